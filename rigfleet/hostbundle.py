"""The host-side tool as one zipapp of ``rigfleet/hostside/**``, byte-for-byte deterministic
(sorted entries, fixed times and modes), so the deploy sends it only when the code changed::

    data = build_bundle()                 # bytes of rigfleet-host.pyz
    # on a host: python3 /usr/local/lib/rigfleet/rigfleet-host.pyz status
"""

from __future__ import annotations

import io
import zipfile
from functools import cache
from pathlib import Path

HOSTSIDE = Path(__file__).resolve().parent / "hostside"
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SHEBANG = b"#!/usr/bin/env python3\n"
# The bundle's own package root: only what the host side needs (not rigfleet's control code).
_PACKAGE_INIT = '"""rigfleet: the host-side bundle (see rigfleet/hostbundle.py)."""\n'
_MAIN = (
    '"""rigfleet-host: see rigfleet/hostside/__main__.py."""\n'
    "import sys\n\n"
    "from rigfleet.hostside.__main__ import main\n\n"
    "sys.exit(main())\n"
)


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.external_attr = 0o644 << 16
    info.create_system = 3  # unix, whatever machine builds it
    zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)


@cache
def build_bundle() -> bytes:
    buf = io.BytesIO()
    buf.write(_SHEBANG)
    with zipfile.ZipFile(buf, "w") as zf:
        _add(zf, "__main__.py", _MAIN.encode())
        _add(zf, "rigfleet/__init__.py", _PACKAGE_INIT.encode())
        for path in sorted(p for p in HOSTSIDE.rglob("*.py") if "__pycache__" not in p.parts):
            _add(zf, path.relative_to(HOSTSIDE.parent.parent).as_posix(), path.read_bytes())
    return buf.getvalue()
