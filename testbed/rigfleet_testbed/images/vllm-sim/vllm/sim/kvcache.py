"""KV cache sizing: how many tokens fit, and vLLM's refusal when one sequence does not.

Calibrated on club-3090's measured dual-3090 pools (Qwen3.6-27B AutoRound INT4, TP=2,
262K max-model-len, 24 GiB cards):

=====================================  ==========  ================
stack                                  util        KV pool (tokens)
=====================================  ==========  ================
int8_per_token_head + MTP n=3          0.92        605,495
turboquant_3bit_nc + MTP n=3           0.85        ~1.22M
turboquant_3bit_nc, no MTP             0.92        1,727,935
fp8 + MTP                              0.92        ~622K
=====================================  ==========  ================

Per card: budget = util × total; minus weights (17.5 GB split over TP), minus the overhead
fit from club-3090's KV_MATH (``0.5 + 1.0×util + 0.3×(TP−1)`` GiB), minus the MTP draft
model; the rest is KV. The MTP draft layer also keeps its own KV, one attention layer on top
of the 16 full-attention layers, hence the 17/16 factor on bytes per token.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
# AutoRound INT4 checkpoint (BF16 mtp.fc kept): 17.5 GB on disk, held as-is on the GPUs.
MODEL_WEIGHTS_BYTES = 17.5e9
# MTP draft module (weights + its workspace), whole-model figure split over TP.
MTP_DRAFT_GIB_TOTAL = 2.88
# Full-attention layers hold KV (the 48 DeltaNet layers hold fixed recurrent state instead).
FULL_ATTENTION_LAYERS = 16

# KV bytes per token per card at TP=2 (so twice this over the whole model).
_BYTES_PER_TOKEN_TP2 = {
    "auto": 34998,
    "bfloat16": 34998,
    "float16": 34998,
    "fp8": 17499,
    "fp8_e4m3": 17499,
    "fp8_e5m2": 17499,
    "fp8_inc": 17499,
    "fp8_ds_mla": 17499,
    # int8 values plus a per-token-head scale: a little above fp8.
    "int8_per_token_head": 17976,
    "fp8_per_token_head": 17976,
    # TurboQuant: ~3.5/4.5/6.5/4 effective bits incl. norms and codebook indices.
    "turboquant_3bit_nc": 7588,
    "turboquant_4bit_nc": 9774,
    "turboquant_k8v4": 14148,
    "turboquant_k3v4_nc": 8681,
}


class KvCacheError(Exception):
    """The engine cannot hold the KV cache it was asked for (vLLM raises ValueError)."""


def bytes_per_token_per_card(kv_dtype: str, tp: int, mtp: bool) -> float:
    total = 2 * _BYTES_PER_TOKEN_TP2.get(kv_dtype, _BYTES_PER_TOKEN_TP2["auto"])
    per_card = total / max(tp, 1)
    if mtp:
        per_card *= (FULL_ATTENTION_LAYERS + 1) / FULL_ATTENTION_LAYERS
    return per_card


@dataclass(frozen=True)
class KvPlan:
    """The outcome of profiling: memory split per card and the KV pool size."""

    weights_gib_per_card: float
    overhead_gib_per_card: float
    draft_gib_per_card: float
    kv_gib_per_card: float
    bytes_per_token: float
    num_tokens: int
    max_model_len: int

    @property
    def max_concurrency(self) -> float:
        return self.num_tokens / self.max_model_len


def plan(card_gib: float, util: float, tp: int, kv_dtype: str, mtp: bool,
         max_model_len: int) -> KvPlan:
    """Size the KV cache on the smallest card; raise KvCacheError like vLLM when it can't."""
    weights = MODEL_WEIGHTS_BYTES / GIB / tp
    overhead = 0.5 + 1.0 * util + 0.3 * (tp - 1)
    draft = MTP_DRAFT_GIB_TOTAL / tp if mtp else 0.0
    kv_gib = util * card_gib - weights - overhead - draft
    if kv_gib <= 0:
        raise KvCacheError(
            "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.")
    bpt = bytes_per_token_per_card(kv_dtype, tp, mtp)
    tokens = int(kv_gib * GIB // bpt)
    needed = max_model_len * bpt
    if needed > kv_gib * GIB:
        raise KvCacheError(
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available "
            f"KV cache memory ({kv_gib:.2f} GiB). Based on the available memory, the estimated "
            f"maximum model length is {tokens}. Try increasing `gpu_memory_utilization` or "
            "decreasing `max_model_len` when initializing the engine.")
    return KvPlan(weights, overhead, draft, kv_gib, bpt, tokens, max_model_len)
