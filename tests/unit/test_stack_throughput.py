"""The seeds' other stacks (tq3-nomtp, turbo, single-fp8-mtp), the stack files' throughput
section, and what a host stages (host data ``stacks``, its GPUs) and gates with."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_stack_files import _write, builtin, load_stack_file

from rigfleet.catalog import CatalogError, builtin_catalog
from rigfleet.desired import stack_gate_set, staged_stacks
from rigfleet.hostdata import HostDataError, validate_host
from rigfleet.hostside.verify.profiles import resolve

CATALOG = builtin_catalog()


def test_tq3_nomtp_is_the_largest_pool_without_mtp_or_genesis():
    s = CATALOG.get("tq3-nomtp")
    assert (s.kv_cache_dtype, s.tensor_parallel_size, s.max_model_len) == (
        "turboquant_3bit_nc", 2, 262144)
    assert (s.gpu_memory_utilization, s.max_num_batched_tokens, s.max_num_seqs) == (
        0.92, 8192, 2)
    assert s.speculative_method is None and s.genesis is None
    assert "--enable-prefix-caching" in s.args  # vllm#43559 needs MTP
    assert s.image.kinds == ("release",) and s.image.min_version == "0.21.0"


def test_turbo_is_tq3_mtp_genesis_for_four_streams():
    turbo, base = CATALOG.get("turbo"), CATALOG.get("tq3-mtp-genesis")
    assert turbo.max_num_seqs == 4 and base.max_num_seqs == 2
    assert turbo.genesis == base.genesis and turbo.image == base.image
    assert turbo.args == base.args and dict(turbo.env) == dict(base.env)
    assert turbo.boot_expect == base.boot_expect
    assert turbo.port != base.port


def test_single_card_stack_is_seed_004s_on_a_release_with_its_caveats_handled():
    s = CATALOG.get("single-fp8-mtp")
    assert (s.gpu_count, s.tensor_parallel_size, s.kv_cache_dtype) == (1, 1, "fp8_e5m2")
    assert (s.max_model_len, s.gpu_memory_utilization, s.max_num_seqs,
            s.max_num_batched_tokens) == (75000, 0.97, 1, 2048)
    assert (s.speculative_method, s.num_speculative_tokens) == ("mtp", 3)
    assert "--enable-prefix-caching" not in s.args
    for flag in ("--no-enable-prefix-caching", "--no-async-scheduling",
                 "--language-model-only"):
        assert flag in s.args
    for name in ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "VLLM_MARLIN_USE_ATOMIC_ADD",
                 "CUDA_DEVICE_MAX_CONNECTIONS", "VLLM_FLOAT32_MATMUL_PRECISION"):
        assert name in s.env
    assert "HUGGING_FACE_HUB_TOKEN" not in s.env and s.genesis is None


@pytest.mark.parametrize("name", ["int8", "single-fp8-mtp"])
def test_every_flag_a_caveat_names_is_passed(name):
    spec = CATALOG.get(name)
    for caveat in spec.caveats:
        if caveat.handled_by.startswith("--"):
            assert caveat.handled_by in spec.args, caveat.id


def test_throughput_sections_of_the_builtin_stacks():
    tq3 = CATALOG.get("tq3-mtp-genesis").throughput
    assert tq3 is not None and tq3.reference == {"narrative": 89.2, "code": 119.1}
    assert (tq3.margin, tq3.cv_max) == (0.15, 0.10)
    assert tq3.floors == pytest.approx((0.76, 0.672, 0.6))
    assert CATALOG.get("single-fp8-mtp").throughput.reference == {"narrative": 66.0,
                                                                    "code": 84.0}
    assert CATALOG.get("int8").throughput.reference == {"narrative": 130.8}
    nomtp = CATALOG.get("tq3-nomtp").throughput
    assert nomtp is not None and nomtp.acceptance == () and nomtp.floors == ()
    assert "throughput_acceptance_floor" not in " ".join(nomtp.gate_set())
    assert tq3.gate_set() == (
        "throughput_reference_narrative=89.2", "throughput_reference_code=119.1",
        "throughput_margin=0.15", "throughput_cv_max=0.1",
        "throughput_acceptance_floor=0.76,0.672,0.6")


def test_a_minimal_throughput_section_takes_the_defaults(tmp_path):
    data = builtin("int8")
    data["throughput"] = {"reference": {"code": 100}}
    spec = load_stack_file(_write(tmp_path, "int8", data))
    assert spec.throughput is not None
    assert (spec.throughput.narrative, spec.throughput.code) == (None, 100.0)
    assert (spec.throughput.margin, spec.throughput.cv_max) == (0.15, 0.10)


def test_acceptance_floors_need_a_drafter(tmp_path):
    data = builtin("tq3-nomtp")
    data["throughput"]["acceptance"] = {"reference": [0.9]}
    with pytest.raises(CatalogError, match="no acceptance section for a stack without "
                                           "vllm.speculative"):
        load_stack_file(_write(tmp_path, "tq3-nomtp", data))


# -- what a host stages and gates with -----------------------------------------------------


@pytest.fixture
def data(tmp_path) -> dict[str, Any]:
    key = tmp_path / "api-key"
    key.write_text("k" * 40)
    key.chmod(0o600)
    repo = {"url": "https://repo.example/{distro}/x86_64", "key_url": "https://repo.example/k",
            "suite": "/", "components": []}
    return {"stack": "int8", "power_caps_w": 290, "model_dir": "/srv/models",
            "front_port": 8000, "api_key_file": str(key),
            "apt_repos": {"cuda": repo, "nvidia-container-toolkit": repo}}


class _Pins:
    """Just what staged_stacks reads: the pinned stack names, in pins order."""

    def __init__(self, *names: str):
        self.stacks = dict.fromkeys(names)


ALL_PINNED = _Pins("int8", "tq3-mtp-genesis", "tq3-nomtp", "turbo", "single-fp8-mtp")


def test_by_default_a_host_stages_every_pinned_stack_its_gpus_can_run(data):
    dual = validate_host("rig-a", data)
    assert (dual.stacks, dual.throughput_scale) == (None, 1.0)
    assert [s.name for s in staged_stacks(dual, ALL_PINNED)] == [
        "int8", "tq3-mtp-genesis", "tq3-nomtp", "turbo", "single-fp8-mtp"]
    single = validate_host("rig-b", {**data, "stack": "single-fp8-mtp", "gpu_count": 1,
                                     "power_caps_w": 330})
    assert [s.name for s in staged_stacks(single, ALL_PINNED)] == ["single-fp8-mtp"]
    # Only what is pinned is staged.
    assert [s.name for s in staged_stacks(dual, _Pins("int8"))] == ["int8"]


def test_host_data_stacks_limits_what_a_host_stages(data):
    s = validate_host("rig-a", {**data, "stacks": ["int8", "tq3-nomtp"]})
    assert s.stacks == ("int8", "tq3-nomtp")
    assert [x.name for x in staged_stacks(s, ALL_PINNED)] == ["int8", "tq3-nomtp"]


@pytest.mark.parametrize(("changes", "expected"), [
    ({"stacks": ["tq3-nomtp"]}, ["rig-a: stacks: ['tq3-nomtp']", "leaves out the stack the "
                                 "host serves", "a list that includes 'int8'"]),
    ({"stacks": ["int8", "fp9"]}, ["rig-a: stacks[1]: 'fp9'", "not a stack in the catalog"]),
    ({"stack": "single-fp8-mtp", "gpu_count": 1, "power_caps_w": 330,
      "stacks": ["single-fp8-mtp", "int8"]},
     ["rig-a: stacks[1]: 'int8'", "needs 2 GPUs (gpu_count is 1)", "run on 1 GPU(s)"]),
    ({"stacks": {}}, ["rig-a: stacks: {}", "a list of stack names"]),
    ({"throughput_scale": 0}, ["rig-a: throughput_scale: 0", "a number > 0"]),
    ({"throughput_scale": "fast"}, ["rig-a: throughput_scale: 'fast'"]),
])
def test_bad_stacks_or_scale_are_refused(data, changes, expected):
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", {**data, **changes})
    msg = str(err.value)
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_a_stack_brings_its_throughput_settings_and_the_host_scale_to_the_gate(data):
    settings = validate_host("rig-a", {**data, "throughput_scale": 40})
    sets = stack_gate_set(CATALOG.get("tq3-mtp-genesis"), settings)
    assert sets[:3] == ("throughput_stack=tq3-mtp-genesis",
                        "throughput_history_dir=/var/lib/rigfleet/throughput",
                        "throughput_scale=40")
    assert "throughput_reference_code=119.1" in sets
    prof = resolve("fast", list(sets))
    assert prof.throughput_scale == 40 and prof.throughput_acceptance_floor == (0.76, 0.672, 0.6)
