"""apt commands and files: keyrings, deb822 sources, preferences, install and hold.

Example::

    from rigfleet.commands import apt

    apt.keyring_path("https://nvidia.github.io/libnvidia-container/gpgkey")
    # '/etc/apt/keyrings/gpgkey.gpg'
    apt.install(["jq", "nvidia-container-toolkit=1.17.8-1"])
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from urllib.parse import urlparse

KEYRING_DIR = "/etc/apt/keyrings"
SOURCES_DIR = "/etc/apt/sources.list.d"
PREFERENCES_DIR = "/etc/apt/preferences.d"

# How long apt waits for dpkg's lock another program holds (unattended-upgrades, a person's
# apt) before it fails, instead of failing at once.
LOCK_TIMEOUT_S = 120
# Non-interactive, keep local config files on upgrade (a prompt would hang an SSH session).
_APT_GET = (
    "DEBIAN_FRONTEND=noninteractive apt-get -y -q "
    f"-o DPkg::Lock::Timeout={LOCK_TIMEOUT_S} "
    "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
)


def keyring_name(key_url: str) -> str:
    """The keyring's base name, from the key URL's last path segment without extension.

    ``.../rigfleet-testbed.asc`` -> ``rigfleet-testbed``; ``.../3bf863cc.pub`` -> ``3bf863cc``.
    Two repositories signed by the same key URL share one keyring file.
    """
    last = urlparse(key_url).path.rstrip("/").rsplit("/", 1)[-1] or "key"
    base = re.sub(r"\.(asc|gpg|pub|key)$", "", last)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip(".-") or "key"


def keyring_path(key_url: str) -> str:
    """``/etc/apt/keyrings/<name>.gpg`` for ``key_url`` (see ``keyring_name``)."""
    return f"{KEYRING_DIR}/{keyring_name(key_url)}.gpg"


def _fetch_dearmored(key_url: str, out: str) -> str:
    # Armored keys (NVIDIA's, the testbed's) are dearmored; a binary key passes through as is.
    # `gpg --dearmor` only decodes base64, so its output is byte-for-byte stable and can be
    # compared with the installed keyring. Fails (non-zero) when the download fails.
    return (
        f'rf_raw=$(mktemp) && curl -fsSL {shlex.quote(key_url)} -o "$rf_raw" && '
        f"{{ if grep -q 'BEGIN PGP PUBLIC KEY BLOCK' \"$rf_raw\"; "
        f'then gpg --batch --yes --dearmor -o {out} "$rf_raw"; '
        f'else cp "$rf_raw" {out}; fi; }} && rm -f "$rf_raw"'
    )


def keyring_state(key_url: str, dest: str) -> str:
    """Fact command: prints ``same``, ``differ`` or ``missing`` for the installed keyring.

    When the key cannot be fetched now (no curl/gpg yet, network down) an existing keyring
    counts as ``same``: the install step would fail the same way, and a converged host must
    not report a change because a key server is briefly away.
    """
    d = shlex.quote(dest)
    return (
        f"if [ ! -s {d} ]; then echo missing; "
        "elif command -v curl >/dev/null 2>&1 && command -v gpg >/dev/null 2>&1 && "
        f"rf_new=$(mktemp) && {_fetch_dearmored(key_url, chr(34) + '$rf_new' + chr(34))}; "
        f'then if cmp -s "$rf_new" {d}; then echo same; else echo differ; fi; '
        'rm -f "$rf_new"; '
        "else echo same; fi"
    )


def install_keyring(key_url: str, dest: str, fingerprint: str | None = None) -> str:
    """Fetch ``key_url`` with curl, dearmor with gpg, install it 0644 root at ``dest``.

    + fingerprint: when given (40 hex), the fetched key must carry it or nothing is installed
    """
    d = shlex.quote(dest)
    tmp = shlex.quote(dest + ".rigfleet-tmp")
    check = ""
    if fingerprint:
        fpr = shlex.quote(fingerprint.replace(" ", "").upper())
        check = (
            f"{{ gpg --batch --show-keys --with-colons {tmp} | grep -q '^fpr:.*:'{fpr}':$' || "
            f"{{ echo 'key at '{shlex.quote(key_url)}' lacks fingerprint '{fpr} >&2; "
            f"rm -f {tmp}; false; }}; }} && "
        )
    return (
        f"install -d -m 0755 {shlex.quote(KEYRING_DIR)} && "
        f"{_fetch_dearmored(key_url, tmp)} && test -s {tmp} && {check}"
        f"install -m 0644 -o root -g root {tmp} {d} && rm -f {tmp}"
    )


def deb822_sources(url: str, suite: str, components: Sequence[str] | str, signed_by: str) -> str:
    """A deb822 ``.sources`` file for one repository.

    A flat repository (NVIDIA's CUDA repo: suite ``/``) has no components, so the line is left
    out when there are none.
    """
    comps = components.split() if isinstance(components, str) else list(components)
    lines = ["Types: deb", f"URIs: {url}", f"Suites: {suite}"]
    if comps:
        lines.append(f"Components: {' '.join(comps)}")
    lines.append(f"Signed-By: {signed_by}")
    return "\n".join(lines) + "\n"


def branch_preferences(version_glob: str, packages: Sequence[str]) -> str:
    """apt preferences pinning ``packages`` (globs allowed) to versions matching the glob.

    Priority 1001 makes apt prefer (and downgrade to) the pinned branch even when a newer
    branch is in the same repository; versions outside the glob keep their normal priority, so
    the container toolkit (1.x) is unaffected by a ``580.*`` pin.
    """
    return (
        "# Managed by rigfleet: the NVIDIA driver stays on the pinned branch.\n"
        f"Package: {' '.join(packages)}\n"
        f"Pin: version {version_glob}\n"
        "Pin-Priority: 1001\n"
    )


def require_candidate(package: str, version_prefix: str, message: str) -> str:
    """Fails (``message`` and the versions there on stderr) unless the configured repositories
    offer ``package`` at a version starting with ``version_prefix`` (run after ``update``).

    An apt preferences pin that matches nothing does not stop apt: it would install the
    newest version instead. This stops the host first.
    """
    return (
        f"rf_v=$(apt-cache madison {shlex.quote(package)} 2>/dev/null "
        "| awk -F'|' '{gsub(/ /, \"\", $2); print $2}' | sort -uV | tr '\\n' ' '); "
        f"printf '%s\\n' $rf_v | awk -v p={shlex.quote(version_prefix)} "
        "'index($0, p) == 1 {f = 1} END {exit !f}' || "
        f"{{ echo {shlex.quote(message)}\"; versions there: ${{rf_v:-none}}\" >&2; false; }}"
    )


def update() -> str:
    """``apt-get update``, quiet and non-interactive."""
    return f"{_APT_GET} update"


def install(specs: Sequence[str], allow_downgrades: bool = False,
            download_only: bool = False) -> str:
    """``apt-get install`` of ``name`` / ``name=version`` specs.

    + allow_downgrades: also allow changing held packages (a pin bump of a held driver)
    + download_only: only fetch them into apt's cache (the inputs of a maintenance step,
      before its window opens)
    """
    flags = " --allow-downgrades --allow-change-held-packages" if allow_downgrades else ""
    flags += " --download-only" if download_only else ""
    return f"{_APT_GET}{flags} install " + " ".join(shlex.quote(s) for s in specs)


def hold(names: Sequence[str]) -> str:
    """``apt-mark hold``: unattended upgrades and ``apt upgrade`` leave these alone."""
    return "apt-mark hold " + " ".join(shlex.quote(n) for n in names)


def dpkg_state() -> str:
    """Fact command: one ``name<TAB>version<TAB>status`` line per known package."""
    return "dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n' 2>/dev/null || true"
