"""The PyPI stand-in: a PEP 503 "simple" index with the packages Genesis needs at runtime.

Genesis imports ``xxhash``, ``pandas`` and ``scipy``; the vLLM image lacks them, which is why
Genesis entrypoints ``pip install`` them (genesis.md 1.3); v12's rendered bootstrap pins
``pandas==2.2.3 scipy==1.14.1 xxhash==3.5.0`` (upstream-2026.md 3.2). The testbed has no internet,
so the services container serves tiny pure-Python wheels under those real names and versions
(each imports and has ``__version__``; nothing more)::

    build_index(Path(".testbed/services/pypi"))
    # pip install --index-url http://pypi.rigfleet.test:3141/simple/ \\
    #     --trusted-host pypi.rigfleet.test xxhash==3.5.0 pandas==2.2.3 scipy==1.14.1

Layout under the data directory: ``simple/index.html``, ``simple/<name>/index.html`` (links
with ``#sha256=`` fragments), ``packages/<wheel>``. Wheels are reproducible (fixed timestamps),
and files are rewritten only when their bytes change.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Dist:
    """A stand-in distribution: project ``name`` at ``version``, one top-level package."""

    name: str
    version: str
    package: str
    summary: str

    @property
    def wheel_name(self) -> str:
        return f"{self.package}-{self.version}-py3-none-any.whl"

    @property
    def normalized(self) -> str:
        """PEP 503 name normalisation."""
        return re.sub(r"[-_.]+", "-", self.name).lower()


DISTS: tuple[Dist, ...] = (
    Dist("xxhash", "3.5.0", "xxhash", "Python binding for xxHash (rigfleet testbed stand-in)"),
    Dist("pandas", "2.2.3", "pandas", "Powerful data structures for data analysis (rigfleet "
         "testbed stand-in)"),
    Dist("scipy", "1.14.1", "scipy", "Fundamental algorithms for scientific computing (rigfleet "
         "testbed stand-in)"),
)
_DATE = (2026, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def wheel_bytes(d: Dist) -> bytes:
    """A valid, reproducible py3-none-any wheel of ``d``."""
    info = f"{d.package}-{d.version}.dist-info"
    files = {
        f"{d.package}/__init__.py": (
            f'"""{d.name} {d.version}: a rigfleet testbed stand-in (the real package is not '
            f'here; only its name, version and import)."""\n\n__version__ = "{d.version}"\n'),
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {d.name}\nVersion: {d.version}\n"
                             f"Summary: {d.summary}\n"),
        f"{info}/WHEEL": ("Wheel-Version: 1.0\nGenerator: rigfleet-testbed\n"
                          "Root-Is-Purelib: true\nTag: py3-none-any\n"),
        f"{info}/top_level.txt": f"{d.package}\n",
    }
    record = "".join(f"{name},{_record_hash(body.encode())},{len(body.encode())}\n"
                     for name, body in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, body in files.items():
            zi = zipfile.ZipInfo(name, date_time=_DATE)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, body)
    return buf.getvalue()


def _page(title: str, links: list[tuple[str, str]]) -> bytes:
    body = "".join(f'    <a href="{html.escape(href, quote=True)}">{html.escape(text)}</a><br/>\n'
                   for href, text in links)
    return (f"<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" "
            f"content=\"1.0\"><title>{html.escape(title)}</title></head>\n  <body>\n"
            f"    <h1>{html.escape(title)}</h1>\n{body}  </body>\n</html>\n").encode()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)


def build_index(root: Path, dists: tuple[Dist, ...] = DISTS) -> dict[str, str]:
    """Write the index under ``root``; returns ``{name: version}``."""
    projects = []
    for d in dists:
        wheel = wheel_bytes(d)
        _write(root / "packages" / d.wheel_name, wheel)
        sha = hashlib.sha256(wheel).hexdigest()
        _write(root / "simple" / d.normalized / "index.html", _page(
            f"Links for {d.name}", [(f"../../packages/{d.wheel_name}#sha256={sha}",
                                     d.wheel_name)]))
        projects.append((f"{d.normalized}/", d.name))
    _write(root / "simple" / "index.html", _page("Simple index", projects))
    return {d.name: d.version for d in dists}
