"""Helpers for tests that run the Genesis fixture's apply programs against the simulator.

A test gets a site directory holding the simulator's ``vllm`` package as one image build has it
(``vllm_sim_helpers.make_package``), the Genesis tree of one fixture commit where the container
mounts it (v7: ``vllm/_genesis``; v12: ``sndr``), and, unless it asks otherwise, the PyPI
stand-in's wheels unpacked beside them (what ``pip install xxhash pandas scipy`` leaves)::

    site = genesis_site(tmp_path, "v12", tag="v0.27.1")
    rc, out = apply(site, "v12", {"GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL": "1"})
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from rigfleet_testbed import genesis_fixture as gf
from rigfleet_testbed import pypi_fixture
from vllm_sim_helpers import DEFAULT_TAG, make_package

MODULES = {"v7": "vllm._genesis.patches.apply_all", "v12": "sndr.apply"}
P67 = "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"


def generation(name: str) -> gf.Generation:
    return next(g for g in gf.GENERATIONS if g.name == name)


def render(name: str, dest: Path, upto: int | None = None) -> Path:
    """The repository files of generation ``name`` at its ``upto``-th commit (default: last)."""
    gen = generation(name)
    count = len(gen.releases) if upto is None else upto + 1
    gf.render_release(gen, gen.releases[:count], dest, ["0" * 40])
    return dest


def install_runtime_deps(site: Path) -> None:
    """Unpack the stand-in wheels into ``site`` (pure-Python wheels: unpacking installs them)."""
    for dist in pypi_fixture.DISTS:
        with zipfile.ZipFile(io.BytesIO(pypi_fixture.wheel_bytes(dist))) as zf:
            zf.extractall(site)


def genesis_site(base: Path, name: str, tag: str = DEFAULT_TAG, upto: int | None = None,
                 deps: bool = True) -> Path:
    """A site dir: the simulator package of ``tag`` plus Genesis ``name`` mounted as in a
    container, plus the runtime dependencies when ``deps``."""
    site = make_package(base / "pkg", tag)
    tree = render(name, base / "genesis", upto)
    if name == "v7":
        shutil.copytree(tree / "vllm" / "_genesis", site / "vllm" / "_genesis")
    else:
        shutil.copytree(tree / "sndr", site / "sndr")
    if deps:
        install_runtime_deps(site)
    return site


def apply(site: Path, name: str, env: dict[str, str] | None = None, *args: str,
          pythonpath: Path | None = None) -> tuple[int, str]:
    """Run the generation's apply program; (exit status, stdout+stderr)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GENESIS_", "SNDR_"))}
    proc = subprocess.run(
        [sys.executable, "-m", MODULES[name], *args],
        cwd=site.parent,  # not a directory holding a vllm/ of its own
        env={**clean, "PYTHONPATH": str(pythonpath or site), "PYTHONDONTWRITEBYTECODE": "1",
             **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout
