"""Simulated Secure Boot: mokutil's outputs, shim's MokManager at boot, the module's refusal."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rigfleet_testbed import firmware, packages
from rigfleet_testbed.hardware import hardware_profile
from rigfleet_testbed.nvidia import kmod
from rigfleet_testbed.nvidia import simstate as sim

HOST = Path(__file__).resolve().parents[2] / "testbed/rigfleet_testbed/images/host/firmware"
MOKUTIL, BOOT = HOST / "mokutil", HOST / "testbed-firmware-boot"
VERSION = "580.105.08"

needs_tools = pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("sha1sum")),
                                 reason="openssl and sha1sum are needed")


@pytest.fixture(scope="module")
def dkms_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed")
    key, cert = firmware.dkms_key_pair()
    d = tmp_path_factory.mktemp("dkms")
    (d / "mok.key").write_bytes(key)
    (d / "mok.pub").write_bytes(cert)
    return d / "mok.pub", cert


def mokutil(nvram: Path, *args: str, stdin: str = "") -> tuple[int, str, str]:
    proc = subprocess.run(["sh", str(MOKUTIL), *args], input=stdin, capture_output=True,
                          text=True, env={**os.environ, "NVIDIA_SIM_FIRMWARE": str(nvram)})
    return proc.returncode, proc.stdout, proc.stderr


def boot(nvram: Path) -> str:
    proc = subprocess.run(["sh", str(BOOT)], capture_output=True, text=True, check=True,
                          env={**os.environ, "NVIDIA_SIM_FIRMWARE": str(nvram)})
    return proc.stdout


@needs_tools
def test_sb_state_and_machines_without_efi(tmp_path: Path) -> None:
    firmware.init_nvram(tmp_path / "on", secure_boot=True)
    firmware.init_nvram(tmp_path / "off", secure_boot=False)
    assert mokutil(tmp_path / "on", "--sb-state") == (0, "SecureBoot enabled\n", "")
    assert mokutil(tmp_path / "off", "--sb-state") == (0, "SecureBoot disabled\n", "")
    rc, _, err = mokutil(tmp_path / "none", "--sb-state")
    assert (rc, err) == (255, "EFI variables are not supported on this system\n")


@needs_tools
def test_import_only_requests_and_lists_like_mokutil(tmp_path: Path, dkms_key) -> None:
    cert_path, cert = dkms_key
    nvram = tmp_path / "nvram"
    firmware.init_nvram(nvram, secure_boot=True)
    assert mokutil(nvram, "--test-key", str(cert_path)) == (
        0, f"{cert_path} is not enrolled\n", "")  # mokutil 0.6/0.7: 0 for "not enrolled"
    rc, out, _ = mokutil(nvram, "--import", str(cert_path), stdin="pw-1\npw-1\n")
    assert rc == 0 and out == "input password: \ninput password again: \n"
    sha1 = hashlib.sha1(cert).hexdigest()
    assert firmware.pending_requests(nvram) == [sha1] and firmware.enrolled(nvram) == []
    assert (nvram / "MokAuth").stat().st_mode & 0o777 == 0o600
    assert "pw-1" not in (nvram / "MokAuth").read_text()  # a hash, not the password
    rc, out, _ = mokutil(nvram, "--list-new")
    fingerprint = ":".join(sha1[i:i + 2] for i in range(0, 40, 2))
    assert out.startswith(f"[key 1]\nSHA1 Fingerprint: {fingerprint}\nCertificate:\n")
    assert "Subject: CN = DKMS module signing key" in out or \
        "Subject: CN=DKMS module signing key" in out
    assert mokutil(nvram, "--list-new", "--short")[1] == f"{sha1[:10]} DKMS module signing key\n"
    assert mokutil(nvram, "--list-enrolled") == (0, "", "")
    assert mokutil(nvram, "--import", str(cert_path))[1] == \
        f"SKIP: {cert_path} is already in the enrollment request\n"
    assert mokutil(nvram, "--test-key", str(cert_path))[:2] == (
        1, f"{cert_path} is already in the enrollment request\n")
    assert mokutil(nvram, "--revoke-import")[0] == 0
    assert firmware.pending_requests(nvram) == [] and not (nvram / "MokAuth").exists()


@needs_tools
def test_import_password_and_input_errors(tmp_path: Path, dkms_key) -> None:
    cert_path, _ = dkms_key
    nvram = tmp_path / "nvram"
    firmware.init_nvram(nvram, secure_boot=True)
    rc, _, err = mokutil(nvram, "--import", str(cert_path), stdin="a\nb\nc\nd\n")
    assert rc == 255 and err == "password doesn't match\n" * 3 + "Abort\n"
    rc, _, err = mokutil(nvram, "--import", str(cert_path), stdin="")
    assert rc == 255 and err.endswith("Abort\n")
    assert firmware.pending_requests(nvram) == []
    bogus = tmp_path / "not-a-cert"
    bogus.write_text("hello")
    assert mokutil(nvram, "--import", str(bogus))[2] == \
        f"Abort!!! {bogus} is not a valid x509 certificate in DER format\n"
    assert mokutil(nvram, "--import", str(tmp_path / "missing"))[2] == \
        f"Failed to get file status, {tmp_path / 'missing'}\n"
    hash_file = tmp_path / "hash"
    hash_file.write_text("$6$salt$hash\n")
    assert mokutil(nvram, "--import", str(cert_path), "--hash-file", str(hash_file))[0] == 0
    assert firmware.pending_requests(nvram) != []


@needs_tools
def test_mok_manager_enrols_only_with_a_person_at_the_console(tmp_path: Path,
                                                              dkms_key) -> None:
    cert_path, cert = dkms_key
    nvram = tmp_path / "nvram"
    firmware.init_nvram(nvram, secure_boot=True)
    mokutil(nvram, "--import", str(cert_path), stdin="pw\npw\n")
    assert "no key pressed within 10 seconds" in boot(nvram)  # unattended reboot
    assert firmware.pending_requests(nvram) == [] and firmware.enrolled(nvram) == []
    assert not (nvram / "MokAuth").exists()
    mokutil(nvram, "--import", str(cert_path), stdin="pw\npw\n")
    firmware.arm_console(nvram)
    assert "Enroll MOK" in boot(nvram)
    assert firmware.enrolled(nvram) == [hashlib.sha1(cert).hexdigest()]
    assert not (nvram / "console").exists() and firmware.pending_requests(nvram) == []
    assert mokutil(nvram, "--test-key", str(cert_path))[:2] == (
        1, f"{cert_path} is already enrolled\n")
    assert mokutil(nvram, "--list-enrolled", "--short")[1].endswith(
        " DKMS module signing key\n")
    assert mokutil(nvram, "--import", str(cert_path))[1] == \
        f"SKIP: {cert_path} is already enrolled\n"
    assert len(firmware.boot_log(nvram)) == 2
    assert boot(nvram) == ""  # nothing pending: boots straight through


# --- the module under Secure Boot -----------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[sim.SimPaths, Path]:
    source = tmp_path / "etc-hardware.json"
    source.write_text(json.dumps(hardware_profile("host1", secure_boot=True)))
    monkeypatch.setenv("NVIDIA_SIM_ROOT", str(tmp_path / "run"))
    for var in ("NVIDIA_SIM_HARDWARE", "NVIDIA_SIM_DEV", "NVIDIA_SIM_FIRMWARE", "NVIDIA_SIM_DKMS"):
        monkeypatch.delenv(var, raising=False)
    return sim.SimPaths.from_env(), source


def sign(paths: sim.SimPaths, cert: bytes) -> None:
    """What the package's DKMS step records: the signing certificate's SHA-1."""
    d = paths.dkms / "nvidia" / VERSION
    d.mkdir(parents=True)
    (d / kmod.MODULE_SIGNER).write_text(hashlib.sha1(cert).hexdigest() + "\n")


def test_secure_boot_rejects_a_module_whose_key_is_not_enrolled(host) -> None:
    paths, source = host
    firmware.init_nvram(paths.firmware, secure_boot=True)
    err = io.StringIO()
    assert kmod.load(paths, source, VERSION, err=err) == 1
    assert err.getvalue() == ("Loading of unsigned module is rejected\n"
                              "modprobe: ERROR: could not insert 'nvidia': Key was rejected by "
                              "service\n")
    sign(paths, b"cert-one")
    err = io.StringIO()
    assert kmod.load(paths, source, VERSION, err=err) == 1
    assert err.getvalue().startswith("Loading of module with unavailable key is rejected\n")
    assert sim.loaded_version(paths) is None
    firmware.init_nvram(paths.firmware, secure_boot=True, enrolled=[b"cert-one"])
    assert kmod.load(paths, source, VERSION, err=io.StringIO()) == 0
    assert sim.loaded_version(paths) == VERSION


def test_without_secure_boot_any_module_loads(host) -> None:
    paths, source = host
    firmware.init_nvram(paths.firmware, secure_boot=False)
    assert kmod.load(paths, source, VERSION, err=io.StringIO()) == 0
    paths2 = sim.SimPaths(root=paths.root / "x", hardware=paths.hardware,
                          firmware=paths.root / "no-efi", dkms=paths.dkms, dev=paths.dev)
    assert kmod.load(paths2, source, VERSION, err=io.StringIO()) == 0  # legacy BIOS machine


def test_dkms_step_of_the_module_package_signs_with_the_mok(tmp_path: Path) -> None:
    kmod_pkg = packages.driver_packages("580.105.08-1")[0]
    assert kmod_pkg.name == "nvidia-kernel-open-dkms" and "openssl" in kmod_pkg.depends
    postinst = dict(kmod_pkg.scripts)["postinst"]
    assert "openssl req -new -x509 -nodes -days 36500 -subj '/CN=DKMS module signing key' " \
           "-newkey rsa:2048 -keyout /var/lib/dkms/mok.key -outform DER -out " \
           "/var/lib/dkms/mok.pub" in postinst
    assert "sha1sum < /var/lib/dkms/mok.pub | cut -d' ' -f1 > " \
           f"/var/lib/dkms/nvidia/{VERSION}/module-signer" in postinst
    assert "Public certificate (MOK): /var/lib/dkms/mok.pub" in postinst
    if shutil.which("sh") and shutil.which("openssl"):
        # Run the DKMS part against a scratch directory instead of /var/lib/dkms.
        part = postinst[postinst.index('if [ "$1" = "configure" ]; then\n\techo \'Building'):]
        script = part.replace("/var/lib/dkms", str(tmp_path / "dkms"))
        out = subprocess.run(["sh", "-c", script, "postinst", "configure"], check=True,
                             capture_output=True, text=True).stdout
        assert "generating self signed certificate for MOK" in out
        cert = (tmp_path / "dkms/mok.pub").read_bytes()
        assert (tmp_path / f"dkms/nvidia/{VERSION}/module-signer").read_text().strip() == \
            hashlib.sha1(cert).hexdigest()
        assert (tmp_path / "dkms/mok.key").stat().st_mode & 0o777 == 0o600
        again = subprocess.run(["sh", "-c", script, "postinst", "configure"], check=True,
                               capture_output=True, text=True).stdout
        assert "generating" not in again and (tmp_path / "dkms/mok.pub").read_bytes() == cert
