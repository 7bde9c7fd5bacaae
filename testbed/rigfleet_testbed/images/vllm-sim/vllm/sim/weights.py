"""What the served weights' own data say about the model's long-context recall.

Read once at boot from the model directory, never from a request. Qwen3.6 is a hybrid model:
three of every four layers are Gated DeltaNet (linear attention, a fixed-size recurrent state)
and every fourth is full attention (``layer_types`` in config.json). Exact retrieval of a fact
far back in a long context is the full-attention layers' job: a linear-attention state holds a
bounded number of associations, so recall over long contexts degrades without real attention
(Zoology, Arora et al. 2023, on associative recall in efficient models; the Qwen3-Next/Qwen3.5
design keeps one full-attention layer in four for that).

A full-attention layer is *dead* when its output projection is all zero: in AutoRound's
``auto_round:auto_gptq`` packing (symmetric int4, eight 4-bit values per int32, zero point 8)
that is a ``self_attn.o_proj.qweight`` whose every nibble is 8, as a re-quantisation that clips
the layer away leaves it. Such a checkpoint loads and answers short prompts fluently; past a
recall horizon of ``RECALL_HORIZON_TOKENS / dead_fraction`` prompt tokens a recalled fact comes
back wrong (a confident, plausible, different value), which is the needle-in-a-haystack failure
verify-stress is there to catch::

    health = inspect(Path("/models/qwen"))     # AttentionHealth(16, dead_layers=(3, 7, ...))
    set_served(health)
    reply = recall_reply(reply, prompt_tokens=12000, seed=7)
"""

from __future__ import annotations

import json
import random
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm.sim import textgen
from vllm.sim.responder import Reply

ZERO_POINT_NIBBLE = 8
DEAD_SHARE = 0.99  # nibbles at the zero point for a layer to count as dead
SAMPLE_BYTES = 1 << 16  # read at most this much of each o_proj tensor
# Prompt length up to which the linear-attention layers alone still recall a fact exactly
# (the simulator's modelling choice, below verify-stress's shallowest needle).
RECALL_HORIZON_TOKENS = 4096
O_PROJ = "model.language_model.layers.{}.self_attn.o_proj.qweight"


@dataclass(frozen=True)
class AttentionHealth:
    """Full-attention layers found in the weights, and those whose output is all zero."""

    full_attention_layers: int
    dead_layers: tuple[int, ...] = ()

    @property
    def dead_fraction(self) -> float:
        return len(self.dead_layers) / self.full_attention_layers \
            if self.full_attention_layers else 0.0

    @property
    def recall_horizon(self) -> int | None:
        """Prompt tokens beyond which recall fails; None when attention is intact."""
        if not self.dead_layers:
            return None
        return int(RECALL_HORIZON_TOKENS / self.dead_fraction)


def _full_attention_layers(cfg: dict[str, Any]) -> list[int]:
    sub = cfg.get("text_config")
    text: dict[str, Any] = sub if isinstance(sub, dict) else cfg
    types = text.get("layer_types")
    if isinstance(types, list):
        return [i for i, t in enumerate(types) if t == "full_attention"]
    every = text.get("full_attention_interval")
    layers = text.get("num_hidden_layers")
    if isinstance(every, int) and isinstance(layers, int) and every > 0:
        return [i for i in range(layers) if (i + 1) % every == 0]
    return []


def _tensor_sample(shard: Path, name: str) -> bytes | None:
    """The first SAMPLE_BYTES of one tensor's data, or None when the shard lacks it."""
    with shard.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        entry = header.get(name)
        if not isinstance(entry, dict):
            return None
        begin, end = entry["data_offsets"]
        fh.seek(8 + n + begin)
        return fh.read(min(end - begin, SAMPLE_BYTES))


def _zero_point_share(data: bytes) -> float:
    if not data:
        return 0.0
    hits = sum(((b >> 4) == ZERO_POINT_NIBBLE) + ((b & 0xF) == ZERO_POINT_NIBBLE) for b in data)
    return hits / (2 * len(data))


def inspect(path: Path) -> AttentionHealth:
    """Look at every full-attention layer's o_proj in the shards (unreadable ones count as
    intact: the checks in ``modelfiles`` already failed the boot for broken shards)."""
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        weight_map = json.loads((path / "model.safetensors.index.json").read_text(
            encoding="utf-8")).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        return AttentionHealth(0)
    layers = _full_attention_layers(cfg) if isinstance(cfg, dict) else []
    seen, dead = 0, []
    for i in layers:
        shard = weight_map.get(O_PROJ.format(i))
        if not shard:
            continue
        try:
            sample = _tensor_sample(path / shard, O_PROJ.format(i))
        except (OSError, ValueError, KeyError, struct.error):
            continue
        if sample is None:
            continue
        seen += 1
        if _zero_point_share(sample) >= DEAD_SHARE:
            dead.append(i)
    return AttentionHealth(seen, tuple(dead))


_served = AttentionHealth(0)


def set_served(health: AttentionHealth) -> None:
    """Record what the loaded weights are (boot calls this once)."""
    global _served
    _served = health


def served() -> AttentionHealth:
    return _served


def _misremember(value: str, seed: int) -> str:
    """A plausible wrong value: every number and word of the true one replaced."""
    rng = random.Random(seed ^ 0xA77E)
    vocab = [w for w in textgen.ADJECTIVES + textgen.NOUNS if w.isalpha()]
    low = value.lower()

    def number(m: re.Match[str]) -> str:
        digits = m.group(0)
        while True:
            new = "".join(rng.choice("0123456789") for _ in digits).lstrip("0") or "7"
            if new != digits and new not in low:
                return new

    def word(m: re.Match[str]) -> str:
        old = m.group(0).lower()
        while True:
            new = rng.choice(vocab)
            if old not in new and new not in low:
                return new.capitalize() if m.group(0)[:1].isupper() else new

    return re.sub(r"[A-Za-z]+", word, re.sub(r"\d+", number, value))


def recall_reply(reply: Reply, prompt_tokens: int, seed: int,
                 health: AttentionHealth | None = None) -> Reply:
    """The reply these weights give: a recall past the horizon comes back with a wrong value."""
    health = health or _served
    horizon = health.recall_horizon
    if horizon is None or reply.kind != "recall" or not reply.recall_value \
            or prompt_tokens <= horizon:
        return reply
    wrong = _misremember(reply.recall_value, seed)
    return Reply(content=reply.content.replace(reply.recall_value, wrong),
                 reasoning=reply.reasoning.replace(reply.recall_value, wrong),
                 tool_calls=reply.tool_calls, kind=reply.kind, recall_value=wrong)
