"""Marlin mixed-precision linear kernel: source text only (rigfleet serving simulator).

The form of builds with vllm#45295 (general tile pad, ``marlin_padded_nk``; upstream at
0.22.1rc1.dev491, released in v0.24.0): sub-tile output shards are padded on load.
"""

GPTQ_MARLIN_MIN_THREAD_N = 64


def marlin_padded_nk(n, k):
    return -(-n // GPTQ_MARLIN_MIN_THREAD_N) * GPTQ_MARLIN_MIN_THREAD_N, k


class MarlinLinearKernel:
    @classmethod
    def can_implement(cls, c):
        out_features, _ = marlin_padded_nk(c.partition_weight_shape[1], c.partition_weight_shape[0])
        return out_features >= GPTQ_MARLIN_MIN_THREAD_N, None
