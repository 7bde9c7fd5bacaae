"""The Genesis decisions (``rigfleet.genesis``): the allowlist of both layouts, switches set to 1
that the pinned Genesis does not know or has retired, needed patches, layout and version
against the pin; and how each layout is mounted and applied (entrypoint, compose volume).

Reports come from the real helper run on the small trees of ``genesis_trees.py``.

Run: ``.venv/bin/python -m pytest tests/unit/test_genesis_checks.py -q``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml
from genesis_trees import V7_KNOWN, V12_KNOWN, V12_PENDING, v7_files, v12_files, write_tree

from rigfleet.catalog import StackSpec, builtin_catalog, entrypoint_script
from rigfleet.compose import compose_document
from rigfleet.genesis import (
    StackUse,
    TreeReport,
    allowlist_problem,
    pairing_problems,
    switch_problems,
)
from rigfleet.genesis_inspect import GENERATIONS, DirSource, inspect
from rigfleet.hostdata import HostSettings
from rigfleet.pins import GenesisPin, ModelPin, Pins, StackPins

V7_PIN = GenesisPin("https://example.test/genesis.git", "7b9fd3194ee6efa1644973383cd44ee5604a5d85",
                    "v7", "v7.72.2")  # fmt: skip
V12_PIN = GenesisPin("https://example.test/genesis.git",
                     "66e37841a18f35a113ce10f831808faa4c858ced", "v12", "v12.1.0")  # fmt: skip
STACK = "tq3-mtp-genesis"
V7, V12 = GENERATIONS["v7"], GENERATIONS["v12"]


@pytest.fixture(scope="module")
def r7(tmp_path_factory: pytest.TempPathFactory) -> TreeReport:
    tree = write_tree(tmp_path_factory.mktemp("v7"), v7_files(V7_KNOWN))
    return TreeReport.from_json(inspect(DirSource(tree)))


@pytest.fixture(scope="module")
def r12(tmp_path_factory: pytest.TempPathFactory) -> TreeReport:
    tree = write_tree(tmp_path_factory.mktemp("v12"), v12_files(V12_KNOWN, V12_PENDING))
    return TreeReport.from_json(inspect(DirSource(tree)))


def spec_with(on: list[str], off: tuple[str, ...] | list[str] = (), generation: str = "v12",
              needs: tuple[str, ...] = ()) -> StackSpec:  # fmt: skip
    """The built-in tq3 stack with the given switch set for ``generation``."""
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    switches = {**spec.genesis.switches, generation: (tuple(on), tuple(off))}
    return replace(spec, genesis=replace(spec.genesis, switches=MappingProxyType(switches),
                                         needs=needs))  # fmt: skip


def use(on: list[str], off: tuple[str, ...] | list[str] = (),
        host_env: dict[str, str] | None = None, generation: str = "v12",
        needs: tuple[str, ...] = ()) -> StackUse:  # fmt: skip
    return StackUse.of(spec_with(on, off, generation, needs), generation, host_env)


# --- switches ----------------------------------------------------------------------------------


def test_retired_switch_is_refused_naming_switch_patch_and_genesis(r12: TreeReport) -> None:
    [msg] = switch_problems(r12, use(["P58_ASYNC_PLACEHOLDER_FIX",
                                      "P64_QWEN3CODER_MTP_STREAMING"]), label=V12_PIN.label)
    source = builtin_catalog().get(STACK).source
    assert msg == (
        "stack tq3-mtp-genesis: GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING=1: patch P64 is "
        "retired in Genesis v12.1.0 (66e37841a18f); remove it from the stack file's "
        f"genesis.switches.v12.on ({source})"
    )


def test_an_alias_of_a_retired_patch_is_refused_too(r12: TreeReport) -> None:
    [msg] = switch_problems(r12, use([], host_env={
        "GENESIS_ENABLE_P61C_QWEN3CODER_DEFERRED_COMMIT": "1",
        "GENESIS_ENABLE_P59_QWEN3_TOOL_RECOVERY": "1"}), label=V12_PIN.label)  # fmt: skip
    assert msg == (
        "stack tq3-mtp-genesis: GENESIS_ENABLE_P61C_QWEN3CODER_DEFERRED_COMMIT=1: it is an alias "
        "of patch P64, which is retired in Genesis v12.1.0 (66e37841a18f); remove it from host "
        "data extra_env.tq3-mtp-genesis (or set it to 0)"
    )


def test_unknown_switches_are_refused_with_what_genesis_has(r12: TreeReport) -> None:
    msgs = switch_problems(r12, use(["P4", "PN54", "P67_TQ_MULTI_QUERY_KERNL"]),
                           label=V12_PIN.label)  # fmt: skip
    assert len(msgs) == 3
    assert msgs[0].startswith(
        "stack tq3-mtp-genesis: GENESIS_ENABLE_P4=1: Genesis v12.1.0 (66e37841a18f) has no such "
        "switch (its patch P4 (legacy) has env_flag GENESIS_LEGACY_P4); remove it from the "
        "stack file's genesis.switches.v12.on")
    assert ("GENESIS_ENABLE_PN54=1: Genesis v12.1.0 (66e37841a18f) has no such switch (no "
            "env_flag or env_flag_alias in sndr/dispatcher/registry.py is named so, and it has "
            "no patch PN54)") in msgs[1]
    assert ("(its patch P67 (experimental) has env_flag GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL; "
            "did you mean GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL?)") in msgs[2]


def test_explicit_offs_and_live_switches_are_harmless(r12: TreeReport) -> None:
    u = use(["P58_ASYNC_PLACEHOLDER_FIX", "P67_TQ_MULTI_QUERY_KERNEL", "PN26_SPARSE_V"],
            ["P4", "PN54", "P64_QWEN3CODER_MTP_STREAMING"],
            host_env={"GENESIS_ENABLE_P87": "true", "GENESIS_ENABLE_NOPE": "0",
                      "GENESIS_ENABLE_BUNDLE_REASONING_QWEN3": "1",
                      "SNDR_ENABLE_SPEC_DECODE_ACCEPTANCE_METRIC": "on",
                      "GENESIS_ENABLE_SPEC_DECODE_ACCEPTANCE_METRIC": "yes"})  # fmt: skip
    assert switch_problems(r12, u, label=V12_PIN.label) == []


def test_host_extra_env_can_turn_a_stack_switch_off_or_on(r12: TreeReport) -> None:
    off = use(["P64_QWEN3CODER_MTP_STREAMING"],
              host_env={"GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING": "0"})
    assert switch_problems(r12, off, label=V12_PIN.label) == []
    on = use([], host_env={"GENESIS_ENABLE_PN13_CUDA_GRAPH_LAMBDA_ARITY": "1"})
    [msg] = switch_problems(r12, on, label=V12_PIN.label)
    assert "patch PN13 is retired" in msg and "host data extra_env.tq3-mtp-genesis" in msg


def test_allow_retired_lets_genesis_engage_retired_patches(r12: TreeReport) -> None:
    u = use(["P64_QWEN3CODER_MTP_STREAMING"], host_env={"GENESIS_ALLOW_RETIRED": "1"})
    assert switch_problems(r12, u, label=V12_PIN.label) == []


def test_v7_reads_no_lifecycle_but_refuses_unknown_and_sndr_names(r7: TreeReport) -> None:
    u = use(["PN13_CUDA_GRAPH_LAMBDA_ARITY", "P4"], generation="v7",
            host_env={"SNDR_ENABLE_P87": "1"})  # fmt: skip
    msgs = switch_problems(r7, u, label=V7_PIN.label)
    assert len(msgs) == 2  # the retired PN13 applies on v7: Genesis v7 never skips it
    assert msgs[0].startswith("stack tq3-mtp-genesis: GENESIS_ENABLE_P4=1: Genesis v7.72.2 "
                              "(7b9fd3194ee6) has no such switch (its patch P4 (legacy) has "
                              "env_flag GENESIS_LEGACY_P4); remove it from the stack file's "
                              "genesis.switches.v7.on")  # fmt: skip
    assert msgs[1] == ("stack tq3-mtp-genesis: SNDR_ENABLE_P87=1: Genesis v7.72.2 (7b9fd3194ee6) "
                       "reads no SNDR_ENABLE_* switches; remove it from host data "
                       "extra_env.tq3-mtp-genesis (or set it to 0)")  # fmt: skip


def test_a_stack_without_the_pinned_generations_switch_set_is_an_error() -> None:
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    only_v7 = replace(spec, genesis=replace(spec.genesis, switches=MappingProxyType(
        {"v7": spec.genesis.switches["v7"]})))  # fmt: skip
    with pytest.raises(ValueError, match=r"genesis.switches has no v12 set, but the pinned "
                                         r"Genesis has the v12 layout; allowed: add "
                                         r"genesis.switches.v12 \(have: v7\)"):
        StackUse.of(only_v7, "v12")


# --- needed patches -------------------------------------------------------------------------------


def test_needed_patch_must_exist_live_and_be_switched_on(r12: TreeReport) -> None:
    ok = use(["P67_TQ_MULTI_QUERY_KERNEL"], needs=("P67", "P4"))  # P4: default_on legacy
    assert pairing_problems(r12, V12_PIN, stack=STACK, vllm_version=None, use=ok) == []
    msgs = pairing_problems(r12, V12_PIN, stack=STACK, vllm_version=None,
                            use=use([], needs=("P67", "PN13", "P999")))  # fmt: skip
    assert msgs[0] == (
        "stack tq3-mtp-genesis: needs Genesis patch P67, but no switch that turns it on is set "
        "to 1 (Genesis v12.1.0 (66e37841a18f) switches it with "
        "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL); add it to the stack file's "
        f"genesis.switches.v12.on ({builtin_catalog().get(STACK).source})")
    assert "needs Genesis patch PN13, which is retired in Genesis v12.1.0" in msgs[1]
    assert "needs Genesis patch P999, which Genesis v12.1.0 (66e37841a18f) does not have" in msgs[2]


# --- allowlist, layout, version ----------------------------------------------------------------


def test_allowlist_v12_accepts_both_lists_and_names_both(r12: TreeReport) -> None:
    assert allowlist_problem(r12, "0.21.0", label=V12_PIN.label) is None  # pending only
    assert allowlist_problem(r12, V12_KNOWN[0], label=V12_PIN.label) is None
    [msg] = pairing_problems(r12, V12_PIN, stack=STACK, vllm_version="0.27.1", use=None,
                             image_ref="vllm/vllm-openai:v0.27.1")  # fmt: skip
    assert msg == (
        "stack tq3-mtp-genesis: vLLM 0.27.1 (image vllm/vllm-openai:v0.27.1) is not on Genesis "
        "v12.1.0 (66e37841a18f)'s KNOWN_GOOD_VLLM_PINS nor on its PROMOTION_PENDING_VLLM_PINS "
        "(sndr/engines/vllm/detection/guards.py: 5 + 2 entries; releases among them: 0.21.0, "
        "0.21.1rc0); refusing it (pin an image Genesis lists, or a Genesis commit that lists "
        "vLLM 0.27.1)")


def test_allowlist_v7_names_its_one_list(r7: TreeReport) -> None:
    msg = allowlist_problem(r7, "0.21.0", label=V7_PIN.label)
    assert msg == ("vLLM 0.21.0 is not on Genesis v7.72.2 (7b9fd3194ee6)'s KNOWN_GOOD_VLLM_PINS "
                   "(vllm/_genesis/guards.py: 0.20.1rc1.dev16+g7a1eb8ac2, "
                   "0.20.2rc1.dev9+g01d4d1ad3)")  # fmt: skip
    assert allowlist_problem(r7, "0.20.2rc1.dev9+g01d4d1ad3", label="x") is None


def test_layout_other_than_the_pin_is_refused_first(r12: TreeReport) -> None:
    wrong = replace(V12_PIN, layout="v7")
    assert pairing_problems(r12, wrong, stack=STACK, vllm_version="0.27.1", use=None,
                            where="/opt/rigfleet/genesis-trees/66e3") == [
        "stack tq3-mtp-genesis: Genesis v12.1.0 (66e37841a18f) at /opt/rigfleet/genesis-trees/"
        "66e3 has the v12 layout (sndr/apply/__main__.py), but the pins say layout v7; fix "
        "stacks.tq3-mtp-genesis.genesis.layout in the pins file (`rigfleet pins lock` records "
        "it from the tree)"]  # fmt: skip


def test_declared_release_must_match_the_pinned_release(r12: TreeReport, r7: TreeReport) -> None:
    [msg] = pairing_problems(r12, replace(V12_PIN, version="v12.0.0"), stack=STACK,
                             vllm_version=None, use=None)  # fmt: skip
    assert "the pins say Genesis v12.0.0, but the tree of 66e37841a18f declares v12.1.0" in msg
    # v7 trees declare a stale 'v7.63.x': not a release, not compared.
    assert pairing_problems(r7, V7_PIN, stack=STACK, vllm_version=None, use=None) == []


def test_unreadable_tree_is_one_problem(tmp_path: Path) -> None:
    report = TreeReport.from_json(inspect(DirSource(write_tree(tmp_path, {"x": ""}))))
    [msg] = pairing_problems(report, V7_PIN, stack=STACK, vllm_version="0.1", use=None,
                             where=str(tmp_path))  # fmt: skip
    assert msg.startswith(f"stack tq3-mtp-genesis: cannot read Genesis v7.72.2 (7b9fd3194ee6) "
                          f"at {tmp_path}: no Genesis layout rigfleet knows")  # fmt: skip


# --- mounting and applying ---------------------------------------------------------------------


def test_v7_mount_and_entrypoint_are_unchanged() -> None:
    tree = "/opt/rigfleet/genesis-trees/abc"
    assert V7.mount_source(tree) == f"{tree}/vllm/_genesis"
    assert V7.mount_target == "/usr/local/lib/python3.12/dist-packages/vllm/_genesis"
    assert V7.check_path_in_container == (
        "/usr/local/lib/python3.12/dist-packages/vllm/_genesis/patches/apply_all.py")
    assert "ln -s" not in entrypoint_script(V7, ())


def test_v12_tree_is_mounted_whole_and_sndr_linked_into_site_packages() -> None:
    tree = "/opt/rigfleet/genesis-trees/abc/"
    assert V12.mount_source(tree) == "/opt/rigfleet/genesis-trees/abc"
    assert V12.mount_target == "/opt/genesis"
    assert V12.check_path_in_container == "/opt/genesis/sndr/apply/__main__.py"
    script = entrypoint_script(V12, ("xxhash",))
    lines = script.splitlines()
    link = "ln -sfn /opt/genesis/sndr /usr/local/lib/python3.12/dist-packages/sndr"
    assert lines[0] == "set -e" and lines[-1] == 'exec vllm serve "$@"'
    # mount check, then the link (refusing an image that has its own sndr), then apply.
    assert script.index("/opt/genesis/sndr/apply/__main__.py") < script.index("already has a "
                                                                               "sndr package")
    assert lines.index(link) == lines.index("python3 -m sndr.apply") - 1


def test_v12_entrypoint_links_and_refuses_a_baked_in_sndr(tmp_path: Path) -> None:
    # The prepare lines run in a real shell, with the container paths moved under tmp_path.
    import subprocess

    site, tree = tmp_path / "site", tmp_path / "tree"
    write_tree(tree, {"sndr/__init__.py": ""})
    site.mkdir()
    text = "set -e\n" + "\n".join(V12.prepare) + "\necho linked\n"
    text = text.replace("/usr/local/lib/python3.12/dist-packages", str(site)).replace(
        "/opt/genesis", str(tree))
    run = subprocess.run(["bash", "-c", text], capture_output=True, text=True)
    assert run.returncode == 0 and (site / "sndr").resolve() == (tree / "sndr").resolve()
    run = subprocess.run(["bash", "-c", text], capture_output=True, text=True)  # idempotent
    assert run.returncode == 0 and (site / "sndr").is_symlink()
    (site / "sndr").unlink()
    (site / "sndr").mkdir()
    run = subprocess.run(["bash", "-c", text], capture_output=True, text=True)
    assert run.returncode == 1 and "this image already has a sndr package" in run.stderr


def test_compose_mounts_the_v12_tree_read_only() -> None:
    spec = spec_with(["P67_TQ_MULTI_QUERY_KERNEL"], ["P4"])
    commit = V12_PIN.commit
    pins = Pins(path="pins.yaml", serial=1, driver_branch="580", driver_version=None,
                toolkit_version="1.17.8-1", hf_hub_version="2.4.0",
                model=ModelPin("Lorbus/Qwen3.6-27B-int4-AutoRound", "a" * 40, "m"),
                stacks={STACK: StackPins(STACK, "vllm/vllm-openai:v0.21.0",
                                         "sha256:" + "b" * 64, "0.21.0", V12_PIN)})  # fmt: skip
    host = HostSettings(name="rig-a", stack=STACK, power_caps_w=(290, 290), model_dir="/srv/m",
                        front_port=8000, api_key_file="/k", hf_token_file=None,
                        docker_registry_mirror=None, apt_repos={}, pip_index_url=None,
                        hf_endpoint=None, extra_env={}, pins_file="pins.yaml", gpu_count=2)
    svc = compose_document(spec, pins, host)["services"]["vllm"]
    assert f"/opt/rigfleet/genesis-trees/{commit}:/opt/genesis:ro" in svc["volumes"]
    assert svc["environment"]["GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"] == "1"
    assert svc["environment"]["GENESIS_ENABLE_P4"] == "0"
    assert "python3 -m sndr.apply" in yaml.safe_dump(svc["entrypoint"])


def test_a_host_turning_a_needed_patch_off_is_left_to_the_verify_gate(r12: TreeReport) -> None:
    # The operator's override (the testbed's "P67 off" fault): no pairing problem; the stack
    # boots and the verify-stress gate judges it.
    u = use(["P67_TQ_MULTI_QUERY_KERNEL"], needs=("P67",),
            host_env={"GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL": "0"})  # fmt: skip
    assert pairing_problems(r12, V12_PIN, stack=STACK, vllm_version=None, use=u) == []
