"""Moving saved images between a host's engine and this machine, over the SSH layer: both ways
stream (nothing is staged on the host), hash what passes, and verify by image id::

    saved = export_image(SshRemote(), host, want, Path("/srv/image-archive"), "0.27.1")
    done = load_archive(SshRemote(), host, want, "/srv/image-archive/x.tar")   # "loaded"
"""

from __future__ import annotations

import hashlib
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rigfleet.errors import RigfleetError
from rigfleet.hostside.records import now_iso
from rigfleet.images.archive import ArchiveError, archive_name, inspect_archive, write_sidecar
from rigfleet.images.hoststate import HostImageState, parse_state, state_script
from rigfleet.images.plan import WantedImage, presence, tag_command, verify_staged
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import Remote

Meter = Callable[[int], None]


class ImageError(RigfleetError, RuntimeError):
    """``docker save`` / ``docker load`` failed, or the image is not what the pin says."""


@dataclass(frozen=True)
class SavedArchive:
    """What ``export_image`` wrote: the tar, its sha256 (hex) and size, the image id in it."""

    path: Path
    sha256: str
    size: int
    image_id: str

    def summary(self) -> dict[str, object]:
        return {"path": str(self.path), "sha256": self.sha256, "bytes": self.size,
                "image_id": self.image_id}


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[Meter]:
    """A progress bar on stderr for a transfer; yields the callback to feed bytes to."""
    from rich import progress
    from rich.console import Console

    columns = (progress.TextColumn("{task.description}"), progress.BarColumn(),
               progress.DownloadColumn(), progress.TransferSpeedColumn(),
               progress.TimeRemainingColumn())
    with progress.Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(description, total=total or None)
        yield lambda n: bar.advance(task, n)


def host_state(remote: Remote, host: InventoryHost, refs: tuple[str, ...],
               archives: tuple[str, ...] = (), spaces: tuple[str, ...] = ()) -> HostImageState:
    """``rigfleet.images.hoststate``'s script over SSH (the deploy runs it as a fact)."""
    rc, out = remote.run(host, state_script(refs, archives, spaces), timeout=120)
    if rc != 0:
        raise ImageError(f"{host.name}: cannot read its images (exit {rc}): {out.strip()[-300:]}")
    return parse_state(out.splitlines())


def export_image(remote: Remote, host: InventoryHost, want: WantedImage, directory: Path,
                 vllm_version: str | None = None, meter: Meter | None = None) -> SavedArchive:
    """``docker save`` ``want`` on ``host`` into ``directory`` here, checked, with a sidecar."""
    here = presence(want, host_state(remote, host, want.refs))
    if here.local is None or here.state not in ("present", "tag"):
        raise ImageError(f"{host.name}: {want.image} (digest {want.digest}) is not on the host; "
                         "nothing to save (stage it with the deploy, or save from a host that "
                         "has it)")
    local = here.local
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / archive_name(want.image)
    partial = dest.with_name(dest.name + ".partial")
    name, src = shlex.quote(want.image), shlex.quote(str(here.ref))
    fmt = shlex.quote("{{.Id}}")
    # Saved under the pinned name; a name that pointed at another image points there again.
    script = (f"prev=$(docker image inspect --format {fmt} {name} 2>/dev/null || true); "
              f"docker tag {src} {name} >&2 || exit 3; docker save {name}; rc=$?; "
              f'if [ -n "$prev" ] && [ "$prev" != {shlex.quote(local.id)} ]; then '
              f'docker tag "$prev" {name} >&2; fi; exit $rc')
    try:
        with partial.open("wb") as raw:
            tee = Counted(raw, meter)
            rc, err = remote.stream_out(host, script, tee)  # type: ignore[arg-type]
        if rc != 0:
            raise ImageError(f"{host.name}: docker save {want.image} failed (exit {rc}): "
                             f"{err.strip()[-400:]}")
        try:
            info = inspect_archive(partial)
        except ArchiveError as e:
            raise ImageError(f"{host.name}: docker save {want.image} wrote no usable archive: "
                             f"{e}") from None
        if not info.holds(local.id):
            raise ImageError(f"{host.name}: the saved archive holds {info.label}, not {local.id}")
    except BaseException:  # a refusal, a broken connection, Ctrl-C: no half archive stays
        partial.unlink(missing_ok=True)
        raise
    partial.replace(dest)
    sha = tee.sha.hexdigest()
    write_sidecar(dest, image=want.image, digest=want.digest, image_id=local.id,
                  vllm_version=vllm_version, sha256=sha, bytes=tee.bytes, saved_from=host.name,
                  saved_at=now_iso(suffix="Z"))
    return SavedArchive(dest, sha, tee.bytes, local.id)


class Counted:
    """A file read or written in chunks, hashed and counted (``meter``) as it goes."""

    def __init__(self, f: BinaryIO, meter: Meter | None) -> None:
        self.f, self.meter = f, meter
        self.sha = hashlib.sha256()
        self.bytes = 0

    def _count(self, chunk: bytes) -> bytes:
        self.sha.update(chunk)
        self.bytes += len(chunk)
        if self.meter is not None and chunk:
            self.meter(len(chunk))
        return chunk

    def read(self, n: int = -1) -> bytes:
        return self._count(self.f.read(n))

    def write(self, chunk: bytes) -> int:
        return self.f.write(self._count(chunk))


def stream_archive(remote: Remote, host: InventoryHost, path: str | Path,
                   command: str = "docker load", meter: Meter | None = None) -> None:
    """Feed a control-side archive into ``command`` on ``host``."""
    started = time.monotonic()
    with Path(path).open("rb") as f:
        reader = Counted(f, meter)
        rc, out = remote.stream_in(host, command, reader)  # type: ignore[arg-type]
    if rc != 0:
        raise ImageError(f"{host.name}: {command} of {path} failed (exit {rc}, "
                         f"{reader.bytes} bytes sent in {time.monotonic() - started:.0f}s): "
                         f"{out.strip()[-400:]}")


def load_archive(remote: Remote, host: InventoryHost, want: WantedImage, path: str | Path,
                 meter: Meter | None = None) -> str:
    """Load ``want`` from an archive here into ``host``, verified: present, tagged or loaded."""
    if not want.image_id:
        raise ImageError(f"{want.image}: no image id to verify the archive against")
    info = inspect_archive(path)  # an ArchiveError names the file
    if not info.holds(want.image_id):
        raise ImageError(f"{path} holds {info.label}, not {want.image} ({want.image_id})")
    here = presence(want, host_state(remote, host, want.refs))
    if here.state == "present":
        return "present"
    done, src = "tagged", here.ref
    if here.state != "tag" or src is None:
        stream_archive(remote, host, path, "docker load", meter)
        done, src = "loaded", want.image_id
    rc, out = remote.run(host, tag_command(src, want.image))
    if rc != 0:
        raise ImageError(f"{host.name}: docker tag {want.image} failed: {out.strip()[-300:]}")
    after = host_state(remote, host, (want.image,)).images.get(want.image)
    if problem := verify_staged(want, after, None):
        raise ImageError(f"{host.name}: {problem} (loaded from {path})")
    return done
