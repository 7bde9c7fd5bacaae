"""Marlin mixed-precision linear kernel: source text only (rigfleet serving simulator).

The form of builds before vllm#45295: an output shard narrower than GPTQ_MARLIN_MIN_THREAD_N is
refused. The pad fix (vllm#40361) arrives as a bind-mounted overlay of this file or as Genesis
P87's text patch; the simulator looks for either in this file.
"""

GPTQ_MARLIN_MIN_THREAD_N = 64


class MarlinLinearKernel:
    @classmethod
    def can_implement(cls, c):
        out_features = c.partition_weight_shape[1]
        if out_features < GPTQ_MARLIN_MIN_THREAD_N:
            return False, f"GPTQ_MARLIN_MIN_THREAD_N ({GPTQ_MARLIN_MIN_THREAD_N}) > out_features ({out_features})"
        return True, None
