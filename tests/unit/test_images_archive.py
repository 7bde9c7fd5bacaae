"""Saved archives (rigfleet/images/archive.py) and the host's state script
(rigfleet/images/hoststate.py), the script run in a real /bin/sh against real tars, with a
stand-in ``docker`` that answers as Docker's CLI does."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
from images_fakes import docker_save_tar

from rigfleet.hostside.layout import HOST
from rigfleet.images.archive import (
    ArchiveError,
    archive_name,
    images_in_manifest,
    inspect_archive,
    read_sidecar,
    write_sidecar,
)
from rigfleet.images.hoststate import HostArchive, LocalImage, parse_state, state_script

IMAGE = "vllm/vllm-openai:v0.27.1"


def test_archive_name_is_one_flat_file_per_image() -> None:
    assert archive_name(IMAGE) == "vllm_vllm-openai_v0.27.1.tar"
    assert archive_name("reg.lan:5000/a/b:v1") == "reg.lan_5000_a_b_v1.tar"


@pytest.mark.parametrize("oci", [False, True])
def test_inspect_hashes_the_config_and_reads_the_tags(tmp_path, oci) -> None:
    path = tmp_path / "x.tar"
    image_id = docker_save_tar(path, [IMAGE], oci=oci)
    info = inspect_archive(path)
    assert info.holds(image_id) and not info.holds("sha256:" + "0" * 64)
    assert info.images[0].repo_tags == (IMAGE,) and info.size == path.stat().st_size
    assert info.sidecar == {}


def test_the_id_is_the_configs_hash_not_its_name(tmp_path) -> None:
    # A tar whose manifest names a config file after another id: the content decides.
    config = b'{"os": "linux"}'
    fake = "f" * 64
    path = tmp_path / "liar.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in ((f"{fake}.json", config), ("manifest.json", json.dumps(
                [{"Config": f"{fake}.json", "RepoTags": [IMAGE], "Layers": []}]).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    found = inspect_archive(path)
    assert not found.holds(f"sha256:{fake}")
    assert found.images[0].image_id.startswith("sha256:") and len(found.images[0].image_id) == 71


def test_not_an_archive_names_the_file(tmp_path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(ArchiveError, match=r"junk.tar: not a readable `docker save` archive"):
        inspect_archive(junk)
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    with pytest.raises(ArchiveError, match=r"empty.tar: not a `docker save` archive: it holds "
                                           r"no manifest.json"):
        inspect_archive(empty)
    with pytest.raises(ArchiveError, match="missing.tar: No such file"):
        inspect_archive(tmp_path / "missing.tar")


def test_a_config_the_manifest_names_but_the_tar_lacks_is_an_archive_error(tmp_path) -> None:
    path = tmp_path / "cut.tar"
    manifest = json.dumps([{"Config": "a" * 64 + ".json", "RepoTags": [IMAGE], "Layers": []}])
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest.encode()))
    with pytest.raises(ArchiveError, match=r"cut.tar: not a `docker save` archive: manifest.json "
                                           r"names a{64}.json, which it does not hold"):
        inspect_archive(path)


def test_manifest_shapes() -> None:
    assert images_in_manifest([{"Config": "a" * 64 + ".json", "RepoTags": None}])[0].image_id \
        == "sha256:" + "a" * 64
    with pytest.raises(ValueError, match="names no sha256 config"):
        images_in_manifest([{"Config": "x.json"}])
    with pytest.raises(ValueError, match="not a list"):
        images_in_manifest({})


def test_sidecar_round_trip(tmp_path) -> None:
    path = tmp_path / archive_name(IMAGE)
    image_id = docker_save_tar(path, [IMAGE])
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    write_sidecar(path, image=IMAGE, digest="sha256:" + "d" * 64, image_id=image_id,
                  vllm_version="0.27.1", sha256=sha, bytes=path.stat().st_size)
    side = read_sidecar(path)
    assert side["schema"] == "rigfleet-image-archive/1" and side["image_id"] == image_id
    assert side["archive"] == path.name and "rigfleet images import" in side["restore"]
    assert inspect_archive(path).sidecar["digest"] == "sha256:" + "d" * 64


# --- the host's state script in a real shell -------------------------------------------------

FAKE_DOCKER = r"""#!/bin/sh
# Docker's CLI as the state script uses it: `info`, `info --format`, `image inspect --format`.
case "$1 $2" in
  "info ") exit 0 ;;
  "info --format") echo /srv/docker-root; exit 0 ;;
  "image inspect")
    ref=$5
    case "$ref" in
      vllm/vllm-openai:v0.27.1|vllm/vllm-openai@sha256:*)
        printf 'sha256:%s\t["vllm/vllm-openai@sha256:%s"]\t["vllm/vllm-openai:v0.27.1"]\n' \
          "$(printf 1%.0s $(seq 64))" "$(printf d%.0s $(seq 64))"; exit 0 ;;
    esac
    echo "Error: No such image: $ref" >&2; exit 1 ;;
esac
exit 1
"""


def _bin(tmp_path: Path, docker: bool) -> str:
    """A PATH with the tools the script needs, and (or not) the stand-in docker."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for tool in ("sh", "tar", "stat", "df", "awk", "dirname", "tr", "printf", "seq", "cat"):
        found = shutil.which(tool)
        if found and not (bindir / tool).exists():
            (bindir / tool).symlink_to(found)
    if docker:
        (bindir / "docker").write_text(FAKE_DOCKER)
        (bindir / "docker").chmod(0o755 | stat.S_IXUSR)
    return str(bindir)


def _run(script: str, path: str) -> list[str]:
    proc = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PATH": path}, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_state_script_without_docker_reports_absence_and_free_space(tmp_path) -> None:
    archive_dir = tmp_path / "images"
    archive_dir.mkdir()
    image_id = docker_save_tar(archive_dir / archive_name(IMAGE), [IMAGE])
    (archive_dir / "broken.tar").write_bytes(b"x" * 10)
    single = tmp_path / "one.tar"
    other_id = docker_save_tar(single, None, payload=b"other")
    script = state_script([IMAGE, "vllm/vllm-openai@sha256:" + "d" * 64],
                          [str(archive_dir), str(single), str(tmp_path / "missing")],
                          ["root", str(tmp_path / "not" / "yet")])
    state = parse_state(_run(script, _bin(tmp_path, docker=False)))
    assert state.docker_root == "/var/lib/docker"
    assert state.images == {IMAGE: None, "vllm/vllm-openai@sha256:" + "d" * 64: None}
    assert state.archive_files(str(archive_dir)) == (
        str(archive_dir / "broken.tar"), str(archive_dir / archive_name(IMAGE)))
    good = state.archives[str(archive_dir / archive_name(IMAGE))]
    assert [i.image_id for i in good.images] == [image_id] and good.images[0].repo_tags == (IMAGE,)
    assert state.archives[str(archive_dir / "broken.tar")].error
    assert state.archives[str(single)].images[0].image_id == other_id
    assert state.archive_files(str(tmp_path / "missing")) is None
    assert state.archives[str(tmp_path / "missing")] == HostArchive(None)
    # Free space on the nearest existing directory's filesystem, in bytes.
    assert state.free["root"].free > 0 and state.free[str(tmp_path / "not" / "yet")].free > 0


def test_state_script_reads_docker_inspect_output(tmp_path) -> None:
    digest = "sha256:" + "d" * 64
    script = state_script([IMAGE, f"vllm/vllm-openai@{digest}", "other/image:v1"], (), ())
    state = parse_state(_run(script, _bin(tmp_path, docker=True)))
    assert state.docker_root == "/srv/docker-root"
    assert state.images[IMAGE] == LocalImage("sha256:" + "1" * 64, (f"vllm/vllm-openai@{digest}",),
                                             (IMAGE,))
    assert state.images["other/image:v1"] is None
    assert state.images[IMAGE].has_digest(digest)


def test_parse_state_ignores_noise() -> None:
    state = parse_state(["garbage", "image\tx\tnot-json\t[\t[]", "free\troot\t/dev/x\tlots"])
    assert state.images["x"] == LocalImage("not-json", (), ())
    assert state.free == {}


def test_a_checked_load_stands_for_its_digest(tmp_path) -> None:
    """A peer's load has no RepoDigests: the record the load wrote names the digest."""
    digest, other = "sha256:" + "d" * 64, "sha256:" + "e" * 64
    image_id = "sha256:" + "1" * 64
    loaded = tmp_path / "images-loaded"
    loaded.mkdir()
    (loaded / digest.removeprefix("sha256:")).write_text(image_id + "\n")
    (loaded / other.removeprefix("sha256:")).write_text("sha256:" + "9" * 64 + "\n")
    script = state_script([IMAGE], (), ()).replace(str(HOST.loaded_images_dir), str(loaded))
    lines = _run(script, _bin(tmp_path, docker=False))
    assert f"loaded\t{'d' * 64}\t{image_id}" in lines
    state = parse_state([*lines, f"image\t{IMAGE}\t{image_id}\t[]\t[\"{IMAGE}\"]"])
    assert state.images[IMAGE] == LocalImage(image_id, (), (IMAGE,), (digest,))
    assert state.images[IMAGE].has_digest(digest) and not state.images[IMAGE].has_digest(other)
    # no records directory (a host that never loaded from a peer): nothing, and no error
    script = state_script([IMAGE], (), ()).replace(str(HOST.loaded_images_dir),
                                                   str(tmp_path / "none"))
    assert not [line for line in _run(script, _bin(tmp_path, docker=False))
                if line.startswith("loaded")]

