"""The vLLM builds the testbed publishes: catalog, Docker Hub retention, per-version features,
and how each simulator image boots and fails (testbed/rigfleet_testbed/vllm_builds.py and the
simulator's reading of ``vllm/_build_info.json``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from pathlib import Path

import pytest
from rigfleet_testbed import mirror
from rigfleet_testbed import vllm_builds as vb

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_sim_helpers import (
    MTP,
    SimServer,
    make_gpu_root,
    make_model,
    make_package,
)

GOOD = "nightly-01d4d1ad375dc5854779c593eee093bcebb0cada"
DYING = "nightly-1acd67a795ebccdf9b9db7697ae9082058301657"
COMMON = ["--served-model-name", "qwen3.6-27b-autoround", "--tensor-parallel-size", "2",
          "--max-model-len", "262144",
          "--quantization", "auto_round", "--max-num-seqs", "2", "--enable-prefix-caching",
          "--reasoning-parser", "qwen3", "--default-chat-template-kwargs",
          '{"enable_thinking": false}']
INT8 = [*COMMON, "--kv-cache-dtype", "int8_per_token_head", "--gpu-memory-utilization", "0.92",
        "--speculative-config", MTP]
TQ3 = [*COMMON, "--kv-cache-dtype", "turboquant_3bit_nc", "--gpu-memory-utilization", "0.85",
       "--speculative-config", MTP]
FP8 = [*COMMON, "--kv-cache-dtype", "fp8_e5m2", "--gpu-memory-utilization", "0.92"]


def nightly(day: str, n: int) -> vb.Build:
    return vb.Build(f"nightly-{n:040x}", "0.1.0.dev1", day, f"{n:040x}")


# ---- the catalog -------------------------------------------------------------------------------

def test_catalog_has_the_releases_and_nightlies_the_reference_names():
    releases = {b.tag: (b.version, b.built) for b in vb.RELEASES}
    assert releases == {
        "v0.20.0": ("0.20.0", "2026-04-28"), "v0.21.0": ("0.21.0", "2026-05-15"),
        "v0.22.0": ("0.22.0", "2026-05-29"), "v0.24.0": ("0.24.0", "2026-07-01"),
        "v0.27.1": ("0.27.1", "2026-08-13"), "v0.28.0": ("0.28.0", "2026-08-26"),
    }
    assert vb.by_tag("v0.28.0").commit == "2cf0a6915ce544dc493a0990f2ea38d81601128a"
    assert vb.by_tag(GOOD).version == "0.20.2rc1.dev9+g01d4d1ad3"
    assert vb.by_tag(GOOD.removeprefix("nightly-")) == vb.by_tag(GOOD)
    assert vb.by_tag(DYING).regressions == (vb.SPECULATORS_OSERROR,)
    assert {b.tag for b in vb.BUILDS if b.archived} == {GOOD, DYING}
    for b in vb.NIGHTLIES:
        assert re.fullmatch(r"nightly-[0-9a-f]{40}", b.tag) and b.commit == b.tag[8:]
        local = b.version.partition("+g")[2]
        assert len(local) >= 9 and b.commit.startswith(local), b
    assert len({b.tag for b in vb.BUILDS}) == len(vb.BUILDS)
    with pytest.raises(KeyError, match="no vLLM build 'v9.9.9'"):
        vb.by_tag("v9.9.9")


def test_recent_nightlies_are_daily_until_today():
    recent = vb.recent_nightlies()
    days = [dt.date.fromisoformat(b.built) for b in recent]
    assert days[-1] == vb.TODAY - dt.timedelta(days=1) and len(days) == 21
    assert all(b - a == dt.timedelta(days=1) for a, b in zip(days, days[1:], strict=False))
    assert recent == vb.recent_nightlies()  # deterministic SHAs and versions


# ---- retention ---------------------------------------------------------------------------------

def test_retention_keeps_releases_and_the_14_newest_nightlies():
    builds = [vb.Build("v1.0.0", "1.0.0", "2020-01-01")]
    builds += [nightly(f"2026-03-{d:02d}", d) for d in range(1, 21)]
    builds.append(vb.Build("v1.1.0", "1.1.0", "2026-03-30"))
    kept, purged = vb.retention(builds)
    assert [b.tag for b in kept if not b.nightly] == ["v1.0.0", "v1.1.0"]
    assert [b.built for b in kept if b.nightly] == [f"2026-03-{d:02d}" for d in range(7, 21)]
    assert [b.built for b in purged] == [f"2026-03-{d:02d}" for d in range(1, 7)]
    kept, purged = vb.retention(builds[::-1])  # input order does not matter, only the dates
    assert len(purged) == 6 and max(b.built for b in purged) == "2026-03-06"
    assert vb.retention(builds[:5]) == (builds[:5], [])  # fewer than 14: nothing purged


def test_docker_hub_today_serves_releases_and_late_november_nightlies_only():
    kept, purged = vb.retention(vb.BUILDS)
    assert {b.tag for b in kept if not b.nightly} == {b.tag for b in vb.RELEASES}
    served = sorted(b.built for b in kept if b.nightly)
    # 12 daily nightlies (2026-11-19 ... 30) and the two throughput nightlies of 27 and 28.
    assert len(served) == 14 and served[0] == "2026-11-19" and served[-1] == "2026-11-30"
    assert set(vb.THROUGHPUT_NIGHTLIES) <= set(kept)
    purged_tags = {b.tag for b in purged}
    assert {GOOD, DYING} <= purged_tags  # 404 since May (club-3090#167)
    assert "nightly-2dfaae752b4db0d43cfc0715c780e33be030d0f1" in purged_tags  # genesis#89


def test_mirror_plan_pushes_the_kept_and_deletes_purged_tags_it_still_has():
    kept, drop = mirror.plan(vb.BUILDS, [GOOD, "v0.27.1", "nightly-" + "f" * 40])
    assert drop == [GOOD]  # an unknown tag is not ours to delete
    assert kept == vb.retention(vb.BUILDS)[0]


def test_throughput_nightlies_are_second_builds_of_late_november_days():
    daily = {b.built: b for b in vb.recent_nightlies()}
    regs = (vb.DECODE_THROUGHPUT_REGRESSION, vb.DECODE_THROUGHPUT_UNSTABLE)
    for b, reg in zip(vb.THROUGHPUT_NIGHTLIES, regs, strict=True):
        assert b.regressions == (reg,) and b.source.startswith("fictional")
        nxt = (dt.date.fromisoformat(b.built) + dt.timedelta(days=1)).isoformat()
        assert daily[b.built].v < b.v < daily[nxt].v, b  # between its day's daily and the next
        info = vb.build_info(b)
        # Only the decode speed differs from the neighbouring nightlies.
        assert info["regressions"] == [reg, *vb.build_info(daily[b.built])["regressions"]]
        assert {k: v for k, v in info.items() if k not in ("tag", "version", "commit", "built",
                                                           "regressions")} == \
            {k: v for k, v in vb.build_info(daily[b.built]).items()
             if k not in ("tag", "version", "commit", "built", "regressions")}
        assert vb.by_tag(b.commit) is b


# ---- features by version -----------------------------------------------------------------------

@pytest.mark.parametrize(("tag", "int8", "marlin", "hybrid", "bugs"), [
    ("v0.20.0", False, "needs-pad", False, False),
    (GOOD, False, "needs-pad", False, False),
    (DYING, False, "needs-pad", True, False),
    ("v0.21.0", False, "model-native", True, False),
    ("v0.22.0", True, "model-native", True, False),
    ("nightly-2dfaae752b4db0d43cfc0715c780e33be030d0f1", True, "native", True, False),
    ("v0.24.0", True, "native", True, False),
    ("v0.27.1", True, "native", True, True),
    ("v0.28.0", True, "native", True, True),
    (vb.recent_nightlies()[-1].tag, True, "native", True, True),
])
def test_features_follow_the_version(tag, int8, marlin, hybrid, bugs):
    b = vb.by_tag(tag)
    info = vb.build_info(b)
    assert ("int8_per_token_head" in info["kv_cache_dtypes"]) is int8
    assert "turboquant_3bit_nc" in info["kv_cache_dtypes"]  # every build is >= v0.20.0
    assert (info["marlin_sub_tile_n"], info["turboquant_hybrid"]) == (marlin, hybrid)
    assert ({vb.GDN_SPEC_WILD_WRITE, vb.MTP_PREFIX_CACHE_GDN} <= set(info["regressions"])) is bugs
    assert (info["tag"], info["version"], info["built"]) == (b.tag, b.version, b.built)


def test_layer_files_carry_build_info_metadata_and_the_versions_source_text(tmp_path):
    old = {f.path: f.data for f in vb.layer_files(vb.by_tag(GOOD)).files}
    assert json.loads(old["vllm/_build_info.json"]) == vb.build_info(vb.by_tag(GOOD))
    assert b"Version: 0.20.2rc1.dev9+g01d4d1ad3" in \
        old["vllm-0.20.2rc1.dev9+g01d4d1ad3.dist-info/METADATA"]
    assert b"NotImplementedError" in old["vllm/v1/attention/backends/turboquant_attn.py"]
    assert b"marlin_padded_nk" not in old[
        "vllm/model_executor/kernels/linear/mixed_precision/marlin.py"]
    assert "vllm/tool_parsers/qwen3coder_tool_parser.py" in old  # deleted upstream 2026-06-15
    new = {f.path for f in vb.layer_files(vb.by_tag("v0.27.1")).files}
    assert new == {"vllm/_build_info.json", "vllm-0.27.1.dist-info/METADATA",
                   "vllm-0.27.1.dist-info/INSTALLER", "vllm-0.27.1.dist-info/RECORD",
                   # make_arg_parser where vLLM before 0.29 keeps it (worker-vllm#338)
                   "vllm/entrypoints/openai/__init__.py",
                   "vllm/entrypoints/openai/cli_args.py"}
    vb.layer_files(vb.by_tag("v0.27.1")).write(tmp_path)
    assert json.loads((tmp_path / "vllm/_build_info.json").read_text())["version"] == "0.27.1"


# ---- the simulator, per build ------------------------------------------------------------------

def boot(tmp_path: Path, tag: str, args: list[str], sub: str = "a", **kw) -> SimServer:
    return SimServer(make_package(tmp_path / sub, tag, **kw), make_gpu_root(tmp_path),
                     make_model(tmp_path), args)


def test_a_dtype_the_version_lacks_dies_in_argparse_listing_its_choices(tmp_path):
    for tag in (GOOD, "v0.21.0"):
        srv = boot(tmp_path, tag, INT8, sub=tag)
        assert srv.wait_exit() == 2
        out = srv.output()
        assert out.startswith("usage: vllm serve [model_tag] [options]\n")
        m = re.search(r"vllm serve: error: argument --kv-cache-dtype: invalid choice: "
                      r"'int8_per_token_head' \(choose from (.*)\)", out)
        assert m, out
        assert "turboquant_3bit_nc" in m.group(1) and "per_token_head" not in m.group(1)
        assert "Starting vLLM API server" not in out
    with boot(tmp_path, "v0.22.0", INT8, sub="v022") as srv:
        srv.wait_ready()
        srv.stop()


def test_marlin_sub_tile_shards_before_v0_21_die_unless_the_pad_fix_is_in(tmp_path):
    srv = boot(tmp_path, "v0.20.0", FP8)
    assert srv.wait_exit() == 1
    out = srv.output()
    assert "EngineCore failed to start." in out
    assert re.search(r"ERROR .*\] ValueError: Failed to find a kernel that can implement the "
                     r"WNA16 linear layer\. Reasons: \n.* MarlinLinearKernel cannot implement due "
                     r"to: GPTQ_MARLIN_MIN_THREAD_N \(64\) > out_features \(48\)", out), out
    assert out.rstrip().endswith("RuntimeError: Engine core initialization failed. See root "
                                 "cause above. Failed core proc(s): {}")
    tq3_p4 = dict(genesis_applied=["P4"])
    # The pad fix as Genesis P87's patch of marlin.py: boots.
    with boot(tmp_path, GOOD, TQ3, sub="p87", genesis_applied=["P4", "P87"]) as srv:
        srv.wait_ready()
        srv.stop()
    # As the vllm#40361 overlay (its _maybe_pad_n in marlin.py): boots.
    site = make_package(tmp_path / "overlay", GOOD, **tq3_p4)
    marlin = site / "vllm/model_executor/kernels/linear/mixed_precision/marlin.py"
    marlin.write_text(marlin.read_text() + "\n    def _maybe_pad_n(self, layer):\n        pass\n")
    with SimServer(site, make_gpu_root(tmp_path), make_model(tmp_path), TQ3) as srv:
        srv.wait_ready()
        srv.stop()
    # v0.21.0 runs this model natively; an unquantized model never meets Marlin.
    with boot(tmp_path, "v0.21.0", FP8, sub="v021") as srv:
        srv.wait_ready()
        srv.stop()
    site = make_package(tmp_path / "plain", GOOD, **tq3_p4)
    with SimServer(site, make_gpu_root(tmp_path), make_model(tmp_path / "m", quantized=False),
                   TQ3) as srv:
        srv.wait_ready()
        srv.stop()


def _essays(srv: SimServer, n: int) -> list[int]:
    """HTTP statuses of ``n`` long answers (several hundred tokens each)."""
    return [srv.chat([{"role": "user", "content": f"Explain step by step how a hash map works "
                       f"(part {i})."}], max_tokens=1500).status for i in range(n)]


def test_vllm_50021_kills_the_engine_under_mtp_and_async_scheduling(tmp_path):
    srv = boot(tmp_path, "v0.27.1", [*INT8, "--no-enable-prefix-caching"])
    with srv:
        srv.wait_ready()
        short = srv.chat([{"role": "user", "content": "What is the capital of France?"}],
                         max_tokens=30)
        statuses = _essays(srv, 3)  # ~1,000 tokens of decode work is enough
        assert srv.wait_exit() == 1
    assert short.status == 200 and statuses[0] == 500, statuses
    out = srv.output()
    assert "ERROR" in out and "[core.py:1050] EngineCore encountered a fatal error." in out
    assert ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
            in out)
    assert "vllm.v1.engine.exceptions.EngineDeadError" in out
    assert "INFO:     Shutting down" in out
    # Mitigated: --no-async-scheduling, or no speculative decoding; and v0.24.0 does not carry it.
    no_mtp = [a for a in INT8 if a not in ("--speculative-config", MTP)]
    for sub, tag, args in (("sync", "v0.27.1", [*INT8, "--no-async-scheduling"]),
                           ("nomtp", "v0.27.1", no_mtp), ("old", "v0.24.0", INT8)):
        with boot(tmp_path, tag, [*args, "--no-enable-prefix-caching"], sub=sub) as srv:
            srv.wait_ready()
            assert _essays(srv, 6) == [200] * 6, sub
            assert srv.request("GET", "/health").status == 200
            srv.stop()


def _conversation(srv: SimServer) -> tuple[str, str]:
    first = [{"role": "user", "content": "Our service is called Larkspur and it runs on three "
              "hosts in Lisbon. Describe in two sentences what a canary deploy is."}]
    a = srv.chat(first, max_tokens=200).json()["choices"][0]["message"]["content"]
    second = first + [{"role": "assistant", "content": a},
                      {"role": "user", "content": "Now explain what a rollback is, briefly."}]
    b = srv.chat(second, max_tokens=200).json()["choices"][0]["message"]["content"]
    return a, b


def _degenerate(text: str) -> bool:
    words = text.split()
    return len(words) > 50 and len(set(words)) <= 3


def test_vllm_43559_corrupts_a_turn_that_reuses_a_cached_prefix(tmp_path):
    with boot(tmp_path, "v0.27.1", [*INT8, "--no-async-scheduling"]) as srv:
        srv.wait_ready()
        a, b = _conversation(srv)
        srv.stop()
    assert not _degenerate(a) and _degenerate(b), (a, b)
    for sub, args in (("nopc", [*INT8, "--no-async-scheduling", "--no-enable-prefix-caching"]),
                      ("nomtp", [a for a in INT8 if a not in ("--speculative-config", MTP)])):
        with boot(tmp_path, "v0.27.1", args, sub=sub) as srv:
            srv.wait_ready()
            a, b = _conversation(srv)
            srv.stop()
        assert not _degenerate(a) and not _degenerate(b), (sub, b)


def test_p66_logs_the_capture_sizes_it_keeps_when_its_marker_is_in(tmp_path):
    line = ("[Genesis P66] Filtered cudagraph_capture_sizes for spec-decode uniform_query_len=4: "
            "removed 2 non-divisible sizes [1, 2]; kept [4, 8, 16].")
    with boot(tmp_path, "v0.24.0", TQ3, genesis_applied=["P66", "P67"]) as srv:
        srv.wait_ready()
        srv.stop()
    assert line in srv.output()
    # The engine captures what P66 kept (tqdm bars of the graph capture).
    bar = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| {0}/{0} "
    assert bar.format(3) in srv.output()
    with boot(tmp_path, "v0.24.0", TQ3, sub="b", genesis_applied=["P67"]) as srv:
        srv.wait_ready()
        srv.stop()
    assert "[Genesis P66]" not in srv.output() and bar.format(5) in srv.output()


def test_an_archive_is_recognised_by_the_image_it_holds(tmp_path):
    import io
    import tarfile

    from rigfleet_testbed import vllm_images

    def archive(manifest: object) -> Path:
        path = tmp_path / f"a{len(list(tmp_path.iterdir()))}.tar"
        with tarfile.open(path, "w") as tar:
            data = json.dumps(manifest).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        return path

    digest = "ab" * 32
    # docker save of Docker 25+ (OCI layout) and of older engines.
    assert vllm_images.archived_image_id(archive([{"Config": f"blobs/sha256/{digest}"}])) == \
        f"sha256:{digest}"
    assert vllm_images.archived_image_id(archive([{"Config": f"{digest}.json"}])) == \
        f"sha256:{digest}"
    assert vllm_images.archived_image_id(tmp_path / "missing.tar") is None
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    assert vllm_images.archived_image_id(tmp_path / "junk.tar") is None
    assert vllm_images.archive_path(tmp_path, vb.by_tag(GOOD)) == tmp_path / f"{GOOD}.tar"
