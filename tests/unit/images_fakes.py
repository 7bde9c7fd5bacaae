"""Fakes for the image tests: a registry that knows some digests, and a tiny ``docker save``.

``FakeHub`` answers the two calls the source checks make (``digest``: a HEAD by digest;
``resolve``: the manifests' sizes) the way a registry fails: an unknown digest is a 404
(``RegistryNotFound``), an ``unreachable`` hub raises ``RegistryUnreachable``.
``docker_save_tar`` writes an archive in ``docker save``'s layout (manifest.json, the config,
one layer), so the archive code reads a real tar.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import runpy
import tarfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from rigfleet.inventory import InventoryHost
from rigfleet.registry import RegistryNotFound, RegistryUnreachable, ResolvedImage
from rigfleet.ssh import HostUnreachable

REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeHub:
    """A registry at ``url`` holding ``known``: digest -> (image id, compressed layer bytes)."""

    calls: list[tuple[str, str, str]] = []

    def __init__(self, url: str, known: dict[str, tuple[str, int]] | None = None,
                 unreachable: bool = False) -> None:
        self.base_url = url
        self.known = known or {}
        self.unreachable = unreachable

    @property
    def where(self) -> str:
        return self.base_url

    def _find(self, method: str, repo: str, ref: str) -> tuple[str, int]:
        FakeHub.calls.append((method, self.base_url, f"{repo}@{ref}"))
        if self.unreachable:
            raise RegistryUnreachable(f"registry {self.base_url}: {repo}@{ref}: cannot reach "
                                      "the registry (Name or service not known)")
        if ref not in self.known:
            raise RegistryNotFound(f"registry {self.base_url}: {repo}@{ref}: not found")
        return self.known[ref]

    def digest(self, repo: str, ref: str) -> str:
        self._find("HEAD", repo, ref)
        return ref

    def resolve(self, repo: str, ref: str) -> ResolvedImage:
        image_id, size = self._find("GET", repo, ref)
        return ResolvedImage(ref, image_id, ref, size)


def image_config(payload: bytes = b"layer") -> bytes:
    """An image config; its sha256 is the image id."""
    return json.dumps({"architecture": "amd64", "os": "linux",
                       "rootfs": {"type": "layers", "diff_ids": []},
                       "payload": hashlib.sha256(payload).hexdigest()}).encode()


def write_save_tar(f: BinaryIO, config: bytes, tags: list[str] | None, oci: bool = False,
                   payload: bytes = b"layer") -> str:
    """Write a ``docker save``-shaped archive (manifest.json, the config, one layer) into
    ``f``; returns its image id."""
    hexid = hashlib.sha256(config).hexdigest()
    config_name = f"blobs/sha256/{hexid}" if oci else f"{hexid}.json"
    manifest = [{"Config": config_name, "RepoTags": tags, "Layers": ["layer0/layer.tar"]}]
    with tarfile.open(fileobj=f, mode="w") as tar:
        for name, data in (("layer0/layer.tar", payload), (config_name, config),
                           ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return f"sha256:{hexid}"


def docker_save_tar(path: Path, tags: list[str] | None, payload: bytes = b"layer",
                    oci: bool = False) -> str:
    """Write a ``docker save``-shaped archive at ``path``; returns its image id."""
    with path.open("wb") as f:
        return write_save_tar(f, image_config(payload), tags, oci, payload)


def image_id_of(digest: str) -> str:
    """The image id (config digest) a pull of ``digest`` brings, in these fakes."""
    return "sha256:" + hashlib.sha256(f"config of {digest}".encode()).hexdigest()


@dataclass
class FakeImage:
    """One image in a fake engine: its references (``repo@digest``, ``repo:tag``) and, for an
    image that can be saved, its config (the id is the config's sha256)."""

    id: str
    digests: set[str] = field(default_factory=set)
    tags: set[str] = field(default_factory=set)
    config: bytes | None = None


def _repo(name: str) -> str:
    return name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name


@dataclass
class FakeEngine:
    """A host's Docker engine as the image code sees it: it answers ``state_script`` and applies
    ``docker pull`` (of a digest: the image ``pulls`` or ``image_id_of`` says), ``docker tag``,
    ``docker load -i`` (of ``archives``), and loads/saves real tars (``load_tar``,
    ``save_tar``)."""

    images: dict[str, FakeImage] = field(default_factory=dict)
    archives: dict[str, tuple[str, tuple[str, ...], int]] = field(default_factory=dict)
    # What the registry serves: digest -> image id (default ``image_id_of``).
    pulls: dict[str, str] = field(default_factory=dict)
    free: int = 500 * 1024**3
    installed: bool = True

    def add(self, image_id: str, digests: set[str] | None = None,
            tags: set[str] | None = None, config: bytes | None = None) -> FakeImage:
        image = self.images.setdefault(image_id, FakeImage(image_id))
        image.digests |= digests or set()
        image.config = config or image.config
        for tag in tags or set():
            for other in self.images.values():
                other.tags.discard(tag)
            image.tags.add(tag)
        return image

    def find(self, ref: str) -> FakeImage | None:
        """What ``docker image inspect <ref>`` finds: by id, ``repo@digest`` or ``repo:tag``
        (a ``repo:tag@digest`` looks up the digest alone, as Docker does)."""
        if ref in self.images:
            return self.images[ref]
        if "@" in ref:
            name, _, digest = ref.partition("@")
            want = f"{_repo(name)}@{digest}"
            return next((i for i in self.images.values() if want in i.digests), None)
        return next((i for i in self.images.values() if ref in i.tags), None)

    def state(self, cmd: str) -> list[str]:
        """The answer to ``rigfleet.images.hoststate.state_script``."""
        out = ["root\t/var/lib/docker"]
        for ref in re.findall(r"^rf_img (\S+)$", cmd, re.M):
            ref = ref.strip("'")
            image = self.find(ref) if self.installed else None
            if image is None:
                out.append(f"image\t{ref}\t-")
            else:
                out.append("\t".join(("image", ref, image.id, json.dumps(sorted(image.digests)),
                                      json.dumps(sorted(image.tags)))))
        for path in re.findall(r"^rf_path (\S+)$", cmd, re.M):
            path = path.strip("'")
            files = sorted(p for p in self.archives if p.startswith(path.rstrip("/") + "/"))
            if files:
                out.append(f"dir\t{path}")
            elif path in self.archives:
                files = [path]
            else:
                out.append(f"archive\t{path}\tmissing")
            for f in files:
                image_id, tags, size = self.archives[f]
                manifest = [{"Config": image_id.removeprefix("sha256:") + ".json",
                             "RepoTags": list(tags), "Layers": []}]
                out.append(f"archive\t{f}\t{size}\t{json.dumps(manifest)}")
        for key in re.findall(r"^rf_free (\S+)$", cmd, re.M):
            out.append(f"free\t{key.strip(chr(39))}\t/dev/fake\t{self.free}")
        return out

    def apply(self, cmd: str) -> tuple[bool, list[str]] | None:
        """Apply a pull, tag or ``load -i``; None for any other command."""
        if cmd.startswith("root=$(docker info") and "rf_img()" in cmd:
            return True, self.state(cmd)
        m = re.match(r"\{ curl -fsS \S+ \| docker load -q >/dev/null && .*?; \} \|\| "
                     r"\{ echo .*? >&2; (.*); \}$", cmd)
        if m:  # a peer's load: no fake serves peers (curl fails), so its fallback runs
            for part in m.group(1).split(" && "):
                done = self.apply(part)
                if done is None or not done[0]:
                    return False, done[1] if done else [f"cannot run {part}"]
            return True, []
        m = re.match(r"docker pull --quiet (\S+)$", cmd)
        if m:
            name, _, digest = m.group(1).partition("@")
            image_id = self.pulls.get(digest) or image_id_of(digest)
            self.add(image_id, digests={f"{_repo(name)}@{digest}"})
            return True, []
        m = re.match(r"docker tag (\S+) (\S+)$", cmd)
        if m:
            found = self.find(m.group(1).strip("'"))
            if found is None:
                return False, [f"Error response from daemon: No such image: {m.group(1)}"]
            self.add(found.id, tags={m.group(2).strip("'")})
            return True, []
        m = re.match(r"docker load -i (\S+)", cmd)
        if m:
            path = m.group(1).strip("'")
            if path not in self.archives:
                return False, [f"open {path}: no such file or directory"]
            image_id, tags, _ = self.archives[path]
            self.add(image_id, tags=set(tags))
            return True, [f"Loaded image ID: {image_id}"]
        return None

    def load_tar(self, data: bytes) -> str:
        """``docker load`` of a real archive: every image in its manifest, by config hash."""
        lines: list[str] = []
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
            for entry in manifest:
                config = tar.extractfile(entry["Config"]).read()  # type: ignore[union-attr]
                image_id = "sha256:" + hashlib.sha256(config).hexdigest()
                tags = entry.get("RepoTags") or []
                self.add(image_id, tags=set(tags), config=config)
                lines += [f"Loaded image: {t}" for t in tags] or [f"Loaded image ID: {image_id}"]
        return "\n".join(lines) + "\n"

    def save_tar(self, ref: str) -> bytes:
        """``docker save <ref>``: the image under that name, as a real tar."""
        image = self.find(ref)
        if image is None or image.config is None:
            raise KeyError(ref)
        buf = io.BytesIO()
        write_save_tar(buf, image.config, [ref] if not ref.startswith("sha256:") else None)
        return buf.getvalue()


class FakeRemote:
    """``rigfleet.ssh.Remote`` for hosts running fake engines (``engines`` by host name, or one
    ``engine`` for every host); ``corrupt`` makes ``docker save`` write another image (a wrong
    archive), ``load_fails`` makes ``docker load`` fail, ``down`` hosts are unreachable."""

    def __init__(self, engine: FakeEngine | None = None,
                 engines: dict[str, FakeEngine] | None = None) -> None:
        self.engine = engine or FakeEngine()
        self.engines = engines or {}
        self.down: set[str] = set()
        self.commands: list[str] = []
        self.corrupt = False
        self.load_fails = False

    def run(self, host: InventoryHost, command: str, *, timeout: float = 120,
            stdin: bytes = b"") -> tuple[int, str]:
        self.commands.append(command)
        if host.name in self.down:
            raise HostUnreachable(f"{host.name}: ssh root@{host.name}:22: connection refused")
        answer = self.on(host).apply(command)
        if answer is None:
            return 0, ""
        ok, lines = answer
        return (0 if ok else 1), "\n".join(lines) + "\n"

    def stream_out(self, host: InventoryHost, command: str, dest: BinaryIO, *,
                   timeout: float = 3600) -> tuple[int, str]:
        self.commands.append(command)
        tag = re.search(r"docker tag (\S+) (\S+) >&2 \|\| exit 3", command)
        assert tag is not None
        engine = self.on(host)
        engine.apply(f"docker tag {tag.group(1)} {tag.group(2)}")
        name = re.search(r"docker save (\S+);", command).group(1).strip("'")  # type: ignore[union-attr]
        data = engine.save_tar(name)
        if self.corrupt:
            other = FakeEngine()
            other.add("sha256:" + hashlib.sha256(image_config(b"x")).hexdigest(),
                      tags={name}, config=image_config(b"x"))
            data = other.save_tar(name)
        dest.write(data)
        return 0, ""

    def stream_in(self, host: InventoryHost, command: str, src: BinaryIO, *,
                  timeout: float = 3600) -> tuple[int, str]:
        self.commands.append(command)
        assert command == "docker load"
        data = b""
        while chunk := src.read(1 << 16):
            data += chunk
        if self.load_fails:
            return 1, "Error processing tar file(exit status 1): unexpected EOF"
        return 0, self.on(host).load_tar(data)

    def reachable(self, host: InventoryHost) -> str | None:
        return "connection refused" if host.name in self.down else None

    def on(self, host: InventoryHost) -> FakeEngine:
        return self.engines.get(host.name, self.engine)


def pins_text(stacks: str, hosts: str = "") -> str:
    """A pins file whose ``stacks:`` section is ``stacks`` (YAML lines, indented two spaces)
    and, optionally, a ``hosts:`` section."""
    head = textwrap.dedent(f"""\
        schema: rigfleet-pins/1
        serial: 1
        driver: {{branch: "580"}}
        container_toolkit: {{version: 1.17.8-1}}
        huggingface_hub: {{version: 2.4.0}}
        model: {{repo: Lorbus/Qwen3.6-27B-int4-AutoRound, revision: "{"a" * 40}",
                 local_dir: qwen3.6-27b-autoround-int4}}
        stacks:
        """)
    return head + textwrap.indent(textwrap.dedent(stacks), "  ") + hosts + "history: []\n"


def fleet_data(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """Host data as inventory/group_data/all.py gives it, with an API key file in ``tmp_path``."""
    defaults = runpy.run_path(str(REPO_ROOT / "inventory" / "group_data" / "all.py"))
    key = tmp_path / "api-key"
    key.write_text("k" * 40 + "\n")
    os.chmod(key, 0o600)
    return {**{k: v for k, v in defaults.items() if not k.startswith("__")},
            "api_key_file": str(key), **extra}
