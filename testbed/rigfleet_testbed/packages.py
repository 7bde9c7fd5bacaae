"""Builds the stand-in NVIDIA .deb packages that the testbed's signed apt repository serves.

Same names, versions and dependencies as NVIDIA's packages (docs/architecture.md, "Stand-in
packages"), so the deploy installs and pins them exactly as on real hosts. Programs are the
stdlib-only modules of ``rigfleet_testbed.nvidia``, each bundled with ``simstate`` into one
zipapp file (the package's version baked in); unit files and maintainer scripts behave like
Debian's (dh_installsystemd): the kernel-module unit is enabled but never started (the driver
loads at the next boot), the persistence daemon is enabled and (re)started.

Builds are reproducible (fixed mtimes, SOURCE_DATE_EPOCH), and ``build_all`` rewrites a .deb
only when its bytes change::

    debs = build_all(Path(".testbed/debs"))     # 24 packages: 3 driver + 3 toolkit versions
    pkgs = driver_packages("595.58.03-1")       # what would be built, without building
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# One version per driver branch the twin's CUDA repositories carry (which repository carries
# which: rigfleet_testbed.aptrepo.CUDA_BRANCHES): R580 (long-term support until 2028-06), R595
# (production until 2027-03; 595.58.03 is a version club-3090 runs), R620 (the next
# long-term-support branch; its version number here is the stand-in's own).
DRIVER_VERSIONS = ("580.105.08-1", "595.58.03-1", "620.37.02-1")
# nvidia-container-toolkit as published: 1.17.7 (CVE-2025-23266 affected), 1.17.8 (fixed),
# 1.20.0 (newest, 2026-08-12). The stand-in runtime does not model 1.18's jit-cdi default.
TOOLKIT_VERSIONS = ("1.17.7-1", "1.17.8-1", "1.20.0-1")
MAINTAINER = "rigfleet testbed <testbed@rigfleet.test>"
ARCHITECTURE = "amd64"
# 2026-01-01T00:00:00Z: every mtime in a package, so equal inputs give byte-identical .debs.
SOURCE_DATE_EPOCH = 1767225600

NVIDIA_SRC = Path(__file__).resolve().parent / "nvidia"
KMOD_UNIT = "nvidia-sim-kmod.service"
RELOAD_GENERATOR = "nvidia-sim-scope-devices"
PERSISTENCED_UNIT = "nvidia-persistenced.service"


@dataclass(frozen=True)
class FileEntry:
    """A file in a package: absolute install path, bytes (or a file to copy), mode.

    ``symlink`` makes the entry a symbolic link to that target instead; a path ending in
    ``/`` is an (empty) directory.
    """

    path: str
    data: bytes = b""
    mode: int = 0o644
    source: Path | None = None
    symlink: str | None = None

    @property
    def size(self) -> int:
        return self.source.stat().st_size if self.source is not None else len(self.data)


@dataclass(frozen=True)
class Package:
    """One binary package to build."""

    name: str
    version: str
    summary: str
    description: str
    depends: tuple[str, ...] = ()
    files: tuple[FileEntry, ...] = ()
    scripts: tuple[tuple[str, str], ...] = ()  # (postinst|prerm|postrm, shell text)
    conffiles: tuple[str, ...] = ()
    section: str = "non-free/utils"
    architecture: str = ARCHITECTURE
    relations: tuple[tuple[str, str], ...] = ()  # (Recommends|Conflicts|..., "a, b")
    maintainer: str = MAINTAINER

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.split(':')[-1]}_{self.architecture}.deb"

    def control(self) -> str:
        size_kib = sum((f.size + 1023) // 1024 for f in self.files) + 4
        fields = [
            ("Package", self.name), ("Version", self.version),
            ("Architecture", self.architecture), ("Maintainer", self.maintainer),
            ("Installed-Size", str(size_kib)),
        ]
        if self.depends:
            fields.append(("Depends", ", ".join(self.depends)))
        fields += list(self.relations)
        fields += [("Section", self.section), ("Priority", "optional")]
        body = "".join(f"{k}: {v}\n" for k, v in fields)
        long = "\n".join(" " + (line if line.strip() else ".")
                         for line in self.description.strip().splitlines())
        return body + f"Description: {self.summary}\n{long}\n"


def upstream(version: str) -> str:
    """'580.105.08-1' -> '580.105.08'."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


# --- program bundles -------------------------------------------------------------------------


# Modules every stand-in program may import, bundled into each zipapp.
SHARED_MODULES = ("simstate", "devnodes")


def zipapp(module: str, version: str | None = None) -> bytes:
    """One executable file: a zip of ``module`` + the shared modules behind a python3 shebang.

    ``-Es``: the program ignores PYTHON* variables and user site-packages on the host.
    """
    call = f"main(version={version!r})" if version else "main()"
    members = {
        "__main__.py": f"import sys\nimport {module}\n\nsys.exit({module}.{call})\n",
        **{f"{m}.py": (NVIDIA_SRC / f"{m}.py").read_text() for m in (module, *SHARED_MODULES)},
    }
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/python3 -Es\n")
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, members[name])
    return buf.getvalue()


def _unit(name: str) -> FileEntry:
    return FileEntry(f"/usr/lib/systemd/system/{name}", (NVIDIA_SRC / name).read_bytes())


def _doc(name: str, text: str) -> FileEntry:
    return FileEntry(f"/usr/share/doc/{name}/README.testbed", text.encode())


_STANDIN_NOTE = (
    "This is a rigfleet testbed stand-in, not NVIDIA software: it simulates the real package\n"
    "on a machine without GPUs (see docs/architecture.md in the rigfleet repository).\n"
)


# --- maintainer scripts (the shape dh_installsystemd generates) ------------------------------


def _postinst_unit(unit: str, start: bool) -> str:
    start_cmd = (f"\t\tdeb-systemd-invoke restart '{unit}' >/dev/null || true\n" if start else
                 "\t\t# Never started here: the module loads at the next boot, as a DKMS one.\n")
    return (
        "#!/bin/sh\nset -e\n"
        'if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || '
        '[ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ]; then\n'
        f"\tdeb-systemd-helper unmask '{unit}' >/dev/null || true\n"
        f"\tif deb-systemd-helper --quiet was-enabled '{unit}'; then\n"
        f"\t\tdeb-systemd-helper enable '{unit}' >/dev/null || true\n"
        "\telse\n"
        f"\t\tdeb-systemd-helper update-state '{unit}' >/dev/null || true\n"
        "\tfi\n"
        "\tif [ -d /run/systemd/system ]; then\n"
        "\t\tsystemctl --system daemon-reload >/dev/null || true\n"
        f"{start_cmd}"
        "\tfi\n"
        "fi\n"
    )


def _postinst_dkms_sign(version: str) -> str:
    """What DKMS prints and does when it builds and signs the module (dell/dkms 3.x ``dkms.in``):
    a machine owner key made on first use (openssl, CN "DKMS module signing key"), reused after.
    The module's signature is recorded as the certificate's SHA-1 (``kmod`` checks it)."""
    key, cert = "/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"
    signer = f"/var/lib/dkms/nvidia/{version}/module-signer"
    return (
        'if [ "$1" = "configure" ]; then\n'
        f"\techo 'Building module(s) nvidia/{version} for the running kernel... done.'\n"
        f"\techo 'Signing key: {key}'\n"
        f"\techo 'Public certificate (MOK): {cert}'\n"
        f"\tif [ ! -f {key} ] || [ ! -f {cert} ]; then\n"
        "\t\techo 'Certificate or key are missing, generating self signed certificate for MOK...'\n"
        "\t\tmkdir -p /var/lib/dkms\n"
        "\t\topenssl req -new -x509 -nodes -days 36500 -subj '/CN=DKMS module signing key' "
        f"-newkey rsa:2048 -keyout {key} -outform DER -out {cert} >/dev/null 2>&1\n"
        f"\t\tchmod 600 {key}\n"
        "\tfi\n"
        f"\tmkdir -p /var/lib/dkms/nvidia/{version}\n"
        f"\tsha1sum < {cert} | cut -d' ' -f1 > {signer}\n"
        f"\techo 'Signing module /var/lib/dkms/nvidia/{version}/build/nvidia.ko'\n"
        "fi\n"
    )


def _prerm_stop(unit: str) -> str:
    return (
        "#!/bin/sh\nset -e\n"
        'if [ -d /run/systemd/system ] && [ "$1" = remove ]; then\n'
        f"\tdeb-systemd-invoke stop '{unit}' >/dev/null || true\n"
        "fi\n"
    )


def _postrm_unit(unit: str) -> str:
    return (
        "#!/bin/sh\nset -e\n"
        'if [ "$1" = remove ] && [ -d /run/systemd/system ]; then\n'
        "\tsystemctl --system daemon-reload >/dev/null || true\n"
        "fi\n"
        'if [ "$1" = "remove" ] && [ -x /usr/bin/deb-systemd-helper ]; then\n'
        f"\tdeb-systemd-helper mask '{unit}' >/dev/null || true\n"
        "fi\n"
        'if [ "$1" = "purge" ] && [ -x /usr/bin/deb-systemd-helper ]; then\n'
        f"\tdeb-systemd-helper purge '{unit}' >/dev/null || true\n"
        f"\tdeb-systemd-helper unmask '{unit}' >/dev/null || true\n"
        "fi\n"
    )


# --- the packages ----------------------------------------------------------------------------


def driver_packages(version: str) -> list[Package]:
    """The driver branch set: kernel module, nvidia-smi, persistence daemon, metapackage."""
    v = upstream(version)
    branch = v.split(".")[0]
    exact = f"(= {version})"
    kmod = Package(
        "nvidia-kernel-open-dkms", version,
        f"NVIDIA open GPU kernel module, branch {branch} (testbed stand-in)",
        "Simulates the DKMS-built open kernel module: a boot unit 'loads' it by creating\n"
        "/run/nvidia-sim/loaded. Like a freshly built module it is loaded at the next boot,\n"
        "never by the installation itself. It is signed like a DKMS module (key in\n"
        "/var/lib/dkms), so Secure Boot refuses it until that key is enrolled.",
        depends=("python3", "openssl"),
        files=(
            FileEntry("/usr/lib/nvidia-sim/nvidia-sim-kmod", zipapp("kmod", v), 0o755),
            _unit(KMOD_UNIT),
            _doc("nvidia-kernel-open-dkms", _STANDIN_NOTE),
        ),
        scripts=(("postinst", _postinst_unit(KMOD_UNIT, start=False)
                  + _postinst_dkms_sign(v)),
                 ("postrm", _postrm_unit(KMOD_UNIT)
                  + f'if [ "$1" = "purge" ]; then\n\trm -rf /var/lib/dkms/nvidia/{v}\nfi\n')),
        section="non-free/kernel",
    )
    smi = Package(
        "nvidia-smi", version, "NVIDIA System Management Interface (testbed stand-in)",
        "Prints the formats of the real nvidia-smi from the simulated GPUs' state.",
        depends=("python3",),
        files=(FileEntry("/usr/bin/nvidia-smi", zipapp("smi", v), 0o755),
               _doc("nvidia-smi", _STANDIN_NOTE)),
    )
    persistenced = Package(
        "nvidia-persistenced", version, "NVIDIA Persistence Daemon (testbed stand-in)",
        "Keeps persistence mode enabled on all simulated GPUs while it runs.",
        depends=("python3",),
        files=(
            FileEntry("/usr/bin/nvidia-persistenced", zipapp("persistenced", v), 0o755),
            _unit(PERSISTENCED_UNIT),
            _doc("nvidia-persistenced", _STANDIN_NOTE),
        ),
        scripts=(("postinst", _postinst_unit(PERSISTENCED_UNIT, start=True)),
                 ("prerm", _prerm_stop(PERSISTENCED_UNIT)),
                 ("postrm", _postrm_unit(PERSISTENCED_UNIT))),
    )
    meta = Package(
        "nvidia-driver-cuda", version, "NVIDIA driver compute-only stack (testbed stand-in)",
        "Depends on the kernel module, nvidia-smi and the persistence daemon of one version.",
        depends=(f"nvidia-kernel-open-dkms {exact}", f"nvidia-smi {exact}",
                 f"nvidia-persistenced {exact}"),
        files=(_doc("nvidia-driver-cuda", _STANDIN_NOTE),),
    )
    return [kmod, smi, persistenced, meta]


_CONFIG_TOML = b"""\
# NVIDIA Container Runtime configuration (rigfleet testbed stand-in).
# The stand-in runtime and hook read nothing from here; the file exists as on real hosts.
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["runc", "crun"]
"""


def toolkit_packages(version: str) -> list[Package]:
    """The container toolkit set, all four at one version (as NVIDIA asks them pinned)."""
    v = upstream(version)
    exact = f"(= {version})"
    lib = Package(
        "libnvidia-container1", version, "NVIDIA container runtime library (testbed stand-in)",
        "Placeholder for the library; the stand-in hook needs no library.",
        files=(_doc("libnvidia-container1", _STANDIN_NOTE),), section="non-free/libs",
    )
    tools = Package(
        "libnvidia-container-tools", version,
        "NVIDIA container runtime library, command-line tools (testbed stand-in)",
        "Placeholder for nvidia-container-cli; its failures are printed by the stand-in hook.",
        depends=(f"libnvidia-container1 {exact}",),
        files=(_doc("libnvidia-container-tools", _STANDIN_NOTE),),
    )
    base = Package(
        "nvidia-container-toolkit-base", version,
        "NVIDIA Container Toolkit base: nvidia-ctk and the runtime (testbed stand-in)",
        "nvidia-ctk registers the nvidia runtime in Docker's daemon.json;\n"
        "nvidia-container-runtime wraps runc.",
        depends=("python3",),
        files=(
            FileEntry("/usr/bin/nvidia-ctk", zipapp("ctk", v), 0o755),
            FileEntry("/usr/bin/nvidia-container-runtime", zipapp("container_runtime"), 0o755),
            FileEntry("/etc/nvidia-container-runtime/config.toml", _CONFIG_TOML),
            _doc("nvidia-container-toolkit-base", _STANDIN_NOTE),
        ),
        conffiles=("/etc/nvidia-container-runtime/config.toml",),
    )
    toolkit = Package(
        "nvidia-container-toolkit", version,
        "NVIDIA Container Toolkit: the OCI prestart hook (testbed stand-in)",
        "nvidia-container-runtime-hook gives GPU containers the simulated driver, and fails\n"
        "like the real one when the driver is not loaded. A systemd generator stands in for\n"
        "what daemon-reload does to the device cgroup of systemd-managed GPU containers.",
        depends=(f"nvidia-container-toolkit-base {exact}", f"libnvidia-container-tools {exact}",
                 "python3", "util-linux"),
        files=(FileEntry("/usr/bin/nvidia-container-runtime-hook", zipapp("runtime_hook"), 0o755),
               FileEntry(f"/usr/lib/systemd/system-generators/{RELOAD_GENERATOR}",
                         zipapp("reload_generator"), 0o755),
               _doc("nvidia-container-toolkit", _STANDIN_NOTE)),
    )
    return [lib, tools, base, toolkit]


def all_packages(driver_versions: Sequence[str] = DRIVER_VERSIONS,
                 toolkit_versions: Sequence[str] = TOOLKIT_VERSIONS) -> list[Package]:
    pkgs: list[Package] = []
    for v in driver_versions:
        pkgs += driver_packages(v)
    for v in toolkit_versions:
        pkgs += toolkit_packages(v)
    return pkgs


# --- building --------------------------------------------------------------------------------


def _stage(pkg: Package, root: Path) -> None:
    debian = root / "DEBIAN"
    debian.mkdir(parents=True)
    (debian / "control").write_text(pkg.control())
    for name, text in pkg.scripts:
        (debian / name).write_text(text)
        os.chmod(debian / name, 0o755)
    if pkg.conffiles:
        (debian / "conffiles").write_text("".join(c + "\n" for c in pkg.conffiles))
    for f in pkg.files:
        dest = root / f.path.lstrip("/")
        if f.path.endswith("/"):
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        if f.symlink is not None:
            dest.symlink_to(f.symlink)
            continue
        if f.source is not None:
            shutil.copyfile(f.source, dest)
        else:
            dest.write_bytes(f.data)
        os.chmod(dest, f.mode)
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            os.utime(Path(dirpath) / name, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH),
                     follow_symlinks=False)
        for name in dirnames:
            os.chmod(Path(dirpath) / name, 0o755)
            os.utime(Path(dirpath) / name, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
    os.chmod(root, 0o755)


def build_deb(pkg: Package, out_dir: Path, compression: tuple[str, ...] = ("-Zxz",)) -> Path:
    """Build one package into out_dir (replaced only when its bytes differ); return its path.

    ``compression``: dpkg-deb's options; big binaries go faster with ``("-Zzstd", "-z3")``
    (dpkg >= 1.21.18 reads zstd, so Debian 12 and 13 do).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / pkg.filename
    with tempfile.TemporaryDirectory(prefix="rigfleet-deb-") as tmp:
        root = Path(tmp) / "root"
        _stage(pkg, root)
        built = Path(tmp) / pkg.filename
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
        proc = subprocess.run(
            ["dpkg-deb", "--root-owner-group", *compression, "--build", str(root), str(built)],
            capture_output=True, text=True, env=env,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"dpkg-deb failed for {pkg.filename}: {proc.stderr.strip()}")
        if not target.exists() or target.read_bytes() != built.read_bytes():
            shutil.move(str(built), target)
    return target


def build_all(out_dir: Path, packages: Sequence[Package] | None = None) -> list[Path]:
    """Build every stand-in into out_dir; older builds of our packages that are no longer
    wanted are removed so the repository built from out_dir lists exactly these."""
    pkgs = list(all_packages() if packages is None else packages)
    paths = [build_deb(p, Path(out_dir)) for p in pkgs]
    names = {p.name for p in pkgs}
    keep = {p.name for p in paths}
    for old in Path(out_dir).glob("*.deb"):
        if old.name not in keep and old.name.split("_", 1)[0] in names:
            old.unlink()
    return paths
