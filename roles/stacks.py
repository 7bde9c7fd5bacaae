"""Serving stacks, staged: images by digest, the Genesis gate, both compose projects.

Nothing here starts or stops a container: ``roles/swap.py`` does, through the host-side
transaction (stop old, start new, verify-stress gate, promote or roll back). This role makes
sure everything that transaction needs is already on the host, so the 503 window holds no
download:

1. secrets (``/etc/rigfleet/secrets/vllm.env``, the probe's auth header, the bare key for the
   gate; root 0600, content never logged) and the Genesis allowlist helper;
2. every pinned stack's image pulled by ``<repo>:<tag>@<digest>`` and checked against the pin
   (the other stack's too: a later swap, or a rollback to it, must not wait for a pull);
3. for a Genesis stack that is desired, the compatibility gate *before anything starts*: the
   image's own ``vllm.__version__`` (cached per digest) must equal the pin and be on the
   checked-out Genesis ``KNOWN_GOOD_VLLM_PINS``; a refusal names both;
4. both stacks' compose projects (as ``rigfleet.desired`` rendered them) written and checked
   with ``docker compose config -q``.

Example::

    stacks(ctx)
"""

from __future__ import annotations

import io
import json
import shlex
from functools import partial

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from rigfleet.commands import docker as docker_commands
from rigfleet.facts import ImageDigests, TextFile, read_fact
from rigfleet.hostside.layout import HOST
from rigfleet.resources import project_file
from roles.ops import (
    Secret,
    check,
    executing,
    fail,
    on_change,
    run_on_host,
    secret_file,
)
from roles.preflight import HostContext

ALLOWLIST_SCRIPT = str(HOST.script("rigfleet-genesis-allowlist.py"))
VERSION_CACHE_DIR = str(HOST.version_cache_dir)


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


@operation()
def genesis_gate(stack: str, image_ref: str, digest: str, vllm_version: str, commit: str):
    """Refuse a Genesis stack whose image's vLLM is not on the Genesis allowlist.

    The image's version is read from the image itself (``docker run ... python3 -c 'import
    vllm'``) once per digest and cached on the host; the allowlist is parsed from the
    checked-out ``guards.py`` with ``ast`` by a host-side helper. Runs when the deploy
    executes (the checkout and the image exist only then); writing the cache is the only
    change it makes.

    + stack: the stack's name (for messages)
    + image_ref, digest: the pinned image
    + vllm_version: the version the pins say the image reports
    + commit: the pinned Genesis commit (for messages)
    """
    cache = str(HOST.version_cache(digest))
    cached = read_fact(TextFile, path=cache)
    if not executing():
        if cached is None:
            yield f"install -d -m 0755 {VERSION_CACHE_DIR}"  # the version gets cached
        else:
            host.noop("checked when the deploy runs")
        return
    version = cached.strip() if cached else None
    if version is None:
        ok, out, err = run_on_host(docker_commands.vllm_version(image_ref))
        if not ok or not out:
            yield from fail(
                f"{host.name}: cannot read vLLM's version from {image_ref}: "
                f"{' '.join(err[-3:]) or 'no output'}"
            )
            return
        version = out[-1].strip()
    checkout = str(HOST.genesis_checkout)
    ok, out, err = run_on_host(f"python3 {ALLOWLIST_SCRIPT} {shlex.quote(checkout)}")
    try:
        allowed = json.loads(out[-1])["known_good"] if ok and out else None
    except (ValueError, KeyError):
        allowed = None
    if allowed is None:
        yield from fail(
            f"{host.name}: cannot read KNOWN_GOOD_VLLM_PINS from {checkout}: "
            f"{' '.join(err[-3:]) or 'no output'}"
        )
        return
    if version != vllm_version:
        yield from fail(
            f"{host.name}: stack {stack}: image {image_ref} reports vLLM {version}, but the "
            f"pins say {vllm_version}; refusing to start it (fix the pins)"
        )
        return
    if version not in allowed:
        yield from fail(
            f"{host.name}: stack {stack}: image vLLM {version} is not on Genesis "
            f"{commit[:12]}'s KNOWN_GOOD_VLLM_PINS {allowed}; refusing to start it "
            "(pin an allowed image, or a Genesis commit that lists this vLLM)"
        )
        return
    if cached is None:
        yield (
            f"install -d -m 0755 {VERSION_CACHE_DIR} && "
            f"printf '%s\\n' {shlex.quote(version)} > {shlex.quote(cache)}"
        )
    else:
        host.noop(f"vLLM {version} is on the Genesis allowlist")


@deploy("Serving stacks")
def stacks(ctx: HostContext) -> None:
    """Secrets, images, the Genesis gate and both compose files: see the module docstring."""
    key = ctx.api_key.reveal()
    secrets_dir = str(HOST.secrets_dir)
    files.directory(
        name=f"Directory {secrets_dir}", path=secrets_dir, user="root", group="root",
        mode="0700",
    )  # fmt: skip
    secret_file(
        name="vLLM API key env file (root-only)",
        dest=str(HOST.vllm_env_file),
        content=Secret(f"VLLM_API_KEY={key}\n"),
    )
    secret_file(
        name="Readiness probe auth header (root-only)",
        dest=str(HOST.auth_header_file),
        content=Secret(f"Authorization: Bearer {key}\n"),
    )
    secret_file(
        name="API key for the gate (root-only)", dest=str(HOST.api_key_file),
        content=Secret(f"{key}\n"),
    )
    files.put(
        name="Genesis allowlist helper",
        src=str(project_file("files/rigfleet-genesis-allowlist.py")),
        dest=ALLOWLIST_SCRIPT,
        user="root",
        group="root",
        mode="0755",
    )

    # One order on every host (not "desired stack first"): hosts serving different stacks must
    # call the same operations in the same order, or pyinfra's operation DAG has a cycle.
    images: dict[str, str] = {}
    for name in sorted(ctx.specs):
        other = ctx.pins.stacks[name]
        images.setdefault(other.image_ref, name)
    for _ref, name in host.loop(list(images.items())):
        other = ctx.pins.stacks[name]
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
    # Every staged Genesis stack is checked, whichever stack this host serves: the same
    # operations on every host (a per-host `if` here made pyinfra's operation DAG cyclic).
    genesis_stacks = [(n, ctx.pins.stacks[n]) for n, sp in sorted(ctx.specs.items())
                      if sp.needs_genesis and ctx.pins.stacks[n].genesis is not None]
    for name, staged in host.loop(genesis_stacks):
        genesis_gate(
            name=f"Genesis compatibility of vLLM {staged.vllm_version}",
            stack=name,
            image_ref=staged.image_ref,
            digest=staged.digest,
            vllm_version=staged.vllm_version,
            commit=staged.genesis.commit,
        )

    for name, staged in host.loop(sorted(ctx.want.stacks.items())):
        other = staged.spec
        dirs = [str(HOST.stack_dir(name)), *other.cache_dirs]
        for path in host.loop(dirs):
            files.directory(
                name=f"Directory {path}", path=path, user="root", group="root", mode="0755"
            )
        compose = files.put(
            name=f"Compose project {other.compose_project}",
            src=io.StringIO(staged.text),
            dest=staged.compose_file,
            user="root",
            group="root",
            mode="0644",
        )
        on_change(
            name=f"Check {other.compose_project} with docker compose config",
            commands=[
                docker_commands.compose_config_check(staged.compose_file, other.compose_project)
            ],
            gates=[compose],
            reason="compose file unchanged",
        )
