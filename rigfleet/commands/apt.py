"""apt commands and files: keyrings, deb822 sources, preferences, install and hold."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from urllib.parse import urlparse

KEYRING_DIR = "/etc/apt/keyrings"
SOURCES_DIR = "/etc/apt/sources.list.d"
PREFERENCES_DIR = "/etc/apt/preferences.d"

# Non-interactive, dpkg's lock waited for 120 s (unattended-upgrades, a person's apt), local
# config files kept on upgrade (a prompt would hang an SSH session).
_APT_GET = ("DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout=120 "
            "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")
UPDATE = f"{_APT_GET} update"


def keyring_path(key_url: str) -> str:
    """``.../3bf863cc.pub`` -> ``/etc/apt/keyrings/3bf863cc.gpg``: one keyring per key URL."""
    last = urlparse(key_url).path.rstrip("/").rsplit("/", 1)[-1] or "key"
    base = re.sub(r"\.(asc|gpg|pub|key)$", "", last)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip(".-") or "key"
    return f"{KEYRING_DIR}/{name}.gpg"


def _fetch_dearmored(key_url: str, out: str) -> str:
    # Armored keys are dearmored (byte-stable, so comparable); binary keys pass through.
    # The download is removed whether it worked or not (a fact runs this at every converge).
    return (f'rf_raw=$(mktemp) && {{ curl -fsSL {shlex.quote(key_url)} -o "$rf_raw" && '
            f"{{ if grep -q 'BEGIN PGP PUBLIC KEY BLOCK' \"$rf_raw\"; "
            f'then gpg --batch --yes --dearmor -o {out} "$rf_raw"; '
            f'else cp "$rf_raw" {out}; fi; }}; rf_rc=$?; rm -f "$rf_raw"; [ $rf_rc -eq 0 ]; }}')


def keyring_state(key_url: str, dest: str) -> str:
    """Fact command: ``same``, ``differ`` or ``missing``; an unfetchable key counts as ``same``
    (a converged host must not report a change because a key server is briefly away)."""
    d = shlex.quote(dest)
    return (f"if [ ! -s {d} ]; then echo missing; "
            "elif command -v curl >/dev/null 2>&1 && command -v gpg >/dev/null 2>&1 && "
            f"rf_new=$(mktemp) && {_fetch_dearmored(key_url, chr(34) + '$rf_new' + chr(34))}; "
            f'then if cmp -s "$rf_new" {d}; then echo same; else echo differ; fi; '
            'rm -f "$rf_new"; '
            'else rm -f ${rf_new:+"$rf_new"}; echo same; fi')


def install_keyring(key_url: str, dest: str, fingerprint: str | None = None) -> str:
    """Fetch, dearmor and install the key at ``dest``; a ``fingerprint`` it must carry."""
    d = shlex.quote(dest)
    tmp = shlex.quote(dest + ".rigfleet-tmp")
    check = ""
    if fingerprint:
        fpr = shlex.quote(fingerprint.replace(" ", "").upper())
        check = (f"{{ gpg --batch --show-keys --with-colons {tmp} | grep -q '^fpr:.*:'{fpr}':$' || "
                 f"{{ echo 'key at '{shlex.quote(key_url)}' lacks fingerprint '{fpr} >&2; "
                 f"rm -f {tmp}; false; }}; }} && ")
    return (f"install -d -m 0755 {shlex.quote(KEYRING_DIR)} && "
            f"{_fetch_dearmored(key_url, tmp)} && test -s {tmp} && {check}"
            f"install -m 0644 -o root -g root {tmp} {d} && rm -f {tmp}")


def deb822_sources(url: str, suite: str, components: Sequence[str], signed_by: str) -> str:
    """A deb822 ``.sources`` file (a flat repository, suite ``/``, has no components)."""
    lines = ["Types: deb", f"URIs: {url}", f"Suites: {suite}",
             *([f"Components: {' '.join(components)}"] if components else []),
             f"Signed-By: {signed_by}"]
    return "\n".join(lines) + "\n"


def branch_preferences(version_glob: str, packages: Sequence[str]) -> str:
    """apt preferences holding ``packages`` to the glob (1001: downgrades to it too)."""
    return ("# Managed by rigfleet: the NVIDIA driver stays on the pinned branch.\n"
            f"Package: {' '.join(packages)}\n"
            f"Pin: version {version_glob}\n"
            "Pin-Priority: 1001\n")


def require_candidate(package: str, version_prefix: str, message: str) -> str:
    """Fail with ``message`` unless apt offers ``package`` at ``version_prefix*`` (a pin that
    matches nothing would let apt install the newest instead)."""
    return (f"rf_v=$(apt-cache madison {shlex.quote(package)} 2>/dev/null "
            "| awk -F'|' '{gsub(/ /, \"\", $2); print $2}' | sort -uV | tr '\\n' ' '); "
            f"printf '%s\\n' $rf_v | awk -v p={shlex.quote(version_prefix)} "
            "'index($0, p) == 1 {f = 1} END {exit !f}' || "
            f"{{ echo {shlex.quote(message)}\"; versions there: ${{rf_v:-none}}\" >&2; false; }}")


def install(specs: Sequence[str], allow_downgrades: bool = False,
            download_only: bool = False) -> str:
    """``apt-get install`` of ``name`` / ``name=version`` specs."""
    flags = " --allow-downgrades --allow-change-held-packages" if allow_downgrades else ""
    flags += " --download-only" if download_only else ""
    return f"{_APT_GET}{flags} install {shlex.join(specs)}"


def hold(names: Sequence[str]) -> str:
    return shlex.join(["apt-mark", "hold", *names])
