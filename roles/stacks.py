"""Serving stacks, staged: the secrets they read and every staged stack's compose project.

Nothing here starts or stops a container: ``roles/swap.py`` does, through the host-side
transaction (stop old, start new, verify-stress gate, promote or roll back). With the images
(``roles/images.py``) and the Genesis tree and gate (``roles/genesis.py``), this role makes sure
everything that transaction needs is on the host, so the 503 window holds no download:

1. secrets (``Layout.vllm_env_file``, the probe's auth header, the bare key for the gate;
   root 0600, content never logged) and the Genesis helper the gate runs;
2. every staged stack's compose project (as ``rigfleet.desired`` rendered it), written and
   checked with ``docker compose config -q``; before a changed file is written, the pinned
   image's own vLLM parses the stack's arguments and ``VLLM_*`` names (``rigfleet.vllmargs``):
   a refusal fails the host here, before the swap opens any window, and leaves the staged file
   and the serving stack as they were.

Example::

    stacks(ctx)
"""

from __future__ import annotations

import hashlib
import io
from functools import partial

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files

from rigfleet.commands import docker as docker_commands
from rigfleet.compose import SERVICE
from rigfleet.desired import DesiredStack
from rigfleet.facts import FileDigest, read_fact, read_paths
from rigfleet.hostside.layout import HOST
from rigfleet.vllmargs import check_command, parse_output, refusal
from roles.ops import (
    Secret,
    check,
    on_change,
    run_on_host,
    secret_file,
)
from roles.preflight import HostContext

VERSION_CACHE_DIR = str(HOST.version_cache_dir)


@deploy("Serving stacks")
def stacks(ctx: HostContext) -> None:
    """Secrets, images, the Genesis gate and both compose files: see the module docstring."""
    key = ctx.api_key.reveal()
    secrets_dir = str(HOST.secrets_dir)
    read_paths([str(HOST.vllm_env_file), str(HOST.auth_header_file), str(HOST.api_key_file),
                *(p for name, staged in sorted(ctx.want.stacks.items())
                  for p in (str(HOST.stack_dir(name)), *staged.spec.cache_dirs,
                            staged.compose_file))])
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

    for name, staged in host.loop(sorted(ctx.want.stacks.items())):
        other = staged.spec
        # Before anything of this stack is written: a refusal leaves the host as it was.
        check(
            name=f"vLLM arguments of {name} (the pinned image's own parser)",
            verify=partial(vllm_args_refusal, staged),
            what="vLLM arguments",
        )
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


def vllm_args_refusal(staged: DesiredStack) -> str | None:
    """Why the pinned image's vLLM refuses ``staged``'s arguments or settings (None: accepted,
    or the compose file on the host is already this one, checked when it was written)."""
    current = read_fact(FileDigest, path=staged.compose_file)
    if current is not None and current.sha256 == hashlib.sha256(staged.text.encode()).hexdigest():
        return None
    service = staged.document["services"][SERVICE]
    image = staged.pins.local_image
    cmd = check_command(image, [str(a).replace("$$", "$") for a in service["command"]],
                        service.get("environment") or {})
    ok, out, err = run_on_host(cmd)
    return refusal(parse_output(ok, out, err), staged.spec, image)
