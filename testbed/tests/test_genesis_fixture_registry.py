"""The Genesis fixture's registries against the real ones, as rigfleet reads both.

``tests/fixtures/genesis/<release>-registry.json`` is an extract of the real registries
(v7.72.2 ``7b9fd319`` and v12.1.0 ``66e37841``, from the workspace's upstream Genesis bundle,
written by ``scripts/genesis-registry-extract.py`` with ``rigfleet/genesis_inspect.py``): for
every patch the fixture models, every patch the built-in stack files switch or need, each
patch's ``env_flag``, lifecycle, ``default_on`` (and v12's
``applies_to.vllm_version_range``), and every switch name of those patches or of the stack files
with the patches it turns on. The fixture's trees, read by the same helper, must say exactly
that, so the Genesis gate decides on the fixture as it does on the real trees::

    .venv/bin/python -m pytest testbed/tests/test_genesis_fixture_registry.py -q
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from genesis_helpers import render
from rigfleet_testbed import genesis_patches as gp

from rigfleet.catalog import StackSpec, builtin_catalog
from rigfleet.genesis import (
    PatchEntry,
    StackUse,
    Switch,
    TreeReport,
    decision_problems,
    in_scope,
    needs_problems,
    pairing_problems,
    read_entries,
    stack_profile,
    switch_problems,
)
from rigfleet.genesis_inspect import GENERATIONS, DirSource, inspect
from rigfleet.pins import GenesisPin

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "genesis"
RELEASES = {"v7": ("v7.72.2", 0), "v12": ("v12.1.0", 2)}  # release, index among its commits
URL = "https://github.com/Sandermage/sndr_core_engine.git"
COMMITS = {"v7": "7b9fd3194ee6efa1644973383cd44ee5604a5d85",
           "v12": "66e37841a18f35a113ce10f831808faa4c858ced"}
VLLM = {"v7": "0.20.2rc1.dev9+g01d4d1ad3", "v12": "0.21.0"}  # what each pairing runs
STACK = "tq3-mtp-genesis"


def facts(generation: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (FIXTURES / f"{RELEASES[generation][0]}-registry.json").read_text())
    return data


def pin(generation: str) -> GenesisPin:
    return GenesisPin(URL, COMMITS[generation], generation, RELEASES[generation][0])


def real_report(generation: str) -> TreeReport:
    """The real tree's report, as far as the extract goes (registry and allowlist)."""
    f = facts(generation)
    allow = json.loads((FIXTURES / f"{RELEASES[generation][0]}-allowlist.json").read_text())
    files = GENERATIONS[generation]
    return TreeReport(
        layout=generation, known_good=tuple(allow["known_good"]),
        pending=tuple(allow["pending"]), registry_file=f["registry_file"],
        switch_prefixes=files.switch_prefixes, retired_skipped=files.retired_skipped,
        switches={k: tuple(Switch(*t) for t in v) for k, v in f["switches"].items() if v},
        patch_flags={k: (e["env_flag"], e["lifecycle"], e["default_on"])
                     for k, e in f["patches"].items()},
        has_registry=True)  # fmt: skip


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TreeReport]:
    """The fixture's trees at v7.72.2 and v12.1.0, read by the hosts' helper."""
    out = {}
    for generation, (_, index) in RELEASES.items():
        tree = render(generation, tmp_path_factory.mktemp(generation), index)
        out[generation] = TreeReport.from_json(inspect(DirSource(tree)))
    return out


def with_switches(on: tuple[str, ...], off: tuple[str, ...], generation: str,
                  needs: tuple[str, ...] | None = None) -> StackSpec:
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    switches = {**spec.genesis.switches, generation: (on, off)}
    genesis = replace(spec.genesis, switches=MappingProxyType(switches),
                      needs=spec.genesis.needs if needs is None else needs)
    return replace(spec, genesis=genesis)


@pytest.mark.parametrize("generation", ["v7", "v12"])
def test_every_patch_and_switch_is_the_real_ones(reports: dict[str, TreeReport],
                                                 generation: str) -> None:
    r, f = reports[generation], facts(generation)
    assert r.errors == () and r.layout == generation and r.registry_file == f["registry_file"]
    # Each patch: exists under the real id, with the real env_flag, lifecycle and default_on.
    assert dict(r.patch_flags) == {k: (e["env_flag"], e["lifecycle"], e["default_on"])
                                   for k, e in f["patches"].items()}  # fmt: skip
    # Each switch name turns on the same patches (none where the real tree has no such switch).
    for name, targets in f["switches"].items():
        assert r.switches.get(name, ()) == tuple(Switch(*t) for t in targets), name
    assert set(r.switches) <= set(f["switches"])  # no switch the real tree lacks
    # Each patch's category and applies_to conditions (what the correctness-patch rule reads).
    entries = gp.registry_entries(generation)
    assert {pid: e["category"] for pid, e in entries.items()} == {
        pid: e["category"] for pid, e in f["patches"].items()}
    conditions = {pid: {k: list(v) if isinstance(v, tuple) else v
                        for k, v in (e.get("applies_to") or {}).items()  # type: ignore[attr-defined]
                        if k != "vllm_version_range"} for pid, e in entries.items()}
    assert {pid: c for pid, c in conditions.items() if c} == {
        pid: e["conditions"] for pid, e in f["patches"].items() if "conditions" in e}
    if generation == "v12":
        ranges = {pid: (e.get("applies_to") or {}).get("vllm_version_range")
                  for pid, e in gp.registry_entries("v12").items()}
        assert {pid: list(v) if isinstance(v, tuple) else v for pid, v in ranges.items()} == {
            pid: e["vllm_version_range"] for pid, e in f["patches"].items()}


def test_the_extract_covers_every_built_in_stack() -> None:
    # A stack file that switches or needs a patch the extract lacks: refresh the extract from
    # the real trees (scripts/genesis-registry-extract.py), then make the fixture match it.
    for spec in builtin_catalog().stacks.values():
        if spec.genesis is None:
            continue
        names = {n for on, off in spec.genesis.switches.values() for n in (*on, *off)}
        for generation in RELEASES:
            f = facts(generation)
            assert names <= set(f["switches"]), (spec.name, generation,
                                                 names - set(f["switches"]))  # fmt: skip
            assert set(spec.genesis.needs) <= set(f["patches"]), (spec.name, generation)


def test_the_stack_file_sets_pass_the_gate_as_on_the_real_trees(
        reports: dict[str, TreeReport]) -> None:  # fmt: skip
    spec = builtin_catalog().get(STACK)
    for generation in RELEASES:
        use = StackUse.of(spec, generation)
        for report in (reports[generation], real_report(generation)):
            assert pairing_problems(report, pin(generation), stack=STACK,
                                    vllm_version=VLLM[generation], use=use) == []


def variants() -> list[tuple[str, StackSpec, str]]:
    """Switch sets the gate refuses in one generation or the other: (id, spec, generation)."""
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    v7_on, v7_off = spec.genesis.switches["v7"]
    return [
        ("v7-set-as-v12", with_switches(v7_on, v7_off, "v12"), "v12"),
        ("v7-set-on-v7-with-P4", with_switches((*v7_on, "P4"), v7_off, "v7"), "v7"),
        ("v7-set-on-v12-with-P4", with_switches((*v7_on, "P4"), v7_off, "v12"), "v12"),
        ("needs-P4-and-PN30", with_switches(v7_on, v7_off, "v12", needs=("P67", "P4", "PN30",
                                                                        "PN8")), "v12"),
        ("needs-P4-on-v7", with_switches(v7_on, v7_off, "v7", needs=("P67", "P4", "P67b")),
         "v7"),
        ("v7-set-without-P67", with_switches(
            tuple(n for n in v7_on if not n.startswith("P67")), v7_off, "v7"), "v7"),
    ]


@pytest.mark.parametrize(("case", "spec", "generation"), variants(),
                         ids=[v[0] for v in variants()])
def test_the_gate_says_the_same_of_the_fixture_and_the_real_tree(
        reports: dict[str, TreeReport], case: str, spec: StackSpec, generation: str) -> None:
    use = StackUse.of(spec, generation)
    label = pin(generation).label
    got = (switch_problems(reports[generation], use, label=label)
           + needs_problems(reports[generation], use, label=label))
    want = (switch_problems(real_report(generation), use, label=label)
            + needs_problems(real_report(generation), use, label=label))
    assert got == want
    if case != "needs-P4-on-v7":  # P4 is default_on in v7.72.2: needing it is sound
        assert got, case  # each variant is refused: the comparison is not vacuous


@pytest.mark.parametrize("generation", ["v7", "v12"])
def test_a_legacy_patch_a_stack_needs_is_applied_without_a_switch(
        reports: dict[str, TreeReport], generation: str) -> None:
    """P4 (env_flag GENESIS_LEGACY_P4) runs on every apply in both generations, even where v12
    lists it retired: needing it is no pairing problem, on the fixture as on the real tree."""
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    on, off = spec.genesis.switches[generation]
    use = StackUse.of(with_switches(on, off, generation, needs=("P67", "P4")), generation)
    label = pin(generation).label
    for report in (reports[generation], real_report(generation)):
        assert needs_problems(report, use, label=label) == []


def real_entries(generation: str) -> list[PatchEntry]:
    """The extract's patches as the correctness-patch rule reads them (titles aside)."""
    out = []
    for pid, e in facts(generation)["patches"].items():
        applies = dict(e.get("conditions") or {})
        if e.get("vllm_version_range") is not None:
            applies["vllm_version_range"] = e["vllm_version_range"]
        switches = tuple(s for s, ts in facts(generation)["switches"].items()
                         if any(t[0] == pid for t in ts))
        out.append(PatchEntry(pid, "", e["category"], e["lifecycle"], e["default_on"], applies,
                              switches))
    return out


@pytest.mark.parametrize("generation", ["v7", "v12"])
def test_the_fixture_asks_for_the_same_correctness_decisions_as_the_real_tree(
        tmp_path: Path, generation: str) -> None:  # fmt: skip
    tree = render(generation, tmp_path, RELEASES[generation][1])
    fixture = read_entries(DirSource(tree), generation)
    spec = builtin_catalog().get(STACK)
    profile = stack_profile(spec)
    got = {e.pid for e in fixture if in_scope(e, profile, VLLM[generation])}
    want = {e.pid for e in real_entries(generation) if in_scope(e, profile, VLLM[generation])}
    assert got == want and {"PN11", "PN30"} <= got  # not vacuous: two correctness patches
    assert decision_problems(spec, fixture, VLLM[generation], label=generation,
                             generation=generation) == []
    assert decision_problems(spec, real_entries(generation), VLLM[generation],
                             label=generation, generation=generation) == []
