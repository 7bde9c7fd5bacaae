"""Genesis patch orchestration; the entry point is :mod:`vllm._genesis.patches.apply_all`."""
