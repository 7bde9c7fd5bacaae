"""The known causes of a slow host, ranked by ``impact`` (the estimated, not measured, share
of decode speed lost), each with evidence and a fix. Pure; docs/bench.md, "rigfleet doctor"::

    causes = diagnose(evidence, Expect(tp=1, kv_cache_dtype="fp8_e5m2", floors=(...)))
    causes[0].title, causes[0].impact, causes[0].fix
    # ('power cap 230 W binds on gpu0', 0.246, 'raise power_caps_w ...')
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise

from rigfleet.doctor.evidence import Card, Evidence
from rigfleet.hostside.layout import CACHE_ROOT

CAUSE, INFO, RULED_OUT = "cause", "info", "ruled-out"

# Share of one 3090's top decode speed at a power cap, linear between the points (seed 004,
# HARDWARE.md): 330 W = 0.95; 230 W = 0.95 x 33/43; 290 W = that / 0.84.
SINGLE_CARD_CURVE: tuple[tuple[float, float], ...] = (
    (230.0, 0.729), (290.0, 0.868), (330.0, 0.95), (388.0, 1.0))
DUAL_KNEE_W = 220.0
DUAL_FLAT_TOP_W = 330.0
RTX3090_LINK = (4, 16)  # PCIe generation and width of the card itself
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938}  # per lane, per direction
GEN3_TP2_COST = 0.30  # HARDWARE.md: "Gen 3 + older CPUs cost 30-40% on TP=2" (low end)
LINK_COST_CAP = 0.35
PIECEWISE_COST = 0.15
EAGER_COST = 0.35
HW_SLOWDOWN_COST = 0.5
THROTTLE_TEMP_C = 80.0
AIR_THROTTLE_W = 325.0  # HARDWARE.md: throttled air-cooled cards run ~310-340 W


@dataclass(frozen=True)
class Expect:
    """What the host should run, and the code runs' acceptance from the last gate."""

    tp: int = 2
    kv_cache_dtype: str | None = None
    floors: tuple[float, ...] = ()
    acceptance_reference: tuple[float, ...] = ()
    gate_acceptance: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Cause:
    """One finding: ``impact`` (share of decode speed lost), ``evidence``, ``fix`` and ``basis``."""

    id: str
    title: str
    kind: str = CAUSE
    impact: float = 0.0
    evidence: tuple[str, ...] = ()
    fix: str = ""
    basis: str = ""

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "impact": round(self.impact, 3), "evidence": list(self.evidence)}


def single_card_speed(cap_w: float) -> float:
    """Linear between the curve's points (extrapolated below the first, at least 0.3)."""
    pts = SINGLE_CARD_CURVE
    if cap_w >= pts[-1][0]:
        return pts[-1][1]
    (x0, y0), (x1, y1) = next((a, b) for a, b in pairwise(pts) if cap_w <= b[0])
    return max(0.3, y0 + (cap_w - x0) * (y1 - y0) / (x1 - x0))


def _w(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f} W"


def _used(ev: Evidence, tp: int) -> list[Card]:
    return list(ev.cards[:max(tp, 1)])


def power(ev: Evidence, exp: Expect) -> Cause | None:
    cards = [c for c in _used(ev, exp.tp) if c.power_limit_w is not None]
    if not cards:
        return None
    caps = "/".join(_w(c.power_limit_w) for c in cards)
    drawn = "/".join(_w(c.power_draw_max_w) for c in cards)
    evidence = [f"cap {caps}, drawing up to {drawn} under load"]
    if capped := [c for c in cards if "sw_power_cap" in c.reasons]:
        evidence.append("clock event reason sw_power_cap active under load on "
                        + ", ".join(f"gpu{c.index}" for c in capped))
    if exp.tp >= 2:
        low = min(c.power_limit_w or 0.0 for c in cards)
        if low >= DUAL_KNEE_W:
            return Cause("power-cap", f"power cap {caps} (two cards)", RULED_OUT, 0.0,
                         (*evidence, f"dual-card decode is flat from {DUAL_KNEE_W:.0f} to "
                                     f"{DUAL_FLAT_TOP_W:.0f} W per card (bandwidth-bound)"),
                         basis="club-3090 HARDWARE.md")
        return Cause("power-cap", f"power cap {low:.0f} W is below the dual-card knee",
                     CAUSE, 1.0 - low / DUAL_KNEE_W, tuple(evidence),
                     f"raise power_caps_w to at least {DUAL_KNEE_W:.0f} W per card (decode is "
                     f"flat from {DUAL_KNEE_W:.0f} to {DUAL_FLAT_TOP_W:.0f} W)",
                     "club-3090 HARDWARE.md (knee <= 220 W/card); below it: rough estimate")
    c = cards[0]
    cap = c.power_limit_w or 0.0
    top = min(c.power_max_w or SINGLE_CARD_CURVE[-1][0], SINGLE_CARD_CURVE[-1][0])
    impact = max(0.0, 1.0 - single_card_speed(cap) / single_card_speed(top))
    if not capped and (c.power_draw_max_w or 0.0) < 0.95 * cap:
        return Cause("power-cap", f"power cap {cap:.0f} W does not bind", RULED_OUT, 0.0,
                     tuple(evidence), basis="the card draws less than its cap under load")
    if impact < 0.02:
        return Cause("power-cap", f"power cap {cap:.0f} W binds, at most {impact:.0%} of "
                     "decode", INFO, impact, tuple(evidence),
                     basis="seed 004; club-3090 HARDWARE.md")
    return Cause("power-cap", f"power cap {cap:.0f} W binds on gpu{c.index} (one card is "
                 "power-bound)", CAUSE, impact, tuple(evidence),
                 f"raise power_caps_w toward {top:.0f} W (the card's max); club-3090's "
                 "single-card targets: 290 W air, 330 W water",
                 "seed 004 (43 -> 33 tok/s, 330 -> 230 W); club-3090 HARDWARE.md")


def _n(v: float | None) -> str:
    """A figure nvidia-smi may report as [N/A]."""
    return "?" if v is None else f"{v:.0f}"


def _bw(gen: float, width: float) -> float:
    return LANE_GBPS.get(int(gen), LANE_GBPS[1]) * width


def pcie(ev: Evidence, exp: Expect) -> Cause | None:
    cards = [c for c in _used(ev, exp.tp) if c.gen_load is not None]
    if not cards:
        return None
    ref = _bw(*RTX3090_LINK)
    evidence, worst = [], 1.0
    for c in cards:
        gen, width = c.gen_load or 1, c.width_load or c.width_max or 16
        card_gen = c.gen_gpumax or RTX3090_LINK[0]
        evidence.append(
            f"gpu{c.index}: gen{gen:.0f} x{width:.0f} under load (slot allows gen"
            f"{_n(c.gen_max)} x{_n(c.width_max)}; the card gen{card_gen:.0f} "
            f"x{RTX3090_LINK[1]}; gen{_n(c.gen_idle)} at idle)"
            + (f", utilization {c.utilization:.0f}%" if c.utilization is not None else ""))
        worst = min(worst, _bw(gen, width) / ref)
    if worst >= 0.999:
        return Cause("pcie-link", "PCIe links at gen4 x16 under load", RULED_OUT, 0.0,
                     tuple(evidence))
    fix = ("put the card in a slot wired x16 gen4 to the CPU (not a chipset or riser slot), "
           "and check the BIOS's PCIe link settings")
    if any((c.gen_max and (c.gen_load or 0) < c.gen_max)
           or (c.width_max and (c.width_load or 0) < c.width_max) for c in cards):
        fix = ("the link trains below what the slot allows: reseat the card or its riser, "
               "and check the BIOS's PCIe settings; " + fix)
    title = f"PCIe link at {worst:.0%} of gen4 x16 under load"
    if exp.tp < 2:
        return Cause("pcie-link", title + " (one card: only tokens cross it)", INFO, 0.01,
                     tuple(evidence), fix, "one card moves only tokens over PCIe")
    impact = min(LINK_COST_CAP, GEN3_TP2_COST * (1.0 - worst) / 0.5)
    utils = [c.utilization for c in cards if c.utilization is not None]
    if len(utils) > 1 and max(utils) - min(utils) >= 10:
        evidence.append("GPU utilization asymmetry under load: the slow link's symptom")
    return Cause("pcie-link", title + " (TP=2 all-reduce crosses it)", CAUSE, impact,
                 tuple(evidence), fix, "club-3090 HARDWARE.md: Gen 3 costs 30-40% on TP=2")


def graph_mode(ev: Evidence, exp: Expect) -> Cause | None:
    if (mode := ev.graph_mode) is None:
        return None
    if mode == "NONE":
        return Cause("cuda-graphs", "no CUDA graphs (--enforce-eager)", CAUSE, EAGER_COST,
                     ("--enforce-eager in the engine's arguments",),
                     "drop --enforce-eager (vllm.args in the stack file, or the host's extra "
                     "arguments)", "no published figure: rough estimate")
    if mode == "PIECEWISE":
        down = ev.engine.get("downgrade")
        line = down.get("line") if isinstance(down, dict) else None
        return Cause("cuda-graphs", "CUDA graphs downgraded to PIECEWISE", CAUSE, PIECEWISE_COST,
                     (line,) if line else ("only PIECEWISE graphs were captured",),
                     "FlashInfer (fp8 KV) cannot capture spec-decode steps in full graphs: a "
                     "KV dtype whose backend can (int8_per_token_head: TRITON_ATTN; "
                     "TurboQuant), or MTP off; on one card fp8 KV has no such choice",
                     "seed 004 bounds it at ~35%; rough estimate")
    return Cause("cuda-graphs", f"CUDA graphs {mode}", RULED_OUT, 0.0,
                 (f"the engine captured {', '.join(ev.engine.get('captures') or [mode])}",))


def clocks(ev: Evidence, exp: Expect) -> Cause | None:
    cards = _used(ev, exp.tp)
    hw = [c for c in cards if {"hw_slowdown", "hw_thermal_slowdown",
                               "hw_power_brake_slowdown"} & set(c.reasons)]
    if hw:
        return Cause("clocks", "hardware slowdown under load", CAUSE, HW_SLOWDOWN_COST, tuple(
            f"gpu{c.index}: {', '.join(c.reasons)}; {_n(c.temperature_max)} °C; SM "
            f"{_n(c.clocks_sm)}/{_n(c.clocks_max_sm)} MHz" for c in hw),
            "check cooling (temperature), the PSU and its cables (power brake)",
            "nvidia-smi: HW slowdown reduces the core clocks by a factor of 2 or more")
    hot = [c for c in cards if "sw_thermal_slowdown" in c.reasons
           or (c.temperature_max or 0) >= THROTTLE_TEMP_C]
    if hot:
        impact = 0.0 if exp.tp >= 2 else max(0.0, 1.0 - single_card_speed(AIR_THROTTLE_W)
                                             / single_card_speed(SINGLE_CARD_CURVE[-1][0]))
        if any("sw_thermal_slowdown" in c.reasons for c in hot):
            ratio = min(((c.clocks_sm or 0) / c.clocks_max_sm for c in hot if c.clocks_max_sm),
                        default=0.0)
            impact = max(impact, 1.0 - ratio / 0.9) if ratio else impact
        return Cause("thermal", "cards run hot under load", CAUSE if impact > 0.02 else INFO,
                     impact, tuple(f"gpu{c.index}: up to {_n(c.temperature_max)} °C"
                                   + (", sw_thermal_slowdown" if "sw_thermal_slowdown"
                                      in c.reasons else "") for c in hot),
                     "improve airflow or fan curves; air-cooled 3090s throttle from ~80 °C",
                     "club-3090 HARDWARE.md")
    if exp.tp >= 2:
        slow_mem = [c for c in cards if c.clocks_mem and c.clocks_max_mem
                    and c.clocks_mem < 0.9 * c.clocks_max_mem]
        if slow_mem:
            worst = min((c.clocks_mem or 0) / (c.clocks_max_mem or 1) for c in slow_mem)
            return Cause("clocks", "memory clock low under load (TP=2 decode is "
                         "bandwidth-bound)", CAUSE, 1.0 - worst, tuple(
                             f"gpu{c.index}: memory {c.clocks_mem:.0f}/{c.clocks_max_mem:.0f} "
                             "MHz" for c in slow_mem),
                         "remove memory clock offsets or locks (nvidia-smi -lmc / -rmc)",
                         "decode speed follows memory bandwidth on two cards")
    return None


def compile_cache(ev: Evidence, exp: Expect) -> Cause | None:
    entries = [e for e in ev.engine.get("compile") or [] if isinstance(e, dict)]
    cold = [e for e in entries if e.get("kind") == "cold"]
    hit = [e for e in entries if e.get("kind") == "hit"]
    dirs = [str(d) for d in ev.engine.get("cache_dirs") or []]
    mounted = bool(dirs) and all(any(d.startswith(dest.rstrip("/") + "/") for _, dest in
                                     ev.mounts) for d in dirs)
    if hit and not cold:
        return Cause("compile-cache", "torch.compile loaded from its cache at the last start",
                     RULED_OUT, 0.0, tuple(str(e.get("line")) for e in hit[:2]),
                     basis="the cache survived the restart")
    if not cold:
        return None
    seconds = sum(float(e.get("seconds") or 0) for e in cold)
    evidence = tuple(str(e.get("line")) for e in cold[:2]) + tuple(
        f"cache directory {d} ({'on a volume' if mounted else 'in the container layer'})"
        for d in dirs[:1])
    if mounted:
        return Cause("compile-cache", f"compiled cold at the last start ({seconds:.0f} s)",
                     INFO, 0.0, evidence, "nothing: a first start of this configuration, or "
                     "the cache was cleared; the next start loads it",
                     "boot time only, not warm decode")
    return Cause("compile-cache", f"the compile cache does not survive a restart ({seconds:.0f} "
                 "s cold at every start)", INFO, 0.0, evidence,
                 f"mount the compile cache (the stacks' cache_dirs: {CACHE_ROOT}/<stack>)",
                 "boot time only, not warm decode")


def kv_and_batching(ev: Evidence, exp: Expect) -> list[Cause]:
    out = []
    warnings = ev.engine.get("warnings") or {}
    backend = b.get("name") if isinstance(b := ev.engine.get("backend"), dict) else None
    kv_lines = tuple(warnings.get("kv_cache") or ())
    if exp.kv_cache_dtype == "int8_per_token_head":
        out.append(Cause("kv-dtype", "int8 per-token-head KV on TRITON_ATTN slows with "
                         "context depth", INFO, 0.0,
                         (f"backend: {backend or '?'}", *kv_lines[:2]),
                         "for long contexts an fp8 KV stack stays flat (#594: 114.4 -> 115.0)",
                         "club-3090 #594: 130.8 -> 50.7 tok/s at 35K"))
    elif kv_lines:
        out.append(Cause("kv-dtype", "the engine warns about the KV cache dtype", INFO, 0.0,
                         kv_lines[:3]))
    if batched := tuple(warnings.get("batched_tokens") or ()):
        out.append(Cause("batched-tokens", "the engine warns about max-num-batched-tokens",
                         INFO, 0.0, batched[:2],
                         "raise vllm.max_num_batched_tokens in a copy of the stack file (seed "
                         "004's reference setup used 2048 too)"))
    return out


def acceptance(ev: Evidence, exp: Expect) -> Cause | None:
    have = exp.gate_acceptance
    if have is None:
        if ev.load_acceptance:
            return Cause("mtp-acceptance", "MTP acceptance (narrative load only)", INFO, 0.0,
                         ("narrative: " + "/".join(f"{x:.0%}" for x in ev.load_acceptance),
                          "the floors are for code-shape runs: see the last gate"))
        return None
    text = "/".join(f"{x:.0%}" for x in have)
    floors = "/".join(f"{x:.0%}" for x in exp.floors)
    low = [i for i, (a, f) in enumerate(zip(have, exp.floors, strict=False)) if a < f]
    missing = list(range(len(have), len(exp.floors)))  # floors /metrics shows no position for
    if not low and not missing:
        return Cause("mtp-acceptance", f"MTP acceptance {text} clears the floors", RULED_OUT,
                     0.0, (f"code runs of the last gate: {text}; floors {floors or 'none'}",),
                     basis="the drafter is not the cause")
    ref = exp.acceptance_reference or exp.floors
    impact = max(0.0, 1.0 - (1 + sum(have)) / (1 + sum(ref[:len(have)])))
    evidence = [f"positions {', '.join(str(i + 1) for i in low)} below the floor"] if low else []
    if missing:
        evidence.append(f"positions {', '.join(str(i + 1) for i in missing)} not in /metrics "
                        f"(the engine drafts {len(have)} token(s), the stack has "
                        f"{len(exp.floors)} floors)")
    return Cause("mtp-acceptance", f"MTP acceptance {text} below the floors {floors}", CAUSE,
                 impact, tuple(evidence),
                 "check the image and Genesis (a spec-decode regression), the KV dtype, and the "
                 "MTP weights (mtp.fc kept BF16 in the checkpoint)",
                 "tok/s follows the mean acceptance length at the same step rate")


RULES = (power, pcie, graph_mode, clocks, compile_cache, acceptance)


def diagnose(ev: Evidence, exp: Expect) -> list[Cause]:
    """Every rule's finding, causes first by impact, then info, then ruled-out."""
    found: list[Cause] = [c for rule in RULES if (c := rule(ev, exp)) is not None]
    found += kv_and_batching(ev, exp)
    return sorted(found, key=lambda c: ((CAUSE, INFO, RULED_OUT).index(c.kind), -c.impact))


@dataclass(frozen=True)
class Verdict:
    """Is the host slow: ``margin`` below its baseline or the fleet's median (same pins)."""

    now: float | None
    baseline: float | None = None
    baseline_source: str = ""
    fleet_median: float | None = None
    fleet_hosts: int = 0
    margin: float = 0.15
    reasons: list[str] = field(default_factory=list)

    @property
    def slow(self) -> bool:
        return bool(self.reasons)

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        reasons = out.pop("reasons")  # after "slow"
        return {**out, "slow": self.slow, "reasons": reasons}


def verdict(now: float | None, baseline: float | None, baseline_source: str,
            peers: Sequence[float], margin: float) -> Verdict:
    """``peers``: the decode of every host of the same stack and pins (this one included)."""
    med = statistics.median(peers) if len(peers) > 1 else None
    out = Verdict(now, baseline, baseline_source, med, len(peers), margin)
    if now is None:
        return out
    if baseline and now < baseline * (1 - margin):
        out.reasons.append(f"{now:.1f} tok/s is {1 - now / baseline:.0%} below its baseline "
                           f"{baseline:.1f} ({baseline_source})")
    if out.fleet_median and now < out.fleet_median * (1 - margin):
        out.reasons.append(f"{now:.1f} tok/s is {1 - now / out.fleet_median:.0%} below the "
                           f"fleet median {out.fleet_median:.1f} ({len(peers)} hosts, same "
                           "stack and pins)")
    return out
