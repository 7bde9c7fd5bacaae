"""Images on the hosts after a bump: keep the previous one, prune older ones, keep a copy.

Each vLLM image is ~30 GB; a rig keeps exactly what it needs: the images its pins name now
(the new one) and the ones it served before the bump (an instant rollback needs no pull, and
the upstream nightly tag may be gone in two weeks). Other ``vllm/vllm-openai`` images are
removed; ``docker image rm`` without ``--force`` never removes one a container uses.

Because upstream deletes nightly tags, the promoted image can be kept: ``save_image`` runs
``docker save`` on the canary and streams it over SSH into a control-side directory
(``<repo>_<tag>.tar`` + a JSON sidecar with digest, image id, version, sha256), with the same
code as ``rigfleet images export``; an ``archive`` image source (or ``rigfleet images import``)
restores it, verified by image id. For pulls by digest copy the image into a mirror registry
instead (``rigfleet.bump.mirror``, ``--push-mirror``).

Example::

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
    """References to remove: every reference (``<repo>@<digest>`` and the ``<repo>:<tag>`` the
    images role gave it) of the repository's images whose digest is not in ``keep``.

    Pure. ``listing`` is ``list_command``'s output (one line per tag). Removing only the digest
    reference would leave a tagged image in place. Images without a registry digest
    (``<none>``: built or loaded locally) are never touched.
    """
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
    """Remove the repository's images other than ``keep`` on ``host``; returns what went."""
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


# One piece of code saves images: ``rigfleet images export`` and ``--save-dir`` share it.
SavedImage = SavedArchive


def save_image(
    remote: Remote, host: InventoryHost, candidate: Candidate, directory: Path, version: str
) -> SavedArchive:
    """``docker save`` the candidate (under its name, so ``docker load`` restores it) into
    ``directory`` on this machine, streamed over SSH, with the JSON sidecar that records the
    pin (``rigfleet.images.transfer.export_image``)."""
    want = WantedImage(candidate.image, candidate.digest, None, ())
    return export_image(remote, host, want, directory, version)
