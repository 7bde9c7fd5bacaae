"""PATCH_REGISTRY: every patch's metadata (data only).

Each entry: ``title``, ``env_flag`` (the ``GENESIS_ENABLE_*`` switch; ``GENESIS_LEGACY_<id>``
for a legacy patch, which is no switch), ``default_on``, ``category``, ``lifecycle``
(experimental | legacy | research | retired) and, where declared,
``applies_to.vllm_version_range`` (PEP 440 specifiers, a tuple or one string, enforced only
with ``GENESIS_ENFORCE_VERSION_RANGE=1``).
"""

from __future__ import annotations

from typing import Any

PATCH_REGISTRY: dict[str, dict[str, Any]] = {}  # genesis-fixture: registry
