"""Serving stacks staged, not started: their secrets, and compose files vLLM's parser accepted."""

from __future__ import annotations

import hashlib
import io
from functools import partial

from pyinfra import host
from pyinfra.api import deploy

from rigfleet.commands import docker as docker_commands
from rigfleet.compose import SERVICE
from rigfleet.desired import DesiredStack
from rigfleet.facts import FileDigest, read_fact, read_paths
from rigfleet.hostside.layout import HOST
from rigfleet.vllmargs import check_command, parse_output, refusal, start_failed
from roles.ops import Secret, check, on_change, root_dir, root_put, run_on_host, secret_file
from roles.preflight import HostContext


@deploy("Serving stacks")
def stacks(ctx: HostContext) -> None:
    key = ctx.api_key.reveal()
    secrets = {str(HOST.vllm_env_file): ("vLLM API key env file", f"VLLM_API_KEY={key}\n"),
               str(HOST.auth_header_file): ("Readiness probe auth header",
                                            f"Authorization: Bearer {key}\n"),
               str(HOST.api_key_file): ("API key for the gate", f"{key}\n")}
    read_paths([*secrets, *(p for name, staged in sorted(ctx.want.stacks.items())
                            for p in (str(HOST.stack_dir(name)), *staged.spec.cache_dirs,
                                      staged.ref.compose_file))])
    root_dir(name=f"Directory {HOST.secrets_dir}", path=str(HOST.secrets_dir), mode="0700")
    for dest, (what, text) in host.loop(secrets.items()):
        secret_file(name=f"{what} (root-only)", dest=dest, content=Secret(text))

    for name, staged in host.loop(sorted(ctx.want.stacks.items())):
        project = staged.spec.compose_project
        # Before anything of this stack is written: a refusal leaves the host as it was.
        check(name=f"vLLM arguments of {name} (the pinned image's own parser)",
              verify=partial(vllm_args_refusal, staged), what="vLLM arguments")
        for path in host.loop([str(HOST.stack_dir(name)), *staged.spec.cache_dirs]):
            root_dir(name=f"Directory {path}", path=path)
        compose = root_put(name=f"Compose project {project}", src=io.StringIO(staged.text),
                           dest=staged.ref.compose_file)
        on_change(name=f"Check {project} with docker compose config",
                  commands=[docker_commands.compose_config_check(staged.ref.compose_file, project)],
                  gates=[compose], reason="compose file unchanged")


def vllm_args_refusal(staged: DesiredStack) -> str | None:
    """Why the pinned image's vLLM refuses ``staged``'s arguments, if it does."""
    current = read_fact(FileDigest, path=staged.ref.compose_file)
    if current is not None and current.sha256 == hashlib.sha256(staged.text.encode()).hexdigest():
        return None
    service = staged.document["services"][SERVICE]
    image = staged.pins.image
    cmd = check_command(image, [str(a).replace("$$", "$") for a in service["command"]],
                        service.get("environment") or {})
    answer = run_on_host(cmd)
    if start_failed(*answer):  # the container never started: once more before refusing
        answer = run_on_host(cmd)
    return refusal(parse_output(*answer), staged.spec, image)
