"""Images on the hosts after a bump: keep the new and the previous one (an instant rollback
needs no pull), prune older ``vllm/vllm-openai`` ones, and ``docker save`` the promoted one into
a control-side directory (the code of ``rigfleet images export``)::

    removed = prune(remote, host, "vllm/vllm-openai", keep={new.digest, old.digest})
    saved = save_image(remote, canary, candidate, Path("/srv/image-archive"), "0.20.2rc1...")
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from pathlib import Path

from rigfleet.bump.candidate import Candidate
from rigfleet.images.plan import WantedImage
from rigfleet.images.transfer import ImageError, SavedArchive, export_image
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import Remote

LIST_FORMAT = "{{.Repository}} {{.Tag}} {{.Digest}}"
__all__ = ["ImageError", "SavedImage", "prune", "save_image", "to_prune"]


def list_command(repository: str) -> str:
    fmt = shlex.quote(LIST_FORMAT)
    return f"docker image ls --digests --format {fmt} {shlex.quote(repository)}"


def to_prune(listing: str, repository: str, keep: Iterable[str]) -> list[str]:
    """Every reference (by digest and by tag) of the repository's images whose digest is not in
    ``keep``, from ``list_command``'s output; images with no registry digest stay. Pure."""
    keep_set = set(keep)
    out: list[str] = []
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[0] != repository:
            continue
        tag, digest = parts[1], parts[2]
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest) or digest in keep_set:
            continue
        refs = [f"{repository}@{digest}"] + ([f"{repository}:{tag}"] if tag != "<none>" else [])
        out += [r for r in refs if r not in out]
    return out


def prune(remote: Remote, host: InventoryHost, repository: str, keep: Iterable[str]) -> list[str]:
    rc, listing = remote.run(host, list_command(repository))
    if rc != 0:
        return []
    refs = to_prune(listing, repository, keep)
    removed = []
    for ref in refs:
        # No --force: an image a container (even a stopped one) uses keeps its last reference.
        rc, _ = remote.run(host, f"docker image rm {shlex.quote(ref)} >/dev/null 2>&1")
        if rc == 0:
            removed.append(ref)
    return removed


SavedImage = SavedArchive


def save_image(
    remote: Remote, host: InventoryHost, candidate: Candidate, directory: Path, version: str
) -> SavedArchive:
    """``docker save`` the candidate into ``directory`` here, with its JSON sidecar."""
    want = WantedImage(candidate.image, candidate.digest, None, ())
    return export_image(remote, host, want, directory, version)
