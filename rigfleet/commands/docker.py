"""Docker and Compose commands the deploy sends (stacks start and stop in the host tool)."""

from __future__ import annotations

import shlex


def compose_config_check(file: str, project: str) -> str:
    """Validate a compose file (``config -q``: parse, interpolate, print nothing)."""
    return f"docker compose -p {shlex.quote(project)} -f {shlex.quote(file)} config -q"


def pull(ref: str) -> str:
    """Pull by ``<repo>:<tag>@<digest>``: the digest decides what arrives."""
    return f"docker pull --quiet {shlex.quote(ref)}"


def vllm_version(ref: str) -> str:
    """Ask the image itself which vLLM it carries (no GPU, no network, removed afterwards)."""
    return (f"docker run --rm --network none --entrypoint python3 {shlex.quote(ref)} "
            f"-c {shlex.quote('import vllm; print(vllm.__version__)')}")
