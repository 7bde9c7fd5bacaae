"""A small Docker registry v2 API client: tags and manifest digests.

Works against Docker Hub (anonymous bearer-token dance) and against a plain mirror such as the
testbed's. ``docker pull`` is not needed to learn what a tag points at::

    reg = Registry("https://registry-1.docker.io")
    reg.digest("vllm/vllm-openai", "nightly-01d4d1ad375dc5854779c593eee093bcebb0cada")
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
DOCKER_HUB = "https://registry-1.docker.io"


class RegistryError(RuntimeError):
    """A registry answered something we cannot use (the message says what and where)."""


@dataclass
class Registry:
    """Registry at ``base_url`` (``http://127.0.0.1:15000`` or Docker Hub)."""

    base_url: str = DOCKER_HUB
    timeout: float = 15.0
    _tokens: dict[str, str] = field(default_factory=dict)

    def _request(self, method: str, path: str, repo: str, accept: str = "") -> tuple[dict, bytes]:
        """(lower-cased headers, body) of one request, with Docker Hub's token dance."""
        url = f"{self.base_url.rstrip('/')}{path}"
        for attempt in range(2):
            req = urllib.request.Request(url, method=method)
            if accept:
                req.add_header("Accept", accept)
            if repo in self._tokens:
                # Unredirected: Docker Hub sends blob reads to a CDN with a signed URL, which
                # must not also receive our bearer token.
                req.add_unredirected_header("Authorization", f"Bearer {self._tokens[repo]}")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return {k.lower(): v for k, v in resp.headers.items()}, resp.read()
            except urllib.error.HTTPError as exc:
                challenge = exc.headers.get("WWW-Authenticate", "")
                if exc.code == 401 and attempt == 0 and challenge.startswith("Bearer"):
                    self._tokens[repo] = self._token(challenge)
                    continue
                if exc.code == 404:
                    raise RegistryError(f"{url}: not found (tag or repository gone?)") from None
                raise RegistryError(f"{url}: HTTP {exc.code} {exc.reason}") from None
            except urllib.error.URLError as exc:
                raise RegistryError(f"{url}: cannot reach the registry ({exc.reason})") from None
        raise RegistryError(f"{url}: authentication failed")

    def _token(self, challenge: str) -> str:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        if not realm:
            raise RegistryError(f"unusable auth challenge: {challenge!r}")
        url = f"{realm}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=self.timeout) as resp:
            body = json.load(resp)
        return body.get("token") or body["access_token"]

    def digest(self, repo: str, tag: str) -> str:
        """The manifest digest (``sha256:...``) that ``repo:tag`` points at now."""
        headers, _ = self._request("HEAD", f"/v2/{repo}/manifests/{tag}", repo, MANIFEST_TYPES)
        found = headers.get("docker-content-digest", "")
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", found):
            raise RegistryError(f"{repo}:{tag}: registry gave no usable digest ({found!r})")
        return found

    def tags(self, repo: str) -> list[str]:
        """Every tag of ``repo`` (follows pagination)."""
        path: str | None = f"/v2/{repo}/tags/list?n=1000"
        found: list[str] = []
        while path:
            headers, body = self._request("GET", path, repo)
            found.extend(json.loads(body or b"{}").get("tags") or [])
            link = headers.get("link", "")
            match = re.match(r"<([^>]+)>", link)
            path = match.group(1) if match else None
        return found


def split_image(image: str) -> tuple[str, str]:
    """``vllm/vllm-openai:nightly-x`` -> (``vllm/vllm-openai``, ``nightly-x``)."""
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        raise RegistryError(f"image {image!r} has no tag; expected <repository>:<tag>")
    return name, tag
