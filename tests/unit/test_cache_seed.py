"""files/rigfleet-cache-seed.py against a token-guarded upstream that redirects blobs to a
"CDN", and a seeding registry on a unix socket (both local HTTP servers): each blob of the
linux/amd64 image is fetched once, checked, uploaded; nothing unverified is stored."""

from __future__ import annotations

import hashlib
import http.server
import json
import socketserver
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from http_fakes import QuietHandler

from scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "files" / "rigfleet-cache-seed.py"
REPO = "vllm/vllm-openai"
TOKEN = "t0ken-for-the-upstream-only"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def seeder() -> ModuleType:
    return load_script("files/rigfleet-cache-seed.py")


class Upstream:
    """An index with an arm64 and an amd64 image; blob GETs counted per digest."""

    def __init__(self) -> None:
        self.blobs = {sha(b): b for b in (b'{"config": 1}', b"layer-one" * 1000, b"layer-2")}
        cfg, l1, l2 = self.blobs
        amd64 = json.dumps({"config": {"digest": cfg, "size": len(self.blobs[cfg])},
                            "layers": [{"digest": d, "size": len(self.blobs[d])}
                                       for d in (l1, l2)]}).encode()
        arm64 = json.dumps({"config": {"digest": "sha256:" + "a" * 64, "size": 1},
                            "layers": []}).encode()
        self.manifests = {sha(amd64): amd64, sha(arm64): arm64}
        index = json.dumps({"manifests": [
            {"digest": sha(arm64), "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": sha(amd64), "platform": {"os": "linux", "architecture": "amd64"}}]})
        self.index = sha(index.encode())
        self.manifests[self.index] = index.encode()
        self.gets: Counter[str] = Counter()
        self.auth_on_cdn = 0
        self.bad: set[str] = set()


@pytest.fixture()
def upstream() -> Iterator[tuple[Upstream, str]]:
    up = Upstream()

    class Handler(QuietHandler):

        def do_GET(self) -> None:
            base = f"http://127.0.0.1:{self.server.server_address[1]}"
            if self.path.startswith("/token?"):
                return self._send(200, json.dumps({"token": TOKEN}).encode())
            if self.path.startswith("/cdn/"):
                d = self.path[5:]
                up.auth_on_cdn += "Authorization" in self.headers
                up.gets[d] += 1
                body = up.blobs[d]
                return self._send(200, body[:-1] + b"X" if d in up.bad else body)
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._send(401, headers={"WWW-Authenticate": (
                    f'Bearer realm="{base}/token",service="reg",scope="repository:{REPO}:pull"')})
            kind, _, ref = self.path.removeprefix(f"/v2/{REPO}/").partition("/")
            if kind == "manifests" and ref in up.manifests:
                return self._send(200, up.manifests[ref])
            if kind == "blobs" and ref in up.blobs:
                return self._send(307, headers={"Location": f"{base}/cdn/{ref}"})
            self._send(404)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield up, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture()
def local(tmp_path) -> Iterator[tuple[dict[str, bytes], str]]:
    """A registry's blob API on a unix socket: HEAD, POST uploads, PUT ?digest= (checked)."""
    stored: dict[str, bytes] = {}

    class Handler(QuietHandler):
        def address_string(self) -> str:
            return "unix"

        def do_GET(self) -> None:
            self._send(200 if self.path == "/v2/" else 404)

        def do_HEAD(self) -> None:
            self._send(200 if self.path.rsplit("/", 1)[-1] in stored else 404)

        def do_POST(self) -> None:
            self._send(202, headers={"Location": f"http://localhost/v2/{REPO}/blobs/uploads/"
                                                 f"{uuid.uuid4()}?_state=abc"})

        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            digest = self.path.split("digest=", 1)[1].replace("%3A", ":")
            if "_state=abc" not in self.path or sha(body) != digest:
                return self._send(400)
            stored[digest] = body
            self._send(201)

    path = str(tmp_path / "seed.sock")
    server = UnixHTTPServer(path, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield stored, path
    server.shutdown()


def run(seeder, base: str, sock: str, digest: str, tmp_path: Path) -> int:
    return seeder.main(["--upstream", base, "--socket", sock, "--repo", REPO, "--digest",
                        digest, "--marker", str(tmp_path / "warm" / "m"),
                        "--spool", str(tmp_path / "spool")])


def test_each_amd64_blob_is_fetched_once_checked_and_stored(seeder, upstream, local,
                                                            tmp_path, capsys):
    (up, base), (stored, sock) = upstream, local
    assert run(seeder, base, sock, up.index, tmp_path) == 0
    assert stored == up.blobs  # the amd64 image's config and layers, nothing of arm64's
    assert dict(up.gets) == dict.fromkeys(up.blobs, 1)
    assert up.auth_on_cdn == 0  # the token went to the upstream, not on its redirects
    assert (tmp_path / "warm" / "m").read_text() == f"{REPO}@{up.index}\n"
    assert not list((tmp_path / "spool").iterdir())
    assert TOKEN not in capsys.readouterr().out
    # A second run finds every blob held and fetches nothing.
    assert run(seeder, base, sock, up.index, tmp_path) == 0
    assert dict(up.gets) == dict.fromkeys(up.blobs, 1)
    assert "3 blobs, 0 to fetch" in capsys.readouterr().out


def test_a_blob_that_fails_its_digest_is_not_stored_and_no_marker_is_written(
        seeder, upstream, local, tmp_path, capsys):
    (up, base), (stored, sock) = upstream, local
    bad = list(up.blobs)[1]
    up.bad.add(bad)
    assert run(seeder, base, sock, up.index, tmp_path) == 1
    assert bad not in stored and not (tmp_path / "warm" / "m").exists()
    assert not list((tmp_path / "spool").iterdir())
    err = capsys.readouterr().err
    assert f"blob {bad}" in err and "not stored" in err


def test_a_manifest_that_is_not_the_pinned_digest_is_refused(seeder, upstream, local,
                                                             tmp_path, capsys):
    (up, base), (stored, sock) = upstream, local
    up.manifests[up.index] = b'{"manifests": []}'
    assert run(seeder, base, sock, up.index, tmp_path) == 1
    assert not stored and f"manifest {up.index} came with sha256" in capsys.readouterr().err


def test_a_digest_that_is_not_sha256_is_a_usage_error(seeder, tmp_path, capsys):
    assert run(seeder, "http://x", "/nope", "latest", tmp_path) == 2
    assert "allowed: sha256:<64 hex>" in capsys.readouterr().err
