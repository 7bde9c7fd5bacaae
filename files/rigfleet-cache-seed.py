#!/usr/bin/env python3
"""Put one pinned image's blobs into the fleet cache, each fetched from the upstream once.

Installed on a fleet cache host by rigfleet (roles/cache.py) and run as root there:

    rigfleet-cache-seed.py --upstream https://registry-1.docker.io \
        --socket /run/rigfleet-cache-seed/registry.sock --repo vllm/vllm-openai \
        --digest sha256:<64 hex> [--marker FILE] [--spool DIR]

Why: Docker's registry 2.x in proxy mode fetches a blob it does not hold from the upstream
twice (one copy to store, one streamed to the client that asked), so a cache warmed through
its own proxy costs the uplink every byte twice. Here each blob of the linux/amd64 image
(config and layers; an index is resolved to that platform) is fetched once, its sha256
checked, and uploaded to a second registry on a root-only socket that shares the proxy's
storage; the proxy then serves it from disk. Blobs the cache holds already are skipped.
Manifests are left to the proxy (a few KB; it fetches them when a host asks).

Registry token auth (Docker Hub's anonymous pull tokens) is answered from the upstream's own
``WWW-Authenticate`` challenge; the token is sent to the upstream only, never on a redirect.
Progress goes to stdout, prefixed ``[rigfleet-cache]``. Exit codes: 0 ok, 1 a fetch or check
failed (nothing unverified was stored), 2 usage, 4 not enough disk.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

MANIFEST_TYPES = ",".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
CHUNK = 1 << 20


class SeedError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def say(message: str) -> None:
    print(f"[rigfleet-cache] {message}", flush=True)


class Upstream:
    """GETs from a registry, answering a Bearer challenge once per repository."""

    def __init__(self, base: str, repo: str) -> None:
        self.base, self.repo, self.token = base.rstrip("/"), repo, ""

    def open(self, path: str, accept: str = ""):
        for attempt in (1, 2):
            req = urllib.request.Request(f"{self.base}/v2/{self.repo}/{path}")
            if accept:
                req.add_header("Accept", accept)
            if self.token:  # not copied onto a redirect (a CDN's signed URL refuses it)
                req.add_unredirected_header("Authorization", f"Bearer {self.token}")
            try:
                return urllib.request.urlopen(req, timeout=60)
            except urllib.error.HTTPError as e:
                challenge = e.headers.get("WWW-Authenticate", "")
                if e.code != 401 or attempt == 2 or not challenge.startswith("Bearer "):
                    raise SeedError(
                        f"{self.base}: GET /v2/{self.repo}/{path}: HTTP {e.code}") from None
                self.token = self._token(challenge)
        raise AssertionError("unreachable")

    def _token(self, challenge: str) -> str:
        fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if "realm" not in fields:
            raise SeedError(f"{self.base}: a Bearer challenge without a realm: {challenge}")
        query = {"scope": fields.get("scope", f"repository:{self.repo}:pull")}
        if "service" in fields:
            query["service"] = fields["service"]
        url = f"{fields['realm']}?{urllib.parse.urlencode(query)}"
        try:
            with urllib.request.urlopen(url, timeout=60) as answer:
                body = json.loads(answer.read())
        except (OSError, ValueError) as e:
            raise SeedError(f"{self.base}: the token service {fields['realm']}: {e}") from None
        token = body.get("token") or body.get("access_token")
        if not isinstance(token, str) or not token:
            raise SeedError(f"{self.base}: the token service {fields['realm']} gave no token")
        return token

    def manifest(self, digest: str) -> dict:
        with self.open(f"manifests/{digest}", MANIFEST_TYPES) as answer:
            body = answer.read()
        got = "sha256:" + hashlib.sha256(body).hexdigest()
        if got != digest:
            raise SeedError(f"{self.base}: manifest {digest} came with sha256 {got}")
        return json.loads(body)


def image_blobs(upstream: Upstream, digest: str) -> list[tuple[str, int]]:
    """(digest, size) of the linux/amd64 image's config and layers."""
    top = upstream.manifest(digest)
    if "manifests" in top:
        amd64 = [m["digest"] for m in top["manifests"]
                 if m.get("platform", {}).get("os") == "linux"
                 and m.get("platform", {}).get("architecture") == "amd64"]
        if not amd64:
            raise SeedError(f"{digest}: the index has no linux/amd64 image")
        top = upstream.manifest(amd64[0])
    return [(d["digest"], int(d["size"])) for d in (top["config"], *top["layers"])]


class SocketConnection(http.client.HTTPConnection):
    """HTTP to the seeding registry's unix socket."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=600)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Local:
    """The seeding registry: which blobs it holds, and a monolithic upload of one."""

    def __init__(self, path: str, repo: str, wait_s: float = 30) -> None:
        self.path, self.repo = path, repo
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._request("GET", "/v2/")
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    raise SeedError(
                        f"the seeding registry at {path} does not answer: {e}") from None
                time.sleep(0.5)

    def _request(self, method: str, target: str, body=None, headers=None):
        conn = SocketConnection(self.path)
        try:
            conn.request(method, target, body=body, headers=headers or {})
            answer = conn.getresponse()
            answer.read()
            return answer.status, answer.headers
        finally:
            conn.close()

    def holds(self, digest: str) -> bool:
        return self._request("HEAD", f"/v2/{self.repo}/blobs/{digest}")[0] == 200

    def upload(self, digest: str, path: str) -> None:
        status, headers = self._request("POST", f"/v2/{self.repo}/blobs/uploads/")
        where = headers.get("Location", "")
        if status != 202 or not where:
            raise SeedError(f"the seeding registry refused an upload: HTTP {status}")
        url = urllib.parse.urlsplit(where)
        query = "&".join(q for q in (url.query, urllib.parse.urlencode({"digest": digest})) if q)
        with open(path, "rb") as body:
            status, _ = self._request("PUT", f"{url.path}?{query}", body=body, headers={
                "Content-Type": "application/octet-stream",
                "Content-Length": str(os.path.getsize(path))})
        if status != 201:
            raise SeedError(f"the seeding registry refused {digest}: HTTP {status}")


def fetch_blob(upstream: Upstream, digest: str, size: int, dest: str) -> None:
    """Stream one blob to ``dest``; its size and sha256 must be the manifest's."""
    sha, got = hashlib.sha256(), 0
    with upstream.open(f"blobs/{digest}") as answer, open(dest, "wb") as out:
        while chunk := answer.read(CHUNK):
            sha.update(chunk)
            out.write(chunk)
            got += len(chunk)
    if got != size or "sha256:" + sha.hexdigest() != digest:
        os.unlink(dest)
        raise SeedError(f"{upstream.base}: blob {digest}: {got} bytes with sha256 "
                        f"{sha.hexdigest()[:16]}..., the manifest says {size} bytes; not stored")


def seed(args: argparse.Namespace) -> int:
    upstream = Upstream(args.upstream, args.repo)
    blobs = image_blobs(upstream, args.digest)
    local = Local(args.socket, args.repo)
    todo = [(d, s) for d, s in blobs if not local.holds(d)]
    say(f"{args.repo}@{args.digest[:19]}: {len(blobs)} blobs, {len(todo)} to fetch "
        f"({sum(s for _, s in todo)} bytes)")
    os.makedirs(args.spool, mode=0o700, exist_ok=True)
    for i, (digest, size) in enumerate(todo, 1):
        free = shutil.disk_usage(args.spool).free
        if free < 2 * size:
            raise SeedError(f"{args.spool}: {free} bytes free, blob {digest} needs {2 * size} "
                            "(the spooled copy and the stored one); free space or prune the "
                            "cache (docs/images.md)", code=4)
        part = os.path.join(args.spool, f"{digest[7:]}.{os.getpid()}.part")
        try:
            fetch_blob(upstream, digest, size, part)
            local.upload(digest, part)
        finally:
            if os.path.exists(part):
                os.unlink(part)
        say(f"[{i}/{len(todo)}] {digest[:19]} {size} bytes stored")
    if args.marker:
        os.makedirs(os.path.dirname(args.marker), mode=0o755, exist_ok=True)
        with open(args.marker, "w") as f:
            f.write(f"{args.repo}@{args.digest}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, help="the registry the cache proxies")
    p.add_argument("--socket", required=True, help="the seeding registry's unix socket")
    p.add_argument("--repo", required=True, help="repository path upstream (vllm/vllm-openai)")
    p.add_argument("--digest", required=True, help="the pinned digest (index or image)")
    p.add_argument("--marker", help="written once every blob is held")
    p.add_argument("--spool", default="/var/lib/rigfleet/cache-spool")
    args = p.parse_args(argv)
    if not DIGEST.match(args.digest):
        print(f"--digest {args.digest!r}: allowed: sha256:<64 hex>", file=sys.stderr)
        return 2
    try:
        return seed(args)
    except SeedError as e:
        print(f"[rigfleet-cache] ERROR: {e}", file=sys.stderr)
        return e.code
    except OSError as e:
        print(f"[rigfleet-cache] ERROR: {args.upstream}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
