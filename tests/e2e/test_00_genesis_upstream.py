"""Genesis as it really is: rigfleet's Genesis code against the real history
(``../shared/upstream/genesis-dev-and-v12.1.0.bundle``: branch ``dev`` with v7.72.2 and tag
``v12.1.0``, no ``main``). Needs no testbed; skips, saying why, when the bundle is absent.

- the host's checkout reaches the dev-only v7.72.2 commit and the tag-only v12.1.0 commit;
- both layouts are detected, both allowlists and both registries read (all 325 v12 entries);
- the switch check on the real registries: what the stack file must change for v12;
- the bump's search over branches and tags, and what ``rigfleet pins lock`` records;
- why a v12 tree is mounted whole (a patch reads data outside ``sndr/`` at apply time).

Run: ``.venv/bin/python -m pytest tests/e2e/test_00_genesis_upstream.py -v``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from rigfleet.bump.genesis import GenesisRepo, choose_genesis, lock_genesis
from rigfleet.catalog import Catalog, StackSpec, builtin_catalog
from rigfleet.facts import GenesisHead
from rigfleet.genesis import StackUse, TreeReport, pairing_problems, switch_problems
from rigfleet.genesis_inspect import DirSource, inspect
from rigfleet.pins import GenesisPin, ModelPin, Pins, StackPins
from roles.genesis import checkout_commands, export_command

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO.parent / "shared" / "upstream" / "genesis-dev-and-v12.1.0.bundle"
V7 = "7b9fd3194ee6efa1644973383cd44ee5604a5d85"  # release(v7.72.2), only on dev
V12 = "66e37841a18f35a113ce10f831808faa4c858ced"  # tag v12.1.0, on no branch
URL = "https://github.com/Sandermage/sndr_core_engine.git"
STACK = "tq3-mtp-genesis"
# club-3090's tq3 switches that v12.1.0 retired (its registry; upstream-2026.md 3.4 lists PN8
# and PN30 too: that is main 34e26930, after v12.1.0, where they were retired later).
RETIRED_IN_V12_1_0 = {"P61", "P61b", "P64", "P78", "P83", "P94", "PN9", "PN13", "PN19", "PN22",
                      "PN34"}  # fmt: skip

pytestmark = pytest.mark.skipif(
    not BUNDLE.is_file(),
    reason=f"the real Genesis history is not here ({BUNDLE}): it is reference material of "
    "../shared/upstream, absent outside the project's workspace",
)


def sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The host's way: one checkout moved from the v7 pin to the v12 pin, each exported."""
    base = tmp_path_factory.mktemp("genesis")
    checkout, out = base / "checkout", base / "trees"
    check = {V7: "vllm/_genesis/patches/apply_all.py", V12: "sndr/apply/__main__.py"}
    for commit in (V7, V12):
        for command in checkout_commands(str(BUNDLE), commit, str(checkout),
                                         (checkout / ".git").is_dir()):  # fmt: skip
            run = sh(command)
            assert run.returncode == 0, (command, run.stderr)
        head = GenesisHead()
        state = head.process(sh(head.command(str(checkout))).stdout.splitlines())
        assert state.head == commit and state.origin == str(BUNDLE)
        assert state.layout == ("v7" if commit == V7 else "v12")
        run = sh(export_command(str(checkout), commit, check[commit], str(out)))
        assert run.returncode == 0, run.stderr
    return {"v7": out / V7, "v12": out / V12}


@pytest.fixture(scope="module")
def reports(trees: dict[str, Path]) -> dict[str, TreeReport]:
    return {k: TreeReport.from_json(inspect(DirSource(t))) for k, t in trees.items()}


def club_switches(generation: str = "v7") -> tuple[tuple[str, ...], tuple[str, ...]]:
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    return spec.genesis.switches[generation]


def with_switches(on: list[str], off: list[str], generation: str) -> StackSpec:
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    switches = {**spec.genesis.switches, generation: (tuple(on), tuple(off))}
    return replace(spec, genesis=replace(spec.genesis, switches=MappingProxyType(switches)))


def test_real_v12_tree(reports: dict[str, TreeReport]) -> None:
    r = reports["v12"]
    assert r.errors == () and r.layout == "v12" and r.version == "v12.1.0"
    assert r.patches == 325
    assert dict(r.lifecycles) == {"experimental": 235, "retired": 41, "legacy": 28, "stable": 14,
                                  "coordinator": 4, "research": 3}  # fmt: skip
    assert len(r.known_good) == 39 and r.pending == ("0.21.0", "0.21.1rc0",
                                                     "0.21.1rc0+gd735968f6d63",
                                                     "0.21.1rc0+gbf610c2f5676")  # fmt: skip
    assert r.lists("0.21.0") and r.lists("0.23.1rc1.dev748+g2dfaae752")
    assert not r.lists("0.24.0") and not r.lists("0.27.1")
    assert "BUNDLE_REASONING_QWEN3" in r.flags


def test_real_v7_tree(reports: dict[str, TreeReport]) -> None:
    r = reports["v7"]
    assert r.errors == () and r.layout == "v7"
    assert r.version == "v7.63.x"  # what vllm/_genesis/__version__.py says at v7.72.2
    assert r.known_good == ("0.20.1rc1.dev16+g7a1eb8ac2", "0.20.2rc1.dev9+g01d4d1ad3")
    assert r.pending == () and r.patches == 126 and not r.retired_skipped


def test_stack_file_v7_set_on_the_real_v7(reports: dict[str, TreeReport]) -> None:
    on, off = club_switches("v7")
    use = StackUse.of(with_switches(list(on), list(off), "v7"), "v7")
    pin = GenesisPin(URL, V7, "v7", "v7.72.2")
    problems = switch_problems(reports["v7"], use, label=pin.label)
    # Only P4 (a legacy patch switched by GENESIS_LEGACY_P4) is no v7 switch, if the file has it.
    assert all("GENESIS_ENABLE_P4=1" in p for p in problems), problems
    assert ("P4" in on) == bool(problems)


def test_club_switches_on_the_real_v12_registry(reports: dict[str, TreeReport]) -> None:
    r = reports["v12"]
    on, off = club_switches("v7")
    names = [*on, *off]
    retired = {t.patch for n in names for t in r.switches.get(n, ()) if t.lifecycle == "retired"}
    unknown = {n for n in names if n not in r.switches}
    assert retired == RETIRED_IN_V12_1_0 & {t.patch for n in names for t in r.switches.get(n, ())}
    assert unknown <= {"P4", "PN54"}
    # The v7 ON set as a v12 set is refused, switch by switch, naming the patch and release.
    use = StackUse.of(with_switches(list(on), [], "v12"), "v12")
    pin = GenesisPin(URL, V12, "v12", "v12.1.0")
    problems = pairing_problems(r, pin, stack=STACK, vllm_version="0.21.0", use=use)
    source = builtin_catalog().get(STACK).source
    if "P64_QWEN3CODER_MTP_STREAMING" in on:
        assert (
            "stack tq3-mtp-genesis: GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING=1: patch P64 is "
            "retired in Genesis v12.1.0 (66e37841a18f); remove it from the stack file's "
            f"genesis.switches.v12.on ({source})"
        ) in problems
    # What the stack file's v12 set must be: the v7 ON switches that v12.1.0 knows and keeps.
    keep = [n for n in on if r.switches.get(n)
            and not all(t.lifecycle == "retired" for t in r.switches[n])]  # fmt: skip
    sound = StackUse.of(with_switches(keep, [n for n in off if n in r.switches], "v12"), "v12")
    assert pairing_problems(r, pin, stack=STACK, vllm_version="0.21.0", use=sound) == []


def test_bump_search_and_lock_over_the_real_history(tmp_path: Path) -> None:
    repo = GenesisRepo(URL, fetch_url=str(BUNDLE), cache_dir=tmp_path)
    repo.sync()
    assert repo.commit(V7).label == "7b9fd3194ee6 (v7.72.2)" and repo.version(V7) == "v7.72.2"
    assert repo.commit(V12).label == "66e37841a18f (v12.1.0)" and repo.version(V12) == "v12.1.0"
    newer = repo.newer(V7)
    assert newer[0] == V12  # the newest commit of any branch or tag
    choice = choose_genesis(repo, V7, "0.21.0", "0.20.2rc1.dev9+g01d4d1ad3")
    assert (choice.commit, choice.layout, choice.version) == (V12, "v12", "v12.1.0")
    assert choice.rollback_safe  # v12.1.0 still lists the v7 pairing's vLLM
    # pins lock: layout and version recorded from the commit, the stack checked against it.
    r = repo.report(V12)
    on, off = club_switches("v7")
    keep = [n for n in on if r.switches.get(n)
            and not all(t.lifecycle == "retired" for t in r.switches[n])]  # fmt: skip
    catalog = Catalog({STACK: with_switches(keep, [], "v12")})
    pins = Pins(path="pins.yaml", serial=1, driver_branch="580", driver_version=None,
                toolkit_version="1.17.8-1", hf_hub_version="2.4.0",
                model=ModelPin("Lorbus/Qwen3.6-27B-int4-AutoRound", "unresolved", "m"),
                stacks={STACK: StackPins(STACK, "vllm/vllm-openai:v0.21.0", "unresolved",
                                         "0.21.0", GenesisPin(URL, V12))})  # fmt: skip
    new, changes = lock_genesis(pins, catalog, fetch_url=str(BUNDLE), cache_dir=tmp_path)
    assert new.stacks[STACK].genesis == GenesisPin(URL, V12, "v12", "v12.1.0")
    assert changes == [f"stacks.{STACK}.genesis.layout: v7 -> v12",
                       f"stacks.{STACK}.genesis.version: None -> v12.1.0"]  # fmt: skip


def test_v12_reads_data_outside_sndr_at_apply_time(trees: dict[str, Path], tmp_path: Path) -> None:
    # PN79 v2 finds its post-patch file by walking up from its module's resolved path to a
    # directory holding tests/unit/integrations. Importing that module (no vLLM needed) from a
    # site-packages that links the whole tree's sndr finds it; a copy of sndr/ alone does not.
    tree = trees["v12"]
    module = "sndr.engines.vllm.patches.attention.gdn.pn79_v2_md5_chunk"
    code = f"import {module} as m; print(m._POST_PATCH_FIXTURE.is_file())"
    linked, copied = tmp_path / "linked", tmp_path / "copied"
    linked.mkdir()
    (linked / "sndr").symlink_to(tree / "sndr")
    copied.mkdir()
    subprocess.run(["cp", "-r", str(tree / "sndr"), str(copied / "sndr")], check=True)
    for site, found in ((linked, "True"), (copied, "False")):
        run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, "
                              f"{str(site)!r}); {code}"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=120)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip().splitlines()[-1] == found, (site, run.stdout)


def test_the_stack_files_switch_sets_suit_the_real_trees(reports: dict[str, TreeReport]) -> None:
    # What the pins lock and the hosts' gate will say about the built-in stack file as it is.
    spec = builtin_catalog().get(STACK)
    for generation, commit, version, vllm in (("v7", V7, "v7.72.2", "0.20.2rc1.dev9+g01d4d1ad3"),
                                              ("v12", V12, "v12.1.0", "0.21.0")):  # fmt: skip
        pin = GenesisPin(URL, commit, generation, version)
        problems = pairing_problems(reports[generation], pin, stack=STACK, vllm_version=vllm,
                                    use=StackUse.of(spec, generation))  # fmt: skip
        assert problems == [], problems
