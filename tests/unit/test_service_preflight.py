"""The service hosts' preflights (balancer, monitor, cache) through pyinfra's ``@fake``
connector: each refuses its host alone, in its own words, when a GPU host's data (or, for the
monitor and the cache, its pins) cannot be read, when the inventory has no GPU host, or when the
host is not a supported OS booted with systemd."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_roles_fake
from fake_rig import FakeRig
from test_roles_fake import deploy_many

import roles
from rigfleet.scrape import Target

_fast = test_roles_fake._fast
data = test_roles_fake.data

SERVICE = {"balancers": {"balancer_port": 8080}, "monitors": {}, "caches": {}}
BAD_GPU = ("@fake/rig1: gpu_count: 'two' is not valid; allowed: an integer 1..16 (the host's "
           "number of GPUs)")
BAD_PINS = ("@fake/rig1: pins_file: TMP/bad-pins.yaml: serial: 'x' is not valid; allowed: an "
            "integer >= 1 (save_pins increments it)")
WHY = {"balancers": "GPU host @fake/rig1's data does not validate, so the balancer cannot be "
                     "built",
       "monitors": "@fake/rig1's data does not validate, so its scrape targets cannot be built",
       "caches": "@fake/rig1's data does not validate, so the revisions to cache cannot be read"}
NONE = {"balancers": "balance; allowed: a balancer beside at least one GPU host (every host not "
                     "only in group balancers, or in group gpu_hosts)",
        "monitors": "monitor; allowed: a monitor beside at least one GPU host",
        "caches": "cache for; allowed: a cache beside at least one GPU host"}
PID1 = ("@fake/svc: os: PID 1 is 'bash' and /run/systemd/system is missing: systemd does not run "
        "this host; allowed: a host booted with systemd as init (rigfleet manages systemd units: "
        "docker, nginx, nvidia-persistenced, its own)")
ROCKY = ("@fake/svc: os: 'rocky 9.4' is not supported; allowed: debian 12, debian 13, "
         "ubuntu 22.04, ubuntu 24.04")


def refusals(data: dict, service: str, rig: dict | None, lb: dict | None = None,
             svc: FakeRig | None = None) -> dict[str, str | None]:
    """Prepare a run of one ``service`` host beside (``lb``) a balancer and (``rig``) a GPU
    host; each host's refusal, ``tmp_path`` shown as TMP."""
    hosts = {"@fake/svc": (svc or FakeRig("debian13"), {**data, **SERVICE[service]})}
    groups = {service: ["@fake/svc"]}
    if lb is not None:
        hosts = {"@fake/lb1": (FakeRig("debian13"), {**data, "balancer_port": 8080, **lb}),
                 **hosts}
        groups["balancers"] = [*groups.get("balancers", []), "@fake/lb1"]
    if rig is not None:
        hosts["@fake/rig1"] = (FakeRig("debian13"), {**data, "ssh_hostname": "10.0.0.11", **rig})
        groups["gpu_hosts"] = ["@fake/rig1"]
    runs = deploy_many(hosts, execute=False, groups=groups)
    tmp = str(Path(data["pins_file"]).parent)
    return {name.removeprefix("@fake/"): run.refused and run.refused.replace(tmp, "TMP")
            for name, run in runs.items()}


@pytest.mark.parametrize("service", list(SERVICE))
def test_a_service_host_beside_a_valid_gpu_host_goes_on(data, service):
    assert refusals(data, service, {}) == {"svc": None, "rig1": None}


@pytest.mark.parametrize("service", list(SERVICE))
def test_a_gpu_host_whose_data_does_not_validate_refuses_the_service_host(data, service):
    got = refusals(data, service, {"gpu_count": "two"})
    assert got == {"rig1": BAD_GPU,
                   "svc": f"@fake/svc: {service}: {WHY[service]}; allowed: fix it first "
                          f"({BAD_GPU})"}


@pytest.mark.parametrize("service", list(SERVICE))
def test_pins_that_do_not_validate_refuse_the_monitor_and_the_cache_only(data, service):
    bad = Path(data["pins_file"]).with_name("bad-pins.yaml")
    bad.write_text("schema: rigfleet-pins/1\nserial: x\n")
    got = refusals(data, service, {"pins_file": str(bad)})
    assert (got["rig1"] or "").startswith(BAD_PINS + "\n")
    assert got["svc"] == (None if service == "balancers" else
                          f"@fake/svc: {service}: {WHY[service]}; allowed: fix it first "
                          f"({BAD_PINS})")


@pytest.mark.parametrize("service", list(SERVICE))
def test_a_service_host_without_gpu_hosts_is_refused(data, service):
    assert refusals(data, service, None) == {
        "svc": f"@fake/svc: {service}: the inventory has no GPU host to {NONE[service]}"}


@pytest.mark.parametrize("service", list(SERVICE))
@pytest.mark.parametrize(("os_key", "pid1", "refusal"),
                         [("debian13", "bash", PID1), ("rocky9", "systemd", ROCKY)])
def test_a_service_host_must_run_a_supported_os_with_systemd(data, service, os_key, pid1,
                                                            refusal):
    svc = FakeRig(os_key)
    svc.pid1 = pid1
    assert refusals(data, service, {}, svc=svc) == {"svc": refusal, "rig1": None}


def test_the_monitor_names_the_first_host_of_the_inventory_that_does_not_validate(data):
    got = refusals(data, "monitors", {"gpu_count": "two"}, lb={"balancer_port": "x"})
    lb = ("@fake/lb1: balancer_port: 'x' is not valid; allowed: a TCP port 1..65535 (clients "
          "call http(s)://<balancer>:<port>)")
    assert got == {"lb1": lb, "rig1": BAD_GPU,
                   "svc": "@fake/svc: monitors: @fake/lb1's data does not validate, so its "
                          f"scrape targets cannot be built; allowed: fix it first ({lb})"}


def test_the_monitor_takes_the_fronts_key_only(data, tmp_path):
    other = tmp_path / "other-key"
    other.write_text("another-key-0123456789abcdef\n")
    other.chmod(0o600)
    rig = {"api_key_file": data["api_key_file"]}
    got = refusals({**data, "api_key_file": str(other)}, "monitors", rig)
    assert (got["svc"] or "").startswith(
        "@fake/svc: api_key_file: the key it holds (not shown) is not the key of @fake/rig1; "
        "allowed: the same key for the balancer and every GPU host")


@pytest.mark.parametrize("service", ["monitors", "caches"])
def test_what_the_monitor_and_the_cache_read_of_the_fleet(data, service, monkeypatch):
    seen = []
    roles_of = {"monitors": "MONITOR_ROLES", "caches": "CACHE_ROLES"}[service]
    monkeypatch.setattr(roles, roles_of, (seen.append,))
    lb = {"ssh_hostname": "lb1.lan"}
    assert set(refusals(data, service, {}, lb=lb).values()) == {None}
    [ctx] = seen
    if service == "caches":
        assert [(m.repo, m.revision[:4]) for m in ctx.models] == [
            ("Lorbus/Qwen3.6-27B-int4-AutoRound", "aaaa")]
        assert ctx.hf_hub_version == "2.4.0"
        assert ctx.images == (("vllm/vllm-openai", test_roles_fake.DIGEST),)
    else:
        assert ctx.plan.fronts == (Target("@fake/rig1", "10.0.0.11:8000"),)
        assert ctx.plan.balancers == (Target("@fake/lb1", "lb1.lan:8080"),)
        assert 'host="@fake/rig1"' in ctx.desired


def test_the_run_ends_with_one_summary_when_every_host_is_refused(data, caplog):
    runs = deploy_many({"@fake/mon1": (FakeRig("debian13"), data),
                        "@fake/mon2": (FakeRig("debian13"), data)},
                       groups={"monitors": ["@fake/mon1", "@fake/mon2"]})
    assert all(run.failed and run.refused for run in runs.values())
    assert caplog.text.count("failed preflight") == 1
    summary = caplog.text[caplog.text.index("--> rigfleet: 2 host(s) failed preflight (nothing "
                                            "changed on them):"):]
    assert "    @fake/mon1: monitors: the inventory has no GPU host" in summary
    assert "    @fake/mon2: monitors: the inventory has no GPU host" in summary
