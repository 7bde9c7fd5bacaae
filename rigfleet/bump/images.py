"""Images on the hosts after a bump: keep the previous one, prune older ones, keep a copy.

Each vLLM image is ~30 GB; a rig keeps exactly what it needs: the images its pins name now
(the new one) and the ones it served before the bump (an instant rollback needs no pull, and
the upstream nightly tag may be gone in two weeks). Other ``vllm/vllm-openai`` images are
removed; ``docker image rm`` without ``--force`` never removes one a container uses.

Because upstream deletes nightly tags, the promoted image can be kept: ``save_image`` runs
``docker save`` on the canary and streams it over SSH into a control-side directory
(``<repo>_<tag>.tar`` + a JSON sidecar with digest, version, sha256); ``docker load -i``
restores it. A loaded image has no registry digest, so for pulls by digest copy the image
into a mirror registry instead (``rigfleet.bump.mirror``, ``--push-mirror``).

Example::

    removed = prune(remote, host, "vllm/vllm-openai", keep={new.digest, old.digest})
    saved = save_image(remote, canary, candidate, Path("/srv/image-archive"), "0.20.2rc1...")
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rigfleet.bump.candidate import Candidate
from rigfleet.errors import RigfleetError
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import Remote

LIST_FORMAT = "{{.Repository}} {{.Digest}}"


class ImageError(RigfleetError, RuntimeError):
    """``docker save`` / ``docker push`` failed on the host; the message quotes docker."""


def list_command(repository: str) -> str:
    fmt = shlex.quote(LIST_FORMAT)
    return f"docker image ls --digests --format {fmt} {shlex.quote(repository)}"


def to_prune(listing: str, repository: str, keep: Iterable[str]) -> list[str]:
    """``<repo>@<digest>`` references to remove: the repository's images not in ``keep``.

    Pure. ``listing`` is ``list_command``'s output; images without a registry digest
    (``<none>``: built or loaded locally) are never touched.
    """
    keep_set = set(keep)
    out: list[str] = []
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) != 2 or parts[0] != repository:
            continue
        digest = parts[1]
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest) or digest in keep_set:
            continue
        ref = f"{repository}@{digest}"
        if ref not in out:
            out.append(ref)
    return out


def prune(remote: Remote, host: InventoryHost, repository: str, keep: Iterable[str]) -> list[str]:
    """Remove the repository's images other than ``keep`` on ``host``; returns what went."""
    rc, listing = remote.run(host, list_command(repository))
    if rc != 0:
        return []
    refs = to_prune(listing, repository, keep)
    removed = []
    for ref in refs:
        # No --force: an image a container (even a stopped one) uses stays.
        rc, _ = remote.run(host, f"docker image rm {shlex.quote(ref)} >/dev/null 2>&1")
        if rc == 0:
            removed.append(ref)
    return removed


@dataclass(frozen=True)
class SavedImage:
    path: Path
    sha256: str
    size: int

    def summary(self) -> dict[str, object]:
        return {"path": str(self.path), "sha256": self.sha256, "bytes": self.size}


def archive_name(candidate: Candidate) -> str:
    """``vllm_vllm-openai_nightly-<sha>.tar``: one file per tag, safe on any filesystem."""
    return f"{candidate.repository.replace('/', '_')}_{candidate.tag}.tar"


def save_image(
    remote: Remote, host: InventoryHost, candidate: Candidate, directory: Path, version: str
) -> SavedImage:
    """``docker save`` the candidate (tagged, so ``docker load`` restores the name) into
    ``directory`` on this machine, streamed over SSH; a ``.json`` sidecar records the pin."""
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / archive_name(candidate)
    partial = dest.with_suffix(".tar.partial")
    local = shlex.quote(f"{candidate.repository}@{candidate.digest}")
    tagged = shlex.quote(candidate.image)
    # Tag only for the save (a saved digest reference restores nameless); untag afterwards
    # unless the tag was already there.
    script = (
        f"had=0; docker image inspect {tagged} >/dev/null 2>&1 && had=1; "
        f"docker tag {local} {tagged} >&2 || exit 3; "
        f"docker save {tagged}; rc=$?; "
        f'[ "$had" = 1 ] || docker image rm {tagged} >/dev/null 2>&1; exit $rc'
    )
    digest = hashlib.sha256()
    size = 0
    with partial.open("wb") as raw:

        class _Tee:
            def write(self, chunk: bytes) -> int:
                nonlocal size
                digest.update(chunk)
                size += len(chunk)
                return raw.write(chunk)

        rc, err = remote.stream_out(host, script, _Tee())  # type: ignore[arg-type]
    if rc != 0:
        partial.unlink(missing_ok=True)
        raise ImageError(f"{host.name}: docker save {candidate.image} failed: {err.strip()[-400:]}")
    partial.replace(dest)
    dest.with_suffix(".json").write_text(
        json.dumps(
            {
                "image": candidate.image,
                "digest": candidate.digest,
                "vllm_version": version,
                "archive": dest.name,
                "sha256": digest.hexdigest(),
                "bytes": size,
                "restore": f"docker load -i {dest.name}",
            },
            indent=2,
        )
        + "\n"
    )
    return SavedImage(dest, digest.hexdigest(), size)
