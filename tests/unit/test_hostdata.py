"""Host data validation, power caps against real cards, apt repos, the example inventory."""

from __future__ import annotations

import copy
import json
import os
import runpy
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rigfleet.aptrepos import AptRepo, nvidia_distro
from rigfleet.hostdata import HostDataError, check_caps_against_gpus, validate_host
from rigfleet.hostside.supervise import Policy
from rigfleet.validate import URL_ALLOWED

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "k" * 64
HF_TOKEN = "hf_" + "t" * 34

APT_REPOS = {
    "cuda": {
        "url": "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/",
        "key_url": "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/"
        "3bf863cc.pub",
        "suite": "/",
        "components": [],
        "key_fingerprint": "EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8 63CC",
    },
    "nvidia-container-toolkit": {
        "url": "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)",
        "key_url": "https://nvidia.github.io/libnvidia-container/gpgkey",
        "suite": "/",
    },
}


@pytest.fixture
def secrets(tmp_path: Path) -> dict[str, Path]:
    key = tmp_path / "api-key"
    key.write_text(API_KEY + "\n")
    key.chmod(0o600)
    token = tmp_path / "hf-token"
    token.write_text(HF_TOKEN)
    token.chmod(0o400)
    return {"api_key": key, "hf_token": token}


@pytest.fixture
def data(secrets: dict[str, Path]) -> dict[str, Any]:
    return {
        "ssh_hostname": "192.168.1.41",
        "stack": "tq3-mtp-genesis",
        "power_caps_w": [290, 280],
        "model_dir": "/srv/models",
        "front_port": 8000,
        "api_key_file": str(secrets["api_key"]),
        "apt_repos": copy.deepcopy(APT_REPOS),
        "pins_file": "pins.yaml",
    }


def test_good_data(data: dict[str, Any], secrets: dict[str, Path]) -> None:
    data["hf_token_file"] = str(secrets["hf_token"])
    data["docker_registry_mirror"] = "http://registry.lan:5000"
    data["pip_index_url"] = "https://pypi.lan/simple"
    data["hf_endpoint"] = "http://hub.rigfleet.test:8080"
    data["extra_env"] = {"int8": {"RIGFLEET_FAULT": "x", "N": 3}}
    s = validate_host("rig-a", data)
    assert s.name == "rig-a" and s.stack == "tq3-mtp-genesis"
    assert s.spec.port == 8015
    assert s.power_caps_w == (290, 280) and s.gpu_count == 2
    assert s.model_dir == "/srv/models" and s.front_port == 8000
    assert s.api_key_file == str(secrets["api_key"])
    assert s.hf_token_file == str(secrets["hf_token"])
    assert s.docker_registry_mirror == "http://registry.lan:5000"
    assert s.extra_env == {"int8": {"RIGFLEET_FAULT": "x", "N": "3"}}
    assert s.env_for("int8") == {"RIGFLEET_FAULT": "x", "N": "3"}
    assert s.env_for("tq3-mtp-genesis") == {}
    cuda = s.apt_repos["cuda"]
    assert cuda.flat and cuda.components == ()
    assert cuda.key_fingerprint == "EB693B3035CD5710E231E123A4B469963BF863CC"


def test_shipped_cuda_repository_has_debian13s_own_key(data: dict[str, Any]) -> None:
    """inventory/group_data/all.py: NVIDIA signs debian13 with 8793F200, the rest with
    3bf863cc; each host gets its distribution's repository and key."""
    data["apt_repos"] = runpy.run_path(str(REPO_ROOT / "inventory/group_data/all.py"))[
        "apt_repos"]
    cuda = validate_host("rig-a", data).apt_repos["cuda"]
    base = "https://developer.download.nvidia.com/compute/cuda/repos"
    got = {(os_id, version): cuda.expand(os_id=os_id, version_id=version, codename="x")
           for os_id, version in (("debian", "13"), ("debian", "12"), ("ubuntu", "24.04"),
                                  ("ubuntu", "22.04"))}
    new = got[("debian", "13")]
    assert (new.name, new.url, new.key_url, new.key_fingerprint, new.per_distro) == (
        "cuda", f"{base}/debian13/x86_64/", f"{base}/debian13/x86_64/8793F200.pub",
        "02182E60104FCDC26EAE1B8597A5D4CB8793F200", ())
    assert (new.suite, new.components) == ("/", ())
    for (os_id, version), repo in got.items():
        if (os_id, version) == ("debian", "13"):
            continue
        distro = nvidia_distro(os_id, version)
        assert (repo.url, repo.key_url, repo.key_fingerprint) == (
            f"{base}/{distro}/x86_64/", f"{base}/{distro}/x86_64/3bf863cc.pub",
            "EB693B3035CD5710E231E123A4B469963BF863CC")


def test_defaults_and_single_cap(data: dict[str, Any]) -> None:
    data["power_caps_w"] = 250
    del data["pins_file"]
    s = validate_host("rig-b", data)
    assert s.power_caps_w == (250, 250)
    assert s.pins_file == "pins.yaml" and s.gpu_count == 2
    assert s.hf_token_file is None and s.pip_index_url is None and s.extra_env == {}
    assert (s.swap.supervise_backoff_s, s.swap.supervise_limit, s.swap.supervise_window_s) \
        == (Policy.backoff_s, Policy.limit, Policy.window_s)


@pytest.mark.parametrize("backoff", [[1, 2.5], "1,2.5", (1, 2.5)])
def test_the_supervisors_policy_from_host_data(data: dict[str, Any], backoff: Any) -> None:
    data.update(supervise_backoff_s=backoff, supervise_limit=2, supervise_window_s=600)
    s = validate_host("rig-a", data)
    assert (s.swap.supervise_backoff_s, s.swap.supervise_limit, s.swap.supervise_window_s) \
        == ((1.0, 2.5), 2, 600.0)


def test_works_with_pyinfra_host_data(data: dict[str, Any]) -> None:
    from pyinfra.api.host import HostData

    group = {k: v for k, v in data.items() if k != "power_caps_w"}
    host_data = HostData("rig-a", {"power_caps_w": [300, 300]}, group)  # type: ignore[arg-type]
    s = validate_host("rig-a", host_data)
    assert s.power_caps_w == (300, 300) and s.stack == "tq3-mtp-genesis"
    host_data = HostData("rig-a", {"power_caps": [300, 300]}, data)  # type: ignore[arg-type]
    with pytest.raises(HostDataError, match=r"did you mean 'power_caps_w'"):
        validate_host("rig-a", host_data)


def _world_readable(path: Path) -> str:
    path.chmod(0o644)
    return str(path)


# (key, value or a function of the secrets fixture, strings the message must contain)
BAD_HOSTS: list[tuple[str, Any, list[str]]] = [
    ("stack", "fp8", ["rig-a: stack: 'fp8'", "not a stack",
                      "int8, single-fp8-mtp, tq3-mtp-genesis, tq3-nomtp, turbo"]),
    ("power_caps_w", "290", ["power_caps_w: '290'", "integer number of watts", "[290, 290]"]),
    ("power_caps_w", [290, 700], ["power_caps_w[1]: 700", "sane range", "50..600"]),
    ("power_caps_w", [290], ["power_caps_w: [290]", "has 1 cap(s) but gpu_count is 2"]),
    ("power_caps_w", [290, True], ["power_caps_w[1]: True", "whole number of watts"]),
    ("power_caps_w", [290.5, 290], ["power_caps_w[0]: 290.5", "whole number of watts"]),
    ("model_dir", "srv/models", ["model_dir: 'srv/models'", "absolute"]),
    ("model_dir", "/", ["model_dir: '/'", "other than '/'"]),
    ("model_dir", "/srv/../models", ["model_dir: '/srv/../models'", "normalised"]),
    ("model_dir", "/srv/models/", ["model_dir: '/srv/models/'", "normalised"]),
    ("model_dir", "/srv/a:b", ["model_dir: '/srv/a:b'", "without ':'"]),
    ("front_port", 8011, ["front_port: 8011", "stack int8's loopback port", "8015"]),
    ("front_port", 70000, ["front_port: 70000", "1..65535"]),
    ("front_port", "8000", ["front_port: '8000'", "1..65535"]),
    ("gpu_count", 1, ["gpu_count: 1", "too few for stack tq3-mtp-genesis", "at least 2"]),
    (
        "api_key_file",
        "/nonexistent/api-key",
        ["'/nonexistent/api-key'", "does not exist", "openssl rand -hex 32"],
    ),
    (
        "api_key_file",
        lambda s: _world_readable(s["api_key"]),
        ["api_key_file", "readable by others (mode 0644)", "chmod 600"],
    ),
    (
        "hf_token_file",
        lambda s: _world_readable(s["hf_token"]),
        ["hf_token_file", "readable by others", "chmod 600"],
    ),
    ("docker_registry_mirror", "ftp://mirror", ["'ftp://mirror'", "http:// or https://"]),
    ("pip_index_url", "pypi.lan/simple", ["pip_index_url: 'pypi.lan/simple'", "http://"]),
    ("hf_endpoint", "http://", ["hf_endpoint: 'http://'", "with a host"]),
    ("apt_repos", {"cuda": APT_REPOS["cuda"]}, ["apt_repos.nvidia-container-toolkit: missing"]),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "key_url": None}},
        ["apt_repos.cuda.key_url: missing"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "url": "https://x/{arch}/"}},
        ["apt_repos.cuda.url: 'https://x/{arch}/'", "unknown {arch}", "{distro}"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "key_url": "https://u:s3cret@x/{distro}.pub"}},
        ["apt_repos.cuda.key_url: 'https://***@x/{distro}.pub'", "carries credentials",
         "auth.conf.d"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "components": ["main"]}},
        ["apt_repos.cuda.components: ['main']", "flat repository", "[] with a flat suite"],
    ),
    (
        "apt_repos",
        {
            **APT_REPOS,
            "docker": {"url": "https://d/{id}", "key_url": "https://d/gpg", "suite": "{codename}"},
        },
        ["apt_repos.docker.components: []", "is not flat", "['main']"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "key_fingerprint": "3bf863cc"}},
        ["apt_repos.cuda.key_fingerprint: '3bf863cc'", "40 hex digits"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "Bad_Name": APT_REPOS["cuda"]},
        ["apt_repos.Bad_Name: 'Bad_Name'", "lowercase letters"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "per_distro": ["debian13"]}},
        ["apt_repos.cuda.per_distro: ['debian13']", "NVIDIA distribution name"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "per_distro": {"Debian 13": {}}}},
        ["apt_repos.cuda.per_distro.Debian 13: 'Debian 13'", "debian12, ubuntu2404"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"],
                               "per_distro": {"debian13": {"key_fingerprint": "8793F200"}}}},
        ["apt_repos.cuda.per_distro.debian13.key_fingerprint: '8793F200'", "40 hex digits"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "per_distro": {"debian13": {"key": "x"}}}},
        ["apt_repos.cuda.per_distro.debian13.key: 'key'", "is an unknown key"],
    ),
    ("extra_env", {"fp8": {"A": "1"}},
     ["extra_env.fp8: 'fp8'", "int8, single-fp8-mtp, tq3-mtp-genesis, tq3-nomtp, turbo"]),
    ("extra_env", {"int8": {"BAD-NAME": "1"}}, ["extra_env.int8.BAD-NAME", "environment name"]),
    ("extra_env", {"int8": {"FLAG": True}}, ["extra_env.int8.FLAG: True", "'1'/'0'"]),
    ("extra_env", ["A=1"], ["extra_env: ['A=1']", "a mapping stack -> {NAME: value}"]),
    ("power_cap_w", 290, ["power_cap_w", "did you mean 'power_caps_w'"]),
    ("stack", None, ["rig-a: stack: missing", "inventory/group_data/all.py"]),
    # Control characters, wherever a string goes (a file, a unit, an apt source, a shell, a URL)
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "url": "https://x/\ndeb http://evil/ /"}},
        ["rig-a: apt_repos.cuda.url: 'https://x/\\ndeb http://evil/ /' holds control "
         "characters", "allowed: printable text"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "cuda": {**APT_REPOS["cuda"], "suite": "/\x1b"}},
        ["apt_repos.cuda.suite: '/\\x1b' holds control characters"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "docker": {"url": "https://d/{id}", "key_url": "https://d/gpg",
                                 "suite": "{codename}", "components": ["stable\x00"]}},
        ["apt_repos.docker.components[0]: 'stable\\x00' holds control characters"],
    ),
    (
        "apt_repos",
        {**APT_REPOS, "docker": {"url": "https://d/{id}", "key_url": "https://d/gpg",
                                 "suite": "{codename}", "components": ["stable;rm"]}},
        ["apt_repos.docker.components: ['stable;rm']", "letters, digits and ._-/"],
    ),
    (
        "docker_registry_mirror",
        "http://mirror.lan:5000\r\n",
        ["docker_registry_mirror: 'http://mirror.lan:5000\\r\\n' holds control characters"],
    ),
    (
        "extra_env",
        {"int8": {"VLLM_LOGGING_LEVEL": "DEBUG\nVLLM_API_KEY=x"}},
        ["extra_env.int8.VLLM_LOGGING_LEVEL: 'DEBUG\\nVLLM_API_KEY=x' holds control"],
    ),
    ("pins_file", "pins\x07.yaml", ["pins_file: 'pins\\x07.yaml' holds control characters"]),
    ("hf_token_file", "/tmp/tok\n", ["hf_token_file: '/tmp/tok\\n' holds control characters"]),
    ("gate_set", ["soak_sessions=2\x1b"], ["gate_set[0]: 'soak_sessions=2\\x1b' holds control"]),
    ("stacks_dir", "/etc", ["stacks_dir: '/etc' is a system directory", "a directory of its own"]),
    # New keys
    ("adopt_foreign_driver", "maybe", ["adopt_foreign_driver: 'maybe' is not valid",
                                       "true or false"]),
    ("rigfleet_stop_on_preflight", 2, ["rigfleet_stop_on_preflight: 2", "--data KEY=1"]),
    ("front_tls_certfile", "/x.pem", ["front_tls_certfile", "did you mean 'front_tls_cert_file'"]),
    ("front_tls_cert_file", "/nonexistent.pem",
     ["front_tls_key_file: missing", "both front_tls_cert_file and front_tls_key_file"]),
    ("front_tls_ca_file", "/nonexistent.pem",
     ["front_tls_ca_file: '/nonexistent.pem' is set but the front has no certificate"]),
    # The supervisor's policy
    ("supervise_backoff_s", [], ["supervise_backoff_s: [] is not valid",
                                 "a non-empty list of seconds >= 0, e.g. [10, 30, 90]"]),
    ("supervise_backoff_s", [10, -1], ["supervise_backoff_s: [10, -1]", "seconds >= 0"]),
    ("supervise_backoff_s", "10,soon", ["supervise_backoff_s: '10,soon'", "seconds >= 0"]),
    ("supervise_backoff_s", [1, True], ["supervise_backoff_s: [1, True]", "seconds >= 0"]),
    # The table (docs/hostdata.md and the message) says the upper bound the check enforces
    ("throughput_scale", 2e6, ["throughput_scale: 2000000.0", "a number > 0, at most 1000000"]),
    ("supervise_limit", 0, ["supervise_limit: 0 is not valid", "an integer 1..100"]),
    ("supervise_limit", 2.5, ["supervise_limit: 2.5", "an integer 1..100"]),
    ("supervise_window_s", 0, ["supervise_window_s: 0 is not valid", "seconds > 0"]),
    ("supervise_windows_s", 60, ["supervise_windows_s", "did you mean 'supervise_window_s'"]),
]


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    BAD_HOSTS,
    ids=[f"{b[0]}={'<computed>' if callable(b[1]) else repr(b[1])}"[:40] for b in BAD_HOSTS],
)
def test_bad_host_data_is_refused_with_a_precise_message(
    data: dict[str, Any], secrets: dict[str, Path], key: str, value: Any, expected: list[str]
) -> None:
    data[key] = value(secrets) if callable(value) else value
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    msg = str(err.value)
    assert msg.startswith("rig-a: "), msg
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "is empty"),
        ("\n\n", "is empty"),
        ("short", "holds only 5 characters"),
        ("two words-but-long-enough", "whitespace or control characters"),
        ("long-enough-key-but-with-a!", "holds characters outside the allowed set"),
    ],
)
def test_bad_api_key_content_is_described_not_shown(
    data: dict[str, Any], secrets: dict[str, Path], content: str, expected: str
) -> None:
    secrets["api_key"].write_text(content)
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    msg = str(err.value)
    assert expected in msg and "api_key_file" in msg
    if content.strip():
        assert content.strip() not in msg  # the secret never appears


def test_secret_content_never_in_messages(data: dict[str, Any], secrets: dict[str, Path]) -> None:
    secrets["api_key"].chmod(0o640)
    data["hf_token_file"] = _world_readable(secrets["hf_token"])
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert API_KEY not in str(err.value) and HF_TOKEN not in str(err.value)


def test_tilde_is_expanded(data: dict[str, Any], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    data["api_key_file"] = "~/api-key"
    assert validate_host("rig-a", data).api_key_file == str(tmp_path / "api-key")


def test_all_problems_at_once(data: dict[str, Any]) -> None:
    data.update(stack="fp8", front_port=0, model_dir="rel")
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    keys = [line.split(": ")[1] for line in err.value.problems]
    assert keys == ["stack", "model_dir", "front_port"]


# ---------------------------------------------------------------------------------------------
# caps against the real cards


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str | None
    power_min_limit_w: float | None
    power_max_limit_w: float | None


RTX3090 = "NVIDIA GeForce RTX 3090"


def test_caps_within_card_limits_pass() -> None:
    check_caps_against_gpus(
        "rig-a", (290, 350), [Gpu(1, RTX3090, 100, 350), Gpu(0, RTX3090, 100, 350)]
    )
    check_caps_against_gpus("rig-a", (100,), [Gpu(0, None, 100.0, 350.0)])


def test_cap_outside_card_range_names_card_and_range() -> None:
    gpus = [Gpu(0, RTX3090, 100, 350), Gpu(1, RTX3090, 100, 370)]
    with pytest.raises(HostDataError) as err:
        check_caps_against_gpus("rig-a", (400, 360), gpus)
    assert err.value.problems == [
        f"rig-a: power_caps_w[0]: 400 W is outside card 0 ({RTX3090})'s range; allowed: 100..350 W",
    ]
    with pytest.raises(HostDataError, match=r"power_caps_w\[0\]: 90 W .* allowed: 100..350 W"):
        check_caps_against_gpus("rig-b", [90], [Gpu(0, None, 100.0, 350.0)])


def test_cap_count_must_match_cards() -> None:
    with pytest.raises(HostDataError) as err:
        check_caps_against_gpus("rig-a", (290, 290), [Gpu(0, RTX3090, 100, 350)])
    msg = str(err.value)
    assert "rig-a: power_caps_w: [290, 290] has 2 cap(s) but the host has 1 GPU(s)" in msg
    assert "indexes: 0" in msg and "one cap per card" in msg


def test_card_without_power_limits() -> None:
    with pytest.raises(HostDataError, match=r"card 0 .* reports no power limit range"):
        check_caps_against_gpus("rig-a", (290,), [Gpu(0, RTX3090, None, None)])


def test_apt_repo_credentials_are_refused_and_never_shown(data: dict[str, Any]) -> None:
    data["apt_repos"] = {**APT_REPOS, "cuda": {**APT_REPOS["cuda"],
                                               "url": "https://me:s3cret@apt.lan/{distro}/"}}
    with pytest.raises(HostDataError, match=r"apt_repos.cuda.url: 'https://\*\*\*@apt") as err:
        validate_host("rig-a", data)
    assert "s3cret" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# apt repos per distro


@pytest.mark.parametrize(
    ("os_id", "version", "codename", "distro"),
    [
        ("ubuntu", "22.04", "jammy", "ubuntu2204"),
        ("ubuntu", "24.04", "noble", "ubuntu2404"),
        ("debian", "12", "bookworm", "debian12"),
        ("debian", "13", "trixie", "debian13"),
    ],
)
def test_apt_repo_expansion(os_id: str, version: str, codename: str, distro: str) -> None:
    assert nvidia_distro(os_id, version) == distro
    cuda = AptRepo(
        "cuda",
        "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/",
        "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/3bf863cc.pub",
        "/",
    ).expand(os_id=os_id, version_id=version, codename=codename)
    assert (cuda.url, cuda.suite, cuda.components) == (
        f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/", "/", ())
    assert cuda.key_url.endswith(f"/{distro}/x86_64/3bf863cc.pub")
    docker = AptRepo(
        "docker",
        "https://download.docker.com/linux/{id}",
        "https://download.docker.com/linux/{id}/gpg",
        "{codename}",
        ("stable",),
    ).expand(os_id=os_id, version_id=version, codename=codename)
    assert (docker.url, docker.suite, docker.components) == (
        f"https://download.docker.com/linux/{os_id}", codename, ("stable",))
    toolkit = AptRepo(
        "nvidia-container-toolkit",
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)",
        "https://nvidia.github.io/libnvidia-container/gpgkey",
        "/",
    ).expand(os_id=os_id, version_id=version, codename=codename)
    assert toolkit.url.endswith("/deb/$(ARCH)")  # apt's own variable, left alone


# ---------------------------------------------------------------------------------------------
# the example inventory


# pyinfra_cli monkey-patches the process with gevent on import (it breaks other tests), so the
# inventory is loaded the way the CLI does it, in a child process.
_LOAD_INVENTORY = """
import json, sys
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory
from rigfleet.hostdata import validate_host

with ctx_state.use(State()):
    inventory = make_inventory(sys.argv[1], cwd=sys.argv[2])
out = {"groups": {g: sorted(h.name for h in inventory.get_group(g))
                  for g in ("gpu_hosts", "canary", "home")}, "hosts": {}}
for h in inventory:
    s = validate_host(h.name, h.data)
    out["hosts"][h.name] = {
        "stack": s.stack, "caps": list(s.power_caps_w), "model_dir": s.model_dir,
        "front_port": s.front_port, "pins_file": s.pins_file, "gpu_count": s.gpu_count,
        "api_key_file": s.api_key_file, "apt_repos": sorted(s.apt_repos),
        "ssh_hostname": h.data.get("ssh_hostname"),
        "strict": h.data.get("ssh_strict_host_key_checking"),
    }
print(json.dumps(out))
"""


def test_example_inventory_validates(tmp_path: Path) -> None:
    key = tmp_path / ".config" / "rigfleet" / "api-key"
    key.parent.mkdir(parents=True)
    key.write_text(API_KEY)
    key.chmod(0o600)
    env = {**os.environ, "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_INVENTORY, str(REPO_ROOT / "inventory" / "home.py"),
         str(REPO_ROOT)],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["groups"] == {
        "gpu_hosts": ["rig-a", "rig-b"], "canary": ["rig-a"], "home": ["rig-a", "rig-b"]
    }  # fmt: skip
    a, b = out["hosts"]["rig-a"], out["hosts"]["rig-b"]
    assert (a["stack"], a["caps"], a["model_dir"]) == ("tq3-mtp-genesis", [290, 290], "/srv/models")
    assert (b["stack"], b["caps"], b["model_dir"]) == ("int8", [250, 250], "/data/models")
    assert (a["ssh_hostname"], b["ssh_hostname"]) == ("192.168.1.41", "192.168.1.42")
    for s in (a, b):
        assert (s["front_port"], s["pins_file"], s["gpu_count"]) == (8000, "pins.yaml", 2)
        assert s["api_key_file"] == str(key) and s["strict"] == "yes"
        assert s["apt_repos"] == ["cuda", "docker", "nvidia-container-toolkit"]


# ---------------------------------------------------------------------------------------------
# stacks_dir entries, TLS, flags


def test_a_stack_file_linking_outside_stacks_dir_is_refused(
        data: dict[str, Any], tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    secret = tmp_path / "elsewhere.yaml"
    secret.write_text("not: a stack\n")
    (stacks / "evil.yaml").symlink_to(secret)
    data["stacks_dir"] = str(stacks)
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert f"rig-a: stacks_dir: evil.yaml: '{stacks}/evil.yaml' leads outside the directory " \
           f"(to '{secret}'); allowed: stack files inside '{stacks}'" in str(err.value)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """Certificates as openssl makes them: self-signed, a CA and a leaf it signed, another
    key, an encrypted key."""
    import shutil

    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed here")
    d = tmp_path_factory.mktemp("pki")

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=rig-a",
        "-keyout", "self.key", "-out", "self.crt")
    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=ca",
        "-keyout", "ca.key", "-out", "ca.crt")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=rig-b", "-keyout", "leaf.key",
        "-out", "leaf.csr")
    ssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "30", "-out", "leaf.crt")
    ssl("genpkey", "-algorithm", "RSA", "-out", "other.key")
    ssl("pkey", "-in", "self.key", "-aes256", "-passout", "pass:x", "-out", "enc.key")
    for key in d.glob("*.key"):
        key.chmod(0o600)
    return {p.stem + p.suffix.replace(".", "_"): p for p in d.iterdir()}


def test_front_tls_self_signed(data: dict[str, Any], pki: dict[str, Path]) -> None:
    data.update(front_tls_cert_file=str(pki["self_crt"]), front_tls_key_file=str(pki["self_key"]))
    s = validate_host("rig-a", data)
    assert s.front_tls is not None and s.front_scheme == "https"
    assert s.front_tls.ca_file == s.front_tls.cert_file == str(pki["self_crt"])


def test_front_tls_signed_by_a_ca(data: dict[str, Any], pki: dict[str, Path]) -> None:
    data.update(front_tls_cert_file=str(pki["leaf_crt"]), front_tls_key_file=str(pki["leaf_key"]),
                front_tls_ca_file=str(pki["ca_crt"]), front_url="https://rig-b.lan:8000")
    s = validate_host("rig-a", data)
    assert s.front_tls is not None and s.front_tls.ca_file == str(pki["ca_crt"])
    # Without the CA the leaf itself is what clients trust (pinned; a partial chain).
    del data["front_tls_ca_file"]
    pinned = validate_host("rig-a", data).front_tls
    assert pinned is not None and pinned.ca_file == str(pki["leaf_crt"])


BAD_TLS = [
    ({"front_tls_key_file": "other_key"},
     ["front_tls_key_file", "does not load with the certificate (KEY_VALUES_MISMATCH",
      "the private key that belongs to front_tls_cert_file"]),
    ({"front_tls_key_file": "enc_key"},
     ["front_tls_key_file", "is an encrypted key", "nginx cannot ask for a passphrase"]),
    ({"front_tls_cert_file": "/nonexistent/front.crt"},
     ["front_tls_cert_file: '/nonexistent/front.crt' does not exist", "a readable PEM file"]),
    ({"front_tls_cert_file": "leaf_crt", "front_tls_key_file": "leaf_key",
      "front_tls_ca_file": "self_crt"},
     ["front_tls_ca_file", "does not verify the front's certificate"]),
    ({"front_tls_cert_file": "self_key"},
     ["front_tls_cert_file", "is not a PEM certificate", "'-----BEGIN CERTIFICATE"]),
    ({"front_url": "http://rig-a.lan:8000"},
     ["front_url: 'http://rig-a.lan:8000' is plain HTTP, but the front serves TLS"]),
]


@pytest.mark.parametrize(("change", "expected"), BAD_TLS,
                         ids=[",".join(f"{k}={v}" for k, v in c.items()) for c, _ in BAD_TLS])
def test_bad_front_tls_is_refused(data: dict[str, Any], pki: dict[str, Path],
                                  change: dict[str, str], expected: list[str]) -> None:
    data.update(front_tls_cert_file=str(pki["self_crt"]), front_tls_key_file=str(pki["self_key"]))
    data.update({k: str(pki[v]) if v in pki else v for k, v in change.items()})
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    msg = str(err.value)
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"
    assert "PRIVATE KEY" not in msg and pki["self_key"].read_text().splitlines()[1] not in msg


def test_front_tls_key_readable_by_others(data: dict[str, Any], pki: dict[str, Path],
                                          tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    key.write_bytes(pki["self_key"].read_bytes())
    key.chmod(0o644)
    data.update(front_tls_cert_file=str(pki["self_crt"]), front_tls_key_file=str(key))
    with pytest.raises(HostDataError, match=r"front_tls_key_file: .* is readable by others "
                                            r"\(mode 0644\); allowed: mode 0600 or stricter"):
        validate_host("rig-a", data)


def test_a_fifo_or_a_missing_file_is_named_not_read(data: dict[str, Any], pki: dict[str, Path],
                                                   tmp_path: Path) -> None:
    """A FIFO given as a TLS or CA file blocked `rigfleet check` and the deploy on its read
    (only the secret and Alertmanager files were checked to be regular files first), and a
    site_ca_files entry was "not a readable PEM certificate" whatever the reason."""
    import signal

    fifo = tmp_path / "cert.fifo"
    os.mkfifo(fifo)
    data.update(front_tls_cert_file=str(fifo), front_tls_key_file=str(pki["self_key"]),
                site_ca_files=[str(fifo), str(tmp_path / "none.pem")])

    class Hung(BaseException):  # not an OSError: the readers never catch it
        pass

    def hung(*_: Any) -> None:
        raise Hung("blocked reading the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 5)
    try:
        with pytest.raises(HostDataError) as err:
            validate_host("rig-a", data)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    msg = str(err.value)
    assert f"front_tls_cert_file: {str(fifo)!r} is not a regular file; allowed: a readable" in msg
    assert f"site_ca_files[0]: {str(fifo)!r} is not a regular file" in msg
    assert f"site_ca_files[1]: {str(tmp_path / 'none.pem')!r} does not exist" in msg


@pytest.mark.parametrize(("value", "expected"), [
    (True, True), (False, False), (1, True), (0, False), ("1", True), ("yes", True),
    ("true", True), ("0", False), ("no", False), ("", False), (None, False)])
def test_stop_on_preflight_reads_data_leniently(value: Any, expected: bool, monkeypatch) -> None:
    from rigfleet.hostdata import stop_on_preflight

    monkeypatch.delenv("RIGFLEET_STOP_ON_PREFLIGHT", raising=False)
    assert stop_on_preflight({"rigfleet_stop_on_preflight": value}) is expected
    monkeypatch.setenv("RIGFLEET_STOP_ON_PREFLIGHT", "1")
    assert stop_on_preflight({}) is True


def test_flags_are_settings(data: dict[str, Any]) -> None:
    data.update(adopt_foreign_driver="yes", rigfleet_stop_on_preflight=1)
    from rigfleet.hostdata import stop_on_preflight

    s = validate_host("rig-a", data)
    assert s.adopt_foreign_driver is True and stop_on_preflight(data) is True
    assert validate_host("rig-a", {**data, "adopt_foreign_driver": False}).adopt_foreign_driver \
        is False


# ---------------------------------------------------------------------------------------------
# GPU count and card memory (the preflight's check once the driver answers)


@dataclass(frozen=True)
class Card:
    index: int
    memory_total_mib: int
    name: str = RTX3090


def test_gpu_count_and_memory(data: dict[str, Any]) -> None:
    from dataclasses import replace

    from rigfleet.hostdata import check_gpus

    spec = validate_host("rig-a", data).spec
    assert check_gpus("rig-a", 2, spec, [Card(0, 24576), Card(1, 24576)]) == []
    [count] = check_gpus("rig-a", 2, spec, [Card(1, 24576)])
    assert count.startswith("rig-a: gpu_count: 2 but nvidia-smi lists 1 GPU(s) (indexes: 1); "
                            "allowed: gpu_count set to the cards the host has")
    big = replace(spec, gpu_memory_mib=32768, source="stacks/big.yaml")
    problems = check_gpus("rig-a", 2, big, [Card(0, 24576), Card(1, 40960)])
    assert problems == [
        f"rig-a: stack: {spec.name!r} needs 32768 MiB per card (gpus.memory_mib in "
        f"stacks/big.yaml) but card 0 ({RTX3090}) has 24576 MiB; allowed: a stack whose "
        "cards fit, or cards with enough memory"]


@pytest.mark.parametrize("key", ["runtime_pip_index_url", "pip_index_url",
                                 "docker_registry_mirror"])
def test_a_url_with_credentials_is_refused_without_showing_them(
    data: dict[str, Any], key: str
) -> None:
    data[key] = "https://build:s3cret-pass@pypi.lan:3141/simple/"
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    msg = str(err.value)
    assert msg == (f"rig-a: {key}: 'https://***@pypi.lan:3141/simple/' carries credentials "
                   "(user:password@); allowed: a URL without credentials (an index or mirror "
                   "on the LAN that needs none)")
    assert "s3cret" not in msg and "build" not in msg


def test_a_genesis_url_with_a_password_is_refused_without_showing_it(
    data: dict[str, Any]
) -> None:
    data["bump_genesis_url"] = "https://me:ghp_s3cret@git.lan/genesis.git"
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    msg = str(err.value)
    assert msg.startswith("rig-a: bump_genesis_url: 'https://***@git.lan/genesis.git' carries "
                          "a password (user:password@); allowed: a git URL without a password")
    assert "s3cret" not in msg
    data["bump_genesis_url"] = "ssh://git@git.lan:2222/genesis.git"  # a user alone: SSH's
    assert validate_host("rig-a", data).bump_genesis_url == data["bump_genesis_url"]


@pytest.mark.parametrize("url", ["http://[mirror.lan:5000", "http://mirror.lan:99999",
                                 "http://mirror.lan:port", "http://mirror.lan:0"])
@pytest.mark.parametrize("key", ["docker_registry_mirror", "pip_index_url", "front_url"])
def test_a_url_with_a_broken_host_or_port_is_refused_by_name(
    data: dict[str, Any], key: str, url: str
) -> None:
    # urlsplit raised ValueError (a traceback) for '[', and a bad port passed silently
    data[key] = url
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert str(err.value) == f"rig-a: {key}: {url!r} is not valid; allowed: {URL_ALLOWED}"


@pytest.mark.parametrize("url", ["https://[developer.download.nvidia.com/",
                                 "https://developer.download.nvidia.com:99999/"])
def test_an_apt_url_with_a_broken_host_or_port_is_refused_by_name(
    data: dict[str, Any], url: str
) -> None:
    data["apt_repos"]["cuda"]["url"] = url
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert str(err.value).startswith(f"rig-a: apt_repos.cuda.url: {url!r} is not valid; allowed:")


@pytest.mark.parametrize("value", [10**400, float("inf")])
@pytest.mark.parametrize("key", ["ready_timeout_s", "gate_timeout_s", "supervise_window_s"])
def test_seconds_too_big_for_a_float_or_infinite_are_refused_by_name(
    data: dict[str, Any], key: str, value: Any
) -> None:
    # 10**400 escaped as OverflowError (float() of it); inf passed as "seconds > 0"
    data[key] = value
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert str(err.value).startswith(f"rig-a: {key}: ")
    assert "is not valid; allowed: seconds > 0" in str(err.value)


def test_a_backoff_too_big_for_a_float_is_refused_by_name(data: dict[str, Any]) -> None:
    # math.isfinite(10**400) raised OverflowError: a traceback instead of the key's message
    data["supervise_backoff_s"] = [10, 10**400]
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert str(err.value).startswith("rig-a: supervise_backoff_s: [10, 1000")
    assert "is not valid; allowed: a non-empty list of seconds >= 0" in str(err.value)


def test_a_stacks_dir_that_cannot_be_looked_at_is_refused_by_name(data: dict[str, Any]) -> None:
    # Path.is_dir() raised OSError (ENAMETOOLONG here, EACCES for a parent it may not search)
    data["stacks_dir"] = "s" * 300
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert str(err.value).startswith("rig-a: stacks_dir: 'sss")
    assert "cannot be read (File name too long); allowed: a directory of stack files" in str(
        err.value)


@pytest.mark.parametrize("content", ["k" * 16 + "!", "k" * 16 + "\"", "k" * 16 + "$x",
                                     "k" * 16 + "._~+/=-", "hf_" + "A1" * 10])
def test_check_and_deploy_read_api_keys_by_one_rule(
    data: dict[str, Any], secrets: dict[str, Path], content: str
) -> None:
    """A key `rigfleet check` passes is one the deploy reads, and the other way round."""
    from roles.preflight import PreflightError, read_secret

    secrets["api_key"].write_text(content + "\n")
    try:
        validate_host("rig-a", data)
        checked = True
    except HostDataError as e:
        assert "api_key_file" in str(e) and content not in str(e)
        checked = False
    try:
        read_secret("rig-a", "api_key_file", str(secrets["api_key"]))
        read = True
    except PreflightError:
        read = False
    assert checked == read, content


@pytest.mark.parametrize("stacks", [None, ["tq3-mtp-genesis"]])
def test_an_invalid_gpu_count_is_the_only_message(data: dict[str, Any], stacks: Any) -> None:
    # gpu_count '4' (a string, as --data gives it) was read as 2 by the keys after it:
    # "power_caps_w: [...] has 4 cap(s) but gpu_count is 2", a count the data does not say
    data.update(gpu_count="4", power_caps_w=[290, 290, 290, 290], stacks=stacks)
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert err.value.problems == ["rig-a: gpu_count: '4' is not valid; allowed: an integer "
                                  "1..16 (the host's number of GPUs)"]


@pytest.mark.parametrize("url", ["https://x/{distro!z}/", "https://x/{id:d}/"])
def test_an_apt_url_placeholder_with_a_conversion_or_format_is_refused_by_name(
    data: dict[str, Any], url: str
) -> None:
    # str.format raised ValueError ("Unknown conversion specifier z"), naming no host or key
    data["apt_repos"]["cuda"]["url"] = url
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert str(err.value).startswith(f"rig-a: apt_repos.cuda.url: {url!r} uses ")
    assert "allowed: placeholders {id} (" in str(err.value)


def test_an_invalid_peer_port_beside_a_missing_front_port_is_not_called_the_same_port(
        data: dict[str, Any]) -> None:
    # both unusable (None): "peer_port: None is this host's front_port too"
    del data["front_port"]
    data["peer_port"] = "8082"
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert [line.partition(":")[2].partition(":")[0] for line in err.value.problems] == [
        " front_port", " peer_port"]
    assert "front_port too" not in str(err.value)


def test_a_peer_port_that_is_a_stacks_loopback_port_is_refused(data: dict[str, Any]) -> None:
    # The peer server listens on every address: on 8011 it and int8's container (127.0.0.1:8011)
    # cannot both bind, and its start-up probe of 127.0.0.1:8011 would take vLLM for it
    data["peer_port"] = 8011
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    assert str(err.value).startswith(
        "rig-a: peer_port: 8011 is stack int8's loopback port; allowed: a TCP port 1..65535 "
        "other than front_port and the stacks' loopback ports 8011 (int8), ")
