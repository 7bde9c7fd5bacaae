"""The Genesis fixture repository: history shaped like sndr_core_engine today, deterministic SHAs,
dumb-HTTP clones under both names, the real history beside it, and what its two apply programs
(v7 ``python3 -m vllm._genesis.patches.apply_all``, v12 ``python3 -m sndr.apply``) do to the
simulator's vLLM package::

    .venv/bin/python -m pytest testbed/tests/test_genesis_fixture.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from genesis_helpers import P67, apply, genesis_site, render
from rigfleet_testbed import genesis_patches as gp
from rigfleet_testbed.genesis_fixture import (
    OLD_REPO_NAME,
    REPO_NAME,
    GenesisFixture,
    build_genesis_fixture,
    import_bundle,
)
from services_helpers import services
from verify_sim import TQ3_MTP
from vllm_sim_helpers import SimServer, make_gpu_root, make_model

from rigfleet.catalog import builtin_catalog
from rigfleet.hostside.stackctl import missing_boot_lines

ROOT = Path(__file__).resolve().parents[2]
INSPECT = ROOT / "rigfleet" / "genesis_inspect.py"  # the hosts' rigfleet-genesis-inspect.py
FIXTURES = ROOT / "tests" / "fixtures" / "genesis"
SIM_VLLM = ROOT / "testbed/rigfleet_testbed/images/vllm-sim/vllm"
VARIANTS = ROOT / "testbed/rigfleet_testbed/images/vllm-build/variants"
GOOD = "nightly-01d4d1ad375dc5854779c593eee093bcebb0cada"
V7722_PINS = ("0.20.1rc1.dev16+g7a1eb8ac2", "0.20.2rc1.dev9+g01d4d1ad3")
V7730_NEW = ("0.20.2rc1.dev212+g3f9c2a7e5", "0.20.2rc1.dev240+gb7e4d1c9a")
# Retired in the v12.1.0 registry (PN8 and PN30 are experimental there; upstream-2026.md 3.4
# lists them retired on main 34e26930, after v12.1.0).
RETIRED = {"P4", "P61", "P61b", "P64", "P78", "P83", "P94", "PN9", "PN13", "PN19", "PN22", "PN34",
           "PN54"}
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
# Switches of club-3090's tq3 stack that are text patches on an old nightly (P4 is one too, but
# has no switch: a legacy patch that every apply runs), and a rebind (P68).
TQ3_SWITCHES = {P67: "1", "GENESIS_ENABLE_P66_CUDAGRAPH_SIZE_FILTER": "1",
                "GENESIS_ENABLE_P58_ASYNC_PLACEHOLDER_FIX": "1",
                "GENESIS_ENABLE_P68_AUTO_FORCE_TOOL": "1"}  # fmt: skip
P4_LINE = "[Genesis] P4    [ON] TurboQuant KV cache on hybrid (GDN + attention) models — "
P4_SKIP = ("[Genesis] P4    [SKIP] TurboQuant KV cache on hybrid (GDN + attention) models — "
           "required anchor missing in v1/attention/backends/turboquant_attn.py")
P67_TITLE = "TurboQuant multi-query kernel for spec-decode K+1 verify"


def git(*args: str, cwd: Path | None = None, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV},
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0 or not check, proc.stderr
    return proc.stdout.strip()


def allowlist_at(checkout: Path) -> dict[str, object]:
    """The allowlists as the deploy's host helper reads them from the checkout."""
    proc = subprocess.run([sys.executable, str(INSPECT), str(checkout)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    allow = json.loads(proc.stdout)["allowlist"]
    return {"guards": allow["file"], "known_good": allow["known_good"],
            "pending": allow["pending"]}


@pytest.fixture(scope="module")
def genesis(tmp_path_factory: pytest.TempPathFactory) -> GenesisFixture:
    return build_genesis_fixture(tmp_path_factory.mktemp("data") / "git")


@pytest.fixture(scope="module")
def git_base(genesis: GenesisFixture) -> Iterator[str]:
    """The fixture served by ``python -m services`` (git listener on a free port)."""
    data = genesis.repo_path.parent.parent
    with services(data, log=data / "services.log") as ports:
        yield f"http://127.0.0.1:{ports['git']}"


@pytest.fixture(scope="module")
def checkout(genesis: GenesisFixture, git_base: str,
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("clone") / "genesis"
    git("clone", "--quiet", genesis.url(git_base), str(dest))
    return dest


# ---- the repository ----------------------------------------------------------------------------

def test_builds_are_deterministic(genesis: GenesisFixture, tmp_path: Path) -> None:
    again = build_genesis_fixture(tmp_path / "git")
    rebuilt = build_genesis_fixture(tmp_path / "git")  # over an existing repository
    for fx in (again, rebuilt):
        assert fx.all_commits() == genesis.all_commits() and fx.tags == genesis.tags
    bare = genesis.repo_path
    assert bare.name == REPO_NAME
    (c1, c2), main = genesis.commits, genesis.main_commits
    assert c1.title.startswith("release(v7.72.2): ") and c2.title.startswith("release(v7.73.0): ")
    assert c1.allowlist == V7722_PINS and c2.allowlist == V7722_PINS + V7730_NEW
    assert genesis.releases["v7.72.2"] == c1.sha and genesis.releases["v7.73.0"] == c2.sha
    assert git("--git-dir", str(bare), "log", "-1", "--format=%an <%ae> %ad", "--date=iso",
               c1.sha) == "Genesis Fixture <genesis@rigfleet.test> 2026-05-05 09:30:00 +0000"
    assert main[0].title == "Genesis vLLM Patches — v12 public release (tidied)"
    refs = dict(reversed(line.split("\t")) for line in (bare / "info/refs").read_text().split("\n")
                if line)  # fmt: skip
    assert refs == {"refs/heads/dev": c2.sha, "refs/heads/main": main[-1].sha,
                    "refs/tags/v12.0.0": main[1].sha, "refs/tags/v12.1.0": main[2].sha}
    assert (bare / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert (bare / "objects/info/packs").read_text().startswith("P pack-")


def test_history_is_shaped_like_the_real_one(genesis: GenesisFixture) -> None:
    bare = ["--git-dir", str(genesis.repo_path)]
    merge_base = subprocess.run(["git", *bare, "merge-base", "dev", "main"], capture_output=True,
                                env={**os.environ, **GIT_ENV}, check=False)  # fmt: skip
    assert merge_base.returncode == 1  # main was rewritten: no common history with dev
    for c in genesis.commits:  # v7 only on dev
        assert git(*bare, "branch", "--contains", c.sha).split() == ["dev"]
        assert git(*bare, "tag", "--contains", c.sha) == ""
    root = genesis.main_commits[0].sha
    assert git(*bare, "rev-list", "--max-parents=0", "main") == root
    assert git(*bare, "rev-list", "--count", "main") == "4"
    assert git(*bare, "cat-file", "-t", "v12.1.0") == "commit"  # a lightweight tag, as upstream
    assert git(*bare, "tag") == "v12.0.0\nv12.1.0"  # no v7.72.x or v7.73.x tag exists
    assert genesis.main != genesis.tags["v12.1.0"]  # main moved on after the release
    assert (genesis.alias_path.resolve() == genesis.repo_path.resolve()
            and genesis.alias_path.name == OLD_REPO_NAME)


def test_clone_over_dumb_http_under_both_names(genesis: GenesisFixture, checkout: Path,
                                               git_base: str, tmp_path: Path) -> None:
    assert git("rev-parse", "HEAD", cwd=checkout) == genesis.main
    for path in ("sndr/apply/__main__.py", "sndr/dispatcher/registry.py", "sndr/plugin.py",
                 "sndr/engines/vllm/detection/guards.py", "sndr/kernel/textpatch.py",
                 "pyproject.toml", "sndr/pins.yaml"):
        assert (checkout / path).is_file(), path
    assert not (checkout / "vllm").exists()  # no vllm/_genesis on main
    # The v7 commit a pin names is there after a full clone, via dev (3.1).
    v7 = genesis.releases["v7.72.2"]
    git("checkout", "--quiet", v7, cwd=checkout)
    assert (checkout / "vllm/_genesis/patches/apply_all.py").is_file()
    assert allowlist_at(checkout) == {"guards": "vllm/_genesis/guards.py",
                                      "known_good": list(V7722_PINS), "pending": []}
    old = tmp_path / "old-name"
    git("clone", "--quiet", f"{git_base}/{OLD_REPO_NAME}", str(old))
    assert git("rev-parse", "HEAD", cwd=old) == genesis.main
    git("fetch", "--quiet", "origin", cwd=checkout)
    assert git("rev-parse", "origin/dev", cwd=checkout) == genesis.commits[-1].sha
    log = (genesis.repo_path.parent.parent / "services.log").read_text()
    assert "info/refs?service=git-upload-pack 200" in log  # smart probe answered as dumb


def test_v12_allowlist_is_the_real_v12_1_0_one(genesis: GenesisFixture, checkout: Path) -> None:
    real = json.loads((FIXTURES / "v12.1.0-allowlist.json").read_text())
    git("checkout", "--quiet", "v12.1.0", cwd=checkout)
    got = allowlist_at(checkout)
    assert got == {"guards": "sndr/engines/vllm/detection/guards.py",
                   "known_good": real["known_good"], "pending": real["pending"]}
    assert "0.21.0" in got["known_good"] and "0.21.0" in got["pending"]
    assert not {"0.24.0", "0.27.1"} & set(got["known_good"] + got["pending"])
    v7 = json.loads((FIXTURES / "v7.72.2-allowlist.json").read_text())
    assert v7["known_good"] == list(V7722_PINS)
    pyproject = (checkout / "pyproject.toml").read_text()
    assert 'name = "sndr-platform"' in pyproject and 'version = "12.1.0"' in pyproject
    assert '[project.entry-points."vllm.general_plugins"]\ngenesis_v7 = "sndr.plugin:register"' \
        in pyproject
    git("checkout", "--quiet", "v12.0.0", cwd=checkout)
    assert 'version = "12.0.0"' in (checkout / "pyproject.toml").read_text()
    assert "0.23.1rc1.dev748+g2dfaae752" not in allowlist_at(checkout)["known_good"]


def test_v12_registry_lifecycles_match_the_reference() -> None:
    # (Every entry against the real registries: test_genesis_fixture_registry.py.)
    v12 = gp.registry_entries("v12")
    assert {pid for pid, e in v12.items() if e["lifecycle"] == "retired"} == RETIRED
    assert v12["P4"]["env_flag"] == "GENESIS_LEGACY_P4" and not v12["P4"]["default_on"]
    assert (v12["PN8"]["lifecycle"], v12["PN30"]["lifecycle"]) == ("experimental", "experimental")
    assert (v12["P40"]["lifecycle"], v12["P82"]["lifecycle"]) == ("legacy", "research")
    assert v12["PN26b"]["env_flag"] == "GENESIS_ENABLE_PN26_SPARSE_V"
    assert v12["P67"]["applies_to"] == {"is_turboquant": [True],
                                        "vllm_version_range": (">=0.20.0", "<0.24.0")}
    capped = {pid for pid, e in v12.items()
              if e.get("applies_to", {}).get("vllm_version_range") == (">=0.20.0", "<0.24.0")}
    assert capped == {"P67", "P72", "P82", "P103", "PN12", "PN14"}
    v7 = gp.registry_entries("v7")
    assert (v7["P4"]["env_flag"], v7["P4"]["default_on"], v7["P4"]["lifecycle"]) == (
        "GENESIS_LEGACY_P4", True, "legacy")
    assert v7["P61"]["deprecated"] and v7["PN13"]["lifecycle"] == "retired"
    assert v7["P67b"]["env_flag"] == v7["P67"]["env_flag"] == P67


def test_every_anchor_is_in_the_vllm_source_it_patches() -> None:
    variants = {"v1/attention/backends/turboquant_attn.py": "turboquant_attn.pre-hybrid.py",
                "model_executor/kernels/linear/mixed_precision/marlin.py": "marlin.pre-pad.py",
                "tool_parsers/qwen3coder_tool_parser.py": "qwen3coder_tool_parser.py"}
    for pid, t in gp.TEXT_PATCHES.items():
        texts = [p.read_text()
                 for p in (SIM_VLLM / t.target, VARIANTS / variants.get(t.target, "-"))
                 if p.is_file()]  # fmt: skip
        counts = [text.count(t.anchor) for text in texts]
        assert max(counts) == 1 and min(counts) >= 0, pid  # in some form, never ambiguous
        assert t.anchor not in t.replacement and f"[Genesis {pid}" in t.replacement, pid


def test_real_history_from_a_bundle(tmp_path: Path) -> None:
    src = tmp_path / "src"
    git("init", "--quiet", "-b", "dev", str(src))
    (src / "f").write_text("1\n")
    git("add", "f", cwd=src)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "one", cwd=src)
    git("tag", "v12.1.0", cwd=src)
    bundle = tmp_path / "real.bundle"
    git("bundle", "create", str(bundle), "dev", "v12.1.0", cwd=src)
    dest = tmp_path / "git" / "real" / REPO_NAME
    assert import_bundle(bundle, dest) == dest
    head = git("rev-parse", "HEAD", cwd=src)
    assert git("--git-dir", str(dest), "for-each-ref", "--format=%(refname)").split() == [
        "refs/heads/dev", "refs/tags/v12.1.0"]
    assert (dest / "HEAD").read_text() == "ref: refs/heads/dev\n"  # the bundle has no main
    assert f"{head}\trefs/heads/dev" in (dest / "info/refs").read_text()
    stamp = (dest / "info/refs").stat().st_mtime_ns
    assert import_bundle(bundle, dest) == dest  # same refs: kept as it is
    assert (dest / "info/refs").stat().st_mtime_ns == stamp
    assert import_bundle(tmp_path / "absent.bundle", dest) is None
    fx = build_genesis_fixture(tmp_path / "git", tmp_path / "absent.bundle")
    assert fx.real_path is None


# ---- v7: python3 -m vllm._genesis.patches.apply_all --------------------------------------------

def test_v7_needs_its_runtime_dependencies(tmp_path: Path) -> None:
    site = genesis_site(tmp_path, "v7", GOOD, upto=0, deps=False)
    rc, out = apply(site, "v7", {P67: "1"})
    assert rc == 1 and "ModuleNotFoundError: No module named 'pandas'" in out, out
    assert "[Genesis P67" not in (
        site / "vllm/v1/attention/backends/turboquant_attn.py").read_text()


def test_v7_applies_text_patches_the_simulator_then_reads(tmp_path: Path) -> None:
    from vllm.sim.buildinfo import load_genesis_state, marlin_pad_present  # (vllm_sim_helpers)

    site = genesis_site(tmp_path, "v7", GOOD, upto=0)
    env = {**TQ3_SWITCHES, "GENESIS_ENABLE_P87": "1", "GENESIS_ENABLE_P81_FP8_BLOCK_SCALED_M_LE_8":
           "0", "GENESIS_VLLM_PIN_POLICY": "strict"}  # fmt: skip
    rc, out = apply(site, "v7", env)
    assert rc == 0, out
    assert "[Genesis] apply_all v7.72.2 starting" in out
    assert f"[Genesis pin-gate] allowlist (2 entries): {list(V7722_PINS)}" in out
    assert "OK — vllm pin 0.20.2rc1.dev9+g01d4d1ad3 is on the Genesis allowlist" in out
    assert (f"[Genesis] P67   [ON] {P67_TITLE} — text-patched "
            "v1/attention/backends/turboquant_attn.py") in out
    assert "[Genesis] P67b  [ON] TurboQuant spec-verify routing to the P67 kernel — rebind" in out
    assert "[Genesis] P68   [ON] auto-force tool choice on long contexts — rebind" in out
    assert "[Genesis] P81   [OFF] FP8 block-scaled GEMM for M <= 8 — disabled by" in out
    # P4 without a switch: v7.72.2 applies it on every run (this build refuses TQ on hybrids).
    assert (P4_LINE + "text-patched v1/attention/backends/turboquant_attn.py") in out
    assert "Genesis Results: 7 applied, 39 skipped, 0 failed" in out
    state = load_genesis_state(site / "vllm")
    assert state is not None and state.applied == {"P4", "P58", "P66", "P67", "P87"}
    assert marlin_pad_present(site / "vllm")


def test_p4_has_no_switch_and_applies_where_vllm_refuses_turboquant_on_hybrids(
        tmp_path: Path) -> None:  # fmt: skip
    # v7.72.2: a legacy patch (env_flag GENESIS_LEGACY_P4) that every apply runs; a
    # GENESIS_ENABLE_P4 is an unregistered name (the typo guard says so) and changes nothing.
    site = genesis_site(tmp_path / "v7", "v7", GOOD, upto=0)
    rc, out = apply(site, "v7", {"GENESIS_ENABLE_P4": "0"})
    assert rc == 0 and (P4_LINE + "legacy patch") not in out, out
    assert (P4_LINE + "text-patched v1/attention/backends/turboquant_attn.py") in out
    assert "WARNING [Genesis typo-guard] GENESIS_ENABLE_P4 is not a registered patch flag" in out
    # v12.1.0: retired in the registry, yet its hook still runs it: an old build gets it, with
    # the lifecycle noted; a build with hybrid TurboQuant (v0.21.0) has no anchor left.
    old = genesis_site(tmp_path / "v12-old", "v12", GOOD)
    rc, out = apply(old, "v12", {})
    assert rc == 0 and (P4_LINE + "text-patched v1/attention/backends/turboquant_attn.py "
                        "[lifecycle retired]") in out, out
    rc, out = apply(genesis_site(tmp_path / "v12-new", "v12", "v0.21.0"), "v12", {})
    assert rc == 0 and P4_SKIP in out and "Genesis Results: 0 applied" in out, out


@pytest.mark.parametrize("generation", ["v7", "v12"])
def test_the_stack_file_set_serves_turboquant_on_a_build_before_hybrid_support(
        tmp_path: Path, generation: str) -> None:  # fmt: skip
    # The tq3 stack file's switches for the generation (no P4 in either) on the v7 pairing's
    # build (0.20.2rc1.dev9, before vllm#39931): Genesis leaves P4, P67 and P87 in vLLM's files
    # and the simulator serves TurboQuant + MTP on the hybrid model.
    from vllm.sim.buildinfo import load_genesis_state  # (vllm_sim_helpers)

    spec = builtin_catalog().get("tq3-mtp-genesis")
    assert spec.genesis is not None
    site = genesis_site(tmp_path, generation, GOOD, upto=0 if generation == "v7" else None)
    rc, out = apply(site, generation, spec.genesis.env(generation))
    assert rc == 0 and "0 failed" in out, out
    state = load_genesis_state(site / "vllm")
    assert state is not None and {"P4", "P67", "P87"} <= state.applied
    with SimServer(site, make_gpu_root(tmp_path), make_model(tmp_path), TQ3_MTP) as srv:
        srv.wait_ready()
        srv.stop()
    assert "NotImplementedError" not in srv.output()
    # The stack file's boot.expect lines are in what the container prints (the entrypoint's
    # apply, then vLLM); with P67 switched off, its line is the one missing.
    expect = [(b.pattern, b.title) for b in spec.boot_expect]
    assert len(expect) == 2
    assert missing_boot_lines(out + srv.output(), expect) == []
    env = {k: ("0" if "P67" in k else v) for k, v in spec.genesis.env(generation).items()}
    bare = genesis_site(tmp_path / "no-p67", generation, GOOD,
                        upto=0 if generation == "v7" else None)
    rc, out = apply(bare, generation, env)
    assert rc == 0 and "P67" not in load_genesis_state(bare / "vllm").applied, out
    assert missing_boot_lines(out + srv.output(), expect) == [spec.boot_expect[0].title]


def test_v7_pin_gate(tmp_path: Path) -> None:
    site = genesis_site(tmp_path, "v7", "nightly-1acd67a795ebccdf9b9db7697ae9082058301657", upto=0)
    rc, out = apply(site, "v7", {"GENESIS_VLLM_PIN_POLICY": "strict", P67: "1"})
    assert rc == 2, out
    assert ("[Genesis pin-gate] STRICT FAIL: UNKNOWN — vllm pin '0.20.2rc1.dev129+g1acd67a79' is "
            "NOT on the Genesis known-good list (2 entries)") in out
    assert "add it to KNOWN_GOOD_VLLM_PINS in vllm/_genesis/guards.py" in out
    assert "Genesis Results" not in out  # the gate runs before any patch
    rc, out = apply(site, "v7", {P67: "1"})  # default policy: warn, boot continues
    assert rc == 0 and "WARNING [Genesis pin-gate] UNKNOWN — vllm pin" in out, out
    assert "P67   [ON]" in out
    # v7.73.0 (dev only) lists dev212; v7.72.2 does not.
    new = genesis_site(tmp_path / "new", "v7", "v0.24.0", upto=1)
    rc, out = apply(new, "v7", {"GENESIS_VLLM_PIN_POLICY": "strict"})
    assert rc == 2 and "allowlist (4 entries)" in out, out


def test_v7_second_apply_in_the_same_container_fails(tmp_path: Path) -> None:
    site = genesis_site(tmp_path, "v7", GOOD, upto=0)
    rc, first = apply(site, "v7", TQ3_SWITCHES)
    assert rc == 0 and "0 failed" in first, first
    rc, second = apply(site, "v7", TQ3_SWITCHES)  # docker stop + start: same writable layer
    assert rc == 1, second
    assert (f"[Genesis] P67   [FAIL] {P67_TITLE} — anchor not found in "
            "v1/attention/backends/turboquant_attn.py: already patched") in second
    assert "docker compose down && docker compose up -d" in second
    assert "Genesis Results: 2 applied, 40 skipped, 4 failed" in second  # P67b, P68: rebinds
    rc, out = apply(site, "v7", {"GENESIS_ENABLE_P68_AUTO_FORCE_TOOL": "1"})
    assert rc == 1 and "P4    [FAIL]" in out and "P68   [ON]" in out, out  # P4 runs every time
    new = genesis_site(tmp_path / "new", "v7", "v0.24.0", upto=0)  # P4 finds nothing to patch
    for _ in range(2):
        rc, out = apply(new, "v7", {"GENESIS_ENABLE_P68_AUTO_FORCE_TOOL": "1"})
        assert rc == 0, out  # rebinds leave nothing on disk


def test_v7_unwritable_p87_target_fails_and_dry_run_writes_nothing(tmp_path: Path) -> None:
    site = genesis_site(tmp_path, "v7", GOOD, upto=0)
    marlin = site / "vllm/model_executor/kernels/linear/mixed_precision/marlin.py"
    before = marlin.read_text()
    rc, out = apply(site, "v7", {"GENESIS_ENABLE_P87": "1", P67: "1"}, "--dry-run")
    assert rc == 0 and "P87   [DRY]" in out and "(dry-run: 4 would apply)" in out, out  # +P4, P67b
    assert marlin.read_text() == before
    # Tests run as root, so a read-only mode would not stop the write; a directory in place of
    # the file does (in a container the read-only bind mount gives errno 30 instead).
    marlin.unlink()
    marlin.mkdir()
    rc, out = apply(site, "v7", {"GENESIS_ENABLE_P87": "1", P67: "1"})
    assert rc == 1 and "P87   [FAIL]" in out and "Errno" in out, out
    assert "Genesis Results: 3 applied, 42 skipped, 1 failed" in out  # P4, P67, P67b; P87


def test_v7_typo_guard_and_missing_vllm(genesis: GenesisFixture, tmp_path: Path) -> None:
    site = genesis_site(tmp_path, "v7", GOOD, upto=0)
    typo = {"GENESIS_ENABLE_P67_TQ_MULTIQUERY_KERNEL": "1"}
    rc, out = apply(site, "v7", typo)
    assert rc == 0 and f"did you mean {P67}?" in out, out
    rc, out = apply(site, "v7", {**typo, "GENESIS_TYPO_GUARD_STRICT": "1"})
    assert rc == 2 and "orchestrator setup error" in out, out
    # Genesis without a vllm package: strict gate refuses, warn mode cannot locate vllm.
    bare = tmp_path / "bare"
    (bare / "vllm").mkdir(parents=True)
    (site / "vllm/_genesis").rename(bare / "vllm/_genesis")
    for dep in ("pandas", "scipy", "xxhash"):
        (site / dep).rename(bare / dep)
    rc, out = apply(bare / "x", "v7", {"GENESIS_VLLM_PIN_POLICY": "strict"}, pythonpath=bare)
    assert rc == 2 and "STRICT FAIL: MISSING" in out, out
    rc, out = apply(bare / "x", "v7", pythonpath=bare)
    assert rc == 2 and "orchestrator setup error" in out, out


def test_plugins_apply_once_per_process(tmp_path: Path) -> None:
    v7 = genesis_site(tmp_path / "v7", "v7", GOOD, upto=0)
    plugin = render("v7", tmp_path / "v7tree", 0) / "tools/genesis_vllm_plugin"
    v12 = genesis_site(tmp_path / "v12", "v12", "v0.21.0")
    code = {"v7": "import genesis_v7 as p; p.register(); p.register()",
            "v12": "import sndr.plugin as p; p.register(); p.register()"}
    for name, path in (("v7", f"{v7}{os.pathsep}{plugin}"), ("v12", str(v12))):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GENESIS_")},
               "PYTHONPATH": path, P67: "1"}  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", code[name]], capture_output=True, text=True,
                              env={**env, "GENESIS_DISABLE": "1"}, check=False)  # fmt: skip
        assert proc.returncode == 0 and "GENESIS_DISABLE set" in proc.stdout, proc.stderr
        proc = subprocess.run([sys.executable, "-c", code[name]], capture_output=True, text=True,
                              env=env, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        # v7 on an old build: P4 (no switch), P67, P67b; v12 on v0.21.0: P4 finds no anchor.
        applied = {"v7": 3, "v12": 2}[name]
        assert f"register() complete: {applied} applied" in proc.stdout, (name, proc.stdout)
        assert "register() complete: already applied in this process" in proc.stdout
    toml = (plugin / "pyproject.toml").read_text()
    assert 'genesis_v7 = "genesis_v7:register"' in toml and 'version = "7.72.2"' in toml


# ---- v12: python3 -m sndr.apply ----------------------------------------------------------------

def test_v12_on_a_release_it_does_not_list(tmp_path: Path) -> None:
    site = genesis_site(tmp_path, "v12", "v0.27.1")
    env = {P67: "1", "GENESIS_ENABLE_P87": "1", "GENESIS_ENABLE_P61_QWEN3_MULTI_TOOL": "1",
           "GENESIS_ENABLE_P4": "1", "GENESIS_ENABLE_P82": "0"}
    rc, out = apply(site, "v12", {**env, "GENESIS_VLLM_PIN_POLICY": "strict"})
    assert rc == 2, out
    assert ("[Genesis pin-gate] STRICT FAIL: UNKNOWN — vllm pin '0.27.1' is NOT on the Genesis "
            "known-good list (43 entries)") in out
    assert "PROMOTION_PENDING_VLLM_PINS for a not-yet-validated candidate) in " \
        "sndr/engines/vllm/detection/guards.py" in out
    rc, out = apply(site, "v12", env)  # warn: it goes on
    assert rc == 0, out
    assert "[Genesis] sndr.apply 12.1.0 starting (engine=vllm, apply=True)" in out
    assert "WARNING [Genesis typo-guard] GENESIS_ENABLE_P4 is not a registered patch flag" in out
    assert ("P61   [SKIP] Qwen3 multiple tool calls per turn — lifecycle retired: hard-skipped "
            "(set GENESIS_ALLOW_RETIRED=1 to force)") in out
    assert (f"P67   [ON] {P67_TITLE} — text-patched v1/attention/backends/turboquant_attn.py"
            in out)
    assert P4_SKIP in out  # retired, but applied by its hook: on this build it finds no anchor
    assert "[vllm 0.27.1 outside vllm_version_range >=0.20.0,<0.24.0; not enforced]" in out
    assert ("P87   [SKIP] Marlin pad-sub-tile-n (vllm#40361 backport) — upstream drift marker "
            "'marlin_padded_nk' in model_executor/kernels/linear/mixed_precision/marlin.py") in out
    assert "Genesis Results: 2 applied, 44 skipped, 0 failed" in out  # P67, P67b


def test_v12_version_range_retired_switches_and_pending_pins(tmp_path: Path) -> None:
    site = genesis_site(tmp_path, "v12", "v0.27.1")
    rc, out = apply(site, "v12", {P67: "1", "GENESIS_ENFORCE_VERSION_RANGE": "1"})
    assert rc == 0 and (f"P67   [SKIP] {P67_TITLE} — vllm 0.27.1 outside vllm_version_range "
                        ">=0.20.0,<0.24.0 (GENESIS_ENFORCE_VERSION_RANGE=1)") in out, out
    # 0.21.0: on PROMOTION_PENDING (and KNOWN_GOOD), accepted in strict mode.
    old = genesis_site(tmp_path / "v021", "v12", "v0.21.0")
    env = {"GENESIS_VLLM_PIN_POLICY": "strict", "GENESIS_ENABLE_P61_QWEN3_MULTI_TOOL": "1",
           "GENESIS_ENABLE_P87": "1"}
    rc, out = apply(old, "v12", env)
    assert rc == 0 and "OK — vllm pin 0.21.0 is on the Genesis allowlist" in out, out
    assert "P61   [SKIP]" in out and "P87   [ON]" in out
    rc, out = apply(genesis_site(tmp_path / "allow", "v12", "v0.21.0"), "v12",
                    {**env, "GENESIS_ALLOW_RETIRED": "1"})
    assert rc == 0 and ("P61   [ON] Qwen3 multiple tool calls per turn — text-patched "
                        "tool_parsers/qwen3coder_tool_parser.py") in out, out


def test_v12_reads_sndr_enable_first_and_env_flag_aliases(tmp_path: Path) -> None:
    site = genesis_site(tmp_path, "v12", "v0.21.0")
    sndr = "SNDR_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"
    rc, out = apply(site, "v12", {sndr: "1", "GENESIS_ENABLE_P87": "0",
                                  "SNDR_ENABLE_P87": "1"})  # fmt: skip
    assert rc == 0 and f"P67   [ON] {P67_TITLE}" in out and "P67b  [ON]" in out, out
    assert "P87   [ON]" in out  # SNDR_ENABLE_ wins over GENESIS_ENABLE_
    rc, out = apply(genesis_site(tmp_path / "b", "v12", "v0.21.0"), "v12",
                    {"GENESIS_ENABLE_P87": "1", "SNDR_ENABLE_P87": "0"})
    assert rc == 0 and "P87   [OFF] Marlin pad-sub-tile-n (vllm#40361 backport) — disabled by " \
        "SNDR_ENABLE_P87=0" in out, out
    # An alias of a retired patch is a known name (no typo warning), and the patch is skipped.
    alias = "GENESIS_ENABLE_P59_QWEN3_TOOL_RECOVERY"
    rc, out = apply(site, "v12", {alias: "1"})
    assert rc == 0 and "P61b  [SKIP] tool-call streaming overlap fix — lifecycle retired" in out
    assert "typo-guard" not in out, out


def test_v12_second_apply_fails_and_missing_deps_or_engine(tmp_path: Path) -> None:
    site = genesis_site(tmp_path, "v12", "v0.24.0")
    env = {P67: "1", "GENESIS_ENABLE_P66_CUDAGRAPH_SIZE_FILTER": "1"}
    rc, out = apply(site, "v12", env)
    assert rc == 0 and "Genesis Results: 3 applied" in out, out  # P66, P67, P67b
    rc, out = apply(site, "v12", env)
    assert rc == 1 and "P66   [FAIL]" in out and "already patched" in out, out
    assert "Genesis Results: 1 applied, 43 skipped, 2 failed" in out  # P67b is a rebind
    rc, out = apply(site, "v12", {**env, "SNDR_ENGINE": "sglang"})
    assert rc == 2 and "SNDR_ENGINE=sglang" in out, out
    bare = genesis_site(tmp_path / "nodeps", "v12", "v0.24.0", deps=False)
    rc, out = apply(bare, "v12", env)
    assert rc == 1 and "ModuleNotFoundError: No module named 'pandas'" in out, out


def test_the_shas_are_the_ones_other_tests_name(genesis: GenesisFixture) -> None:
    from bump_helpers import GENESIS_NEW, GENESIS_OLD

    assert [c.sha for c in genesis.commits] == [GENESIS_OLD, GENESIS_NEW]
