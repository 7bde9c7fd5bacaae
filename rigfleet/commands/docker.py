"""Docker and Compose commands: images by digest, compose projects, container state.

Example::

    from rigfleet.commands import docker

    docker.compose_up("/opt/rigfleet/stacks/int8/compose.yaml", "rigfleet-int8")
    # 'docker compose -p rigfleet-int8 -f /opt/rigfleet/stacks/int8/compose.yaml up -d ...'
"""

from __future__ import annotations

import json
import shlex


def _compose(file: str, project: str) -> str:
    return f"docker compose -p {shlex.quote(project)} -f {shlex.quote(file)}"


def compose_config_check(file: str, project: str) -> str:
    """Validate a compose file (``config -q``: parse, interpolate, print nothing)."""
    return f"{_compose(file, project)} config -q"


def compose_up(file: str, project: str) -> str:
    """Start (or recreate when its config hash changed) the project's services, detached."""
    return f"{_compose(file, project)} up -d --remove-orphans --quiet-pull"


def compose_down(file: str, project: str) -> str:
    """Stop and remove the project's containers (``down``, never ``stop``: Genesis patches
    the container's writable layer, and a stopped-then-started container re-patches)."""
    return f"{_compose(file, project)} down --remove-orphans"


def container_label(container: str, label: str) -> str:
    """Fact command: ``<status> <label value>`` of a container, or nothing when absent."""
    fmt = "{{.State.Status}} {{index .Config.Labels " + json.dumps(label) + "}}"
    return (
        f"docker inspect --type container --format {shlex.quote(fmt)} "
        f"{shlex.quote(container)} 2>/dev/null || true"
    )


def container_status(container: str) -> str:
    """Fact command: ``<status> <exit-code> <restart-count>`` or nothing."""
    fmt = "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}"
    return (
        f"docker inspect --type container --format {shlex.quote(fmt)} "
        f"{shlex.quote(container)} 2>/dev/null || true"
    )


def image_repo_digests(ref: str) -> str:
    """Fact command: the image's RepoDigests as JSON (nothing when absent)."""
    return (
        "docker image inspect --format '{{json .RepoDigests}}' "
        f"{shlex.quote(ref)} 2>/dev/null || true"
    )


def pull(ref: str) -> str:
    """Pull by ``<repo>:<tag>@<digest>``: the digest decides what arrives, the tag is for people."""
    return f"docker pull --quiet {shlex.quote(ref)}"


def vllm_version(ref: str) -> str:
    """Ask the image itself which vLLM it carries (no GPU, no network, removed afterwards)."""
    code = "import vllm; print(vllm.__version__)"
    return (
        f"docker run --rm --network none --entrypoint python3 {shlex.quote(ref)} "
        f"-c {shlex.quote(code)}"
    )


def logs_tail(container: str, lines: int = 40) -> str:
    """The container's last log lines (stdout and stderr together)."""
    return f"docker logs --tail {int(lines)} {shlex.quote(container)} 2>&1 || true"


def runtimes() -> str:
    """Fact command: the daemon's registered runtimes as JSON (nothing when docker is absent)."""
    return "docker info --format '{{json .Runtimes}}' 2>/dev/null || true"
