"""Internals of the vLLM serving simulator.

Modules, in the order a request meets them:

- ``buildinfo``  version, commit and baked-in regressions; Genesis markers
- ``args``       ``vllm serve`` argument parsing (argparse, vLLM's flags and error texts)
- ``logs``       vLLM/uvicorn-style log lines and tracebacks
- ``hardware``   simulated GPUs and their memory (``$NVIDIA_SIM_ROOT``)
- ``modelfiles`` model directory checks (config.json, safetensors shards)
- ``kvcache``    KV cache sizing, calibrated on club-3090's measured pools
- ``boot``       the boot sequence and its failure modes
- ``tokenizer``  a deterministic, lossless tokenizer (~4 chars/token)
- ``chat``       the ChatML chat template (Qwen3 style) used for token counting
- ``facts``      fact recall from the prompt, a tiny fact table, arithmetic
- ``textgen``    deterministic prose/code/reasoning text
- ``responder``  the rule-based "model": what to answer
- ``engine``     decode simulation: timing, spec decode, failure modes, faults
- ``metrics``    Prometheus counters
- ``server``     the OpenAI-compatible HTTP API
"""
