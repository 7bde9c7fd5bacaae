"""How a container applies each Genesis generation: the entrypoint script around ``LAYOUTS``.

``LAYOUTS`` is the generation table of ``rigfleet.genesis_inspect`` (the one leaf that knows the
layouts; docs/genesis.md tells the generations apart)::

    v7 = LAYOUTS["v7"]
    v7.mount_source("/opt/rigfleet/genesis-trees/7b9f...")   # '.../vllm/_genesis'
    entrypoint_script(v7, ("xxhash==3.5.0",))                # the container's bash script
"""

from __future__ import annotations

from rigfleet.genesis_inspect import GENERATIONS, GenesisLayout, refuse_if

LAYOUTS = GENERATIONS


def entrypoint_script(layout: GenesisLayout, runtime_packages: tuple[str, ...]) -> str:
    """The container's ``/bin/bash -c <script> -- <vllm args>``: check the mount and the baked
    packages, apply Genesis (``set -e``: a failed patch stops the boot), serve."""
    check = layout.check_path_in_container
    lines = ["set -e", *refuse_if(
        f"[ ! -f {check} ]", f"Genesis patches missing: {check} not found; the host's Genesis "
        "checkout is empty or not at the pinned commit. Re-run the deploy.")]
    if runtime_packages:
        # Genesis' dependencies are imported by their names (``xxhash==3.5.0``: ``xxhash``).
        modules = ", ".join(r.split("==", 1)[0].strip().lower().replace("-", "_")
                            for r in runtime_packages)
        wanted = " ".join(runtime_packages)
        lines += refuse_if(f"! python3 -c 'import {modules}' 2>/dev/null",
                           f"the packages Genesis needs ({wanted}) are not in this image; the "
                           "deploy bakes them into the stack's image. Re-run the deploy.")
    lines += [*layout.prepare, layout.apply_command, 'exec vllm serve "$@"']
    return "\n".join(lines) + "\n"
