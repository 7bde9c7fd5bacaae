"""Saved images (``docker save`` archives) here, matched to a pin by image id, and their JSON
sidecars, which keep the rest of the pin (docs/images.md, "`rigfleet images`")::

    info = inspect_archive("/srv/image-archive/vllm_vllm-openai_v0.27.1.tar")
    info.holds("sha256:...")           # True when one of its images has that id
    info.sidecar["digest"]             # what `rigfleet images export` recorded
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigfleet.errors import RigfleetError
from rigfleet.hostside.atomic import write_atomic
from rigfleet.hostside.records import read_json

SIDECAR_SCHEMA = "rigfleet-image-archive/1"
_CONFIG_NAME = re.compile(r"(?:blobs/sha256/)?(?P<hex>[0-9a-f]{64})(?:\.json)?")
_CACHE: dict[tuple[str, int, int], ArchiveInfo] = {}


class ArchiveError(RigfleetError, ValueError):
    """An archive that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ArchivedImage:
    """One image in an archive: its id and the tags ``docker load`` restores."""

    image_id: str
    repo_tags: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.image_id[:19]} ({', '.join(self.repo_tags) or 'untagged'})"


@dataclass(frozen=True)
class ArchiveInfo:
    path: str
    size: int
    images: tuple[ArchivedImage, ...]
    sidecar: dict[str, Any] = field(default_factory=dict)

    def holds(self, image_id: str | None) -> bool:
        return image_id is not None and any(i.image_id == image_id for i in self.images)

    @property
    def label(self) -> str:
        return ", ".join(i.label for i in self.images) or "no image"


def archive_name(image: str) -> str:
    """``vllm/vllm-openai:v0.27.1`` -> ``vllm_vllm-openai_v0.27.1.tar``."""
    return image.replace("/", "_").replace(":", "_") + ".tar"


def images_in_manifest(manifest: Any) -> tuple[ArchivedImage, ...]:
    """The images a ``manifest.json`` names, ids taken from the config file names (unhashed)."""
    if not isinstance(manifest, list):
        raise ValueError("manifest.json is not a list")
    out = []
    for entry in manifest:
        config = entry.get("Config") if isinstance(entry, dict) else None
        m = _CONFIG_NAME.fullmatch(config) if isinstance(config, str) else None
        if m is None:
            raise ValueError(f"manifest.json names no sha256 config ({config!r})")
        tags = entry.get("RepoTags") or []
        out.append(ArchivedImage(f"sha256:{m.group('hex')}", tuple(str(t) for t in tags)))
    return tuple(out)


def inspect_archive(path: str | Path) -> ArchiveInfo:
    """What a ``docker save`` archive holds (configs hashed) and its sidecar; cached per mtime."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise ArchiveError(f"{p}: {e.strerror or e}") from None
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key in _CACHE:
        return _CACHE[key]
    try:
        with tarfile.open(p, "r:*") as tar:
            try:
                manifest = json.loads(_read(tar, "manifest.json"))
            except KeyError:
                raise ValueError("it holds no manifest.json") from None
            listed, held = images_in_manifest(manifest), set(tar.getnames())
            if missing := [e["Config"] for e in manifest if e["Config"] not in held]:
                raise ValueError(f"manifest.json names {missing[0]}, which it does not hold")
            images = tuple(
                ArchivedImage("sha256:" + hashlib.sha256(_read(tar, entry["Config"])).hexdigest(),
                              named.repo_tags)
                for entry, named in zip(manifest, listed, strict=True))
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ArchiveError(f"{p}: not a readable `docker save` archive ({e})") from None
    except ValueError as e:
        raise ArchiveError(f"{p}: not a `docker save` archive: {e}") from None
    return _CACHE.setdefault(key, ArchiveInfo(str(p), st.st_size, images, read_sidecar(p)))


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    if (f := tar.extractfile(tar.getmember(name))) is None:
        raise ValueError(f"{name} is not a file")
    return f.read()


def read_sidecar(archive: str | Path) -> dict[str, Any]:
    """The archive's sidecar ``x.json`` (``{}`` when there is none or it is not JSON)."""
    data, _ = read_json(Path(archive).with_suffix(".json"))
    return data if isinstance(data, dict) else {}


def write_sidecar(archive: str | Path, **pin: Any) -> None:
    """Write ``x.json`` next to ``x.tar``: the pin it is a copy of and how to restore it."""
    name = Path(archive).name
    data = {"schema": SIDECAR_SCHEMA, **pin, "archive": name,
            "restore": f"rigfleet images import {name} --host <host> (or: docker load -i {name})"}
    write_atomic(Path(archive).with_suffix(".json"), json.dumps(data, indent=2) + "\n")
