"""Genesis: the checkout is at the pinned commit, from the pinned repository, unmodified, and
the pinned commit is exported where the stacks mount it.

The deploy keeps the checkout on every host whose pins use Genesis for some stack (so a switch
finds it ready); a host whose pins use no Genesis skips these checks.

    pytest tests/hosts/test_genesis_checkout.py --inventory inventory/home.py
"""

from __future__ import annotations

import shlex

import pytest

from rigfleet.genesis_inspect import GENERATIONS
from rigfleet.hostside.layout import HOST

CHECKOUT = str(HOST.genesis_checkout)
GIT = f"git -c safe.directory='*' -C {shlex.quote(CHECKOUT)}"


@pytest.fixture(scope="module")
def pin(rig):
    """The Genesis checkout the deploy keeps (``DesiredHost.genesis``)."""
    if rig.want.genesis is None:
        pytest.skip(f"{rig.name}: no pinned stack uses Genesis")
    return rig.want.genesis


def test_genesis_at_pinned_commit(host, rig, pin, require):
    head = host.run(f"{GIT} rev-parse --verify -q HEAD")
    require(
        head.rc == 0,
        f"{rig.name}: {CHECKOUT} is not a git checkout (pin {pin.commit}): {head.stderr.strip()}",
    )
    have = head.stdout.strip()
    subject = host.run(f"{GIT} log -1 --format=%s HEAD").stdout.strip()
    require(
        have == pin.commit,
        f"{rig.name}: Genesis checkout {CHECKOUT} is at {have} ({subject!r}), pin is {pin.commit}",
    )


def test_genesis_origin_and_layout(host, rig, pin, fail_if):
    problems = []
    origin = host.run(f"{GIT} remote get-url origin").stdout.strip()
    if origin != pin.repo:
        problems.append(f"origin is {origin or 'unset'}, pin repo is {pin.repo}")
    # The pinned generation's check file: the trees the stacks mount are exported from here.
    check_file = GENERATIONS[pin.layout].check_file
    if not host.file(f"{CHECKOUT}/{check_file}").is_file:
        problems.append(f"{check_file} is missing: the container would boot without the patches")
    fail_if(f"Genesis checkout {CHECKOUT}", problems)


def test_genesis_tree_exported(host, rig, pin, require):
    # What the stacks mount: the pinned commit exported (git archive) next to the checkout.
    tree = HOST.genesis_tree(pin.commit)
    check_file = GENERATIONS[pin.layout].check_file
    require(
        host.file(f"{tree}/{check_file}").is_file,
        f"{rig.name}: Genesis tree {tree} (what the stacks mount) is missing or lacks "
        f"{check_file}, expected the export of pin {pin.commit}",
    )


def test_genesis_tree_unmodified(host, rig, pin, require):
    # The checkout is what the trees are exported from and what people read: an edited patch
    # file there is a Genesis other than the pinned commit.
    status = host.run(f"{GIT} status --porcelain --untracked-files=no")
    changed = status.stdout.strip().splitlines()
    require(
        status.rc == 0 and not changed,
        f"{rig.name}: Genesis checkout {CHECKOUT} has local changes against "
        f"{pin.commit[:12]}: {changed[:10] or status.stderr.strip()}",
    )
