"""Genesis: a full clone of the pinned patch repository, detached at the pinned commit.

Full clone, not ``--depth 1``: a pinned commit is not reachable through a shallow branch
fetch (Genesis v7.x has no release tags). The checkout is verified (``HEAD`` == pin and
``vllm/_genesis/patches/apply_all.py`` present): an empty or stale tree mounted into the
container makes ``apply_all`` a silent no-op and the boot fails later with a cryptic error.

Example::

    genesis(ctx)
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy, operation

from rigfleet.compose import GENESIS_HOST_DIR
from rigfleet.facts import APPLY_ALL, GenesisHead
from roles.ops import check
from roles.preflight import HostContext


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
def genesis_checkout(repo: str, commit: str, dest: str = GENESIS_HOST_DIR):
    """Clone ``repo`` into ``dest`` and check out ``commit`` (detached); no change when there.

    + repo: the Genesis git URL (pins)
    + commit: full 40-hex commit (pins)
    + dest: the checkout (``/opt/rigfleet/genesis``)
    """
    state = host.get_fact(GenesisHead, path=dest)
    if state.head == commit and state.has_apply_all and state.origin == repo:
        host.noop(f"{dest} at {commit[:12]}")
        return
    yield from checkout_commands(repo, commit, dest, cloned=state.head is not None)


def verify_checkout(commit: str, dest: str) -> str | None:
    """At execution time: HEAD is the pin and apply_all.py exists."""
    state = host.get_fact(GenesisHead, path=dest)
    if state.head != commit:
        return f"Genesis checkout {dest} is at {state.head}, pin is {commit}"
    if not state.has_apply_all:
        return f"Genesis checkout {dest} lacks {APPLY_ALL} (wrong repository or layout?)"
    return None


@deploy("Genesis")
def genesis(ctx: HostContext) -> None:
    """Check out the pinned Genesis commit (when any pinned stack uses Genesis) and verify."""
    pin = ctx.genesis
    if pin is None:  # no pinned stack uses Genesis
        return
    genesis_checkout(
        name=f"Genesis checkout at {pin.commit[:12]}",
        repo=pin.repo,
        commit=pin.commit,
        dest=GENESIS_HOST_DIR,
    )
    check(
        name="Verify Genesis HEAD and apply_all.py",
        verify=lambda: verify_checkout(pin.commit, GENESIS_HOST_DIR),
        what="Genesis verification",
    )
