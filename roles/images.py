"""Staged stacks' images pinned and verified, Genesis runtime images built (docs/images.md)."""

from __future__ import annotations

import io
import shlex
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, deploy, operation

from rigfleet.facts import ImageLabels, read_fact
from rigfleet.fleetcache import peer_image_command
from rigfleet.hostside.layout import HOST
from rigfleet.images.deploy import ImageState, fact_arguments, staging_plan
from rigfleet.images.plan import (
    WARNING_MARK,
    ImagePlan,
    Shell,
    SourceResult,
    Step,
    WantedImage,
    verify_staged,
)
from rigfleet.images.transfer import ImageError, stream_archive
from rigfleet.inventory import InventoryHost
from rigfleet.runtime_image import BASE_LABEL, PACKAGES_LABEL, RuntimeImage
from rigfleet.ssh import HostUnreachable
from roles import peers
from roles.ops import DeployError, WarnedCommand, check
from roles.preflight import HostContext


def _stream(state: Any, host: Any, path: str, command: str) -> None:
    """Feed ``path`` (on this machine) into ``command`` on the host."""
    done = [0, 0]

    def meter(n: int) -> None:
        done[0] += n
        if done[0] - done[1] >= 1 << 30:  # a line per GiB: a 30 GB image takes a while
            done[1] = done[0]
            logger.info(f"[{host.name}] {path}: {done[0] / (1 << 30):.0f} GiB streamed")

    try:
        stream_archive(peers.REMOTE(), InventoryHost.of(host), path, command, meter)
    except (ImageError, HostUnreachable, OSError) as e:
        raise DeployError(f"{host.name}: {e}") from None


@operation()
def image_from_peer(image: str, digest: str, image_id: str, steps: Sequence[Step],
                    peer: peers.Peer | None):
    """No fleet cache: the image from the seed once it has it (checked by id), else the pull."""
    if peer is None:
        return
    yield FunctionCommand(peers.start_seed, (peer,), {})
    fallback = " && ".join(s.command for s in steps if isinstance(s, Shell))
    yield WarnedCommand(WARNING_MARK, peer_image_command(
        peer.url, image_id, image, str(HOST.loaded_image(digest)), fallback, WARNING_MARK))


def peer_image(p: ImagePlan) -> tuple[WantedImage, peers.Peer | None]:
    """The image as a peer's load is checked (by id), and the seed (for a pull only)."""
    image_id = p.want.image_id or (p.source.image_id if p.source else None)
    want = replace(p.want, image_id=image_id)
    if p.action != "fetch" or not image_id or not all(isinstance(s, Shell) for s in p.steps):
        return want, None
    return want, peers.peer_for(lambda d: any(
        (s.pins.image, s.pins.digest) == (want.image, want.digest) for s in d.stacks.values()))


@operation()
def image_staged(image: str, steps: Sequence[Step], present: str):
    """Run one image's staging steps; ``present`` is what ``--dry`` says when there are none."""
    if not steps:
        host.noop(f"{image}: {present}")
        return
    for step in steps:
        if not isinstance(step, Shell):
            yield FunctionCommand(_stream, (step.path, step.command), {})
        else:  # a fleet cache's pull may fall back: a warning
            yield WarnedCommand(WARNING_MARK, step.command)


def verify_image(want: WantedImage, source: SourceResult | None,
                 state_args: dict[str, Any]) -> str | None:
    """At execution time: the pinned name holds the pinned image."""
    return verify_staged(want, read_fact(ImageState, **state_args).images.get(want.image), source)


def describe(p: ImagePlan) -> str:
    if p.action == "fetch" and p.source is not None:
        return f"Stage {p.want.image} from {p.source.label}"
    if p.action == "tag":
        return f"Name {p.want.image} (there as {p.presence.ref})"
    return f"Stage {p.want.image}"


def verify_runtime_image(image: RuntimeImage) -> str | None:
    """The built image says it holds the pinned base and packages."""
    labels = read_fact(ImageLabels, ref=image.ref) or {}
    packages = " ".join(image.packages)
    if labels.get(BASE_LABEL) != image.digest or labels.get(PACKAGES_LABEL) != packages:
        return (f"{image.ref} has labels {labels or 'none'}; expected {BASE_LABEL}="
                f"{image.digest} and {PACKAGES_LABEL}={packages!r}")
    return None


@operation()
def runtime_image_built(image: RuntimeImage, index_url: str | None):
    """Build ``image`` (the pinned image plus the stack's pinned packages) unless it is there."""
    if verify_runtime_image(image) is None:
        host.noop(f"{image.ref} built from {image.digest[:19]}")
        return
    directory = str(HOST.image_build_dir(f"{image.stack}-runtime"))
    yield f"install -d -m 0755 {shlex.quote(directory)}"
    yield FileUploadCommand(io.BytesIO(image.dockerfile(index_url).encode()),
                            f"{directory}/Dockerfile")
    # --network host: the build reaches the index as the host does (a LAN mirror's name).
    yield (f"docker build --quiet --network host -t {shlex.quote(image.ref)} "
           f"{shlex.quote(directory)}")


@deploy("Images")
def images(ctx: HostContext) -> None:
    state_args = fact_arguments(ctx.want)
    # One order on every host (by stack name), or pyinfra's operation DAG has a cycle; each host's
    # own staging before any peer's load (other hosts hold a shared image at other loop positions).
    planned = [(p, *peer_image(p)) for p in staging_plan(ctx.want).images]
    for p, _, peer in host.loop(planned):
        present = (f"present (id {p.presence.local.id[:19]})"
                   if p.presence.local is not None else "present")
        image_staged(name=describe(p), image=p.want.image, steps=p.steps if peer is None else (),
                     present=present if peer is None else f"from peer {peer.seed} once it has it")
    for p, want, peer in host.loop(planned):
        image_from_peer(name=f"Stage {p.want.image} from a peer", image=p.want.image,
                        digest=p.want.digest, image_id=want.image_id or "", steps=p.steps,
                        peer=peer)
        # from a peer: no RepoDigests, the image id is the check (as for an archive)
        checked, source = (p.want, p.source) if peer is None else (want, None)
        check(name=f"Verify {p.want.image} is the pinned image",
              verify=partial(verify_image, checked, source, state_args), what="image verification")
    # A Genesis stack's packages, baked into its own image (no installs at container start).
    runtime = [img for _, s in sorted(ctx.want.stacks.items())
               if (img := RuntimeImage.for_stack(s.spec, s.pins)) is not None]
    index_url = ctx.want.settings.runtime_pip_index_url or ctx.want.settings.pip_index_url
    for img in host.loop(runtime):
        runtime_image_built(name=f"Build {img.ref} (pinned packages baked in)", image=img,
                            index_url=index_url)
        check(name=f"Verify {img.ref}", verify=partial(verify_runtime_image, img),
              what="runtime image verification")
