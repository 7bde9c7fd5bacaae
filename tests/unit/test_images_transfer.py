"""Saving and loading images over the SSH layer (rigfleet/images/transfer.py), with a fake
``Remote`` whose host runs a fake engine that writes and reads real ``docker save`` tars."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from images_fakes import FakeEngine, FakeRemote, docker_save_tar, image_config

from rigfleet.bump.candidate import Candidate
from rigfleet.bump.images import ImageError as BumpImageError
from rigfleet.bump.images import save_image
from rigfleet.images.archive import archive_name, inspect_archive, read_sidecar
from rigfleet.images.plan import WantedImage
from rigfleet.images.transfer import ImageError, export_image, load_archive
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import HostUnreachable

IMAGE = "vllm/vllm-openai:v0.27.1"
DIGEST = "sha256:" + "d" * 64
HOST = InventoryHost("host1", (), {})


def pulled_engine() -> tuple[FakeEngine, str]:
    """An engine holding the pinned image pulled by digest (untagged), with its config."""
    engine = FakeEngine()
    config = image_config(b"v0.27.1 layers")
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    engine.add(image_id, digests={f"vllm/vllm-openai@{DIGEST}"}, config=config)
    return engine, image_id


def test_export_saves_under_the_pinned_name_with_a_sidecar(tmp_path) -> None:
    engine, image_id = pulled_engine()
    remote = FakeRemote(engine)
    metered: list[int] = []
    saved = export_image(remote, HOST, WantedImage(IMAGE, DIGEST, image_id, ("int8",)),
                         tmp_path / "out", "0.27.1", metered.append)
    assert saved.path == tmp_path / "out" / archive_name(IMAGE)
    assert saved.image_id == image_id and sum(metered) == saved.size == saved.path.stat().st_size
    assert saved.sha256 == hashlib.sha256(saved.path.read_bytes()).hexdigest()
    info = inspect_archive(saved.path)
    assert info.holds(image_id) and info.images[0].repo_tags == (IMAGE,)
    side = read_sidecar(saved.path)
    assert {k: side[k] for k in ("image", "digest", "image_id", "vllm_version", "sha256",
                                 "bytes", "saved_from")} == {
        "image": IMAGE, "digest": DIGEST, "image_id": image_id, "vllm_version": "0.27.1",
        "sha256": saved.sha256, "bytes": saved.size, "saved_from": "host1"}
    assert not list((tmp_path / "out").glob("*.partial"))


def test_export_refuses_an_absent_image_and_a_wrong_archive(tmp_path) -> None:
    with pytest.raises(ImageError, match=r"host1: vllm/vllm-openai:v0.27.1 \(digest sha256:d+\) "
                                         r"is not on the host; nothing to save"):
        export_image(FakeRemote(FakeEngine()), HOST, WantedImage(IMAGE, DIGEST, None, ()),
                     tmp_path)
    engine, image_id = pulled_engine()
    remote = FakeRemote(engine)
    remote.corrupt = True
    with pytest.raises(ImageError, match=f"the saved archive holds .* not {image_id}"):
        export_image(remote, HOST, WantedImage(IMAGE, DIGEST, image_id, ()), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_save_that_breaks_off_leaves_no_partial_archive(tmp_path) -> None:
    engine, image_id = pulled_engine()

    class Dropped(FakeRemote):
        def stream_out(self, host, command, dest, *, timeout=3600):  # type: ignore[no-untyped-def]
            dest.write(b"half a tar")
            raise HostUnreachable("host1: the connection broke off")

    with pytest.raises(HostUnreachable):
        export_image(Dropped(engine), HOST, WantedImage(IMAGE, DIGEST, image_id, ()), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_bump_save_dir_uses_the_same_export(tmp_path) -> None:
    engine, image_id = pulled_engine()
    saved = save_image(FakeRemote(engine), HOST, Candidate("vllm/vllm-openai", "v0.27.1", DIGEST),
                       tmp_path, "0.27.1")
    side = json.loads(saved.path.with_suffix(".json").read_text())
    assert side["image_id"] == image_id and side["digest"] == DIGEST
    assert saved.summary()["image_id"] == image_id
    with pytest.raises(BumpImageError):
        save_image(FakeRemote(FakeEngine()), HOST, Candidate("vllm/vllm-openai", "v0.27.1",
                                                             DIGEST), tmp_path, "0.27.1")


def test_load_streams_tags_and_verifies_by_image_id(tmp_path) -> None:
    archive = tmp_path / "saved.tar"
    image_id = docker_save_tar(archive, None)  # saved by id: no tag in it
    engine = FakeEngine()
    remote = FakeRemote(engine)
    want = WantedImage(IMAGE, DIGEST, image_id, ())
    assert load_archive(remote, HOST, want, archive) == "loaded"
    assert engine.find(IMAGE) is not None and engine.find(IMAGE).id == image_id  # type: ignore[union-attr]
    assert f"docker tag {image_id} {IMAGE}" in remote.commands
    assert load_archive(remote, HOST, want, archive) == "present"
    assert remote.commands.count("docker load") == 1


def test_load_of_another_image_or_a_failing_load_is_an_error(tmp_path) -> None:
    archive = tmp_path / "other.tar"
    docker_save_tar(archive, [IMAGE], payload=b"something else")
    want = WantedImage(IMAGE, DIGEST, "sha256:" + "7" * 64, ())
    remote = FakeRemote(FakeEngine())
    with pytest.raises(ImageError, match=r"other.tar holds sha256:.* \(vllm/vllm-openai:v0.27.1\)"
                                         r", not vllm/vllm-openai:v0.27.1 \(sha256:7777"):
        load_archive(remote, HOST, want, archive)
    assert remote.commands == []  # refused before anything reached the host
    want = WantedImage(IMAGE, DIGEST, inspect_archive(archive).images[0].image_id, ())
    remote.load_fails = True
    with pytest.raises(ImageError, match=r"host1: docker load of .*other.tar failed \(exit 1, "
                                         r"\d+ bytes sent"):
        load_archive(remote, HOST, want, archive)
    with pytest.raises(ImageError, match="no image id"):
        load_archive(remote, HOST, WantedImage(IMAGE, DIGEST, None, ()), Path(archive))
