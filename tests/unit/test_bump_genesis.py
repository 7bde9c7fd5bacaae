"""Genesis on the control side (``rigfleet.bump.genesis``) against a repository of the real
shape (``genesis_trees.genesis_repo``: v7 only on ``dev``, v12 only as tags with no common
history, no ``main``, one commit only ``refs/pull/*`` reaches): labels, the search over every
branch and tag newest first, proposals and refusals, the switch check of a chosen commit, and
what ``rigfleet pins lock`` records.

Run: ``.venv/bin/python -m pytest tests/unit/test_bump_genesis.py -q``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest
from genesis_trees import FixtureRepo, genesis_repo

from rigfleet.bump.genesis import (
    GenesisError,
    GenesisRefused,
    GenesisRepo,
    check_switches,
    choose_genesis,
    infer_version,
    lock_genesis,
    names_commit,
)
from rigfleet.catalog import Catalog, StackSpec, builtin_catalog
from rigfleet.genesis import StackUse
from rigfleet.pins import GenesisPin, ModelPin, Pins, StackPins

PINNED_URL = "https://github.com/Sandermage/sndr_core_engine.git"
CURRENT = "0.20.2rc1.dev9+g01d4d1ad3"
DEV212 = "0.20.2rc1.dev212+g3f9c2a7e5"
STACK = "tq3-mtp-genesis"
GOOD_SHA = "01d4d1ad375dc5854779c593eee093bcebb0cada"


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> FixtureRepo:
    return genesis_repo(tmp_path_factory.mktemp("git"))


@pytest.fixture
def repo(fixture: FixtureRepo, tmp_path: Path) -> GenesisRepo:
    r = GenesisRepo(PINNED_URL, fetch_url=fixture.url, cache_dir=tmp_path / "cache")
    r.sync()
    return r


def test_commits_are_labelled_by_tag_or_release_subject(fixture, repo) -> None:
    c = fixture.commits
    assert repo.commit(c["v12.1.0"]).label == f"{c['v12.1.0'][:12]} (v12.1.0)"
    assert repo.commit(c["v12.0.0"]).label == f"{c['v12.0.0'][:12]} (v12.0.0)"
    assert repo.commit(c["v7.72.2"]).label == f"{c['v7.72.2'][:12]} (v7.72.2)"  # subject
    assert repo.commit(c["dev-tip"]).label == c["dev-tip"][:12]
    assert repo.commit(c["v12.1.0"]).tree.layout == "v12"
    assert repo.commit(c["v7.72.2"]).tree.layout == "v7"
    repo.sync()  # a second sync fetches instead of cloning


def test_newer_walks_every_branch_and_tag_newest_first(fixture, repo) -> None:
    c = fixture.commits
    # Not a descendant walk of main (there is none): every branch and tag, by commit date.
    assert repo.newer(c["v7.72.2"]) == [c["v12.1.0"], c["v12.0.0"], c["dev-tip"]]
    assert repo.newer(c["v12.0.0"]) == [c["v12.1.0"]]
    assert repo.newer(c["v12.1.0"]) == []  # the pull-only commit is newer, but no branch/tag
    assert repo.resolve(c["pull-only"][:10]) == c["pull-only"]  # the mirror still has it


def test_version_on_the_pinned_allowlist_keeps_the_pin(fixture, repo) -> None:
    pinned = fixture.commits["v7.72.2"]
    choice = choose_genesis(repo, pinned, CURRENT, CURRENT)
    assert (choice.commit, choice.proposed, choice.rollback_safe) == (pinned, False, True)
    assert (choice.layout, choice.version) == ("v7", "v7.72.2")


def test_newest_commit_that_lists_the_version_is_proposed(fixture, repo) -> None:
    c = fixture.commits
    choice = choose_genesis(repo, c["v7.72.2"], "0.21.0", CURRENT)  # pending in v12.0.0 too
    assert choice.commit == c["v12.1.0"] and choice.proposed  # the newest newer that lists it
    assert choice.label.endswith("(v12.1.0)") and choice.rollback_safe
    assert choice.pin(PINNED_URL) == GenesisPin(PINNED_URL, c["v12.1.0"], "v12", "v12.1.0")
    choice = choose_genesis(repo, c["v7.72.2"], DEV212, CURRENT)
    assert choice.commit == c["dev-tip"] and choice.layout == "v7"


def test_version_no_commit_lists_is_refused_naming_what_was_checked(fixture, repo) -> None:
    c = fixture.commits
    with pytest.raises(GenesisRefused) as err:
        choose_genesis(repo, c["v7.72.2"], "0.27.1", CURRENT)
    text = str(err.value)
    assert text.startswith(f"vLLM 0.27.1 is not on Genesis {c['v7.72.2'][:12]} (v7.72.2)'s "
                           "KNOWN_GOOD_VLLM_PINS (vllm/_genesis/guards.py: ")
    assert (f"nor on any newer Genesis commit of any branch or tag (checked 3, newest first: "
            f"{c['v12.1.0'][:12]} (v12.1.0), {c['v12.0.0'][:12]} (v12.0.0), "
            f"{c['dev-tip'][:12]})") in text  # fmt: skip
    assert "refusing before any host changes" in text
    with pytest.raises(GenesisRefused, match="no newer Genesis commit exists on any branch or tag"):
        choose_genesis(repo, c["v12.1.0"], "0.27.1", CURRENT)
    with pytest.raises(GenesisRefused, match=r"\(v12.1.0\)'s KNOWN_GOOD_VLLM_PINS nor on its "
                                             "PROMOTION_PENDING_VLLM_PINS"):
        choose_genesis(repo, c["v12.1.0"], "0.27.1", CURRENT)


def test_explicit_genesis_commit_is_checked_not_searched(fixture, repo) -> None:
    c = fixture.commits
    choice = choose_genesis(repo, c["v7.72.2"], "0.21.0", CURRENT, explicit="v12.0.0")
    assert choice.commit == c["v12.0.0"] and choice.proposed
    with pytest.raises(GenesisRefused, match=r"the commit given with --genesis"):
        choose_genesis(repo, c["v7.72.2"], "0.21.1rc0", CURRENT, explicit="v12.0.0")
    with pytest.raises(GenesisError, match="no commit 'deadbeef'"):
        choose_genesis(repo, c["v7.72.2"], "0.21.0", CURRENT, explicit="deadbeef")


def test_an_older_commit_given_with_genesis_is_not_called_newer(fixture, repo, capsys,
                                                               tmp_path):
    """``--genesis`` naming a commit older than the pin: the plan said "(newer than the pin;
    it lists the candidate's vLLM)"."""
    from bump_helpers import bumped, hosts, write_pins

    from rigfleet.bump.images import VersionProbe
    from rigfleet.bump.output import print_plan
    from rigfleet.bump.plan import build_plan

    c = fixture.commits
    older = choose_genesis(repo, c["v12.1.0"], "0.21.0", CURRENT, explicit="v12.0.0")
    assert older.commit == c["v12.0.0"] and older.proposed
    pins = write_pins(tmp_path)
    plan = build_plan(hosts("int8", "int8"), {}, pins, bumped(pins, GOOD_SHA))
    print_plan(plan, {STACK: older}, VersionProbe("0.21.0", "pulled"))
    err = " ".join(capsys.readouterr().err.split())
    assert "newer than the pin" not in err and "older than the pin" in err
    newer = choose_genesis(repo, c["v7.72.2"], "0.21.0", CURRENT, explicit="v12.0.0")
    print_plan(plan, {STACK: newer}, VersionProbe("0.21.0", "pulled"))
    assert "newer than the pin" in " ".join(capsys.readouterr().err.split())


def test_unreachable_repository_is_an_error(tmp_path: Path) -> None:
    r = GenesisRepo("http://x/genesis.git", fetch_url=str(tmp_path / "nope.git"),
                    cache_dir=tmp_path)  # fmt: skip
    with pytest.raises(GenesisError, match="cannot clone Genesis"):
        r.sync()


def test_dry_run_infers_the_version_from_the_allowlist_entry_naming_the_commit(fixture, repo):
    pinned = fixture.commits["v7.72.2"]
    newer, dies = "3f9c2a7e5b1d4c8a9e0f6b2d7c1a5e8f9b3d6c02", "1acd67a795ebccdf9b9db7697ae9"
    assert names_commit(DEV212, newer) and not names_commit(DEV212, dies)
    assert not names_commit("0.21.0", newer)  # a release entry names no commit
    assert infer_version(repo, pinned, newer) == DEV212  # found on dev's newer commit
    assert infer_version(repo, pinned, dies) is None


# --- the switch check of a chosen commit --------------------------------------------------------


def v12_spec(on: list[str], off: tuple[str, ...] | list[str] = (), generation: str = "v12"
             ) -> StackSpec:  # fmt: skip
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    switches = {**spec.genesis.switches, generation: (tuple(on), tuple(off))}
    return replace(spec, genesis=replace(spec.genesis, switches=MappingProxyType(switches),
                                         needs=("P67",)))  # fmt: skip


def test_chosen_commit_is_refused_for_a_switch_it_retired(fixture, repo) -> None:
    c = fixture.commits
    pin = GenesisPin(PINNED_URL, c["v12.1.0"], "v12", "v12.1.0")
    spec = v12_spec(["P67_TQ_MULTI_QUERY_KERNEL", "P64_QWEN3CODER_MTP_STREAMING"])
    uses = {"": StackUse.of(spec, "v12"),
            "host1": StackUse.of(spec, "v12", {"GENESIS_ENABLE_P4": "1"})}  # fmt: skip
    with pytest.raises(GenesisRefused) as err:
        check_switches(repo, pin, uses, stack=STACK)
    text = str(err.value)
    assert text.count("GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING=1: patch P64 is retired in "
                      f"Genesis v12.1.0 ({c['v12.1.0'][:12]})") == 1  # once, not per host
    assert "host1: stack tq3-mtp-genesis: GENESIS_ENABLE_P4=1: Genesis v12.1.0" in text
    assert text.endswith("refusing before any host changes")
    check_switches(repo, pin, {"": StackUse.of(v12_spec(["P67_TQ_MULTI_QUERY_KERNEL"]), "v12")},
                   stack=STACK)  # fmt: skip


# --- rigfleet pins lock -------------------------------------------------------------------------


def pins_for(commit: str, layout: str = "v7", version: str | None = None,
             vllm: str = "0.21.0") -> Pins:  # fmt: skip
    g = GenesisPin(PINNED_URL, commit, layout, version)
    return Pins(path="pins.yaml", serial=1, driver_branch="580", driver_version=None,
                toolkit_version="1.17.8-1", hf_hub_version="2.4.0",
                model=ModelPin("Lorbus/Qwen3.6-27B-int4-AutoRound", "unresolved", "m"),
                stacks={STACK: StackPins(STACK, "vllm/vllm-openai:v0.21.0", "unresolved",
                                         vllm, g)})  # fmt: skip


def test_lock_records_layout_and_version_of_the_pinned_commit(fixture, tmp_path) -> None:
    c = fixture.commits["v12.1.0"]
    catalog = Catalog({STACK: v12_spec(["P67_TQ_MULTI_QUERY_KERNEL"],
                                       ["P64_QWEN3CODER_MTP_STREAMING"])})
    new, changes = lock_genesis(pins_for(c), catalog, fetch_url=fixture.url, cache_dir=tmp_path)
    assert new.stacks[STACK].genesis == GenesisPin(PINNED_URL, c, "v12", "v12.1.0")
    assert changes == [f"stacks.{STACK}.genesis.layout: v7 -> v12",
                       f"stacks.{STACK}.genesis.version: None -> v12.1.0"]  # fmt: skip
    again, changes = lock_genesis(new, catalog, fetch_url=fixture.url, cache_dir=tmp_path)
    assert again == new and changes == []
    # A v7 commit only dev reaches: its release subject names the version.
    v7 = fixture.commits["v7.72.2"]
    v7_catalog = Catalog({STACK: v12_spec(["P67_TQ_MULTI_QUERY_KERNEL"], generation="v7")})
    locked, _ = lock_genesis(pins_for(v7, vllm=CURRENT), v7_catalog, fetch_url=fixture.url,
                             cache_dir=tmp_path)  # fmt: skip
    assert locked.stacks[STACK].genesis == GenesisPin(PINNED_URL, v7, "v7", "v7.72.2")


def test_lock_refuses_what_the_hosts_gate_would_refuse(fixture, tmp_path) -> None:
    c = fixture.commits["v12.1.0"]
    catalog = Catalog({STACK: v12_spec(["P67_TQ_MULTI_QUERY_KERNEL",
                                        "PN13_CUDA_GRAPH_LAMBDA_ARITY"])})
    with pytest.raises(GenesisRefused) as err:
        lock_genesis(pins_for(c, vllm="0.27.1"), catalog, fetch_url=fixture.url,
                     cache_dir=tmp_path)  # fmt: skip
    lines = str(err.value).splitlines()
    assert lines[0].startswith("pins.yaml: stack tq3-mtp-genesis: vLLM 0.27.1 (image "
                               "vllm/vllm-openai:v0.21.0) is not on Genesis v12.1.0 "
                               f"({c[:12]})'s KNOWN_GOOD_VLLM_PINS nor on its "
                               "PROMOTION_PENDING_VLLM_PINS")  # fmt: skip
    assert lines[1].startswith("pins.yaml: stack tq3-mtp-genesis: "
                               "GENESIS_ENABLE_PN13_CUDA_GRAPH_LAMBDA_ARITY=1: patch PN13 is "
                               f"retired in Genesis v12.1.0 ({c[:12]})")  # fmt: skip
    # A stack file without the commit's generation's switch set: said as such.
    spec = builtin_catalog().get(STACK)
    assert spec.genesis is not None
    only_v7 = replace(spec, genesis=replace(spec.genesis, switches=MappingProxyType(
        {"v7": spec.genesis.switches["v7"]})))  # fmt: skip
    with pytest.raises(GenesisRefused, match="genesis.switches has no v12 set"):
        lock_genesis(pins_for(c), Catalog({STACK: only_v7}), fetch_url=fixture.url,
                     cache_dir=tmp_path)  # fmt: skip
    with pytest.raises(GenesisRefused, match=f"stacks.{STACK}.genesis.commit: {'e' * 40} is not "
                                             "in"):
        lock_genesis(pins_for("e" * 40), fetch_url=fixture.url, cache_dir=tmp_path)


def undecided(spec: StackSpec) -> StackSpec:
    assert spec.genesis is not None
    decisions = {k: v for k, v in spec.genesis.decisions.items() if k != "PN346"}
    return replace(spec, genesis=replace(spec.genesis, decisions=MappingProxyType(decisions)))


def test_lock_and_the_bump_refuse_an_undecided_correctness_patch(fixture, repo,
                                                                  tmp_path) -> None:
    c = fixture.commits["v12.1.0"]
    spec = undecided(v12_spec(["P67_TQ_MULTI_QUERY_KERNEL"]))
    with pytest.raises(GenesisRefused) as err:
        lock_genesis(pins_for(c), Catalog({STACK: spec}), fetch_url=fixture.url,
                     cache_dir=tmp_path)  # fmt: skip
    text = str(err.value)
    assert text.startswith(f"pins.yaml: {spec.source}: genesis.decisions.PN346: missing; "
                           f"Genesis v12.1.0 ({c[:12]}) patch PN346 ('Mamba/GDN cache hit "
                           "boundary fix for MTP + prefix caching'; correctness, "
                           "vllm_version_range >=0.21.0,<0.24.0")  # fmt: skip
    # The bump's plan: the candidate's vLLM decides what is in scope.
    pin = GenesisPin(PINNED_URL, c, "v12", "v12.1.0")
    uses = {"": StackUse.of(spec, "v12")}
    with pytest.raises(GenesisRefused, match="genesis.decisions.PN346: missing.*vLLM 0.23.1"):
        check_switches(repo, pin, uses, stack=STACK, spec=spec, vllm_version="0.23.1")
    check_switches(repo, pin, uses, stack=STACK, spec=spec, vllm_version="0.24.0")  # out of range
    # The shipped file decides it: both pass.
    decided = v12_spec(["P67_TQ_MULTI_QUERY_KERNEL"])
    check_switches(repo, pin, {"": StackUse.of(decided, "v12")}, stack=STACK, spec=decided,
                   vllm_version="0.23.1")  # fmt: skip
    lock_genesis(pins_for(c), Catalog({STACK: decided}), fetch_url=fixture.url,
                 cache_dir=tmp_path)  # fmt: skip


def test_a_git_that_hangs_or_is_missing_is_a_genesis_error_not_a_traceback(tmp_path, monkeypatch):
    """A stalled clone (git's 600 s limit) or no git on the control machine: the bump says
    which Genesis URL could not be read (``GenesisError``), not a subprocess traceback."""
    import subprocess

    def hangs(argv, **_):
        raise subprocess.TimeoutExpired(argv, 600)

    def missing(argv, **_):
        raise FileNotFoundError(2, "No such file or directory", "git")

    r = GenesisRepo(PINNED_URL, fetch_url="http://git.lan/genesis.git", cache_dir=tmp_path)
    for fake, said in ((hangs, "no answer in 600 s"), (missing, "cannot run git")):
        monkeypatch.setattr(subprocess, "run", fake)
        with pytest.raises(GenesisError, match=rf"clone Genesis from http://git.lan.*{said}"):
            r.sync()
