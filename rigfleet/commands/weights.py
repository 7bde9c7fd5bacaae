"""Commands for the huggingface_hub venv and the host-side weights fetcher."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from urllib.parse import urlsplit

from rigfleet.hostside.layout import HOST

HF_VENV = str(HOST.hf_venv)
FETCH_SCRIPT = str(HOST.script("rigfleet-fetch-weights.py"))


def pip_index(index_url: str | None) -> str:
    """pip's `` --index-url`` option (a plain-http index trusted), or nothing."""
    if not index_url:
        return ""
    host = urlsplit(index_url).hostname if urlsplit(index_url).scheme == "http" else None
    return f" --index-url {shlex.quote(index_url)}" + (
        f" --trusted-host {shlex.quote(host)}" if host else "")


def venv_install(version: str, index_url: str | None = None) -> str:
    return (f"( test -x {HF_VENV}/bin/python || python3 -m venv {HF_VENV} ) && "
            f"{HF_VENV}/bin/pip install --disable-pip-version-check --no-input -q"
            f"{pip_index(index_url)} "
            f"{shlex.quote(f'huggingface_hub=={version}')}")


def fetch(repo: str, revision: str, local_dir: str, token_file: str | None = None,
          endpoint: str | None = None, mirrors: Sequence[str] = ()) -> str:
    """Run the fetcher (the token stays in its file); ``mirrors`` are tried before the hub."""
    env = f"HF_ENDPOINT={shlex.quote(endpoint)} " if endpoint else ""
    token = f" --token-file {shlex.quote(token_file)}" if token_file else ""
    mirror = "".join(f" --mirror {shlex.quote(m)}" for m in mirrors)
    return (f"{env}HF_HUB_DISABLE_TELEMETRY=1 {HF_VENV}/bin/python {FETCH_SCRIPT} fetch "
            f"--repo {shlex.quote(repo)} --revision {shlex.quote(revision)} "
            f"--local-dir {shlex.quote(local_dir)} --lock-dir {HOST.locks_dir}{token}{mirror}")


def adopt(repo: str, revision: str, old: str, new: str) -> str:
    """Move verified pre-revision weights ``old`` to ``new`` and leave ``old`` a link to it."""
    return (f"{HF_VENV}/bin/python {FETCH_SCRIPT} adopt --repo {shlex.quote(repo)} "
            f"--revision {shlex.quote(revision)} --from {shlex.quote(old)} --to {shlex.quote(new)} "
            f"--lock-dir {HOST.locks_dir}")


def remove(paths: Sequence[str]) -> str:
    """Remove stale revision directories, partial downloads and old links."""
    return shlex.join(["rm", "-rf", "--", *paths])
