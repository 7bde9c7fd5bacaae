"""Every path rigfleet keeps on a host: ``Layout``, one per filesystem root (``HOST``: ``/``;
tests: ``Layout(tmp_path)``); docs/architecture.md, "Where each record lives"::

    HOST.lock_dir                      # PosixPath('/var/lib/rigfleet/lock')
    HOST.compose_file("int8")          # PosixPath('/opt/rigfleet/stacks/int8/compose.yaml')
    Layout(tmp_path).state_file        # tmp_path / 'var/lib/rigfleet/state.json'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STATE_ROOT = "/var/lib/rigfleet"
OPT_ROOT = "/opt/rigfleet"
ETC_ROOT = "/etc/rigfleet"
CACHE_ROOT = "/var/cache/rigfleet"
LIB_ROOT = "/usr/local/lib/rigfleet"
FRONT_ROOT = "/etc/nginx/rigfleet"

CONFIG_HASH_LABEL = "io.rigfleet.config-hash"
STACK_LABEL = "io.rigfleet.stack"
# On an image rigfleet derived from a pinned one (rigfleet.runtime_image): the base's digest.
BASE_DIGEST_LABEL = "io.rigfleet.base-digest"
# The first line of the front's route include: "# rigfleet route: <stack>/<config hash>".
ROUTE_MARK = "# rigfleet route: "
# Written next to verified weights by the fetcher (files/rigfleet-fetch-weights.py).
MANIFEST_NAME = ".rigfleet-manifest.json"
# A throughput directory's files: the verified history and the last gate's figures.
THROUGHPUT_HISTORY_NAME = "history.jsonl"
THROUGHPUT_LAST_NAME = "last.json"
# A model revision's directory: ``<local_dir>@<its first 12 hex>`` (a pinned ``local_dir``
# never holds an '@', rigfleet/pins.py).
WEIGHTS_REVISION_MARK = "@"
WEIGHTS_REVISION_CHARS = 12
# The units roles/swap.py installs: the active stack across reboots and its supervisor.
STACK_UNIT = "rigfleet-stack.service"
SUPERVISE_UNIT = "rigfleet-supervise.service"


class _At:
    """A ``Layout`` path: ``parts`` joined below the layout's root."""

    def __init__(self, *parts: str) -> None:
        self.parts = (parts[0].lstrip("/"), *parts[1:])

    def __get__(self, lay: Layout, owner: type | None = None) -> Path:
        return lay.root.joinpath(*self.parts)


class _Of:
    """A ``Layout`` path of one name: ``lay.swap_dir(name)`` fills the ``{}`` in ``parts``."""

    def __init__(self, *parts: str) -> None:
        self.at = _At(*parts)

    def __get__(self, lay: Layout, owner: type | None = None) -> Callable[[str], Path]:
        return lambda name: lay.root.joinpath(*(part.format(name) for part in self.at.parts))


@dataclass(frozen=True)
class Layout:
    """Host paths below ``root`` (``/`` on a host, a temporary directory in tests)."""

    root: Path = Path("/")

    # /var/lib/rigfleet: records; ``active/compose.yaml`` links the current snapshot, for people.
    state_dir = _At(STATE_ROOT)
    lock_dir = _At(STATE_ROOT, "lock")
    state_file = _At(STATE_ROOT, "state.json")
    ledger_file = _At(STATE_ROOT, "ledger.jsonl")
    active_dir = _At(STATE_ROOT, "active")
    active_json = _At(STATE_ROOT, "active", "active.json")
    active_compose = _At(STATE_ROOT, "active", "compose.yaml")
    active_snapshot = _Of(STATE_ROOT, "active", "compose-{}.yaml")  # by config hash
    swaps_dir = _At(STATE_ROOT, "swap")
    # One transaction: plan.json, events.jsonl, result.json, kept logs.
    swap_dir = _Of(STATE_ROOT, "swap", "{}")
    plan_file = _Of(STATE_ROOT, "swap", "{}", "plan.json")
    reports_dir = _At(STATE_ROOT, "reports")  # gate reports, flat: verify-<ts>.json / .md
    supervise_dir = _At(STATE_ROOT, "supervise")
    supervise_state = _At(STATE_ROOT, "supervise", "state.json")
    supervise_reset = _At(STATE_ROOT, "supervise", "reset.json")
    throughput_dir = _At(STATE_ROOT, "throughput")
    throughput_history = _At(STATE_ROOT, "throughput", THROUGHPUT_HISTORY_NAME)
    throughput_last = _At(STATE_ROOT, "throughput", THROUGHPUT_LAST_NAME)
    timings_file = _At(STATE_ROOT, "timings.json")  # measured window times: Retry-After
    maintenance_dir = _At(STATE_ROOT, "maintenance")
    window_file = _At(STATE_ROOT, "maintenance", "window.json")
    window_plan = _Of(STATE_ROOT, "maintenance", "plan-{}.json")  # the deploy's, for a window
    locks_dir = _At(STATE_ROOT, "locks")  # flock files of long host jobs (the weight fetcher)
    version_cache_dir = _At(STATE_ROOT, "vllm-versions")
    loaded_images_dir = _At(STATE_ROOT, "images-loaded")

    # /opt/rigfleet: what the deploy stages (the Genesis checkout is never mounted).
    opt_dir = _At(OPT_ROOT)
    stacks_dir = _At(OPT_ROOT, "stacks")
    stack_dir = _Of(OPT_ROOT, "stacks", "{}")
    compose_file = _Of(OPT_ROOT, "stacks", "{}", "compose.yaml")
    genesis_checkout = _At(OPT_ROOT, "genesis")
    genesis_trees_dir = _At(OPT_ROOT, "genesis-trees")
    genesis_tree = _Of(OPT_ROOT, "genesis-trees", "{}")  # by commit: a rollback finds the old one
    image_build_dir = _Of(OPT_ROOT, "images", "{}")  # a derived image's Dockerfile
    hf_venv = _At(OPT_ROOT, "hf-venv")  # the pinned huggingface_hub (the weight fetcher's)

    # /etc/rigfleet: secrets; the API key alone, as the stacks' env_file and as a header line.
    etc_dir = _At(ETC_ROOT)
    secrets_dir = _At(ETC_ROOT, "secrets")
    api_key_file = _At(ETC_ROOT, "secrets", "api-key")
    vllm_env_file = _At(ETC_ROOT, "secrets", "vllm.env")
    auth_header_file = _At(ETC_ROOT, "secrets", "api-auth-header")
    hf_token_file = _At(ETC_ROOT, "secrets", "hf-token")

    # Compile caches, programs, and the front's route include (proxy to a stack, or 503).
    # One stack's compile caches, never shared (vLLM's AOT cache key ignores the GPU
    # architecture and the quantisation kernel, club-3090 #548).
    stack_cache_dir = _Of(CACHE_ROOT, "{}")
    lib_dir = _At(LIB_ROOT)
    script = _Of(LIB_ROOT, "{}")  # a helper script the deploy installs
    bundle = _At(LIB_ROOT, "rigfleet-host.pyz")  # the zipapp (roles/swap.py uploads it)
    front_dir = _At(FRONT_ROOT)
    front_route = _At(FRONT_ROOT, "route.conf")

    def version_cache(self, digest: str) -> Path:
        """An image's cached vLLM version, keyed by its (immutable) digest."""
        return self.version_cache_dir / digest.removeprefix("sha256:")

    def loaded_image(self, digest: str) -> Path:
        return self.loaded_images_dir / digest.removeprefix("sha256:")

    def weights_dir(self, model_dir: str, local_dir: str, revision: str) -> Path:
        """``<model_dir>/<local_dir>@<revision[:12]>``: renamed in once verified, then read-only."""
        name = f"{local_dir}{WEIGHTS_REVISION_MARK}{revision[:WEIGHTS_REVISION_CHARS]}"
        return self.root / model_dir.lstrip("/") / name

    def weights_legacy_dir(self, model_dir: str, local_dir: str) -> Path:
        """Where weights lived before per-revision directories (the deploy adopts it)."""
        return self.root / model_dir.lstrip("/") / local_dir


# The host itself: what the control side names in commands and uploads.
HOST = Layout()
BUNDLE_PATH = str(HOST.bundle)
