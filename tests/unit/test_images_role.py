"""The images role and its preflight through pyinfra's API on a ``@fake`` host (the harness of
test_roles_fake.py: a ``FakeRig`` answers the facts and applies the commands; its engine is
tests/unit/images_fakes.py's ``FakeEngine``). Each source kind end to end, "run twice changes
nothing", and the refusals before any host changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import pytest
from fake_rig import FakeRig
from images_fakes import FakeHub, docker_save_tar, image_id_of, pins_text
from test_roles_fake import _fast, deploy  # noqa: F401  (the harness; _fast is autouse)

import rigfleet.images.deploy
import roles.peers
from rigfleet.images.archive import archive_name
from rigfleet.images.checks import SourceChecker
from rigfleet.inventory import InventoryHost
from roles import images, preflight
from roles.preflight import HostRefused

IMAGE = "vllm/vllm-openai:v0.27.1"
DIGEST = "sha256:" + "d" * 64
API_KEY = "k3y-" + "x" * 40
REPO = {"url": "http://apt.rigfleet.test/debian", "key_url": "http://apt.rigfleet.test/k.asc",
        "suite": "stable", "components": ["main"]}


@pytest.fixture
def setup(tmp_path: Path, monkeypatch) -> dict[str, Any]:
    key = tmp_path / "api-key"
    key.write_text(API_KEY + "\n")
    key.chmod(0o600)
    archive = tmp_path / "archive"
    archive.mkdir()
    image_id = docker_save_tar(archive / archive_name(IMAGE), [IMAGE])
    pins = tmp_path / "pins.yaml"
    pins.write_text(pins_text(f'int8: {{image: "{IMAGE}", digest: "{DIGEST}", '
                              f"vllm_version: 0.27.1, image_id: '{image_id}'}}\n"))
    hub: dict[str, tuple[str, int]] = {}
    monkeypatch.setattr(rigfleet.images.deploy, "SourceChecker",
                        lambda: SourceChecker(lambda url: FakeHub(url, hub)))
    data = {"fake_delay": 0, "fake_delay_jitter": 0, "stack": "int8", "power_caps_w": 250,
            "model_dir": "/srv/models", "front_port": 8000, "api_key_file": str(key),
            "pins_file": str(pins), "apt_repos": {"cuda": REPO, "nvidia-container-toolkit": REPO}}
    rig = FakeRig("debian13")
    rig.packages["docker.io"] = "26.1.5"
    rig.engine.pulls[DIGEST] = image_id  # the archive is a save of the image the digest names
    return {"data": data, "rig": rig, "hub": hub, "image_id": image_id, "archive": archive,
            "pins": pins}


def stage() -> None:
    """Preflight, then the images role (what converge runs, without the other roles)."""
    images.images(preflight.preflight())


class StreamRemote:
    """The SSH layer for the streamed archive: ``docker load`` into the rig's engine."""

    def __init__(self, rig: FakeRig) -> None:
        self.rig = rig
        self.loads: list[str] = []

    def stream_in(self, host: InventoryHost, command: str, src: BinaryIO, *,
                  timeout: float = 3600) -> tuple[int, str]:
        data = b""
        while chunk := src.read(1 << 16):
            data += chunk
        self.loads.append(command)
        if command.startswith("cat > "):  # into a file on the host (an upload_dir)
            self.rig.files[command.removeprefix("cat > ").strip("'")] = data
            return 0, ""
        return 0, self.rig.engine.load_tar(data)


def test_default_hub_pulls_by_digest_then_a_second_run_changes_nothing(setup) -> None:
    setup["hub"][DIGEST] = (setup["image_id"], 9 * 1024**3)
    rig = setup["rig"]
    first = deploy(rig, setup["data"], fn=stage)
    assert not first.failed
    assert first.plan == ["Images | Stage vllm/vllm-openai:v0.27.1 from image_sources[0] (hub)"]
    assert first.ran(f"docker pull --quiet {IMAGE}@{DIGEST}")
    assert first.ran(f"docker tag vllm/vllm-openai@{DIGEST} {IMAGE}")
    second = deploy(rig, setup["data"], fn=stage)
    assert second.plan == [] and not second.failed
    assert not second.ran("docker pull") and not second.ran("docker tag")


def test_image_there_by_digest_only_is_just_named(setup) -> None:
    rig = setup["rig"]
    rig.engine.add(setup["image_id"], digests={f"vllm/vllm-openai@{DIGEST}"})
    run = deploy(rig, setup["data"], fn=stage)
    assert run.plan == [f"Images | Name {IMAGE} (there as vllm/vllm-openai@{DIGEST})"]
    assert not run.ran("docker pull") and run.ran(f"docker tag vllm/vllm-openai@{DIGEST} {IMAGE}")
    assert not run.failed


def test_offline_host_gets_the_image_streamed_from_a_control_side_archive(setup,
                                                                          monkeypatch) -> None:
    # Docker Hub does not have it (a purged nightly's fate); the archive does.
    rig = setup["rig"]
    remote = StreamRemote(rig)
    monkeypatch.setattr(roles.peers, "REMOTE", lambda: remote)
    data = {**setup["data"], "image_sources": [{"kind": "hub"},
                                               {"kind": "archive", "path": str(setup["archive"])}]}
    first = deploy(rig, data, fn=stage)
    assert not first.failed
    assert first.plan == [f"Images | Stage {IMAGE} from image_sources[1] "
                          f"(archive {setup['archive']} (this machine))"]
    assert remote.loads == ["docker load"] and not first.ran("docker pull")
    assert first.ran(f"docker tag {setup['image_id']} {IMAGE}")
    assert rig.engine.find(IMAGE).id == setup["image_id"]  # type: ignore[union-attr]
    second = deploy(rig, data, fn=stage)
    assert second.plan == [] and remote.loads == ["docker load"]


def test_uploaded_archive_is_loaded_and_removed(setup, monkeypatch) -> None:
    """It goes over the SSH layer into upload_dir, never through pyinfra's upload: with _sudo
    that stages the whole file in the SSH user's temp dir first (test_secret_upload.py), outside
    upload_dir and its disk check, readable by others, and left there when the copy fails."""
    rig = setup["rig"]
    remote = StreamRemote(rig)
    monkeypatch.setattr(roles.peers, "REMOTE", lambda: remote)
    data = {**setup["data"], "image_sources": [
        {"kind": "archive", "path": str(setup["archive"]), "via": "upload",
         "upload_dir": "/data/up"}]}
    run = deploy(rig, data, fn=stage)
    assert not run.failed
    dest = f"/data/up/{archive_name(IMAGE)}"
    assert dest not in rig.uploads and remote.loads == [f"cat > {dest}"]
    assert run.ran(f"docker load -i {dest}; rc=$?; rm -f {dest}; exit $rc")
    assert dest not in rig.files and rig.engine.find(IMAGE) is not None


def test_host_archive_is_loaded_on_the_host(setup) -> None:
    rig = setup["rig"]
    path = f"/srv/images/{archive_name(IMAGE)}"
    rig.engine.archives[path] = (setup["image_id"], (IMAGE,), 1000)
    data = {**setup["data"], "image_sources": [{"kind": "host-archive", "path": "/srv/images"}]}
    run = deploy(rig, data, fn=stage)
    assert not run.failed and run.ran(f"docker load -i {path}")
    assert deploy(rig, data, fn=stage).plan == []


def test_no_source_refuses_before_any_host_changes(setup) -> None:
    rig = setup["rig"]
    data = {**setup["data"], "image_sources": [
        {"kind": "hub"}, {"kind": "archive", "path": str(setup["archive"] / "gone.tar")},
        {"kind": "host-archive", "path": "/srv/images"}]}
    # The preflight refuses this host alone (roles/preflight.py); the reason is the images'.
    with pytest.raises(HostRefused) as e:
        deploy(rig, data, fn=stage)
    lines = str(e.value).splitlines()
    assert lines[0].startswith(f"@fake/rig: image_sources: {IMAGE} (stacks int8) is not on the "
                               "host and no source can provide it")
    assert lines[1].startswith(f"@fake/rig: image_sources[0] (hub): vllm/vllm-openai@{DIGEST} is "
                               "not there at https://registry-1.docker.io (HTTP 404")
    assert lines[2] == (f"@fake/rig: image_sources[1] (archive {setup['archive'] / 'gone.tar'} "
                        f"(this machine)): {setup['archive'] / 'gone.tar'} is missing on "
                        "this machine")
    assert lines[3] == ("@fake/rig: image_sources[2] (host-archive /srv/images): /srv/images is "
                        "missing on the host")
    assert not [c for c in rig.commands if c.startswith(("docker pull", "docker load",
                                                          "docker tag"))]


def test_a_full_disk_refuses_with_what_is_needed_and_free(setup) -> None:
    setup["hub"][DIGEST] = (setup["image_id"], 10 * 1024**3)
    rig = setup["rig"]
    rig.engine.free = 20 * 1024**3
    with pytest.raises(HostRefused, match=r"staging needs ~32.0 GiB on /var/lib/docker "
                                            r"\(/dev/fake; .* but 20.0 GiB is free"):
        deploy(rig, setup["data"], fn=stage)


def test_a_host_whose_load_fails_verification_fails(setup, monkeypatch) -> None:
    rig = setup["rig"]

    class WrongRemote(StreamRemote):
        def stream_in(self, host, command, src, *, timeout=3600):
            src.read()
            rig.engine.add(image_id_of("other"), tags={IMAGE})  # the load "brings" another
            return 0, "Loaded image: vllm/vllm-openai:v0.27.1"

    monkeypatch.setattr(roles.peers, "REMOTE", lambda: WrongRemote(rig))
    data = {**setup["data"], "image_sources": [{"kind": "archive", "path": str(setup["archive"])}]}
    # The tag by the pinned id fails (that id never arrived): the host fails, not the run.
    run = deploy(rig, data, fn=stage)
    assert run.failed and rig.engine.find(IMAGE).id == image_id_of("other")  # type: ignore[union-attr]
