"""Serving stacks: images by digest, both compose projects, one running, ready.

Order matters and is the point of this role:

1. secrets (``/etc/rigfleet/secrets/vllm.env`` and the probe's auth header, root 0600, content
   never logged) and the Genesis allowlist helper;
2. the desired stack's image pulled by ``<repo>:<tag>@<digest>`` and checked against the pin;
3. for a Genesis stack, the compatibility gate *before anything starts*: the image's own
   ``vllm.__version__`` (cached per digest) must equal the pin and be on the checked-out
   Genesis ``KNOWN_GOOD_VLLM_PINS``; a refusal names both;
4. both stacks' compose projects rendered (``rigfleet.compose.render_compose``) and checked
   with ``docker compose config -q``;
5. the other stack down (two stacks do not fit on 2x24 GB), then the desired one up, only
   when its compose file changed or its container is not running with the expected
   ``io.rigfleet.config-hash`` label: a converged host's serving container is never restarted;
6. wait until ``/health`` is 200 and ``/v1/models`` lists the served name (with the key),
   failing fast with the last log lines when the container exits.

Example::

    stacks(ctx)
"""

from __future__ import annotations

import io
import json
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from rigfleet.catalog import StackSpec
from rigfleet.commands import docker as docker_commands
from rigfleet.commands import probe
from rigfleet.compose import (
    CONFIG_HASH_LABEL,
    GENESIS_HOST_DIR,
    SECRETS_DIR,
    SERVICE,
    VLLM_ENV_FILE,
    compose_dir,
    compose_document,
    compose_path,
    render_compose,
)
from rigfleet.facts import ContainerLabel, ImageDigests, TextFile
from roles.ops import (
    Secret,
    changed,
    check,
    executing,
    fail,
    on_change,
    run_on_host,
    secret_file,
)
from roles.preflight import HostContext

FILES_DIR = Path(__file__).resolve().parent.parent / "files"
SCRIPT_DIR = "/usr/local/lib/rigfleet"
ALLOWLIST_SCRIPT = f"{SCRIPT_DIR}/rigfleet-genesis-allowlist.py"
VERSION_CACHE_DIR = "/var/lib/rigfleet/vllm-versions"

# A cold first boot (torch.compile, Triton autotune, cudagraph capture) takes minutes.
READY_TIMEOUT_S = 1200.0
READY_INTERVAL_S = 5.0
LOG_LINES = 30


def expected_hash(ctx: HostContext, spec: StackSpec) -> str:
    """The config-hash label the rendered compose file gives the stack's container."""
    doc = compose_document(spec, ctx.pins, ctx.settings)
    return str(doc["services"][SERVICE]["labels"][CONFIG_HASH_LABEL])


def version_cache_path(digest: str) -> str:
    """Where the image's vLLM version is cached, keyed by its (immutable) digest."""
    return f"{VERSION_CACHE_DIR}/{digest.removeprefix('sha256:')}"


@operation()
def image_pulled(image_ref: str, repository: str, digest: str):
    """Pull ``<repo>:<tag>@<digest>`` unless an image with that digest is present.

    + image_ref: ``<repo>:<tag>@<digest>`` (what is pulled)
    + repository: ``<repo>`` (the local image is looked up as ``<repo>@<digest>``)
    + digest: ``sha256:<64-hex>``
    """
    digests = host.get_fact(ImageDigests, ref=f"{repository}@{digest}")
    if any(d.endswith(f"@{digest}") for d in digests):
        host.noop(f"image {digest[:19]} present")
        return
    yield docker_commands.pull(image_ref)


def verify_image(image_ref: str, repository: str, digest: str) -> str | None:
    """At execution time: ``docker image inspect`` RepoDigests hold the pinned digest."""
    digests = host.get_fact(ImageDigests, ref=f"{repository}@{digest}")
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
    cache = version_cache_path(digest)
    cached = host.get_fact(TextFile, path=cache)
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
    ok, out, err = run_on_host(f"python3 {ALLOWLIST_SCRIPT} {shlex.quote(GENESIS_HOST_DIR)}")
    try:
        allowed = json.loads(out[-1])["known_good"] if ok and out else None
    except (ValueError, KeyError):
        allowed = None
    if allowed is None:
        yield from fail(
            f"{host.name}: cannot read KNOWN_GOOD_VLLM_PINS from {GENESIS_HOST_DIR}: "
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


@operation()
def stack_down(stack: str, project: str, container: str):
    """``docker compose down`` the stack when its container exists (running or not).

    + stack, project, container: names (``int8``, ``rigfleet-int8``, ``rigfleet-int8``)
    """
    state = host.get_fact(ContainerLabel, container=container, label=CONFIG_HASH_LABEL)
    if state is None:
        host.noop(f"{stack} has no container")
        return
    yield docker_commands.compose_down(compose_path(stack), project)


@operation()
def stack_up(
    stack: str,
    project: str,
    container: str,
    config_hash: str,
    gates: Sequence[OperationMeta],
):
    """``docker compose up -d`` only when the compose file changed or the container is not
    running with the expected config hash.

    + stack, project, container: names (``int8``, ``rigfleet-int8``, ``rigfleet-int8``)
    + config_hash: the ``io.rigfleet.config-hash`` the running container must carry
    + gates: the compose file operation
    """
    state = host.get_fact(ContainerLabel, container=container, label=CONFIG_HASH_LABEL)
    current = state is not None and state.running and state.label == config_hash
    if current and not changed(gates):
        host.noop(f"{container} running with config hash {config_hash}")
        return
    yield docker_commands.compose_up(compose_path(stack), project)


def _parse_probe(lines: list[str]) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in lines if "=" in line)


def _model_ids(body: str) -> list[str]:
    try:
        return [str(m.get("id")) for m in json.loads(body).get("data", [])]
    except (ValueError, AttributeError):
        return []


def wait_ready(container: str, port: int, served_name: str, timeout: float) -> str | None:
    """At execution time: poll until ready; a message when the container dies or time runs out."""
    deadline = time.monotonic() + timeout
    first_restarts: int | None = None
    last = "no answer yet"
    while True:
        _, out, _ = run_on_host(probe.ready(container, port))
        values = _parse_probe(out)
        words = values.get("state", "").split()
        if len(words) != 3:
            return f"container {container} does not exist"
        status, exit_code, restarts = words[0], words[1], int(words[2] or 0)
        if first_restarts is None:
            first_restarts = restarts
        if status in ("exited", "dead") or restarts > first_restarts:
            _, logs, _ = run_on_host(docker_commands.logs_tail(container, LOG_LINES))
            return (
                f"container {container} exited (status {status}, exit code {exit_code}) "
                f"before it was ready; last log lines:\n    " + "\n    ".join(logs[-LOG_LINES:])
            )
        health = values.get("health", "")
        ids = _model_ids(values.get("models", ""))
        if health == "200" and served_name in ids:
            return None
        last = f"/health {health or 'no answer'}, /v1/models lists {ids or 'nothing'}"
        if time.monotonic() > deadline:
            _, logs, _ = run_on_host(docker_commands.logs_tail(container, LOG_LINES))
            return (
                f"{container} not ready after {timeout:g}s ({last}); last log lines:\n    "
                + "\n    ".join(logs[-LOG_LINES:])
            )
        time.sleep(READY_INTERVAL_S)


@deploy("Serving stacks")
def stacks(ctx: HostContext) -> None:
    """Pull, gate, render, switch and wait: see the module docstring for the order."""
    spec, pinned = ctx.spec, ctx.desired
    key = ctx.api_key.reveal()
    files.directory(
        name=f"Directory {SECRETS_DIR}", path=SECRETS_DIR, user="root", group="root",
        mode="0700",
    )  # fmt: skip
    secret_file(
        name="vLLM API key env file (root-only)",
        dest=VLLM_ENV_FILE,
        content=Secret(f"VLLM_API_KEY={key}\n"),
    )
    secret_file(
        name="Readiness probe auth header (root-only)",
        dest=probe.AUTH_HEADER_FILE,
        content=Secret(f"Authorization: Bearer {key}\n"),
    )
    files.put(
        name="Genesis allowlist helper",
        src=str(FILES_DIR / "rigfleet-genesis-allowlist.py"),
        dest=ALLOWLIST_SCRIPT,
        user="root",
        group="root",
        mode="0755",
    )

    image_pulled(
        name=f"Pull {pinned.image} by digest",
        image_ref=pinned.image_ref,
        repository=pinned.repository,
        digest=pinned.digest,
    )
    check(
        name="Verify the image's RepoDigests hold the pinned digest",
        verify=lambda: verify_image(pinned.image_ref, pinned.repository, pinned.digest),
        what="digest verification",
    )
    if spec.needs_genesis and pinned.genesis is not None:
        genesis_gate(
            name=f"Genesis compatibility of vLLM {pinned.vllm_version}",
            stack=spec.name,
            image_ref=pinned.image_ref,
            digest=pinned.digest,
            vllm_version=pinned.vllm_version,
            commit=pinned.genesis.commit,
        )

    compose_ops: dict[str, OperationMeta] = {}
    for name, other in host.loop(sorted(ctx.specs.items())):
        project_dir = compose_dir(name)
        dirs = [project_dir, *other.cache_dirs]
        for path in host.loop(dirs):
            files.directory(
                name=f"Directory {path}", path=path, user="root", group="root", mode="0755"
            )
        compose_ops[name] = files.put(
            name=f"Compose project {other.compose_project}",
            src=io.StringIO(render_compose(other, ctx.pins, ctx.settings)),
            dest=compose_path(name),
            user="root",
            group="root",
            mode="0644",
        )
        on_change(
            name=f"Check {other.compose_project} with docker compose config",
            commands=[
                docker_commands.compose_config_check(compose_path(name), other.compose_project)
            ],
            gates=[compose_ops[name]],
            reason="compose file unchanged",
        )

    for name, other in host.loop(sorted(ctx.specs.items())):
        if name != spec.name:
            stack_down(
                name=f"Stop {other.compose_project} (only one stack fits)",
                stack=name,
                project=other.compose_project,
                container=other.container_name,
            )
    stack_up(
        name=f"Start {spec.compose_project} (only when needed)",
        stack=spec.name,
        project=spec.compose_project,
        container=spec.container_name,
        config_hash=expected_hash(ctx, spec),
        gates=[compose_ops[spec.name]],
    )
    timeout = float(host.data.get("ready_timeout_s") or READY_TIMEOUT_S)
    check(
        name=f"Wait until {spec.container_name} serves {spec.served_model_name}",
        verify=lambda: wait_ready(spec.container_name, spec.port, spec.served_model_name, timeout),
        what="readiness",
    )
