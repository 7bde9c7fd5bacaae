"""Model weights: a pinned huggingface_hub venv, the host-side fetcher, a verified download.

The fetcher (``files/rigfleet-fetch-weights.py``) does the work on the host: per-repo lock,
free-disk check, resumable ``snapshot_download`` at the pinned revision, sha256 of every LFS
file against the hub, manifest written last. The deploy decides whether to run it from the
manifest (``WeightsManifest``: revision + size/mtime of every file), so a converged host shows
no change under ``--dry`` and no download or hashing happens on a re-run.

Example::

    weights(ctx)
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from rigfleet.commands import weights as weights_commands
from rigfleet.facts import VenvPackageVersion, WeightsManifest, read_fact
from rigfleet.hostside.layout import HOST
from rigfleet.resources import project_file
from roles.ops import Secret, secret_file
from roles.preflight import HostContext


@operation()
def hf_hub_venv(version: str, index_url: str | None = None):
    """``Layout.hf_venv`` with exactly ``huggingface_hub==<version>``.

    + version: the pinned huggingface_hub version
    + index_url: a PyPI mirror (host data ``pip_index_url``), else PyPI
    """
    current = read_fact(
        VenvPackageVersion, venv=weights_commands.HF_VENV, dist="huggingface_hub"
    )
    if current == version:
        host.noop(f"huggingface_hub {version} in {weights_commands.HF_VENV}")
        return
    yield weights_commands.venv_install(version, index_url)


@operation()
def fetch_weights(
    repo: str,
    revision: str,
    local_dir: str,
    token_file: str | None = None,
    endpoint: str | None = None,
):
    """Run the fetcher unless the manifest already records this pin and the files match.

    + repo, revision: the model pin (revision is a full commit)
    + local_dir: ``<model_dir>/<local_dir>``
    + token_file: the host's root-only token file, when a token is configured
    + endpoint: ``HF_ENDPOINT`` (a mirror or the testbed hub), else huggingface.co
    """
    state = read_fact(WeightsManifest, local_dir=local_dir)
    if state.repo == repo and state.revision == revision and state.intact:
        host.noop(f"{repo}@{revision[:12]} verified in {local_dir}")
        return
    yield weights_commands.fetch(repo, revision, local_dir, token_file, endpoint)


@deploy("Model weights")
def weights(ctx: HostContext) -> None:
    """Install the fetcher and its venv, then fetch and verify the pinned weights."""
    directories = (
        (str(HOST.opt_dir), "0755"),
        (str(HOST.lib_dir), "0755"),
        (str(HOST.etc_dir), "0755"),
        (str(HOST.secrets_dir), "0700"),
        (str(HOST.state_dir), "0755"),
        (ctx.settings.model_dir, "0755"),
    )
    for path, mode in host.loop(directories):
        files.directory(name=f"Directory {path}", path=path, user="root", group="root", mode=mode)
    hf_hub_venv(
        name=f"huggingface_hub {ctx.pins.hf_hub_version} venv",
        version=ctx.pins.hf_hub_version,
        index_url=ctx.settings.pip_index_url,
    )
    files.put(
        name="Weights fetcher script",
        src=str(project_file("files/rigfleet-fetch-weights.py")),
        dest=weights_commands.FETCH_SCRIPT,
        user="root",
        group="root",
        mode="0755",
    )
    token_file = None
    if ctx.hf_token is not None:
        token_file = weights_commands.HF_TOKEN_FILE
        secret_file(
            name="Hugging Face token (root-only)",
            dest=token_file,
            content=Secret(ctx.hf_token.reveal() + "\n"),
        )
    model = ctx.pins.model
    fetch_weights(
        name=f"Fetch and verify {model.repo}@{model.revision[:12]}",
        repo=model.repo,
        revision=model.revision,
        local_dir=ctx.want.model_path,
        token_file=token_file,
        endpoint=ctx.settings.hf_endpoint,
    )
