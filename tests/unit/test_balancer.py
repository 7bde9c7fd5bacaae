"""The balancer: which hosts get it, its host data, its pools, its HAProxy config, its stats.

The config's behaviour is checked by a real HAProxy in test_balancer_live.py; here the
decisions (pure) and the config's important directives, ``haproxy -c`` on it (skipped
without HAProxy), and the role through pyinfra's ``@fake`` connector.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from balancer_helpers import API_KEY, gpu_data, gpu_host, key_file, make_plan, tls_files

from rigfleet.balancer.haproxy import (
    HostPaths,
    check_timing,
    keys_list,
    parse_stat_csv,
    render_config,
)
from rigfleet.balancer.plan import BalancerError, front_target, plan_balancer
from rigfleet.balancer.status import rotation
from rigfleet.catalog import builtin_catalog
from rigfleet.hostdata import HostDataError, validate_balancer, validate_host
from rigfleet.inventory import InventoryHost, balancers, gpu_hosts, host_kind

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STACKS = {"host1": "int8", "host2": "int8", "host3": "tq3-mtp-genesis"}


# --- which roles a host gets -----------------------------------------------------------------


@pytest.mark.parametrize(("groups", "gpu", "balancer"), [
    ((), True, False),
    (("gpu_hosts", "canary", "home"), True, False),
    (("balancers", "home"), False, True),
    (("balancers", "gpu_hosts"), True, True),
])
def test_a_host_is_a_gpu_host_unless_it_is_only_a_balancer(groups, gpu, balancer):
    kind = host_kind(groups)
    assert (kind.gpu, kind.balancer) == (gpu, balancer)


def test_status_and_the_bump_see_only_gpu_hosts():
    hosts = [InventoryHost("rig-a", ("gpu_hosts",), {}), InventoryHost("lb1", ("balancers",), {}),
             InventoryHost("rig-b", ("gpu_hosts", "balancers"), {})]
    assert [h.name for h in gpu_hosts(hosts)] == ["rig-a", "rig-b"]
    assert [h.name for h in balancers(hosts)] == ["lb1", "rig-b"]


# --- host data -------------------------------------------------------------------------------


def test_balancer_defaults(tmp_path):
    s = validate_balancer("lb1", {"api_key_file": str(key_file(tmp_path))})
    assert (s.port, s.scheme, s.check_interval_s, s.retry_buffer_kib, s.default_stack) == (
        8080, "http", 2.0, 128, None)


@pytest.mark.parametrize(("data", "named"), [
    ({"balancer_port": 70000}, "lb1: balancer_port: 70000 is not valid; allowed: a TCP port"),
    ({"balancer_check_interval_s": 0.1}, "lb1: balancer_check_interval_s: 0.1 is not valid; "
                                         "allowed: seconds between readiness checks, 0.5..30"),
    ({"balancer_retry_buffer_kib": 4096}, "lb1: balancer_retry_buffer_kib: 4096 is not valid; "
                                          "allowed: KiB, 16..1024"),
    ({"balancer_default_stack": "fp4"}, "lb1: balancer_default_stack: 'fp4' is not a stack in "
                                        "the catalog; allowed: int8"),
    ({"balancer_tls_cert_file": "/nope.crt"}, "lb1: balancer_tls_key_file: missing; allowed: "
                                              "both balancer_tls_cert_file and"),
    ({"balancer_url": "ftp://lb"}, "lb1: balancer_url: 'ftp://lb' is not valid"),
    ({"balancer_prot": 9000}, "lb1: balancer_prot: 'balancer_prot' is not a rigfleet key "
                              "(did you mean 'balancer_port'?)"),
])
def test_bad_balancer_data_names_host_key_value_and_what_is_allowed(tmp_path, data, named):
    with pytest.raises(HostDataError) as e:
        validate_balancer("lb1", {"api_key_file": str(key_file(tmp_path)), **data})
    assert any(line.startswith(named) for line in e.value.problems), e.value.problems


def test_a_host_that_serves_and_balances_needs_two_ports(tmp_path):
    data = {"api_key_file": str(key_file(tmp_path)), "front_port": 8080}
    validate_balancer("rig-a", data)  # alone it is fine
    with pytest.raises(HostDataError, match="rig-a: balancer_port: 8080 is this host's "
                       "front_port too .*; allowed: a port other than front_port 8080"):
        validate_balancer("rig-a", data, gpu_host=True)



def test_a_host_that_serves_and_balances_keeps_the_stacks_loopback_ports(tmp_path):
    # HAProxy listens on every address: on a stack's loopback port it and that stack's
    # container (127.0.0.1) cannot both bind; the port was accepted
    port = builtin_catalog().get("int8").port
    data = {"api_key_file": str(key_file(tmp_path)), "front_port": 8000, "balancer_port": port}
    validate_balancer("rig-a", data)  # a balancer that serves nothing may use it
    with pytest.raises(HostDataError, match=f"^rig-a: balancer_port: {port} is stack int8's "
                       "loopback port .*; allowed: a port other than the stacks' loopback ports "
                       f"{port} \\(int8\\)"):
        validate_balancer("rig-a", data, gpu_host=True)


def test_the_key_must_be_private(tmp_path):
    key = key_file(tmp_path)
    key.chmod(0o644)
    with pytest.raises(HostDataError, match="lb1: api_key_file: .* is readable by others"):
        validate_balancer("lb1", {"api_key_file": str(key)})


@pytest.mark.parametrize("address", ["rig a", "rig-a:0", "rig-a:99999", "http://rig-a", ""])
def test_bad_front_address_is_refused(tmp_path, address):
    with pytest.raises(HostDataError, match="rig-a: balancer_front_address: "):
        validate_host("rig-a", gpu_data(key_file(tmp_path), balancer_front_address=address))


# --- the plan --------------------------------------------------------------------------------


def test_one_pool_per_stack_holding_the_hosts_of_that_stack(tmp_path):
    plan = make_plan(tmp_path, STACKS)
    assert [(p.stack, [s.host for s in p.servers]) for p in plan.pools] == [
        ("int8", ["host1", "host2"]), ("tq3-mtp-genesis", ["host3"])]
    assert plan.default_stack is None  # two stacks, none chosen: /v1 names the prefixes
    assert make_plan(tmp_path, {"host1": "int8"}).default_stack == "int8"
    chosen = make_plan(tmp_path, STACKS, balancer_default_stack="tq3-mtp-genesis")
    assert chosen.default_stack == "tq3-mtp-genesis"


def test_the_default_stack_must_be_served(tmp_path):
    with pytest.raises(BalancerError, match="lb1: balancer_default_stack: 'tq3-mtp-genesis' is "
                       "no GPU host's stack; allowed: int8"):
        make_plan(tmp_path, {"host1": "int8"}, balancer_default_stack="tq3-mtp-genesis")


def test_where_the_balancer_reaches_a_front(tmp_path):
    key = key_file(tmp_path)
    assert front_target(gpu_host("rig-a", key)) == ("rig-a:8000", "rig-a")
    assert front_target(gpu_host("rig-a", key, "192.0.2.1")) == ("192.0.2.1:8000", "192.0.2.1")
    assert front_target(gpu_host("rig-a", key, balancer_front_address="rig-a.lan")) == (
        "rig-a.lan:8000", "rig-a.lan")
    assert front_target(gpu_host("rig-a", key, balancer_front_address="[fd00::5]:9000")) == (
        "[fd00::5]:9000", "fd00::5")


def test_two_hosts_at_one_address_or_no_gpu_host_are_refused(tmp_path):
    settings = validate_balancer("lb1", {"api_key_file": str(key_file(tmp_path))})
    key = key_file(tmp_path)
    with pytest.raises(BalancerError, match="host2 and host1 are both reached at"):
        plan_balancer("lb1", settings, [gpu_host("host1", key, "192.0.2.1"),
                                        gpu_host("host2", key, balancer_front_address="192.0.2.1")])
    with pytest.raises(BalancerError, match="lb1: balancers: the inventory has no GPU host"):
        plan_balancer("lb1", settings, [])


# --- the config ------------------------------------------------------------------------------


def render(tmp_path, **balancer) -> str:
    plan = make_plan(tmp_path, STACKS, {n: f"{n}.lan" for n in STACKS}, **balancer)
    return render_config(plan)


def test_config_routes_each_stack_to_its_own_hosts(tmp_path):
    text = render(tmp_path, balancer_default_stack="int8")
    int8 = text[text.index("\nbackend stack_int8"):text.index("\nbackend stack_tq3")]
    tq3 = text[text.index("\nbackend stack_tq3"):]
    assert "server host1 host1.lan:8000 check" in int8 and "server host2 host2.lan:8000" in int8
    assert "host3" not in int8 and "host1" not in tq3
    assert "http-check expect hdr name X-Rigfleet-Route value -m beg int8/" in int8
    assert "http-check expect hdr name X-Rigfleet-Route value -m beg tq3-mtp-genesis/" in tq3
    assert "http-request replace-path ^/stacks/int8(/.*)$ \\1" in int8
    assert "use_backend stack_tq3-mtp-genesis if stack_tq3-mtp-genesis" in text
    assert "default_backend stack_int8" in text


def test_config_has_the_streaming_retry_and_check_settings(tmp_path):
    text = "\n".join(line.strip() for line in render(tmp_path, balancer_check_interval_s=2)
                     .splitlines() if not line.lstrip().startswith("#"))
    for line in [
        "retry-on conn-failure empty-response 502 503", "option redispatch 1", "retries 3",
        "timeout server 3600s", "timeout client 3600s", "option http-buffer-request",
        "tune.bufsize 131072", "balance hdr(X-Session-Id)", "hash-type consistent",
        "http-check send meth GET uri /rigfleet/ready ver HTTP/1.1",
        "http-check expect status 200",
        "default-server inter 2000ms fastinter 500ms downinter 2000ms fall 2 rise 2",
        "http-request disable-l7-retry unless retry_safe",
        "stats socket /run/haproxy/rigfleet.sock mode 600 level admin",
    ]:
        assert line in text, line
    # Running requests finish on a host leaving rotation; unbuffered answers.
    assert "shutdown-sessions" not in text and "http-server-close" not in text
    # With two stacks and no default, /v1/... is answered with the prefixes to use.
    assert "hosts serve several stacks: ask one by its path" in text
    assert "default_backend" not in text


def test_config_names_the_key_file_and_never_holds_the_key(tmp_path):
    text = render(tmp_path)
    assert API_KEY not in text
    assert "req.fhdr(authorization) -m str -f /etc/haproxy/rigfleet/api-keys.lst" in text
    assert keys_list(API_KEY) == f"Bearer {API_KEY}\n"


def test_haproxy_metrics_only_after_the_key_check(tmp_path):
    lines = [line.strip() for line in render(tmp_path).splitlines()]
    key = next(i for i, x in enumerate(lines) if x.startswith("http-request return status 401"))
    metrics = lines.index("http-request use-service prometheus-exporter if "
                          "{ path /rigfleet/metrics/haproxy }")
    # A final action: whatever comes first decides; the 401 of a request without the key.
    assert key < metrics
    assert not [x for x in lines[:key] if x.startswith("http-request")]


def test_check_timing_leaves_rotation_within_about_one_interval():
    assert check_timing(2.0) == {"inter_ms": 2000, "fastinter_ms": 500,
                                 "check_timeout_ms": 2000}
    assert check_timing(0.5)["fastinter_ms"] == 250



def test_tls_at_the_balancer_and_to_tls_fronts(tmp_path):
    crt, key = tls_files(tmp_path, "lb1")
    fcrt, fkey = tls_files(tmp_path, "rig-a.lan")
    k = key_file(tmp_path)
    front = gpu_host("rig-a", k, balancer_front_address="rig-a.lan",
                     front_tls_cert_file=str(fcrt), front_tls_key_file=str(fkey))
    settings = validate_balancer("lb1", {"api_key_file": str(k), "balancer_tls_cert_file":
                                         str(crt), "balancer_tls_key_file": str(key)})
    plan = plan_balancer("lb1", settings, [front])
    text = render_config(plan)
    assert "bind :8080 ssl crt /etc/haproxy/rigfleet/balancer.pem alpn h2,http/1.1" in text
    assert ("server rig-a rig-a.lan:8000 check ssl verify required ca-file "
            "/etc/haproxy/rigfleet-ca/rig-a.pem verifyhost rig-a.lan sni str(rig-a.lan)") in text
    assert plan.pools[0].servers[0].ca_file == str(fcrt)


@pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed here")
@pytest.mark.parametrize("tls", [False, True])
def test_haproxy_accepts_the_config(tmp_path, tls):
    paths = HostPaths(config=str(tmp_path / "haproxy.cfg"), secret_dir=str(tmp_path),
                      ca_dir=str(tmp_path / "ca"), socket=str(tmp_path / "s.sock"))
    Path(paths.keys).write_text(keys_list(API_KEY))
    extra = {}
    if tls:
        crt, key = tls_files(tmp_path, "lb1")
        Path(paths.pem).write_text(crt.read_text() + key.read_text())
        extra = {"balancer_tls_cert_file": str(crt), "balancer_tls_key_file": str(key),
                 "balancer_plain_fronts": True}
    plan = make_plan(tmp_path, STACKS, {n: f"127.0.0.{i + 1}" for i, n in enumerate(STACKS)},
                     **extra)
    Path(paths.config).write_text(render_config(plan, paths))
    proc = subprocess.run(["haproxy", "-c", "-f", paths.config], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ALERT" not in proc.stdout + proc.stderr


@pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed here")
def test_a_gpu_host_whose_name_does_not_resolve_leaves_rotation_not_the_balancer(tmp_path):
    """HAProxy resolves server names when it starts: one that does not resolve (a host gone
    from DNS, DNS not up yet at boot) must not keep the config from passing or HAProxy from
    starting for every other host."""
    paths = HostPaths(config=str(tmp_path / "haproxy.cfg"), secret_dir=str(tmp_path),
                      ca_dir=str(tmp_path / "ca"), socket=str(tmp_path / "s.sock"))
    Path(paths.keys).write_text(keys_list(API_KEY))
    plan = make_plan(tmp_path, STACKS, {"host1": "127.0.0.1", "host2": "rig-gone.invalid",
                                        "host3": "127.0.0.3"})
    Path(paths.config).write_text(render_config(plan, paths))
    proc = subprocess.run(["haproxy", "-c", "-f", paths.config], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the runtime stats ------------------------------------------------------------------------


def test_show_stat_says_which_hosts_are_in_rotation(tmp_path):
    servers = parse_stat_csv((FIXTURES / "haproxy" / "show-stat-2.6.csv").read_text())
    assert [(s.backend, s.host, s.status, s.check_code) for s in servers] == [
        ("stack_int8", "host1", "UP", "200"), ("stack_int8", "host2", "DOWN", "503"),
        ("stack_tq3-mtp-genesis", "host3", "UP", "200")]
    plan = make_plan(tmp_path, {**STACKS, "host4": "int8"})
    rot = {r.stack: r for r in rotation("lb1", "-", plan, servers)}
    assert rot["int8"].up == ["host1"]
    assert rot["int8"].out == [("host2", "DOWN (L7STS 503)"),
                               ("host4", "not in the running config")]
    assert rot["tq3-mtp-genesis"].up == ["host3"]


def test_show_stat_output_that_is_not_csv_is_an_error():
    with pytest.raises(ValueError, match="not HAProxy 'show stat' output"):
        parse_stat_csv("Unknown command\n")


# --- status and endpoints --------------------------------------------------------------------


class FakeRemote:
    def __init__(self, answer: tuple[int, str] | Exception) -> None:
        self.answer = answer
        self.commands: list[str] = []

    def run(self, host, command, *, timeout=120, stdin=b""):
        self.commands.append(command)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def inventory(tmp_path: Path) -> list[InventoryHost]:
    key = key_file(tmp_path)
    gpu = [InventoryHost(n, ("gpu_hosts",), gpu_data(key, stack=s)) for n, s in STACKS.items()]
    lb = InventoryHost("lb1", ("balancers",), {"api_key_file": str(key),
                                                "ssh_hostname": "127.0.0.1",
                                                "balancer_default_stack": "int8"})
    return [*gpu, lb]


def test_status_shows_each_stack_of_a_balancer_and_fits_80_columns(tmp_path):
    import io

    from rich.console import Console

    from rigfleet.balancer.status import balancer_rows
    from rigfleet.ssh import HostUnreachable
    from rigfleet.status.cli import as_json, balancer_exit, render_balancers

    hosts = inventory(tmp_path)
    remote = FakeRemote((0, (FIXTURES / "haproxy" / "show-stat-2.6.csv").read_text()))
    rows = balancer_rows(hosts[-1], hosts, remote)
    assert remote.commands == ["printf 'show stat\\n' | socat -t 5 - "
                               "UNIX-CONNECT:/run/haproxy/rigfleet.sock"]
    assert [(r.stack, r.up, r.out, r.url) for r in rows] == [
        ("int8", ["host1"], [("host2", "DOWN (L7STS 503)")], "http://127.0.0.1:8080"),
        ("tq3-mtp-genesis", ["host3"], [], "http://127.0.0.1:8080")]
    assert balancer_exit(rows) == 0
    out = io.StringIO()
    render_balancers(rows).print(Console(file=out, width=80, color_system=None))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "1/2" in text and "lb1 int8: host2 out of rotation: DOWN (L7STS 503)" in text
    assert "balancers" in as_json([], rows)

    down = balancer_rows(hosts[-1], hosts, FakeRemote(HostUnreachable("lb1: refused")))
    assert [r.reachable for r in down] == [False, False] and balancer_exit(down) == 2
    broken = balancer_rows(hosts[-1], hosts, FakeRemote((1, "socat: No such file")))
    assert broken[0].error and "exited 1" in broken[0].error


def test_endpoints_asks_each_stack_through_the_balancer(tmp_path, monkeypatch):
    import rigfleet.endpoints as endpoints

    asked = []

    def chat(url, key, prompt, max_tokens=40, timeout=60, context=None, model=""):
        asked.append((url, key))
        return {"model": "qwen3.6-27b-autoround", "choices": [{"message": {"content": "Paris."}}]}

    monkeypatch.setattr(endpoints, "chat", chat)
    hosts = inventory(tmp_path)
    rows = endpoints.check_balancer(hosts[-1], hosts)
    assert [(r.url, r.status) for r in rows] == [
        ("http://127.0.0.1:8080/stacks/int8", 200),
        ("http://127.0.0.1:8080/stacks/tq3-mtp-genesis", 200)]
    assert {k for _, k in asked} == {API_KEY}


# --- the converge's batch cap ------------------------------------------------------------------


def test_behind_a_balancer_the_converge_keeps_a_host_of_every_shared_stack_serving(tmp_path):
    from rigfleet.balancer.plan import converge_batch, swap_batch

    assert swap_batch(None).size is None
    three = make_plan(tmp_path, {"host1": "int8", "host2": "int8", "host3": "int8",
                                 "host4": "tq3-mtp-genesis"})
    batch = swap_batch(three)
    assert batch.size == 2 and (
        "at a time, so that one int8 host keeps serving behind lb1" in batch.why)
    mixed = make_plan(tmp_path, {"a": "int8", "b": "tq3-mtp-genesis", "c": "int8",
                                 "d": "tq3-mtp-genesis", "e": "int8"})
    assert swap_batch(mixed).size == 1  # two tq3 hosts: one at a time
    alone = make_plan(tmp_path, {"a": "int8", "b": "tq3-mtp-genesis"})
    assert swap_batch(alone).size is None and "one host" in swap_batch(alone).why
    # From the inventory, as the deploy sees it: no balancer, no cap; one, the cap of its pools.
    hosts = inventory(tmp_path)
    assert converge_batch([h for h in hosts if h.name != "lb1"]).size is None
    assert converge_batch(hosts).size == 1  # STACKS: two int8 hosts, one tq3 host
    # A GPU host whose data does not validate: one host at a time, saying why.
    broken = [InventoryHost("bad", ("gpu_hosts",), {"stack": "int8"}), *hosts]
    assert converge_batch(broken).size == 1
    assert "lb1's data does not validate" in converge_batch(broken).why


def test_endpoints_ask_for_the_model_each_stack_serves(tmp_path, monkeypatch):
    import json

    import yaml

    import rigfleet.endpoints as endpoints
    from rigfleet.catalog import BUILTIN_DIR

    stacks = tmp_path / "stacks"
    stacks.mkdir()
    mine = yaml.safe_load((Path(BUILTIN_DIR) / "int8.yaml").read_text())
    mine.update(name="mine", port=8032, served_model_name="my-model")
    (stacks / "mine.yaml").write_text(yaml.safe_dump(mine, sort_keys=False))
    key = key_file(tmp_path)
    data = gpu_data(key, stack="mine", stacks_dir=str(stacks), ssh_hostname="127.0.0.1")
    hosts = [InventoryHost("host1", ("gpu_hosts",), data),
             InventoryHost("lb1", ("balancers",), {"api_key_file": str(key),
                                                    "ssh_hostname": "127.0.0.1"})]
    asked: list[str] = []

    def urlopen(req, timeout=60, context=None):  # vLLM answers 404 for a model it does not serve
        asked.append(json.loads(req.data)["model"])
        raise OSError("not served here")

    monkeypatch.setattr(endpoints.urllib.request, "urlopen", urlopen)
    endpoints.check(hosts[0])
    endpoints.check_balancer(hosts[1], hosts)
    assert asked == ["my-model", "my-model"]


def test_endpoints_bracket_an_ipv6_ssh_address_in_their_urls(tmp_path):
    from rigfleet.balancer.plan import fleet_plan
    from rigfleet.balancer.status import balancer_url
    from rigfleet.endpoints import front_url

    key = key_file(tmp_path)
    rig = InventoryHost("rig-a", ("gpu_hosts",), gpu_data(key, ssh_hostname="fd00::11"))
    lb = InventoryHost("lb1", ("balancers",), {"api_key_file": str(key),
                                                "ssh_hostname": "fd00::2"})
    assert front_url(rig, validate_host(rig.name, rig.data)) == "http://[fd00::11]:8000"
    assert balancer_url(fleet_plan(lb, [rig, lb]), lb) == "http://[fd00::2]:8080"


@pytest.mark.parametrize(("groups", "port"), [(("balancers", "monitors"), 9090),
                                              (("balancers", "monitors"), 9100),
                                              (("balancers", "gpu_hosts"), 9100)])
def test_a_balancer_port_another_service_of_its_host_takes_is_refused(tmp_path, groups, port):
    from rigfleet.balancer.plan import fleet_plan

    key = key_file(tmp_path)
    data = {**gpu_data(key), "balancer_port": port}
    lb = InventoryHost("lb1", groups, data)
    rig = InventoryHost("rig-a", ("gpu_hosts",), gpu_data(key))
    with pytest.raises(HostDataError, match=f"lb1: balancer_port: {port} is taken by another "
                                            "service of this host"):
        fleet_plan(lb, [rig, lb])
