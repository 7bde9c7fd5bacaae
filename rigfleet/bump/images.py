"""The candidate image on the hosts: seeded into the fleet caches (``prefetch``), its
``vllm.__version__`` read on the canary (docs/bump.md, steps 3 and 7), older images pruned after
the rollout, the promoted one saved here (the code of ``rigfleet images export``)::

    held = prefetch(SshRemote(), load_inventory("inventory/home.py"), candidate, log)
    probe = read_version(SshRemote(), canary_host, candidate, pull=True, caches=held)
    probe.version, probe.pulled     # ("0.20.2rc1.dev212+g3f9c2a7e5", True)
    removed = prune(remote, host, "vllm/vllm-openai", keep={new.digest, old.digest})
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rigfleet.bump.candidate import Candidate
from rigfleet.commands import docker as docker_commands
from rigfleet.errors import RigfleetError
from rigfleet.fleetcache import cache_settings, seed_command, warm_marker
from rigfleet.hostside.layout import HOST
from rigfleet.images.plan import WantedImage
from rigfleet.images.transfer import ImageError as ImageError  # save_image's error
from rigfleet.images.transfer import SavedArchive, export_image
from rigfleet.inventory import InventoryHost
from rigfleet.registry import DIGEST, registry_of
from rigfleet.ssh import Remote


class VersionError(RigfleetError, RuntimeError):
    """The image could not be pulled or did not tell its vLLM version."""


@dataclass(frozen=True)
class VersionProbe:
    version: str | None
    source: str  # "cache" | "image" (present before) | "pulled" | "unknown" (dry, absent)
    pulled: bool = False


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
    """Ask the image on ``host``; raises ``VersionError`` (or ``HostUnreachable``)."""
    rc, out = remote.run(host, probe_script(candidate, pull, caches), timeout=3600)
    values = parse_probe(out)
    if rc == 3:
        raise VersionError(f"{host.name}: cannot pull {candidate.ref}: {out.strip()[-500:]}")
    if rc != 0 or (values.get("source") != "unknown" and not values.get("version")):
        raise VersionError(f"{host.name}: cannot read vllm.__version__ from {candidate.ref} "
                           f"(exit {rc}): {out.strip()[-500:]}")
    source = values.get("source", "unknown")
    return VersionProbe(values.get("version") or None, source, pulled=source == "pulled")


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
    for parts in map(str.split, listing.splitlines()):
        if len(parts) != 3 or parts[0] != repository:
            continue
        _, tag, digest = parts
        if DIGEST.fullmatch(digest) and digest not in keep_set:
            refs.append(f"{repository}@{digest}")
            refs += [f"{repository}:{tag}"] if tag != "<none>" else []
    return list(dict.fromkeys(refs))


def prune(remote: Remote, host: InventoryHost, repository: str, keep: Iterable[str]) -> list[str]:
    fmt = shlex.quote("{{.Repository}} {{.Tag}} {{.Digest}}")
    rc, listing = remote.run(host, f"docker image ls --digests --format {fmt} "
                                   f"{shlex.quote(repository)}")
    if rc != 0:
        return []
    removed = []
    for ref in to_prune(listing, repository, keep):
        # No --force: an image a container (even a stopped one) uses keeps its last reference.
        rc, _ = remote.run(host, f"docker image rm {shlex.quote(ref)} >/dev/null 2>&1")
        if rc == 0:
            removed.append(ref)
    return removed


def save_image(remote: Remote, host: InventoryHost, candidate: Candidate, directory: Path,
               version: str) -> SavedArchive:
    """``docker save`` the candidate into ``directory`` here, with its JSON sidecar."""
    return export_image(remote, host, WantedImage(candidate.image, candidate.digest, None, ()),
                        directory, version)
