"""Every series the monitor scrapes, spelled once: the metric-name contract that
tests/unit/test_monitor_names.py and test_monitor_rules.py check the rules and dashboards
against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Scrape jobs of every GPU host: the node exporter (with the textfiles) and the engine.
JOBS = ("node", "vllm")


@dataclass(frozen=True)
class Metric:
    """One series family: its name, type, labels (besides ``instance``/``job``) and help."""

    name: str
    type: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()


_V = ("model_name", "engine")
_G = ("gpu", "uuid")
_PINS = ("stack", "image_digest", "model_revision", "genesis_commit")

METRICS: dict[str, Metric] = {m.name: m for m in (
    # The engine's own /metrics (vLLM v1 and the simulator), scrape job "vllm".
    Metric("vllm:num_requests_running", "gauge", "requests being decoded", _V),
    Metric("vllm:num_requests_waiting", "gauge", "requests queued", _V),
    Metric("vllm:kv_cache_usage_perc", "gauge", "KV cache usage, 0-1", _V),
    Metric("vllm:spec_decode_num_drafts_total", "counter", "speculative drafts", _V),
    Metric("vllm:spec_decode_num_draft_tokens_total", "counter",
           "tokens proposed by the draft (MTP) head", _V),
    Metric("vllm:spec_decode_num_accepted_tokens_total", "counter", "draft tokens accepted", _V),
    Metric("vllm:generation_tokens_total", "counter", "tokens generated", _V),
    # GPU figures from nvidia-smi (textfile rigfleet-gpu.prom, every 15 s).
    Metric("rigfleet_gpu_power_watts", "gauge", "board power draw", _G),
    Metric("rigfleet_gpu_power_limit_watts", "gauge", "enforced power limit", _G),
    Metric("rigfleet_gpu_temperature_celsius", "gauge", "GPU core temperature", _G),
    Metric("rigfleet_gpu_sm_clock_mhz", "gauge", "SM clock", _G),
    Metric("rigfleet_gpu_memory_used_bytes", "gauge", "framebuffer memory used", _G),
    Metric("rigfleet_gpu_memory_total_bytes", "gauge", "framebuffer memory", _G),
    Metric("rigfleet_gpu_utilization_ratio", "gauge", "GPU utilisation, 0-1", _G),
    Metric("rigfleet_gpu_throttle", "gauge",
           "clock throttle reason active (1) or not (0); reason: sw_power_cap, hw_slowdown, "
           "sw_thermal, hw_thermal, hw_power_brake", (*_G, "reason")),
    Metric("rigfleet_gpu_pcie_link_gen", "gauge",
           "PCIe link generation; state: current, max", (*_G, "state")),
    Metric("rigfleet_gpu_pcie_link_width", "gauge",
           "PCIe link width (lanes); state: current, max", (*_G, "state")),
    Metric("rigfleet_gpu_ecc_errors_total", "counter",
           "ECC errors (only where the card reports ECC)", _G),
    Metric("rigfleet_gpu_scrape_ok", "gauge", "1 when nvidia-smi answered, else 0"),
    # rigfleet's own facts (textfile rigfleet.prom, every 15 s and after each swap/gate).
    Metric("rigfleet_serving_info", "gauge", "what serves, always 1", _PINS),
    Metric("rigfleet_ready", "gauge", "the front says ready (1) or not (0)"),
    Metric("rigfleet_engine_up", "gauge",
           "the serving engine's container/process runs (1/0), busy or not"),
    Metric("rigfleet_swap_in_progress", "gauge", "a swap transaction runs (1/0)"),
    Metric("rigfleet_swap_expected_seconds", "gauge", "the running swap's expected duration"),
    Metric("rigfleet_maintenance_window_open", "gauge", "a maintenance window is open"),
    Metric("rigfleet_maintenance_window_opened_timestamp_seconds", "gauge",
           "when the open maintenance window opened"),
    Metric("rigfleet_gate_tokens_per_second", "gauge",
           "the last gate's decode tokens/s", ("stack",)),
    Metric("rigfleet_gate_baseline_tokens_per_second", "gauge",
           "the host's baseline decode tokens/s for the stack", ("stack",)),
    Metric("rigfleet_gate_margin_ratio", "gauge",
           "the stack's allowed shortfall against the baseline (e.g. 0.1)", ("stack",)),
    Metric("rigfleet_gate_passed", "gauge", "the last gate passed (1/0)", ("stack",)),
    Metric("rigfleet_gate_timestamp_seconds", "gauge", "when the last gate ran", ("stack",)),
    Metric("rigfleet_mtp_acceptance_floor", "gauge",
           "the stack's lowest acceptable MTP acceptance rate", ("stack",)),
    Metric("rigfleet_supervisor_recreations_total", "counter", "stacks the supervisor recreated"),
    Metric("rigfleet_supervisor_gave_up", "gauge", "the supervisor gave up (1/0)"),
    Metric("rigfleet_drain_seconds", "gauge", "the last drain's duration"),
    Metric("rigfleet_facts_timestamp_seconds", "gauge", "when rigfleet.prom was written"),
    # On the monitor host, from pins.yaml and the inventory (written by the converge).
    Metric("rigfleet_desired_info", "gauge",
           "what pins.yaml says a host should serve, always 1", ("host", *_PINS)),
)}

# Prometheus' own series the rules and dashboards use.
BUILTIN = ("up", "ALERTS", "ALERTS_FOR_STATE")
# node exporter's own series the dashboards use (job "node").
NODE = ("node_cpu_seconds_total", "node_memory_MemAvailable_bytes",
        "node_memory_MemTotal_bytes", "node_load1", "node_filesystem_avail_bytes",
        "node_textfile_scrape_error", "node_time_seconds")

# Recording rules (files/monitor/rules.yml), level:metric:operations.
RECORDED = ("instance:vllm_generation_tokens:rate1m", "instance:vllm_mtp_acceptance:ratio_rate10m",
            "instance:vllm_requests_running:sum", "instance:vllm_kv_cache_usage:max",
            "instance_stack:rigfleet_mtp_floor:serving",
            "instance_stack:rigfleet_gate_shortfall:ratio", "instance:rigfleet_swap_age:seconds")
# Alerts (files/monitor/rules.yml).
ALERTS = ("RigEngineDown", "RigNotReady", "RigThroughputBelowBaseline", "RigMtpAcceptanceLow",
          "RigGpuThrottling", "RigKvCacheNearFull", "RigMaintenanceWindowLong",
          "RigSupervisorGaveUp", "RigPinsDiffer", "RigTargetDown")
