"""The candidate image, from the registry's v2 API: its tag, manifest digest and build time.

vLLM publishes ``vllm/vllm-openai:nightly-<40-hex commit>`` per build (multi-arch indexes on
Docker Hub); the moving ``nightly`` tag pins nothing, so a candidate is always one of the
commit tags, pinned by the manifest digest the registry reports now. ``--latest`` means the
newest of those by the image config's ``created`` time (tags carry no order; Hub keeps ~14)::

    reg = ImageRegistry("https://registry-1.docker.io")
    cand = find_candidate(reg, "vllm/vllm-openai", tag="nightly-3f9c2a7e5b1d...")
    cand.ref            # "vllm/vllm-openai:nightly-3f9c...@sha256:..."
    latest = find_candidate(reg, "vllm/vllm-openai", latest=True)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rigfleet.registry import MANIFEST_TYPES, Registry, RegistryError

NIGHTLY_TAG = re.compile(r"nightly-(?P<sha>[0-9a-f]{40})")
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
# The rigs are x86_64 boxes with RTX 3090s.
PLATFORM = ("linux", "amd64")


@dataclass(frozen=True)
class Candidate:
    """One image the fleet could move to."""

    repository: str  # vllm/vllm-openai
    tag: str  # nightly-<40-hex>
    digest: str  # sha256:<64-hex>, what the tag points at in the registry now
    created: str | None = None  # the image config's build time (RFC 3339), when read

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def ref(self) -> str:
        """``<repo>:<tag>@<digest>``: what hosts pull (the digest decides)."""
        return f"{self.image}@{self.digest}"

    @property
    def commit(self) -> str | None:
        """The vLLM commit of a ``nightly-<sha>`` tag."""
        m = NIGHTLY_TAG.fullmatch(self.tag)
        return m.group("sha") if m else None


class ImageRegistry(Registry):
    """``Registry`` plus manifests and blobs (enough to read an image's config)."""

    def manifest(self, repo: str, reference: str) -> tuple[dict[str, Any], str, str]:
        """(manifest JSON, media type, digest) of ``repo:reference`` (tag or digest)."""
        headers, body = self._request("GET", f"/v2/{repo}/manifests/{reference}", repo, MANIFEST_TYPES)
        try:
            doc = json.loads(body)
        except ValueError:
            raise RegistryError(f"{repo}:{reference}: manifest is not JSON") from None
        media = doc.get("mediaType") or headers.get("content-type", "").split(";")[0]
        digest = headers.get("docker-content-digest") or (
            "sha256:" + hashlib.sha256(body).hexdigest()
        )
        return doc, media, digest

    def blob(self, repo: str, digest: str) -> bytes:
        """A blob's bytes, checked against its digest."""
        _, body = self._request("GET", f"/v2/{repo}/blobs/{digest}", repo)
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise RegistryError(f"{repo}@{digest}: blob content does not match its digest")
        return body

    def image_config(self, repo: str, reference: str) -> dict[str, Any]:
        """The image config (``created``, ``config.Env``, ...) for linux/amd64."""
        doc, media, _ = self.manifest(repo, reference)
        if media in INDEX_TYPES or "manifests" in doc:
            doc = self.manifest(repo, platform_manifest(doc, f"{repo}:{reference}"))[0]
        config = (doc.get("config") or {}).get("digest")
        if not config:
            raise RegistryError(f"{repo}:{reference}: manifest has no config blob")
        return json.loads(self.blob(repo, config))


def platform_manifest(index: dict[str, Any], what: str) -> str:
    """The linux/amd64 manifest digest of an image index (``what`` names it in errors)."""
    for entry in index.get("manifests") or []:
        p = entry.get("platform") or {}
        if (p.get("os"), p.get("architecture")) == PLATFORM:
            return str(entry["digest"])
    raise RegistryError(f"{what}: no {'/'.join(PLATFORM)} image in the index")


def nightly_tags(tags: Iterable[str]) -> list[str]:
    """Only the immutable per-commit nightly tags (``nightly-<40-hex>``), sorted."""
    return sorted(t for t in tags if NIGHTLY_TAG.fullmatch(t))


def newest(candidates: Iterable[Candidate]) -> Candidate:
    """The candidate built last (RFC 3339 UTC strings sort by time); ties by tag."""
    dated = [c for c in candidates if c.created]
    if not dated:
        raise RegistryError("no nightly tag has a readable build time")
    return max(dated, key=lambda c: (_normalise(c.created or ""), c.tag))


def _normalise(created: str) -> str:
    # "2026-05-12T14:00:00.123456789Z" and "...+00:00" compare correctly once both are "Z".
    return created.replace("+00:00", "Z")


def find_candidate(
    reg: ImageRegistry, repository: str, tag: str | None = None, latest: bool = False
) -> Candidate:
    """Resolve ``--image TAG`` or ``--latest`` to a ``Candidate`` (digest + build time).

    + reg: the registry (Docker Hub, or the testbed mirror)
    + repository: ``vllm/vllm-openai``
    + tag: the tag to bump to (``nightly-<40-hex>`` or a release tag such as ``v0.20.1``)
    + latest: pick the newest ``nightly-<40-hex>`` instead

    Raises ``RegistryError`` naming the tag and registry when it cannot be found.
    """
    if latest:
        tags = nightly_tags(reg.tags(repository))
        if not tags:
            raise RegistryError(f"{reg.base_url}: {repository} has no nightly-<commit> tags")
        found = []
        for t in tags:
            try:
                found.append(_candidate(reg, repository, t))
            except RegistryError:
                continue  # a tag deleted while we list is not a candidate
        return newest(found)
    if tag is None:
        raise RegistryError("give --image TAG or --latest")
    return _candidate(reg, repository, tag)


def _candidate(reg: ImageRegistry, repository: str, tag: str) -> Candidate:
    digest = reg.digest(repository, tag)
    created = reg.image_config(repository, digest).get("created")
    return Candidate(repository, tag, digest, str(created) if created else None)


def parse_image_arg(value: str, default_repository: str) -> tuple[str, str]:
    """``--image`` as given: ``nightly-<sha>``, ``<sha>`` or ``<repo>:<tag>`` -> (repo, tag)."""
    value = value.strip()
    if "@" in value:
        raise RegistryError(f"--image {value!r}: give a tag; the digest is read from the registry")
    if re.fullmatch(r"[0-9a-f]{40}", value):
        return default_repository, f"nightly-{value}"
    if ":" in value.rsplit("/", 1)[-1]:
        repo, _, tag = value.rpartition(":")
        return repo, tag
    return default_repository, value
