"""The Genesis fixture repository: deterministic SHAs, dumb-HTTP clone, apply_all behaviour.

apply_all runs against a fake vllm package (``<site>/vllm/__init__.py`` with ``__version__`` and
the cloned ``vllm/_genesis`` copied in, as the container mounts it)::

    .venv/bin/python -m pytest tests/unit/test_genesis_fixture.py -q
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rigfleet_testbed.genesis_fixture import REPO_NAME, GenesisFixture, build_genesis_fixture

SERVICES_DIR = Path(__file__).resolve().parents[2] / "testbed/rigfleet_testbed/images/services"
V7722_PINS = ("0.20.1rc1.dev16+g7a1eb8ac2", "0.20.2rc1.dev9+g01d4d1ad3")
V7730_NEW = ("0.20.2rc1.dev212+g3f9c2a7e5", "0.20.2rc1.dev240+gb7e4d1c9a")
P67 = "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def git(*args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def allowlist_in(checkout: Path) -> tuple[str, ...]:
    """``KNOWN_GOOD_VLLM_PINS`` as written in the checkout's guards.py (read, not imported)."""
    tree = ast.parse((checkout / "vllm/_genesis/guards.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and getattr(node.target, "id", "") == "KNOWN_GOOD_VLLM_PINS"
        ):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("KNOWN_GOOD_VLLM_PINS not found")


@pytest.fixture(scope="module")
def genesis(tmp_path_factory: pytest.TempPathFactory) -> GenesisFixture:
    return build_genesis_fixture(tmp_path_factory.mktemp("data") / "git")


@pytest.fixture(scope="module")
def git_url(genesis: GenesisFixture) -> Iterator[str]:
    """The fixture served by ``python -m services`` (git listener on a free port)."""
    data = genesis.repo_path.parent.parent
    ports_file = data / "ports.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services", "--data", str(data), "--bind", "127.0.0.1",
         "--apt-port", "0", "--hub-port", "0", "--git-port", "0",
         "--ports-file", str(ports_file), "--log", str(data / "services.log")],
        cwd=SERVICES_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while not ports_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "services did not start"
        time.sleep(0.05)
    port = json.loads(ports_file.read_text())["git"]
    try:
        yield genesis.url(f"http://127.0.0.1:{port}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def checkout(git_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("clone") / "genesis"
    git("clone", "--quiet", git_url, str(dest))
    return dest


def fake_vllm(root: Path, checkout: Path, sha: str, version: str) -> Path:
    """``<root>/site/vllm`` with ``__version__`` and Genesis at ``sha`` as ``vllm/_genesis``."""
    git("checkout", "--quiet", sha, cwd=checkout)
    site = root / "site"
    pkg = site / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'__version__ = "{version}"\n')
    shutil.copytree(checkout / "vllm/_genesis", pkg / "_genesis")
    return site


def apply_all(
    site: Path, *args: str, env: dict[str, str] | None = None, pythonpath: Path | None = None
) -> tuple[int, str]:
    """Run ``python3 -m vllm._genesis.patches.apply_all``; (exit status, stdout+stderr)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GENESIS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm._genesis.patches.apply_all", *args],
        cwd=site.parent,  # not a directory holding a vllm/ of its own
        env={**clean, "PYTHONPATH": str(pythonpath or site), **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout


# ---- the repository -------------------------------------------------------------------------


def test_builds_are_deterministic(genesis: GenesisFixture, tmp_path: Path) -> None:
    again = build_genesis_fixture(tmp_path / "git")
    assert again.commits == genesis.commits
    rebuilt = build_genesis_fixture(tmp_path / "git")  # over an existing repository
    assert rebuilt.commits == genesis.commits

    (c1, t1, a1), (c2, t2, a2) = genesis.commits
    assert t1.startswith("release(v7.72.2): ") and t2.startswith("release(v7.73.0): ")
    assert a1 == V7722_PINS and a2 == V7722_PINS + V7730_NEW
    assert genesis.main == c2 and genesis.releases == {"v7.72.2": c1, "v7.73.0": c2}
    bare = genesis.repo_path
    assert bare.name == REPO_NAME
    assert git("--git-dir", str(bare), "rev-parse", "refs/heads/main") == c2
    assert git("--git-dir", str(bare), "rev-parse", f"{c2}^") == c1
    assert git("--git-dir", str(bare), "log", "-1", "--format=%an <%ae> %ad", "--date=iso", c1) == (
        "Genesis Fixture <genesis@rigfleet.test> 2026-05-05 09:30:00 +0000"
    )
    assert (bare / "info/refs").read_text().split() == [c2, "refs/heads/main"]
    assert (bare / "objects/info/packs").read_text().startswith("P pack-")


def test_clone_over_dumb_http_and_checkout(
    genesis: GenesisFixture, checkout: Path, git_url: str, tmp_path: Path
) -> None:
    (c1, _, a1), (c2, _, a2) = genesis.commits
    assert git("rev-parse", "HEAD", cwd=checkout) == c2
    for path in ("vllm/_genesis/__init__.py", "vllm/_genesis/guards.py", "vllm/_genesis/dispatcher.py",
                 "vllm/_genesis/patches/__init__.py", "vllm/_genesis/patches/apply_all.py",
                 "tools/genesis_vllm_plugin/pyproject.toml", "tools/genesis_vllm_plugin/genesis_v7.py",
                 "README.md", "CHANGELOG.md"):  # fmt: skip
        assert (checkout / path).is_file(), path
    git("checkout", "--quiet", c1, cwd=checkout)
    assert allowlist_in(checkout) == a1
    assert 'VERSION = "v7.72.2"' in (checkout / "vllm/_genesis/__version__.py").read_text()
    git("checkout", "--quiet", c2, cwd=checkout)
    assert allowlist_in(checkout) == a2
    # An existing clone fetches over the same protocol.
    git("fetch", "--quiet", "origin", cwd=checkout)
    assert git("rev-parse", "origin/main", cwd=checkout) == c2
    log = (genesis.repo_path.parent.parent / "services.log").read_text()
    assert "info/refs?service=git-upload-pack 200" in log  # smart probe answered as dumb


# ---- apply_all ------------------------------------------------------------------------------


def test_allowlisted_pin_passes_the_gate(
    genesis: GenesisFixture, checkout: Path, tmp_path: Path
) -> None:
    site = fake_vllm(tmp_path, checkout, genesis.releases["v7.72.2"], V7722_PINS[1])
    rc, out = apply_all(site, env={"GENESIS_VLLM_PIN_POLICY": "strict"})
    assert rc == 0, out
    assert f"[Genesis pin-gate] running vllm pin = {V7722_PINS[1]}" in out
    assert f"[Genesis pin-gate] allowlist (2 entries): {list(V7722_PINS)}" in out
    assert f"OK — vllm pin {V7722_PINS[1]} is on the Genesis allowlist" in out
    assert "Genesis Results: 0 applied, 44 skipped, 0 failed" in out
    assert not (site / "vllm/_genesis_applied.json").exists()  # nothing enabled, nothing applied


def test_strict_gate_refuses_unknown_pin(
    genesis: GenesisFixture, checkout: Path, tmp_path: Path
) -> None:
    pin = "0.20.2rc1.dev129+g1acd67a79"
    site = fake_vllm(tmp_path, checkout, genesis.releases["v7.72.2"], pin)
    rc, out = apply_all(site, env={"GENESIS_VLLM_PIN_POLICY": "strict", P67: "1"})
    assert rc == 2, out
    assert "[Genesis pin-gate] STRICT FAIL: UNKNOWN — vllm pin" in out
    assert f"'{pin}' is NOT on the Genesis known-good list (2 entries)" in out
    assert f"Allowed pins: {list(V7722_PINS)}" in out
    assert "add it to KNOWN_GOOD_VLLM_PINS in vllm/_genesis/guards.py" in out
    assert "Genesis Results" not in out  # the gate runs before any patch
    assert not (site / "vllm/_genesis_applied.json").exists()

    rc, out = apply_all(site, env={P67: "1"})  # default policy: warn, boot continues
    assert rc == 0, out
    assert f"WARNING [Genesis pin-gate] UNKNOWN — vllm pin '{pin}'" in out
    assert "[Genesis] applied: P67" in out


def test_newer_release_accepts_newer_pins(
    genesis: GenesisFixture, checkout: Path, tmp_path: Path
) -> None:
    site = fake_vllm(tmp_path / "new", checkout, genesis.releases["v7.73.0"], V7730_NEW[0])
    rc, out = apply_all(site, env={"GENESIS_VLLM_PIN_POLICY": "strict"})
    assert rc == 0 and "allowlist (4 entries)" in out, out
    site = fake_vllm(tmp_path / "old", checkout, genesis.releases["v7.72.2"], V7730_NEW[0])
    rc, out = apply_all(site, env={"GENESIS_VLLM_PIN_POLICY": "strict"})
    assert rc == 2, out


def test_p67_marker_only_when_enabled(
    genesis: GenesisFixture, checkout: Path, tmp_path: Path
) -> None:
    site = fake_vllm(tmp_path, checkout, genesis.releases["v7.72.2"], V7722_PINS[1])
    marker = site / "vllm/_genesis_applied.json"
    rc, out = apply_all(site, env={P67: "0"})
    assert rc == 0 and "[Genesis] skipped: P67 (disabled by" in out, out
    assert not marker.exists()

    rc, out = apply_all(site, "--dry-run", env={P67: "1"})
    assert rc == 0 and "dry-run: would apply P67" in out, out
    assert not marker.exists()

    rc, out = apply_all(site, env={P67: "1"})
    assert rc == 0, out
    assert (
        "[Genesis] applied: P67" in out
        and "Genesis Results: 1 applied, 43 skipped, 0 failed" in out
    )
    assert json.loads(marker.read_text()) == {"genesis_version": "v7.72.2", "applied": ["P67"]}

    # Same container again (stop/start): recorded patches are skipped, the marker merges.
    rc, out = apply_all(site, env={P67: "1", "GENESIS_ENABLE_P58_ASYNC_PLACEHOLDER_FIX": "1"})
    assert rc == 0 and "skipped: P67 (already applied" in out, out
    assert json.loads(marker.read_text())["applied"] == ["P58", "P67"]


def test_unwritable_p87_target_fails_with_exit_1(
    genesis: GenesisFixture, checkout: Path, tmp_path: Path
) -> None:
    site = fake_vllm(tmp_path, checkout, genesis.releases["v7.72.2"], V7722_PINS[1])
    # Tests run as root, so a read-only mode would not stop the write; a directory in place of
    # the target file does (in a container the read-only bind mount gives errno 30 instead).
    (site / "vllm/model_executor/kernels/linear/mixed_precision/marlin.py").mkdir(parents=True)
    rc, out = apply_all(site, env={P67: "1", "GENESIS_ENABLE_P87": "1"})
    assert rc == 1, out
    assert "[Genesis] FAILED: P87" in out and "Errno" in out
    assert "Genesis Results: 1 applied, 42 skipped, 1 failed" in out
    assert json.loads((site / "vllm/_genesis_applied.json").read_text())["applied"] == ["P67"]


def test_vllm_not_importable(genesis: GenesisFixture, checkout: Path, tmp_path: Path) -> None:
    # Run from the bare checkout: its vllm/ has no __init__.py, so there is no vllm.__version__.
    git("checkout", "--quiet", genesis.releases["v7.72.2"], cwd=checkout)
    rc, out = apply_all(
        checkout / "x", env={"GENESIS_VLLM_PIN_POLICY": "strict"}, pythonpath=checkout
    )
    assert rc == 2 and "STRICT FAIL: MISSING" in out, out
    rc, out = apply_all(checkout / "x", pythonpath=checkout)
    assert rc == 2 and "orchestrator setup error" in out, out


def test_typo_guard(genesis: GenesisFixture, checkout: Path, tmp_path: Path) -> None:
    site = fake_vllm(tmp_path, checkout, genesis.releases["v7.72.2"], V7722_PINS[1])
    typo = {"GENESIS_ENABLE_P67_TQ_MULTIQUERY_KERNEL": "1"}
    rc, out = apply_all(site, env=typo)
    assert rc == 0 and f"did you mean {P67}?" in out, out
    rc, out = apply_all(site, env={**typo, "GENESIS_TYPO_GUARD_STRICT": "1"})
    assert rc == 2 and "orchestrator setup error" in out, out


def test_plugin_register(genesis: GenesisFixture, checkout: Path, tmp_path: Path) -> None:
    site = fake_vllm(tmp_path, checkout, genesis.releases["v7.72.2"], V7722_PINS[1])
    plugin = checkout / "tools/genesis_vllm_plugin"
    code = "import genesis_v7; genesis_v7.register(); genesis_v7.register()"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GENESIS_")},
           "PYTHONPATH": f"{site}{os.pathsep}{plugin}", P67: "1"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "GENESIS_DISABLE": "1"},
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0 and "GENESIS_DISABLE set" in proc.stdout
    assert not (site / "vllm/_genesis_applied.json").exists()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "register() complete: 1 applied" in proc.stdout  # first call
    assert "register() complete: 0 applied" in proc.stdout  # idempotent second call
    assert json.loads((site / "vllm/_genesis_applied.json").read_text())["applied"] == ["P67"]
    toml = (plugin / "pyproject.toml").read_text()
    assert 'genesis_v7 = "genesis_v7:register"' in toml and 'version = "7.72.2"' in toml
