"""The services container's hub (and apt listener) against the real ``huggingface_hub`` client.

The services program runs as a subprocess on 127.0.0.1 ephemeral ports over a temporary fixture;
every client call runs in its own interpreter with ``HF_ENDPOINT`` set, as on a host::

    .venv/bin/python -m pytest testbed/tests/test_hub.py -q
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rigfleet_testbed.model_fixture import (
    MODEL_REPO,
    HubUser,
    ModelFixture,
    build_model_fixture,
    git_blob_oid,
    write_hub_repo,
    write_hub_users,
)

SERVICES_DIR = Path(__file__).resolve().parents[2] / "testbed/rigfleet_testbed/images/services"
TOKEN = "hf_testbedREADtoken0123456789abcdefXYZ"  # a user with access to everything
OTHER_TOKEN = "hf_testbedOTHERtoken0123456789abcdefQ"  # a user without access to the gated repo
GATED_REPO = "rigfleet-test/gated-model"
BIG_REPO = "rigfleet-test/big-file"


@dataclass
class Services:
    data: Path
    ports: dict[str, int]
    log: Path

    @property
    def hub(self) -> str:
        return f"http://127.0.0.1:{self.ports['hub']}"

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8")


def start_services(data: Path, log: Path) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """Run ``python -m services`` on free ports; returns the process and its ports."""
    ports_file = data / "ports.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services", "--data", str(data), "--bind", "127.0.0.1",
         "--apt-port", "0", "--hub-port", "0", "--git-port", "0", "--pypi-port", "0",
         "--ports-file", str(ports_file), "--log", str(log)],
        cwd=SERVICES_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while not ports_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"services did not start (rc={proc.poll()})")
        time.sleep(0.05)
    return proc, json.loads(ports_file.read_text())


@pytest.fixture(scope="module")
def fixture_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModelFixture]:
    data = tmp_path_factory.mktemp("testbed")
    for sub in ("apt", "hub", "git"):
        (data / sub).mkdir()
    fx = build_model_fixture(data / "hub", shard_mib=1)
    write_hub_repo(
        data / "hub",
        GATED_REPO,
        {"config.json": b'{"model_type": "tiny"}\n', "model.safetensors": b"\x00" * 4096},
        gated="manual",
    )
    write_hub_users(
        data / "hub",
        [HubUser("testbed", TOKEN, ("*",)), HubUser("outsider", OTHER_TOKEN, (MODEL_REPO,))],
    )
    (data / "apt/debian/dists/stable").mkdir(parents=True)
    (data / "apt/debian/dists/stable/Release").write_text("Suite: stable\nComponents: main\n")
    (data / "apt/rigfleet-testbed.asc").write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
    return data, fx


@pytest.fixture(scope="module")
def services(fixture_data: tuple[Path, ModelFixture]) -> Iterator[Services]:
    data, _ = fixture_data
    log = data / "services.log"
    proc, ports = start_services(data, log)
    try:
        yield Services(data, ports, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def model(fixture_data: tuple[Path, ModelFixture]) -> ModelFixture:
    return fixture_data[1]


@pytest.fixture(autouse=True)
def _no_faults_left(services: Services) -> Iterator[None]:
    yield
    http(services.hub + "/_testbed/faults", method="DELETE")


def http(
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One raw request: (status, headers, body), errors included."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def hf(services: Services, tmp_path: Path, code: str, **env: str) -> dict:
    """Run client code in a fresh interpreter configured like a host; returns its ``result``.

    The code sees ``REPO``, ``json``, ``hashlib``, ``os`` and must assign a JSON-able ``result``.
    """
    prelude = f"import hashlib, json, os\nREPO = {MODEL_REPO!r}\n"
    epilogue = "\nprint('@@RESULT@@' + json.dumps(result))\n"
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))},
        "HF_ENDPOINT": services.hub,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        **env,
    }
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code) + epilogue],
        env=full_env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"client failed:\n{proc.stdout}\n{proc.stderr}"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT@@"))
    return json.loads(line[len("@@RESULT@@") :])


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- the model fixture itself ---------------------------------------------------------------


def test_model_fixture_is_deterministic_and_valid(tmp_path: Path) -> None:
    a = build_model_fixture(tmp_path / "a", shard_mib=1)
    b = build_model_fixture(tmp_path / "b", shard_mib=1)
    assert a.commit == b.commit and a.files == b.files
    assert len(a.commit) == 40 and int(a.commit, 16) >= 0
    assert build_model_fixture(tmp_path / "c", shard_mib=2).commit != a.commit

    shards = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert set(shards) <= a.lfs_files
    assert not {"config.json", "tokenizer.json", "README.md"} & a.lfs_files
    index = json.loads((a.path / "blobs" / a.files["model.safetensors.index.json"][1]).read_bytes())
    seen: dict[str, str] = {}
    total = 0
    for shard in shards:
        raw = (a.path / "blobs" / a.files[shard][1]).read_bytes()
        assert 1024 * 1024 <= len(raw) < 1.1 * 1024 * 1024  # ~shard_mib
        hlen = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + hlen])
        assert (8 + hlen) % 8 == 0
        data_len = len(raw) - 8 - hlen
        sizes = {"BF16": 2, "F16": 2, "I32": 4}
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            begin, end = meta["data_offsets"]
            assert end - begin == math.prod(meta["shape"]) * sizes[meta["dtype"]]
            assert end <= data_len
            seen[name] = shard
            total += end - begin
        assert (
            max(m["data_offsets"][1] for k, m in header.items() if k != "__metadata__") == data_len
        )
    assert index["weight_map"] == seen
    assert index["metadata"]["total_size"] == total

    config = json.loads((a.path / "blobs" / a.files["config.json"][1]).read_bytes())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config["text_config"]["num_hidden_layers"] == 64
    assert config["quantization_config"]["quant_method"] == "auto-round"
    assert config["quantization_config"]["bits"] == 4
    json.loads((a.path / "blobs" / a.files["tokenizer.json"][1]).read_bytes())


# ---- downloads with the real client ---------------------------------------------------------


def test_snapshot_at_pinned_revision_matches_hub_metadata(
    services: Services, model: ModelFixture, tmp_path: Path
) -> None:
    out = tmp_path / "model"
    result = hf(
        services,
        tmp_path,
        f"""
        from huggingface_hub import HfApi, snapshot_download, get_hf_file_metadata, hf_hub_url
        info = HfApi().model_info(REPO, revision={model.commit!r}, files_metadata=True)
        main = HfApi().model_info(REPO, revision="main")
        path = snapshot_download(REPO, revision={model.commit!r}, local_dir={str(out)!r})
        meta = {{}}
        for name in ("config.json", "model-00002-of-00004.safetensors"):
            m = get_hf_file_metadata(hf_hub_url(REPO, name, revision={model.commit!r}))
            meta[name] = [m.commit_hash, m.etag, m.size]
        result = {{
            "sha": info.sha, "main": main.sha, "path": path, "meta": meta,
            "siblings": {{s.rfilename: [s.size, s.blob_id, s.lfs.sha256 if s.lfs else None,
                                       s.lfs.size if s.lfs else None] for s in info.siblings}},
        }}
        """,
    )
    assert result["sha"] == model.commit
    assert result["main"] == model.later_commit  # main has moved on to the re-quantised upload
    assert Path(result["path"]) == out.resolve()
    siblings = result["siblings"]
    assert set(siblings) == set(model.files)
    for name, (size, sha256) in model.files.items():
        local = out / name
        assert local.stat().st_size == size == siblings[name][0]
        data = local.read_bytes()
        if name in model.lfs_files:
            # What a verifying downloader does: local sha256 against the hub's LFS sha256.
            assert siblings[name][2] == sha256_file(local) == sha256
            assert siblings[name][3] == size
        else:
            assert siblings[name][2] is None
            assert siblings[name][1] == git_blob_oid(data)
    shard = "model-00002-of-00004.safetensors"
    assert result["meta"][shard] == [model.commit, model.files[shard][1], model.files[shard][0]]
    config = model.files["config.json"]
    cfg_bytes = (out / "config.json").read_bytes()
    assert result["meta"]["config.json"] == [model.commit, git_blob_oid(cfg_bytes), config[0]]


def test_resolve_headers_as_the_real_hub(services: Services, model: ModelFixture) -> None:
    shard = "model-00001-of-00004.safetensors"
    size, sha = model.files[shard]
    rev = model.commit
    status, headers, body = http(f"{services.hub}/{MODEL_REPO}/resolve/{rev}/{shard}",
                                 method="HEAD")
    assert status == 200 and body == b""
    assert headers["X-Repo-Commit"] == model.commit
    assert headers["ETag"] == headers["X-Linked-Etag"] == f'"{sha}"'
    assert headers["X-Linked-Size"] == headers["Content-Length"] == str(size)
    assert headers["Accept-Ranges"] == "bytes"

    status, headers, body = http(
        f"{services.hub}/{MODEL_REPO}/resolve/{model.commit}/{shard}",
        headers={"Range": "bytes=100-199"},
    )
    blob = (model.path / "blobs" / sha).read_bytes()
    assert status == 206 and body == blob[100:200]
    assert headers["Content-Range"] == f"bytes 100-199/{size}"
    assert headers["Content-Length"] == "100"
    status, headers, body = http(
        f"{services.hub}/{MODEL_REPO}/resolve/{rev}/{shard}", headers={"Range": "bytes=-8"}
    )
    assert status == 206 and body == blob[-8:]
    status, headers, _ = http(
        f"{services.hub}/{MODEL_REPO}/resolve/{rev}/{shard}", headers={"Range": f"bytes={size}-"}
    )
    assert status == 416 and headers["Content-Range"] == f"bytes */{size}"

    status, headers, _ = http(
        f"{services.hub}/{MODEL_REPO}/resolve/{rev}/config.json", method="HEAD"
    )
    assert "X-Linked-Etag" not in headers
    cfg = (model.path / "blobs" / model.files["config.json"][1]).read_bytes()
    assert headers["ETag"] == f'"{git_blob_oid(cfg)}"'


def test_corrupted_shard_is_detected_against_metadata(
    services: Services, model: ModelFixture, tmp_path: Path
) -> None:
    shard = "model-00002-of-00004.safetensors"
    status, _, body = http(
        services.hub + "/_testbed/faults",
        method="POST",
        body=json.dumps({"corrupt": [shard]}).encode(),
    )
    assert status == 200 and json.loads(body)["corrupt"] == [shard]
    code = f"""
        from huggingface_hub import hf_hub_download, HfApi
        info = HfApi().model_info(REPO, revision={model.commit!r}, files_metadata=True)
        expected = {{s.rfilename: s.lfs.sha256 for s in info.siblings if s.lfs}}
        path = hf_hub_download(REPO, {shard!r}, revision={model.commit!r},
                               local_dir={str(tmp_path / "dl")!r}, force_download=True)
        data = open(path, "rb").read()
        result = {{"expected": expected[{shard!r}], "actual": hashlib.sha256(data).hexdigest(),
                   "size": len(data)}}
        """
    bad = hf(services, tmp_path, code)
    assert bad["size"] == model.files[shard][0]  # same size: only a hash check can tell
    assert bad["expected"] == model.files[shard][1]
    assert bad["actual"] != bad["expected"]
    _, _, body = http(services.hub + "/_testbed/faults")
    assert json.loads(body)["served"][shard]["corrupt"] >= 1

    http(services.hub + "/_testbed/faults", method="DELETE")
    good = hf(services, tmp_path, code)
    assert good["actual"] == good["expected"]


def test_cut_connection_is_retried_and_verified(
    services: Services, model: ModelFixture, tmp_path: Path
) -> None:
    shard = "model-00003-of-00004.safetensors"
    spec = {"cut_after_bytes": {shard: 100_000}, "cut_times": 2}
    http(services.hub + "/_testbed/faults", method="POST", body=json.dumps(spec).encode())
    result = hf(
        services,
        tmp_path,
        f"""
        from huggingface_hub import hf_hub_download
        path = hf_hub_download(REPO, {shard!r}, revision={model.commit!r},
                               local_dir={str(tmp_path / "dl")!r})
        result = {{"sha": hashlib.sha256(open(path, "rb").read()).hexdigest()}}
        """,
    )
    assert result["sha"] == model.files[shard][1]
    _, _, body = http(services.hub + "/_testbed/faults")
    state = json.loads(body)
    assert state["cuts_left"][shard] == 0 and state["served"][shard]["cut"] == 2
    # The client buffers up to 10 MiB before writing, so a cut this early restarts from 0:
    # two cut GETs, then a complete one.
    lines = services.log_text().splitlines()[-20:]
    gets = [ln for ln in lines if f"/{shard} " in ln and " GET " in ln]
    assert [("fault=cut@100000" in ln) for ln in gets][-3:] == [True, True, False]


def test_cut_after_10mib_is_resumed_with_range(services: Services, tmp_path: Path) -> None:
    size = 11 * 1024 * 1024 + 12345
    data = hashlib.shake_256(b"big").digest(size)
    big = write_hub_repo(services.data / "hub", BIG_REPO, {"weights.bin": data})
    cut = 10 * 1024 * 1024 + 4096
    spec = {"cut_after_bytes": {"weights.bin": cut}}
    http(services.hub + "/_testbed/faults", method="POST", body=json.dumps(spec).encode())
    result = hf(
        services,
        tmp_path,
        f"""
        from huggingface_hub import hf_hub_download, get_hf_file_metadata, hf_hub_url
        meta = get_hf_file_metadata(hf_hub_url({BIG_REPO!r}, "weights.bin"))
        path = hf_hub_download({BIG_REPO!r}, "weights.bin", local_dir={str(tmp_path / "dl")!r})
        result = {{"sha": hashlib.sha256(open(path, "rb").read()).hexdigest(), "etag": meta.etag}}
        """,
    )
    assert result["sha"] == result["etag"] == big.files["weights.bin"][1]
    gets = [
        ln for ln in services.log_text().splitlines() if f"/{BIG_REPO}/" in ln and " GET " in ln
    ]
    assert f"fault=cut@{cut}" in gets[-2]
    # Resumed after the 10 MiB the client had written, not from the start.
    assert " 206 " in gets[-1] and "range=bytes=10485760-" in gets[-1]


def test_not_found_errors(services: Services, model: ModelFixture, tmp_path: Path) -> None:
    result = hf(
        services,
        tmp_path,
        f"""
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub.errors import (
            RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError)
        result = {{}}
        cases = {{
            "repo": lambda: HfApi().model_info("nobody/no-such-model"),
            "repo_auth": lambda: HfApi().model_info("nobody/no-such-model", token={TOKEN!r}),
            "revision": lambda: HfApi().model_info(REPO, revision="0" * 40),
            "short_sha": lambda: HfApi().model_info(REPO, revision={model.commit[:7]!r}),
            "file_revision": lambda: hf_hub_download(REPO, "config.json", revision="no-such-branch"),
            "entry": lambda: hf_hub_download(REPO, "no-such-file.json", revision={model.commit!r}),
        }}
        for key, call in cases.items():
            try:
                call()
                result[key] = None
            except (RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError) as e:
                result[key] = [type(e).__name__, e.response.status_code]
        """,
    )
    assert result == {
        # The Hub answers 401 to anonymous callers for repos it will not show, 404 otherwise.
        "repo": ["RepositoryNotFoundError", 401],
        "repo_auth": ["RepositoryNotFoundError", 404],
        "revision": ["RevisionNotFoundError", 404],
        "short_sha": ["RevisionNotFoundError", 404],
        "file_revision": ["RevisionNotFoundError", 404],
        "entry": ["RemoteEntryNotFoundError", 404],
    }
    status, headers, _ = http(f"{services.hub}/{MODEL_REPO}/resolve/main/nope.bin", method="HEAD")
    assert status == 404 and headers["X-Error-Code"] == "EntryNotFound"
    assert headers["X-Repo-Commit"] == model.later_commit
    status, headers, _ = http(f"{services.hub}/api/models/{MODEL_REPO}/revision/{'f' * 40}")
    assert status == 404 and headers["X-Error-Code"] == "RevisionNotFound"
    status, headers, _ = http(f"{services.hub}/other/repo/resolve/main/x")
    assert status == 401 and headers["X-Error-Code"] == "RepoNotFound"


def test_gated_repo_needs_a_token(services: Services, tmp_path: Path) -> None:
    result = hf(
        services,
        tmp_path,
        f"""
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub.errors import GatedRepoError, HfHubHTTPError
        result = {{}}
        for key, token in (("none", False), ("bad", "hf_not_a_real_token_at_all_0000000000"),
                           ("outsider", {OTHER_TOKEN!r}), ("good", {TOKEN!r})):
            try:
                path = hf_hub_download({GATED_REPO!r}, "model.safetensors", token=token,
                                       cache_dir=os.environ["HF_HOME"] + "/" + key)
                result[key] = ["ok", os.path.getsize(path)]
            except HfHubHTTPError as e:
                result[key] = [type(e).__name__, e.response.status_code]
        # Metadata of a gated repo is public, as on the Hub.
        result["info"] = HfApi().model_info({GATED_REPO!r}, token=False).gated
        result["whoami"] = HfApi(token={TOKEN!r}).whoami()["name"]
        """,
    )
    assert result["none"] == ["GatedRepoError", 401]
    assert result["bad"] == ["HfHubHTTPError", 401]
    assert result["outsider"] == ["GatedRepoError", 403]
    assert result["good"] == ["ok", 4096]
    assert result["info"] == "manual"
    assert result["whoami"] == "testbed"
    log = services.log_text()
    assert f"/{GATED_REPO}/resolve/" in log and "auth=Bearer" in log
    for secret in (TOKEN, OTHER_TOKEN, "hf_not_a_real_token_at_all"):
        assert secret not in log


def test_fault_spec_is_validated(services: Services) -> None:
    for bad in (b"[1]", b"{not json", b'{"corrupt": "x"}', b'{"cut_after_bytes": {"x": -1}}',
                b'{"typo": []}'):  # fmt: skip
        status, _, body = http(services.hub + "/_testbed/faults", method="POST", body=bad)
        assert status == 400, bad
        assert b"bad fault spec" in body
    status, _, body = http(services.hub + "/_testbed/faults")
    assert status == 200 and json.loads(body)["corrupt"] == []


def test_apt_static_files(services: Services) -> None:
    base = f"http://127.0.0.1:{services.ports['apt']}"
    release = (services.data / "apt/debian/dists/stable/Release").read_bytes()
    status, headers, body = http(base + "/debian/dists/stable/Release")
    assert status == 200 and body == release
    assert headers["Content-Length"] == str(len(release))
    status, headers, body = http(base + "/debian/dists/stable/Release", method="HEAD")
    assert status == 200 and body == b"" and headers["Content-Length"] == str(len(release))
    status, _, body = http(base + "/debian/dists/stable/Release", headers={"Range": "bytes=7-"})
    assert status == 206 and body == release[7:]
    status, _, body = http(base + "/rigfleet-testbed.asc")
    assert status == 200 and body.startswith(b"-----BEGIN PGP")
    assert http(base + "/debian/nope")[0] == 404
    assert http(base + "/../hub/_hub.json")[0] in (400, 404)
    assert http(base + "/%2e%2e/hub/_hub.json")[0] in (400, 404)
