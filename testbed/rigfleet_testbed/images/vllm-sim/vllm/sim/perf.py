"""The throughput model: how fast this configuration decodes and prefills, in wall-clock time.

Pure functions of the configuration (no I/O). An engine *step* verifies one batch of MTP
draft tokens (or decodes one token without MTP); the hardware and the stack set the step
rate, and what a step yields is a draw of the drafter's acceptance, so a stream's tok/s is
``step rate x mean acceptance length``::

    cond = Conditions(era="may", backend="TRITON_ATTN", graph_mode="FULL_AND_PIECEWISE",
                      tp=2, spec_tokens=3, cards=(Card(250), Card(250)))
    expected_tok_s(cond, "narrative")    # ~87.8
    expected_tok_s(cond, "code")         # ~117.3

Reference figures (Qwen3.6-27B AutoRound INT4, MTP n=3, one stream, short context, tok/s):

==============================================  =========  ========  =======================
configuration                                   narrative  code      source
==============================================  =========  ========  =======================
dual, int8_per_token_head, May nightlies        85.0       121.1     seed 000 table; also
                                                                     88.05 / 120.17
                                                                     (club3090.md §10)
dual, turboquant_3bit_nc + Genesis P67, May     89.2 CV4%  119.1 CV1%  seed 000 table
dual, turboquant_3bit_nc without MTP, May       ~67                  club3090.md §10
dual, TQ3 + MTP without P67 (broken)            98.7 CV36% 104.5 CV27% seed 000 table
dual, int8_per_token_head, v0.22+ releases      130.8 warm,          upstream-2026.md §1.3
                                                50.7 @ 35K           (club-3090 #594)
dual, fp8 KV, v0.22+ releases                   114.4 flat           #594
single card, fp8_e5m2 (FlashInfer, PIECEWISE)   ~43        ~54       seed 004 at 330 W
                                                ~33        ~40       seed 004 at 230 W
==============================================  =========  ========  =======================

How each factor is set (cited, or marked as our assumption):

- Acceptance by content: code and tool-call arguments accept like seed 004's measured
  93/87/74% and seed 000's [0.95, 0.84, 0.75] (mean acceptance length 3.54); prose accepts
  [0.82, 0.52, 0.31] (length 2.65), so code decodes 1.34x faster than prose at the same step
  rate (seed 000: 119.1/89.2 = 1.34 for TQ3, 121.1/85.0 = 1.42 for int8; seed 004's runs:
  58.0/45.0 = 1.29). Seed 004's drafted throughput (~48 tok/s = 16 steps/s) x 3.55 is its
  code figure, which is why its measured per-position rates are taken for code.
- Step rates are fitted to each reference (the geometric middle of its narrative and code
  figures); where a figure was measured in PIECEWISE mode (FlashInfer + MTP), the FULL-graph
  rate is the figure divided by the PIECEWISE factor.
- Power: a single card is power-bound (seed 004: 43 -> 33 narrative from 330 to 230 W;
  club-3090 HARDWARE.md: 330 W loses 5% against ~388 W stock, 230 W ~16% against 290 W).
  TP=2 decode is memory-bandwidth-bound: flat from 220 to 330 W per card with the knee at
  <=220 W (HARDWARE.md); below the knee, (cap/220)^0.75 (our assumption: the single-card
  curve's elasticity near 230 W). TP=2 runs in lockstep: the lowest cap counts.
- PCIe: a TP=2 decode step spends 4% of its time moving all-reduce data at x16 gen4 (so that
  NVLink, where NCCL may use it, gains ~4%; DUAL_CARD.md: 2-5%); that term scales with
  1/bandwidth of the slowest card's link: x16 gen3 -4%, x8 gen3 -11%, x4 gen3 -22%. Prefill
  spends 30% there (NVLink gains 35-49% on prefill, DUAL_CARD.md): x16 gen3 costs 23% of
  prefill, in line with HARDWARE.md's "Gen 3 + older CPUs cost 30-40% on TP=2". One card
  moves only tokens over PCIe: 0.2% of decode.
- CUDA graphs: FULL (FULL_AND_PIECEWISE) 1.0, PIECEWISE 0.85, eager (NONE) 0.60 (our
  assumption: attention outside the graphs adds launch overhead on every layer; seed 004's
  PIECEWISE single card ran 43/54 against a reference setup's claimed 66/84, so the
  PIECEWISE cost is at most ~35%).
- Context depth: int8_per_token_head runs on TRITON_ATTN only, and on v0.22+ releases its
  decode slows linearly with the context: 130.8 warm -> 50.7 at 35K gives 1/(1 + ctx/22150).
  fp8 and TurboQuant stay flat (#594: 114.4 -> 115.0). No depth figures exist for the May
  nightlies: flat there.
- Concurrency: streams in one batch share each step; a step with n streams takes
  1 + 0.3(n-1) times as long (our assumption): 2 streams 0.77x each, 1.54x in all; 4 streams
  0.53x each, 2.1x in all.
- Without MTP a step decodes one token: tq3-nomtp's ~67 tok/s against TQ3+MTP's fitted
  33.65 steps/s is a 1.99x faster step (applied to every backend).
- One card (TP=1): seed 004 (single, PIECEWISE, 330 W) against seed 000's TurboQuant dual
  rate gives 0.58x, taking the May FlashInfer and TurboQuant dual rates as equal (no dual
  fp8 figure exists for the May nightlies).
- Noise: the acceptance draws alone give ~2% CV per 1000-token run; each request also gets a
  log-normal step-rate jitter of 1.2%: a healthy config shows CV ~1.5-3% (seed 000: 4% and
  1%, seed 004: ~1.6%). TQ3 + MTP without Genesis P67 is bimodal per request (club-3090:
  "bimodal (100% / corrupt)"): half the runs rubber-stamp every draft (length 4), half verify
  against a corrupted cache (prose length 1.75, code 2.15): seed 000's 98.7 (CV 36%) /
  104.5 (CV 27%).
- Builds: ``decode-throughput-regression`` decodes at 0.70x, ``decode-throughput-unstable``
  is bimodal from one request to the next (like the bimodal TQ3 + MTP above, but alternating:
  1.7x then 0.3x of its neighbours' speed, CV ~70-90% over any 5 runs; a twin on a shared
  CPU shows up to ~20-40% CV from the machine alone, so an instability must stand well above
  that to be told from it); nothing else changes.
- Prefill (time to first token): 2200 tok/s on two cards, 1200 on one, at 350 W on x16 gen4
  (our assumption; no reference figure); compute-bound, so the single-card power curve
  applies at any TP, with the PCIe prefill share above.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Build-info regressions (``_build_info.json`` "regressions") this model knows.
from vllm.sim.buildinfo import REGRESSION_DECODE_SLOWDOWN, REGRESSION_DECODE_UNSTABLE

# -- names -----------------------------------------------------------------------------------

ERA_MAY = "may"  # the May 2026 nightlies (0.20.x) club-3090 benched the stacks on
ERA_CURRENT = "current"  # releases from v0.22.0 (where club-3090 #594 measured)
CURRENT_FROM = (0, 22, 0)

FLASHINFER = "FLASHINFER"
TRITON_ATTN = "TRITON_ATTN"
FLASH_ATTN = "FLASH_ATTN"
TURBOQUANT = "TURBOQUANT"

MODE_FULL = "FULL_AND_PIECEWISE"
MODE_PIECEWISE = "PIECEWISE"
MODE_NONE = "NONE"

NARRATIVE = "narrative"
CODE = "code"

# -- acceptance ------------------------------------------------------------------------------

ACCEPTANCE: dict[str, tuple[float, ...]] = {
    CODE: (0.95, 0.84, 0.75),
    NARRATIVE: (0.82, 0.52, 0.31),
}
RUBBER_STAMP = (1.0, 1.0, 1.0)
CORRUPT_ACCEPTANCE: dict[str, tuple[float, ...]] = {
    CODE: (0.60, 0.35, 0.20),
    NARRATIVE: (0.45, 0.20, 0.10),
}
RUBBER_STAMP_SHARE = 0.5


def rates(acceptance: Sequence[float], k: int) -> list[float]:
    """Per-position unconditional acceptance for ``k`` draft tokens (longer drafts decay)."""
    out = list(acceptance[:k])
    while len(out) < k:
        out.append(out[-1] * 0.85 if out else 0.5)
    return out


def conditional(unconditional: Sequence[float]) -> list[float]:
    """P(accept position i | accepted 0..i-1), from unconditional per-position rates."""
    out = []
    prev = 1.0
    for r in unconditional:
        out.append(min(1.0, r / prev) if prev > 0 else 0.0)
        prev = r
    return out


def mean_length(acceptance: Sequence[float], k: int) -> float:
    """Mean acceptance length (tokens per step) of ``k`` drafts; 1.0 without drafts."""
    return 1.0 + sum(rates(acceptance, k)) if k else 1.0


def draw_accepted(cond_rates: Sequence[float], rng: random.Random) -> int:
    """How many of one step's drafts are accepted (a run stops at the first rejection)."""
    a = 0
    while a < len(cond_rates) and rng.random() < cond_rates[a]:
        a += 1
    return a


def request_acceptance(kind: str, k: int, broken_verify: bool,
                       rng: random.Random) -> tuple[float, ...]:
    """The unconditional per-position acceptance one request decodes with.

    + kind: ``code`` or ``narrative`` (anything else counts as narrative)
    + broken_verify: TurboQuant + MTP without the multi-query verify kernel (Genesis P67)
    """
    key = CODE if kind == CODE else NARRATIVE
    if broken_verify:
        chosen = RUBBER_STAMP if rng.random() < RUBBER_STAMP_SHARE else CORRUPT_ACCEPTANCE[key]
        return tuple(rates(chosen, k))
    return tuple(rates(ACCEPTANCE[key], k))


# -- hardware and engine factors -------------------------------------------------------------

# One card: fraction of full-power decode speed at a cap (W), linear between the points.
SINGLE_POWER_CURVE: tuple[tuple[float, float], ...] = (
    (100.0, 0.43), (230.0, 0.73), (290.0, 0.87), (330.0, 0.95), (388.0, 1.0),
)
DUAL_KNEE_W = 220.0
DUAL_BELOW_KNEE_EXPONENT = 0.75
# What a card draws while decoding, uncapped: one card is power-bound (the cap binds), each
# card of a TP=2 pair sits at the bandwidth knee.
SINGLE_DECODE_DEMAND_W = 370.0
DUAL_DECODE_DEMAND_W = DUAL_KNEE_W

LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938}
REF_GEN, REF_WIDTH = 4, 16
DECODE_COMM_SHARE = {1: 0.002, 2: 0.04}
PREFILL_COMM_SHARE = {1: 0.01, 2: 0.31}
# RTX 3090 NVLink bridge: 4 links, ~112.5 GB/s per direction, peer to peer; PCIe without P2P
# stages every all-reduce through host memory (two hops), so NVLink counts double.
NVLINK_GBPS = 225.0

GRAPH_FACTOR = {MODE_FULL: 1.0, "FULL": 1.0, "FULL_DECODE_ONLY": 1.0, MODE_PIECEWISE: 0.85,
                MODE_NONE: 0.60}
INT8_DEPTH_TOKENS = 35_000 / (130.8 / 50.7 - 1.0)  # ~22,150 (#594)
STREAM_STEP_COST = 0.3
PREFILL_REF_TOK_S = {1: 1200.0, 2: 2200.0}
PREFILL_REF_CAP_W = 350.0
HEALTHY_JITTER = 0.012
UNSTABLE_SWING = 0.70  # decode-throughput-unstable: requests alternate 1 + swing, 1 - swing
SLOW_BUILD_FACTOR = 0.70


def _interp(points: Sequence[tuple[float, float]], x: float) -> float:
    if x >= points[-1][0]:
        return points[-1][1]
    lo = 0
    while lo < len(points) - 2 and x > points[lo + 1][0]:
        lo += 1
    (x0, y0), (x1, y1) = points[lo], points[lo + 1]
    return max(0.2, y0 + (x - x0) * (y1 - y0) / (x1 - x0))


def single_power_factor(cap_w: float) -> float:
    """Speed of one power-bound card at ``cap_w``, 1.0 at ~388 W and above."""
    return _interp(SINGLE_POWER_CURVE, cap_w)


def power_factor(tp: int, caps_w: Sequence[float]) -> float:
    """Decode speed factor from the power caps of the cards in use."""
    cap = min(caps_w) if caps_w else SINGLE_POWER_CURVE[-1][0]
    if tp <= 1:
        return single_power_factor(cap)
    if cap >= DUAL_KNEE_W:
        return 1.0
    return max(0.05, (cap / DUAL_KNEE_W) ** DUAL_BELOW_KNEE_EXPONENT)


def decode_demand_w(tp: int) -> float:
    """The power one card would draw while decoding, were it not capped."""
    return SINGLE_DECODE_DEMAND_W if tp <= 1 else DUAL_DECODE_DEMAND_W


def link_gbps(gen: int, width: int) -> float:
    """Usable PCIe bandwidth of a link, GB/s per direction."""
    return LANE_GBPS.get(gen, LANE_GBPS[1]) * max(width, 1)


def _comm_factor(share: float, bandwidth: float) -> float:
    ref = link_gbps(REF_GEN, REF_WIDTH)
    return 1.0 / ((1.0 - share) + share * ref / max(bandwidth, 1e-6))


def link_factor(tp: int, links: Sequence[tuple[int, int]], nvlink_p2p: bool = False,
                prefill: bool = False) -> float:
    """Speed factor from the slowest card's PCIe link ``(gen, width)``.

    + nvlink_p2p: an NVLink bridge NCCL may use (P2P not disabled): all-reduce goes over it
    """
    shares = PREFILL_COMM_SHARE if prefill else DECODE_COMM_SHARE
    share = shares[1 if tp <= 1 else 2]
    if tp > 1 and nvlink_p2p:
        return _comm_factor(share, NVLINK_GBPS)
    bandwidth = min((link_gbps(g, w) for g, w in links), default=link_gbps(REF_GEN, REF_WIDTH))
    return _comm_factor(share, bandwidth)


def decode_utilization(tp: int, gen: int, width: int) -> int:
    """GPU utilization (%) of one card while decoding: a card on a slower link than x16
    gen4 idles its SMs while its all-reduce data crawls over the link, its peer spins in NCCL
    (club-3090 HARDWARE.md: the Gen 3 symptom is "GPU util asymmetry")."""
    if tp <= 1:
        return 97
    share = DECODE_COMM_SHARE[2]
    own = share * link_gbps(REF_GEN, REF_WIDTH) / max(link_gbps(gen, width), 1e-6)
    extra = (own - share) / ((1.0 - share) + own)
    return round(97 * (1.0 - max(extra, 0.0)))


def graph_factor(mode: str) -> float:
    return GRAPH_FACTOR.get(mode, 1.0)


def depth_factor(era: str, backend: str, context_tokens: int) -> float:
    """int8-PTH on TRITON_ATTN slows with depth on releases (#594); the rest stay flat."""
    if era == ERA_CURRENT and backend == TRITON_ATTN:
        return 1.0 / (1.0 + max(context_tokens, 0) / INT8_DEPTH_TOKENS)
    return 1.0


def stream_factor(streams: int) -> float:
    """Per-stream speed with ``streams`` sequences decoding in the same steps."""
    return 1.0 / (1.0 + STREAM_STEP_COST * max(streams - 1, 0))


# -- references and step rates ---------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """A measured figure and the CUDA-graph mode it was measured in."""

    narrative: float
    code: float | None = None
    measured_mode: str = MODE_FULL
    spec_tokens: int = 3

    def step_rate(self) -> float:
        """FULL-graph steps/s that reproduce the figure(s)."""
        k = self.spec_tokens
        al_n = mean_length(ACCEPTANCE[NARRATIVE], k)
        if self.code is None:
            fitted = self.narrative / al_n
        else:
            fitted = math.sqrt(self.narrative * self.code / (al_n * mean_length(
                ACCEPTANCE[CODE], k)))
        return fitted / graph_factor(self.measured_mode)


INT8_MAY = Reference(85.0, 121.1)  # seed 000 table, INT8 PTH baseline
TQ3_MAY = Reference(89.2, 119.1)  # seed 000 table, TQ3 + MTP with Genesis P67
INT8_CURRENT = Reference(130.8)  # club-3090 #594, warm (TRITON_ATTN)
FP8_CURRENT = Reference(114.4, measured_mode=MODE_PIECEWISE)  # #594 (FlashInfer + MTP)
SINGLE_330W = Reference(43.0, 54.0, measured_mode=MODE_PIECEWISE)  # seed 004 at 330 W
TQ3_NO_MTP_MAY_TOK_S = 67.0  # club3090.md §10, tq3-nomtp

# FULL-graph step rates of a TP=2 pair at reference conditions: caps in the flat 220-330 W
# range, x16 gen4, one stream, short context, MTP n=3.
DUAL_STEP_RATE: dict[tuple[str, str], float] = {
    (ERA_MAY, TRITON_ATTN): INT8_MAY.step_rate(),
    (ERA_MAY, TURBOQUANT): TQ3_MAY.step_rate(),
    # No dual fp8/bf16 figure for the May nightlies: taken equal to TurboQuant's.
    (ERA_MAY, FLASHINFER): TQ3_MAY.step_rate(),
    (ERA_MAY, FLASH_ATTN): TQ3_MAY.step_rate(),
    (ERA_CURRENT, TRITON_ATTN): INT8_CURRENT.step_rate(),
    (ERA_CURRENT, FLASHINFER): FP8_CURRENT.step_rate(),
    (ERA_CURRENT, FLASH_ATTN): FP8_CURRENT.step_rate(),
    # No TurboQuant figure on releases (Genesis P67 is capped below 0.24): the May rate.
    (ERA_CURRENT, TURBOQUANT): TQ3_MAY.step_rate(),
}
NO_SPEC_STEP_FACTOR = TQ3_NO_MTP_MAY_TOK_S / TQ3_MAY.step_rate()
SINGLE_CARD_STEP_FACTOR = (SINGLE_330W.step_rate() / single_power_factor(330.0)
                           / DUAL_STEP_RATE[(ERA_MAY, FLASHINFER)])


# -- the configuration -----------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """One card the engine runs on: its power limit now, its PCIe link when trained up."""

    power_limit_w: float = 350.0
    pcie_gen: int = REF_GEN
    pcie_width: int = REF_WIDTH


@dataclass(frozen=True)
class Conditions:
    """Everything the speed depends on, apart from content, context depth and load."""

    era: str
    backend: str
    graph_mode: str
    tp: int
    spec_tokens: int
    cards: tuple[Card, ...] = (Card(), Card())
    nvlink_p2p: bool = False
    decode_factor: float = 1.0
    jitter: float = HEALTHY_JITTER
    swing: float = 0.0  # > 0: successive requests alternate (1 + swing)x, (1 - swing)x

    @property
    def used(self) -> tuple[Card, ...]:
        return self.cards[: max(self.tp, 1)] or (Card(),)

    @property
    def caps_w(self) -> list[float]:
        return [c.power_limit_w for c in self.used]

    @property
    def links(self) -> list[tuple[int, int]]:
        return [(c.pcie_gen, c.pcie_width) for c in self.used]


def era_of(version: str) -> str:
    """``0.20.2rc1.dev9+g01d4d1ad3`` -> ``may``; ``0.27.1`` -> ``current``."""
    nums = []
    for part in version.split("+", 1)[0].split(".")[:3]:
        m = re.match(r"\d+", part)
        nums.append(int(m.group(0)) if m else 0)
    nums += [0] * (3 - len(nums))
    return ERA_CURRENT if tuple(nums) >= CURRENT_FROM else ERA_MAY


def step_rate(c: Conditions, context_tokens: int = 0, streams: int = 1) -> float:
    """Engine steps per second seen by one stream of this configuration."""
    base = DUAL_STEP_RATE.get((c.era, c.backend), DUAL_STEP_RATE[(ERA_MAY, TURBOQUANT)])
    if c.tp <= 1:
        base *= SINGLE_CARD_STEP_FACTOR
    if c.spec_tokens <= 0:
        base *= NO_SPEC_STEP_FACTOR
    return (base * power_factor(c.tp, c.caps_w) * link_factor(c.tp, c.links, c.nvlink_p2p)
            * graph_factor(c.graph_mode) * depth_factor(c.era, c.backend, context_tokens)
            * stream_factor(streams) * c.decode_factor)


def expected_tok_s(c: Conditions, kind: str, context_tokens: int = 0, streams: int = 1) -> float:
    """Mean decode tok/s of one stream of healthy ``kind`` output (``code`` or narrative)."""
    key = CODE if kind == CODE else NARRATIVE
    return step_rate(c, context_tokens, streams) * mean_length(ACCEPTANCE[key], c.spec_tokens)


def prefill_tok_s(c: Conditions) -> float:
    """Prompt tokens per second (compute-bound: the power curve applies at any TP)."""
    ref = PREFILL_REF_TOK_S[1 if c.tp <= 1 else 2]
    power = single_power_factor(min(c.caps_w)) / single_power_factor(PREFILL_REF_CAP_W)
    return ref * power * link_factor(c.tp, c.links, c.nvlink_p2p, prefill=True)


def build_adjustments(regressions: Iterable[str]) -> tuple[float, float]:
    """(decode speed factor, alternating swing) of a build with these regressions."""
    regs = set(regressions)
    factor = SLOW_BUILD_FACTOR if REGRESSION_DECODE_SLOWDOWN in regs else 1.0
    swing = UNSTABLE_SWING if REGRESSION_DECODE_UNSTABLE in regs else 0.0
    return factor, swing


class Stream:
    """One request's decode as the model sees it: its acceptance draws and its jitter.

    The engine sleeps ``step_seconds`` (divided by the testbed clock) per step and emits
    ``1 + draw()`` tokens::

        s = Stream(cond, "code", broken_verify=False, rng=random.Random(1))
        s.draw(), s.step_seconds(context_tokens=500, streams=1)
    """

    _requests = itertools.count()  # the server's request order (a swinging build alternates)

    def __init__(self, cond: Conditions, kind: str, broken_verify: bool, rng: random.Random,
                 acceptance: Sequence[float] | None = None):
        self.cond = cond
        self.rng = rng
        k = cond.spec_tokens
        self.acceptance = tuple(rates(acceptance, k)) if acceptance is not None else (
            request_acceptance(kind, k, broken_verify, rng))
        self._conditional = conditional(self.acceptance) if k else []
        self.jitter = request_jitter(cond.jitter, rng)
        if cond.swing > 0:
            self.jitter *= 1.0 + cond.swing * (1 if next(Stream._requests) % 2 == 0 else -1)

    def draw(self) -> int:
        """Drafts accepted in the next step (0 without MTP)."""
        return draw_accepted(self._conditional, self.rng)

    def step_seconds(self, context_tokens: int, streams: int) -> float:
        """Real-rig seconds of the next step."""
        return 1.0 / (step_rate(self.cond, context_tokens, streams) * self.jitter)


def request_jitter(sigma: float, rng: random.Random) -> float:
    """A per-request step-rate multiplier: log-normal with mean 1."""
    sigma = max(sigma, 0.0)
    return math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2.0) if sigma else 1.0


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (population); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return math.sqrt(var) / mean if mean else 0.0
