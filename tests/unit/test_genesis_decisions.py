"""The correctness-patch rule: every live Genesis patch in a correctness category that concerns a
stack on its pinned vLLM must be decided in the stack file (rigfleet/genesis.py), and
the stack file's ``genesis.decisions`` / ``genesis.model`` are validated like every key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from rigfleet.catalog import (
    BUILTIN_DIR,
    CatalogError,
    PatchDecision,
    StackSpec,
    builtin_catalog,
    parse_stack,
)
from rigfleet.genesis import (
    PatchEntry,
    decision_problems,
    entries_from_literal,
    in_range,
    meets,
)

STACK = "tq3-mtp-genesis"
P346 = PatchEntry("PN346", "Mamba/GDN cache hit boundary fix", "correctness", "experimental",
                  True, {"vllm_version_range": (">=0.21.0", "<0.24.0")}, ("PN346",))


def spec_with(decisions: dict[str, tuple[str, str]] | None = None,
              on: tuple[str, ...] = (), off: tuple[str, ...] = ()) -> StackSpec:
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    switches = {"v12": (on, off)}
    g = replace(spec.genesis, switches=MappingProxyType(switches),
                decisions=MappingProxyType({k: PatchDecision(*v)
                                            for k, v in (decisions or {}).items()}))
    return replace(spec, genesis=g)


def problems(spec: StackSpec, entries: list[PatchEntry], version: str = "0.21.0") -> list[str]:
    return decision_problems(spec, entries, version, label="v12.1.0 (66e37841a18f)",
                             generation="v12")


def test_an_undecided_correctness_patch_is_refused_naming_it_its_title_range_and_genesis() -> None:
    [line] = problems(spec_with(), [P346])
    assert line.startswith(f"{BUILTIN_DIR / STACK}.yaml: genesis.decisions.PN346: missing; ")
    for part in ("Genesis v12.1.0 (66e37841a18f) patch PN346",
                 "'Mamba/GDN cache hit boundary fix'", "correctness",
                 "vllm_version_range >=0.21.0,<0.24.0", "vLLM 0.21.0",
                 "allowed: {decision: on|off|default, reason: one line}"):
        assert part in line, part


@pytest.mark.parametrize(("decision", "on"), [("on", ("PN346",)), ("off", ()), ("default", ())])
def test_a_decided_patch_passes(decision: str, on: tuple[str, ...]) -> None:
    assert problems(spec_with({"PN346": (decision, "why")}, on=on), [P346]) == []


@pytest.mark.parametrize("entry", [
    replace(P346, lifecycle="retired"),                            # retired: Genesis skips it
    replace(P346, category="spec_decode"),                          # not a correctness category
    replace(P346, applies_to={"vllm_version_range": ("<0.21.0",)}),  # range excludes 0.21.0
    replace(P346, applies_to={"vllm_version_range": "<0.20.2rc1.dev9"}),
    replace(P346, applies_to={"model_arch": ["Gemma4ForConditionalGeneration"]}),
    replace(P346, applies_to={"tool_call_parser": "gemma4"}),
    replace(P346, applies_to={"is_turboquant": [False]}),
    replace(P346, applies_to={"spec_method": ["dflash"]}),
], ids=["retired", "category", "range", "range-string", "model-arch", "tool-parser",
        "turboquant", "drafter"])
def test_what_does_not_concern_the_stack_is_not_asked(entry: PatchEntry) -> None:
    assert problems(spec_with(), [entry]) == []


@pytest.mark.parametrize("applies", [
    {"vllm_version_range": ("<0.21.1rc0+g626fa9bba5",)},  # not PEP 440 (a real v12.1.0 range)
    {"vllm_version_range": "not a range"},
    {},                                                  # no range at all
    {"model_arch": ["*"]},                               # "defer to the runtime guard"
    {"sm_min": (8, 0)},                                  # a key the stack cannot judge
    {"model_arch": ["Qwen3_5ForConditionalGeneration"], "is_hybrid": True,
     "quant_format": ["autoround_int4"], "kv_cache_dtype": ["turboquant_3bit_nc"],
     "tool_call_parser": ["qwen3_coder"], "spec_method": ["mtp"]},
], ids=["local-version", "garbage", "none", "star", "unknown-key", "all-met"])
def test_a_range_that_does_not_parse_or_conditions_met_count_as_applying(
        applies: dict[str, Any]) -> None:  # fmt: skip
    entry = replace(P346, applies_to=applies)
    assert len(problems(spec_with(), [entry])) == 1


def test_ranges_are_read_with_pep_440_including_prereleases() -> None:
    assert in_range((">=0.20.0", "<0.24.0"), "0.21.0")
    assert not in_range((">=0.20.0", "<0.24.0"), "0.24.0")
    assert in_range((">=0.20.0", "<0.24.0"), "0.20.2rc1.dev9+g01d4d1ad3")
    assert not in_range("<0.20.2rc1.dev9", "0.20.2rc1.dev9+g01d4d1ad3")
    assert in_range((">=0.20.0",), None) and in_range(None, "0.21.0")
    assert in_range(("<0.21.1rc0+g626fa9bba5",), "9.9.9")


def test_unknown_model_facts_count_as_met() -> None:
    assert meets({"model_class": ["gemma4"]}, {}) and not meets(
        {"model_class": ["gemma4"]}, {"model_class": "qwen3_5"})


@pytest.mark.parametrize(("decision", "on", "off", "says"), [
    ("on", (), (), "'on', but none of its switches (GENESIS_ENABLE_PN346) is in "
                   "genesis.switches.v12.on"),
    ("off", ("PN346",), (), "'off', but genesis.switches.v12.on sets PN346"),
    ("default", (), ("PN346",), "'default', but genesis.switches.v12.off sets PN346 to 0"),
])
def test_a_decision_the_switches_contradict_is_refused(decision: str, on: tuple[str, ...],
                                                       off: tuple[str, ...], says: str) -> None:
    [line] = problems(spec_with({"PN346": (decision, "why")}, on=on, off=off), [P346])
    assert f"genesis.decisions.PN346: {says}" in line and "; allowed: " in line


def test_a_legacy_patch_has_no_switch_and_may_only_be_left_to_genesis() -> None:
    [entry] = entries_from_literal({"P34": {"title": "Mamba zero-collapse deadlock guard",
                                            "env_flag": "GENESIS_LEGACY_P34",
                                            "category": "stability", "lifecycle": "legacy",
                                            "default_on": True}}, "v12")
    assert entry.switches == ()
    assert problems(spec_with({"P34": ("default", "legacy hook")}), [entry]) == []
    [line] = problems(spec_with({"P34": ("off", "no")}), [entry])
    assert "has no switch" in line and line.endswith("allowed: default")


def test_a_bump_that_moves_vllm_asks_for_what_came_into_scope() -> None:
    newer = replace(P346, pid="PN401", switches=("PN401",),
                    applies_to={"vllm_version_range": (">=0.23.0", "<0.24.0")})
    spec = spec_with({"PN346": ("off", "unmeasured")})
    assert problems(spec, [P346, newer], "0.21.0") == []
    [line] = problems(spec, [P346, newer], "0.23.1")
    assert "genesis.decisions.PN401: missing" in line and "vLLM 0.23.1" in line


def _stack(tmp: Path, edit: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((BUILTIN_DIR / f"{STACK}.yaml").read_text())
    data["genesis"].update(edit)
    return data


@pytest.mark.parametrize(("edit", "says"), [
    ({"decisions": {"PN346": {"decision": "maybe", "reason": "x"}}},
     "genesis.decisions.PN346.decision: 'maybe' is not allowed; allowed: on, off, default"),
    ({"decisions": {"PN346": {"decision": "off"}}},
     "genesis.decisions.PN346.reason: missing; allowed: one line"),
    ({"decisions": {"PN346": {"decison": "off", "reason": "x"}}},
     "genesis.decisions.PN346.decison: 'decison' is an unknown key (did you mean 'decision'?)"),
    ({"decisions": ["PN346"]}, "genesis.decisions: ['PN346'] is not a mapping"),
    ({"model": {"is_hybrid": "yes"}}, "genesis.model.is_hybrid: 'yes' is not valid; allowed: "
                                      "true or false"),
    ({"model": {"model_arc": ["X"]}}, "genesis.model.model_arc: 'model_arc' is an unknown key "
                                      "(did you mean 'model_arch'?)"),
])
def test_bad_decisions_and_model_facts_are_refused_naming_the_key(
        tmp_path: Path, edit: dict[str, Any], says: str) -> None:  # fmt: skip
    with pytest.raises(CatalogError) as e:
        parse_stack(_stack(tmp_path, edit), f"{STACK}.yaml")
    assert f"{STACK}.yaml: {says}" in str(e.value)


def test_yaml_booleans_on_and_off_are_read_as_decisions(tmp_path: Path) -> None:
    data = _stack(tmp_path, {"decisions": {"PN346": {"decision": True, "reason": "a"},
                                           "PN11": {"decision": False, "reason": "b"}}})
    g = parse_stack(data, f"{STACK}.yaml").genesis
    assert g is not None
    assert (g.decisions["PN346"].decision, g.decisions["PN11"].decision) == ("on", "off")


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "HF_TOKEN", "my_secret", "DB_PASSWORD_FILE"])
def test_a_secret_looking_env_name_is_refused_pointing_to_the_secret_files(name: str) -> None:
    data: dict[str, Any] = yaml.safe_load((BUILTIN_DIR / "int8.yaml").read_text())
    data["env"][name] = "x"
    with pytest.raises(CatalogError) as e:
        parse_stack(data, "int8.yaml")
    msg = str(e.value)
    assert f"int8.yaml: env.{name}: '{name}' looks like a secret's name; allowed:" in msg
    assert "/etc/rigfleet/secrets" in msg and "api_key_file" in msg and "hf_token_file" in msg
