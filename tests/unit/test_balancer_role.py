"""The balancer role and the routing of ``deploy.py``, through pyinfra's ``@fake`` connector
(``FakeRig`` hosts; see test_roles_fake.py): a host of ``balancers`` gets base + HAProxy and
nothing of the GPU roles, a host in both groups gets both, a config HAProxy refuses never
replaces the running one, and a second run changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import test_roles_fake
from fake_rig import FakeRig
from test_roles_fake import deploy_many

from rigfleet.balancer.haproxy import HOST_PATHS

CONF = HOST_PATHS.config
# The fake connector wired to the rigs (autouse) and the GPU hosts' data, as there.
_fast = test_roles_fake._fast
data = test_roles_fake.data


@pytest.fixture
def lb_data(data) -> dict:
    """A balancer host's data: the fleet's common data (as group data gives it) + its own."""
    return {**data, "balancer_port": 8080}


def fleet(data: dict, lb_data: dict, rigs: tuple[FakeRig, FakeRig], **kw):
    gpu, lb = rigs
    runs = deploy_many({"@fake/rig1": (gpu, {**data, "ssh_hostname": "10.0.0.11"}),
                        "@fake/lb1": (lb, lb_data)},
                       groups={"gpu_hosts": ["@fake/rig1"], "balancers": ["@fake/lb1"]}, **kw)
    return {name.removeprefix("@fake/"): run for name, run in runs.items()}


def test_a_balancer_host_gets_base_and_haproxy_only_and_a_second_run_changes_nothing(
        data, lb_data):
    rigs = (FakeRig("debian13"), FakeRig("debian13"))
    runs = fleet(data, lb_data, rigs)
    lb = runs["lb1"]
    assert not lb.failed and not runs["rig1"].failed, lb.commands[-5:]
    installs = [c.split(" install ", 1)[1] for c in lb.ran("apt-get") if " install " in c]
    assert installs == ["ca-certificates curl gnupg git python3 python3-venv jq chrony",
                        "haproxy socat"]
    assert not lb.ran("docker") and not lb.ran("nvidia")
    conf = rigs[1].files[CONF].decode()
    assert "server _fake_rig1 10.0.0.11:8000 check" in conf
    assert rigs[1].files[HOST_PATHS.keys].decode().startswith("Bearer k3y-")
    assert rigs[1].modes[HOST_PATHS.keys] == "0600"
    assert "k3y-" not in conf and not any("k3y-" in c for c in lb.commands)
    # Checked as a staged copy, moved into place, then a graceful reload.
    staged = f"{CONF}.rigfleet-new"  # roles.ops.checked_file's staged copy
    checked = next(i for i, c in enumerate(lb.commands)
                   if c.startswith(f"haproxy -c -q -f {staged}"))
    moved = lb.commands.index(f"mv -f {staged} {CONF}")
    reload = lb.commands.index("systemctl reload-or-restart haproxy")
    assert checked < moved < reload
    # The GPU host knows nothing of it.
    assert not runs["rig1"].ran("haproxy")

    again = fleet(data, lb_data, rigs)
    assert again["lb1"].plan == [] and again["rig1"].plan == []
    assert not again["lb1"].ran("reload-or-restart")


def test_a_config_haproxy_refuses_leaves_the_running_one(data, lb_data):
    rigs = (FakeRig("debian13"), FakeRig("debian13"))
    assert not fleet(data, lb_data, rigs)["lb1"].failed
    before = rigs[1].files[CONF]
    rigs[1].haproxy_refuses = "[ALERT] config : parsing [haproxy.cfg:60] : unknown keyword"
    run = fleet(data, {**lb_data, "balancer_port": 9090}, rigs)["lb1"]
    assert run.failed
    assert rigs[1].files[CONF] == before
    assert f"{CONF}.rigfleet-new" not in rigs[1].files
    assert not run.ran("reload-or-restart")


def test_a_host_in_both_groups_gets_every_role(data):
    rig = FakeRig("debian13")
    run = deploy_many({"@fake/rig1": (rig, {**data, "balancer_port": 8080,
                                            "ssh_hostname": "10.0.0.11"})},
                      groups={"gpu_hosts": ["@fake/rig1"],
                              "balancers": ["@fake/rig1"]})["@fake/rig1"]
    assert not run.failed, run.commands[-5:]
    assert run.ran("docker") and run.ran("haproxy -c")
    # The SSH address is the front's (an inventory name that is no host name, such as
    # @fake's, is refused: tests/unit/test_hostdata_rules.py).
    assert "server _fake_rig1 10.0.0.11:8000 check" in rig.files[CONF].decode()


def test_a_balancer_whose_key_is_not_the_fronts_is_refused(data, lb_data, tmp_path: Path):
    other = tmp_path / "other-key"
    other.write_text("another-key-0123456789abcdef\n")
    other.chmod(0o600)
    rigs = (FakeRig("debian13"), FakeRig("debian13"))
    run = fleet(data, {**lb_data, "api_key_file": str(other)}, rigs)["lb1"]
    assert run.failed and run.refused
    assert run.refused.startswith("@fake/lb1: api_key_file: the key it holds (not shown) is "
                                  "not the key of @fake/rig1; allowed: the same key")
    assert "another-key" not in run.refused
    assert not run.ran("apt-get")
