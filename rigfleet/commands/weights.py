"""Commands for the huggingface_hub venv and the host-side weights fetcher.

Example::

    from rigfleet.commands import weights

    weights.fetch("Lorbus/Qwen3.6-27B-int4-AutoRound", "0" * 40, "/srv/models/qwen")
"""

from __future__ import annotations

import shlex
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
) -> str:
    """Run the fetcher; the token stays in its root-only file (the script reads it)."""
    env = f"HF_ENDPOINT={shlex.quote(endpoint)} " if endpoint else ""
    token = f" --token-file {shlex.quote(token_file)}" if token_file else ""
    return (
        f"{env}HF_HUB_DISABLE_TELEMETRY=1 {HF_VENV}/bin/python {FETCH_SCRIPT} fetch "
        f"--repo {shlex.quote(repo)} --revision {shlex.quote(revision)} "
        f"--local-dir {shlex.quote(local_dir)} --lock-dir {LOCK_DIR}{token}"
    )
