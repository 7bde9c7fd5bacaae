"""Where the host-side tool keeps its state: one ``Layout`` per filesystem root.

Every path the transaction, the lock, the ledger and the front touch comes from here, so the
unit tests run the real code against a temporary directory (``Layout(tmp_path)``) and the
hosts against ``/``::

    lay = Layout()                      # root "/"
    lay.lock_dir                        # /var/lib/rigfleet/lock
    lay.swap_dir("20261129T101500Z-1a2b3c")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The zipapp's place on a host (roles/swap.py uploads it there).
BUNDLE_PATH = "/usr/local/lib/rigfleet/rigfleet-host.pyz"
CONFIG_HASH_LABEL = "io.rigfleet.config-hash"
STACK_LABEL = "io.rigfleet.stack"


@dataclass(frozen=True)
class Layout:
    """Host paths below ``root`` (``/`` on a host, a temporary directory in tests)."""

    root: Path = Path("/")

    def _p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    @property
    def state_dir(self) -> Path:
        return self._p("/var/lib/rigfleet")

    @property
    def lock_dir(self) -> Path:
        """``mkdir`` of this directory is the lock; ``holder.json`` inside says who."""
        return self.state_dir / "lock"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def ledger_file(self) -> Path:
        return self.state_dir / "ledger.jsonl"

    @property
    def active_dir(self) -> Path:
        """The stack that serves (or served last): ``active.json`` and ``compose.yaml``, a
        snapshot of exactly what was verified, so a rollback restarts that and nothing else."""
        return self.state_dir / "active"

    @property
    def active_json(self) -> Path:
        return self.active_dir / "active.json"

    @property
    def active_compose(self) -> Path:
        return self.active_dir / "compose.yaml"

    @property
    def swaps_dir(self) -> Path:
        return self.state_dir / "swap"

    def swap_dir(self, swap_id: str) -> Path:
        """One transaction: ``plan.json``, ``events.jsonl``, ``result.json``, kept logs."""
        return self.swaps_dir / swap_id

    @property
    def reports_dir(self) -> Path:
        """Gate reports (``verify-<ts>.json`` / ``.md``), flat, as ``rigfleet status`` reads."""
        return self.state_dir / "reports"

    @property
    def front_dir(self) -> Path:
        return self._p("/etc/nginx/rigfleet")

    @property
    def front_route(self) -> Path:
        """The include the front's ``location /`` ends with: proxy to a stack, or 503."""
        return self.front_dir / "route.conf"

    @property
    def api_key_file(self) -> Path:
        """The API key alone (root 0600), for the gate and the host's own probes."""
        return self._p("/etc/rigfleet/secrets/api-key")

    @property
    def vllm_env_file(self) -> Path:
        return self._p("/etc/rigfleet/secrets/vllm.env")

    @property
    def bundle(self) -> Path:
        return self._p(BUNDLE_PATH)
