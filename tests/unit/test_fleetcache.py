"""The fleet cache: its host kind and data, the registry's and nginx's configs, the model
mirrors the rigs get from the inventory, and the fetcher's mirror path against a real local
HTTP server (a good file is used, a corrupted one and a cache that is down are skipped with a
warning, nothing unverified stays)."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import yaml
from balancer_helpers import key_file

from rigfleet.commands import weights as weights_commands
from rigfleet.fleetcache import (
    SEED_CONFIG,
    SEED_SCRIPT,
    SEED_SERVICE,
    SEED_SOCKET,
    model_mirrors,
    model_path,
    render_nginx_site,
    render_registry_config,
    render_seed_config,
    render_seed_unit,
    seed_command,
    validate_cache_host,
)
from rigfleet.hostdata import HostDataError, validate_cache
from rigfleet.image_sources import NO_CHECK, ImageSource
from rigfleet.images.checks import SourceChecker
from rigfleet.images.hoststate import HostImageState, Space
from rigfleet.images.plan import (
    GIB,
    WARNING_MARK,
    Shell,
    SourceResult,
    WantedImage,
    plan_host,
)
from rigfleet.inventory import HostKind, InventoryHost, host_kind
from roles.docker import daemon_settings, merge_daemon_config
from scripts import load_script

REPO, REV = "org/model", "ab" * 20


@pytest.mark.parametrize(("groups", "gpu", "cache", "service"), [
    (("caches",), False, True, True),
    (("caches", "balancers", "monitors"), False, True, True),
    (("caches", "gpu_hosts"), True, True, True),
    ((), True, False, False),
])
def test_a_cache_host_is_a_service_host_never_a_rig_unless_in_gpu_hosts(groups, gpu, cache,
                                                                          service):
    kind = host_kind(groups)
    in_service_group = kind.balancer or kind.monitor or kind.cache
    assert (kind.gpu, kind.cache, in_service_group) == (gpu, cache, service)
    hosts = [InventoryHost("rig-a", (), {}), InventoryHost("lb1", tuple(groups) or ("x",), {})]
    assert [h.name for h in hosts if h.kind.cache] == (["lb1"] if cache else [])


def test_cache_data_defaults_and_address(tmp_path):
    key = key_file(tmp_path)
    s = validate_cache("lb1", {"api_key_file": str(key), "ssh_hostname": "lb1.lan"})
    assert (s.address, s.registry_port, s.model_port) == ("lb1.lan", 5000, 8081)
    assert s.registry_upstream == "https://registry-1.docker.io"
    assert s.model_url == "http://lb1.lan:8081" and s.registry_url == "http://lb1.lan:5000"
    s = validate_cache("lb1", {"api_key_file": str(key), "cache_address": "10.0.0.5",
                               "cache_registry_upstream": "http://reg.lan:5000/"})
    assert s.model_url == "http://10.0.0.5:8081" and s.registry_upstream == "http://reg.lan:5000"
    s = validate_cache("lb1", {"api_key_file": str(key), "cache_address": "fd00::5"})
    assert s.model_url == "http://[fd00::5]:8081" and s.registry_url == "http://[fd00::5]:5000"


def test_bad_cache_data_names_host_key_value_and_what_is_allowed(tmp_path):
    key = key_file(tmp_path)
    with pytest.raises(HostDataError) as e:
        validate_cache("lb1", {"api_key_file": str(key), "cache_model_port": 8080,
                               "cache_registry_port": 8080, "cache_model_dir": "srv/x",
                               "cache_adress": "x", "cache_registry_upstream": "ftp://x",
                               "balancer_port": 8080},
                       HostKind(gpu=False, balancer=True, cache=True))
    text = str(e.value)
    for line in ("lb1: cache_model_port: 8080 is cache_registry_port too; allowed:",
                 "lb1: cache_registry_port: 8080 is taken by another service of this host",
                 "lb1: cache_model_dir: 'srv/x'", "did you mean 'cache_address'?",
                 "lb1: cache_registry_upstream: 'ftp://x'"):
        assert line in text



def test_a_cache_on_a_host_that_serves_keeps_the_stacks_loopback_ports(tmp_path):
    # the registry and nginx listen on every address: on a stack's loopback port they and that
    # stack's container (127.0.0.1) cannot both bind; the port was accepted
    data = {"api_key_file": str(key_file(tmp_path)), "cache_model_port": 8011,
            "front_port": 8000}
    assert validate_cache_host("lb1", ("caches",), data).model_port == 8011  # serves nothing
    with pytest.raises(HostDataError, match=r"^rig-a: cache_model_port: 8011 is taken by "
                       r"another service of this host; allowed: a port none of this host's "
                       r"other services use \(\[8000, 8011, "):
        validate_cache_host("rig-a", ("caches", "gpu_hosts"), data)


def test_registry_config_is_a_pull_through_cache_without_auth(tmp_path):
    s = validate_cache("lb1", {"api_key_file": str(key_file(tmp_path)),
                               "cache_registry_upstream": "http://registry.test:5000",
                               "cache_registry_port": 5001})
    conf = yaml.safe_load(render_registry_config(s))
    assert conf["proxy"] == {"remoteurl": "http://registry.test:5000"}
    assert conf["http"] == {"addr": ":5001"}
    assert "auth" not in conf
    assert conf["storage"]["filesystem"]["rootdirectory"] == "/var/lib/docker-registry"
    assert conf["log"]["accesslog"] == {"disabled": False}


def test_nginx_site_serves_the_model_dir_read_only_and_hides_dot_names(tmp_path):
    s = validate_cache("lb1", {"api_key_file": str(key_file(tmp_path)),
                               "cache_model_dir": "/srv/cache/models"})
    site = render_nginx_site(s)
    assert "listen 8081;" in site and "root /srv/cache/models;" in site
    assert "[::]" not in site  # (a deployed IPv4 cache's site as it was)
    # nginx's "listen 8081" is IPv4 only ([::] sockets are ipv6only=on since nginx 1.3.4)
    v6 = validate_cache("lb1", {"api_key_file": str(key_file(tmp_path)),
                                "cache_address": "fd00::5"})
    assert "    listen 8081;\n    listen [::]:8081;\n" in render_nginx_site(v6)
    assert "location ~ /\\. {\n        return 404;" in site
    assert "limit_except GET {\n            deny all;" in site
    assert "autoindex off;" in site
    nginx = shutil.which("nginx")
    if nginx:  # the real parser, where this machine has nginx
        conf = tmp_path / "nginx.conf"
        conf.write_text(f"pid {tmp_path}/pid; error_log {tmp_path}/err;\nevents {{}}\n"
                        f"http {{\n{site.replace('/var/log/nginx', str(tmp_path))}}}\n")
        subprocess.run([nginx, "-t", "-q", "-c", str(conf)], check=True)
    assert model_path("/srv/cache/models", REPO, REV) == f"/srv/cache/models/{REPO}/{REV}"


def _host(name, groups, data):
    return SimpleNamespace(name=name, groups=groups, data=data)


def test_rigs_get_every_valid_cache_in_inventory_order(tmp_path):
    key = str(key_file(tmp_path))
    inventory = [_host("rig-a", (), {}),
                 _host("c1", ("caches",), {"api_key_file": key, "cache_address": "c1.lan"}),
                 _host("bad", ("caches",), {"api_key_file": key, "cache_model_port": "x"}),
                 _host("c2", ("caches", "balancers"), {"api_key_file": key,
                                                       "cache_model_port": 9000})]
    assert model_mirrors(inventory) == ("http://c1.lan:8081", "http://c2:9000")
    assert model_mirrors(inventory[:1]) == ()


def test_fetch_command_passes_the_mirrors_in_order_quoted():
    cmd = weights_commands.fetch(REPO, REV, "/srv/m/x", mirrors=("http://c1:8081", "http://c 2"))
    assert cmd.endswith("--mirror http://c1:8081 --mirror 'http://c 2'")
    assert "--mirror" not in weights_commands.fetch(REPO, REV, "/srv/m/x")


# --- the fetcher's mirror path, against a real HTTP server -------------------------------------


@pytest.fixture(scope="module")
def fetcher() -> ModuleType:
    return load_script("files/rigfleet-fetch-weights.py")


@pytest.fixture()
def cache_server(tmp_path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "cache"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def _listing(files: dict[str, bytes], lfs: set[str]) -> dict[str, dict]:
    out = {}
    for name, data in files.items():
        blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
        out[name] = {"size": len(data), "blob_id": blob,
                     "sha256": hashlib.sha256(data).hexdigest() if name in lfs else None}
    return out


FILES = {"model.safetensors": b"W" * 5000, "config.json": b'{"a": 1}\n',
         "sub/tokenizer.json": b"{}\n"}


def test_verified_files_come_from_the_cache(fetcher, cache_server, tmp_path, capsys):
    url, root = cache_server
    for name, data in FILES.items():
        (root / REPO / REV / name).parent.mkdir(parents=True, exist_ok=True)
        (root / REPO / REV / name).write_bytes(data)
    work = tmp_path / "work"
    work.mkdir()
    expected = _listing(FILES, {"model.safetensors"})
    missing, given = fetcher.from_mirrors([url], REPO, REV, work, expected)
    assert missing == set() and given == sum(len(d) for d in FILES.values())
    assert {n: (work / n).read_bytes() for n in FILES} == FILES
    assert "WARNING" not in capsys.readouterr().err


def test_a_corrupted_file_is_dropped_with_a_warning(fetcher, cache_server, tmp_path, capsys):
    url, root = cache_server
    for name, data in FILES.items():
        (root / REPO / REV / name).parent.mkdir(parents=True, exist_ok=True)
        (root / REPO / REV / name).write_bytes(data)
    # Same size, one byte flipped (sha256 differs); a small file whose git blob id differs.
    (root / REPO / REV / "model.safetensors").write_bytes(b"W" * 4999 + b"X")
    (root / REPO / REV / "config.json").write_bytes(b'{"a": 2}\n')
    work = tmp_path / "work"
    work.mkdir()
    missing, given = fetcher.from_mirrors([url], REPO, REV, work,
                                          _listing(FILES, {"model.safetensors"}))
    assert missing == {"model.safetensors", "config.json"}
    assert given == len(FILES["sub/tokenizer.json"])
    assert not (work / "model.safetensors").exists() and not (work / "config.json").exists()
    assert not list(work.rglob("*" + fetcher.MIRROR_PART))
    err = capsys.readouterr().err
    assert f"WARNING: mirror {url}: model.safetensors: sha256 " in err
    assert f"WARNING: mirror {url}: config.json: git blob " in err


def test_a_verified_file_changed_in_place_is_fetched_again_from_the_cache(
        fetcher, cache_server, tmp_path, monkeypatch, capsys):
    """A repair: a shard changed on the host with its size kept is not taken for present
    (it was, and the verification after the mirrors failed)."""
    url, root = cache_server
    for name, data in FILES.items():
        for base in (root / REPO / REV, tmp_path / "model"):
            (base / name).parent.mkdir(parents=True, exist_ok=True)
            (base / name).write_bytes(data)
    final = tmp_path / "model"
    expected = _listing(FILES, {"model.safetensors"})
    fetcher.write_manifest(final, REPO, REV, fetcher.verify(final, expected))
    shard = final / "model.safetensors"
    shard.write_bytes(b"W" * 4999 + b"X")  # same size, written later (a clock tick may be
    os.utime(shard, (shard.stat().st_atime, shard.stat().st_mtime + 2))  # coarser than this)
    assert not fetcher.manifest_matches(final, REPO, REV)[0]
    # A damaged manifest is as good as a changed file, never a traceback.
    for meta in ({"size": 5000, "mtime": "x"}, "x"):
        assert fetcher.moved(final, "model.safetensors", meta) is not None
    monkeypatch.setattr(fetcher, "hub_files", lambda repo, revision, token: expected)
    args = SimpleNamespace(local_dir=str(final), lock_dir=str(tmp_path / "locks"), repo=REPO,
                           revision=REV, token_file=None, mirror=[url])
    assert fetcher.fetch(args) == 0
    assert (final / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert fetcher.manifest_matches(final, REPO, REV) == (True, "matches manifest")
    out = capsys.readouterr().out
    assert "(1 changed file(s) removed)" in out and f"mirrors gave {5000} bytes" in out


def test_a_cache_that_is_down_is_skipped_with_a_warning(fetcher, tmp_path, capsys):
    with socketless_port() as port:
        down = f"http://127.0.0.1:{port}"
    work = tmp_path / "work"
    work.mkdir()
    missing, given = fetcher.from_mirrors([down], REPO, REV, work, _listing(FILES, set()))
    assert missing == set(FILES) and given == 0
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and f"mirror {down} cannot be reached" in err


def test_a_cache_miss_is_no_warning_and_the_next_mirror_is_asked(fetcher, cache_server,
                                                                 tmp_path, capsys):
    url, root = cache_server
    (root / REPO / REV).mkdir(parents=True)
    (root / REPO / REV / "config.json").write_bytes(FILES["config.json"])
    work = tmp_path / "work"
    work.mkdir()
    missing, _ = fetcher.from_mirrors([url], REPO, REV, work, _listing(FILES, set()))
    assert missing == {"model.safetensors", "sub/tokenizer.json"}
    assert "WARNING" not in capsys.readouterr().err


class socketless_port:
    """A local port nothing listens on (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        return int(self.s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.s.close()


# --- images: the cache's registry first, the next source on the host when it fails ------------

IMAGE = "vllm/vllm-openai:v0.27.1"
DIGEST = "sha256:" + "d" * 64
W = WantedImage(IMAGE, DIGEST, "sha256:" + "1" * 64, ("int8",))
CACHE = ImageSource("registry", url="http://lb1:5000", check=NO_CHECK, cache="lb1")


def _state() -> HostImageState:
    return HostImageState("/var/lib/docker", {}, free={"root": Space("/dev/sda1",
                                                                            500 * GIB)})


class _Hub:
    def __init__(self, url: str) -> None:
        self.url, self.asked = url, 0

    def digest(self, repo: str, ref: str) -> str:
        self.asked += 1
        return ref

    def resolve(self, repo: str, ref: str):
        return SimpleNamespace(layer_bytes=3 * GIB, image_id="sha256:" + "1" * 64)


def test_the_cache_is_not_asked_from_here_and_the_next_source_is_the_fallback(tmp_path):
    settings = SimpleNamespace(image_sources=(ImageSource("hub"),),
                               bump_registry="http://hub.test")
    checker = SourceChecker(_Hub)
    results = checker.results(W, settings, _state(), (CACHE, *settings.image_sources))
    assert [(r.ok, r.label) for r in results] == [
        (True, "fleet cache lb1 (http://lb1:5000)"), (True, "image_sources[0] (hub)")]
    plan = plan_host("rig-a", [W], _state(), {IMAGE: results})
    [p] = plan.images
    assert p.source is results[0] and p.need == {"root": 9 * GIB} and plan.problems == ()
    [step] = p.steps
    assert isinstance(step, Shell) and WARNING_MARK in step.command


def _run_with_fake_docker(tmp_path: Path, command: str, cache_ok: bool) -> tuple[int, str, str]:
    """Run the plan's command in bash with a ``docker`` that logs its calls and fails pulls
    from the cache when it is 'down' (as a pull from a dead host or a bad blob does)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    fake = bin_dir / "docker"
    fake.write_text("#!/bin/sh\n"
                    f'echo "$*" >> {log}\n'
                    f'case "$*" in *lb1:5000*) [ {int(cache_ok)} = 1 ] || '
                    '{ echo "digest verification failed" >&2; exit 1; } ;; esac\n')
    fake.chmod(0o755)
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    return proc.returncode, log.read_text(), proc.stderr


def test_a_failed_pull_from_the_cache_falls_back_to_the_hub_with_a_warning(tmp_path):
    results = [SourceResult(0, CACHE, True, "not checked", ref=None),
               SourceResult(0, ImageSource("hub"), True, "there", 3 * GIB)]
    [p] = plan_host("rig-a", [W], _state(), {IMAGE: results}).images
    [step] = p.steps
    assert isinstance(step, Shell)
    rc, calls, err = _run_with_fake_docker(tmp_path, step.command, cache_ok=False)
    ref = f"lb1:5000/vllm/vllm-openai@{DIGEST}"
    assert rc == 0
    assert calls.splitlines() == [f"pull --quiet {ref}", f"pull --quiet {IMAGE}@{DIGEST}",
                                  f"tag vllm/vllm-openai@{DIGEST} {IMAGE}"]
    assert f"{WARNING_MARK}{IMAGE}: the pull from fleet cache lb1 (http://lb1:5000) failed" \
        in err and "pulling from image_sources[0] (hub) instead" in err


def test_a_good_pull_from_the_cache_is_all_that_runs(tmp_path):
    results = [SourceResult(0, CACHE, True, "not checked"),
               SourceResult(0, ImageSource("hub"), True, "there", 3 * GIB)]
    [p] = plan_host("rig-a", [W], _state(), {IMAGE: results}).images
    rc, calls, err = _run_with_fake_docker(tmp_path, p.steps[0].command, cache_ok=True)
    ref = f"lb1:5000/vllm/vllm-openai@{DIGEST}"
    assert rc == 0 and calls.splitlines() == [f"pull --quiet {ref}", f"tag {ref} {IMAGE}"]
    assert "WARNING" not in err


def test_cache_registries_are_added_to_insecure_registries_keeping_the_users():
    merged = merge_daemon_config({"insecure-registries": ["mine:5000"]},
                                 daemon_settings(None, ("lb1:5000",)))
    assert merged["insecure-registries"] == ["mine:5000", "lb1:5000"]
    assert merge_daemon_config(merged, daemon_settings(None, ("lb1:5000",))) == merged
    assert "insecure-registries" not in daemon_settings(None)


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq (a base package of every host)")
@pytest.mark.parametrize("seed_rc", [0, 4])
def test_seeding_runs_the_seeding_registry_only_meanwhile_and_keeps_the_scripts_code(
        tmp_path, seed_rc):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    for name, rc in (("systemctl", 0), ("python3", seed_rc)):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit {rc}\n')
        (bin_dir / name).chmod(0o755)
    cmd = seed_command("https://registry-1.docker.io", "vllm/vllm-openai", "sha256:" + "a" * 64,
                       "/var/lib/rigfleet/m")
    proc = subprocess.run(["bash", "-c", cmd], env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert proc.returncode == seed_rc
    calls = log.read_text().splitlines()
    assert calls[0] == f"systemctl start {SEED_SERVICE}"
    assert calls[1].startswith(f"python3 {SEED_SCRIPT} --upstream "
                               "https://registry-1.docker.io --socket ")
    assert "--repo vllm/vllm-openai" in calls[1] and "--marker /var/lib/rigfleet/m" in calls[1]
    assert calls[2:] == [f"systemctl stop {SEED_SERVICE}"]


def test_the_seeding_registry_shares_the_proxys_storage_on_a_socket_only(tmp_path):
    seed, proxy = yaml.safe_load(render_seed_config()), yaml.safe_load(render_registry_config(
        validate_cache("lb1", {"api_key_file": str(key_file(tmp_path))})))
    assert seed["storage"] == {"filesystem": proxy["storage"]["filesystem"]}
    assert seed["http"] == {"net": "unix", "addr": SEED_SOCKET} and "proxy" not in seed
    unit = render_seed_unit()
    assert f"ExecStart=/usr/bin/docker-registry serve {SEED_CONFIG}" in unit
    assert "User=docker-registry" in unit and "[Install]" not in unit  # never enabled


def test_the_cache_alone_never_makes_an_image_available():
    """What no upstream holds is refused before any host changes, the cache not named."""
    results = [SourceResult(0, CACHE, True, "not checked"),
               SourceResult(0, ImageSource("hub"), False, "not there (HTTP 404)")]
    plan = plan_host("rig-a", [W], _state(), {IMAGE: results})
    assert plan.images[0].action == "refused"
    assert any("image_sources[0] (hub): not there" in p for p in plan.problems)
    assert not any("fleet cache" in p for p in plan.problems)


# --- benchmarks/fleet_fetch.py: what each source's own log says it served ---------------------


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("benchmarks/fleet_fetch.py")


def test_the_benchmark_counts_each_sources_bytes_from_its_own_log(bench):
    hub = ["2026-12-04T06:40:01.1Z [hub] 10.0.0.61 GET /org/m/resolve/abc/model.safetensors "
           "200 5000B",
           "2026-12-04T06:40:01.2Z [hub] 10.0.0.11 HEAD /org/m/resolve/abc/model.safetensors "
           "200 0B",
           "2026-12-04T06:40:01.3Z [hub] 10.0.0.11 GET /api/models/org/m/revision/abc 200 700B",
           "2026-12-04T06:40:01.4Z [hub] 10.0.0.11 GET /org/m/resolve/abc/x 404 40B",
           "2026-12-04T06:40:01.5Z [hub] faults set: {}"]
    assert bench.hub_bytes(hub) == (5700, 2)
    registry = [
        '10.0.0.61 - - [04/Dec/2026:06:40:01 +0000] "GET /v2/vllm/vllm-openai/blobs/sha256:a '
        'HTTP/1.1" 200 12345 "" "docker/26.1.5"',
        '127.0.0.1 - - [04/Dec/2026:06:40:02 +0000] "GET /v2/vllm/vllm-openai/blobs/sha256:a '
        'HTTP/1.1" 200 12345 "" "curl/8"',
        '10.0.0.11 - - [04/Dec/2026:06:40:03 +0000] "HEAD /v2/vllm/vllm-openai/manifests/x '
        'HTTP/1.1" 200 0 "" "docker/26.1.5"',
        'time="2026-12-04T06:40:01Z" level=info msg="response completed" '
        'http.response.written=12345']
    assert bench.access_bytes(registry) == (24690, 2)
    assert bench.access_bytes(registry, skip_clients=("127.0.0.1",)) == (12345, 1)
    nginx = ["2026-12-04T06:40:01+00:00 10.0.0.11 200 5000 GET /org/m/abc/model.safetensors",
             "2026-12-04T06:40:01+00:00 10.0.0.12 200 5000 GET /org/m/abc/model.safetensors",
             "2026-12-04T06:40:01+00:00 10.0.0.12 404 153 GET /org/m/abc/other"]
    total, files, clients = bench.nginx_bytes(nginx)
    assert (total, files, dict(clients)) == (10000, 2, {"10.0.0.11": 1, "10.0.0.12": 1})
    assert bench.wan_ratio(5700 + 12345, 17000) == pytest.approx(1.0615, abs=1e-3)


def test_warning_lines_of_a_successful_command_are_shown_as_the_hosts_warnings():
    from pyinfra.connectors.util import CommandOutput, OutputLine

    from roles.ops import WarnedCommand
    from roles.weights import WARNING_MARK as WEIGHTS_MARK

    shown: list[str] = []
    output = CommandOutput([OutputLine("stdout", "[rigfleet-weights] verified 3 files"),
                            OutputLine("stderr", f"{WEIGHTS_MARK}mirror http://lb1:8081 cannot "
                                       "be reached (refused); skipped"),
                            OutputLine("stderr", "some other noise")])
    host = SimpleNamespace(run_shell_command=lambda *a, **k: (True, output),
                           log_styled=lambda text, **k: shown.append(text))
    state = SimpleNamespace(print_output=False, print_input=False)
    cmd = WarnedCommand(WEIGHTS_MARK, "fetch ...")
    assert cmd.execute(state, host, {}) == (True, output)
    assert shown == ["mirror http://lb1:8081 cannot be reached (refused); skipped"]


def test_rigs_leave_out_a_cache_its_own_preflight_refuses(tmp_path):
    key = str(key_file(tmp_path))
    clash = _host("mon", ("caches", "monitors"), {"api_key_file": key, "cache_model_port": 9090})
    fine = _host("c1", ("caches",), {"api_key_file": key, "cache_model_port": 9090})
    with pytest.raises(HostDataError, match="9090"):
        validate_cache_host(clash.name, clash.groups, clash.data)
    assert model_mirrors([clash, fine]) == ("http://c1:9090",)


def test_a_cache_on_a_gpu_host_keeps_clear_of_its_node_exporter(tmp_path):
    key = str(key_file(tmp_path))
    rig = _host("rig-a", ("gpu_hosts", "caches"), {"api_key_file": key, "front_port": 8000,
                                                   "cache_registry_port": 9100})
    with pytest.raises(HostDataError, match="cache_registry_port: 9100 is taken"):
        validate_cache_host(rig.name, rig.groups, rig.data)


@pytest.mark.parametrize("model_dir", ["/srv/rigfleet cache", "/srv/a;b", "/srv/$models",
                                       "/srv/a{b}", "/srv/a#b"])
def test_a_cache_model_dir_nginx_cannot_serve_as_written_is_refused(tmp_path, model_dir):
    data = {"api_key_file": str(key_file(tmp_path)), "cache_model_dir": model_dir}
    with pytest.raises(HostDataError, match=r"c1: cache_model_dir: .* nginx"):
        validate_cache_host("c1", ("caches",), data)
    fine = validate_cache_host("c1", ("caches",), {**data, "cache_model_dir": "/srv/c-1/m_2.x@y"})
    assert "root /srv/c-1/m_2.x@y;" in render_nginx_site(fine)
