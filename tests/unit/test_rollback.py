"""``rigfleet rollback``: the earlier pin set rebuilt from the pins history that real bumps
write (``rigfleet.bump.rollout.pins_after``), the plan it rolls out, and what it refuses."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
from bump_helpers import GENESIS_NEW, GOOD, NEWER, REGRESSED, bumped, hosts, stack, write_pins

from rigfleet import rollback
from rigfleet.bump.plan import build_plan
from rigfleet.bump.rollout import HostOutcome, RolloutResult, Status, pins_after
from rigfleet.pins import Pins, load_pins, save_pins
from rigfleet.rollback import RollbackRefused, changes, default_target, pins_at


def bump(pins: Pins, sha: str, *, genesis: str | None = None,
         partial: bool = False) -> Pins:
    """Record a bump to ``sha`` as ``rigfleet bump`` does (3 int8 hosts; ``partial``: only
    host1 promoted, host2 failed)."""
    new = bumped(pins, sha, names=("int8", "tq3-mtp-genesis"), genesis=genesis)
    plan = build_plan(hosts("int8", "int8", "int8"), {}, pins, new, 1, 1)
    outcomes = {"host1": HostOutcome("host1", Status.PROMOTED, 0, True),
                "host2": HostOutcome("host2", Status.FAILED if partial else Status.PROMOTED,
                                     1, not partial),
                "host3": HostOutcome("host3", Status.NOT_ATTEMPTED if partial
                                     else Status.PROMOTED, 2, not partial)}
    saved, entry = pins_after(plan, RolloutResult(outcomes), "2026-12-03T10:00:00Z", "ops@ctl")
    assert saved is not None
    return save_pins(saved, entry)


def test_the_pins_before_a_bump_come_back_exactly(tmp_path):
    before = write_pins(tmp_path)
    before = save_pins(replace(before, stacks={
        **before.stacks, "int8": replace(before.stacks["int8"], image_id="sha256:" + "e" * 64)}),
        {"action": "lock", "changes": ["image ids"]})
    after = bump(before, NEWER, genesis=GENESIS_NEW)
    assert after.stacks["int8"].digest == stack("int8", NEWER).digest
    assert default_target(after) == before.serial
    assert pins_at(after, before.serial) == before.stacks  # image id and Genesis too


def test_two_bumps_back_and_the_default_is_the_last_one(tmp_path):
    first = write_pins(tmp_path)
    second = bump(first, NEWER)
    third = bump(second, REGRESSED)
    assert default_target(third) == second.serial
    assert pins_at(third, second.serial) == second.stacks
    assert pins_at(third, first.serial) == first.stacks


def test_a_rollback_entry_is_rolled_back_like_a_bump(tmp_path):
    first = write_pins(tmp_path)
    second = bump(first, NEWER)
    back = pins_at(second, first.serial)
    plan = build_plan(hosts("int8", "int8"), {}, second, changes(second, back, ["host1"]), 1, 1)
    outcomes = {h: HostOutcome(h, Status.PROMOTED, 0, True) for h in ("host1", "host2")}
    new, entry = pins_after(plan, RolloutResult(outcomes), "t", "ops")
    assert new is not None and entry is not None
    entry.update(action="rollback", to_serial=first.serial)
    third = save_pins(new, entry)
    assert third.stacks == first.stacks
    assert default_target(third) == second.serial  # "undo the rollback"
    assert pins_at(third, second.serial) == second.stacks


def test_a_partial_bump_rolls_back_the_hosts_it_moved(tmp_path):
    first = write_pins(tmp_path)
    second = bump(first, NEWER, partial=True)
    assert second.stacks == first.stacks and "host1" in second.hosts
    target = pins_at(second, first.serial)
    new = changes(second, target, ["host1", "host2", "host3"])
    assert set(new) == {"int8", "tq3-mtp-genesis"}  # host1 runs other pins than the fleet's
    plan = build_plan(hosts("int8", "int8", "int8"), {}, second, new, 1, 1)
    assert plan.batches == (("host1",),) and plan.up_to_date == ("host2", "host3")
    assert changes(first, pins_at(second, first.serial), ["host2"]) == {}


def test_refusals_name_the_serials_allowed(tmp_path):
    first = write_pins(tmp_path)
    with pytest.raises(RollbackRefused, match="no bump or rollback recorded"):
        default_target(first)
    locked = save_pins(first, {"action": "lock", "changes": ["int8 digest"]})
    second = bump(locked, NEWER)
    with pytest.raises(RollbackRefused, match=rf"serial {locked.serial} \(lock\) records no "
                       rf"earlier pins.*allowed: --to {locked.serial} or later"):
        pins_at(second, first.serial)
    with pytest.raises(RollbackRefused, match=rf"--to: {second.serial}; allowed: a serial "
                       rf"from {first.serial} to {second.serial - 1}"):
        pins_at(second, second.serial)
    with pytest.raises(RollbackRefused, match="--to: 0"):
        pins_at(second, 0)


def test_a_serial_saved_without_a_history_entry_cannot_be_rebuilt(tmp_path):
    first = save_pins(write_pins(tmp_path), {"action": "bump", "old": {}})
    second = save_pins(first)  # no entry
    third = bump(second, NEWER)
    with pytest.raises(RollbackRefused, match=rf"no entry for serial {second.serial}, .*"
                       rf"allowed: --to {second.serial} or later"):
        pins_at(third, first.serial - 1)
    assert pins_at(third, second.serial) == first.stacks


def test_old_history_entries_without_image_ids_or_layouts_still_rebuild(tmp_path):
    first = write_pins(tmp_path)
    second = bump(first, NEWER, genesis=GENESIS_NEW)
    for e in second.history:  # as written before the summaries carried them
        for s in e.get("old", {}).values():
            s.pop("image_id", None)
            s.pop("genesis_layout", None)
    got = pins_at(second, first.serial)
    assert got["tq3-mtp-genesis"].genesis == first.stacks["tq3-mtp-genesis"].genesis
    assert got["int8"] == first.stacks["int8"]


def test_no_terminal_refuses_naming_yes(monkeypatch, capsys):
    class NoTty:
        @staticmethod
        def isatty() -> bool:
            return False

    monkeypatch.setattr("sys.stdin", NoTty())
    assert rollback.confirm("Roll back", "[red]refused:[/red] not a terminal: pass --yes") is False
    assert "pass --yes" in " ".join(capsys.readouterr().err.split())


def test_the_parser_takes_the_common_flags():
    parser = argparse.ArgumentParser()
    rollback.add_parser(parser.add_subparsers())
    args = parser.parse_args(["rollback", "--limit", "host1", "--limit", "canary", "--to", "3",
                              "--dry", "--inventory", "inv.py", "--json", "--timeout", "5"])
    assert (args.limit, args.to, args.dry, args.inventory, args.json, args.timeout) == \
        (["host1", "canary"], 3, True, "inv.py", True, 5.0)


def test_plan_json_and_text(tmp_path, capsys):
    first = write_pins(tmp_path)
    second = bump(first, NEWER)
    plan = build_plan(hosts("int8", "int8"), {"host2": "not in --limit"}, second,
                      changes(second, pins_at(second, first.serial), ["host1", "host2"]), 1, 1)
    data = rollback.plan_json(plan, first.serial)
    assert data["batches"] == [["host1"]] and data["skipped"] == {"host2": "not in --limit"}
    assert data["stacks"]["int8"]["to"].startswith(f"nightly-{GOOD}")
    rollback.print_plan(plan, first.serial)
    err = capsys.readouterr().err
    assert "host2: not in --limit" in err and "canary" in err
    assert load_pins(second.path).serial == second.serial  # --dry wrote nothing
