"""The vLLM patches."""
