"""The host-side scripts the roles install, run here as the hosts run them.

- ``files/rigfleet-fetch-weights.py`` against the testbed's hub service (started locally on an
  ephemeral port, as testbed/tests/test_hub.py does) with the real ``huggingface_hub`` client;
- ``rigfleet/genesis_inspect.py`` (on hosts ``rigfleet-genesis-inspect.py``) isolated, as a
  host's own ``python3`` runs it, on small trees of both Genesis layouts (the full checks are
  in tests/unit/test_genesis_inspect.py).

Run: ``.venv/bin/python -m pytest testbed/tests/test_host_scripts.py -q``.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rigfleet_testbed.model_fixture import MODEL_REPO, ModelFixture, build_model_fixture

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "files" / "rigfleet-fetch-weights.py"
INSPECT = ROOT / "rigfleet" / "genesis_inspect.py"  # installed as rigfleet-genesis-inspect.py
SERVICES_DIR = ROOT / "testbed/rigfleet_testbed/images/services"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ModelFixture]]:
    data = tmp_path_factory.mktemp("hub")
    for sub in ("apt", "hub", "git"):
        (data / sub).mkdir()
    model = build_model_fixture(data / "hub", shard_mib=1)
    ports_file = data / "ports.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services", "--data", str(data), "--bind", "127.0.0.1",
         "--apt-port", "0", "--hub-port", "0", "--git-port", "0", "--pypi-port", "0",
         "--ports-file", str(ports_file), "--log", str(data / "services.log")],
        cwd=SERVICES_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while not ports_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.skip("the testbed services program did not start here")
        time.sleep(0.05)
    ports = json.loads(ports_file.read_text())
    try:
        yield f"http://127.0.0.1:{ports['hub']}", model
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def fetch(endpoint: str, model: ModelFixture, local_dir: Path, *extra: str, lock_dir: Path,
          revision: str | None = None):
    env = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HOME": str(local_dir.parent / "hf-home"),
    }
    return subprocess.run(
        [sys.executable, str(FETCH), "fetch", "--repo", MODEL_REPO,
         "--revision", revision or model.commit, "--local-dir", str(local_dir),
         "--lock-dir", str(lock_dir), *extra],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_fetch_verifies_writes_manifest_and_skips_on_rerun(hub, tmp_path):
    endpoint, model = hub
    local = tmp_path / "models" / "qwen"
    locks = tmp_path / "locks"
    first = fetch(endpoint, model, local, lock_dir=locks)
    assert first.returncode == 0, first.stderr
    assert "[rigfleet-weights] verify" in first.stdout
    manifest = json.loads((local / ".rigfleet-manifest.json").read_text())
    assert manifest["repo"] == MODEL_REPO and manifest["revision"] == model.commit
    assert set(manifest["files"]) == set(model.files)
    for name, (size, sha256) in model.files.items():
        assert manifest["files"][name]["size"] == size
        assert manifest["files"][name]["sha256"] == sha256

    again = fetch(endpoint, model, local, lock_dir=locks)
    assert again.returncode == 0
    assert "already verified" in again.stdout and "verify" not in again.stdout.replace(
        "already verified", ""
    )


def test_corrupted_shard_is_refetched_or_refused(hub, tmp_path):
    endpoint, model = hub
    local = tmp_path / "models" / "qwen"
    locks = tmp_path / "locks"
    assert fetch(endpoint, model, local, lock_dir=locks).returncode == 0
    shard = next(n for n in model.lfs_files)
    path = local / shard
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # same size, different content, new mtime
    path.write_bytes(bytes(data))
    run = fetch(endpoint, model, local, lock_dir=locks)
    # huggingface_hub may trust its local-dir metadata and keep the file; the sha256 check
    # must then refuse it, naming the file. Either way no manifest vouches for bad bytes.
    if run.returncode == 0:
        assert (local / shard).read_bytes() != bytes(data)
    else:
        assert f"{shard}: sha256" in run.stderr
        assert "repaired in place" in run.stdout
        assert not (local / ".rigfleet-manifest.json").exists()


def test_second_concurrent_fetch_fails_fast_naming_the_holder(hub, tmp_path):
    endpoint, model = hub
    locks = tmp_path / "locks"
    locks.mkdir()
    lock = locks / ("weights-" + MODEL_REPO.replace("/", "_") + ".lock")
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fh.write("4242\n")
        fh.flush()
        run = fetch(endpoint, model, tmp_path / "m", lock_dir=locks)
    assert run.returncode == 3
    assert "pid 4242" in run.stderr


def test_disk_check_names_the_numbers(hub, tmp_path, monkeypatch):
    endpoint, model = hub
    sitecustomize = tmp_path / "site" / "sitecustomize.py"
    sitecustomize.parent.mkdir()
    sitecustomize.write_text(
        "import shutil, collections\n"
        "U = collections.namedtuple('U', 'total used free')\n"
        "shutil.disk_usage = lambda p: U(10, 10, 1000)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(sitecustomize.parent))
    run = fetch(endpoint, model, tmp_path / "m", lock_dir=tmp_path / "locks")
    assert run.returncode == 4
    assert "not enough free disk" in run.stderr and "headroom" in run.stderr
    # The revision's name appears only once it is verified; the partial download stays.
    assert not (tmp_path / "m").exists() and (tmp_path / ".m.partial").is_dir()


def tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``root``: (size, mtime_ns, content); what "never written" compares."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def adopt(model: ModelFixture, old: Path, new: Path, lock_dir: Path, revision: str | None = None):
    return subprocess.run(
        [sys.executable, str(FETCH), "adopt", "--repo", MODEL_REPO,
         "--revision", revision or model.commit, "--from", str(old), "--to", str(new),
         "--lock-dir", str(lock_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_revision_directory_appears_only_verified(hub, tmp_path):
    endpoint, model = hub
    final = tmp_path / "models" / f"qwen@{model.commit[:12]}"
    run = fetch(endpoint, model, final, lock_dir=tmp_path / "locks")
    assert run.returncode == 0, run.stderr
    assert f"-> {tmp_path / 'models' / ('.' + final.name + '.partial')}" in run.stdout
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name]  # no partial left
    manifest = json.loads((final / ".rigfleet-manifest.json").read_text())
    assert manifest["revision"] == model.commit and set(manifest["files"]) == set(model.files)


def test_a_directory_verified_for_another_revision_is_never_rewritten(hub, tmp_path):
    endpoint, model = hub
    final = tmp_path / "models" / f"qwen@{model.commit[:12]}"
    final.mkdir(parents=True)
    other = {"repo": MODEL_REPO, "revision": "e" * 40, "files": {"x": {"size": 1, "mtime": 0}}}
    (final / ".rigfleet-manifest.json").write_text(json.dumps(other))
    before = tree(final)
    run = fetch(endpoint, model, final, lock_dir=tmp_path / "locks")
    assert run.returncode == 1
    assert f"holds {MODEL_REPO}@{'e' * 40}, not {MODEL_REPO}@{model.commit}" in run.stderr
    assert "never rewritten" in run.stderr
    assert tree(final) == before


def test_adopting_the_old_directory_renames_it_links_it_and_downloads_nothing(hub, tmp_path):
    endpoint, model = hub
    models, locks = tmp_path / "models", tmp_path / "locks"
    old = models / "qwen"  # where rigfleet kept the weights before per-revision directories
    assert fetch(endpoint, model, old, lock_dir=locks).returncode == 0
    files = tree(old)
    new = models / f"qwen@{model.commit[:12]}"
    run = adopt(model, old, new, locks)
    assert run.returncode == 0, run.stderr
    assert "no download" in run.stdout
    assert new.is_dir() and not new.is_symlink() and tree(new) == files  # mtimes kept
    assert old.is_symlink() and os.readlink(old) == new.name  # relative: survives a move
    assert tree(old) == files  # what the old compose snapshot mounts: the same files
    again = fetch(endpoint, model, new, lock_dir=locks)
    assert again.returncode == 0 and "already verified" in again.stdout  # no hub, no hashing
    assert "adopted already" in adopt(model, old, new, locks).stdout


def test_adopt_leaves_what_it_cannot_vouch_for(hub, tmp_path):
    _, model = hub
    models, locks = tmp_path / "models", tmp_path / "locks"
    old, new = models / "qwen", models / f"qwen@{model.commit[:12]}"
    assert "nothing to adopt" in adopt(model, old, new, locks).stdout
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"half a download")
    run = adopt(model, old, new, locks)
    assert run.returncode == 0 and "never verified" in run.stdout
    assert old.is_dir() and not old.is_symlink() and not new.exists()
    (old / ".rigfleet-manifest.json").write_text(json.dumps(
        {"repo": MODEL_REPO, "revision": "e" * 40, "files": {}}))
    run = adopt(model, old, new, locks)
    assert run.returncode == 1 and f"is for {MODEL_REPO}@{'e' * 40}" in run.stderr
    assert old.is_dir() and not new.exists()
    other = adopt(model, old, tmp_path / "elsewhere" / new.name, locks)
    assert other.returncode == 2 and "two names in one directory" in other.stderr


def test_a_new_revision_goes_to_its_own_directory_and_the_old_one_is_untouched(hub, tmp_path):
    """The hub fixture's two revisions (the known-good one, and the later one ``main`` points
    at): fetching the later one writes only its own directory."""
    endpoint, model = hub
    assert model.later_commit and model.later_commit != model.commit
    models, locks = tmp_path / "models", tmp_path / "locks"
    old = models / f"qwen@{model.commit[:12]}"
    assert fetch(endpoint, model, old, lock_dir=locks).returncode == 0
    before = tree(old)
    new = models / f"qwen@{model.later_commit[:12]}"
    run = fetch(endpoint, model, new, lock_dir=locks, revision=model.later_commit)
    assert run.returncode == 0, run.stderr
    assert tree(old) == before  # what a rollback mounts: byte for byte, mtimes too
    manifest = json.loads((new / ".rigfleet-manifest.json").read_text())
    assert manifest["revision"] == model.later_commit
    assert {n: m["sha256"] for n, m in manifest["files"].items()} == {
        n: sha for n, (_, sha) in model.later_files.items()}


def test_token_is_read_from_the_file_and_never_printed(hub, tmp_path):
    endpoint, model = hub
    token = tmp_path / "hf-token"
    token.write_text("hf_not_a_real_token_value_0000000000\n")
    token.chmod(0o600)
    run = fetch(
        endpoint, model, tmp_path / "m", "--token-file", str(token), lock_dir=tmp_path / "locks"
    )
    assert "hf_not_a_real_token_value" not in run.stdout + run.stderr


def test_revision_must_be_a_full_commit(tmp_path):
    run = subprocess.run(
        [sys.executable, str(FETCH), "check", "--repo", MODEL_REPO, "--revision", "main",
         "--local-dir", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2 and "40-hex" in run.stderr


@pytest.mark.parametrize("layout", ["v7", "v12"])
def test_genesis_inspect_runs_isolated_as_on_a_host(tmp_path, layout):
    # The host runs the single file with its own python3: no rigfleet, no site-packages.
    from genesis_trees import V7_KNOWN, V12_KNOWN, V12_PENDING, v7_files, v12_files, write_tree

    files = v7_files(V7_KNOWN) if layout == "v7" else v12_files(V12_KNOWN, V12_PENDING)
    tree = write_tree(tmp_path / "tree", files)
    run = subprocess.run([sys.executable, "-I", "-S", str(INSPECT), str(tree)],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["layout"] == layout and report["errors"] == []
    assert report["allowlist"]["known_good"] == (V7_KNOWN if layout == "v7" else V12_KNOWN)


def test_genesis_inspect_reads_every_testbed_fixture_commit(tmp_path):
    # The testbed's Genesis stands in for the real one: the host helper must read each of its
    # commits (both layouts) as it reads the real trees, without an error.
    from rigfleet_testbed.genesis_fixture import build_genesis_fixture

    from roles.genesis import checkout_commands

    fx = build_genesis_fixture(tmp_path / "git")
    checkout = tmp_path / "genesis"
    for commit in [*fx.commits, *fx.main_commits]:
        for command in checkout_commands(str(fx.repo_path), commit.sha, str(checkout),
                                         (checkout / ".git").is_dir()):  # fmt: skip
            subprocess.run(["sh", "-c", command], check=True, capture_output=True)
        run = subprocess.run([sys.executable, "-I", "-S", str(INSPECT), str(checkout)],
                             capture_output=True, text=True)  # fmt: skip
        assert run.returncode == 0, (commit.title, run.stderr)
        report = json.loads(run.stdout)
        assert report["layout"] == commit.layout, commit.title
        assert tuple(report["allowlist"]["known_good"]) == tuple(commit.allowlist)
        assert tuple(report["allowlist"]["pending"]) == tuple(commit.pending)
        assert report["registry"]["patches"] > 0
