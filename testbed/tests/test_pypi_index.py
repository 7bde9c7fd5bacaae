"""The PyPI stand-in: reproducible stand-in wheels, a PEP 503 index, served by the services
container's pypi listener, installable with plain ``pip install --index-url``."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rigfleet_testbed import layout, pypi_fixture
from services_helpers import services

WANTED = {"xxhash": "3.5.0", "pandas": "2.2.3", "scipy": "1.14.1"}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    data = tmp_path_factory.mktemp("data")
    assert pypi_fixture.build_index(data / "pypi") == WANTED
    with services(data) as ports:
        yield data / "pypi", f"http://127.0.0.1:{ports['pypi']}"


def pip(url: str, target: Path, *reqs: str) -> subprocess.CompletedProcess[str]:
    # No pip configuration of this machine (a find-links directory would offer real wheels).
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
           "PIP_CONFIG_FILE": os.devnull}
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir",
         "--disable-pip-version-check", "--no-input", "--target", str(target),
         "--index-url", f"{url}/simple/", *reqs],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_wheels_are_reproducible_and_valid(tmp_path: Path) -> None:
    for dist in pypi_fixture.DISTS:
        data = pypi_fixture.wheel_bytes(dist)
        assert data == pypi_fixture.wheel_bytes(dist)
        (tmp_path / dist.wheel_name).write_bytes(data)
        with zipfile.ZipFile(tmp_path / dist.wheel_name) as zf:
            names = zf.namelist()
            info = f"{dist.package}-{dist.version}.dist-info"
            assert {f"{dist.package}/__init__.py", f"{info}/METADATA", f"{info}/WHEEL",
                    f"{info}/RECORD"} <= set(names)
            assert f"Version: {dist.version}" in zf.read(f"{info}/METADATA").decode()
            assert "Tag: py3-none-any" in zf.read(f"{info}/WHEEL").decode()


def test_index_pages_follow_pep_503(index: tuple[Path, str]) -> None:
    root, _ = index
    top = (root / "simple/index.html").read_text()
    assert all(f'<a href="{name}/">{name}</a>' in top for name in WANTED)
    page = (root / "simple/xxhash/index.html").read_text()
    m = re.search(r'href="\.\./\.\./packages/(xxhash-3\.5\.0-py3-none-any\.whl)'
                  r'#sha256=([0-9a-f]{64})"',
                  page)  # fmt: skip
    assert m, page
    assert hashlib.sha256((root / "packages" / m.group(1)).read_bytes()).hexdigest() == m.group(2)
    stamp = (root / "packages" / m.group(1)).stat().st_mtime_ns
    pypi_fixture.build_index(root)  # unchanged bytes: nothing rewritten
    assert (root / "packages" / m.group(1)).stat().st_mtime_ns == stamp


def test_pip_installs_what_genesis_needs_from_it(index: tuple[Path, str], tmp_path: Path) -> None:
    _, url = index
    target = tmp_path / "site"
    proc = pip(url, target, *(f"{n}=={v}" for n, v in WANTED.items()))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = "import xxhash, pandas, scipy; print(xxhash.__version__, pandas.__version__, " \
           "scipy.__version__)"
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(target)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == list(WANTED.values())
    proc = pip(url, tmp_path / "other", "xxhash==3.4.1")
    assert proc.returncode != 0 and "No matching distribution found for xxhash==3.4.1" in \
        proc.stdout + proc.stderr


def test_the_testbed_url() -> None:
    assert layout.PYPI_URL == "http://pypi.rigfleet.test:3141/simple/"
    assert "pypi.rigfleet.test" in layout.SERVICES_ALIASES
