"""Prometheus text exposition parsing, just enough for vLLM's counters.

    samples = parse(text)
    total(samples, "vllm:spec_decode_num_drafts_total", model_name="qwen")   # float | None
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .client import Client

_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+"
                   r"(?P<value>\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')

# vLLM's spec-decode counters (vllm/v1/spec_decode/metrics.py, exposed with _total).
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# vLLM's per-request decode phase: first to last token on the engine's clock (vllm/v1/metrics).
DECODE_TIME_SUM = "vllm:request_decode_time_seconds_sum"
DECODE_TIME_COUNT = "vllm:request_decode_time_seconds_count"


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    out: list[Sample] = []
    for line in text.splitlines():
        if not (m := _LINE.match(line.strip())):  # blank, # HELP / # TYPE, malformed
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\")
                  for k, v in _LABEL.findall(m.group("labels") or "")}
        out.append(Sample(m.group("name"), labels, value))
    return out


def scrape(client: Client, timeout: float) -> list[Sample] | None:
    """``GET /metrics`` parsed, or None when the server has none."""
    r = client.request("GET", "/metrics", timeout=timeout)
    return parse(r.body.decode("utf-8", "replace")[:10_000_000]) if r.status == 200 else None


def _matching(samples: list[Sample], name: str, labels: dict[str, str]) -> list[Sample]:
    """Samples of ``name`` without a label that has another value (e.g. another model)."""
    return [s for s in samples if s.name == name
            and all(s.labels.get(k) == v for k, v in labels.items() if k in s.labels)]


def total(samples: list[Sample] | None, name: str, **labels: str) -> float | None:
    """Sum over every engine's matching ``name``; None without samples or that series."""
    found = _matching(samples or [], name, labels)
    return sum(s.value for s in found) if found else None


def delta(before: list[Sample] | None, after: list[Sample] | None, name: str,
          **labels: str) -> float:
    """``total`` in ``after`` minus in ``before``; a missing series counts as 0."""
    return (total(after, name, **labels) or 0.0) - (total(before, name, **labels) or 0.0)


def by_label(samples: list[Sample], name: str, label: str, **labels: str) -> dict[str, float]:
    """Samples of ``name`` summed per value of ``label`` (e.g. per draft ``position``)."""
    out: dict[str, float] = {}
    for s in _matching(samples, name, labels):
        if label in s.labels:
            out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out
