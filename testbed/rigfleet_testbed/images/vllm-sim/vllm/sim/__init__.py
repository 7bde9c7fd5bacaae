"""Internals of the vLLM serving simulator.

Modules, in the order a request meets them:

- ``buildinfo``  version, commit and baked-in regressions; Genesis markers
- ``args``       ``vllm serve`` argument parsing (argparse, vLLM's flags and error texts)
- ``logs``       vLLM/uvicorn-style log lines and tracebacks
- ``hardware``   simulated GPUs and their memory (``$NVIDIA_SIM_ROOT``)
- ``modelfiles`` model directory checks (config.json, safetensors shards)
- ``kvcache``    KV cache sizing, calibrated on club-3090's measured pools
- ``graphmode``  attention backend and the CUDA-graph mode (FlashInfer + MTP -> PIECEWISE)
- ``compilecache`` torch.compile's on-disk cache: cold compile or hit
- ``startup``    compile and graph capture at boot (their log lines and time)
- ``boot``       the boot sequence and its failure modes
- ``tokenizer``  a deterministic, lossless tokenizer (~4 chars/token)
- ``chat``       the ChatML chat template (Qwen3 style) used for token counting
- ``facts``      fact recall from the prompt, a tiny fact table, arithmetic
- ``textgen``    deterministic prose/code/reasoning text
- ``responder``  the rule-based "model": what to answer
- ``perf``       the throughput model: decode/prefill speed from hardware, stack and load
- ``rig``        power limits, PCIe links and the clock of the cards in use; activity for
                 nvidia-smi
- ``engine``     decode simulation: pacing, spec decode, failure modes, faults
- ``metrics``    Prometheus counters
- ``server``     the OpenAI-compatible HTTP API
"""
