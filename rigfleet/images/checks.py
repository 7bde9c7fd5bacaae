"""Can this source provide this image, asked here: a registry by a HEAD for the digest, an archive
by hashing its configs, one on the host from its ``HostImageState``; a checker keeps its answers::

    checker = SourceChecker()
    results = checker.results(wanted, settings, host_state)
    [r.reason for r in results]   # "vllm/vllm-openai@sha256:... is there", "no such file ..."
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

from rigfleet.hostdata import HostSettings
from rigfleet.image_sources import NO_CHECK, ImageSource
from rigfleet.images.archive import ArchiveError, ArchiveInfo, archive_name, inspect_archive
from rigfleet.images.hoststate import HostArchive, HostImageState
from rigfleet.images.plan import SourceResult, WantedImage, registry_ref
from rigfleet.registry import (
    DOCKER_HUB,
    Registry,
    RegistryError,
    RegistryNotFound,
    RegistryUnreachable,
    registry_of,
)
from rigfleet.vllm_versions import NIGHTLY_TAG

# vllm .buildkite/scripts/cleanup-nightly-builds.sh (docs/images.md).
NIGHTLY_NOTE = ("vLLM keeps only the 14 newest nightly-* tags on Docker Hub (about two weeks); "
                "release tags stay")
# Why a registry does not hold an image, else its linux/amd64 compressed layer bytes and image
# id (None: unreadable).
_Found = tuple[str | None, int | None, str | None]


class SourceChecker:
    """Checks sources for images; one per deploy run or command (answers are kept)."""

    def __init__(self, registry: Callable[[str], Registry] = Registry) -> None:
        self.client: Callable[[str], Registry] = cache(registry)  # one client per URL
        self._there: dict[tuple[str, str, str, str], _Found] = {}

    def results(self, w: WantedImage, settings: HostSettings, state: HostImageState,
                sources: Sequence[ImageSource] | None = None) -> list[SourceResult]:
        """Each source in order until the first that holds ``w`` (the rest are not asked)."""
        out: list[SourceResult] = []
        index = 0
        for source in settings.image_sources if sources is None else sources:
            out.append(self.check(index, source, w, settings, state))
            index += source.cache is None  # a fleet cache is not an entry of image_sources
            # A fleet cache is not asked from here: the next source is the host's fallback.
            if out[-1].ok and source.cache is None:
                break
        return out

    def check(self, index: int, source: ImageSource, w: WantedImage, settings: HostSettings,
              state: HostImageState) -> SourceResult:
        if source.cache is not None and registry_of(w.repository)[0] is not None:
            return SourceResult(index, source, False, f"{w.repository} is not a Docker Hub "
                                "name: the fleet cache pulls through for Docker Hub's names "
                                "only (cache_registry_upstream)")
        if source.kind == "hub":
            return self.registry(index, source, check_url(source, w, settings),
                                 registry_of(w.repository)[1], w, f"{w.image}@{w.digest}")
        if source.kind == "registry":
            url = source.check or str(source.url)
            path = source.repository or registry_of(w.repository)[1]
            return self.registry(index, source, url, path, w, registry_ref(w, source))
        if not w.image_id:
            return SourceResult(index, source, False, f"the pins carry no image_id for "
                                f"{w.image} (run `rigfleet pins lock`): an archive is matched "
                                "by image id")
        if source.kind == "archive":
            return self.archive(index, source, w)
        return host_archive(index, source, w, state)

    def registry(self, index: int, source: ImageSource, url: str, path: str, w: WantedImage,
                 ref: str) -> SourceResult:
        if url == NO_CHECK:
            return SourceResult(index, source, True, "not checked from here (check: none); "
                                "the host pulls it", None, ref=ref)
        # The 404's note follows the tag: a nightly and a release name of one build ask apart.
        note = f" ({NIGHTLY_NOTE})" if NIGHTLY_TAG.fullmatch(w.image.rpartition(":")[2]) else ""
        key = (url, path, w.digest, note)
        if key not in self._there:
            self._there[key] = self._ask(url, path, w.digest, note)
        problem, size, image_id = self._there[key]
        if problem is not None:
            return SourceResult(index, source, False, problem, ref=ref)
        return SourceResult(index, source, True, f"{path}@{w.digest[:19]} is there at {url}",
                            size, ref=ref, image_id=image_id)

    def _ask(self, url: str, path: str, digest: str, note: str) -> _Found:
        try:
            self.client(url).digest(path, digest)
        except RegistryNotFound:
            return (f"{path}@{digest} is not there at {url} (HTTP 404: digest, tag or "
                    f"repository gone){note}"), None, None
        except RegistryUnreachable as e:
            return f"unreachable from this machine: {e}", None, None
        except RegistryError as e:
            return str(e), None, None
        try:
            found = self.client(url).resolve(path, digest)
        except RegistryError:
            return None, None, None
        return None, found.layer_bytes, found.image_id

    def archive(self, index: int, source: ImageSource, w: WantedImage) -> SourceResult:
        p = Path(str(source.path))
        files = (sorted(str(f) for f in p.glob("*.tar") if f.is_file()) if p.is_dir()
                 else [str(p)] if p.is_file() else None)
        return _archives(index, source, w, files, inspect_archive, "on this machine")


def host_archive(index: int, source: ImageSource, w: WantedImage,
                 state: HostImageState) -> SourceResult:
    def read(f: str) -> HostArchive:
        if (found := state.archives[f]).error:
            raise ArchiveError(f"{f}: {found.error}")
        return found

    return _archives(index, source, w, state.archive_files(str(source.path)), read, "on the host")


def _archives(index: int, source: ImageSource, w: WantedImage, files: Sequence[str] | None,
              read: Callable[[str], ArchiveInfo | HostArchive], where: str) -> SourceResult:
    """The first of ``files`` (None: ``source.path`` is missing) that ``read`` finds holding
    ``w``'s image id; the file `rigfleet images export` would have written for it goes first."""
    path = str(source.path)
    if files is None:
        return SourceResult(index, source, False, f"{path} is missing {where}")
    if not files:
        return SourceResult(index, source, False, f"{path} {where} holds no *.tar archive")
    seen = []
    for f in sorted(files, key=lambda f: Path(f).name != archive_name(w.image)):
        try:
            found = read(f)
        except ArchiveError as e:
            seen.append(str(e))
            continue
        if any(i.image_id == w.image_id for i in found.images):
            return SourceResult(index, source, True, f"{f} {where} holds image id "
                                f"{str(w.image_id)[:19]}", found.size, f)
        seen.append(f"{Path(f).name} holds "
                    + (", ".join(i.label for i in found.images) or "no image"))
    return SourceResult(index, source, False, f"no archive there holds image id {w.image_id} "
                        f"({'; '.join(seen)})")


def check_url(source: ImageSource, w: WantedImage, settings: HostSettings) -> str:
    """Where this machine checks a ``hub`` source (a Docker Hub name: ``bump_registry``)."""
    host, _ = registry_of(w.repository)
    return source.check or (f"https://{host}" if host else settings.bump_registry or DOCKER_HUB)
