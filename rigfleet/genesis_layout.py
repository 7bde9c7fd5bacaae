"""Where each Genesis generation is mounted in a container and how it is applied there.

A leaf of the data layer (it reads ``rigfleet.genesis_inspect.GENERATIONS`` only), so the stack
catalog, the pins and the compose renderer can use it without the Genesis checks
(``rigfleet.genesis``) that read them. docs/genesis.md tells the generations apart.

Example::

    from rigfleet.genesis_layout import LAYOUTS, entrypoint_script

    v7 = LAYOUTS["v7"]
    v7.mount_source("/opt/rigfleet/genesis-trees/7b9f...")   # '.../vllm/_genesis'
    v7.apply_command                                          # 'python3 -m vllm._genesis...'
    entrypoint_script(v7, ("xxhash==3.5.0",))                # the container's bash script
"""

from __future__ import annotations

from dataclasses import dataclass

from rigfleet.genesis_inspect import GENERATIONS, TreeFiles

# The official vllm/vllm-openai image keeps vLLM in dist-packages (Python 3.12).
SITE_PACKAGES_IN_CONTAINER = "/usr/local/lib/python3.12/dist-packages"
# Where a v12 tree is mounted whole (see V12).
TREE_IN_CONTAINER = "/opt/genesis"


@dataclass(frozen=True)
class GenesisLayout:
    """One Genesis generation: where it keeps things (``files``) and how a container gets it.

    + files: the tree's files (``genesis_inspect.TreeFiles``: package, check file, allowlist,
      registry, version file)
    + mount: the directory of the tree that is mounted, relative to its root (``""``: the whole
      tree)
    + target: where that directory appears inside the container
    + apply_command: what applies the patches inside the container
    + prepare: shell lines the entrypoint runs before applying (after the mount check)
    """

    files: TreeFiles
    mount: str
    target: str
    apply_command: str
    prepare: tuple[str, ...] = ()

    @property
    def generation(self) -> str:
        """``v7`` or ``v12`` (the key stack files use for their switch sets)."""
        return self.files.generation

    @property
    def package(self) -> str:
        """The importable package directory, relative to the tree's root."""
        return self.files.package

    @property
    def check_file(self) -> str:
        """A file that must exist (an empty mount would make applying a silent no-op)."""
        return self.files.check_file

    @property
    def allowlist_file(self) -> str:
        return self.files.allowlist_file

    @property
    def registry_file(self) -> str:
        return self.files.registry_file

    def mount_source(self, tree: str) -> str:
        """The host directory mounted for a tree exported at ``tree``."""
        root = tree.rstrip("/")
        return f"{root}/{self.mount}" if self.mount else root

    @property
    def mount_target(self) -> str:
        """Where the mounted directory appears inside the container."""
        return self.target

    @property
    def check_path_in_container(self) -> str:
        """``check_file`` as the container sees it."""
        inside = self.check_file.removeprefix(f"{self.mount}/") if self.mount else self.check_file
        return f"{self.target}/{inside}"


V7 = GenesisLayout(
    files=GENERATIONS["v7"],
    mount="vllm/_genesis",
    target=f"{SITE_PACKAGES_IN_CONTAINER}/vllm/_genesis",
    apply_command="python3 -m vllm._genesis.patches.apply_all",
)

# v12 is mounted whole and linked into site-packages, rather than mounting only sndr/ there:
# some v12 patches read data that lives outside sndr/ at apply time, found by walking up from
# the module's resolved path (PN79 v2 and PN118 v2 read their post-patch file contents from
# tests/unit/integrations/.../fixtures/ of the tree; with sndr/ alone they skip as "fixture
# missing"). The patched vLLM files import sndr at serve time, so it must stay importable from
# site-packages for `vllm serve` and its workers: a symlink does both (Path.resolve() follows
# it back to the tree). An image that already carries a sndr package is refused, not mixed.
_SNDR_IN_SITE = f"{SITE_PACKAGES_IN_CONTAINER}/sndr"
V12 = GenesisLayout(
    files=GENERATIONS["v12"],
    mount="",
    target=TREE_IN_CONTAINER,
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
    - the layout's ``prepare`` lines (v12: link the mounted tree's ``sndr`` into site-packages);
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
    lines += [*layout.prepare, layout.apply_command, 'exec vllm serve "$@"']
    return "\n".join(lines) + "\n"
