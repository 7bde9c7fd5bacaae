"""Serving stacks, staged: the secrets they read and every staged stack's compose project.

Nothing here starts or stops a container: ``roles/swap.py`` does, through the host-side
transaction (stop old, start new, verify-stress gate, promote or roll back). With the images
(``roles/images.py``) and the Genesis tree and gate (``roles/genesis.py``), this role makes sure
everything that transaction needs is on the host, so the 503 window holds no download:

1. secrets (``Layout.vllm_env_file``, the probe's auth header, the bare key for the gate;
   root 0600, content never logged) and the Genesis helper the gate runs;
2. every staged stack's compose project (as ``rigfleet.desired`` rendered it), written and
   checked with ``docker compose config -q``.

Example::

    stacks(ctx)
"""

from __future__ import annotations

import io

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files

from rigfleet.commands import docker as docker_commands
from rigfleet.facts import read_paths
from rigfleet.hostside.layout import HOST
from roles.ops import (
    Secret,
    on_change,
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
