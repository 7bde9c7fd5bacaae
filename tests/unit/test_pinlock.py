"""``rigfleet pins lock`` (rigfleet/pinlock.py) and the registry client (rigfleet/registry.py)
against a small registry v2 server: digests and image ids (index -> linux/amd64 -> config),
Docker Hub's token dance, and the messages for a gone tag, auth and network failures."""

from __future__ import annotations

import hashlib
import json
import socket
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from images_fakes import pins_text

from rigfleet import pinlock
from rigfleet.catalog import load_catalog
from rigfleet.pinlock import LockError, lock
from rigfleet.pins import UNRESOLVED, StackPins, load_pins
from rigfleet.registry import (
    DOCKER_HUB,
    Registry,
    RegistryError,
    RegistryNotFound,
    RegistryUnreachable,
    registry_of,
    split_image,
)

REPO = "vllm/vllm-openai"
GONE = "nightly-01d4d1ad375dc5854779c593eee093bcebb0cada"
NIGHTLY = "nightly-" + "b" * 40
TOKEN = "s3cret-registry-token"
HF_TOKEN = "hf_s3cretHubToken0123456789"
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class Store:
    """Manifests and blobs by reference; ``v0.27.1`` is a two-platform index."""

    def __init__(self) -> None:
        self.manifests: dict[str, tuple[str, bytes]] = {}
        self.blobs: dict[str, bytes] = {}
        self.image_ids: dict[str, str] = {}  # tag -> amd64 config digest
        self.add_index("v0.27.1", b"v0.27.1")
        self.add_single(NIGHTLY, b"nightly")
        self.auth = False
        self.deny = False
        self.truncate = False  # bodies cut short: a Content-Length above what is sent
        self.tag_list = json.dumps({"name": REPO, "tags": ["v0.27.1", NIGHTLY]}).encode()
        self.gated = False

    def image(self, seed: bytes, arch: str) -> tuple[str, bytes, str]:
        config = json.dumps({"architecture": arch, "os": "linux", "seed": seed.hex()}).encode()
        cdig = _digest(config)
        self.blobs[cdig] = config
        body = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                           "config": {"digest": cdig, "size": len(config)},
                           "layers": [{"digest": "sha256:" + "0" * 64, "size": 1000},
                                      {"digest": "sha256:" + "1" * 64, "size": 234}]}).encode()
        self.manifests[_digest(body)] = (MANIFEST, body)
        return _digest(body), body, cdig

    def add_index(self, tag: str, seed: bytes) -> str:
        amd, _, cdig = self.image(seed, "amd64")
        arm, _, _ = self.image(seed + b"arm", "arm64")
        body = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": [
            {"digest": arm, "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": amd, "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
        self.manifests[_digest(body)] = self.manifests[tag] = (INDEX, body)
        self.image_ids[tag] = cdig
        return _digest(body)

    def add_single(self, tag: str, seed: bytes) -> None:
        digest, body, cdig = self.image(seed, "amd64")
        self.manifests[tag] = (MANIFEST, body)
        self.image_ids[tag] = cdig


@pytest.fixture
def registry() -> Iterator[tuple[str, Store]]:
    store = Store()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body) + 100 * store.truncate))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/token":
                return self._send(200, json.dumps({"token": TOKEN}).encode())
            if path.startswith("/api/models/") and path.endswith("/revision/main"):
                # As the Hub: a gated model answers 401 "GatedRepo" without an accepted token.
                if store.gated and self.headers.get("Authorization") != f"Bearer {HF_TOKEN}":
                    return self._send(401, b'{"error":"Access to model is restricted"}',
                                      {"X-Error-Code": "GatedRepo",
                                       "X-Error-Message": "Access to model is restricted"})
                repo = path.removeprefix("/api/models/").removesuffix("/revision/main")
                return self._send(200, json.dumps({"id": repo, "sha": "c" * 40,
                                                   "siblings": []}).encode())
            if store.auth and self.headers.get("Authorization") != f"Bearer {TOKEN}" or \
                    store.deny:
                realm = f'Bearer realm="http://127.0.0.1:{self.server.server_port}/token",' \
                        f'service="test",scope="repository:{REPO}:pull"'
                return self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                                  {"WWW-Authenticate": realm})
            prefix = f"/v2/{REPO}/"
            if path == prefix + "tags/list":
                return self._send(200, store.tag_list)
            if path.startswith(prefix + "manifests/"):
                ref = path.rsplit("/", 1)[1]
                if ref in store.manifests:
                    media, body = store.manifests[ref]
                    return self._send(200, body, {"Content-Type": media,
                                                  "Docker-Content-Digest": _digest(body)})
            if path.startswith(prefix + "blobs/"):
                ref = path.rsplit("/", 1)[1]
                if ref in store.blobs:
                    return self._send(200, store.blobs[ref])
            return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", store
    server.shutdown()


def pins_file(tmp_path: Path, tag: str = "v0.27.1", hosts: str = "") -> Path:
    version = tag[1:] if tag.startswith("v") else f"0.20.2rc1.dev9+g{tag[8:17]}"
    path = tmp_path / "pins.yaml"
    path.write_text(pins_text(
        f'int8: {{image: "{REPO}:{tag}", digest: unresolved, vllm_version: {version}}}\n', hosts))
    return path


# --- the registry client ---------------------------------------------------------------------


def test_resolve_reads_index_then_amd64_manifest_then_config(registry) -> None:
    url, store = registry
    found = Registry(url).resolve(REPO, "v0.27.1")
    assert found.digest == _digest(store.manifests["v0.27.1"][1])
    assert found.image_id == store.image_ids["v0.27.1"]
    assert found.layer_bytes == 1234 and found.manifest_digest != found.digest
    by_digest = Registry(url).resolve(REPO, found.digest)
    assert by_digest == found
    single = Registry(url).resolve(REPO, NIGHTLY)
    assert single.digest == single.manifest_digest and single.image_id == store.image_ids[NIGHTLY]
    config = Registry(url).blob(REPO, found.image_id)  # checked against its digest
    assert json.loads(config)["architecture"] == "amd64"


def test_token_dance_and_the_token_never_in_a_message(registry) -> None:
    url, store = registry
    store.auth = True
    assert Registry(url).digest(REPO, "v0.27.1").startswith("sha256:")
    store.deny = True
    with pytest.raises(RegistryError) as e:
        Registry(url).digest(REPO, "v0.27.1")
    text = str(e.value)
    assert text.startswith(f"registry {url}: {REPO}:v0.27.1: access denied (HTTP 401")
    assert TOKEN not in text


def test_not_found_and_unreachable_name_registry_repository_and_tag(registry) -> None:
    url, _ = registry
    with pytest.raises(RegistryNotFound, match=rf"^registry {url}: {REPO}:{GONE}: not found "
                                               r"\(HTTP 404"):
        Registry(url).digest(REPO, GONE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(RegistryUnreachable, match=rf"^registry http://127.0.0.1:{port}: "
                                                  rf"{REPO}:v1: cannot reach the registry"):
        Registry(f"http://127.0.0.1:{port}", timeout=2).digest(REPO, "v1")


def test_a_body_cut_short_is_an_unreachable_registry_not_a_traceback(registry) -> None:
    url, store = registry
    store.truncate = True
    with pytest.raises(RegistryUnreachable, match=rf"^registry {url}: {REPO}:v0.27.1: cannot "
                                                  r"reach the registry \(IncompleteRead"):
        Registry(url, timeout=5).resolve(REPO, "v0.27.1")
    store.auth = True  # the token service's answer cut short
    with pytest.raises(RegistryUnreachable, match="cannot get a token from"):
        Registry(url, timeout=5).digest(REPO, "v0.27.1")


def test_a_tag_list_that_is_not_json_says_so_naming_the_registry(registry) -> None:
    url, store = registry
    assert Registry(url).tags(REPO) == ["v0.27.1", NIGHTLY]
    store.tag_list = b"<html>proxy login</html>"  # a proxy's page, HTTP 200
    with pytest.raises(RegistryError, match=rf"^registry {url}: {REPO} \(tag list\): the "
                                            "answer is not JSON"):
        Registry(url).tags(REPO)
    store.tag_list = b'["v1"]'
    with pytest.raises(RegistryError, match="not an object with a list of tags"):
        Registry(url).tags(REPO)


@pytest.mark.parametrize("media,doc,why", [
    (INDEX, {"manifests": ["sha256:" + "a" * 64]}, "no linux/amd64 image in the index"),
    (INDEX, {"manifests": {"linux/amd64": "x"}}, "the index's manifests are not a list"),
    (INDEX, {"manifests": [{"platform": {"os": "linux", "architecture": "amd64"}}]},
     "the index's linux/amd64 entry names no sha256 digest"),
    (MANIFEST, {"config": "sha256:" + "a" * 64}, "names no sha256 config"),
    (MANIFEST, {"config": {"digest": "sha256:" + "a" * 64}, "layers": [{"size": "big"}]},
     "layers are not a list of entries with a byte size"),
    (MANIFEST, {"config": {"digest": "sha256:" + "a" * 64}, "layers": 7},
     "layers are not a list of entries with a byte size"),
    (MANIFEST, {"config": {"digest": "sha256:" + "a" * 64}, "layers": [{"size": "1234"}]},
     "layers are not a list of entries with a byte size"),  # a descriptor's size is a number
])
def test_a_malformed_manifest_is_a_registry_error_naming_it(registry, media, doc, why) -> None:
    url, store = registry
    store.manifests["bad"] = (media, json.dumps(doc).encode())
    with pytest.raises(RegistryError, match=rf"^registry {url}: {REPO}:bad: .*{why}"):
        Registry(url).resolve(REPO, "bad")


def test_a_tag_list_follows_relative_and_absolute_next_links_on_its_host() -> None:
    pages: dict[str, tuple[list[str], str]] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            tags, link = pages.get(self.path, ([], ""))
            body = json.dumps({"name": REPO, "tags": tags}).encode()
            self.send_response(200 if self.path in pages else 404)
            if link:
                self.send_header("Link", f'<{link}>; rel="next"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    first, second, third = (f"/v2/{REPO}/tags/list?n=1000", f"/v2/{REPO}/tags/list?last=b",
                            f"/v2/{REPO}/tags/list?last=c")
    try:
        pages.update({first: (["a", "b"], second), second: (["c"], url + third),
                      third: (["d"], "")})
        assert Registry(url).tags(REPO) == ["a", "b", "c", "d"]
        pages[second] = (["c"], "http://elsewhere.test" + third)
        with pytest.raises(RegistryError, match=rf"^registry {url}: {REPO} \(tag list\): the "
                                                "next page of the tag list is on another host"):
            Registry(url).tags(REPO)
    finally:
        server.shutdown()


def test_a_tag_list_whose_next_link_comes_back_is_refused_not_read_forever() -> None:
    # A registry (or a proxy before it) whose Link header names a page already read: tags()
    # asked for it again and again, for ever (here the server gives up after 20 asks)
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(self.path)
            body = json.dumps({"name": REPO, "tags": ["a"]}).encode()
            self.send_response(200 if len(asked) < 20 else 500)
            self.send_header("Link", f'</v2/{REPO}/tags/list?last=a>; rel="next"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(RegistryError, match=rf"^registry {url}: {REPO} \(tag list\): the "
                           rf"next page of the tag list \(/v2/{REPO}/tags/list\?last=a\) was "
                           "read already"):
            Registry(url).tags(REPO)
        assert len(asked) == 2
    finally:
        server.shutdown()


def test_image_names() -> None:
    assert registry_of("vllm/vllm-openai") == (None, "vllm/vllm-openai")
    assert registry_of("docker.io/vllm/vllm-openai") == (None, "vllm/vllm-openai")
    assert registry_of("nginx") == (None, "library/nginx")
    assert registry_of("registry.lan:5000/vllm/vllm-openai") == ("registry.lan:5000",
                                                                 "vllm/vllm-openai")
    assert split_image("registry.lan:5000/a/b:v1") == ("registry.lan:5000/a/b", "v1")


# --- pins lock -------------------------------------------------------------------------------


def test_lock_writes_digest_and_image_id(registry, tmp_path) -> None:
    url, store = registry
    path = pins_file(tmp_path)
    changes = lock(path, url, "http://hub.invalid")
    digest = _digest(store.manifests["v0.27.1"][1])
    assert changes == [f"stacks.int8.digest: unresolved -> {digest}",
                       f"stacks.int8.image_id: (none) -> {store.image_ids['v0.27.1']}"]
    pins = load_pins(path)
    assert pins.stacks["int8"].digest == digest
    assert pins.stacks["int8"].image_id == store.image_ids["v0.27.1"]
    assert pins.serial == 2 and pins.history[-1]["action"] == "lock"
    assert lock(path, url, "http://hub.invalid") == []  # locked: nothing to do, nothing asked


def test_the_image_id_is_the_pinned_digests_not_the_moved_tags(registry, tmp_path) -> None:
    url, store = registry
    old = _digest(store.manifests["v0.27.1"][1])
    old_id = store.image_ids["v0.27.1"]
    path = pins_file(tmp_path)
    text = path.read_text().replace("digest: unresolved", f"digest: '{old}'")
    path.write_text(text)
    store.add_index("v0.27.1", b"re-pushed")  # the tag moves; the pin does not
    assert lock(path, url, "http://hub.invalid") == [
        f"stacks.int8.image_id: (none) -> {old_id}"]
    assert lock(path, url, url, refresh=True) == [
        f"stacks.int8.digest: {old} -> {_digest(store.manifests['v0.27.1'][1])}",
        f"stacks.int8.image_id: {old_id} -> {store.image_ids['v0.27.1']}",
        f"model.revision: {'a' * 40} -> {'c' * 40}"]


def test_a_gone_nightly_says_so_and_what_to_do(registry, tmp_path) -> None:
    url, _ = registry
    path = pins_file(tmp_path, tag=GONE)
    before = path.read_text()
    with pytest.raises(LockError) as e:
        lock(path, url, "http://hub.invalid")
    assert e.value.problems == [
        f"{path}: stacks.int8.image: {REPO}:{GONE} is not in {url} (vLLM keeps only the 14 "
        "newest nightly-* tags on Docker Hub; release tags stay); allowed: a release tag "
        "(vX.Y.Z), or import a saved copy (`rigfleet images import FILE`) and pin its digest "
        "and image id"]
    assert path.read_text() == before


def test_host_overrides_are_locked_too(registry, tmp_path) -> None:
    url, store = registry
    hosts = textwrap.dedent(f"""\
        hosts:
          host2:
            stacks:
              int8: {{image: "{REPO}:{NIGHTLY}", digest: unresolved,
                      vllm_version: 0.20.2rc1.dev9+g{"b" * 9}}}
        """)
    path = pins_file(tmp_path, hosts=hosts)
    lock(path, url, "http://hub.invalid")
    pins = load_pins(path)
    assert pins.hosts["host2"]["int8"].image_id == store.image_ids[NIGHTLY]
    assert yaml.safe_load(path.read_text())["hosts"]["host2"]["stacks"]["int8"]["image_id"] == \
        store.image_ids[NIGHTLY]


def test_a_gated_model_needs_the_token_file_and_the_token_is_never_shown(registry,
                                                                           tmp_path) -> None:
    url, store = registry
    store.gated = True
    text = pins_file(tmp_path).read_text().replace('revision: "' + "a" * 40 + '"',
                                                   "revision: unresolved")
    assert "revision: unresolved" in text
    path = tmp_path / "gated.yaml"
    path.write_text(text)
    with pytest.raises(LockError) as e:
        lock(path, url, url)
    assert "model.revision" in str(e.value) and "gated" in str(e.value)
    token = tmp_path / "hf-token"
    token.write_text(HF_TOKEN + "\n")
    token.chmod(0o600)
    changes = lock(path, url, url, token_file=str(token))
    assert "model.revision: unresolved -> " + "c" * 40 in changes
    assert HF_TOKEN not in path.read_text() and HF_TOKEN not in " ".join(changes)



@pytest.mark.parametrize("content", [HF_TOKEN + "\n" + HF_TOKEN + "2\n",
                                     b"\xff" + HF_TOKEN.encode(), HF_TOKEN + " x"])
def test_a_token_file_that_is_not_one_token_is_refused_by_name_never_shown(
        registry, tmp_path, content) -> None:
    # Two lines: the HTTP client refused the header and its error, the token in it, became
    # the lock's message ("Illegal header value b'Bearer hf_...'"); not UTF-8: a bare
    # "'utf-8' codec can't decode byte 0xff" naming no file
    url, store = registry
    store.gated = True
    path = tmp_path / "gated.yaml"
    path.write_text(pins_file(tmp_path).read_text().replace('revision: "' + "a" * 40 + '"',
                                                            "revision: unresolved"))
    token = tmp_path / "hf-token"
    token.write_bytes(content if isinstance(content, bytes) else content.encode())
    token.chmod(0o600)
    with pytest.raises(LockError) as e:
        lock(path, url, url, token_file=str(token))
    assert f"hf_token_file: {str(token)!r}" in str(e.value)
    assert "one line of letters, digits and -._~+/=" in str(e.value)
    assert HF_TOKEN not in str(e.value)


def test_lock_saves_nothing_when_the_checks_find_a_thing_missing(registry, tmp_path) -> None:
    url, _ = registry
    path = pins_file(tmp_path)
    before = path.read_text()
    seen = []

    def verify(pins):
        seen.append(pins.stacks["int8"].digest)
        return ["driver 580 (debian 13): missing at cuda http://apt.lan/debian13 /"]

    with pytest.raises(LockError, match="driver 580 .debian 13.: missing at cuda"):
        lock(path, url, url, verify=verify)
    assert seen and seen[0].startswith("sha256:")  # the new pins were the ones checked
    assert path.read_text() == before


def test_every_pinned_models_revision_is_locked(registry, tmp_path) -> None:
    url, _ = registry
    path = pins_file(tmp_path, hosts="models:\n  Org/Next-Model: {revision: unresolved}\n")
    assert lock(path, url, url)[-1] == f"models.Org/Next-Model.revision: unresolved -> {'c' * 40}"
    pins = load_pins(path)
    assert pins.model_for("Org/Next-Model").revision == "c" * 40
    assert pins.model_for("Org/Next-Model").local_dir == "next-model"
    assert pins.model.revision == "a" * 40  # the default model's pin did not move


def test_the_same_path_and_tag_on_two_registries_are_two_lookups(monkeypatch) -> None:
    """vllm/vllm-openai on Docker Hub and ghcr.io/vllm/vllm-openai share a path, not an image."""

    class Remote:
        def __init__(self, where: str, timeout: float = 0) -> None:
            self.where, self.timeout = where, timeout

        def digest(self, path: str, tag: str) -> str:
            return _digest(f"{self.where}/{path}:{tag}".encode())

        def resolve(self, path: str, digest: str) -> Any:
            return type("Resolved", (), {"image_id": _digest(f"{self.where}@{digest}".encode())})

    monkeypatch.setattr(pinlock, "Registry", Remote)
    r = pinlock._Resolver(Remote(DOCKER_HUB), "pins.yaml")  # type: ignore[arg-type]
    pins = [r.stack(f"stacks.{n}", StackPins(n, f"{image}:v0.27.1", UNRESOLVED, "0.27.1"), False)
            for n, image in (("hub", REPO), ("ghcr", f"ghcr.io/{REPO}"))]
    assert pins[0].digest == _digest(f"{DOCKER_HUB}/{REPO}:v0.27.1".encode())
    assert pins[1].digest == _digest(f"https://ghcr.io/{REPO}:v0.27.1".encode())
    assert pins[0].image_id != pins[1].image_id and not r.problems


def test_a_token_file_in_the_home_of_no_such_user_cannot_be_read_by_name() -> None:
    # Path.expanduser raised RuntimeError ("Could not determine home directory.")
    from rigfleet.hub import Hub, HubError

    with pytest.raises(HubError, match=r"^hf_token_file: '~no-such-user-rf/tok' cannot be read "
                                       r"\(No such file or directory\)$"):
        Hub("http://hub.invalid", "~no-such-user-rf/tok").revision("a/b")


def test_pins_lock_with_an_inventory_locks_a_stack_of_its_stacks_dir(registry, tmp_path,
                                                                       monkeypatch) -> None:
    # docs/stacks.md: pin your stack, then `rigfleet pins lock`; the pins were read with the
    # built-in stacks only: "stacks.mine: 'mine' is not a stack in the catalog", nothing locked
    from rigfleet import check, cli
    from rigfleet.catalog import BUILTIN_DIR
    from rigfleet.inventory import InventoryHost

    url, store = registry
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    text = (BUILTIN_DIR / "int8.yaml").read_text().replace("name: int8", "name: mine")
    (stacks / "mine.yaml").write_text(text.replace("port: 8011", "port: 8099"))
    path = pins_file(tmp_path)
    path.write_text(path.read_text().replace("  int8:", "  mine:"))
    hosts = [InventoryHost("rig-a", ("gpu_hosts",), {"stacks_dir": str(stacks)})]
    monkeypatch.setattr(cli, "fleet_hosts", lambda args: hosts)
    monkeypatch.setattr(check, "verify_pins", lambda hosts, pins, online: ([], []))
    assert cli.main(["pins", "lock", "--pins", str(path), "--registry", url, "--hub",
                     "http://hub.invalid", "--inventory", "inv.py"]) == 0
    assert load_pins(path, catalog=load_catalog([stacks])).stacks["mine"].digest == _digest(
        store.manifests["v0.27.1"][1])
