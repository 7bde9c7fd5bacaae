"""The candidate image from the registry's v2 API (tag, manifest digest, build time) and what
``--latest`` picks (docs/bump.md, step 1: releases by version; Genesis nightlies by build time)::

    cand = find_candidate(Registry(DOCKER_HUB), "vllm/vllm-openai", tag="v0.27.1")
    newest_release(reg.tags("vllm/vllm-openai"), above="0.27.1")    # "v0.32.0"
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime

from packaging.version import Version

from rigfleet.errors import RigfleetError
from rigfleet.pins import HEX40
from rigfleet.registry import Registry, RegistryError, split_image
from rigfleet.vllm_versions import NIGHTLY_TAG, RELEASE_TAG, is_release, version_key


class LatestError(RigfleetError, ValueError):
    """``--latest`` cannot pick one candidate for the bumped stacks."""


@dataclass(frozen=True)
class Candidate:
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
        return f"{self.image}@{self.digest}"

    @property
    def commit(self) -> str | None:
        return m.group("sha") if (m := NIGHTLY_TAG.fullmatch(self.tag)) else None


def release_tags(tags: Iterable[str]) -> list[str]:
    """The ``vX.Y.Z`` release tags, oldest version first (by version, not by push time)."""
    return sorted({t for t in tags if RELEASE_TAG.fullmatch(t)}, key=lambda t: Version(t[1:]))


def newest_release(tags: Iterable[str], above: str,
                   allowed: Collection[str] | None = None) -> str | None:
    """The newest release tag above version ``above`` (and in ``allowed`` if given), or None."""
    floor = version_key(above)
    for tag in reversed(release_tags(tags)):  # RELEASE_TAG: a PEP 440 version after the "v"
        if floor is not None and Version(tag[1:]) <= floor:
            return None
        if allowed is None or tag[1:] in allowed:
            return tag
    return None


def follows_nightlies(allowlist: Iterable[str]) -> bool:
    """A Genesis stack whose pinned allowlist names no release follows nightly builds."""
    return not any(is_release(v) for v in allowlist)


@dataclass(frozen=True)
class LatestAsk:
    """What ``--latest`` knows about one bumped stack; ``target``: its ``newest_release``."""

    pinned: str
    nightly: bool
    target: str | None = None


@dataclass(frozen=True)
class LatestChoice:
    """``--latest``'s pick (nightly, or one release ``tag``), its stacks, why others stay."""

    nightly: bool
    tag: str | None
    stacks: tuple[str, ...]
    staying: Mapping[str, str]


def choose_latest(asks: Mapping[str, LatestAsk]) -> LatestChoice:
    """One candidate for every bumped stack, or ``LatestError`` (nightly and release stacks
    mixed, or release stacks whose newest releases differ); stacks on their newest stay."""
    nightly = sorted(n for n, a in asks.items() if a.nightly)
    release = sorted(n for n, a in asks.items() if not a.nightly)
    if nightly and release:
        raise LatestError(f"--latest: {', '.join(nightly)} follow(s) nightly builds (the pinned "
                          f"Genesis allowlist lists only nightlies) but {', '.join(release)} "
                          "follow(s) releases; bump them one at a time with --stack")
    if nightly:
        return LatestChoice(True, None, tuple(nightly), {})
    staying = {n: f"already on the newest release it may take (vLLM {asks[n].pinned})"
               for n in release if asks[n].target is None}
    targets = {n: str(asks[n].target) for n in release if asks[n].target is not None}
    if len(set(targets.values())) > 1:
        listed = ", ".join(f"{n} -> {t}" for n, t in sorted(targets.items()))
        raise LatestError(f"--latest: the stacks' newest releases differ ({listed}); bump "
                            "them one at a time with --stack")
    return LatestChoice(False, next(iter(targets.values()), None), tuple(sorted(targets)), staying)


def newest_nightly(reg: Registry, repository: str) -> Candidate:
    """The nightly built last (by its build time, whatever its UTC offset); ties by tag."""
    tags = sorted(t for t in reg.tags(repository) if NIGHTLY_TAG.fullmatch(t))
    if not tags:
        raise RegistryError(f"registry {reg.where}: {repository} has no nightly-<commit> tags")
    dated = []
    for t in tags:
        try:
            found = find_candidate(reg, repository, t)
        except RegistryError:
            continue  # a tag deleted while we list is not a candidate
        with suppress(ValueError):
            dated.append((datetime.fromisoformat(found.created or "").astimezone(UTC), found))
    if not dated:
        raise RegistryError("no nightly tag has a readable build time")
    return max(dated, key=lambda d: (d[0], d[1].tag))[1]


def find_candidate(reg: Registry, repository: str, tag: str) -> Candidate:
    digest = reg.digest(repository, tag)
    found = reg.resolve(repository, digest)
    created = json.loads(reg.blob(repository, found.image_id)).get("created")
    return Candidate(repository, tag, digest, str(created) if created else None, found.image_id)


def parse_image_arg(value: str, default_repository: str) -> tuple[str, str]:
    """``--image`` as given: ``nightly-<sha>``, ``<sha>`` or ``<repo>:<tag>`` -> (repo, tag)."""
    value = value.strip()
    if "@" in value:
        raise RegistryError(f"--image {value!r}: give a tag; the digest is read from the registry")
    if HEX40.fullmatch(value):
        return default_repository, f"nightly-{value}"
    return split_image(value) if ":" in value.rsplit("/", 1)[-1] else (default_repository, value)
