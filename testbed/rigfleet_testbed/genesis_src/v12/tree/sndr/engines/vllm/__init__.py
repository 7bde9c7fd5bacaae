"""The vLLM engine: detection (the pin gate) and patches."""
