"""Genesis as each of its generations lays itself out: what to mount, how to apply it, where its
allowlist and patch registry live.

Genesis (Sandermage's vLLM patch tree) changed its layout between generations (upstream-2026.md
§3.2): v7.x is a ``vllm/_genesis/`` package applied with
``python3 -m vllm._genesis.patches.apply_all``; v12.x is a top-level ``sndr/`` package applied
with ``python3 -m sndr.apply``. Both text-patch vLLM's files inside the container, so each
container applies them once, from scratch.

Example::

    from rigfleet.genesis import LAYOUTS

    v7 = LAYOUTS["v7"]
    v7.mount_source("/opt/rigfleet/genesis-trees/7b9f...")   # '.../vllm/_genesis'
    v7.apply_command                                          # 'python3 -m vllm._genesis...'
"""

from __future__ import annotations

from dataclasses import dataclass

# The official vllm/vllm-openai image keeps vLLM in dist-packages (Python 3.12).
SITE_PACKAGES_IN_CONTAINER = "/usr/local/lib/python3.12/dist-packages"


@dataclass(frozen=True)
class GenesisLayout:
    """Where one Genesis generation keeps what the deploy needs, relative to the tree's root.

    + generation: ``v7`` or ``v12`` (the key stack files use for their switch sets)
    + package: the directory mounted into the container's site-packages
    + check_file: a file that must exist (an empty mount would make applying a silent no-op)
    + apply_command: what applies the patches inside the container
    + allowlist_file: the file holding ``KNOWN_GOOD_VLLM_PINS``
    + registry_file: the file holding ``PATCH_REGISTRY`` (switch names, lifecycles)
    """

    generation: str
    package: str
    check_file: str
    apply_command: str
    allowlist_file: str
    registry_file: str

    def mount_source(self, tree: str) -> str:
        """The host directory mounted for a tree exported at ``tree``."""
        return f"{tree.rstrip('/')}/{self.package}"

    @property
    def mount_target(self) -> str:
        """Where the package appears inside the container."""
        return f"{SITE_PACKAGES_IN_CONTAINER}/{self.package}"

    @property
    def check_path_in_container(self) -> str:
        return f"{SITE_PACKAGES_IN_CONTAINER}/{self.check_file}"


V7 = GenesisLayout(
    generation="v7",
    package="vllm/_genesis",
    check_file="vllm/_genesis/patches/apply_all.py",
    apply_command="python3 -m vllm._genesis.patches.apply_all",
    allowlist_file="vllm/_genesis/guards.py",
    registry_file="vllm/_genesis/dispatcher.py",
)

V12 = GenesisLayout(
    generation="v12",
    package="sndr",
    check_file="sndr/apply/__main__.py",
    apply_command="python3 -m sndr.apply",
    allowlist_file="sndr/engines/vllm/detection/guards.py",
    registry_file="sndr/dispatcher/registry.py",
)

LAYOUTS: dict[str, GenesisLayout] = {V7.generation: V7, V12.generation: V12}


def requirement_module(requirement: str) -> str:
    """The module a pinned requirement provides for ``import`` (``PyYAML==6`` -> ``yaml`` is
    the exception, not the rule; Genesis' runtime deps import under their own names)."""
    return requirement.split("==", 1)[0].strip().lower().replace("-", "_")


def entrypoint_script(layout: GenesisLayout, runtime_packages: tuple[str, ...]) -> str:
    """The container's ``/bin/bash -c`` script: check the mount and the baked-in packages,
    apply Genesis, serve.

    Runs as ``/bin/bash -c <script> -- <command...>``, so ``"$@"`` is the vLLM argument list.
    Nothing is installed at start (no network needed; nothing unverified): the deploy bakes
    the pinned runtime packages into the stack's image (``roles/images.py``).

    - the mount check: an empty Genesis mount makes applying a silent no-op and the boot then
      fails later with a cryptic upstream error (club-3090 #13); fail at once with a clear line;
    - the package check: the image must be the derived one, with the pinned packages;
    - applying text-patches vLLM in the container's writable layer, once per container;
      ``set -e`` stops the boot if any patch FAILED (exit 1) or the strict pin gate refused
      the build (exit 2).

    + layout: the pinned Genesis' layout
    + runtime_packages: pinned requirements (``xxhash==3.5.0``) baked into the image
    """
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
        modules = ", ".join(requirement_module(r) for r in runtime_packages)
        wanted = " ".join(runtime_packages)
        lines += [
            f"if ! python3 -c 'import {modules}' 2>/dev/null; then",
            f'  echo "rigfleet: the packages Genesis needs ({wanted}) are not in this image; '
            'the deploy bakes them into the stack\'s image. Re-run the deploy." >&2',
            "  exit 1",
            "fi",
        ]
    lines += [layout.apply_command, 'exec vllm serve "$@"']
    return "\n".join(lines) + "\n"
