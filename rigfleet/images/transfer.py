"""Moving saved images between a host's engine and this machine, over the SSH layer.

The one piece of code that saves images (``export_image``: ``rigfleet images export`` and
``rigfleet bump --save-dir`` use it) and the one that loads them (``stream_archive``: the
deploy's archive source and ``rigfleet images import``). Both stream (nothing is staged on
the host), hash what passes, and verify by image id::

    saved = export_image(SshRemote(), host, want, Path("/srv/image-archive"), "0.27.1")
    saved.path, saved.sha256, saved.image_id
    done = load_archive(SshRemote(), host, want, "/srv/image-archive/x.tar")   # "loaded"
"""

from __future__ import annotations

import hashlib
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from rigfleet.errors import RigfleetError
from rigfleet.images.archive import ArchiveError, archive_name, inspect_archive, write_sidecar
from rigfleet.images.hoststate import HostImageState, parse_state, state_script
from rigfleet.images.plan import WantedImage, presence, tag_command, verify_staged
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import Remote

Meter = Callable[[int], None]


class ImageError(RigfleetError, RuntimeError):
    """``docker save`` / ``docker load`` failed, or the image is not what the pin says; the
    message names the host, the image and quotes docker."""


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
    """A rich progress bar on stderr for a transfer; yields the callback to feed bytes to."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
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
    """``docker save`` the pinned image on ``host`` into ``directory`` here, with a sidecar.

    The image is found by the pin (name, digest or image id, verified: never a same-named
    other image), saved under its pinned name (so ``docker load`` restores the name), streamed
    over SSH into ``<dir>/<archive_name>.partial``, checked to hold that image id, renamed,
    and described in ``<name>.json`` (image, digest, image id, vLLM version, sha256, bytes).
    """
    state = host_state(remote, host, want.refs)
    here = presence(want, state)
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
    digest = hashlib.sha256()
    size = 0
    with partial.open("wb") as raw:

        class _Tee:
            def write(self, chunk: bytes) -> int:
                nonlocal size
                digest.update(chunk)
                size += len(chunk)
                if meter is not None:
                    meter(len(chunk))
                return raw.write(chunk)

        rc, err = remote.stream_out(host, script, _Tee())  # type: ignore[arg-type]
    if rc != 0:
        partial.unlink(missing_ok=True)
        raise ImageError(f"{host.name}: docker save {want.image} failed (exit {rc}): "
                         f"{err.strip()[-400:]}")
    try:
        info = inspect_archive(partial)
    except ArchiveError as e:
        partial.unlink(missing_ok=True)
        raise ImageError(f"{host.name}: docker save {want.image} wrote no usable archive: {e}") \
            from None
    if not info.holds(local.id):
        partial.unlink(missing_ok=True)
        raise ImageError(f"{host.name}: the saved archive holds {info.label}, not {local.id}")
    partial.replace(dest)
    write_sidecar(dest, image=want.image, digest=want.digest, image_id=local.id,
                  vllm_version=vllm_version, sha256=digest.hexdigest(), bytes=size,
                  saved_from=host.name,
                  saved_at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"))
    return SavedArchive(dest, digest.hexdigest(), size, local.id)


class _Reader:
    """A file read in chunks, counted (and hashed) as it goes."""

    def __init__(self, f: BinaryIO, meter: Meter | None) -> None:
        self.f, self.meter = f, meter
        self.sha = hashlib.sha256()
        self.bytes = 0

    def read(self, n: int = -1) -> bytes:
        chunk = self.f.read(n)
        self.sha.update(chunk)
        self.bytes += len(chunk)
        if self.meter is not None and chunk:
            self.meter(len(chunk))
        return chunk


def stream_archive(remote: Remote, host: InventoryHost, path: str | Path,
                   command: str = "docker load", meter: Meter | None = None) -> str:
    """Feed a control-side archive into ``command`` (``docker load``) on ``host``; returns its
    output (``Loaded image: ...``). Raises ``ImageError`` quoting docker."""
    started = time.monotonic()
    with Path(path).open("rb") as f:
        reader = _Reader(f, meter)
        rc, out = remote.stream_in(host, command, reader)  # type: ignore[arg-type]
    if rc != 0:
        raise ImageError(f"{host.name}: {command} of {path} failed (exit {rc}, "
                         f"{reader.bytes} bytes sent in {time.monotonic() - started:.0f}s): "
                         f"{out.strip()[-400:]}")
    return out


def load_archive(remote: Remote, host: InventoryHost, want: WantedImage, path: str | Path,
                 meter: Meter | None = None) -> str:
    """Put ``want`` from a control-side archive into ``host``'s engine under its pinned name,
    verified by image id. Returns ``present``, ``tagged`` or ``loaded``."""
    if not want.image_id:
        raise ImageError(f"{want.image}: no image id to verify the archive against")
    try:
        info = inspect_archive(path)
    except ArchiveError as e:
        raise ImageError(str(e)) from None
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
    problem = verify_staged(want, after, None)
    if problem:
        raise ImageError(f"{host.name}: {problem} (loaded from {path})")
    return done


def sidecar_pin(data: dict[str, Any]) -> dict[str, Any]:
    """The pins.yaml keys an archive's sidecar can fill: image, digest, image_id, vllm_version."""
    return {k: data[k] for k in ("image", "digest", "image_id", "vllm_version") if data.get(k)}
