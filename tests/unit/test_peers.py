"""Peers (no fleet cache): who is the seed, the seed's server (files/rigfleet-peer-serve.py,
a real local HTTP server and a fake ``docker``), and a peer's load that falls back with a
warning."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

import roles.peers as peers
from rigfleet.fleetcache import peer_image_command
from scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "files" / "rigfleet-peer-serve.py"
REPO, REV = "org/model", "ab" * 20
IMAGE_ID = "sha256:" + "1" * 64
OTHER_ID = "sha256:" + "2" * 64


@pytest.fixture(scope="module")
def serve() -> ModuleType:
    return load_script("files/rigfleet-peer-serve.py")


@pytest.fixture()
def seed(serve, tmp_path, monkeypatch):
    """A model dir with one verified revision, a fake ``docker save``, the server running."""
    d = tmp_path / "models" / f"model@{REV[:12]}"
    (d / "sub").mkdir(parents=True)
    files = {"config.json": b"{}", "sub/w.safetensors": b"W" * 3000, ".hidden": b"x"}
    for name, data in files.items():
        (d / name).write_bytes(data)
    listed = {n: {"size": len(b), "mtime": (d / n).stat().st_mtime}
              for n, b in files.items() if not n.startswith(".")}
    (d / ".rigfleet-manifest.json").write_text(json.dumps(
        {"repo": REPO, "revision": REV, "files": listed}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # This host names IMAGE_ID vllm/vllm-openai:v1 and OTHER_ID other/image:v1.
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f'[ "$1 $2" = "save {IMAGE_ID}" ] && printf TARBYTES && exit 0\n'
        f'[ "$1 $2 $5" = "image inspect {IMAGE_ID}" ] && '
        """echo '["vllm/vllm-openai:v1"] ["vllm/vllm-openai@sha256:aa"]' && exit 0\n"""
        f'[ "$1 $2 $5" = "image inspect {OTHER_ID}" ] && '
        """echo '["other/image:v1"] null' && exit 0\n"""
        "exit 1\n")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    server = serve.Server(("127.0.0.1", 0), tmp_path / "models", {"vllm/vllm-openai"})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", d
    server.shutdown()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_the_seed_serves_verified_files_and_pinned_images_only(seed):
    url, d = seed
    base = f"{url}/models/{REPO}/{REV}"
    assert get(f"{base}/sub/w.safetensors") == (200, b"W" * 3000)
    assert get(f"{base}/sub%2Fw.safetensors") == (200, b"W" * 3000)  # the fetcher quotes
    assert get(f"{base}/.hidden")[0] == 404  # nothing under a dot name
    assert get(f"{base}/.rigfleet-manifest.json")[0] == 404
    assert get(f"{url}/models/{REPO}/{'cd' * 20}/config.json")[0] == 404  # another revision
    assert get(f"{base}/../model@{REV[:12]}/config.json")[0] == 404
    assert get(f"{url}/images/{IMAGE_ID}") == (200, b"TARBYTES")
    assert get(f"{url}/images/{OTHER_ID}")[0] == 404  # not a pinned repository's
    assert get(f"{url}/images/sha256:{'3' * 64}")[0] == 404  # not on this host
    # A file changed after it was verified is not served (its peer would drop it anyway).
    (d / "config.json").write_bytes(b"{}")
    os.utime(d / "config.json", (1, 1))
    assert get(f"{base}/config.json")[0] == 404
    # A damaged manifest (an mtime that is no number, a files list) serves nothing, and the
    # server keeps answering.
    manifest = json.loads((d / ".rigfleet-manifest.json").read_text())
    manifest["files"]["sub/w.safetensors"]["mtime"] = "x"
    (d / ".rigfleet-manifest.json").write_text(json.dumps(manifest))
    assert get(f"{base}/sub/w.safetensors")[0] == 404
    (d / ".rigfleet-manifest.json").write_text(json.dumps({**manifest, "files": ["x"]}))
    assert get(f"{base}/sub/w.safetensors")[0] == 404


def test_the_server_stops_on_its_own_when_nobody_asks(serve, tmp_path):
    (tmp_path / "m").mkdir()
    done = threading.Event()

    def run() -> None:
        serve.main(["--port", "0", "--model-dir", str(tmp_path / "m"), "--idle", "0.2"])
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10), "the idle server did not stop"


def test_the_server_answers_peers_over_ipv6_and_ipv4(serve, tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    started: list = []

    class Seen(serve.Server):
        def serve_forever(self, *args) -> None:
            started.append(self)
            super().serve_forever(*args)

    monkeypatch.setattr(serve, "Server", Seen)
    threading.Thread(target=serve.main, args=(["--port", "0", "--model-dir", str(tmp_path / "m"),
                                               "--idle", "60"],), daemon=True).start()
    for _ in range(100):
        if started:
            break
        time.sleep(0.05)
    port = started[0].server_address[1]
    for address in ("::1", "127.0.0.1"):  # a seed reached at its IPv6 or IPv4 address
        socket.create_connection((address, port), 2).close()
    started[0].shutdown()


def _fake_bin(tmp_path: Path, curl_ok: bool) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    for name, body in (("curl", f"[ {int(curl_ok)} = 1 ] && printf tar || exit 22"),
                       # as Docker's: an empty stdin is no image
                       ("docker", 'case "$1" in load) [ -n "$(cat)" ] || exit 1 ;; esac')):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{body}\n')
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}, log


@pytest.mark.parametrize("curl_ok", [True, False])
def test_a_peers_load_is_checked_by_id_and_falls_back_with_a_warning(tmp_path, curl_ok):
    env, log = _fake_bin(tmp_path, curl_ok)
    record = tmp_path / "loaded" / "d1"
    cmd = peer_image_command("http://host1:8082", IMAGE_ID, "vllm/vllm-openai:v1", str(record),
                             "docker pull --quiet hub-ref", "[mark] ")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env)
    assert proc.returncode == 0
    calls = log.read_text().splitlines()
    if curl_ok:
        # curl and docker load run at once (a pipe): either may log first
        assert sorted(calls[:2]) == [f"curl -fsS http://host1:8082/images/{IMAGE_ID}",
                                     "docker load -q"]
        assert calls[2:] == [f"docker image inspect {IMAGE_ID}",
                             f"docker tag {IMAGE_ID} vllm/vllm-openai:v1"]
        assert proc.stderr == ""
        # a load has no RepoDigests: the record says which digest this id stands for
        assert record.read_text() == f"{IMAGE_ID}\n"
    else:
        assert calls[-1] == "docker pull --quiet hub-ref"
        assert not record.exists()
        assert "[mark] vllm/vllm-openai:v1: the load from peer http://host1:8082 failed" \
            in proc.stderr


class FakeHost:
    def __init__(self, name: str, groups: tuple[str, ...], data: dict) -> None:
        self.name, self.groups, self.data = name, groups, data


def _desired(image_id: str, model_dir: str = "/srv/models", front: str | None = None):
    pins = SimpleNamespace(image_id=image_id, image="vllm/vllm-openai:v1")
    settings = SimpleNamespace(peer_port=8082, model_dir=model_dir, front_port=8000,
                               balancer_front_address=front)
    return SimpleNamespace(stacks={"int8": SimpleNamespace(pins=pins)}, settings=settings)


@pytest.mark.parametrize(("me", "limit", "caches", "seed"), [
    ("host2", None, False, "host1"),       # the first GPU host of the run is the seed
    ("host1", None, False, None),          # the seed fetches itself
    ("host3", ["host2", "host3"], False, "host2"),  # host1 is not in this run
    ("host2", None, True, None),           # a fleet cache: no peers
])
def test_the_seed_is_the_first_gpu_host_of_the_run_that_wants_it(monkeypatch, me, limit,
                                                                 caches, seed):
    hosts = [FakeHost("lb1", ("balancers",) + (("caches",) if caches else ()), {}),
             *(FakeHost(f"host{i}", ("gpu_hosts",), {"ssh_hostname": f"10.0.0.{i}"})
               for i in (1, 2, 3))]
    by_name = {h.name: h for h in hosts}
    state = SimpleNamespace(is_host_in_limit=lambda h: limit is None or h.name in limit,
                            failed_hosts=set())
    monkeypatch.setattr(peers, "host", SimpleNamespace(name=me, inventory=hosts, state=state))
    monkeypatch.setattr(peers, "_desired", lambda name, data: _desired(IMAGE_ID))
    got = peers.peer_for(lambda want: IMAGE_ID in {s.pins.image_id
                                                   for s in want.stacks.values()})
    assert (got.seed if got else None) == seed
    if got is not None:
        assert got.url == f"http://{by_name[seed].data['ssh_hostname']}:8082"
        assert "--repository vllm/vllm-openai" in got.start
        assert "--model-dir /srv/models" in got.start


def test_a_host_refused_in_its_preflight_is_no_seed(monkeypatch):
    hosts = [FakeHost(f"host{i}", ("gpu_hosts",), {}) for i in (1, 2, 3)]
    state = SimpleNamespace(is_host_in_limit=lambda h: True, failed_hosts={hosts[0]})
    for me, seed in (("host2", None), ("host3", "host2")):
        monkeypatch.setattr(peers, "host", SimpleNamespace(name=me, inventory=hosts,
                                                           state=state))
        monkeypatch.setattr(peers, "_desired", lambda name, data: _desired(IMAGE_ID))
        got = peers.peer_for(lambda want: True)
        assert (got.seed if got else None) == seed


@pytest.mark.parametrize(("front", "url"), [
    ("rig-a.lan:8000", "http://rig-a.lan:8082"),
    ("[fd00::11]:8000", "http://[fd00::11]:8082"),  # an IPv6 seed: in brackets
])
def test_the_seed_is_reached_where_the_balancer_reaches_it(monkeypatch, front, url):
    hosts = [FakeHost(f"host{i}", ("gpu_hosts",), {}) for i in (1, 2)]
    state = SimpleNamespace(is_host_in_limit=lambda h: True, failed_hosts=set())
    monkeypatch.setattr(peers, "host", SimpleNamespace(name="host2", inventory=hosts,
                                                       state=state))
    monkeypatch.setattr(peers, "_desired",
                        lambda name, data: _desired(IMAGE_ID, front=front))
    got = peers.peer_for(lambda want: True)
    assert got is not None and got.url == url

