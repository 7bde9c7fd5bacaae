"""vLLM's utilities (simulator: only what the serving CLI and its callers import)."""
