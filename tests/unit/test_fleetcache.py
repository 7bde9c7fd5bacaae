"""The fleet cache: its host kind and data, the registry's and nginx's configs, the model
mirrors the rigs get from the inventory, and the fetcher's mirror path against a real local
HTTP server (a good file is used, a corrupted one and a cache that is down are skipped with a
warning, nothing unverified stays)."""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
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
    model_mirrors,
    model_path,
    render_nginx_site,
    render_registry_config,
)
from rigfleet.hostdata import HostDataError, validate_cache
from rigfleet.inventory import InventoryHost, caches, host_kind
from rigfleet.resources import project_file

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
    assert (kind.gpu, kind.cache, kind.service) == (gpu, cache, service)
    hosts = [InventoryHost("rig-a", (), {}), InventoryHost("lb1", tuple(groups) or ("x",), {})]
    assert [h.name for h in caches(hosts)] == (["lb1"] if cache else [])


def test_cache_data_defaults_and_address(tmp_path):
    key = key_file(tmp_path)
    s = validate_cache("lb1", {"api_key_file": str(key), "ssh_hostname": "lb1.lan"})
    assert (s.address, s.registry_port, s.model_port) == ("lb1.lan", 5000, 8081)
    assert s.registry_upstream == "https://registry-1.docker.io"
    assert s.model_url == "http://lb1.lan:8081" and s.registry_url == "http://lb1.lan:5000"
    s = validate_cache("lb1", {"api_key_file": str(key), "cache_address": "10.0.0.5",
                               "cache_registry_upstream": "http://reg.lan:5000/"})
    assert s.model_url == "http://10.0.0.5:8081" and s.registry_upstream == "http://reg.lan:5000"


def test_bad_cache_data_names_host_key_value_and_what_is_allowed(tmp_path):
    key = key_file(tmp_path)
    with pytest.raises(HostDataError) as e:
        validate_cache("lb1", {"api_key_file": str(key), "cache_model_port": 8080,
                               "cache_registry_port": 8080, "cache_model_dir": "srv/x",
                               "cache_adress": "x", "cache_registry_upstream": "ftp://x"},
                       taken=[8080])
    text = str(e.value)
    for line in ("lb1: cache_model_port: 8080 is cache_registry_port too; allowed:",
                 "lb1: cache_registry_port: 8080 is taken by another service of this host",
                 "lb1: cache_model_dir: 'srv/x'", "did you mean 'cache_address'?",
                 "lb1: cache_registry_upstream: 'ftp://x'"):
        assert line in text


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
    spec = importlib.util.spec_from_file_location(
        "rigfleet_fetch_weights", project_file("files/rigfleet-fetch-weights.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
