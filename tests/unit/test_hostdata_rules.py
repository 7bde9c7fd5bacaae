"""Host data from one table (KEYS: checks, typo hints, defaults, docs/hostdata.md), and the
rules on what may reach a host: no secrets in extra_env, no TLS balancer in front of plain
fronts by accident, no crafted host name in haproxy.cfg, model_dir a directory of its own."""

from __future__ import annotations

import posixpath
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from balancer_helpers import gpu_data, key_file, tls_files

from rigfleet.balancer.haproxy import render_config
from rigfleet.balancer.plan import BalancerError, GpuHost, plan_balancer
from rigfleet.hostchecks import _NOT_INSIDE, REQUIRED, HostChecker
from rigfleet.hostdata import (
    GROUPS,
    KEYS,
    HostDataError,
    SwapSettings,
    render_doc,
    validate_balancer,
    validate_host,
)
from rigfleet.hostside.plan import Plan
from rigfleet.validate import SYSTEM_DIRS, secret_like

REPO_ROOT = Path(__file__).resolve().parents[2]


def problems(tmp_path: Path, **extra: Any) -> list[str]:
    """The problems of a GPU host's otherwise good data with ``extra`` (empty: it validates)."""
    try:
        validate_host("rig-a", gpu_data(key_file(tmp_path), **extra))
    except HostDataError as e:
        return e.problems
    return []


# --- the table ----------------------------------------------------------------------------------


def test_docs_hostdata_md_is_the_table() -> None:
    text = (REPO_ROOT / "docs" / "hostdata.md").read_text(encoding="utf-8")
    assert text == render_doc(text), (
        "docs/hostdata.md differs from KEYS: python -m rigfleet.hostdata docs/hostdata.md")
    for key in KEYS.values():
        assert key.allowed and key.doc and key.group in GROUPS, key.name
        assert f"| `{key.name}` |" in text


def test_the_defaults_are_the_tables(tmp_path: Path) -> None:
    s = validate_host("rig-a", gpu_data(key_file(tmp_path)))
    for name in ("gpu_count", "pins_file", "throughput_scale", "extra_env",
                 "adopt_foreign_driver", "front_url", "hf_token_file"):
        assert getattr(s, name) == KEYS[name].default, name
    for name in ("gate_profile", "ready_timeout_s", "gate_timeout_s", "supervise_backoff_s",
                 "supervise_limit", "supervise_window_s"):
        assert getattr(s.swap, name) == KEYS[name].default, name
    assert s.swap.gate_set == KEYS["gate_set"].default and s.swap.drain_timeout_s is None
    b = validate_balancer("lb1", {"api_key_file": str(key_file(tmp_path))})
    assert (b.port, b.check_interval_s, b.retry_buffer_kib, b.plain_fronts) == tuple(
        KEYS[k].default for k in ("balancer_port", "balancer_check_interval_s",
                                  "balancer_retry_buffer_kib", "balancer_plain_fronts"))
    # The transaction's time limits: one place (the host-side plan), the same on both sides.
    plan = {f.name: f.default for f in fields(Plan)}
    swap = SwapSettings()
    for name in ("ready_timeout_s", "vram_timeout_s", "gate_timeout_s", "retry_after_s"):
        assert getattr(swap, name) == plan[name], name
    assert KEYS["ready_timeout_s"].default == plan["ready_timeout_s"]
    assert KEYS["gate_timeout_s"].default == plan["gate_timeout_s"]


# ``os`` is too short for a typo hint: one letter off is a third of the name.
@pytest.mark.parametrize("name", [k for k in KEYS if k + "s" not in KEYS
                                  and not k.startswith("ssh_") and len(k) > 2])
def test_every_key_has_its_typo_hint(tmp_path: Path, name: str) -> None:
    found = problems(tmp_path, **{name + "s": 1})
    assert f"rig-a: {name}s: '{name}s' is not a rigfleet key (did you mean '{name}'?); " \
           f"allowed: '{name}'" in found


def test_every_required_key_is_named_when_missing(tmp_path: Path) -> None:
    data = {k: v for k, v in gpu_data(key_file(tmp_path)).items()
            if KEYS[k].default is not REQUIRED}
    with pytest.raises(HostDataError) as err:
        validate_host("rig-a", data)
    required = [k.name for k in KEYS.values() if k.default is REQUIRED and k.on != "balancer"]
    assert err.value.problems == [
        f"rig-a: {k}: missing; set it in inventory/group_data/all.py (fleet default) or in the "
        "host's data" for k in required]


# --- no secrets in extra_env ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["VLLM_API_KEY", "HF_TOKEN", "hf_token",
                                  "HUGGING_FACE_HUB_TOKEN", "S3_SECRET", "DB_PASSWORD",
                                  "password_file", "Openai_Api_Key"])
def test_a_secret_looking_name_is_refused_in_extra_env(tmp_path: Path, name: str) -> None:
    found = problems(tmp_path, extra_env={"int8": {name: "s3cret-value-1234"}})
    assert found == [
        f"rig-a: extra_env.int8.{name}: {name!r} looks like a secret's name (extra_env is "
        "written to the stack's compose file, which every user of the host can read); "
        "allowed: a name that does not look like a secret's (*_KEY, *_TOKEN, *_SECRET, "
        "*PASSWORD*); secrets reach hosts only as root-only files in /etc/rigfleet/secrets: "
        "the API key from host data api_key_file (the stacks read VLLM_API_KEY from "
        "/etc/rigfleet/secrets/vllm.env), a Hugging Face token from host data hf_token_file "
        "(/etc/rigfleet/secrets/hf-token)"]
    assert "s3cret" not in found[0]


@pytest.mark.parametrize(("name", "secret"), [
    ("VLLM_API_KEY", True), ("my_token", True), ("X_Secret", True), ("PGPASSWORD", True),
    ("SIM_TOKENS_PER_SECOND", False), ("GENESIS_PREALLOC_TOKEN_BUDGET", False),
    ("KEYBOARD", False), ("KEY_ROTATION", False), ("VLLM_LOGGING_LEVEL", False),
    ("MAX_TOKENS", False)])
def test_secret_like(name: str, secret: bool) -> None:
    assert secret_like(name) is secret


def test_other_names_pass(tmp_path: Path) -> None:
    env = {"SIM_TOKENS_PER_SECOND": "40", "GENESIS_PREALLOC_TOKEN_BUDGET": 1}
    assert problems(tmp_path, extra_env={"int8": env}) == []


# --- a TLS balancer in front of plain fronts ----------------------------------------------------


def cert(tmp_path: Path, name: str) -> dict[str, str]:
    crt, key = tls_files(tmp_path, name)
    return {"cert": str(crt), "key": str(key)}


def host(tmp_path: Path, name: str, tls: bool = False) -> GpuHost:
    extra: dict[str, Any] = {"balancer_front_address": f"{name}.lan"}
    if tls:
        c = cert(tmp_path, f"{name}.lan")
        extra.update(front_tls_cert_file=c["cert"], front_tls_key_file=c["key"])
    return GpuHost(name, validate_host(name, gpu_data(key_file(tmp_path), **extra)))


def balancer(tmp_path: Path, tls: bool, **extra: Any):
    data: dict[str, Any] = {"api_key_file": str(key_file(tmp_path)), **extra}
    if tls:
        c = cert(tmp_path, "lb1")
        data.update(balancer_tls_cert_file=c["cert"], balancer_tls_key_file=c["key"])
    return validate_balancer("lb1", data)


def test_a_tls_balancer_in_front_of_plain_fronts_is_refused(tmp_path: Path) -> None:
    hosts = [host(tmp_path, "rig-a"), host(tmp_path, "rig-b", tls=True), host(tmp_path, "rig-c")]
    with pytest.raises(BalancerError) as err:
        plan_balancer("lb1", balancer(tmp_path, tls=True), hosts)
    assert str(err.value) == (
        "lb1: balancer_plain_fronts: False, but lb1 serves HTTPS (balancer_tls_cert_file) in "
        "front of GPU host(s) rig-a, rig-c serving plain HTTP: the API key clients send would "
        "cross the LAN in clear from lb1 to them; allowed: TLS on those fronts "
        "(front_tls_cert_file and front_tls_key_file in their data), or balancer_plain_fronts: "
        "True in lb1's data (the LAN between them is trusted, on purpose)")


@pytest.mark.parametrize("said", [True, "1", "yes"])
def test_plain_fronts_behind_tls_when_the_inventory_says_so(tmp_path: Path, said: Any) -> None:
    settings = balancer(tmp_path, tls=True, balancer_plain_fronts=said)
    plan = plan_balancer("lb1", settings, [host(tmp_path, "rig-a")])
    assert "server rig-a rig-a.lan:8000 check\n" in render_config(plan)


def test_tls_fronts_or_a_plain_balancer_need_nothing(tmp_path: Path) -> None:
    plan_balancer("lb1", balancer(tmp_path, tls=True), [host(tmp_path, "rig-a", tls=True)])
    plan_balancer("lb1", balancer(tmp_path, tls=False), [host(tmp_path, "rig-a")])


def test_balancer_plain_fronts_is_a_flag(tmp_path: Path) -> None:
    with pytest.raises(HostDataError, match=r"^lb1: balancer_plain_fronts: 'maybe' is not "
                       r"valid; allowed: true or false \(on the command line: --data KEY=1\)$"):
        balancer(tmp_path, tls=False, balancer_plain_fronts="maybe")


# --- host names that reach haproxy.cfg ----------------------------------------------------------


@pytest.mark.parametrize(("value", "what"), [
    ("rig-a\n    http-request set-header X-Admin 1", "holds control characters"),
    ("rig-a http-request deny", "is not valid"),
    ("rig-a#x", "is not valid"),
    ("rig-a:8000", "is not valid"),
    ("http://rig-a", "is not valid"),
    ("", "is not valid"),
    (["rig-a"], "is not valid"),
])
def test_a_crafted_ssh_hostname_is_refused(tmp_path: Path, value: Any, what: str) -> None:
    found = problems(tmp_path, ssh_hostname=value)
    assert len(found) == 1 and found[0].startswith(f"rig-a: ssh_hostname: {value!r} {what}; "
                                                   "allowed: ")
    assert "a host name or an IP address (no port)" in found[0] or what != "is not valid"


@pytest.mark.parametrize("value", ["192.168.1.41", "fd00::1", "rig-a.lan", "rig_a", "localhost"])
def test_host_names_and_addresses_pass(tmp_path: Path, value: str) -> None:
    assert problems(tmp_path, ssh_hostname=value) == []


def test_the_balancer_names_no_server_that_is_not_a_host(tmp_path: Path) -> None:
    settings = balancer(tmp_path, tls=False)
    good = validate_host("x", gpu_data(key_file(tmp_path)))
    # A host reached by its inventory name, and one built with an address no check saw.
    with pytest.raises(BalancerError, match=r"^lb1: inventory name: 'rig a' \(GPU host rig a\) "
                       r"is not a host name or address, and haproxy.cfg would name it as one; "
                       r"allowed: ssh_hostname or balancer_front_address in rig a's data"):
        plan_balancer("lb1", settings, [GpuHost("rig a", good)])
    with pytest.raises(BalancerError, match=r"^lb1: ssh_hostname: 'rig-a\\n  option"):
        plan_balancer("lb1", settings, [GpuHost("rig-a", good, "rig-a\n  option x")])
    ipv6 = plan_balancer("lb1", settings, [GpuHost("rig-a", good, "fd00::1")])
    assert "server rig-a [fd00::1]:8000 check\n" in render_config(ipv6)


# --- model_dir: a directory of its own ----------------------------------------------------------


OWN = ("allowed: an absolute, normalised directory other than '/', e.g. '/srv/models' (a "
       "directory of its own: not a home, not inside a system or rigfleet directory)")


@pytest.mark.parametrize(("value", "expected"), [
    ("/home/alice", "'/home/alice' is a home directory (the deploy would make it root's, mode "
                    f"0755); {OWN}"),
    ("/var/home/bob", "'/var/home/bob' is a home directory"),
    ("/root", "'/root' is a system directory; allowed: an absolute, normalised directory other "
              "than '/', e.g. '/srv/models' (a directory of its own, not a system directory)"),
    ("/var/lib/rigfleet", "'/var/lib/rigfleet' is a system directory"),
    ("/var/lib/rigfleet/models", f"is inside rigfleet's own /var/lib/rigfleet; {OWN}"),
    ("/opt/rigfleet/models", "is inside rigfleet's own /opt/rigfleet"),
    ("/etc/rigfleet/models", "is inside rigfleet's own /etc/rigfleet"),
    ("/var/cache/rigfleet/int8", "is inside rigfleet's own /var/cache/rigfleet"),
    ("/usr/local/lib/rigfleet/m", "is inside rigfleet's own /usr/local/lib/rigfleet"),
    ("/etc/models", f"is inside system directory /etc; {OWN}"),
    ("/usr/share/models", "is inside system directory /usr/share"),
    ("/tmp/models", "is inside system directory /tmp"),
    ("/proc/1/models", "is inside system directory /proc"),
    ("/var/lib/docker/models", "is inside system directory /var/lib/docker"),
    ("/var/lib/containerd", "is a system directory"),
    ("/var/lib", "is a system directory"),
    ("/usr/local", "is a system directory"),
])
def test_model_dir_must_be_a_directory_of_its_own(tmp_path: Path, value: str,
                                                  expected: str) -> None:
    found = problems(tmp_path, model_dir=value)
    assert len(found) == 1 and found[0].startswith(f"rig-a: model_dir: {value!r} "), found
    assert expected in found[0]


@pytest.mark.parametrize("value", ["/srv/models", "/data/models", "/home/alice/models",
                                   "/mnt/nvme/models", "/opt/models", "/var/lib/models",
                                   "/root/models", "/media/disk/weights"])
def test_model_dirs_of_their_own_pass(tmp_path: Path, value: str) -> None:
    assert problems(tmp_path, model_dir=value) == []


def test_no_parent_of_a_system_or_rigfleet_directory() -> None:
    for d in sorted(SYSTEM_DIRS | set(_NOT_INSIDE)):
        parent = posixpath.dirname(d)
        while parent != "/":
            c = HostChecker("rig-a")
            assert c.model_dir(KEYS["model_dir"], parent) is None, parent
            assert c.lines[0].startswith(f"rig-a: model_dir: {parent!r} is "), c.lines
            parent = posixpath.dirname(parent)
