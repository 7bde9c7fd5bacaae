"""Genesis: a full clone of the pinned patch repository, detached at the pinned commit, and
an immutable export of that commit's tree, which is what the stack mounts.

Full clone, not ``--depth 1``: a pinned commit is not reachable through a shallow branch
fetch (Genesis v7.x has no release tags). The checkout is verified (``HEAD`` == pin and
``vllm/_genesis/patches/apply_all.py`` present): an empty or stale tree mounted into the
container makes ``apply_all`` a silent no-op and the boot fails later with a cryptic error.

The checkout moves with the pin, so the container never mounts it: the commit is exported
(``git archive``) to ``Layout.genesis_tree(<commit>)``, which never changes once
there, and the compose file mounts that. A swap that
rolls back restarts the previous compose snapshot, which still names the previous tree.

Example::

    genesis(ctx)
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Set

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from rigfleet.commands import docker as docker_commands
from rigfleet.facts import APPLY_ALL, GenesisHead, GenesisTrees, TextFile, read_fact
from rigfleet.hostside.layout import HOST
from rigfleet.resources import project_file
from roles.ops import check, executing, fail, run_on_host
from roles.preflight import HostContext

CHECKOUT = str(HOST.genesis_checkout)
ALLOWLIST_SCRIPT = str(HOST.script("rigfleet-genesis-allowlist.py"))
VERSION_CACHE_DIR = str(HOST.version_cache_dir)
TREES_DIR = str(HOST.genesis_trees_dir)


def checkout_commands(repo: str, commit: str, dest: str, cloned: bool) -> list[str]:
    """Commands that bring ``dest`` to ``commit`` (clone first when ``cloned`` is False)."""
    d, r, c = shlex.quote(dest), shlex.quote(repo), shlex.quote(commit)
    commands = []
    if not cloned:
        commands.append(f"rm -rf {d} && git clone --quiet --no-checkout {r} {d}")
    else:
        commands.append(f"git -C {d} remote set-url origin {r}")
    commands += [
        # Fetch only when the commit is not there yet (a re-pin to an older commit is local).
        f"git -C {d} cat-file -e {c}^{{commit}} 2>/dev/null || git -C {d} fetch --quiet origin",
        f"git -C {d} -c advice.detachedHead=false checkout --quiet --force --detach {c}",
    ]
    return commands


@operation()
def genesis_checkout(repo: str, commit: str, dest: str = CHECKOUT):
    """Clone ``repo`` into ``dest`` and check out ``commit`` (detached); no change when there.

    + repo: the Genesis git URL (pins)
    + commit: full 40-hex commit (pins)
    + dest: the checkout (``Layout.genesis_checkout``)
    """
    state = read_fact(GenesisHead, path=dest)
    if state.head == commit and state.has_apply_all and state.origin == repo:
        host.noop(f"{dest} at {commit[:12]}")
        return
    yield from checkout_commands(repo, commit, dest, cloned=state.head is not None)


# Pruning rule: keep the pinned commit's tree, every tree a compose file on the host mounts
# (both stacks' files: what may run now; the active snapshot: what a rollback restarts), and
# the TREES_KEPT newest trees by mtime (the pinned one counts as the newest); remove the rest.
# Trees are small, and the newest few also make a re-pin to a recent commit instant. A tree
# that a swap releases (the old active snapshot) is removed by a later converge, once it is
# outside the newest few; while any compose file names it, it is never removed.
TREES_KEPT = 3


def stale_trees(
    trees: Mapping[str, int], pinned: str, referenced: Set[str], keep: int = TREES_KEPT
) -> list[str]:
    """The trees to remove: ``trees`` maps commit -> mtime; see the rule above."""
    others = sorted((c for c in trees if c != pinned), key=lambda c: (trees[c], c), reverse=True)
    kept = {pinned, *others[: max(keep - 1, 0)], *referenced}
    return sorted(c for c in trees if c not in kept)


def export_command(checkout: str, commit: str, trees_dir: str = TREES_DIR) -> str:
    """Export ``commit`` from ``checkout`` to ``<trees_dir>/<commit>``, atomically (a rename).

    A leftover temporary directory (an interrupted export) is removed first; the tree must
    hold apply_all.py before it is renamed into place.
    """
    d, c = shlex.quote(trees_dir), shlex.quote(commit)
    tree = shlex.quote(f"{trees_dir}/{commit}")
    git = f"git -C {shlex.quote(checkout)} -c tar.umask=0022"
    return (
        f"mkdir -p {d} && rm -rf {d}/.tmp-* && tmp=$(mktemp -d {d}/.tmp-XXXXXX) && "
        f'{git} archive --format=tar {c} | tar -x -C "$tmp" && '
        f'test -f "$tmp/{APPLY_ALL}" && chmod 0755 "$tmp" && rm -rf {tree} && '
        f'mv -T "$tmp" {tree}'
    )


@operation()
def genesis_export(
    commit: str,
    compose_files: tuple[str, ...],
    checkout: str = CHECKOUT,
    trees_dir: str = TREES_DIR,
    keep: int = TREES_KEPT,
):
    """Export ``commit`` to ``<trees_dir>/<commit>/`` (no change when there) and prune.

    + commit: full 40-hex commit (pins); the checkout must have it
    + checkout: the git checkout (``Layout.genesis_checkout``)
    + compose_files: every compose file on the host that may mount a tree (the staged
      stacks' and the active snapshot)
    + trees_dir: the exports (``Layout.genesis_trees_dir``)
    + keep: how many of the newest trees are kept (see ``stale_trees``)
    """
    state = read_fact(GenesisTrees, trees_dir=trees_dir, compose_files=compose_files)
    have = state.trees.get(commit)
    exported = have is not None and have[1]
    if not exported:
        yield export_command(checkout, commit, trees_dir)
    mtimes = {c: mtime for c, (mtime, _) in state.trees.items()}
    stale = stale_trees(mtimes, commit, state.referenced, keep)
    if stale:
        yield "rm -rf " + " ".join(shlex.quote(f"{trees_dir}/{c}") for c in stale)
    if exported and not stale:
        host.noop(f"{trees_dir}/{commit[:12]} exported")


def verify_tree(commit: str) -> str | None:
    """At execution time: the pinned commit's tree is there, with apply_all.py."""
    state = read_fact(GenesisTrees, trees_dir=TREES_DIR)
    have = state.trees.get(commit)
    if have is None or not have[1]:
        return f"Genesis tree {HOST.genesis_tree(commit)} is missing or lacks {APPLY_ALL}"
    return None


def verify_checkout(commit: str, dest: str) -> str | None:
    """At execution time: HEAD is the pin and apply_all.py exists."""
    state = read_fact(GenesisHead, path=dest)
    if state.head != commit:
        return f"Genesis checkout {dest} is at {state.head}, pin is {commit}"
    if not state.has_apply_all:
        return f"Genesis checkout {dest} lacks {APPLY_ALL} (wrong repository or layout?)"
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
    cache = str(HOST.version_cache(digest))
    cached = read_fact(TextFile, path=cache)
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
    checkout = str(HOST.genesis_checkout)
    ok, out, err = run_on_host(f"python3 {ALLOWLIST_SCRIPT} {shlex.quote(checkout)}")
    try:
        allowed = json.loads(out[-1])["known_good"] if ok and out else None
    except (ValueError, KeyError):
        allowed = None
    if allowed is None:
        yield from fail(
            f"{host.name}: cannot read KNOWN_GOOD_VLLM_PINS from {checkout}: "
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


@deploy("Genesis")
def genesis(ctx: HostContext) -> None:
    """Check out the pinned Genesis commit (when any pinned stack uses Genesis), export its
    tree for the stack to mount, and verify both."""
    pin = ctx.genesis
    if pin is None:  # no staged stack uses Genesis
        return
    files.put(
        name="Genesis allowlist helper",
        src=str(project_file("files/rigfleet-genesis-allowlist.py")),
        dest=ALLOWLIST_SCRIPT,
        user="root",
        group="root",
        mode="0755",
    )
    genesis_checkout(
        name=f"Genesis checkout at {pin.commit[:12]}",
        repo=pin.repo,
        commit=pin.commit,
        dest=CHECKOUT,
    )
    check(
        name="Verify Genesis HEAD and apply_all.py",
        verify=lambda: verify_checkout(pin.commit, CHECKOUT),
        what="Genesis verification",
    )
    genesis_export(
        name=f"Genesis tree {pin.commit[:12]} (mounted by the stack)",
        commit=pin.commit,
        compose_files=(*(f for _, f in ctx.want.projects), str(HOST.active_compose)),
    )
    check(
        name="Verify the Genesis tree",
        verify=lambda: verify_tree(pin.commit),
        what="Genesis tree verification",
    )
    # Every staged Genesis stack is checked, whichever stack this host serves: the same
    # operations on every host (a per-host `if` here made pyinfra's operation DAG cyclic).
    genesis_stacks = [(n, s.pins) for n, s in sorted(ctx.want.stacks.items())
                      if s.spec.needs_genesis and s.pins.genesis is not None]
    for name, staged in host.loop(genesis_stacks):
        assert staged.genesis is not None
        genesis_gate(
            name=f"Genesis compatibility of vLLM {staged.vllm_version}",
            stack=name,
            image_ref=staged.local_image,
            digest=staged.digest,
            vllm_version=staged.vllm_version,
            commit=staged.genesis.commit,
        )

