"""Copy a pinned image into a mirror registry over the v2 API, manifest bytes unchanged, so its
digest stays pullable after upstream deletes the tag (``--push-mirror``); an index is copied
whole::

    copied = copy_image(MirrorRegistry("https://registry-1.docker.io"),
                        MirrorRegistry("http://registry.lan:5000"), "vllm/vllm-openai",
                        "nightly-3f9c...", "sha256:...")
"""

from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, BinaryIO

from rigfleet.registry import (
    MANIFEST_TYPES,
    Registry,
    RegistryError,
    byte_size,
    listed,
    sha256_digest,
)


class MirrorRegistry(Registry):
    """``Registry`` that can also write (blob uploads, manifest puts)."""

    def _send(self, method: str, url: str, repo: str, data: bytes | BinaryIO | None = None,
              headers: dict[str, str] | None = None) -> dict[str, str]:
        """The answer's lower-cased headers; a failure as ``RegistryError``."""
        req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
        try:
            with self._open(req, repo, push=True) as resp:
                return {k.lower(): v for k, v in resp.headers.items()}
        except urllib.error.HTTPError as exc:
            body = exc.read()[:300].decode(errors="replace")
            raise RegistryError(f"{method} {url}: HTTP {exc.code} {exc.reason} {body}") from None
        except urllib.error.URLError as exc:
            raise RegistryError(f"{url}: cannot reach the registry ({exc.reason})") from None
        except (OSError, http.client.HTTPException) as exc:  # a timeout, a reset, a short read
            raise RegistryError(f"{method} {url}: the transfer broke off "
                                f"({exc or type(exc).__name__})") from None

    def has(self, repo: str, kind: str, digest: str) -> bool:
        url = f"{self.where}/v2/{repo}/{kind}/{digest}"
        try:
            self._send("HEAD", url, repo, headers={"Accept": MANIFEST_TYPES})
        except RegistryError as e:
            if "HTTP 404" in str(e):
                return False
            raise
        return True

    def blob_stream(self, repo: str, digest: str) -> Any:
        """An open response streaming the blob (caller closes it)."""
        url = f"{self.where}/v2/{repo}/blobs/{digest}"
        try:
            return self._open(urllib.request.Request(url), repo)
        except urllib.error.HTTPError as exc:
            raise RegistryError(f"GET {url}: HTTP {exc.code} {exc.reason}") from None
        except OSError as exc:  # URLError, a timeout
            raise RegistryError(f"{url}: cannot reach the registry "
                                f"({getattr(exc, 'reason', exc)})") from None

    def upload_blob(self, repo: str, digest: str, data: BinaryIO | bytes, size: int) -> None:
        """Monolithic upload: POST a session, then PUT the whole blob with its digest."""
        base = self.where
        answer = self._send("POST", f"{base}/v2/{repo}/blobs/uploads/", repo, b"",
                            {"Content-Length": "0"})
        if not (location := answer.get("location")):
            raise RegistryError(f"{base}: blob upload for {repo} gave no Location")
        url = urllib.parse.urljoin(base + "/", location)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        self._send("PUT", url, repo, data, {"Content-Type": "application/octet-stream",
                                            "Content-Length": str(size)})  # fmt: skip

    def put_manifest(self, repo: str, reference: str, body: bytes, media: str) -> str:
        """PUT manifest bytes; returns the digest the registry reports."""
        return self._send("PUT", f"{self.where}/v2/{repo}/manifests/{reference}", repo, body,
                          {"Content-Type": media}).get("docker-content-digest", "")


@dataclass(frozen=True)
class Copied:
    ref: str  # <mirror host>/<repo>:<tag>
    digest: str  # the manifest digest the mirror serves under the tag
    blobs: int  # blobs uploaded (present ones are skipped)
    bytes: int

    def summary(self) -> dict[str, Any]:
        return {"ref": self.ref, "digest": self.digest, "blobs_copied": self.blobs,
                "bytes_copied": self.bytes}  # fmt: skip


def copy_image(src: MirrorRegistry, dst: MirrorRegistry, repo: str, tag: str, digest: str
               ) -> Copied:
    """Copy ``repo@digest`` from ``src`` to ``dst`` and tag it ``tag`` there."""
    doc, media, _, body = src.manifest(repo, digest)
    counter = [0, 0]
    what = f"{src.where}: {repo}@{digest}"
    # an index: each image's blobs, then its manifest
    for entry in listed(doc, "manifests", what, "'manifests' is not a list"):
        one = sha256_digest(entry, f"{what}: manifests", "an entry has no sha256 digest")
        one_doc, one_media, _, one_body = src.manifest(repo, one)
        _copy_blobs(src, dst, repo, one_doc, counter)
        if not dst.has(repo, "manifests", one):
            dst.put_manifest(repo, one, one_body, one_media)
    _copy_blobs(src, dst, repo, doc, counter)  # an image's config and layers (an index has none)
    got = dst.put_manifest(repo, tag, body, media) or digest
    if got != digest:
        raise RegistryError(f"{dst.base_url}: stored {repo}:{tag} as {got}, expected {digest}")
    host = re.sub(r"^[a-z]+://", "", dst.base_url).rstrip("/")
    return Copied(f"{host}/{repo}:{tag}", got, *counter)


def _copy_blobs(src: MirrorRegistry, dst: MirrorRegistry, repo: str, doc: dict[str, Any],
                counter: list[int]) -> None:
    what = f"{src.where}: {repo} manifest"
    for desc in [doc.get("config") or {}, *listed(doc, "layers", what, "'layers' is not a list")]:
        if not isinstance(desc, dict):
            raise RegistryError(f"{what}: a config or layer entry is not an object: {desc!r:.80}")
        blob = desc.get("digest") and sha256_digest(desc, what, "an entry has no sha256 digest")
        if not blob or dst.has(repo, "blobs", blob):
            continue
        size = byte_size(desc.get("size"), what, f"{blob} size: not a size in bytes")
        with src.blob_stream(repo, blob) as stream:
            header = stream.headers.get("Content-Length")  # text: a number when decimal
            length = byte_size(int(header) if header and header.isdecimal() else header or size,
                               src.where, f"{blob} Content-Length: not a size in bytes")
            dst.upload_blob(repo, blob, stream, length)
        counter[0] += 1
        counter[1] += length

