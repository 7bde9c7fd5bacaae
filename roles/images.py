"""Images: every staged stack's vLLM image on the host, by digest, verified.

The other staged stacks' images too: a later swap, or a rollback to one, must not wait for a
pull in its 503 window. Pulls are by ``<repo>:<tag>@<digest>`` (the digest decides what
arrives) and checked against the pin afterwards.

Example::

    images(ctx)
"""

from __future__ import annotations

import io
import shlex
from functools import partial

from pyinfra import host
from pyinfra.api import FileUploadCommand, deploy, operation

from rigfleet.commands import docker as docker_commands
from rigfleet.facts import ImageDigests, ImageLabels, read_fact
from rigfleet.hostside.layout import HOST
from rigfleet.runtime_image import BASE_LABEL, PACKAGES_LABEL, RuntimeImage
from roles.ops import check
from roles.preflight import HostContext


@operation()
def image_pulled(image_ref: str, repository: str, digest: str):
    """Pull ``<repo>:<tag>@<digest>`` unless an image with that digest is present.

    + image_ref: ``<repo>:<tag>@<digest>`` (what is pulled)
    + repository: ``<repo>`` (the local image is looked up as ``<repo>@<digest>``)
    + digest: ``sha256:<64-hex>``
    """
    digests = read_fact(ImageDigests, ref=f"{repository}@{digest}")
    if any(d.endswith(f"@{digest}") for d in digests):
        host.noop(f"image {digest[:19]} present")
        return
    yield docker_commands.pull(image_ref)


def verify_image(image_ref: str, repository: str, digest: str) -> str | None:
    """At execution time: ``docker image inspect`` RepoDigests hold the pinned digest."""
    digests = read_fact(ImageDigests, ref=f"{repository}@{digest}")
    if not any(d.endswith(f"@{digest}") for d in digests):
        return f"image {image_ref} has RepoDigests {digests or 'none'}; pin is {digest}"
    return None


def _runtime_image_ok(image: RuntimeImage, labels: dict[str, str] | None) -> bool:
    return labels is not None and labels.get(BASE_LABEL) == image.digest and \
        labels.get(PACKAGES_LABEL) == " ".join(image.packages)


@operation()
def runtime_image_built(image: RuntimeImage, index_url: str | None = None):
    """Build ``image`` (the pinned image plus the stack's pinned packages) unless it is there.

    + image: the stack's ``RuntimeImage``
    + index_url: the package index (``runtime_pip_index_url``, else ``pip_index_url``)
    """
    if _runtime_image_ok(image, read_fact(ImageLabels, ref=image.ref)):
        host.noop(f"{image.ref} built from {image.digest[:19]}")
        return
    directory = str(HOST.image_build_dir(f"{image.stack}-runtime"))
    yield f"install -d -m 0755 {shlex.quote(directory)}"
    yield FileUploadCommand(io.BytesIO(image.dockerfile(index_url).encode()),
                            f"{directory}/Dockerfile")
    # --network host: the build reaches the index as the host does (a LAN mirror's name).
    yield (f"docker build --quiet --network host -t {shlex.quote(image.ref)} "
           f"{shlex.quote(directory)}")


def verify_runtime_image(image: RuntimeImage) -> str | None:
    """At execution time: the built image says it holds the pinned base and packages."""
    labels = read_fact(ImageLabels, ref=image.ref)
    if not _runtime_image_ok(image, labels):
        return (f"{image.ref} has labels {labels or 'none'}; expected {BASE_LABEL}="
                f"{image.digest} and {PACKAGES_LABEL}={' '.join(image.packages)!r}")
    return None


@deploy("Images")
def images(ctx: HostContext) -> None:
    """Pull and verify every staged stack's image (see the module docstring)."""
    # One order on every host (not "desired stack first"): hosts serving different stacks must
    # call the same operations in the same order, or pyinfra's operation DAG has a cycle.
    images: dict[str, str] = {}
    for name in sorted(ctx.want.stacks):
        other = ctx.want.stacks[name].pins
        images.setdefault(other.image_ref, name)
    for _ref, name in host.loop(list(images.items())):
        other = ctx.want.stacks[name].pins
        image_pulled(
            name=f"Pull {other.image} by digest",
            image_ref=other.image_ref,
            repository=other.repository,
            digest=other.digest,
        )
        check(
            name=f"Verify {other.image}'s RepoDigests hold the pinned digest",
            verify=partial(verify_image, other.image_ref, other.repository, other.digest),
            what="digest verification",
        )
    # A Genesis stack's packages, baked into its own image (no installs at container start).
    runtime = [img for name in sorted(ctx.want.stacks)
               if (img := RuntimeImage.for_stack(ctx.want.stacks[name].spec,
                                                 ctx.want.stacks[name].pins)) is not None]
    index_url = ctx.settings.runtime_pip_index_url or ctx.settings.pip_index_url
    for img in host.loop(runtime):
        runtime_image_built(name=f"Build {img.ref} (pinned packages baked in)", image=img,
                            index_url=index_url)
        check(name=f"Verify {img.ref}", verify=partial(verify_runtime_image, img),
              what="runtime image verification")
