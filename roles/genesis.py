"""Genesis: a clone of the pinned patch repository, detached at the pinned commit, an immutable
export of that commit's tree (what the stack mounts), and the compatibility gate.

The pinned commit may be reachable only from a non-default branch (Genesis v7.72.2 lives only
on ``dev``; ``main`` was rewritten with no common history) or only from a tag (v12.1.0), and
the repository may have no ``main`` at all: the checkout never relies on the default branch. It
fetches every branch and tag (``+refs/heads/*`` and ``--tags``), then the commit by its sha
when still missing (GitHub hands out commits that only ``refs/pull/*`` reach), and checks it
out detached. The checkout is verified: ``HEAD`` == pin, and its files mark the pinned layout
(``v7``: ``vllm/_genesis/patches/apply_all.py``; ``v12``: ``sndr/apply/__main__.py``); an
empty or stale tree mounted into the container makes applying a silent no-op and the boot
fails later with a cryptic error.

The checkout moves with the pin, so the container never mounts it: the commit is exported
(``git archive``) to ``Layout.genesis_tree(<commit>)``, which never changes once
there, and the compose file mounts that. A swap that
rolls back restarts the previous compose snapshot, which still names the previous tree.

The gate (``genesis_gate``) runs the host helper ``rigfleet-genesis-inspect.py``
(``rigfleet/genesis_inspect.py``) on that tree and refuses, before anything starts, a stack
whose tree has another layout than the pin says, whose image's vLLM is on none of the tree's
allowlists, or that sets to 1 a switch the pinned Genesis does not know or has retired
(``rigfleet.genesis.pairing_problems``).

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

from rigfleet import genesis_inspect
from rigfleet.commands import docker as docker_commands
from rigfleet.facts import GenesisHead, GenesisTrees, TextFile, read_fact, read_paths
from rigfleet.genesis import StackUse, TreeReport, pairing_problems
from rigfleet.genesis_layout import LAYOUTS
from rigfleet.hostside.layout import HOST
from rigfleet.pins import GenesisPin
from rigfleet.retention import stale
from roles.ops import check, executing, fail, read_on_host, run_on_host
from roles.preflight import HostContext
from roles.weights import compose_files

CHECKOUT = str(HOST.genesis_checkout)
INSPECT_SCRIPT = str(HOST.script("rigfleet-genesis-inspect.py"))
# What rigfleet installed before the inspect helper replaced it (removed by the deploy).
OLD_ALLOWLIST_SCRIPT = str(HOST.script("rigfleet-genesis-allowlist.py"))
VERSION_CACHE_DIR = str(HOST.version_cache_dir)
TREES_DIR = str(HOST.genesis_trees_dir)
# Every branch and every tag: a pinned commit may be on any of them (never only the default).
FETCH_REFS = "'+refs/heads/*:refs/remotes/origin/*'"


def checkout_commands(repo: str, commit: str, dest: str, cloned: bool) -> list[str]:
    """Commands that bring ``dest`` to ``commit`` (a fresh repository first when ``cloned`` is
    False); see the module docstring for why every branch and tag is fetched."""
    d, r, c = shlex.quote(dest), shlex.quote(repo), shlex.quote(commit)
    commands = []
    if not cloned:
        # init + fetch, not clone: a clone checks out the remote's HEAD, which may name no
        # branch at all (a repository without main), and fetches no tag added later.
        commands.append(
            f"rm -rf {d} && git init --quiet {d} && git -C {d} remote add origin {r}"
        )
    else:
        commands.append(f"git -C {d} remote set-url origin {r}")
    has = f"git -C {d} cat-file -e {c}^{{commit}} 2>/dev/null"
    missing = shlex.quote(
        f"rigfleet: Genesis commit {commit} is on no branch or tag of {repo}, and the server "
        "does not hand it out by its sha; pin a commit that a branch or tag reaches"
    )
    commands += [
        # Fetch only when the commit is not there yet (a re-pin to an older commit is local).
        f"{has} || git -C {d} fetch --quiet --tags origin {FETCH_REFS}",
        f"{has} || git -C {d} fetch --quiet origin {c} || {{ echo {missing} >&2; exit 1; }}",
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
    if state.head == commit and state.layout is not None and state.origin == repo:
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
    """The trees to remove: ``trees`` maps commit -> mtime; see the rule above (the one rule
    for trees and model revisions: ``rigfleet.retention.stale``)."""
    return stale(trees, pinned, referenced, keep)


def export_command(
    checkout: str, commit: str, check_file: str, trees_dir: str = TREES_DIR
) -> str:
    """Export ``commit`` from ``checkout`` to ``<trees_dir>/<commit>``, atomically (a rename).

    A leftover temporary directory (an interrupted export) is removed first; the tree must
    hold ``check_file`` (the pinned layout's apply entry point) before it is renamed into place.
    """
    d, c = shlex.quote(trees_dir), shlex.quote(commit)
    tree = shlex.quote(f"{trees_dir}/{commit}")
    git = f"git -C {shlex.quote(checkout)} -c tar.umask=0022"
    return (
        f"mkdir -p {d} && rm -rf {d}/.tmp-* && tmp=$(mktemp -d {d}/.tmp-XXXXXX) && "
        f'{git} archive --format=tar {c} | tar -x -C "$tmp" && '
        f'test -f "$tmp"/{shlex.quote(check_file)} && chmod 0755 "$tmp" && rm -rf {tree} && '
        f'mv -T "$tmp" {tree}'
    )


@operation()
def genesis_export(
    commit: str,
    layout: str,
    compose_files: tuple[str, ...],
    checkout: str = CHECKOUT,
    trees_dir: str = TREES_DIR,
    keep: int = TREES_KEPT,
):
    """Export ``commit`` to ``<trees_dir>/<commit>/`` (no change when there) and prune.

    + commit: full 40-hex commit (pins); the checkout must have it
    + layout: the pinned layout (``v7``/``v12``): its check file must be in the export
    + checkout: the git checkout (``Layout.genesis_checkout``)
    + compose_files: every compose file on the host that may mount a tree (the staged
      stacks' and the active snapshot)
    + trees_dir: the exports (``Layout.genesis_trees_dir``)
    + keep: how many of the newest trees are kept (see ``stale_trees``)
    """
    state = read_fact(GenesisTrees, trees_dir=trees_dir, compose_files=compose_files)
    have = state.trees.get(commit)
    exported = have is not None and have[1] is not None
    if not exported:
        yield export_command(checkout, commit, LAYOUTS[layout].check_file, trees_dir)
    mtimes = {c: mtime for c, (mtime, _) in state.trees.items()}
    stale = stale_trees(mtimes, commit, state.referenced, keep)
    if stale:
        yield "rm -rf " + " ".join(shlex.quote(f"{trees_dir}/{c}") for c in stale)
    if exported and not stale:
        host.noop(f"{trees_dir}/{commit[:12]} exported")


def _layout_mismatch(what: str, found: str | None, pin: GenesisPin) -> str | None:
    if found == pin.layout:
        return None
    want = LAYOUTS[pin.layout].check_file
    if found is None:
        return (f"{what} lacks {want} (the {pin.layout} layout the pins say), "
                "and marks no other layout rigfleet knows (wrong repository?)")
    return (f"{what} has the {found} layout "
            f"({genesis_inspect.GENERATIONS[found].check_file}), but the pins say layout "
            f"{pin.layout} for Genesis {pin.label}; fix the pins' genesis.layout (`rigfleet "
            "pins lock` records it from the tree)")


def verify_tree(pin: GenesisPin, compose_files: tuple[str, ...]) -> str | None:
    """At execution time: the pinned commit's tree is there, with the pinned layout (read as
    ``genesis_export`` reads it, ``compose_files`` included: one read answers both)."""
    state = read_fact(GenesisTrees, trees_dir=TREES_DIR, compose_files=compose_files)
    have = state.trees.get(pin.commit)
    tree = HOST.genesis_tree(pin.commit)
    if have is None:
        return f"Genesis tree {tree} is missing"
    return _layout_mismatch(f"Genesis tree {tree}", have[1], pin)


def verify_checkout(pin: GenesisPin, dest: str) -> str | None:
    """At execution time: HEAD is the pin and the files mark the pinned layout."""
    state = read_fact(GenesisHead, path=dest)
    if state.head != pin.commit:
        return f"Genesis checkout {dest} is at {state.head}, pin is {pin.commit}"
    return _layout_mismatch(f"Genesis checkout {dest} at {pin.commit[:12]}", state.layout, pin)


def read_tree_report(tree: str) -> tuple[TreeReport | None, str]:
    """Run the inspect helper on ``tree`` (at execution time): (report, '') or (None, why)."""
    ok, out, err = read_on_host(f"python3 {INSPECT_SCRIPT} {shlex.quote(tree)}")
    try:
        return TreeReport.from_json(json.loads(out[-1])), ""
    except (ValueError, IndexError, TypeError):
        return None, " ".join((err or out)[-3:]) or "no output"


@operation()
def genesis_gate(
    stack: str, image_ref: str, digest: str, vllm_version: str, pin: GenesisPin, use: StackUse
):
    """Refuse a Genesis stack whose pairing with its image is unsound (see the module
    docstring and ``rigfleet.genesis.pairing_problems``).

    The image's version is read from the image itself (``docker run ... python3 -c 'import
    vllm'``) once per digest and cached on the host; the tree the stack mounts is read by the
    host helper (``ast`` only, nothing imported from it). Runs when the deploy executes (the
    tree and the image exist only then); writing the cache is the only change it makes.

    + stack: the stack's name (for messages)
    + image_ref, digest: the pinned image
    + vllm_version: the version the pins say the image reports
    + pin: the stack's Genesis pin (commit, layout, version)
    + use: the stack's Genesis environment (``StackUse``: switches from its stack file and the
      host's extra_env)
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
    if version != vllm_version:
        yield from fail(
            f"{host.name}: stack {stack}: image {image_ref} reports vLLM {version}, but the "
            f"pins say {vllm_version}; refusing to start it (fix the pins)"
        )
        return
    tree = str(HOST.genesis_tree(pin.commit))
    report, why = read_tree_report(tree)
    if report is None:
        yield from fail(f"{host.name}: stack {stack}: cannot inspect Genesis tree {tree}: {why}")
        return
    problems = pairing_problems(report, pin, stack=stack, vllm_version=version, use=use,
                                image_ref=image_ref, where=tree)  # fmt: skip
    if problems:
        yield from fail("\n".join(f"{host.name}: {p}" for p in problems))
        return
    if cached is None:
        yield (
            f"install -d -m 0755 {VERSION_CACHE_DIR} && "
            f"printf '%s\\n' {shlex.quote(version)} > {shlex.quote(cache)}"
        )
    else:
        host.noop(f"vLLM {version} and the stack's switches suit Genesis {pin.label}")


@deploy("Genesis")
def genesis(ctx: HostContext) -> None:
    """Check out the pinned Genesis commit (when any pinned stack uses Genesis), export its
    tree for the stack to mount, and verify both."""
    pin = ctx.want.genesis
    if pin is None:  # no staged stack uses Genesis
        return
    read_paths([INSPECT_SCRIPT, OLD_ALLOWLIST_SCRIPT])
    mounts = compose_files(ctx)
    files.put(
        name="Genesis inspect helper",
        src=str(genesis_inspect.__file__),
        dest=INSPECT_SCRIPT,
        user="root",
        group="root",
        mode="0755",
    )
    files.file(name="Remove the old Genesis allowlist helper", path=OLD_ALLOWLIST_SCRIPT,
               present=False)  # fmt: skip
    genesis_checkout(
        name=f"Genesis checkout at {pin.commit[:12]}",
        repo=pin.repo,
        commit=pin.commit,
        dest=CHECKOUT,
    )
    check(
        name=f"Verify Genesis HEAD and its {pin.layout} layout",
        verify=lambda: verify_checkout(pin, CHECKOUT),
        what="Genesis verification",
    )
    genesis_export(
        name=f"Genesis tree {pin.commit[:12]} (mounted by the stack)",
        commit=pin.commit,
        layout=pin.layout,
        compose_files=mounts,
    )
    check(
        name="Verify the Genesis tree",
        verify=lambda: verify_tree(pin, mounts),
        what="Genesis tree verification",
    )
    # Every staged Genesis stack is checked, whichever stack this host serves: the same
    # operations on every host (a per-host `if` here made pyinfra's operation DAG cyclic).
    # (A stack file without the pinned layout's switch set never gets here: rendering its
    # compose file, when the host's model is built, already refused it.)
    settings = ctx.want.settings
    gates = [(name, s.pins, s.pins.genesis, StackUse.of(s.spec, s.pins.genesis.layout,
                                                        settings.env_for(name)))
             for name, s in sorted(ctx.want.stacks.items())
             if s.spec.needs_genesis and s.pins.genesis is not None]  # fmt: skip
    for name, staged, g, use in host.loop(gates):
        genesis_gate(
            name=f"Genesis compatibility of vLLM {staged.vllm_version}",
            stack=name,
            image_ref=staged.local_image,
            digest=staged.digest,
            vllm_version=staged.vllm_version,
            pin=g,
            use=use,
        )
