"""Commands for the huggingface_hub venv and the host-side weights fetcher.

Example::

    from rigfleet.commands import weights

    weights.fetch("Lorbus/Qwen3.6-27B-int4-AutoRound", "0" * 40, "/srv/models/qwen@000000000000")
    weights.adopt("Lorbus/Qwen3.6-27B-int4-AutoRound", "0" * 40, "/srv/models/qwen",
                  "/srv/models/qwen@000000000000")
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from urllib.parse import urlsplit

from rigfleet.hostside.layout import HOST

HF_VENV = str(HOST.hf_venv)
FETCH_SCRIPT = str(HOST.script("rigfleet-fetch-weights.py"))
HF_TOKEN_FILE = str(HOST.hf_token_file)
LOCK_DIR = str(HOST.locks_dir)


def venv_install(version: str, index_url: str | None = None) -> str:
    """Create the venv if needed and install ``huggingface_hub==<version>`` into it.

    + index_url: a PyPI mirror; a plain-http one is also marked trusted (pip ignores an
      http index otherwise)
    """
    index = ""
    if index_url:
        index = f" --index-url {shlex.quote(index_url)}"
        parts = urlsplit(index_url)
        if parts.scheme == "http" and parts.hostname:
            index += f" --trusted-host {shlex.quote(parts.hostname)}"
    return (
        f"( test -x {HF_VENV}/bin/python || python3 -m venv {HF_VENV} ) && "
        f"{HF_VENV}/bin/pip install --disable-pip-version-check --no-input -q{index} "
        f"{shlex.quote(f'huggingface_hub=={version}')}"
    )


def fetch(
    repo: str,
    revision: str,
    local_dir: str,
    token_file: str | None = None,
    endpoint: str | None = None,
    mirrors: Sequence[str] = (),
) -> str:
    """Run the fetcher; the token stays in its root-only file (the script reads it).

    + mirrors: fleet caches tried before the hub, in order (every file verified either way)
    """
    env = f"HF_ENDPOINT={shlex.quote(endpoint)} " if endpoint else ""
    token = f" --token-file {shlex.quote(token_file)}" if token_file else ""
    mirror = "".join(f" --mirror {shlex.quote(m)}" for m in mirrors)
    return (
        f"{env}HF_HUB_DISABLE_TELEMETRY=1 {HF_VENV}/bin/python {FETCH_SCRIPT} fetch "
        f"--repo {shlex.quote(repo)} --revision {shlex.quote(revision)} "
        f"--local-dir {shlex.quote(local_dir)} --lock-dir {LOCK_DIR}{token}{mirror}"
    )


def adopt(repo: str, revision: str, old: str, new: str) -> str:
    """Rename ``old`` (weights of before per-revision directories, verified for ``revision``)
    to ``new`` (its revision's directory) and leave ``old`` as a link to it; the fetcher
    checks the manifest first and takes the same per-repo lock as a fetch."""
    return (
        f"{HF_VENV}/bin/python {FETCH_SCRIPT} adopt --repo {shlex.quote(repo)} "
        f"--revision {shlex.quote(revision)} --from {shlex.quote(old)} --to {shlex.quote(new)} "
        f"--lock-dir {LOCK_DIR}"
    )


def remove(paths: Sequence[str]) -> str:
    """Remove stale revision directories, partial downloads and old links (``rm -rf`` of a
    link removes the link, not what it points to)."""
    return "rm -rf -- " + " ".join(shlex.quote(p) for p in paths)
