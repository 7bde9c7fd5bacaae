"""Stack files: every built-in one validates; a malformed one is refused naming the file, the
key, the value and what is allowed; a user's own stack directory extends the catalog."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet.catalog import (
    BUILTIN_DIR,
    CatalogError,
    StackSpec,
    builtin_catalog,
    load_catalog,
    parse_stack,
)
from rigfleet.catalog_keys import BY_PATH
from rigfleet.genesis_inspect import GENERATIONS
from rigfleet.hostdata import HostDataError, validate_host
from rigfleet.validate import YamlError, load_yaml
from rigfleet.vllm_versions import version_key


class _Delete:
    def __repr__(self) -> str:
        return "<delete>"


_DELETE = _Delete()


def load_stack_file(path: Path) -> StackSpec:
    """One stack file read and validated as the catalog reads each; raises ``CatalogError``."""
    try:
        data = load_yaml(path, "a stack file")
    except YamlError as e:
        raise CatalogError(str(e)) from None
    return parse_stack(data, str(path))


def builtin(name: str) -> dict[str, Any]:
    return yaml.safe_load((BUILTIN_DIR / f"{name}.yaml").read_text())


@pytest.mark.parametrize("path", sorted(BUILTIN_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_builtin_stack_file_validates(path: Path) -> None:
    spec = load_stack_file(path)
    assert spec.name == path.stem and spec.source == str(path)
    assert spec.tensor_parallel_size <= spec.gpu_count
    if spec.genesis is not None:
        assert set(spec.genesis.switches) <= set(GENERATIONS)
        assert "P67" in spec.genesis.needs
        # Every generation's set enables the kernel the stack cannot work without.
        for on, _off in spec.genesis.switches.values():
            assert "P67_TQ_MULTI_QUERY_KERNEL" in on
        assert all("==" in r for r in spec.genesis.runtime_packages)
    for caveat in spec.caveats:
        assert caveat.id and caveat.summary


def test_the_catalog_holds_the_builtin_stacks_with_their_own_ports() -> None:
    catalog = builtin_catalog()
    assert {"int8", "tq3-mtp-genesis"} <= set(catalog.names)
    assert len(catalog.ports()) == len(catalog.names)


def _write(tmp: Path, name: str, data: Any) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value


# (key, value, strings the message must contain)
BAD: list[tuple[str, Any, list[str]]] = [
    ("vllm.kv_cache_dtype", "int7", ["vllm.kv_cache_dtype: 'int7'", "is not allowed",
                                     "int8_per_token_head", "turboquant_3bit_nc"]),
    ("vllm.kv_cache_dtype", "int8_per_token_heads",
     ["did you mean 'int8_per_token_head'?"]),
    ("vllm.tensor_parallel_size", 4, ["vllm.tensor_parallel_size: 4",
                                      "larger than the stack's GPU count",
                                      "at most gpus.count (2)"]),
    ("vllm.gpu_memory_utilization", 1.2, ["vllm.gpu_memory_utilization: 1.2", "(0.0, 1.0]"]),
    ("vllm.tensor_paralel_size", 2, ["vllm.tensor_paralel_size", "unknown key",
                                     "did you mean 'tensor_parallel_size'?"]),
    ("port", 80, ["port: 80", "1024..65535"]),
    ("name", "Int8", ["name: 'Int8'", "lowercase letters"]),
    ("served_model_name", "bad name\n", ["served_model_name", "control characters"]),
    ("env.BAD-NAME", "1", ["env.BAD-NAME", "environment name"]),
    ("env.FLAG", True, ["env.FLAG: True", "'1'/'0'"]),
    ("vllm.args", ["--max-model-len", "1"], ["vllm.args[0]: '--max-model-len'",
                                             "set by the stack file's own key"]),
    # vLLM reads underscores as dashes: this one passed, and the stack's own key won silently
    ("vllm.args", ["--max_model_len=4096"], ["vllm.args[0]: '--max_model_len=4096'",
                                             "set by the stack file's own key"]),
    # vLLM's alias, a unique prefix argparse takes, a key of a JSON flag: all set managed flags
    ("vllm.args", ["-tp", "1"], ["vllm.args[0]: '-tp'", "set by the stack file's own key",
                                 "such as -tp"]),
    ("vllm.args", ["-tp=1"], ["vllm.args[0]: '-tp=1'", "set by the stack file's own key"]),
    ("vllm.args", ["--enforce-eager", "--max-model", "4096"],
     ["vllm.args[1]: '--max-model'", "set by the stack file's own key"]),
    ("vllm.args", ["--speculative-config.method=ngram"],
     ["vllm.args[0]: '--speculative-config.method=ngram'", "set by the stack file's own key"]),
    # A vLLM config file could set any of them where neither rigfleet nor its checks look
    ("vllm.args", ["--config", "/models/serve.yaml"],
     ["vllm.args[0]: '--config' reads a vLLM config file", "allowed: each option in vllm.args"]),
    ("vllm.speculative", {"method": "medusa", "num_speculative_tokens": 3},
     ["vllm.speculative.method: 'medusa'", "mtp"]),
    ("image", {"kinds": ["weekly"]}, ["image.kinds", "release, nightly"]),
    # `min_version: 0.20` unquoted is YAML's 0.2: it passed as release '0.2' (any image is newer)
    ("image", {"min_version": 0.20}, ["image.min_version: 0.2 is an unquoted number (YAML "
                                      "reads 0.20 as 0.2); allowed: a vLLM release such as "
                                      "'0.22.0', quoted"]),
    ("image", {"min_version": "0.24.0", "below_version": "0.22.0"},
     ["image.below_version: '0.22.0'", "not above min_version"]),
    ("boot", {"failures": [{"kind": "x", "pattern": "(", "title": "t"}]},
     ["boot.failures[0].pattern: '('", "does not compile"]),
    ("gate", {"set": {"nope": 1}}, ["gate.set", "unknown key 'nope'"]),
    # `set: []` / `set: ""` passed as "no overrides" (`or {}`): a wrong type is refused
    ("gate", {"set": []}, ["gate.set: [] is not a mapping", "a mapping of gate profile keys"]),
    ("gate", {"set": ""}, ["gate.set: '' is not a mapping", "a mapping of gate profile keys"]),
    ("schema", "rigfleet-stack/9", ["schema: 'rigfleet-stack/9'", "'rigfleet-stack/1'"]),
    ("entrypoint", _DELETE, ["entrypoint: missing", "the container entrypoint argv"]),
    # The throughput section (docs/bench.md).
    ("throughput", {"reference": {"narrative": -1}},
     ["throughput.reference.narrative: -1", "> 0"]),
    ("throughput", {"reference": {"prose": 1}}, ["throughput.reference.prose", "unknown key"]),
    # The tables (and so docs/stacks.md and the message) say the ranges the checks enforce
    ("gpus", {"count": 2, "memory_mib": 512}, ["gpus.memory_mib: 512", "1024..1000000"]),
    ("throughput", {"reference": {"narrative": 200000}},
     ["throughput.reference.narrative: 200000", "at most 100000"]),
    ("throughput", {"margin": 1.5}, ["throughput.margin: 1.5", "a fraction"]),
    ("throughput", {"cv_max": 0}, ["throughput.cv_max: 0", "a fraction"]),
    ("throughput", {"acceptance": {"reference": [0.9, 0.8]}},
     ["throughput.acceptance.reference", "3 fractions (one per draft position"]),
    ("throughput", {"acceptance": {"reference": [0.9, 0.8, 1.2]}},
     ["throughput.acceptance.reference"]),
    ("throughput", {"acceptance": {"reference": [0.9, 0.8, 0.7], "floor_ratio": 2}},
     ["throughput.acceptance.floor_ratio: 2"]),
    ("throughput", {"rate": 1},
     ["throughput.rate", "unknown key", "reference, margin, cv_max, acceptance"]),
]


@pytest.mark.parametrize(
    ("key", "value", "expected"), BAD, ids=[f"{b[0]}={b[1]!r}"[:40] for b in BAD]
)
def test_a_malformed_stack_file_is_refused_naming_file_key_value_and_allowed(
    tmp_path: Path, key: str, value: Any, expected: list[str]
) -> None:
    data = builtin("int8")
    _set(data, key, value)
    path = _write(tmp_path, "int8", data)
    with pytest.raises(CatalogError) as err:
        load_stack_file(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: "), msg
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_genesis_switches_must_name_a_known_generation_and_pinned_packages(tmp_path):
    data = copy.deepcopy(builtin("tq3-mtp-genesis"))
    data["genesis"]["switches"]["v9"] = {"on": ["P67_TQ_MULTI_QUERY_KERNEL"]}
    data["genesis"]["runtime_packages"] = ["xxhash"]
    data["genesis"]["switches"]["v12"]["off"].append("P87")
    with pytest.raises(CatalogError) as err:
        load_stack_file(_write(tmp_path, "tq3-mtp-genesis", data))
    msg = str(err.value)
    assert "genesis.switches.v9: 'v9' is not a Genesis generation rigfleet knows" in msg
    assert "genesis.runtime_packages[0]: 'xxhash'" in msg and "name==version" in msg
    assert "genesis.switches.v12.off: ['P87']" in msg and "is also on" in msg


def test_a_file_named_differently_from_its_stack_is_refused(tmp_path):
    with pytest.raises(CatalogError, match=r"name: 'int8' differs from the file's name"):
        load_stack_file(_write(tmp_path, "other", builtin("int8")))


def test_duplicate_keys_and_other_encodings_are_refused_with_the_line(tmp_path):
    text = (BUILTIN_DIR / "int8.yaml").read_text().replace("port: 8011", "port: 8011\nport: 8012")
    path = tmp_path / "int8.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=r"int8.yaml: line \d+: .*duplicate key 'port'"):
        load_stack_file(path)
    path.write_bytes((BUILTIN_DIR / "int8.yaml").read_bytes().replace(b"summary:", b"\xffsummary:"))
    with pytest.raises(CatalogError, match=r"int8.yaml: line \d+: byte 0xff is not UTF-8"):
        load_stack_file(path)



def test_an_unquoted_on_or_off_key_is_named_as_yamls_boolean(tmp_path):
    # YAML reads an unquoted on: as the key True: "genesis.switches.v7.True: True is an
    # unknown key; allowed: on, off", naming a key the file does not spell and refusing 'on'
    text = (BUILTIN_DIR / "tq3-mtp-genesis.yaml").read_text()
    assert '"on": [P58' in text and '"off": [P78' in text
    path = tmp_path / "tq3-mtp-genesis.yaml"
    path.write_text(text.replace('"on": [P58', "on: [P58", 1).replace('"off": [P78', "Off: [P78"))
    with pytest.raises(CatalogError) as err:
        load_stack_file(path)
    assert err.value.problems == [
        f"{path}: genesis.switches.v7.True: True is an unknown key (YAML reads an unquoted on "
        "as true: write \"on\"); allowed: on, off",
        f"{path}: genesis.switches.v7.False: False is an unknown key (YAML reads an unquoted "
        "off as false: write \"off\"); allowed: on, off"]


def test_a_users_stack_directory_extends_the_catalog(tmp_path):
    data = builtin("int8")
    data.update(name="int8-local", port=8031, summary="my copy of int8")
    _write(tmp_path, "int8-local", data)
    catalog = load_catalog([tmp_path])
    assert "int8-local" in catalog and "int8" in catalog
    assert catalog.get("int8-local").source == str(tmp_path / "int8-local.yaml")
    # Two stacks may not share a loopback port, nor a name.
    clash = {**data, "name": "clash", "port": 8011}
    _write(tmp_path, "clash", clash)
    with pytest.raises(CatalogError, match=r"clash.yaml: port: 8011 is stack int8's too"):
        load_catalog([tmp_path])


def _host_data(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    key = tmp_path / "api-key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o600)
    repo = {"url": "http://apt.example/debian", "key_url": "http://apt.example/k.asc",
            "suite": "stable", "components": ["main"]}
    return {"stack": "int8", "power_caps_w": 250, "model_dir": "/srv/models",
            "front_port": 8000, "api_key_file": str(key),
            "apt_repos": {"cuda": repo, "nvidia-container-toolkit": repo}, **changes}


def test_a_stack_needing_more_gpus_than_the_host_has_is_refused(tmp_path):
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", _host_data(tmp_path, gpu_count=1, power_caps_w=250))
    msg = str(err.value)
    assert "rig-a: gpu_count: 1 is too few for stack int8" in msg
    assert "tensor-parallel-size 2" in msg and "allowed: at least 2" in msg


def test_host_data_names_a_stack_from_its_own_stack_directory(tmp_path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    data = builtin("int8")
    data.update(name="mine", port=8032, summary="mine")
    _write(stacks, "mine", data)
    settings = validate_host("rig-a", _host_data(tmp_path, stack="mine", stacks_dir=str(stacks)))
    assert settings.spec.name == "mine" and settings.catalog.get("mine").port == 8032
    with pytest.raises(HostDataError, match=r"rig-a: stack: 'mine' is not a stack in the "
                                            r"catalog; allowed: int8, single-fp8-mtp, "
                                            r"tq3-mtp-genesis, tq3-nomtp, turbo"):
        validate_host("rig-a", _host_data(tmp_path, stack="mine"))


def test_version_order_puts_a_nightly_below_its_release():
    assert version_key("0.20.2rc1.dev9+g01d4d1ad3") < version_key("0.20.2") < version_key("0.21.0")
    assert version_key("0.27.1") > version_key("0.24.0") > version_key("0.22.0")
    spec = builtin_catalog().get("int8")
    assert spec.image.allows_version("0.27.1") and not spec.image.allows_version("0.21.0")


def test_the_image_rule_names_the_tag_kind_and_the_version_range():
    int8 = builtin_catalog().get("int8").image
    tq3 = builtin_catalog().get("tq3-mtp-genesis").image
    assert int8.problems("v0.27.1", "0.27.1") == []
    assert int8.problems("nightly-" + "a" * 40, "0.32.1rc1.dev761+gf090c8835") == [
        "is a nightly tag; the stack runs release tags"]
    assert int8.problems("v0.21.0", "0.21.0") == [
        "reports vLLM 0.21.0; the stack needs release tags, vLLM >= 0.22.0"]
    assert int8.problems("latest", "0.28.0") == [
        "is neither a release (vX.Y.Z) nor a nightly tag; the stack runs release tags"]
    assert tq3.problems("v0.21.0", "0.21.0") == []
    assert tq3.problems("v0.24.0", "0.24.0") == [
        "reports vLLM 0.24.0; the stack needs release tags or nightly tags, vLLM < 0.24.0"]
    assert tq3.problems("nightly-" + "b" * 40, "0.24.0rc1.dev3+gbbbbbbbbb") == []
    tq3 = builtin_catalog().get("tq3-mtp-genesis")
    assert tq3.image.allows_version("0.21.0") and not tq3.image.allows_version("0.24.0")


def test_an_entrypoint_with_a_bad_item_is_said_once(tmp_path):
    data = builtin("int8")
    data["entrypoint"] = ["vllm", "serve\n"]
    with pytest.raises(CatalogError) as err:
        load_stack_file(_write(tmp_path, "int8", data))
    assert "entrypoint[1]" in str(err.value) and "is empty" not in str(err.value)
    data["entrypoint"] = []
    with pytest.raises(CatalogError, match=r"entrypoint: \[\] is empty"):
        load_stack_file(_write(tmp_path, "int8", data))


def test_a_drain_section_without_timeout_takes_the_tables_default(tmp_path):
    data = builtin("int8")
    data["drain"] = {}
    assert load_stack_file(_write(tmp_path, "int8", data)).drain_timeout_s == float(
        BY_PATH["drain.timeout_s"].default)
    data["drain"] = {"timeout_s": 5}
    assert load_stack_file(_write(tmp_path, "int8", data)).drain_timeout_s == 5.0


def test_parse_stack_of_nothing_says_what_a_stack_file_is():
    with pytest.raises(CatalogError, match=r"x.yaml: top level: missing"):
        parse_stack(None, "x.yaml")


@pytest.mark.parametrize("value", [[], "", None])
def test_an_empty_genesis_model_arch_is_refused_not_dropped(tmp_path: Path, value: Any) -> None:
    """`model_arch: []` passed and was dropped: the stack then counted the key as unknown."""
    data = builtin("tq3-mtp-genesis")
    data["genesis"]["model"]["model_arch"] = value
    path = _write(tmp_path, "tq3-mtp-genesis", data)
    with pytest.raises(CatalogError) as err:
        load_stack_file(path)
    msg = str(err.value)
    said = "missing" if value is None else repr(value)
    assert f"{path}: genesis.model.model_arch: {said}" in msg, msg
    assert "allowed: a list of architecture names" in msg and "list of a list" not in msg, msg
