"""``--push-mirror``: the pinned image copied registry to registry, digest unchanged, with
blobs the mirror already has skipped; an index copied whole or as its amd64 manifest."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rigfleet.bump.images import MirrorRegistry, copy_image
from rigfleet.registry import RegistryError

REPO = "vllm/vllm-openai"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Store:
    """An in-memory registry: blobs, manifests by digest, tags."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[str, bytes]] = {}
        self.tags: dict[str, str] = {}
        self.uploads: dict[str, bytes] = {}
        self.puts = 0
        self.tokens: list[str] = []
        self.cut_blobs = False  # a blob's answer breaks off after half of it (a reset, a timeout)

    def add_image(self, tag: str, layers: list[bytes], arch: str = "amd64") -> str:
        config = json.dumps({"architecture": arch, "created": "2026-05-11T10:00:00Z"}).encode()
        self.blobs[sha(config)] = config
        for layer in layers:
            self.blobs[sha(layer)] = layer
        doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
               "config": {"digest": sha(config), "size": len(config)},
               "layers": [{"digest": sha(x), "size": len(x)} for x in layers]}  # fmt: skip
        body = json.dumps(doc).encode()
        self.manifests[sha(body)] = (OCI_MANIFEST, body)
        self.tags[tag] = sha(body)
        return sha(body)

    def add_index(self, tag: str, children: dict[str, str]) -> str:
        doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"digest": d, "mediaType": OCI_MANIFEST, "platform": {"os": "linux",
                                                                  "architecture": arch}}
            for arch, d in children.items()]}  # fmt: skip
        body = json.dumps(doc).encode()
        self.manifests[sha(body)] = (OCI_INDEX, body)
        self.tags[tag] = sha(body)
        return sha(body)


def serve(store: Store, auth: bool = False) -> tuple[ThreadingHTTPServer, str]:
    """With ``auth``: Docker Hub's bearer dance; writes need a token with push scope."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def handle_one_request(self) -> None:  # answers 401 before the verb's handler
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline or not self.parse_request():
                self.close_connection = True
                return
            if self.path.startswith("/token?"):
                scope = urllib.parse.parse_qs(self.path.split("?", 1)[1])["scope"][0]
                store.tokens.append(scope)
                return self._reply(200, json.dumps({"token": f"tok {scope}"}).encode())
            given = self.headers.get("Authorization", "").removeprefix("Bearer tok ")
            needed = "push" if self.command in ("POST", "PUT") else "pull"
            if auth and needed not in given.rpartition(":")[2].split(","):
                self._body()
                port = self.server.server_address[1]
                return self._reply(401, b"", {"WWW-Authenticate": (
                    f'Bearer realm="http://127.0.0.1:{port}/token",service="t",'
                    f'scope="repository:{REPO}:pull"')})
            getattr(self, f"do_{self.command}")()

        def _reply(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self) -> None:
            m = re.fullmatch(rf"/v2/{REPO}/(manifests|blobs)/([^?]+)", self.path)
            if not m:
                return self._reply(404)
            kind, ref = m.groups()
            if kind == "blobs":
                if ref in store.blobs and store.cut_blobs:
                    blob = store.blobs[ref]
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(blob)))
                    self.end_headers()
                    self.wfile.write(blob[: len(blob) // 2])
                    self.close_connection = True
                    return None
                if ref in store.blobs:
                    return self._reply(200, store.blobs[ref], {"Docker-Content-Digest": ref})
                return self._reply(404)
            digest = store.tags.get(ref, ref)
            if digest not in store.manifests:
                return self._reply(404)
            media, body = store.manifests[digest]
            return self._reply(200, body, {"Content-Type": media, "Docker-Content-Digest": digest})

        do_HEAD = do_GET

        def do_POST(self) -> None:
            self._body()
            uid = uuid.uuid4().hex
            store.uploads[uid] = b""
            self._reply(202, headers={"Location": f"/v2/{REPO}/blobs/uploads/{uid}"})

        def do_PUT(self) -> None:
            body = self._body()
            m = re.fullmatch(rf"/v2/{REPO}/blobs/uploads/(\w+)\?digest=(sha256%3A\w+)", self.path)
            if m:
                digest = m.group(2).replace("%3A", ":")
                if sha(body) != digest:
                    return self._reply(400, b"digest mismatch")
                store.blobs[digest] = body
                return self._reply(201, headers={"Docker-Content-Digest": digest})
            m = re.fullmatch(rf"/v2/{REPO}/manifests/(.+)", self.path)
            if m:
                store.puts += 1
                doc = json.loads(body)
                refs = [doc.get("config", {}).get("digest"),
                        *(x["digest"] for x in doc.get("layers", []))]  # fmt: skip
                refs += [x["digest"] for x in doc.get("manifests", [])]
                missing = [r for r in refs if r and r not in store.blobs
                           and r not in store.manifests]  # fmt: skip
                if missing:  # like distribution: references must exist first
                    return self._reply(400, f"unknown {missing}".encode())
                store.manifests[sha(body)] = (self.headers["Content-Type"], body)
                if not m.group(1).startswith("sha256:"):
                    store.tags[m.group(1)] = sha(body)
                return self._reply(201, headers={"Docker-Content-Digest": sha(body)})
            return self._reply(404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


@pytest.fixture
def registries() -> Iterator[tuple[Store, str, Store, str]]:
    src, dst = Store(), Store()
    s1, u1 = serve(src)
    s2, u2 = serve(dst)
    yield src, u1, dst, u2
    s1.shutdown()
    s2.shutdown()


def test_copy_keeps_the_digest_and_skips_present_blobs(registries) -> None:
    src, u1, dst, u2 = registries
    digest = src.add_image("nightly-a", [b"layer-one" * 100, b"layer-two" * 50])
    dst.blobs[sha(b"layer-one" * 100)] = b"layer-one" * 100  # the mirror has a shared layer
    copied = copy_image(MirrorRegistry(u1), MirrorRegistry(u2), REPO, "nightly-a", digest)
    assert copied.digest == digest
    assert copied.blobs_copied == 2  # config + layer two
    assert dst.tags["nightly-a"] == digest
    assert copied.ref == f"{u2.removeprefix('http://')}/{REPO}:nightly-a"
    again = copy_image(MirrorRegistry(u1), MirrorRegistry(u2), REPO, "nightly-a", digest)
    assert again.blobs_copied == 0


def test_index_copied_whole(registries) -> None:
    src, u1, dst, u2 = registries
    amd = src.add_image("x-amd64", [b"amd" * 10])
    arm = src.add_image("x-arm64", [b"arm" * 10], arch="arm64")
    index = src.add_index("nightly-b", {"amd64": amd, "arm64": arm})
    whole = copy_image(MirrorRegistry(u1), MirrorRegistry(u2), REPO, "nightly-b", index)
    assert whole.digest == index and {amd, arm} <= set(dst.manifests)


def test_unreachable_mirror_is_an_error(registries) -> None:
    src, u1, _, _ = registries
    digest = src.add_image("nightly-c", [b"c"])
    with pytest.raises(RegistryError, match="cannot reach"):
        copy_image(MirrorRegistry(u1), MirrorRegistry("http://127.0.0.1:9"), REPO,
                   "nightly-c", digest)  # fmt: skip


def test_a_transfer_that_breaks_off_is_a_registry_error(registries) -> None:
    """The source's answer ends mid-blob: the bump's mirror step gets a ``RegistryError`` to
    report (it goes on without the copy), not an exception from deep in http.client."""
    src, u1, dst, u2 = registries
    digest = src.add_image("nightly-e", [b"e" * 200_000])
    src.cut_blobs = True
    with pytest.raises(RegistryError, match="broke off"):
        copy_image(MirrorRegistry(u1, timeout=2), MirrorRegistry(u2, timeout=2), REPO,
                   "nightly-e", digest)
    assert "nightly-e" not in dst.tags


def test_copy_through_bearer_tokens() -> None:
    src, dst = Store(), Store()
    digest = src.add_image("nightly-d", [b"d" * 10])
    (s1, u1), (s2, u2) = serve(src, auth=True), serve(dst, auth=True)
    try:
        copied = copy_image(MirrorRegistry(u1), MirrorRegistry(u2), REPO, "nightly-d", digest)
    finally:
        s1.shutdown()
        s2.shutdown()
    assert copied.digest == digest and dst.tags["nightly-d"] == digest
    assert src.tokens == [f"repository:{REPO}:pull"]  # one token per registry client
    assert dst.tokens == [f"repository:{REPO}:pull,push"]  # writes ask for push scope


@pytest.mark.parametrize("doc", [
    [1, 2],
    {"mediaType": OCI_INDEX, "manifests": [{"mediaType": OCI_MANIFEST}]},
    {"mediaType": OCI_INDEX, "manifests": ["sha256:" + "a" * 64]},
    {"mediaType": OCI_MANIFEST, "config": {"digest": "sha256:" + "c" * 64, "size": "big"}},
    {"mediaType": OCI_MANIFEST, "layers": "sha256:" + "c" * 64},
    {"mediaType": OCI_MANIFEST, "layers": [None]},
], ids=["not-an-object", "entry-without-digest", "entry-not-an-object", "size-not-a-number",
        "layers-not-a-list", "layer-not-an-object"])
def test_a_malformed_manifest_is_a_registry_error(registries, doc) -> None:
    """The bump's mirror step (after the rollout, before the pins file is written) reports a
    ``RegistryError`` and goes on; a KeyError, AttributeError or ValueError from a source's odd
    manifest stopped the pins file being written, and every resume repeated it."""
    src, u1, dst, u2 = registries
    body = json.dumps(doc).encode()
    src.manifests[sha(body)] = (OCI_MANIFEST, body)
    with pytest.raises(RegistryError, match=f"{REPO}"):
        copy_image(MirrorRegistry(u1), MirrorRegistry(u2), REPO, "nightly-f", sha(body))
    assert "nightly-f" not in dst.tags
