"""The simulated UEFI firmware of a testbed host: its NVRAM, on the control side.

Firmware settings survive reboots and reinstalls, so the NVRAM is a directory of the testbed's
state (``.testbed/hosts/<host>/firmware``) bind-mounted read-write at
``/etc/nvidia-sim/firmware`` in the host. On the host, the stand-in ``mokutil`` reads and writes
it, shim's MokManager stand-in (``testbed-firmware-boot``) acts on it at every boot and the
stand-in kernel module checks its signer against it. Layout (``images/host/firmware/mokutil``)::

    SecureBoot  SetupMode      "1" / "0"
    MokListRT/<sha1>.der       enrolled machine owner keys
    MokNew/<sha1>.der, MokAuth a pending enrolment request (mokutil --import)
    console                    a person will be at the console at the next boot (mok-enroll)
    boot.log                   what MokManager did at each boot

Usage::

    init_nvram(path, secure_boot=True, enrolled=[cert_der])
    pending_requests(path)      # ['3f0a...'] after `mokutil --import` on the host
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

DKMS_KEY_SUBJECT = "/CN=DKMS module signing key"


def init_nvram(path: Path, secure_boot: bool, enrolled: list[bytes] | None = None) -> None:
    """A fresh machine's NVRAM (replaces whatever was there)."""
    shutil.rmtree(path, ignore_errors=True)
    (path / "MokListRT").mkdir(parents=True)
    (path / "SecureBoot").write_text("1\n" if secure_boot else "0\n")
    (path / "SetupMode").write_text("0\n")
    for der in enrolled or []:
        (path / "MokListRT" / f"{hashlib.sha1(der).hexdigest()}.der").write_bytes(der)


def dkms_key_pair() -> tuple[bytes, bytes]:
    """(private key PEM, certificate DER) as DKMS makes them (dell/dkms: openssl req ...)."""
    with tempfile.TemporaryDirectory(prefix="rigfleet-mok-") as tmp:
        key, cert = Path(tmp) / "mok.key", Path(tmp) / "mok.pub"
        subprocess.run(
            ["openssl", "req", "-new", "-x509", "-nodes", "-days", "36500", "-subj",
             DKMS_KEY_SUBJECT, "-newkey", "rsa:2048", "-keyout", str(key), "-outform", "DER",
             "-out", str(cert)], check=True, capture_output=True)
        return key.read_bytes(), cert.read_bytes()


def pending_requests(path: Path) -> list[str]:
    """SHA-1s of the keys a pending ``mokutil --import`` asked to enrol."""
    return sorted(p.stem for p in (path / "MokNew").glob("*.der"))


def enrolled(path: Path) -> list[str]:
    return sorted(p.stem for p in (path / "MokListRT").glob("*.der"))


def arm_console(path: Path) -> None:
    """A person will be at the console at the next boot (and enrol what is pending)."""
    (path / "console").write_text("enroll\n")


def boot_log(path: Path) -> list[str]:
    try:
        return (path / "boot.log").read_text().splitlines()
    except FileNotFoundError:
        return []
