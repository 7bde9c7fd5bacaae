"""SNDR Core (Genesis v12): multi-engine patch orchestrator; this fixture carries the vLLM engine.

Applied before ``vllm serve`` with ``python3 -m sndr.apply``, or in every vLLM process by the
``vllm.general_plugins`` entry point ``genesis_v7 = sndr.plugin:register``.
"""

from sndr.version import __version__

__all__ = ["__version__"]
