"""rigfleet: provision dual-RTX-3090 hosts serving Qwen3.6-27B with vLLM, on pyinfra."""

__version__ = "0.1.0"
