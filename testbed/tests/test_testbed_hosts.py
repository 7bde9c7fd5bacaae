"""``testbed up``'s host options (--os, --sudo-user, --hardware) and the inventory they give."""

from __future__ import annotations

import ast
import runpy
import shutil
import urllib.parse
from pathlib import Path

import pytest
import yaml
from rigfleet_testbed import aptrepo, fleet, hardware, hostspec, layout, nvidiarepo

REPO = Path(__file__).resolve().parents[2]


def test_os_option_names_the_host_and_the_allowed_values() -> None:
    host, os_ = hostspec.parse_os("host3=debian12")
    assert host == "host3" and os_.codename == "bookworm" and os_.version_id == "12"
    assert os_.base_image == "rigfleet/bookworm-base:latest"
    assert os_.host_image == "testbed/rigfleet_testbed-host:bookworm"
    assert layout.DEFAULT_OS.host_image == layout.HOST_IMAGE
    with pytest.raises(ValueError, match=r"--os 'host3=ubuntu24'.*allowed: debian13, debian12"):
        hostspec.parse_os("host3=ubuntu24")
    with pytest.raises(ValueError, match=r"expected HOST=OS"):
        hostspec.parse_os("debian12")


def test_host_specs_apply_every_option_and_reject_unknown_hosts() -> None:
    specs = hostspec.host_specs(
        3, [hardware.parse_override("host1:secure_boot=1")],
        [hostspec.parse_os("host3=debian12")], ["host2"])
    assert [(s.name, s.os.name, s.ssh_user) for s in specs] == [
        ("host1", "debian13", "root"), ("host2", "debian13", "rig"), ("host3", "debian12", "root")]
    assert specs[0].profile["secure_boot"] == {"enabled": True, "mok_enrolled": False}
    assert specs[1].profile["secure_boot"] == {"enabled": False, "mok_enrolled": False}
    assert specs[1].metadata() == {"name": "host2", "os": "debian13", "codename": "trixie",
                                   "ssh_user": "rig", "sudo": True}
    for kwargs, option in ((dict(sudo=["host4"]), "--sudo-user"),
                           (dict(oses=[hostspec.parse_os("host9=debian12")]), "--os"),
                           (dict(hardware_overrides=[{"host": "hostx"}]), "--hardware")):
        with pytest.raises(ValueError, match=rf"{option} '.*': no such host \(hosts: host1, "
                                             r"host2, host3\)"):
            hostspec.host_specs(3, **kwargs)


def test_config_hash_changes_with_what_the_machine_is() -> None:
    a, = hostspec.host_specs(1)
    b, = hostspec.host_specs(1, sudo=["host1"])
    c, = hostspec.host_specs(1, [hardware.parse_override("host1:secure_boot=1")])
    d, = hostspec.host_specs(1, oses=[hostspec.parse_os("host1=debian12")])
    hashes = {s.config_hash("sha256:1", "me") for s in (a, b, c, d)}
    assert len(hashes) == 4
    assert a.config_hash("sha256:1", "me") != a.config_hash("sha256:2", "me")  # new host image
    assert a.config_hash("sha256:1", "me") == hostspec.host_specs(1)[0].config_hash(
        "sha256:1", "me")
    # Made for another state directory or SSH key: a machine our key was never put on.
    assert a.config_hash("sha256:1", "me") != a.config_hash("sha256:1", "another checkout")


def test_the_owner_names_the_state_directory_and_its_key(tmp_path) -> None:
    from rigfleet_testbed.fleet import Paths

    owners = []
    for state, key in (("a", "k1"), ("a", "k2"), ("b", "k1")):
        paths = Paths(tmp_path / state)
        paths.ssh_key.parent.mkdir(parents=True, exist_ok=True)
        paths.ssh_key.with_suffix(".pub").write_text(f"ssh-ed25519 {key}\n")
        owners.append(paths.owner())
    assert len(set(owners)) == 3


def test_hardware_firmware_keys() -> None:
    prof = hardware.hardware_profile("host1", secure_boot=True, mok_enrolled=True, cgroup=1)
    assert prof["secure_boot"] == {"enabled": True, "mok_enrolled": True}
    assert prof["cgroup_version"] == 1
    assert hardware.hardware_profile("host1")["cgroup_version"] == 2
    with pytest.raises(ValueError, match="mok_enrolled=1 needs secure_boot=1"):
        hardware.parse_override("host1:mok_enrolled=1")
    with pytest.raises(ValueError, match=r"'host1:cgroup=3'.*cgroup must be 1 or 2"):
        hardware.parse_override("host1:cgroup=3")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPG home with every testbed repository key (generating RSA keys takes seconds)."""
    gnupg = tmp_path_factory.mktemp("keys") / "gnupg"
    nvidiarepo.apt_repos_data(gnupg)
    aptrepo.ensure_key(gnupg, aptrepo.DOCKER_LAYOUT.key_uid, aptrepo.DOCKER_LAYOUT.key_algo)
    return gnupg


def _paths(root: Path, keys: Path) -> fleet.Paths:
    paths = fleet.Paths(root=root)
    shutil.copytree(keys, paths.gnupg)
    return paths


def test_inventory_has_the_sudo_user_and_dockers_repository(tmp_path: Path, keys: Path) -> None:
    paths = _paths(tmp_path, keys)
    docker_fpr = aptrepo.ensure_key(paths.gnupg, aptrepo.DOCKER_LAYOUT.key_uid)
    specs = hostspec.host_specs(2, oses=[hostspec.parse_os("host2=debian12")], sudo=["host2"])
    text = fleet.inventory_text(specs, paths, docker_fpr)
    tree = ast.parse(text)
    values = {t.targets[0].id: ast.literal_eval(t.value) for t in tree.body
              if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)
              and t.targets[0].id in ("_testbed_data", "canary")}
    gpu_hosts = next(t.value for t in tree.body if isinstance(t, ast.Assign)
                     and t.targets[0].id == "gpu_hosts")
    hosts = dict(ast.literal_eval(gpu_hosts.elts[0]))
    assert hosts["host1"]["ssh_user"] == "root" and "_sudo" not in hosts["host1"]
    assert hosts["host2"]["ssh_user"] == "rig" and hosts["host2"]["_sudo"] is True
    # Nothing OS-specific per host: the deploy reads the OS from the host itself.
    assert set(hosts["host1"]) | {"_sudo"} == set(hosts["host2"])
    docker = values["_testbed_data"]["apt_repos"]["docker"]
    assert docker == {"url": "http://download.docker.rigfleet.test/linux/{id}",
                      "key_url": "http://download.docker.rigfleet.test/linux/{id}/gpg",
                      "suite": "{codename}", "components": ["stable"],
                      "key_fingerprint": docker_fpr}
    assert "download.docker.rigfleet.test" in layout.SERVICES_ALIASES
    assert values["canary"] == ["host1"]
    # NVIDIA's repositories as the shipped defaults name them: only host names (and the
    # stand-in keys' fingerprints) differ.
    shipped = runpy.run_path(str(REPO / "inventory/group_data/all.py"))["apt_repos"]
    ours = values["_testbed_data"]["apt_repos"]
    for name in ("cuda", "nvidia-container-toolkit"):
        assert _without_hosts(ours[name]) == _without_hosts(shipped[name]), name
        assert ours[name]["key_fingerprint"] != shipped[name]["key_fingerprint"]
    fprs = {ours["cuda"]["key_fingerprint"],
            ours["cuda"]["per_distro"]["debian13"]["key_fingerprint"],
            ours["nvidia-container-toolkit"]["key_fingerprint"], docker_fpr}
    assert len(fprs) == 4  # a key per signer, as upstream
    for alias in ("developer.download.nvidia.rigfleet.test", "nvidia.github.rigfleet.test"):
        assert alias in layout.SERVICES_ALIASES


def _without_hosts(entry: object) -> object:
    """An apt_repos entry with its URLs' scheme and host name and its fingerprints blanked."""
    if isinstance(entry, dict):
        return {k: "<fpr>" if k == "key_fingerprint" else _without_hosts(v)
                for k, v in entry.items()}
    if isinstance(entry, str) and "://" in entry:
        return "<site>" + urllib.parse.urlsplit(entry).path
    return entry


def test_inventory_with_a_balancer_puts_lb1_in_group_balancers(tmp_path: Path, keys: Path) -> None:
    from rigfleet_testbed.layout import BalancerSlot

    from rigfleet.inventory import host_kind

    paths = _paths(tmp_path, keys)
    docker_fpr = aptrepo.ensure_key(paths.gnupg, aptrepo.DOCKER_LAYOUT.key_uid)
    specs = hostspec.host_specs(2)
    lb = BalancerSlot(1)
    text = fleet.inventory_text(specs, paths, docker_fpr, [lb])
    tree = ast.parse(text)
    groups = {t.targets[0].id: t.value for t in tree.body if isinstance(t, ast.Assign)
              and isinstance(t.targets[0], ast.Name)}
    lbs = dict(ast.literal_eval(groups["balancers"].elts[0]))
    assert lbs["lb1"]["ssh_port"] == lb.ssh_port
    assert lbs["lb1"]["balancer_url"] == f"http://127.0.0.1:{lb.port}"
    hosts = dict(ast.literal_eval(groups["gpu_hosts"].elts[0]))
    # The balancer reaches each front on the testbed network, by the host's name.
    assert hosts["host2"]["balancer_front_address"] == "host2:8000"
    assert host_kind(["balancers", "testbed"]).gpu is False
    # The fleet cache on lb1 too, reached by the rigs by its name, pulling through the twin's
    # registry.
    cache = dict(ast.literal_eval(groups["caches"].elts[0]))["lb1"]
    assert (cache["cache_address"], cache["cache_registry_upstream"]) == ("lb1", layout.MIRROR_URL)
    # Every slot's ports differ from the hosts' and the services'.
    ports = {lb.ssh_port, lb.port} | {s.slot.ssh_port for s in specs} | {
        s.slot.front_port for s in specs} | {layout.HUB_LOCAL_PORT, layout.APT_LOCAL_PORT,
                                             layout.PYPI_LOCAL_PORT, layout.GIT_LOCAL_PORT}
    assert len(ports) == 2 + 2 * len(specs) + 4
    assert fleet.inventory_text(specs, paths, docker_fpr).count("balancers") == 0


def test_resolved_pins_are_pure_and_validated_as_written() -> None:
    import copy

    from rigfleet.pins import PinsError, dump_pins, load_pins, parse_pins

    pins = load_pins(layout.REPO_ROOT / "pins.yaml", allow_unresolved=True)
    int8, other = "sha256:" + "b" * 64, next(n for n in pins.stacks if n != "int8")
    revision = "0123456789abcdef0123456789abcdef01234567"
    before = copy.deepcopy(pins)
    new = fleet.resolved_pins(pins, {"int8": int8}, revision)
    assert pins == before  # the input is untouched
    assert new.stacks["int8"].digest == int8
    assert new.stacks[other] == pins.stacks[other]  # kept
    assert new.model.revision == revision and new.model_for(new.model.repo) == new.model
    filled = ("stacks.int8.digest", f"{pins.model.key}.revision")
    assert new.unresolved() == [k for k in pins.unresolved() if k not in filled]

    bad = fleet.resolved_pins(pins, {"int8": "sha256:nothex"}, "abc1234")
    with pytest.raises(PinsError) as err:  # what write_pins checks before it writes
        parse_pins(yaml.safe_load(dump_pins(bad)), allow_unresolved=True)
    msg = str(err.value)
    assert "stacks.int8.digest: 'sha256:nothex'" in msg
    assert f"{new.model.key}.revision: 'abc1234' is a short hash" in msg
