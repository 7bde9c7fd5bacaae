"""The one Docker registry v2 client (Docker Hub's bearer tokens, or a plain registry); errors
name registry, repository and tag; tokens stay in memory::

    found = Registry("https://registry-1.docker.io").resolve("vllm/vllm-openai", "v0.27.1")
    found.digest, found.image_id, found.layer_bytes
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
IMAGE_MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                        "application/vnd.docker.distribution.manifest.v2+json")
MANIFEST_TYPES = ", ".join((*INDEX_TYPES, *IMAGE_MANIFEST_TYPES))
DOCKER_HUB = "https://registry-1.docker.io"
PLATFORM = ("linux", "amd64")  # the rigs are x86_64 boxes with RTX 3090s
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class RegistryError(RuntimeError):
    """A registry answered something we cannot use (the message says what and where)."""


class RegistryNotFound(RegistryError):
    """HTTP 404: the tag, digest or repository is not in that registry."""


class RegistryUnreachable(RegistryError):
    """The registry could not be reached at all (DNS, connection, timeout), or answered
    nothing about the image (HTTP 429 rate limit, 5xx)."""


@dataclass(frozen=True)
class ResolvedImage:
    """A tag or digest for linux/amd64: digests, image id (what ``docker load`` gives), sizes."""

    digest: str
    image_id: str
    manifest_digest: str
    layer_bytes: int


def reference(repo: str, ref: str) -> str:
    """``repo:tag`` or ``repo@sha256:...``, as people write it."""
    return f"{repo}@{ref}" if ref.startswith("sha256:") else f"{repo}:{ref}"


@dataclass
class Registry:
    base_url: str = DOCKER_HUB
    timeout: float = 15.0
    _tokens: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def where(self) -> str:
        return self.base_url.rstrip("/")

    def _open(self, req: urllib.request.Request, repo: str, what: str = "the repository",
              push: bool = False) -> Any:
        """The open response to ``req``; a Bearer challenge is answered once with a token for
        ``repo`` (with ``push``: pull and push scope) unless the body cannot be sent again."""
        def send() -> Any:
            if repo in self._tokens:
                # Unredirected: Docker Hub sends blob reads to a CDN with a signed URL, which
                # must not also receive our bearer token.
                req.add_unredirected_header("Authorization", f"Bearer {self._tokens[repo]}")
            return urllib.request.urlopen(req, timeout=self.timeout)

        try:
            return send()
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "")
            if exc.code != 401 or not challenge.startswith("Bearer") or hasattr(req.data, "read"):
                raise
        if push:
            challenge = re.sub(r'scope="([^"]*):pull"', r'scope="\1:pull,push"', challenge)
        self._tokens[repo] = self._token(challenge, what)
        return send()

    def _request(self, method: str, path: str, repo: str, what: str, accept: str = ""
                 ) -> tuple[dict, bytes]:
        """(lower-cased headers, body); errors name ``what``."""
        req = urllib.request.Request(f"{self.where}{path}", method=method)
        if accept:
            req.add_header("Accept", accept)
        try:
            with self._open(req, repo, what) as resp:
                return {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc.code, exc.reason, what) from None
        # URLError; a timeout mid-read, a reset connection; a body cut short (IncompleteRead)
        except (OSError, http.client.HTTPException) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise self._fail(what, f"cannot reach the registry ({reason})",
                             RegistryUnreachable) from None

    def _fail(self, what: str, why: str, kind: type[RegistryError] = RegistryError
              ) -> RegistryError:
        return kind(f"registry {self.where}: {what}: {why}")

    def _http_error(self, code: int, reason: str, what: str) -> RegistryError:
        if code == 404:
            return self._fail(what, "not found (HTTP 404: no such tag, digest or repository "
                              "there)", RegistryNotFound)
        if code in (401, 403):
            # Docker Hub answers 401 for a repository that does not exist, as for a private one.
            return self._fail(what, f"access denied (HTTP {code} {reason}: the repository does "
                              "not exist, or needs credentials; rigfleet reads registries "
                              "anonymously)")
        # A rate limit or a server error says nothing of the image: the registry is away.
        if code == 429:
            return self._fail(what, "rate limited (HTTP 429: too many requests from this "
                              "address; wait, or use a registry mirror)", RegistryUnreachable)
        return self._fail(what, f"HTTP {code} {reason}",
                          RegistryUnreachable if code >= 500 else RegistryError)

    def _token(self, challenge: str, what: str = "the repository") -> str:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if not (realm := params.pop("realm", "")):
            raise self._fail(what, "unusable auth challenge")
        url = f"{realm}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            kind = RegistryUnreachable if exc.code == 429 or exc.code >= 500 else RegistryError
            raise self._fail(what, f"the token service {realm} refused (HTTP {exc.code} "
                             f"{exc.reason})", kind) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise self._fail(what, f"cannot get a token from {realm} "
                             f"({getattr(exc, 'reason', exc)})", RegistryUnreachable) from None
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not token:
            raise self._fail(what, f"the token service {realm} answered no token")
        return str(token)

    def digest(self, repo: str, ref: str) -> str:
        """The manifest digest ``repo:ref`` points at now (a HEAD: Docker Hub counts no pull)."""
        what = reference(repo, ref)
        headers, _ = self._request("HEAD", f"/v2/{repo}/manifests/{ref}", repo, what,
                                   MANIFEST_TYPES)
        found = headers.get("docker-content-digest", "")
        if not DIGEST.fullmatch(found):
            raise self._fail(what, f"no usable digest in the answer ({found!r})")
        return found

    def manifest(self, repo: str, ref: str) -> tuple[dict[str, Any], str, str, bytes]:
        """(JSON, media type, digest, the exact bytes the digest is of) of a tag or digest."""
        what = reference(repo, ref)
        headers, body = self._request("GET", f"/v2/{repo}/manifests/{ref}", repo, what,
                                      MANIFEST_TYPES)
        try:
            doc = json.loads(body)
        except ValueError:
            raise self._fail(what, "manifest is not JSON") from None
        if not isinstance(doc, dict):
            raise self._fail(what, "manifest is not an object")
        media = doc.get("mediaType") or headers.get("content-type", "").split(";")[0]
        computed = "sha256:" + hashlib.sha256(body).hexdigest()
        if ref.startswith("sha256:") and computed != ref:
            raise self._fail(what, f"manifest content does not match its digest ({computed})")
        return doc, media, headers.get("docker-content-digest") or computed, body

    def blob(self, repo: str, digest: str) -> bytes:
        """A blob's bytes, checked against its digest."""
        what = f"{repo}@{digest}"
        _, body = self._request("GET", f"/v2/{repo}/blobs/{digest}", repo, what)
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise self._fail(what, "blob content does not match its digest")
        return body

    def resolve(self, repo: str, ref: str) -> ResolvedImage:
        """Digest, image id and download size of ``repo:ref`` (manifests only, never a layer)."""
        what = f"registry {self.where}: {reference(repo, ref)}"
        doc, media, top, _ = self.manifest(repo, ref)
        own = top
        if media in INDEX_TYPES or "manifests" in doc:
            doc, _, own, _ = self.manifest(repo, platform_manifest(doc, what))
        config = sha256_digest(doc.get("config"), what,
                               "the linux/amd64 manifest names no sha256 config")
        why = "the linux/amd64 manifest's layers are not a list of entries with a byte size"
        sizes = [byte_size(layer.get("size"), what, why)
                 for layer in listed(doc, "layers", what, why) if isinstance(layer, dict)]
        return ResolvedImage(top, config, own, sum(sizes))

    def tags(self, repo: str) -> list[str]:
        """Every tag of ``repo`` (follows pagination)."""
        path: str | None = f"/v2/{repo}/tags/list?n=1000"
        found: list[str] = []
        what = f"{repo} (tag list)"
        read: set[str] = set()
        while path:
            if path in read:  # a Link back to a page read: it would never end
                raise self._fail(what, f"the next page of the tag list ({path[:120]}) was read "
                                 "already; allowed: a registry whose tag list pages end")
            read.add(path)
            headers, body = self._request("GET", path, repo, what)
            try:
                doc = json.loads(body or b"{}")
            except ValueError:
                raise self._fail(what, f"the answer is not JSON ({body[:60]!r})") from None
            tags = doc.get("tags") or [] if isinstance(doc, dict) else None
            if not isinstance(tags, list):
                raise self._fail(what, "the answer is not an object with a list of tags")
            found.extend(str(t) for t in tags)
            match = re.match(r"<([^>]+)>", headers.get("link", ""))
            path = self._next_page(match.group(1), what) if match else None
        return found

    def _next_page(self, link: str, what: str) -> str:
        """The path (under ``where``) of a ``Link`` header's next page: relative, as
        Docker's registry sends it, or absolute on this registry (RFC 8288)."""
        parts = urllib.parse.urlsplit(link)
        if not (parts.scheme or parts.netloc):
            return link
        here = urllib.parse.urlsplit(self.where)
        if (parts.scheme.lower(), parts.netloc.lower()) != (here.scheme.lower(),
                                                             here.netloc.lower()):
            raise self._fail(what, f"the next page of the tag list is on another host "
                             f"({link[:120]}); allowed: a link on {here.netloc}")
        path = parts.path
        prefix = here.path.rstrip("/")
        if prefix and path.startswith(prefix + "/"):
            path = path[len(prefix):]
        return path + (f"?{parts.query}" if parts.query else "")


def platform_manifest(index: dict[str, Any], what: str) -> str:
    """The linux/amd64 manifest digest of an image index (``what`` names it in errors)."""
    platform = "/".join(PLATFORM)
    for entry in listed(index, "manifests", what, "the index's manifests are not a list"):
        p = entry.get("platform") if isinstance(entry, dict) else None
        if isinstance(p, dict) and (p.get("os"), p.get("architecture")) == PLATFORM:
            return sha256_digest(entry, what,
                                 f"the index's {platform} entry names no sha256 digest")
    raise RegistryError(f"{what}: no {platform} image in the index")


# Shape checks of manifest JSON (resolve, bump.images): ``what: why (the value found)``.
def listed(doc: dict[str, Any], key: str, what: str, why: str) -> list[Any]:
    """``doc[key]`` as a list (absent: empty); anything else is a ``RegistryError``."""
    found = doc.get(key) or []
    if not isinstance(found, list):
        raise RegistryError(f"{what}: {why} ({found!r:.80})")
    return found


def sha256_digest(entry: Any, what: str, why: str) -> str:
    """A descriptor's ``sha256:`` digest; a descriptor without one is a ``RegistryError``."""
    digest = entry.get("digest") if isinstance(entry, dict) else None
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise RegistryError(f"{what}: {why} ({digest!r})")
    return digest


def byte_size(value: Any, what: str, why: str) -> int:
    """A size in bytes (a descriptor's ``size``, a number; absent: 0); else a ``RegistryError``."""
    size = value or 0
    if type(size) is not int or size < 0:
        raise RegistryError(f"{what}: {why} ({value!r:.80})")
    return size


def split_image(image: str) -> tuple[str, str]:
    """``vllm/vllm-openai:nightly-x`` -> (``vllm/vllm-openai``, ``nightly-x``)."""
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        raise RegistryError(f"image {image!r} has no tag; expected <repository>:<tag>")
    return name, tag


def registry_of(repository: str) -> tuple[str | None, str]:
    """(registry host or None for Docker Hub, path in it), by Docker's rule (a first part with
    a dot or a port, or ``localhost``, is a registry): ``ghcr.io/a/b`` -> (``ghcr.io``,
    ``a/b``); ``nginx`` -> (None, ``library/nginx``)."""
    first, sep, rest = repository.partition("/")
    if sep and first in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        return registry_of(rest)
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return None, repository if sep else f"library/{repository}"
