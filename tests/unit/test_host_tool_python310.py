"""The host tool runs under the host's own ``/usr/bin/python3``, and Ubuntu 22.04 (a supported
OS) has Python 3.10: the bundle must import and run there. Statically, nothing in
rigfleet/hostside imports what only Python 3.11 has (outside ``if TYPE_CHECKING:``); and where a
Python 3.10 is installed (pyenv's, say), the built bundle is run with it."""

from __future__ import annotations

import ast
import glob
import shutil
import subprocess
from pathlib import Path

import pytest

from rigfleet.hostbundle import build_bundle

HOSTSIDE = Path(__file__).resolve().parents[2] / "rigfleet" / "hostside"
# What Python 3.11 added to the standard library that the host side could reach for.
NEW_IN_311 = {
    ("datetime", "UTC"), ("typing", "Self"), ("typing", "LiteralString"), ("typing", "Never"),
    ("typing", "assert_never"), ("typing", "reveal_type"), ("typing", "Required"),
    ("typing", "NotRequired"), ("typing", "TypeVarTuple"), ("typing", "Unpack"),
    ("enum", "StrEnum"), ("enum", "verify"), ("hashlib", "file_digest"), ("contextlib", "chdir"),
    ("asyncio", "TaskGroup"), ("asyncio", "timeout"), ("operator", "call"),
}
NEW_MODULES = {"tomllib", "wsgiref.types"}


def _runtime_imports(tree: ast.Module) -> list[ast.stmt]:
    """Import statements that run (those under ``if TYPE_CHECKING:`` do not)."""
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
               for stmt in node.body for n in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
            and id(n) not in skipped]


def test_the_host_side_uses_nothing_python_3_10_lacks() -> None:
    found = []
    for path in sorted(HOSTSIDE.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text, str(path), feature_version=(3, 10))  # 3.11 syntax fails here
        for node in _runtime_imports(tree):
            if isinstance(node, ast.ImportFrom):
                pairs = {(node.module or "", a.name) for a in node.names}
                found += [f"{path.name}: from {m} import {n}" for m, n in pairs & NEW_IN_311]
                modules = [node.module or ""]
            else:
                modules = [a.name for a in node.names]
            found += [f"{path.name}: {m}" for m in modules if m in NEW_MODULES]
        found += [f"{path.name}: {m}.{n}" for m, n in NEW_IN_311 if f"{m}.{n}" in text]
    assert found == []


def _python310() -> str:
    """A Python 3.10 that runs (a pyenv shim without its version set does not)."""
    for found in [*sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.10*/bin/python3.10"))),
                  shutil.which("python3.10")]:
        if found and subprocess.run([found, "-c", "import sys; assert sys.version_info[:2] == "
                                     "(3, 10)"], capture_output=True, timeout=30).returncode == 0:
            return found
    pytest.skip("no Python 3.10 here (Ubuntu 22.04's): the static check above stands in")


def test_the_bundle_runs_under_python_3_10(tmp_path: Path) -> None:
    python = _python310()
    bundle = tmp_path / "rigfleet-host.pyz"
    bundle.write_bytes(build_bundle())
    for args in (["--help"], ["-m", "rigfleet.hostside.verify", "--help"],
                 ["-m", "rigfleet.hostside.bench", "--help"]):
        argv = [python, str(bundle), *args] if args[0] != "-m" else [python, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": str(bundle)}, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
    # The records, the timestamps read from docker and written to the ledger, a typed record.
    code = ("from rigfleet.hostside.stackctl import docker_time\n"
            "from rigfleet.hostside.records import GateRecord, now_iso\n"
            "print(docker_time('2026-11-29T10:00:01.123456789Z'), now_iso(0, suffix='Z'),\n"
            "      GateRecord.from_dict({'result': 'pass', 'failed_checks': ['x']}).failed_checks)")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(bundle)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1795946401.0", "1970-01-01T00:00:00Z", "('x',)"]
