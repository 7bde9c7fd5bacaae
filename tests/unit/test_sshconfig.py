"""rigfleet's own SSH reads ssh_config as pyinfra's converge does (``rigfleet.sshconfig``):
aliases, Port, User, IdentityFile, ProxyJump, Include; inventory data wins over the file."""

from __future__ import annotations

import pytest

from rigfleet.inventory import InventoryHost
from rigfleet.sshconfig import SshConfigError, resolve

CONFIG = """\
Host rig-a
    HostName 192.0.2.10
    Port 2201
    User ops
    IdentityFile {tmp}/id_rig
    UserKnownHostsFile {tmp}/known

Host rig-b
    HostName 10.0.0.5
    ProxyJump jump-user@bastion:2022,rig-hop
    ConnectTimeout 7

Host rig-hop
    HostName 198.51.100.7
    User hopper
    Port 2200

Host bastion
    HostName 203.0.113.1
    IdentityFile ~/.ssh/bastion_key

Include {tmp}/conf.d/*.conf

Host *
    User fallback
"""


@pytest.fixture
def config(tmp_path):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "more.conf").write_text("Host rig-c\n    HostName 192.0.2.30\n"
                                                   "    Port 2230\n")
    path = tmp_path / "ssh_config"
    path.write_text(CONFIG.format(tmp=tmp_path))
    return path


def test_an_alias_takes_hostname_port_user_key_and_known_hosts_from_the_file(config, tmp_path):
    t = resolve("rig-a", {"ssh_config_file": str(config)})
    assert (t.hostname, t.port, t.user) == ("192.0.2.10", 2201, "ops")
    assert t.key_files == (f"{tmp_path}/id_rig",)
    assert t.known_hosts == (f"{tmp_path}/known",)
    assert t.jumps == ()


def test_ssh_hostname_is_the_name_looked_up(config):
    t = resolve("host1", {"ssh_config_file": str(config), "ssh_hostname": "rig-a"})
    assert (t.hostname, t.port, t.user) == ("192.0.2.10", 2201, "ops")


def test_inventory_data_wins_over_the_file(config, tmp_path):
    t = resolve("rig-a", {"ssh_config_file": str(config), "ssh_port": 22, "ssh_user": "root",
                          "ssh_key": "~/k", "ssh_known_hosts_file": str(tmp_path / "kh")})
    assert (t.hostname, t.port, t.user) == ("192.0.2.10", 22, "root")
    assert len(t.key_files) == 1 and t.key_files[0].endswith("/k")  # replaces IdentityFile
    assert t.known_hosts == (str(tmp_path / "kh"),)


def test_proxyjump_hops_are_looked_up_in_the_same_file_in_order(config):
    t = resolve("rig-b", {"ssh_config_file": str(config)})
    assert (t.hostname, t.port, t.user, t.connect_timeout) == ("10.0.0.5", 22, "fallback", 7.0)
    first, second = t.jumps
    assert (first.hostname, first.port, first.user) == ("203.0.113.1", 2022, "jump-user")
    assert first.key_files[0].endswith("/.ssh/bastion_key")
    assert (second.hostname, second.port, second.user) == ("198.51.100.7", 2200, "hopper")
    assert t.where() == ("fallback@10.0.0.5:22 via jump-user@203.0.113.1:2022 via "
                         "hopper@198.51.100.7:2200")


def test_include_is_expanded(config):
    t = resolve("rig-c", {"ssh_config_file": str(config)})
    assert (t.hostname, t.port, t.user) == ("192.0.2.30", 2230, "fallback")


def test_a_name_the_file_does_not_list_connects_as_written(config):
    t = resolve("10.1.1.1", {"ssh_config_file": str(config), "ssh_user": "root"})
    assert (t.hostname, t.port, t.user, t.key_files) == ("10.1.1.1", 22, "root", ())


def test_no_file_at_all_uses_the_data_and_rigfleets_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config
    t = resolve("host1", {"ssh_hostname": "127.0.0.1", "ssh_port": 2221})
    assert (t.hostname, t.port, t.user, t.known_hosts) == ("127.0.0.1", 2221, "root", ())


def test_the_users_ssh_config_is_read_by_default(tmp_path, monkeypatch, config):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(config.read_text())
    assert resolve("rig-a", {}).hostname == "192.0.2.10"


def test_a_named_file_that_is_missing_is_an_error_naming_host_key_and_value(tmp_path):
    with pytest.raises(SshConfigError, match=r"^rig1: ssh_config_file: .*/nope: no such file; "
                                             r"allowed: "):
        resolve("rig1", {"ssh_config_file": str(tmp_path / "nope")})


def test_an_include_loop_is_refused(tmp_path):
    path = tmp_path / "loop"
    path.write_text(f"Include {path}\nHost x\n  Port 1\n")
    with pytest.raises(SshConfigError, match="includes itself"):
        resolve("x", {"ssh_config_file": str(path)})


def test_inventory_ssh_target_resolves_an_alias(config):
    host = InventoryHost("rig-a", (), {"ssh_config_file": str(config)})
    assert host.ssh_target == ("192.0.2.10", 2201, "ops")


def test_the_ssh_layer_reports_a_missing_config_as_unreachable(tmp_path):
    from rigfleet.ssh import SshRemote

    host = InventoryHost("rig1", (), {"ssh_config_file": str(tmp_path / "nope")})
    why = SshRemote(1).reachable(host)
    assert why is not None and why.startswith("rig1: ssh_config_file: ")


def test_the_ssh_layer_connects_where_the_file_says_through_its_hops(config, tmp_path):
    from rigfleet.ssh import prepare

    host = InventoryHost("host2", (), {"ssh_config_file": str(config), "ssh_hostname": "rig-b",
                                       "ssh_strict_host_key_checking": "yes"})
    conn, target = prepare(host, 5)
    assert (conn.host, conn.port, conn.user) == ("10.0.0.5", 22, "fallback")
    hop2 = conn.gateway
    assert (hop2.host, hop2.port, hop2.user) == ("198.51.100.7", 2200, "hopper")
    hop1 = hop2.gateway
    assert (hop1.host, hop1.port, hop1.user) == ("203.0.113.1", 2022, "jump-user")
    assert hop1.connect_kwargs["key_filename"][0].endswith("/.ssh/bastion_key")
    assert hop1.gateway is None and not hop1.is_connected
    import paramiko

    for c in (conn, hop1, hop2):  # every hop's host key is checked
        assert isinstance(c.client._policy, paramiko.RejectPolicy)

    alias = InventoryHost("rig-a", (), {"ssh_config_file": str(config)})
    conn, _ = prepare(alias, 5)
    assert (conn.host, conn.port, conn.user) == ("192.0.2.10", 2201, "ops")
    assert conn.connect_kwargs["key_filename"] == [f"{tmp_path}/id_rig"]
    assert conn.connect_kwargs["look_for_keys"] is False


def test_a_proxyjump_hop_may_be_an_ipv6_address_in_brackets(tmp_path):
    path = tmp_path / "ssh_config"
    path.write_text("Host rig-v6\n    HostName fd00::10\n"
                    "    ProxyJump ops@[fd00::1]:2022,[fd00::2]\n")
    t = resolve("rig-v6", {"ssh_config_file": str(path)})
    assert [(j.hostname, j.port, j.user) for j in t.jumps] == [("fd00::1", 2022, "ops"),
                                                              ("fd00::2", 22, "root")]
