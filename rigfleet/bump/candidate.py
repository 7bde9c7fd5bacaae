"""The candidate image, from the registry's v2 API: its tag, manifest digest and build time.

vLLM publishes release tags ``vllm/vllm-openai:vX.Y.Z`` (kept) and a ``nightly-<40-hex>`` tag
per build (Docker Hub keeps only the 14 newest); moving tags (``nightly``, ``latest``) pin
nothing. What ``--latest`` means depends on the stack:

- a stack follows **releases** (``follows_nightlies`` is False): the newest ``vX.Y.Z`` tag above
  the pinned version, ordered by version (``newest_release``), never by push time; a Genesis
  stack only takes a release some Genesis commit (pinned or newer) lists;
- a Genesis stack whose pinned Genesis allowlist names no release (only nightly builds) follows
  **nightlies**: the newest ``nightly-<40-hex>`` by the image config's ``created`` time::

    reg = ImageRegistry("https://registry-1.docker.io")
    cand = find_candidate(reg, "vllm/vllm-openai", tag="v0.27.1")
    cand.ref            # "vllm/vllm-openai:v0.27.1@sha256:..."
    newest_release(reg.tags("vllm/vllm-openai"), above="0.27.1")    # "v0.32.0"
    latest = find_candidate(reg, "vllm/vllm-openai", latest=True)   # the newest nightly
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.version import Version

from rigfleet.errors import RigfleetError
from rigfleet.registry import INDEX_TYPES, Registry, RegistryError, platform_manifest
from rigfleet.vllm_versions import NIGHTLY_TAG, RELEASE_TAG, is_release, version_key

__all__ = ["INDEX_TYPES", "NIGHTLY_TAG", "RELEASE_TAG", "Candidate", "ImageRegistry",
           "find_candidate", "is_release", "platform_manifest", "version_key"]


class LatestError(RigfleetError, ValueError):
    """``--latest`` cannot pick one candidate for the bumped stacks; the message says why."""


@dataclass(frozen=True)
class Candidate:
    """One image the fleet could move to."""

    repository: str  # vllm/vllm-openai
    tag: str  # nightly-<40-hex> or vX.Y.Z
    digest: str  # sha256:<64-hex>, what the tag points at in the registry now
    created: str | None = None  # the image config's build time (RFC 3339), when read
    image_id: str | None = None  # the linux/amd64 config digest (what the pins record)

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
    """The registry client as the bump names it (``rigfleet.registry.Registry``; the mirror
    copy extends it)."""


def nightly_tags(tags: Iterable[str]) -> list[str]:
    """Only the immutable per-commit nightly tags (``nightly-<40-hex>``), sorted."""
    return sorted(t for t in tags if NIGHTLY_TAG.fullmatch(t))


def release_tags(tags: Iterable[str]) -> list[str]:
    """The ``vX.Y.Z`` release tags, oldest version first (by version, not by push time)."""
    found = [t for t in set(tags) if RELEASE_TAG.fullmatch(t)]
    return sorted(found, key=lambda t: version_key(t) or Version("0"))


def newest_release(tags: Iterable[str], above: str,
                   allowed: Iterable[str] | None = None) -> str | None:
    """The newest release tag whose version is above ``above`` (and in ``allowed``, when
    given: a Genesis allowlist); None when there is none.

    + tags: the repository's tags; above: the pinned version (``0.27.1``, a nightly's version)
    + allowed: versions some Genesis commit lists (None: any release)
    """
    floor = version_key(above)
    ok = None if allowed is None else set(allowed)
    for tag in reversed(release_tags(tags)):
        version = tag[1:]
        key = version_key(version)
        if floor is not None and key is not None and key <= floor:
            return None
        if ok is None or version in ok:
            return tag
    return None


def follows_nightlies(uses_genesis: bool, allowlist: Iterable[str] | None) -> bool:
    """A stack follows nightly builds only when its Genesis requires them: it uses Genesis and
    the pinned Genesis' allowlist names no release version (all its entries are dev builds)."""
    if not uses_genesis or allowlist is None:
        return False
    return not any(is_release(v) for v in allowlist)


@dataclass(frozen=True)
class LatestAsk:
    """What ``--latest`` knows about one bumped stack (``choose_latest`` decides).

    + pinned: the stack's pinned vLLM version; nightly: it follows nightlies
    + target: for a release stack, ``newest_release`` for it (None: it is on the newest one)
    """

    pinned: str
    nightly: bool
    target: str | None = None


@dataclass(frozen=True)
class LatestChoice:
    """``--latest``: one kind and one release tag (None: the newest nightly), the stacks it
    moves, and why the others stay."""

    nightly: bool
    tag: str | None
    stacks: tuple[str, ...]
    staying: Mapping[str, str]


def choose_latest(asks: Mapping[str, LatestAsk]) -> LatestChoice:
    """One candidate for every bumped stack, or ``LatestError`` saying why not (pure).

    Stacks that follow nightlies and stacks that follow releases need different candidates;
    release stacks already on their newest release stay (``staying``); release stacks whose
    newest releases differ (a Genesis allowlist stops one lower) need separate bumps.
    """
    nightly = sorted(n for n, a in asks.items() if a.nightly)
    release = sorted(n for n, a in asks.items() if not a.nightly)
    if nightly and release:
        raise LatestError(
            f"--latest: {', '.join(nightly)} follow(s) nightly builds (the pinned Genesis "
            f"allowlist lists only nightlies) but {', '.join(release)} follow(s) releases; "
            "bump them one at a time with --stack"
        )
    if nightly:
        return LatestChoice(True, None, tuple(nightly), {})
    staying = {n: f"already on the newest release it may take (vLLM {asks[n].pinned})"
               for n in release if asks[n].target is None}
    targets = {n: str(asks[n].target) for n in release if asks[n].target is not None}
    if len(set(targets.values())) > 1:
        listed = ", ".join(f"{n} -> {t}" for n, t in sorted(targets.items()))
        raise LatestError(f"--latest: the stacks' newest releases differ ({listed}); bump "
                            "them one at a time with --stack")
    tag = next(iter(targets.values()), None)
    return LatestChoice(False, tag, tuple(sorted(targets)), staying)


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
    reg: Registry, repository: str, tag: str | None = None, latest: bool = False
) -> Candidate:
    """Resolve ``--image TAG``, or the newest nightly (``latest``), to a ``Candidate``.

    + reg: the registry (Docker Hub, or the testbed mirror)
    + repository: ``vllm/vllm-openai``
    + tag: the tag to bump to (``nightly-<40-hex>`` or a release tag such as ``v0.27.1``)
    + latest: pick the newest ``nightly-<40-hex>`` (by build time) instead

    Raises ``RegistryError`` naming the tag and registry when it cannot be found.
    """
    if latest:
        tags = nightly_tags(reg.tags(repository))
        if not tags:
            raise RegistryError(f"registry {reg.where}: {repository} has no nightly-<commit> "
                                "tags")
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


def _candidate(reg: Registry, repository: str, tag: str) -> Candidate:
    digest = reg.digest(repository, tag)
    found = reg.resolve(repository, digest)
    created = json.loads(reg.blob(repository, found.image_id)).get("created")
    return Candidate(repository, tag, digest, str(created) if created else None, found.image_id)


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
