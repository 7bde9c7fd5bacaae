"""Signed apt repositories of the stand-in .debs, laid out as the services container serves them.

``build_repo(web_root, gnupg_home, debs, layout)`` writes one repository. NVIDIA's are flat
(``deb [signed-by=...] URL /``: InRelease, Release, Release.gpg, Packages{,.gz} and the .debs
in one directory), one per distribution as NVIDIA publishes them (:func:`nvidia_layout`)::

    web_root/compute/cuda/repos/debian13/x86_64/{InRelease,Release,Packages,...,8793F200.pub}
    web_root/compute/cuda/repos/debian12/x86_64/{InRelease,...,3bf863cc.pub}
    web_root/libnvidia-container/gpgkey, .../stable/deb/amd64/{InRelease,...}

Each layout names its signing key (by uid) and how it was made: the stand-in of NVIDIA's old
CUDA key carries a SHA-1 self-signature as 3bf863cc does (gpgv accepts it; Debian 13's sqv
rejects it since 2026-02-01), the others SHA-512 ones. Keys are generated once into
``gnupg_home`` and reused. Release, Packages and the pool are written in Python (no apt-utils
needed). Idempotent: with the same .debs and key nothing on disk changes, so apt's
If-Modified-Since sees the same files::

    info = build_repo(Path(".testbed/services/apt"), Path(".testbed/gnupg"), debs,
                      nvidia_layout("debian13"))
    info.versions("nvidia-driver-cuda")   # ['595.58.03-1', '620.37.02-1']

:data:`DOCKER_LAYOUT` is shaped like download.docker.com/linux/debian (``dists/<codename>/
stable/binary-amd64``, the pool under ``dists/<codename>/pool/stable/amd64/``, the armored key
at ``linux/debian/gpg``).
"""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import os
import re
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# NVIDIA's CUDA signing keys, by the short id that names their key files. The stand-ins have
# their own fingerprints (the real keys are not ours); what matters is how each is bound.
OLD_CUDA_KEY = "3bf863cc"  # since 2022; SHA-1 self-signature; every repository but debian13
NEW_CUDA_KEY = "8793F200"  # debian13 only (NVIDIA/cuda-repo-management#39)
# The distributions NVIDIA publishes a CUDA repository for (of those rigfleet supports), and
# the key each is signed with.
CUDA_KEY_OF = {"debian12": OLD_CUDA_KEY, "debian13": NEW_CUDA_KEY,
               "ubuntu2204": OLD_CUDA_KEY, "ubuntu2404": OLD_CUDA_KEY}
# The driver branches each carries: debian13 has no 580 (NVIDIA/cuda-repo-management#38, #40);
# the older repositories keep 580 and get the new branches too.
CUDA_BRANCHES = {"debian12": ("580", "595", "620"), "debian13": ("595", "620"),
                 "ubuntu2204": ("580", "595", "620"), "ubuntu2404": ("580", "595", "620")}


@dataclass(frozen=True)
class RepoLayout:
    """Where one repository lives under the web root, how it is named and who signs it."""

    repo_dir: str  # the repository URL's path: <url> = http://<host>/<repo_dir>
    suite: str  # "/" for a flat repository
    component: str
    architectures: tuple[str, ...]
    key_uid: str
    key_asc: str  # web-root-relative paths of the exported key
    key_gpg: str | None
    origin: str
    label: str
    description: str
    pool: str = "debian"  # "debian": pool/<component>/<p>/<name>/; "docker": dists/<s>/pool/...;
    #                       "flat": next to the indexes
    key_algo: str = "rsa4096"
    cert_digest: str = "SHA512"  # the key's self-signatures ("SHA1" as NVIDIA's 3bf863cc)

    @property
    def flat(self) -> bool:
        return self.suite == "/"

    @property
    def index_dir(self) -> str:
        """Where Release and Packages live, relative to repo_dir."""
        return "." if self.flat else f"dists/{self.suite}"

    def pool_path(self, name: str, filename: str) -> str:
        """A package's Filename (relative to repo_dir)."""
        if self.pool == "flat":
            return f"./{filename}"
        if self.pool == "docker":
            return f"dists/{self.suite}/pool/{self.component}/{self.architectures[0]}/{filename}"
        prefix = name[:4] if name.startswith("lib") else name[0]
        return f"pool/{self.component}/{prefix}/{name}/{filename}"


def cuda_key_uid(short_id: str) -> str:
    return (f"rigfleet testbed stand-in for NVIDIA CUDA key {short_id} "
            f"<cuda-{short_id}@rigfleet.test>")


def nvidia_layout(distro: str) -> RepoLayout:
    """NVIDIA's CUDA repository for ``distro`` (``debian13``), flat, its key file beside it."""
    key = CUDA_KEY_OF[distro]
    repo_dir = f"compute/cuda/repos/{distro}/x86_64"
    return RepoLayout(
        repo_dir=repo_dir, suite="/", component="", architectures=("amd64",),
        key_uid=cuda_key_uid(key), key_asc=f"{repo_dir}/{key}.pub", key_gpg=None,
        origin="NVIDIA", label="NVIDIA CUDA", pool="flat",
        description=f"rigfleet testbed stand-in for NVIDIA's {distro} CUDA repository",
        cert_digest="SHA1" if key == OLD_CUDA_KEY else "SHA512",
    )


TOOLKIT_LAYOUT = RepoLayout(
    repo_dir="libnvidia-container/stable/deb/amd64", suite="/", component="",
    architectures=("amd64",),
    key_uid="rigfleet testbed stand-in for libnvidia-container <toolkit@rigfleet.test>",
    key_asc="libnvidia-container/gpgkey", key_gpg=None, origin="NVIDIA",
    label="libnvidia-container", pool="flat",
    description="rigfleet testbed stand-in for NVIDIA's container toolkit repository",
)
DOCKER_LAYOUT = RepoLayout(
    repo_dir="linux/debian", suite="bookworm", component="stable", architectures=("amd64",),
    key_uid="rigfleet testbed Docker CE repository stand-in <docker@rigfleet.test>",
    key_asc="linux/debian/gpg", key_gpg=None, origin="Docker", label="Docker CE",
    description="rigfleet testbed stand-in for Docker's apt repository", pool="docker",
    key_algo="ed25519",
)


class AptRepoError(RuntimeError):
    """gpg or dpkg-deb failed; the message holds the command's stderr."""


@dataclass(frozen=True)
class RepoPackage:
    name: str
    version: str
    architecture: str
    filename: str  # relative to the repository dir (what Packages' Filename says)
    size: int
    sha256: str


@dataclass(frozen=True)
class RepoInfo:
    """What was built, for callers that write sources.list entries or check versions."""

    web_root: Path
    fingerprint: str
    packages: tuple[RepoPackage, ...]
    layout: RepoLayout

    @property
    def repo_dir(self) -> Path:
        return self.web_root / self.layout.repo_dir

    @property
    def public_key(self) -> Path:
        return self.web_root / self.layout.key_asc

    @property
    def keyring(self) -> Path:
        """The binary key (``signed-by=``); a layout without one serves only the armored key."""
        return self.web_root / (self.layout.key_gpg or self.layout.key_asc)

    def versions(self, name: str) -> list[str]:
        return sorted(p.version for p in self.packages if p.name == name)


# --- gpg -------------------------------------------------------------------------------------


def _gpg(gnupg_home: Path, *args: str, input: bytes | None = None) -> bytes:
    proc = subprocess.run(
        ["gpg", "--homedir", str(gnupg_home), "--batch", "--yes", "--no-tty", *args],
        input=input, capture_output=True,
    )
    if proc.returncode != 0:
        raise AptRepoError(f"gpg {' '.join(args)} failed: {proc.stderr.decode().strip()}")
    return proc.stdout


def _stop_agent(gnupg_home: Path, timeout: float = 10.0) -> None:
    """gpg starts an agent per home; ours must not outlive the build. ``gpgconf --kill``
    returns while the agent is still shutting down, and a gpg started then connects to it and
    fails ("can't connect to the agent: End of file"), so this waits until it has exited."""
    asked = subprocess.run(["gpg-connect-agent", "--homedir", str(gnupg_home), "--no-autostart",
                            "getinfo pid", "/bye"], capture_output=True, text=True)
    pid = next((int(line[2:]) for line in asked.stdout.splitlines()
                if line.startswith("D ") and line[2:].strip().isdigit()), None)
    subprocess.run(["gpgconf", "--homedir", str(gnupg_home), "--kill", "gpg-agent"],
                   capture_output=True)
    deadline = time.monotonic() + timeout
    while pid is not None and _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _find_key(gnupg_home: Path, uid: str) -> str | None:
    out = _gpg(gnupg_home, "--with-colons", "--list-secret-keys").decode()
    fpr, pending = None, False
    for line in out.splitlines():
        cols = line.split(":")
        if cols[0] == "sec":
            pending, fpr = True, None
        elif cols[0] == "fpr" and pending and fpr is None:
            fpr = cols[9]
        elif cols[0] == "uid" and pending and fpr and uid in cols[9]:
            return fpr
    return None


def ensure_key(gnupg_home: Path, uid: str, algo: str = "rsa4096",
               cert_digest: str = "SHA512") -> str:
    """The fingerprint of the key ``uid`` in gnupg_home, generating it the first time.

    + cert_digest: the digest of its self-signatures (``SHA1``: a key bound the way NVIDIA's
      3bf863cc is, which Debian 13's sqv refuses)
    """
    gnupg_home.mkdir(parents=True, exist_ok=True)
    os.chmod(gnupg_home, 0o700)
    try:
        fpr = _find_key(gnupg_home, uid)
        if fpr is None:
            _gpg(gnupg_home, "--pinentry-mode", "loopback", "--passphrase", "",
                 "--cert-digest-algo", cert_digest, "--quick-generate-key", uid, algo, "sign",
                 "never")
            fpr = _find_key(gnupg_home, uid)
        if fpr is None:
            raise AptRepoError(f"no key for {uid!r} in {gnupg_home} after generating one")
        return fpr
    finally:
        _stop_agent(gnupg_home)


# --- index files -----------------------------------------------------------------------------


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def _control(deb: Path) -> str:
    proc = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AptRepoError(f"dpkg-deb -f {deb} failed: {proc.stderr.strip()}")
    return proc.stdout.rstrip("\n")


def _field(control: str, name: str) -> str:
    m = re.search(rf"^{name}: (.+)$", control, re.MULTILINE)
    if not m:
        raise AptRepoError(f"control file lacks {name}: {control[:80]!r}")
    return m.group(1).strip()


def _collect(debs: Path | Iterable[Path]) -> list[Path]:
    if isinstance(debs, (str, Path)):
        return sorted(Path(debs).glob("*.deb"))
    return sorted(Path(d) for d in debs)


def _publish_pool(repo: Path, debs: list[Path],
                  layout: RepoLayout) -> tuple[list[RepoPackage], list[str]]:
    """Copy .debs into the pool; return the packages and their Packages paragraphs."""
    entries: list[tuple[RepoPackage, str]] = []
    for deb in debs:
        control = _control(deb)
        name, version = _field(control, "Package"), _field(control, "Version")
        arch = _field(control, "Architecture")
        rel = layout.pool_path(name, deb.name)
        data = deb.read_bytes()
        _write_if_changed(repo / rel, data)
        sha256 = hashlib.sha256(data).hexdigest()
        paragraph = (f"{control}\nFilename: {rel}\nSize: {len(data)}\n"
                     f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {sha256}\n")
        entries.append((RepoPackage(name, version, arch, rel, len(data), sha256), paragraph))
    entries.sort(key=lambda e: (e[0].name, e[0].version))
    wanted = {repo / e[0].filename for e in entries}
    for stale in repo.rglob("*.deb"):
        if stale not in wanted:
            stale.unlink()
    return [e[0] for e in entries], [e[1] for e in entries]


def _release(indexes: dict[str, bytes], date: str, layout: RepoLayout) -> str:
    lines = [f"Origin: {layout.origin}", f"Label: {layout.label}"]
    if not layout.flat:  # a flat repository's Release names no suite, codename or component
        lines += [f"Suite: {layout.suite}", f"Codename: {layout.suite}"]
    lines += [f"Date: {date}", f"Architectures: {' '.join(layout.architectures)}"]
    if not layout.flat:
        lines.append(f"Components: {layout.component}")
    lines.append(f"Description: {layout.description}")
    for title, algo in (("MD5Sum", hashlib.md5), ("SHA256", hashlib.sha256)):
        lines.append(f"{title}:")
        lines += [f" {algo(data).hexdigest()} {len(data):>8} {rel}"
                  for rel, data in sorted(indexes.items())]
    return "\n".join(lines) + "\n"


def _without_date(release: str) -> str:
    return re.sub(r"^Date: .*\n", "", release, flags=re.MULTILINE)


# --- the repository --------------------------------------------------------------------------


def build_repo(out_dir: Path, gnupg_home: Path, debs: Path | Iterable[Path],
               layout: RepoLayout) -> RepoInfo:
    """Build (or bring up to date) the signed repository under the web root ``out_dir``.

    + out_dir: web root; the repository goes to out_dir/<layout.repo_dir>, the key where the
      layout says
    + gnupg_home: GPG home holding (or receiving) the signing key
    + debs: a directory of .debs, or the .deb paths themselves
    """
    out_dir = Path(out_dir)
    fpr = ensure_key(Path(gnupg_home), layout.key_uid, layout.key_algo, layout.cert_digest)
    try:
        repo = out_dir / layout.repo_dir
        packages, paragraphs = _publish_pool(repo, _collect(debs), layout)
        by_arch = {"amd64": "\n".join(paragraphs).encode()}
        indexes: dict[str, bytes] = {}
        if layout.flat:
            indexes["Packages"] = by_arch["amd64"]
            indexes["Packages.gz"] = gzip.compress(indexes["Packages"], mtime=0)
        else:
            for arch in layout.architectures:
                rel = f"{layout.component}/binary-{arch}/Packages"
                indexes[rel] = by_arch.get(arch, b"")
                indexes[rel + ".gz"] = gzip.compress(indexes[rel], mtime=0)
        dists = repo / layout.index_dir
        for rel, data in indexes.items():
            _write_if_changed(dists / rel, data)

        armored = _gpg(gnupg_home, "--armor", "--export", fpr)
        key_changed = _write_if_changed(out_dir / layout.key_asc, armored)
        if layout.key_gpg:
            _write_if_changed(out_dir / layout.key_gpg, _gpg(gnupg_home, "--export", fpr))

        release = _release(indexes, email.utils.formatdate(usegmt=True).replace("GMT", "UTC"),
                           layout)
        old = (dists / "Release").read_text() if (dists / "Release").exists() else ""
        signed = (dists / "InRelease").exists() and (dists / "Release.gpg").exists()
        if key_changed or not signed or _without_date(old) != _without_date(release):
            _write_if_changed(dists / "Release", release.encode())
            sign = ("--local-user", fpr, "--digest-algo", "SHA512")
            _write_if_changed(dists / "InRelease",
                              _gpg(gnupg_home, *sign, "--clearsign", input=release.encode()))
            _write_if_changed(dists / "Release.gpg", _gpg(
                gnupg_home, *sign, "--armor", "--detach-sign", input=release.encode()))
        return RepoInfo(web_root=out_dir, fingerprint=fpr, packages=tuple(packages),
                        layout=layout)
    finally:
        _stop_agent(Path(gnupg_home))
