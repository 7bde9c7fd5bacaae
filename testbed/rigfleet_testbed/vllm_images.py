"""Build the ``vllm/vllm-openai:<tag>`` simulator images, and the archives an operator kept.

One shared image (``images/vllm-sim``: Debian, python3 + pip, the simulator package) and, per
build, one COPY-only layer on top (``images/vllm-build``; its files from
:func:`rigfleet_testbed.vllm_builds.layer_files`). Every image carries the hash of its inputs, so
an unchanged build is skipped; the per-build images build in parallel (about a second each)::

    built = build_sim_images(client, [vb.by_tag("v0.27.1")], log)
    path = save_archive(client, vb.by_tag("nightly-01d4d1ad..."), Path(".testbed-1/archives"), log)

Archives are what ``docker save vllm/vllm-openai:<tag>`` writes, at ``<dir>/<tag>.tar``; one is
rewritten only when the image it holds is not the current build's (the image id is the config
digest named in the archive's ``manifest.json``). ``docker load -i <tag>.tar`` restores the tag;
the loaded image has no registry digest (``RepoDigests`` stays empty): identify it by its image
id.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker

from rigfleet_testbed import images, layout
from rigfleet_testbed.vllm_builds import Build, layer_files

Log = Callable[[str], None]
BUILD_CONTEXT = layout.IMAGES_DIR / "vllm-build"


def ensure_base(client: docker.DockerClient, log: Log) -> str:
    """Build the shared simulator image if its inputs changed; returns its pinned reference."""
    return images.build(client, layout.IMAGES_DIR / "vllm-sim", layout.SIM_BASE_IMAGE, log,
                        pin=True).ref


def build_one(client: docker.DockerClient, build: Build, base: str, log: Log) -> bool:
    """Build ``build``'s image on the shared one (``base``: its pinned reference); True when
    it was (re)built."""
    with tempfile.TemporaryDirectory(prefix="rigfleet-vllm-build-") as tmp:
        ctx = Path(tmp)
        shutil.copy2(BUILD_CONTEXT / "Dockerfile", ctx / "Dockerfile")
        layer_files(build).write(ctx / "dist-packages")
        return images.build(client, ctx, build.image, log,
                            {"BASE": base, "BASE_ID": base.rpartition(":")[2]}).built


def build_sim_images(client: docker.DockerClient, builds: Sequence[Build], log: Log,
                     workers: int = 3) -> list[Build]:
    """Build every image of ``builds`` that is missing or stale; returns those built."""
    base = ensure_base(client, log)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(lambda b: build_one(client, b, base, log), builds))
    return [b for b, built in zip(builds, done, strict=True) if built]


def archive_path(archives: Path, build: Build) -> Path:
    return archives / f"{build.tag}.tar"


def archived_image_id(path: Path) -> str | None:
    """The image id (``sha256:<config digest>``) a ``docker save`` archive holds, or None."""
    try:
        with tarfile.open(path) as tar:
            member = tar.extractfile("manifest.json")
            manifest = json.load(member) if member else []
    except (OSError, tarfile.TarError, KeyError, ValueError):
        return None
    if not manifest:
        return None
    config = str(manifest[0].get("Config", ""))  # "blobs/sha256/<hex>" or "<hex>.json"
    digest = config.rsplit("/", 1)[-1].removesuffix(".json")
    return f"sha256:{digest}" if digest else None


def save_archive(client: docker.DockerClient, build: Build, archives: Path, log: Log) -> Path:
    """``docker save`` the build's image to ``<archives>/<tag>.tar`` unless it is there."""
    path = archive_path(archives, build)
    image = client.images.get(build.image)
    if archived_image_id(path) == image.id:
        return path
    archives.mkdir(parents=True, exist_ok=True)
    log(f"saving {build.image} to {path} (the copy an operator kept)")
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as fh:
        for chunk in image.save(named=build.image):
            fh.write(chunk)
    os.replace(tmp, path)
    return path
