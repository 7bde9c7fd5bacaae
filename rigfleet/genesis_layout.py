"""Where each Genesis generation is mounted in a container and how it is applied there.

A leaf of the data layer (docs/genesis.md tells the generations apart)::

    v7 = LAYOUTS["v7"]
    v7.mount_source("/opt/rigfleet/genesis-trees/7b9f...")   # '.../vllm/_genesis'
    entrypoint_script(v7, ("xxhash==3.5.0",))                # the container's bash script
"""

from __future__ import annotations

from dataclasses import dataclass

from rigfleet.genesis_inspect import GENERATIONS, TreeFiles

# The official vllm/vllm-openai image keeps vLLM in dist-packages (Python 3.12).
SITE_PACKAGES_IN_CONTAINER = "/usr/local/lib/python3.12/dist-packages"
TREE_IN_CONTAINER = "/opt/genesis"


@dataclass(frozen=True)
class GenesisLayout:
    """One generation in the container: the part of the tree mounted (``mount``; ``""``: all
    of it) at ``mount_target``, and the lines the entrypoint runs before applying."""

    files: TreeFiles
    mount: str
    mount_target: str
    apply_command: str
    prepare: tuple[str, ...] = ()

    @property
    def generation(self) -> str:
        return self.files.generation

    @property
    def check_file(self) -> str:
        """A file that must exist (an empty mount would make applying a silent no-op)."""
        return self.files.check_file

    def mount_source(self, tree: str) -> str:
        root = tree.rstrip("/")
        return f"{root}/{self.mount}" if self.mount else root

    @property
    def check_path_in_container(self) -> str:
        inside = self.check_file.removeprefix(f"{self.mount}/") if self.mount else self.check_file
        return f"{self.mount_target}/{inside}"


V7 = GenesisLayout(
    files=GENERATIONS["v7"],
    mount="vllm/_genesis",
    mount_target=f"{SITE_PACKAGES_IN_CONTAINER}/vllm/_genesis",
    apply_command="python3 -m vllm._genesis.patches.apply_all",
)

# v12 is mounted whole and linked into site-packages: docs/genesis.md, "Why v12 is mounted whole".
_SNDR_IN_SITE = f"{SITE_PACKAGES_IN_CONTAINER}/sndr"
V12 = GenesisLayout(
    files=GENERATIONS["v12"],
    mount="",
    mount_target=TREE_IN_CONTAINER,
    apply_command="python3 -m sndr.apply",
    prepare=(
        f"if [ -e {_SNDR_IN_SITE} ] && [ ! -L {_SNDR_IN_SITE} ]; then",
        f'  echo "rigfleet: this image already has a sndr package ({_SNDR_IN_SITE}); refusing '
        'to mix it with the pinned Genesis tree" >&2',
        "  exit 1",
        "fi",
        f"ln -sfn {TREE_IN_CONTAINER}/sndr {_SNDR_IN_SITE}",
    ),
)

LAYOUTS: dict[str, GenesisLayout] = {V7.generation: V7, V12.generation: V12}


def entrypoint_script(layout: GenesisLayout, runtime_packages: tuple[str, ...]) -> str:
    """The container's ``/bin/bash -c <script> -- <vllm args>``: check the mount and the baked
    packages, apply Genesis (``set -e``: a failed patch stops the boot), serve."""
    check = layout.check_path_in_container
    lines = [
        "set -e",
        f"if [ ! -f {check} ]; then",
        f'  echo "rigfleet: Genesis patches missing: {check} not found; the host\'s Genesis '
        'checkout is empty or not at the pinned commit. Re-run the deploy." >&2',
        "  exit 1",
        "fi",
    ]
    if runtime_packages:
        # Genesis' dependencies are imported by their names (``xxhash==3.5.0``: ``xxhash``).
        modules = ", ".join(r.split("==", 1)[0].strip().lower().replace("-", "_")
                            for r in runtime_packages)
        wanted = " ".join(runtime_packages)
        lines += [
            f"if ! python3 -c 'import {modules}' 2>/dev/null; then",
            f'  echo "rigfleet: the packages Genesis needs ({wanted}) are not in this image; '
            'the deploy bakes them into the stack\'s image. Re-run the deploy." >&2',
            "  exit 1",
            "fi",
        ]
    lines += [*layout.prepare, layout.apply_command, 'exec vllm serve "$@"']
    return "\n".join(lines) + "\n"
