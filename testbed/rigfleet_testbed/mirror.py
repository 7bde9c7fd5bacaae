"""The registry mirror's ``vllm/vllm-openai``: what Docker Hub serves today, nothing more.

Docker Hub keeps every release tag and only the 14 newest ``nightly-*`` tags
(:func:`rigfleet_testbed.vllm_builds.retention`); a pull of a purged nightly, by tag or by
digest, is ``manifest unknown`` (club-3090#167; genesis.md 3). The mirror is made to match: the
kept builds are pushed (skipped when the mirror already has the same manifest), and a purged
build's manifest still in the mirror (a registry directory kept from an older ``up``) is
deleted by digest, which removes its tag too::

    report = publish(client, "http://127.0.0.1:15100", vb.BUILDS, log)
    report.pushed, report.deleted

Builds the rule purges are never pushed; the ones an operator kept exist as ``docker save``
archives (:mod:`rigfleet_testbed.vllm_images`).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import docker

from rigfleet.registry import Registry, RegistryError
from rigfleet_testbed.layout import SIM_IMAGE_REPO
from rigfleet_testbed.vllm_builds import Build, retention

Log = Callable[[str], None]


class MirrorError(RuntimeError):
    """A push or delete the mirror refused (the message names the tag)."""


@dataclass
class Report:
    pushed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


def plan(builds: Iterable[Build], mirror_tags: Iterable[str]) -> tuple[list[Build], list[str]]:
    """(builds the mirror must serve, tags it must drop): retention applied to ``builds``."""
    kept, purged = retention(builds)
    present = set(mirror_tags)
    return kept, [b.tag for b in purged if b.tag in present]


def _tags(reg: Registry) -> list[str]:
    try:
        return reg.tags(SIM_IMAGE_REPO)
    except (RegistryError, OSError):
        return []  # the repository does not exist yet (a fresh mirror)


def _pushed_digest(reg: Registry, tag: str, present: set[str]) -> str | None:
    if tag not in present:
        return None
    try:
        return reg.digest(SIM_IMAGE_REPO, tag)
    except (RegistryError, OSError):
        return None


def _push(client: docker.DockerClient, base_url: str, build: Build, log: Log) -> None:
    target = f"{base_url.removeprefix('http://').rstrip('/')}/{SIM_IMAGE_REPO}"
    client.images.get(build.image).tag(target, build.tag)
    log(f"pushing {build.image} to the mirror")
    for line in client.images.push(target, build.tag, stream=True, decode=True):
        if "error" in line:
            raise MirrorError(f"push of {build.image} failed: {line['error']}")


def delete(base_url: str, tag: str, digest: str) -> None:
    """Delete ``vllm/vllm-openai@<digest>`` (and so ``:<tag>``) from the mirror."""
    url = f"{base_url.rstrip('/')}/v2/{SIM_IMAGE_REPO}/manifests/{digest}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=30):
            return
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise MirrorError(f"deleting {SIM_IMAGE_REPO}:{tag} ({digest}) from the mirror: "
                              f"HTTP {exc.code}") from None


def publish(client: docker.DockerClient, base_url: str, builds: Sequence[Build], log: Log,
            workers: int = 4) -> Report:
    """Make the mirror at ``base_url`` (the control side's address) serve what Docker Hub does."""
    reg = Registry(base_url)
    present = set(_tags(reg))
    kept, drop = plan(builds, present)
    report = Report()

    def one(build: Build) -> str:
        local = client.images.get(build.image)
        mine = {d.split("@")[-1] for d in local.attrs.get("RepoDigests", [])}
        if _pushed_digest(reg, build.tag, present) in mine:
            return "unchanged"
        _push(client, base_url, build, log)
        return "pushed"

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for build, what in zip(kept, pool.map(one, kept), strict=True):
            (report.pushed if what == "pushed" else report.unchanged).append(build.tag)
    for tag in drop:
        digest = _pushed_digest(reg, tag, present)
        if digest:
            log(f"deleting {SIM_IMAGE_REPO}:{tag} from the mirror (purged: not among the 14 "
                "newest nightlies)")
            delete(base_url, tag, digest)
            report.deleted.append(tag)
    return report
