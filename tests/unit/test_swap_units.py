"""The swap role's units on a ``@fake`` host (tests/unit/fake_rig.py): the supervisor is
installed with the host's time limits, enabled with the stack unit, started, and restarted
only when the host tool or its unit changed (restarting it never touches the stack).

Uses the fake deploy of tests/unit/test_roles_fake.py (its fixtures are imported here).
"""

from __future__ import annotations

import shlex

import pytest
import test_roles_fake
from fake_rig import FakeRig
from test_roles_fake import _fast, deploy  # noqa: F401 (_fast: an autouse fixture)

from rigfleet.hostside.__main__ import build_parser
from rigfleet.hostside.layout import BUNDLE_PATH

UNIT = "/etc/systemd/system/rigfleet-supervise.service"
RESTART = "systemctl restart rigfleet-supervise.service"


@pytest.fixture
def data(tmp_path):
    """The fake fleet's host data (test_roles_fake's ``data`` fixture)."""
    return test_roles_fake.data.__wrapped__(tmp_path)


def test_the_supervisor_is_installed_enabled_started_and_restarted_only_on_change(data):
    rig = FakeRig("debian13")
    first = deploy(rig, {**data, "ready_timeout_s": 600})
    assert not first.failed, rig.commands[-5:]
    unit = rig.files[UNIT].decode()
    [exec_start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[:2] == ["/usr/bin/python3", BUNDLE_PATH]
    args = build_parser().parse_args(argv[2:])
    assert (args.command, args.front_port, args.ready_timeout_s, args.backoff_s,
            args.limit, args.window_s) == ("supervise", 8000, 600.0, (10.0, 30.0, 90.0), 3,
                                           1800.0)
    assert "rigfleet-supervise.service" in rig.enabled
    assert "rigfleet-supervise.service" in rig.active
    assert len(first.ran(RESTART)) == 1
    # The swap ran before the supervisor was (re)started: it would only have waited.
    assert first.commands.index(first.ran(RESTART)[0]) > first.commands.index(
        first.ran("systemd-run --unit rigfleet-swap-")[0])

    second = deploy(rig, {**data, "ready_timeout_s": 600})
    assert not second.failed and second.ran(RESTART) == []

    rig.files[BUNDLE_PATH] = b"an older host tool"
    third = deploy(rig, {**data, "ready_timeout_s": 600})
    assert not third.failed and len(third.ran(RESTART)) == 1
    assert third.ran("compose") == [] or all(" up " not in c for c in third.ran("compose"))


def test_the_supervisors_backoff_limit_and_window_come_from_host_data(data):
    rig = FakeRig("debian13")
    run = deploy(rig, {**data, "supervise_backoff_s": [1, 2], "supervise_limit": 2,
                       "supervise_window_s": 300})
    assert not run.failed, rig.commands[-5:]
    [exec_start] = [line for line in rig.files[UNIT].decode().splitlines()
                    if line.startswith("ExecStart=")]
    args = build_parser().parse_args(shlex.split(exec_start.removeprefix("ExecStart="))[2:])
    assert (args.backoff_s, args.limit, args.window_s) == ((1.0, 2.0), 2, 300.0)
