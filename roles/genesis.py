"""The pinned Genesis checkout, its tree exported, each Genesis stack's gate (docs/genesis.md)."""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from rigfleet import genesis_inspect
from rigfleet.commands import docker as docker_commands
from rigfleet.facts import GenesisHead, GenesisTrees, TextFile, read_fact, read_paths
from rigfleet.genesis import StackUse, TreeReport, layout_problem, pairing_problems
from rigfleet.hostside.layout import HOST
from rigfleet.pins import GenesisPin, StackPins
from rigfleet.retention import stale
from roles.ops import check, executing, fail, read_on_host, root_put, run_on_host
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
    """Commands that bring ``dest`` to ``commit`` (a fresh repository unless ``cloned``)."""
    d, r, c = shlex.quote(dest), shlex.quote(repo), shlex.quote(commit)
    has = f"git -C {d} cat-file -e {c}^{{commit}} 2>/dev/null"
    missing = shlex.quote(f"rigfleet: Genesis commit {commit} is on no branch or tag of {repo}, "
                          "and the server does not hand it out by its sha; pin a commit that a "
                          "branch or tag reaches")
    return [
        # init + fetch, not clone: a clone checks out the remote's HEAD, which may name no branch.
        f"git -C {d} remote set-url origin {r}" if cloned else
        f"rm -rf {d} && git init --quiet {d} && git -C {d} remote add origin {r}",
        # Fetch only when the commit is not there yet (a re-pin to an older commit is local).
        f"{has} || git -C {d} fetch --quiet --tags origin {FETCH_REFS}",
        f"{has} || git -C {d} fetch --quiet origin {c} || {{ echo {missing} >&2; exit 1; }}",
        f"git -C {d} -c advice.detachedHead=false checkout --quiet --force --detach {c}",
    ]


@operation()
def genesis_checkout(repo: str, commit: str):
    state = read_fact(GenesisHead, path=CHECKOUT)
    if state.head == commit and state.layout is not None and state.origin == repo:
        host.noop(f"{CHECKOUT} at {commit[:12]}")
        return
    yield from checkout_commands(repo, commit, CHECKOUT, cloned=state.head is not None)


# Kept: the pinned commit's tree, every tree a compose file on the host mounts, and the
# TREES_KEPT newest (trees are small; a re-pin to a recent commit is instant).
TREES_KEPT = 3


def export_command(checkout: str, commit: str, check_file: str, trees_dir: str = TREES_DIR) -> str:
    """Export ``commit`` to ``<trees_dir>/<commit>``, renamed there once it has ``check_file``."""
    d, c = shlex.quote(trees_dir), shlex.quote(commit)
    tree = shlex.quote(f"{trees_dir}/{commit}")
    git = f"git -C {shlex.quote(checkout)} -c tar.umask=0022"
    return (f"mkdir -p {d} && rm -rf {d}/.tmp-* && tmp=$(mktemp -d {d}/.tmp-XXXXXX) && "
            f'{git} archive --format=tar {c} | tar -x -C "$tmp" && '
            f'test -f "$tmp"/{shlex.quote(check_file)} && chmod 0755 "$tmp" && rm -rf {tree} && '
            f'mv -T "$tmp" {tree}')


@operation()
def genesis_export(commit: str, layout: str, compose_files: tuple[str, ...]):
    """Export ``commit``'s tree; prune those no ``compose_files`` mounts."""
    state = read_fact(GenesisTrees, trees_dir=TREES_DIR, compose_files=compose_files)
    have = state.trees.get(commit)
    exported = have is not None and have[1] is not None
    if not exported:
        yield export_command(CHECKOUT, commit, genesis_inspect.GENERATIONS[layout].check_file)
    mtimes = {c: mtime for c, (mtime, _) in state.trees.items()}
    if old := stale(mtimes, commit, state.referenced, TREES_KEPT):
        yield "rm -rf " + " ".join(shlex.quote(f"{TREES_DIR}/{c}") for c in old)
    if exported and not old:
        host.noop(f"{TREES_DIR}/{commit[:12]} exported")


def verify_tree(pin: GenesisPin, compose_files: tuple[str, ...]) -> str | None:
    """At execution time: the pinned commit's tree is there, with the pinned layout."""
    state = read_fact(GenesisTrees, trees_dir=TREES_DIR, compose_files=compose_files)
    have = state.trees.get(pin.commit)
    tree = HOST.genesis_tree(pin.commit)
    if have is None:
        return f"Genesis tree {tree} is missing"
    return layout_problem(f"Genesis tree {tree}", have[1], pin)


def verify_checkout(pin: GenesisPin) -> str | None:
    """At execution time: HEAD is the pin and the files mark the pinned layout."""
    state = read_fact(GenesisHead, path=CHECKOUT)
    if state.head != pin.commit:
        return f"Genesis checkout {CHECKOUT} is at {state.head}, pin is {pin.commit}"
    return layout_problem(f"Genesis checkout {CHECKOUT} at {pin.commit[:12]}", state.layout, pin)


@operation()
def genesis_gate(stack: str, staged: StackPins, pin: GenesisPin, use: StackUse):
    """Refuse a stack whose image's vLLM or switches do not suit its Genesis tree (executing)."""
    image_ref, vllm_version = staged.image, staged.vllm_version
    cache = str(HOST.version_cache(staged.digest))
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
            yield from fail(f"{host.name}: cannot read vLLM's version from {image_ref}: "
                            f"{' '.join(err[-3:]) or 'no output'}")
            return
        version = out[-1].strip()
    if version != vllm_version:
        yield from fail(f"{host.name}: stack {stack}: image {image_ref} reports vLLM {version}, "
                        f"but the pins say {vllm_version}; refusing to start it (fix the pins)")
        return
    tree = str(HOST.genesis_tree(pin.commit))
    ok, out, err = read_on_host(f"python3 {INSPECT_SCRIPT} {shlex.quote(tree)}")
    try:
        report = TreeReport.from_json(json.loads(out[-1]))
    except (ValueError, IndexError, TypeError):
        why = " ".join((err or out)[-3:]) or "no output"
        yield from fail(f"{host.name}: stack {stack}: cannot inspect Genesis tree {tree}: {why}")
        return
    if problems := pairing_problems(report, pin, stack=stack, vllm_version=version, use=use,
                                    image_ref=image_ref, where=tree):
        yield from fail("\n".join(f"{host.name}: {p}" for p in problems))
        return
    if cached is None:
        yield (f"install -d -m 0755 {VERSION_CACHE_DIR} && "
               f"printf '%s\\n' {shlex.quote(version)} > {shlex.quote(cache)}")
    else:
        host.noop(f"vLLM {version} and the stack's switches suit Genesis {pin.label}")


@deploy("Genesis")
def genesis(ctx: HostContext) -> None:
    pin = ctx.want.genesis
    if pin is None:  # no staged stack uses Genesis
        return
    read_paths([INSPECT_SCRIPT, OLD_ALLOWLIST_SCRIPT])
    mounts = compose_files(ctx)
    root_put(name="Genesis inspect helper", src=str(genesis_inspect.__file__), dest=INSPECT_SCRIPT,
             mode="0755")
    files.file(name="Remove the old Genesis allowlist helper", path=OLD_ALLOWLIST_SCRIPT,
               present=False)  # fmt: skip
    genesis_checkout(name=f"Genesis checkout at {pin.commit[:12]}", repo=pin.repo,
                     commit=pin.commit)
    check(name=f"Verify Genesis HEAD and its {pin.layout} layout",
          verify=lambda: verify_checkout(pin), what="Genesis verification")
    genesis_export(name=f"Genesis tree {pin.commit[:12]} (mounted by the stack)",
                   commit=pin.commit, layout=pin.layout, compose_files=mounts)
    check(name="Verify the Genesis tree", verify=lambda: verify_tree(pin, mounts),
          what="Genesis tree verification")
    # Every staged Genesis stack, whichever this host serves: the same operations on every
    # host (a per-host `if` here made pyinfra's operation DAG cyclic).
    gates = [(name, s.pins, s.pins.genesis, StackUse.of(s.spec, s.pins.genesis.layout,
                                                        ctx.want.settings.env_for(name)))
             for name, s in sorted(ctx.want.stacks.items())
             if s.spec.genesis is not None and s.pins.genesis is not None]  # fmt: skip
    for name, staged, g, use in host.loop(gates):
        genesis_gate(name=f"Genesis compatibility of vLLM {staged.vllm_version}", stack=name,
                     staged=staged, pin=g, use=use)
