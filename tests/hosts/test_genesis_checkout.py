"""Genesis: the checkout is at the pinned commit, from the pinned repository, unmodified.

The deploy keeps the checkout on every host whose pins use Genesis for some stack (so a switch
finds it ready); a host whose pins use no Genesis skips these checks.

    pytest tests/hosts/test_genesis_checkout.py --inventory inventory/home.py
"""

from __future__ import annotations

import pytest

from rigfleet.compose import GENESIS_HOST_DIR

APPLY_ALL = "vllm/_genesis/patches/apply_all.py"
GIT = f"git -c safe.directory='*' -C {GENESIS_HOST_DIR}"


@pytest.fixture(scope="module")
def pin(rig):
    if rig.exp.genesis is None:
        pytest.skip(f"{rig.name}: no pinned stack uses Genesis")
    return rig.exp.genesis


def test_genesis_at_pinned_commit(host, rig, pin, require):
    head = host.run(f"{GIT} rev-parse --verify -q HEAD")
    require(
        head.rc == 0,
        f"{rig.name}: {GENESIS_HOST_DIR} is not a git checkout (pin {pin.commit}): "
        f"{head.stderr.strip()}",
    )
    have = head.stdout.strip()
    subject = host.run(f"{GIT} log -1 --format=%s HEAD").stdout.strip()
    require(
        have == pin.commit,
        f"{rig.name}: Genesis checkout {GENESIS_HOST_DIR} is at {have} ({subject!r}), "
        f"pin is {pin.commit}",
    )


def test_genesis_origin_and_layout(host, rig, pin, fail_if):
    problems = []
    origin = host.run(f"{GIT} remote get-url origin").stdout.strip()
    if origin != pin.repo:
        problems.append(f"origin is {origin or 'unset'}, pin repo is {pin.repo}")
    if not host.file(f"{GENESIS_HOST_DIR}/{APPLY_ALL}").is_file:
        problems.append(f"{APPLY_ALL} is missing: the container would boot without the patches")
    fail_if(f"Genesis checkout {GENESIS_HOST_DIR}", problems)


def test_genesis_tree_unmodified(host, rig, pin, require):
    # The tree is mounted into the serving container: an edited patch file is a different
    # Genesis than the pinned commit.
    status = host.run(f"{GIT} status --porcelain --untracked-files=no")
    changed = status.stdout.strip().splitlines()
    require(
        status.rc == 0 and not changed,
        f"{rig.name}: Genesis checkout {GENESIS_HOST_DIR} has local changes against "
        f"{pin.commit[:12]}: {changed[:10] or status.stderr.strip()}",
    )
