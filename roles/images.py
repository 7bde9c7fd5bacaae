"""Images: every staged stack's vLLM image on the host, by digest, verified.

The other staged stacks' images too: a later swap, or a rollback to one, must not wait for a
pull in its 503 window. Pulls are by ``<repo>:<tag>@<digest>`` (the digest decides what
arrives) and checked against the pin afterwards.

Example::

    images(ctx)
"""

from __future__ import annotations

from functools import partial

from pyinfra import host
from pyinfra.api import deploy, operation

from rigfleet.commands import docker as docker_commands
from rigfleet.facts import ImageDigests, read_fact
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
