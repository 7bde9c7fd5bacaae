"""The candidate image on the hosts (docs/bump.md, steps 3 and 7): seeded into the fleet caches,
its ``vllm.__version__`` read on the canary, older ones pruned, the promoted one saved here and
copied into a mirror registry, manifest bytes unchanged (``--push-mirror``)::

    held = prefetch(SshRemote(), load_inventory("inventory/home.py"), candidate, log)
    probe = read_version(SshRemote(), canary_host, candidate, pull=True, caches=held)
    probe.version, probe.source     # ("0.20.2rc1.dev212+g3f9c2a7e5", "pulled")
    removed = prune(remote, host, "vllm/vllm-openai", keep={new.digest, old.digest})
    copied = copy_image(MirrorRegistry(DOCKER_HUB), MirrorRegistry(mirror), repo, tag, digest)
"""

from __future__ import annotations

import http.client
import re
import shlex
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from rigfleet.bump.candidate import Candidate
from rigfleet.commands import docker as docker_commands
from rigfleet.errors import RigfleetError
from rigfleet.fleetcache import cache_settings, seed_command, warm_marker
from rigfleet.hostside.layout import HOST
from rigfleet.images.plan import WantedImage
from rigfleet.images.transfer import ImageError as ImageError  # save_image's, read_version's
from rigfleet.images.transfer import SavedArchive, export_image
from rigfleet.inventory import InventoryHost
from rigfleet.registry import (
    DIGEST,
    MANIFEST_TYPES,
    Registry,
    RegistryError,
    byte_size,
    listed,
    registry_of,
    sha256_digest,
)
from rigfleet.ssh import Remote


@dataclass(frozen=True)
class VersionProbe:
    version: str | None
    source: str  # "cache" | "image" (present before) | "pulled" | "unknown" (dry, absent)


def local_refs(candidate: Candidate, caches: Sequence[str]) -> list[str]:
    """The candidate by digest, then in each fleet cache's registry (``lb.lan:5000/<path>@…``)."""
    path = registry_of(candidate.repository)[1]
    return [f"{candidate.repository}@{candidate.digest}",
            *(f"{c}/{path}@{candidate.digest}" for c in caches)]


def probe_script(candidate: Candidate, pull: bool, caches: Sequence[str] = ()) -> str:
    """The host-side script; prints ``key=value`` lines; pulls from ``caches`` first."""
    cache = shlex.quote(str(HOST.version_cache(candidate.digest)))
    # "@REF@": shlex.quote leaves it bare, then it is replaced by "$ref" in the script.
    run_found = docker_commands.vllm_version("@REF@").replace("@REF@", '"$ref"')
    refs = local_refs(candidate, caches)
    lines = [
        f"if [ -s {cache} ]; then echo source=cache; echo version=$(cat {cache}); exit 0; fi",
        'ref=""',
        f"for r in {shlex.join(refs)}; do",
        '  if docker image inspect "$r" >/dev/null 2>&1; then ref=$r; break; fi',
        "done",
        'if [ -n "$ref" ]; then echo source=image; else',
    ]
    if pull:
        for r in refs[1:]:
            warn = shlex.quote(f"WARNING: the pull of {r} from the fleet cache failed; "
                               "trying the next source")
            lines.append(f'  [ -n "$ref" ] || {{ {docker_commands.pull(r)} >&2 && '
                         f"ref={shlex.quote(r)} || echo {warn} >&2; }}")
        lines += [f'  [ -n "$ref" ] || {{ {docker_commands.pull(candidate.ref)} >&2 || exit 3; '
                  f"ref={shlex.quote(candidate.ref)}; }}",
                  "  echo source=pulled"]
    else:
        lines.append("  echo source=unknown; exit 0")
    lines += [
        "fi",
        f'out=$({run_found} 2>&1) || {{ printf "%s\\n" "$out" >&2; exit 4; }}',
        'v=$(printf "%s\\n" "$out" | tail -n 1)',
        'echo "version=$v"',
    ]
    if pull:  # --dry changes nothing, not even the cache
        lines.append(f"install -d -m 0755 {HOST.version_cache_dir} && "
                     f"printf '%s\\n' \"$v\" > {cache}")
    return "\n".join(lines) + "\n"


def parse_probe(output: str) -> dict[str, str]:
    pairs = (line.partition("=") for line in output.splitlines())
    return {key: value.strip() for key, sep, value in pairs if sep and key in ("source", "version")}


def read_version(remote: Remote, host: InventoryHost, candidate: Candidate, *, pull: bool,
                 caches: Sequence[str] = ()) -> VersionProbe:
    """Ask the image on ``host``; raises ``ImageError`` (or ``HostUnreachable``)."""
    rc, out = remote.run(host, probe_script(candidate, pull, caches), timeout=3600)
    values = parse_probe(out)
    if rc == 3:
        raise ImageError(f"{host.name}: cannot pull {candidate.ref}: {out.strip()[-500:]}")
    if rc != 0 or (values.get("source") != "unknown" and not values.get("version")):
        if values.get("source") == "pulled":  # pulled for nothing: leave the host as found
            with suppress(RigfleetError):  # the error to say is the one below
                remove_image(remote, host, candidate, caches)
        raise ImageError(f"{host.name}: cannot read vllm.__version__ from {candidate.ref} "
                         f"(exit {rc}): {out.strip()[-500:]}")
    return VersionProbe(values.get("version") or None, values.get("source", "unknown"))


def remove_image(remote: Remote, host: InventoryHost, candidate: Candidate,
                 caches: Sequence[str] = ()) -> None:
    """Remove a candidate this bump pulled and then refused (leave the host as found)."""
    refs = shlex.join(local_refs(candidate, caches))
    remote.run(host, f"docker image rm {refs} >/dev/null 2>&1; true")


def prefetch(remote: Remote, inventory: Sequence[InventoryHost], candidate: Candidate,
             log: Callable[[str], object]) -> tuple[str, ...]:
    """Seed ``candidate`` into every fleet cache; the registries (``host:port``) that hold it."""
    registry, path = registry_of(candidate.repository)
    if registry is not None:  # the caches pull through for Docker Hub's names only
        return ()
    held: list[str] = []
    hosts = {h.name: h for h in inventory}
    for c in cache_settings(inventory):  # a cache its preflight refuses: the canary pulls upstream
        h = hosts[c.name]
        log(f"fleet cache {h.name}: fetching {path}@{candidate.digest[:19]} from "
            f"{c.registry_upstream} once, before the canary")
        try:
            rc, out = remote.run(h, seed_command(c.registry_upstream, path, candidate.digest,
                                                 warm_marker(candidate.digest)),
                                 timeout=3600)  # several GB through a home uplink
        except RigfleetError as e:
            rc, out = -1, str(e)
        if rc == 0:
            held.append(f"{c.address}:{c.registry_port}")
        else:
            last = out.strip().splitlines()[-1:] or ["no output"]
            log(f"[yellow]warning:[/yellow] fleet cache {h.name}: the candidate is not in the "
                f"cache (exit {rc}: {last[0][-300:]}); the canary pulls it from the upstream")
    return tuple(held)


def to_prune(listing: str, repository: str, keep: Iterable[str]) -> list[str]:
    """Every reference (by digest and by tag) of the repository's images whose digest is not in
    ``keep``, from ``docker image ls --digests`` lines; images with no registry digest stay."""
    keep_set = set(keep)
    refs: list[str] = []
    for repo, tag, digest in (p for p in map(str.split, listing.splitlines()) if len(p) == 3):
        if repo == repository and DIGEST.fullmatch(digest) and digest not in keep_set:
            refs.append(f"{repository}@{digest}")
            refs += [f"{repository}:{tag}"] if tag != "<none>" else []
    return list(dict.fromkeys(refs))


def prune(remote: Remote, host: InventoryHost, repository: str, keep: Iterable[str]) -> list[str]:
    fmt = shlex.quote("{{.Repository}} {{.Tag}} {{.Digest}}")
    rc, listing = remote.run(host, f"docker image ls --digests --format {fmt} "
                                   f"{shlex.quote(repository)}")
    if rc != 0:
        return []
    # No --force: an image a container (even a stopped one) uses keeps its last reference.
    return [ref for ref in to_prune(listing, repository, keep)
            if remote.run(host, f"docker image rm {shlex.quote(ref)} >/dev/null 2>&1")[0] == 0]


def save_image(remote: Remote, host: InventoryHost, candidate: Candidate, directory: Path,
               version: str) -> SavedArchive:
    """``docker save`` the candidate into ``directory`` here, with its JSON sidecar."""
    return export_image(remote, host, WantedImage(candidate.image, candidate.digest, None, ()),
                        directory, version)


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
    blobs_copied: int  # present ones are skipped
    bytes_copied: int


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
