"""Where a host gets its pinned images: host data ``image_sources``, tried in order (each
kind and key: docs/images.md)::

    sources = parse_sources(checker, "image_sources", host_data.get("image_sources"))
    sources[0].label      # "hub"
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rigfleet.hostchecks import HostChecker
from rigfleet.hostside.layout import CACHE_ROOT

KINDS = ("hub", "registry", "archive", "host-archive")
NO_CHECK = "none"
# TODO(lead): a Layout property (rigfleet/hostside/layout.py) once that file can change.
DEFAULT_UPLOAD_DIR = f"{CACHE_ROOT}/image-uploads"
_KEYS = {
    "hub": ("kind", "check"),
    "registry": ("kind", "url", "repository", "check"),
    "archive": ("kind", "path", "via", "upload_dir"),
    "host-archive": ("kind", "path"),
}


@dataclass(frozen=True)
class ImageSource:
    """One entry of ``image_sources``; ``cache``: the fleet cache host a ``registry`` stands for
    (never from host data)."""

    kind: str
    url: str | None = None
    repository: str | None = None
    check: str | None = None
    path: str | None = None
    via: str = "stream"
    upload_dir: str = DEFAULT_UPLOAD_DIR
    cache: str | None = None

    @property
    def registry_host(self) -> str:
        return urlsplit(self.url or "").netloc

    @property
    def keeps_digest(self) -> bool:
        """A pull from a registry records the digest (RepoDigests); a loaded archive does not."""
        return self.kind in ("hub", "registry")

    @property
    def label(self) -> str:
        """How messages and tables name it."""
        if self.cache is not None:
            return f"fleet cache {self.cache} ({self.url})"
        uploaded = ", uploaded" if self.via == "upload" else ""
        return {"registry": f"registry {self.url}",
                "archive": f"archive {self.path} (this machine{uploaded})",
                "host-archive": f"host-archive {self.path}"}.get(self.kind, "hub")


DEFAULT_SOURCES: tuple[ImageSource, ...] = (ImageSource("hub"),)


def parse_sources(c: HostChecker, key: str, value: Any) -> tuple[ImageSource, ...]:
    """``image_sources`` (None: the default); problems go to ``c``."""
    if value is None:
        return DEFAULT_SOURCES
    shape = ("a list of mappings, each with a kind: " + ", ".join(KINDS)
             + ", e.g. [{'kind': 'hub'}, {'kind': 'archive', 'path': '~/image-archive'}]")
    if not isinstance(value, list | tuple) or not value:
        c.bad(key, value, shape, "is not a non-empty list" if not value else "is not a list")
        return DEFAULT_SOURCES
    checked = [_source(c, f"{key}[{i}]", entry, shape) for i, entry in enumerate(value)]
    out = tuple(source for source in checked if source is not None)
    return out if len(out) == len(value) else DEFAULT_SOURCES


def _source(c: HostChecker, base: str, entry: Any, shape: str) -> ImageSource | None:
    if not isinstance(entry, dict):
        c.bad(base, entry, shape, "is not a mapping")
        return None
    kind = c.choice(f"{base}.kind", entry.get("kind"), KINDS)
    if kind is None or c.mapping(base, entry, _KEYS[kind]) is None:
        return None
    if kind == "hub":
        return ImageSource("hub", check=_check_url(c, base, entry))
    if kind == "registry":
        url = c.url(f"{base}.url", entry.get("url"))
        if entry.get("url") is None:
            c.missing(f"{base}.url", "the registry's http(s) URL as the host reaches it, "
                      "e.g. 'http://registry.lan:5000'")
        repository = c.string(f"{base}.repository", entry.get("repository"), None,
                              "a repository path such as 'mirror/vllm-openai'", required=False)
        if repository is not None and (repository != repository.strip("/") or " " in repository
                                       or "@" in repository or ":" in repository):
            c.bad(f"{base}.repository", repository, "a repository path without tag, digest, "
                  "spaces or leading/trailing '/', e.g. 'mirror/vllm-openai'")
        return ImageSource("registry", url=url, repository=repository,
                           check=_check_url(c, base, entry))
    path_allowed = ("an absolute path on the host: a `docker save` .tar file or a directory of "
                    "them, e.g. '/srv/images'")
    if kind == "host-archive":
        path = c.posix_path(f"{base}.path", entry.get("path"), path_allowed)
        if path is not None and "\t" in path:
            c.bad(f"{base}.path", path, path_allowed, "holds a tab")
        return ImageSource("host-archive", path=path)
    raw = c.string(f"{base}.path", entry.get("path"), None,
                   "a `docker save` .tar file or a directory of them on this (control) "
                   "machine, e.g. '~/image-archive'")
    via = c.choice(f"{base}.via", entry.get("via", "stream"), ("stream", "upload"))
    upload_dir = c.posix_path(f"{base}.upload_dir", entry.get("upload_dir"),
                              "an absolute directory on the host", required=False)
    path = str(Path(os.path.expanduser(raw)).absolute()) if raw else None
    return ImageSource("archive", path=path, via=via or "stream",
                       upload_dir=upload_dir or DEFAULT_UPLOAD_DIR)


def _check_url(c: HostChecker, base: str, entry: dict[Any, Any]) -> str | None:
    check = entry.get("check")
    return check if check in (None, NO_CHECK) else c.url(f"{base}.check", check)
