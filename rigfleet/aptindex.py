"""An apt repository read as a host's apt reads it (signed index, then ``Packages`` by SHA256),
for ``rigfleet check --online``. Debian 13 verifies with ``sqv`` (no SHA-1 bindings since
2026-02-01), others with ``gpgv``; docs/converge.md::

    read_index(debian13_repo, policy="sqv").versions("nvidia-driver-cuda")  # ["580.105.08-1"]
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import lzma
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rigfleet.hostdata import AptRepo

ARCH = "amd64"
# Sequoia's standard policy stopped accepting SHA-1 in bindings on this date (trixie's apt).
SHA1_CUTOFF = "2026-02-01"
_SIGCLASS = re.compile(r"sigclass 0x([0-9a-f]{2})")
_DIGEST_ALGO = re.compile(r"digest algo (\d+)")
# Certifications of a user id (0x10-0x13) and subkey bindings (0x18): the key's bindings.
_BINDINGS = {"10", "11", "12", "13", "18"}


class AptIndexError(RuntimeError):
    """The repository's index cannot be used (the message names the URL and why)."""


class AptMissing(AptIndexError):
    """The repository answered 404 for its index: no such suite/distribution there."""


class AptUnreachable(AptIndexError):
    """The repository could not be reached at all."""


@dataclass
class AptIndex:
    """What one repository holds for ``ARCH`` (and ``all``): package -> versions."""

    verifier: str
    packages: dict[str, list[str]] = field(default_factory=dict)

    def versions(self, name: str) -> list[str]:
        return list(self.packages.get(name, []))


def _get(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise AptMissing(f"{url}: not found (HTTP 404)") from None
        raise AptIndexError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (OSError, http.client.HTTPException) as e:  # URLError; a body cut short
        raise AptUnreachable(f"{url}: cannot reach it ({getattr(e, 'reason', e)})") from None


def dist_url(repo: AptRepo) -> str:
    """``<url>/dists/<suite>``, or for a flat repository the suite directory itself."""
    url = repo.url.replace("$(ARCH)", ARCH).rstrip("/")
    if repo.flat:
        sub = repo.suite.strip("/").strip(".")
        return f"{url}/{sub}" if sub else url
    return f"{url}/dists/{repo.suite}"


def _run(args: list[str], what: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(args, capture_output=True, timeout=60, check=False)
    except FileNotFoundError:
        raise AptIndexError(f"{what}: {args[0]} is not installed on this machine") from None


def keyring(key: bytes, home: Path, fingerprint: str | None, key_url: str) -> Path:
    """A binary keyring from an armored or binary key, checked for ``fingerprint``."""
    raw = home / "key.raw"
    raw.write_bytes(key)
    ring = home / "keyring.gpg"
    if b"BEGIN PGP PUBLIC KEY BLOCK" in key:
        proc = _run(["gpg", "--homedir", str(home), "--batch", "--yes", "--dearmor", "-o",
                     str(ring), str(raw)], key_url)
        if proc.returncode != 0:
            raise AptIndexError(f"{key_url}: not an OpenPGP key ({proc.stderr.decode()[-200:]})")
    else:
        ring.write_bytes(key)
    shown = _run(["gpg", "--homedir", str(home), "--batch", "--show-keys", "--with-colons",
                  str(ring)], key_url)
    fprs = [line.split(":")[9] for line in shown.stdout.decode().splitlines()
            if line.startswith("fpr:")]
    if shown.returncode != 0 or not fprs:
        raise AptIndexError(f"{key_url}: not an OpenPGP key")
    if fingerprint and fingerprint.upper() not in fprs:
        raise AptIndexError(f"{key_url}: the key's fingerprints are {', '.join(fprs)}; "
                            f"key_fingerprint says {fingerprint}")
    return ring


def sha1_bound(ring: Path, home: Path) -> bool:
    """Are all of the key's user-id certifications, or all its subkey bindings, SHA-1?"""
    out = _run(["gpg", "--homedir", str(home), "--batch", "--list-packets", str(ring)],
               str(ring)).stdout.decode(errors="replace")
    algos: dict[str, set[int]] = {}
    sigclass = None
    for line in out.splitlines():
        if line.startswith(":signature packet:"):
            sigclass = None
        elif (m := _SIGCLASS.search(line)) is not None:
            sigclass = m.group(1)
        if (d := _DIGEST_ALGO.search(line)) is not None and sigclass in _BINDINGS:
            algos.setdefault("subkey" if sigclass == "18" else "uid", set()).add(int(d.group(1)))
    return any(found == {2} for found in algos.values())


def split_clearsigned(data: bytes, where: str) -> tuple[bytes, bytes]:
    """(the signed text, its armored signature) of a clear-signed ``InRelease``, split as apt
    splits it before ``sqv`` or ``gpgv`` check it: only what the signature covers is read."""
    lines = data.decode("utf-8", "replace").split("\n")
    try:
        if lines[0].rstrip() != "-----BEGIN PGP SIGNED MESSAGE-----":
            raise ValueError
        body = lines.index("", 1) + 1  # after the Hash: headers
        sig = lines.index("-----BEGIN PGP SIGNATURE-----", body)
        end = lines.index("-----END PGP SIGNATURE-----", sig)
    except ValueError:
        raise AptIndexError(f"{where}: not a clear-signed index") from None
    if any(line.strip() for line in lines[end + 1:]):
        raise AptIndexError(f"{where}: text after the signature (apt refuses it)")
    text = "\n".join((line[2:] if line.startswith("- ") else line).rstrip(" \t\r")
                     for line in lines[body:sig])  # RFC 4880 7.1: trailing whitespace unsigned
    return text.encode(), "\n".join(lines[sig:end + 1]).encode() + b"\n"


def verify(base: str, key: bytes, repo: AptRepo, policy: str, timeout: float) -> tuple[str, str]:
    """(the verified Release text, the verifier used) of the index at ``base``: ``InRelease``,
    else ``Release`` and ``Release.gpg``, as apt tries them."""
    with tempfile.TemporaryDirectory(prefix="rigfleet-apt-") as tmp:
        home = Path(tmp)  # mode 0700, as gpg wants its home
        ring = keyring(key, home, repo.key_fingerprint, repo.key_url)
        if policy == "sqv" and sha1_bound(ring, home):
            raise AptIndexError(
                f"{repo.key_url}: the key's bindings are SHA-1, which Debian 13's apt "
                f"(sqv) rejects since {SHA1_CUTOFF}; allowed: the repository NVIDIA signs "
                "for this distribution with its own key, or a host policy that relaxes it")
        release, sig = home / "Release", home / "Release.gpg"
        try:
            text, armored = split_clearsigned(_get(f"{base}/InRelease", timeout),
                                              f"{base}/InRelease")
        except AptMissing:
            text, armored = _get(f"{base}/Release", timeout), _get(f"{base}/Release.gpg", timeout)
        release.write_bytes(text)
        sig.write_bytes(armored)
        if policy == "sqv" and shutil.which("sqv"):
            proc = _run(["sqv", "--keyring", str(ring), str(sig), str(release)], base)
            if proc.returncode != 0:
                raise AptIndexError(f"{base}: sqv (Debian 13's apt) rejects the signature: "
                                    f"{proc.stderr.decode().strip()[-300:]}")
            return text.decode("utf-8", "replace"), "sqv"
        proc = _run(["gpgv", "--homedir", str(home), "--keyring", str(ring), str(sig),
                     str(release)], base)
        if proc.returncode != 0:
            raise AptIndexError(f"{base}: the index's signature does not verify with "
                                f"{repo.key_url}: {proc.stderr.decode().strip()[-300:]}")
        return text.decode("utf-8", "replace"), "gpgv" if policy != "sqv" else (
            "gpgv (sqv not installed; SHA-1 bindings checked with gpg)")


def sha256_list(release: str) -> dict[str, str]:
    """``path -> sha256`` from a Release file's ``SHA256:`` section."""
    out: dict[str, str] = {}
    inside = False
    for line in release.splitlines():
        if not line.startswith(" "):
            inside = line.strip() == "SHA256:"
        elif inside and len(parts := line.split()) == 3:
            out[parts[2]] = parts[0]
    return out


def parse_packages(text: str) -> dict[str, list[str]]:
    """``Package -> [Version, ...]`` of a ``Packages`` file."""
    found: dict[str, list[str]] = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        if "Package" in fields and "Version" in fields:
            found.setdefault(fields["Package"], []).append(fields["Version"].strip())
    return found


# The package lists a repository may list in its signed index, in the order they are fetched:
# Debian's own archive publishes only ``Packages.xz``.
_LISTS: dict[str, Callable[[bytes], bytes]] = {
    "Packages.gz": gzip.decompress, "Packages": bytes, "Packages.xz": lzma.decompress}


def read_index(repo: AptRepo, policy: str = "gpgv", timeout: float = 15.0) -> AptIndex:
    """Verify ``repo``'s index (placeholders already filled) and read its packages."""
    base = dist_url(repo)
    release, verifier = verify(base, _get(repo.key_url, timeout), repo, policy, timeout)
    hashes = sha256_list(release)
    index = AptIndex(verifier)
    dirs = [""] if repo.flat else [f"{c}/binary-{a}/" for c in repo.components
                                   for a in (ARCH, "all")]
    for d in dirs:
        name = next((n for n in _LISTS if f"{d}{n}" in hashes), None)
        if name is None:
            continue
        rel = f"{d}{name}"
        body = _get(f"{base}/{rel}", timeout)
        if hashlib.sha256(body).hexdigest() != hashes[rel]:
            raise AptIndexError(f"{base}/{rel}: its SHA256 is not the one the signed "
                                "index lists (a mirror mid-update?)")
        text = _LISTS[name](body)
        for pkg, versions in parse_packages(text.decode("utf-8", "replace")).items():
            index.packages.setdefault(pkg, []).extend(versions)
    return index
