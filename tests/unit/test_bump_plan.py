"""``rigfleet bump`` plan: who is the canary, the batches, skipped and up-to-date hosts; the
pins file's ``hosts:`` section the plan and the deploy rely on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from bump_helpers import (
    GENESIS_NEW,
    GOOD,
    NEWER,
    bumped,
    hosts,
    pins_data,
    stack,
    write_pins,
)

from rigfleet.bump.decide import BumpOptions
from rigfleet.bump.output import print_steps
from rigfleet.bump.plan import build_plan
from rigfleet.pins import PinsError, dump_pins, load_pins, parse_pins, save_pins
from rigfleet.validate import URL_ALLOWED


def test_canary_alone_then_batches_in_inventory_order(tmp_path: Path) -> None:
    pins = write_pins(tmp_path)
    fleet = hosts("int8", "int8", "tq3-mtp-genesis", "int8", "int8", canary="host2")
    plan = build_plan(fleet, {}, pins, bumped(pins, NEWER), batch_size=2, max_failures=1)
    assert plan.canary == "host2"
    assert plan.batches == (("host2",), ("host1", "host3"), ("host4", "host5"))
    plan1 = build_plan(fleet, {}, pins, bumped(pins, NEWER), batch_size=1)
    assert plan1.batches == (("host2",), ("host1",), ("host3",), ("host4",), ("host5",))


def test_without_canary_group_the_first_host_goes_first(tmp_path: Path) -> None:
    pins = write_pins(tmp_path)
    plan = build_plan(hosts("int8", "int8", "int8", canary=None), {}, pins, bumped(pins, NEWER),
                      batch_size=3)  # fmt: skip
    assert plan.batches == (("host1",), ("host2", "host3"))
    assert plan.notes == ()


def test_canary_must_serve_a_bumped_stack(tmp_path: Path) -> None:
    # Only the Genesis stack is bumped; the inventory canary serves int8, which proves nothing.
    pins = write_pins(tmp_path)
    new = bumped(pins, NEWER, ("tq3-mtp-genesis",), genesis=GENESIS_NEW)
    plan = build_plan(hosts("int8", "tq3-mtp-genesis", "int8"), {}, pins, new)
    assert plan.canary == "host2"
    assert plan.batches[0] == ("host2",)
    assert {h for b in plan.batches for h in b} == {"host1", "host2", "host3"}  # re-rendered
    assert any("inventory canary host1 serves int8" in n for n in plan.notes)


def test_unreachable_hosts_are_skipped_and_a_dead_canary_is_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pins = write_pins(tmp_path)
    reach = {"host1": "ssh 127.0.0.1:2221: connection refused", "host3": None}
    plan = build_plan(hosts("int8", "int8", "int8"), reach, pins, bumped(pins, NEWER))
    assert plan.skipped == {"host1": "ssh 127.0.0.1:2221: connection refused"}
    assert plan.batches == (("host2",), ("host3",))
    assert any("inventory canary host1 is unreachable" in n for n in plan.notes)
    print_steps(plan, "rollout")
    text = capsys.readouterr().err
    assert "host1: unreachable (ssh 127.0.0.1:2221" in text
    assert "canary" in text and "host2 (int8)" in text


def test_hosts_already_on_the_candidate_are_up_to_date(tmp_path: Path) -> None:
    data = pins_data()
    new_int8 = stack("int8", NEWER)
    data["hosts"] = {"host2": {"stacks": {"int8": {
        "image": new_int8.image, "digest": new_int8.digest,
        "vllm_version": new_int8.vllm_version}}}}  # fmt: skip
    pins = write_pins(tmp_path, data)
    plan = build_plan(hosts("int8", "int8", "int8"), {}, pins, bumped(pins, NEWER, ("int8",)))
    assert plan.up_to_date == ("host2",)
    assert plan.batches == (("host1",), ("host3",))
    nothing = build_plan(hosts("int8"), {}, pins, {"int8": pins.stacks["int8"]})
    assert nothing.empty and nothing.up_to_date == ("host1",)


def test_candidate_pins_move_the_rollout_hosts_and_take_the_next_serial(tmp_path: Path) -> None:
    data = pins_data()
    old_int8 = stack("int8", GOOD)
    data["hosts"] = {
        "host1": {"stacks": {"int8": {"image": old_int8.image, "digest": "sha256:" + "c" * 64,
                                      "vllm_version": old_int8.vllm_version}}},
        "gone": {"stacks": {"int8": {"image": old_int8.image, "digest": "sha256:" + "d" * 64,
                                     "vllm_version": old_int8.vllm_version}}},
    }  # fmt: skip
    pins = write_pins(tmp_path, data)
    plan = build_plan(hosts("int8", "int8"), {"host2": "down"}, pins, bumped(pins, NEWER))
    cand = plan.candidate_pins(str(tmp_path / ".cand.yaml"))
    assert cand.serial == pins.serial + 1
    assert cand.stacks["int8"].digest == stack("int8", NEWER).digest
    assert "host1" not in cand.hosts  # it moves: its old override goes
    assert "gone" in cand.hosts  # not ours to touch
    # The candidate file is valid for the deploy.
    parse_pins(yaml.safe_load(dump_pins(cand)), str(tmp_path / ".cand.yaml"))


def test_genesis_alone_over_pins_without_a_genesis_stack_says_so(tmp_path: Path) -> None:
    """``--genesis C`` when no stack pins Genesis said "no pinned stack uses None"."""
    from rigfleet.bump.decide import BumpError, bumped_stacks

    data = pins_data()
    del data["stacks"]["tq3-mtp-genesis"]
    pins = write_pins(tmp_path, data)
    opts = BumpOptions(inventory="inv.py", deploy="deploy.py", genesis=GENESIS_NEW)
    with pytest.raises(BumpError) as e:
        bumped_stacks(opts, pins, None)
    assert "None" not in str(e.value) and "no pinned stack uses Genesis" in str(e.value)


def test_registry_and_mirror_urls_are_checked_before_anything_runs() -> None:
    """``--push-mirror registry.lan:5000`` (no scheme; the --help example was so) was taken,
    and failed as "unknown url type" only after the rollout, when the image was copied."""
    for flag, key in (("--push-mirror", "push_mirror"), ("--registry", "registry")):
        with pytest.raises(ValueError, match=rf"rigfleet bump: {flag}: 'registry.lan:5000' is not "
                                             r"valid; allowed: an http:// or https:// URL"):
            BumpOptions(inventory="inv.py", deploy="deploy.py", latest=True,
                        **{key: "registry.lan:5000"})
    # Checked as inventory data bump_registry / bump_mirror are (Problems.url): a password was
    # taken and then logged ("registry http://u:pw@...: listing the tags"), a port out of range
    # was taken too; both flags are reported at once.
    with pytest.raises(ValueError) as e:
        BumpOptions(inventory="inv.py", deploy="deploy.py", latest=True,
                    registry="http://u:pw@registry.lan:5000", push_mirror="http://mirror:99999")
    assert str(e.value).splitlines() == [
        "rigfleet bump: --registry: 'http://***@registry.lan:5000' carries credentials "
        "(user:password@); allowed: a URL without credentials (an index or mirror on the LAN "
        "that needs none)",
        "rigfleet bump: --push-mirror: 'http://mirror:99999' is not valid; allowed: " + URL_ALLOWED]
    BumpOptions(inventory="inv.py", deploy="deploy.py", latest=True,
                push_mirror="http://registry.lan:5000", registry="https://registry-1.docker.io")


@pytest.mark.parametrize("flags", [["--latest", "--batch-size", "0"],
                                   ["--latest", "--max-failures", "0"], [],
                                   ["--latest", "--registry", "registry.lan:5000"],
                                   ["--latest", "--push-mirror", "registry.lan:5000"]],
                         ids=["batch-size", "max-failures", "no-candidate", "registry", "mirror"])
def test_bad_flags_exit_2_like_argparse(tmp_path: Path, capsys, flags: list[str]) -> None:
    """A bad flag exited 3, which docs/bump.md keeps for an inventory, pins file or registry
    that cannot be read; a usage error exits 2 (docs/operations.md), as argparse's own do."""
    from rigfleet.cli import main

    try:
        code = main(["bump", "--inventory", str(tmp_path / "inv.py"), *flags])
    except SystemExit as e:
        code = int(e.code or 0)
    assert code == 2
    assert ("allowed:" if flags else "give --image") in capsys.readouterr().err


# --- pins: the hosts section ------------------------------------------------------------------


def test_hosts_section_round_trips_and_for_host_merges(tmp_path: Path) -> None:
    pins = write_pins(tmp_path)
    newer = stack("int8", NEWER)
    with_host = replace(pins, hosts={"host2": {"int8": newer}})
    saved = save_pins(with_host, {"action": "bump"})
    again = load_pins(saved.path)
    assert again.hosts == {"host2": {"int8": newer}}
    assert again.for_host("host2").stacks["int8"] == newer
    assert again.for_host("host2").stacks["tq3-mtp-genesis"] == pins.stacks["tq3-mtp-genesis"]
    assert again.for_host("host1") is again
    # Files without overrides are written exactly as before (no empty `hosts:` key).
    assert "hosts" not in yaml.safe_load(dump_pins(pins))


def test_hosts_section_is_validated_like_stacks(tmp_path: Path) -> None:
    data = pins_data()
    data["hosts"] = {
        "host2": {"stacks": {"int8": {"image": "vllm/vllm-openai:nightly", "digest": "sha256:x",
                                      "vllm_version": "0.20.2rc1.dev9+g01d4d1ad3"}}},
        "host3": {"stacks": {"fp8": {}}},
        "host4": {"stacks": {"tq3-mtp-genesis": {
            "image": stack("int8", NEWER).image, "digest": stack("int8", NEWER).digest,
            "vllm_version": stack("int8", NEWER).vllm_version}}},
        "host5": {"stack": {}},
    }  # fmt: skip
    with pytest.raises(PinsError) as err:
        parse_pins(data, "pins.yaml")
    text = str(err.value)
    assert "hosts.host2.stacks.int8.image: 'vllm/vllm-openai:nightly'" in text
    assert "moving tag" in text
    assert "hosts.host2.stacks.int8.digest" in text
    assert "hosts.host3.stacks.fp8" in text and "not a stack in the catalog" in text
    assert "hosts.host4.stacks.tq3-mtp-genesis.genesis: missing" in text
    assert "hosts.host5.stack" in text and "unknown key" in text


# --- the batch cap: at least one host per stack keeps serving --------------------------------


def test_a_batch_that_swaps_every_host_of_a_stack_is_refused(tmp_path: Path) -> None:
    pins = write_pins(tmp_path)
    fleet = hosts("int8", "tq3-mtp-genesis", "tq3-mtp-genesis", "int8")
    with pytest.raises(ValueError) as e:
        build_plan(fleet, {}, pins, bumped(pins, NEWER), batch_size=2)
    assert str(e.value) == (
        "--batch-size 2: batch 1 (host2, host3) would swap every host serving tq3-mtp-genesis "
        "(host2, host3) at once: none would be left to serve it; at least one host per stack "
        "keeps serving while the others swap. Allowed: --batch-size 1 or less")
    # The largest size that keeps one host of each stack serving is named: 3 hosts of int8
    # behind the canary go two at a time, never all three.
    fleet = hosts("tq3-mtp-genesis", "int8", "int8", "int8", "tq3-mtp-genesis")
    with pytest.raises(ValueError, match=r"--batch-size 3: batch 1 \(host2, host3, host4\) "
                       r".*int8 \(host2, host3, host4\).*Allowed: --batch-size 2 or less"):
        build_plan(fleet, {}, pins, bumped(pins, NEWER), batch_size=3)
    plan = build_plan(fleet, {}, pins, bumped(pins, NEWER), batch_size=2)
    assert plan.batches == (("host1",), ("host2", "host3"), ("host4", "host5"))


def test_the_cap_counts_reachable_hosts_that_swap(tmp_path: Path) -> None:
    pins = write_pins(tmp_path)
    # host4 (tq3) is unreachable: host2 and host3 are all that serve tq3 now.
    fleet = hosts("int8", "tq3-mtp-genesis", "tq3-mtp-genesis", "tq3-mtp-genesis")
    with pytest.raises(ValueError, match=r"every host serving tq3-mtp-genesis \(host2, host3\)"):
        build_plan(fleet, {"host4": "connection refused"}, pins, bumped(pins, NEWER),
                   batch_size=2)
    # Only int8 is bumped: the tq3 hosts re-render compose files but keep serving.
    plan = build_plan(fleet[:3], {}, pins, bumped(pins, NEWER, ("int8",)), batch_size=2)
    assert plan.batches == (("host1",), ("host2", "host3"))


def test_a_stack_served_by_one_host_goes_on_with_its_503_window(tmp_path: Path) -> None:
    pins = write_pins(tmp_path)
    plan = build_plan(hosts("int8", "tq3-mtp-genesis"), {}, pins, bumped(pins, NEWER),
                      batch_size=5)
    assert plan.batches == (("host1",), ("host2",))
    assert build_plan(hosts("int8"), {}, pins, bumped(pins, NEWER)).batches == (("host1",),)
