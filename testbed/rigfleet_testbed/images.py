"""Build the testbed's images, skipping any whose inputs have not changed.

Each image carries the hash of its build context and build arguments as a label; a rebuild
happens only when that hash differs, which keeps a second ``testbed up`` well under a minute.
There is no Docker Hub here: base images are debootstrapped Debian trees (13 for everything,
12 as well when a host runs Debian 12) imported into the engine.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import docker
import docker.errors

from rigfleet_testbed import layout

HASH_LABEL = "io.rigfleet.context-hash"
Log = Callable[[str], None]


def debian_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine already uses (plain HTTP works without extra CAs)."""
    for path in [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*"))]:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            words = line.replace("URIs:", " ").split()
            for word in words:
                if word.startswith("http") and word.rstrip("/").endswith("/debian"):
                    return word.rstrip("/")
    return "http://deb.debian.org/debian"


def context_hash(context: Path, buildargs: Mapping[str, str] | None = None) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(context)).encode())
        digest.update(path.read_bytes())
    for key, value in sorted((buildargs or {}).items()):
        digest.update(f"{key}={value}".encode())
    return digest.hexdigest()[:16]


def _existing_hash(client: docker.DockerClient, tag: str) -> str | None:
    try:
        return (client.images.get(tag).labels or {}).get(HASH_LABEL)
    except docker.errors.ImageNotFound:
        return None


def ensure_base(client: docker.DockerClient, log: Log, suite: str = "trixie") -> str:
    """Import a debootstrapped minbase Debian ``suite`` tree as ``rigfleet/<suite>-base``.

    Returns the image name. Debian 12 (bookworm) hosts get theirs the same way as the Debian 13
    ones (TESTBED-FACTS.md: debootstrap from the machine's mirror, then ``docker import``).
    """
    name = f"rigfleet/{suite}-base"
    if _existing_hash(client, f"{name}:latest") == suite:
        return f"{name}:latest"
    log(f"debootstrap {suite} (minbase) from {debian_mirror()}")
    with tempfile.TemporaryDirectory(prefix="rigfleet-rootfs-") as root:
        subprocess.run(
            ["debootstrap", "--variant=minbase", suite, root, debian_mirror()],
            check=True, stdout=subprocess.DEVNULL,
        )
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        # A changes entry keeps the hash label on the imported image.
        client.api.import_image_from_stream(
            tar.stdout, repository=name, tag="latest",
            changes=[f"LABEL {HASH_LABEL}={suite}"],
        )
        if tar.wait() != 0:
            raise RuntimeError("tar of the debootstrapped tree failed")
    log(f"imported {name}")
    return f"{name}:latest"


class Built(NamedTuple):
    """What :func:`build` left: the reference to run (``ref``) and whether it built."""

    ref: str
    built: bool


def _exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def build(
    client: docker.DockerClient,
    context: Path,
    tag: str,
    log: Log,
    buildargs: Mapping[str, str] | None = None,
    extra_files: Mapping[str, Path] | None = None,
    pin: bool = False,
) -> Built:
    """Build ``context`` as ``tag`` unless an image with the same inputs exists.

    ``extra_files`` maps names inside the context to files copied in first (CA certificates).
    With ``pin`` the image is also tagged ``<repo>:ctx-<input hash>`` and that is the ``ref``
    returned: containers made from it keep this build even when another checkout's testbed
    (other code, same engine) moves ``tag`` to its own build meanwhile, and switching back to
    an input already built costs a retag, not a build.
    """
    with tempfile.TemporaryDirectory(prefix="rigfleet-ctx-") as tmp:
        ctx = Path(tmp) / "ctx"
        shutil.copytree(context, ctx, ignore=shutil.ignore_patterns("__pycache__"))
        for name, src in (extra_files or {}).items():
            (ctx / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / name)
        wanted = context_hash(ctx, buildargs)
        repo, _, name = tag.rpartition(":")
        pinned = f"{repo}:ctx-{wanted}" if pin else tag
        if pin and _exists(client, pinned):
            if _existing_hash(client, tag) != wanted:
                client.images.get(pinned).tag(repo, name)
            return Built(pinned, False)
        if not pin and _existing_hash(client, tag) == wanted:
            return Built(tag, False)
        log(f"building {tag}")
        labels = {HASH_LABEL: wanted, layout.LABEL: "image"}
        try:
            image, _ = client.images.build(
                path=str(ctx), tag=tag, buildargs=dict(buildargs or {}), labels=labels,
                rm=True, forcerm=True, pull=False,
            )
        except docker.errors.BuildError as exc:
            tail = "".join(str(c.get("stream", c.get("error", ""))) for c in exc.build_log)
            raise RuntimeError(f"building {tag} failed:\n{tail[-3000:]}") from None
        if pin:
            image.tag(repo, f"ctx-{wanted}")
        return Built(pinned, True)


def site_ca_files() -> dict[str, Path]:
    """The machine's extra CA certificates, for images that reach PyPI through the proxy."""
    ca_dir = Path("/usr/local/share/ca-certificates")
    return {f"ca/{p.name}": p for p in sorted(ca_dir.glob("*.crt"))} if ca_dir.is_dir() else {}


def tar_of(files: Mapping[str, bytes], mode: int = 0o600) -> bytes:
    """A tar archive of in-memory files, for ``put_archive`` into a container."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
