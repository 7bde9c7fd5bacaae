"""The stack catalog: what each serving stack runs, one validated YAML file per stack (built-in
in ``rigfleet/stacks/``, a user's in host data ``stacks_dir``; keys: docs/stacks.md)::

    spec = builtin_catalog().get("tq3-mtp-genesis")
    load_catalog(["inventory/stacks"]).names    # ('int8', 'my-stack', 'tq3-mtp-genesis')
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from rigfleet.catalog_keys import (
    BY_PATH,
    DEFAULT_CV_MAX,
    DEFAULT_FLOOR_RATIO,
    DEFAULT_MARGIN,
    GPU_MEMORY_RANGE_MIB,
    KV_CACHE_DTYPES,
    MAX_DRAIN_TIMEOUT_S,
    MAX_REFERENCE_TOK_S,
    SCHEMA,
    SPECULATIVE_METHODS,
    TABLE,
    allowed,
    keys_of,
)
from rigfleet.genesis_inspect import GENERATIONS, GenesisLayout, refuse_if
from rigfleet.hostside.layout import HOST
from rigfleet.hostside.plan import DEFAULT_DRAIN_TIMEOUT_S
from rigfleet.validate import Problems, ValidationError, YamlError, env_vars, load_yaml
from rigfleet.vllm_versions import TAG_KINDS, tag_kind, version_key

BUILTIN_DIR = Path(__file__).resolve().parent / "stacks"

VLLM_PORT_IN_CONTAINER = 8000

# Flags the stack file sets through its own keys (refused in ``vllm.args``).
MANAGED_FLAGS = (
    "--model", "--served-model-name", "--tensor-parallel-size", "--max-model-len",
    "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens",
    "--kv-cache-dtype", "--speculative-config", "--host", "--port",
)  # fmt: skip

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,40}")
HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_SERVED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")
_CAVEAT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/#-]*")
_PATTERNS = {"kind": _NAME, "id": _CAVEAT_ID}  # the fields of _entries with a pattern
_SWITCH = re.compile(r"[A-Z0-9][A-Z0-9_]*")
_PATCH_ID = re.compile(r"P[N]?[0-9]+[A-Za-z]?")
_PATCH_ID_ANY = re.compile(r"[A-Z][A-Z0-9]*_?[0-9]+[A-Za-z]?")
_PINNED_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*")
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class CatalogError(ValidationError):
    """A stack file that does not validate, or an unknown stack name."""


@dataclass(frozen=True)
class ImageRule:
    """Which vLLM images a stack may run (the stack file's ``image`` section)."""

    kinds: tuple[str, ...] = ("release",)
    min_version: str | None = None
    below_version: str | None = None

    def allows_version(self, version: str) -> bool:
        """``version`` is inside the range (a dev build of 0.24.0 is below 0.24.0)."""
        have = version_key(version)
        low, high = version_key(self.min_version or ""), version_key(self.below_version or "")
        return have is not None and (low is None or have >= low) and (high is None or have < high)

    def problems(self, tag: str, version: str | None) -> list[str]:
        """Problems of ``tag`` reporting ``version`` (None: unknown), to follow ``image <ref>``."""
        out = []
        if (kind := tag_kind(tag)) not in self.kinds:
            what = f"a {kind} tag" if kind else "neither a release (vX.Y.Z) nor a nightly tag"
            out.append(f"is {what}; the stack runs {' or '.join(self.kinds)} tags")
        if version is not None and not self.allows_version(version):
            needs = [" or ".join(f"{k} tags" for k in self.kinds),
                     f"vLLM >= {self.min_version}" if self.min_version else "",
                     f"vLLM < {self.below_version}" if self.below_version else ""]
            out.append(f"reports vLLM {version}; the stack needs {', '.join(filter(None, needs))}")
        return out


@dataclass(frozen=True)
class BootSignature:
    """A boot-log line (``pattern``: a regex) with what it means and what to change."""

    kind: str
    pattern: str
    title: str
    hint: str = ""


@dataclass(frozen=True)
class Caveat:
    """A known problem of what the stack runs, and how the stack file handles it."""

    id: str
    summary: str
    handled_by: str = ""


@dataclass(frozen=True)
class ThroughputSpec:
    """What the gate's throughput check expects of a stack (the ``throughput:`` section)."""

    narrative: float | None = None
    code: float | None = None
    margin: float = DEFAULT_MARGIN
    cv_max: float = DEFAULT_CV_MAX
    acceptance: tuple[float, ...] = ()
    floor_ratio: float = DEFAULT_FLOOR_RATIO

    @property
    def reference(self) -> dict[str, float]:
        """shape -> reference tok/s (shapes with a figure only)."""
        return {k: v for k, v in (("narrative", self.narrative), ("code", self.code)) if v}

    @property
    def floors(self) -> tuple[float, ...]:
        return tuple(round(a * self.floor_ratio, 4) for a in self.acceptance)

    def gate_set(self) -> tuple[str, ...]:
        """The gate profile overrides that carry this section (``key=value``)."""
        out = [f"throughput_reference_narrative={self.narrative or 0:g}",
               f"throughput_reference_code={self.code or 0:g}",
               f"throughput_margin={self.margin:g}", f"throughput_cv_max={self.cv_max:g}"]
        if self.floors:
            out.append("throughput_acceptance_floor=" + ",".join(f"{f:g}" for f in self.floors))
        return tuple(out)


@dataclass(frozen=True)
class PatchDecision:
    """A stack file's decision on one Genesis patch (``on``, ``off``, ``default``) and why."""

    decision: str
    reason: str


@dataclass(frozen=True)
class GenesisSpec:
    """What a stack needs of Genesis; ``switches``: generation -> (set to 1, set to 0)."""

    needs: tuple[str, ...]
    switches: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
    params: Mapping[str, str]
    runtime_packages: tuple[str, ...] = ()
    decisions: Mapping[str, PatchDecision] = field(default_factory=dict)
    model: Mapping[str, Any] = field(default_factory=dict)

    def env(self, generation: str) -> dict[str, str]:
        """The ``GENESIS_*`` environment for ``generation`` (switches on, off, then params)."""
        on, off = self.switches[generation]
        switches = {**dict.fromkeys(on, "1"), **dict.fromkeys(off, "0")}
        return {**{f"GENESIS_ENABLE_{s}": v for s, v in switches.items()}, **self.params}


@dataclass(frozen=True)
class StackSpec:
    """One serving stack, validated from its stack file (docs/stacks.md: each key)."""

    name: str
    summary: str
    port: int
    served_model_name: str
    gpu_count: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    tensor_parallel_size: int
    max_model_len: int
    speculative_method: str | None
    num_speculative_tokens: int
    args: tuple[str, ...]
    env: Mapping[str, str]
    source: str  # the stack file
    entrypoint_argv: tuple[str, ...] = ()
    genesis: GenesisSpec | None = None
    gpu_memory_mib: int | None = None
    image: ImageRule = ImageRule()
    boot_expect: tuple[BootSignature, ...] = ()
    boot_failures: tuple[BootSignature, ...] = ()
    gate_set: tuple[str, ...] = ()
    caveats: tuple[Caveat, ...] = ()
    throughput: ThroughputSpec | None = None
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    model: str | None = None

    @property
    def container_name(self) -> str:
        return f"rigfleet-{self.name}"

    compose_project = container_name  # the compose project is named as its one container

    def environment(self, generation: str | None = None) -> dict[str, str]:
        """``env`` then the Genesis variables of ``generation``, a fresh dict."""
        if self.genesis is None or generation is None:
            return dict(self.env)
        return {**self.env, **self.genesis.env(generation)}

    def entrypoint(self, layout: GenesisLayout | None = None) -> tuple[str, ...]:
        """The container entrypoint (a Genesis stack's applies the pinned ``layout``)."""
        if self.genesis is None:
            return self.entrypoint_argv
        assert layout is not None, f"stack {self.name}: needs Genesis, but no layout given"
        return ("/bin/bash", "-c", entrypoint_script(layout, self.genesis.runtime_packages), "--")

    def model_path(self, local_dir: str) -> str:
        return f"/root/.cache/huggingface/{local_dir}"

    def command(self, local_dir: str) -> list[str]:
        """The ``vllm serve`` argument list (``local_dir``: the model pin's), all strings."""
        # Compact JSON, exactly as club-3090 passes it.
        config = {"method": self.speculative_method,
                  "num_speculative_tokens": self.num_speculative_tokens}
        spec = (("--speculative-config", json.dumps(config, separators=(",", ":")))
                if self.speculative_method else ())
        return [
            "--model", self.model_path(local_dir),
            "--served-model-name", self.served_model_name,
            *self.args,
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            "--max-model-len", str(self.max_model_len),
            "--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}",
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--kv-cache-dtype", self.kv_cache_dtype,
            *spec,
            "--host", "0.0.0.0",
            "--port", str(VLLM_PORT_IN_CONTAINER),
        ]  # fmt: skip

    @property
    def cache_dirs(self) -> dict[str, str]:
        """Host cache directory -> container path, per stack (the deploy creates them)."""
        root = str(HOST.stack_cache_dir(self.name))
        return {f"{root}/torch_compile": "/root/.cache/vllm/torch_compile_cache",
                f"{root}/triton": "/root/.triton/cache"}


@dataclass(frozen=True)
class Catalog:
    """The stacks a fleet can serve, by name; ``sources``: the directories read, in order."""

    stacks: Mapping[str, StackSpec]
    sources: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.stacks))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.stacks

    def get(self, name: str) -> StackSpec:
        """An unknown name raises ``CatalogError`` listing the known ones."""
        if name not in self:
            raise CatalogError(f"unknown stack {name!r}; allowed: {', '.join(self.names)}")
        return self.stacks[name]

    def ports(self) -> dict[int, str]:
        """Loopback port -> stack name (each stack has its own)."""
        return {spec.port: name for name, spec in self.stacks.items()}

    def __deepcopy__(self, memo: dict[int, Any]) -> Catalog:
        return self  # read-only all through (its mappings are proxies): a copy is the same


def entrypoint_script(layout: GenesisLayout, runtime_packages: tuple[str, ...]) -> str:
    """The container's ``/bin/bash -c <script> -- <vllm args>`` (docs/genesis.md)."""
    check = layout.check_path_in_container
    lines = ["set -e", *refuse_if(
        f"[ ! -f {check} ]", f"Genesis patches missing: {check} not found; the host's Genesis "
        "checkout is empty or not at the pinned commit. Re-run the deploy.")]
    if runtime_packages:
        # Genesis' dependencies are imported by their names (``xxhash==3.5.0``: ``xxhash``).
        modules = ", ".join(r.split("==", 1)[0].strip().lower().replace("-", "_")
                            for r in runtime_packages)
        wanted = " ".join(runtime_packages)
        lines += refuse_if(f"! python3 -c 'import {modules}' 2>/dev/null",
                           f"the packages Genesis needs ({wanted}) are not in this image; the "
                           "deploy bakes them into the stack's image. Re-run the deploy.")
    lines += [*layout.prepare, layout.apply_command, 'exec vllm serve "$@"']
    return "\n".join(lines) + "\n"


def parse_stack(data: Any, where: str) -> StackSpec:
    """``where``: the file, its stem the stack's name; raises ``CatalogError`` listing all."""
    p = Problems(where, TABLE)
    if (top := p.mapping("", data)) is None:  # missing or not a mapping: recorded
        raise CatalogError(p.lines)
    if top.get("schema") != SCHEMA:
        p.bad("schema", top.get("schema"), repr(SCHEMA), "is not a supported schema")
    name = p.string("name", top.get("name"), _NAME)
    if name is not None and (stem := Path(where).stem) not in (name, ""):
        p.bad("name", name, repr(stem), "differs from the file's name")
    summary = p.string("summary", top.get("summary"))
    port = p.integer("port", top.get("port"), 1024, 65535)
    served = p.string("served_model_name", top.get("served_model_name"), _SERVED)
    model = p.string("model", top.get("model"), HF_REPO, required=False)
    gpus = p.mapping("gpus", top.get("gpus")) or {}
    gpu_count = p.integer("gpus.count", gpus.get("count"), 1, 16)
    gpu_memory = p.integer("gpus.memory_mib", gpus.get("memory_mib"), *GPU_MEMORY_RANGE_MIB,
                           required=False)
    v = p.mapping("vllm", top.get("vllm")) or {}
    kv = p.choice("vllm.kv_cache_dtype", v.get("kv_cache_dtype"), KV_CACHE_DTYPES)
    tp = p.integer("vllm.tensor_parallel_size", v.get("tensor_parallel_size"), 1, 16)
    if tp is not None and gpu_count is not None and tp > gpu_count:
        p.bad("vllm.tensor_parallel_size", tp, f"at most gpus.count ({gpu_count})",
              "is larger than the stack's GPU count")
    max_len = p.integer("vllm.max_model_len", v.get("max_model_len"), 1024, 10_000_000)
    util = p.number("vllm.gpu_memory_utilization", v.get("gpu_memory_utilization"), 0.0, 1.0,
                    low_open=True)
    seqs = p.integer("vllm.max_num_seqs", v.get("max_num_seqs"), 1, 1024)
    batched = p.integer("vllm.max_num_batched_tokens", v.get("max_num_batched_tokens"),
                        1, 1_000_000)
    method, n = _speculative(p, v.get("speculative"))
    args = p.strings("vllm.args", v.get("args")) or []
    for i, arg in enumerate(args):
        if _managed_flag(arg):
            p.bad(f"vllm.args[{i}]", arg, "flags other than " + ", ".join(MANAGED_FLAGS)
                  + " (nor an alias or abbreviation of one, such as -tp)",
                  "is set by the stack file's own key")
        elif arg.split("=", 1)[0] == "--config":
            p.bad(f"vllm.args[{i}]", arg, "each option in vllm.args itself", "reads a vLLM "
                  "config file, whose settings could override the stack file's own keys unseen")
    env = env_vars(p, "env", top.get("env"), allowed("env"))
    genesis = parse_genesis(p, top.get("genesis"))
    entry = top.get("entrypoint")
    entrypoint: list[str] = []
    if genesis is not None and entry is not None:
        p.bad("entrypoint", entry, "no entrypoint key for a Genesis stack (the deploy builds "
              "the one the pinned Genesis needs)", "is set")
    elif genesis is None:
        if (argv := p.strings("entrypoint", entry, required=True)) == []:  # None: already said
            p.bad("entrypoint", entry, "a non-empty argv such as [vllm, serve]", "is empty")
        entrypoint = argv or []
    image = _image_rule(p, top.get("image"))
    boot = p.mapping("boot", top.get("boot"), required=False) or {}
    expect = [BootSignature(kind="expect", **e)
              for e in _entries(p, "boot.expect", boot.get("expect"))]
    failures = [BootSignature(**e) for e in _entries(p, "boot.failures", boot.get("failures"))]
    gate_set = _gate_set(p, top.get("gate"))
    caveats = [Caveat(**e) for e in _entries(p, "caveats", top.get("caveats"))]
    throughput = _throughput(p, top.get("throughput"), n)
    drain = p.mapping("drain", top.get("drain"), required=False) or {}
    seconds = p.number("drain.timeout_s", drain.get("timeout_s"), 0.0, MAX_DRAIN_TIMEOUT_S,
                       required=False)
    p.raise_if_any(CatalogError)
    assert name and summary and port and served and gpu_count and kv and tp and max_len
    assert util is not None and seqs and batched
    return StackSpec(
        name=name, summary=summary, port=port, served_model_name=served, gpu_count=gpu_count,
        kv_cache_dtype=kv, gpu_memory_utilization=util, max_num_seqs=seqs,
        max_num_batched_tokens=batched, tensor_parallel_size=tp, max_model_len=max_len,
        speculative_method=method, num_speculative_tokens=n, args=tuple(args),
        env=MappingProxyType(env), entrypoint_argv=tuple(entrypoint), genesis=genesis,
        source=where, gpu_memory_mib=gpu_memory, image=image, boot_expect=tuple(expect),
        boot_failures=tuple(failures), gate_set=tuple(gate_set), caveats=tuple(caveats),
        throughput=throughput, model=model,
        drain_timeout_s=DEFAULT_DRAIN_TIMEOUT_S if seconds is None else seconds,
    )


def _image_rule(p: Problems, value: Any) -> ImageRule:
    d = p.mapping("image", value, required=False) or {}  # left out: the defaults
    kinds = d.get("kinds", list(ImageRule.kinds))
    if not isinstance(kinds, list) or not kinds or not all(k in TAG_KINDS for k in kinds):
        p.bad("image.kinds", kinds, allowed("image.kinds"))
        kinds = list(ImageRule.kinds)
    versions = {}
    for key in ("min_version", "below_version"):
        if isinstance(raw := d.get(key), float) and len(str(raw).partition(".")[2]) < 2:
            # YAML read `0.20` (or `0.2`) as the number 0.2: which release was meant is lost
            p.bad(f"image.{key}", raw, allowed(f"image.{key}") + ", quoted",
                  "is an unquoted number (YAML reads 0.20 as 0.2)")
            raw = None
        elif isinstance(raw, int | float) and not isinstance(raw, bool):
            raw = str(raw)  # `min_version: 0.22` unquoted
        versions[key] = p.string(f"image.{key}", raw, _VERSION, required=False)
    rule = ImageRule(tuple(kinds), versions["min_version"], versions["below_version"])
    if rule.min_version and rule.below_version and not rule.allows_version(rule.min_version):
        p.bad("image.below_version", rule.below_version,
              f"a release above min_version {rule.min_version}", "is not above min_version")
    return rule


def _entries(p: Problems, key: str, value: Any) -> list[dict[str, str]]:
    """A list of mappings of strings (``boot.expect``, ``caveats``); a ``pattern`` compiles."""
    if not isinstance(value, list):
        if value is not None:
            p.bad(key, value, allowed(key))
        return []
    out = []
    for i, entry in enumerate(value):
        d = p.mapping(f"{key}[{i}]", entry) or {}
        fields: dict[str, str | None] = {}
        # a failure's kind is checked last, as before the table drove this (messages' order)
        for name in sorted(keys_of(f"{key}[]"), key=lambda n: n == "kind"):
            item, required = f"{key}[{i}].{name}", BY_PATH[f"{key}[].{name}"].required
            got = p.string(item, d.get(name), _PATTERNS.get(name), required=required)
            if name == "pattern" and got is not None:
                try:
                    re.compile(got)
                except re.error as error:
                    p.bad(item, got, "a valid regular expression", f"does not compile ({error})")
                    got = None
            fields[name] = "" if got is None and not required else got
        if None not in fields.values():
            out.append(cast(dict[str, str], fields))
    return out


def _managed_flag(arg: str) -> bool:
    """Does vLLM's parser read ``arg`` as one of ``MANAGED_FLAGS``?"""
    # --max_model_len is --max-model-len; --speculative-config.method a key of
    # --speculative-config; -tp vLLM's alias of --tensor-parallel-size (engine/arg_utils.py);
    # argparse takes a flag's unique prefix (--max-model).
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = name.split(".", 1)[0].replace("_", "-")
    return name.startswith("-") and name.lstrip("-") != "" and any(
        flag.startswith(name) for flag in (*MANAGED_FLAGS, "-tp"))


def _gate_set(p: Problems, value: Any) -> list[str]:
    from rigfleet.hostside.verify.profiles import ProfileError, resolve

    raw = p.named("gate.set", (p.mapping("gate", value, required=False) or {}).get("set"))
    if not raw:
        return []
    sets = [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in raw.items()]
    try:
        resolve("full", sets)
    except ProfileError as e:
        p.add(f"gate.set: {e}")
        return []
    return sets


def _throughput(p: Problems, value: Any, spec_tokens: int) -> ThroughputSpec | None:
    if (d := p.mapping("throughput", value, required=False)) is None:
        return None
    ref = p.mapping("throughput.reference", d.get("reference"), required=False) or {}
    narrative, code = (p.number(f"throughput.reference.{shape}", ref.get(shape), 0.0,
                                MAX_REFERENCE_TOK_S, required=False, low_open=True)
                       for shape in ("narrative", "code"))
    margin = _fraction(p, "throughput.margin", d)
    cv_max = _fraction(p, "throughput.cv_max", d)
    acc = p.mapping("throughput.acceptance", d.get("acceptance"), required=False)
    per_pos: tuple[float, ...] = ()
    if acc is not None:
        raw = acc.get("reference")
        if spec_tokens == 0:
            p.bad("throughput.acceptance", acc, "no acceptance section for a stack without "
                  "vllm.speculative (nothing is drafted)", "is set")
        elif (not isinstance(raw, list) or len(raw) != spec_tokens or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and 0 < x <= 1
                for x in raw)):
            p.bad("throughput.acceptance.reference", raw, f"{spec_tokens} fractions (one per "
                  "draft position, vllm.speculative.num_speculative_tokens), e.g. "
                  "[0.95, 0.84, 0.75]")
        else:
            per_pos = tuple(float(x) for x in raw)
    ratio = _fraction(p, "throughput.acceptance.floor_ratio", acc or {})
    return ThroughputSpec(narrative, code, margin, cv_max, per_pos, ratio)


def _fraction(p: Problems, key: str, section: dict[Any, Any]) -> float:
    """A fraction in (0, 1] at ``key``; the table's default when left out."""
    got = p.number(key, section.get(key.rpartition(".")[2]), 0.0, 1.0, required=False,
                   low_open=True)
    return float(TABLE.default(key)) if got is None else got


def _speculative(p: Problems, value: Any) -> tuple[str | None, int]:
    if value is None:
        return None, 0
    d = p.mapping("vllm.speculative", value) or {}
    method = p.choice("vllm.speculative.method", d.get("method"), SPECULATIVE_METHODS)
    n = p.integer("vllm.speculative.num_speculative_tokens", d.get("num_speculative_tokens"), 1, 16)
    return method, n or 0


def parse_genesis(p: Problems, value: Any) -> GenesisSpec | None:
    """The ``genesis`` section (None when left out)."""
    if value is None:
        return None
    d = p.mapping("genesis", value) or {}
    needs = p.strings("genesis.needs", d.get("needs"), _PATCH_ID) or []
    switches: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    if not isinstance(raw := d.get("switches"), dict) or not raw:
        p.bad("genesis.switches", raw, f"{allowed('genesis.switches')} with generations "
              f"{', '.join(GENERATIONS)}")
    else:
        for gen, sets in raw.items():
            key = f"genesis.switches.{gen}"
            if gen not in GENERATIONS:
                p.bad(key, gen, ", ".join(GENERATIONS),
                      "is not a Genesis generation rigfleet knows")
                continue
            s = p.mapping(key, sets) or {}
            on = p.strings(f"{key}.on", s.get("on"), _SWITCH) or []
            off = p.strings(f"{key}.off", s.get("off"), _SWITCH) or []
            if both := sorted(set(on) & set(off)):
                p.bad(f"{key}.off", both, "each switch either on or off", "is also on")
            switches[str(gen)] = (tuple(on), tuple(off))
    params = env_vars(p, "genesis.params", d.get("params"), allowed("env"))
    for name in params:
        if not name.startswith("GENESIS_") or name.startswith("GENESIS_ENABLE_"):
            p.bad(f"genesis.params.{name}", name, allowed("genesis.params"))
    packages = p.strings("genesis.runtime_packages", d.get("runtime_packages"),
                         _PINNED_REQUIREMENT) or []
    return GenesisSpec(tuple(needs), MappingProxyType(switches), MappingProxyType(params),
                       tuple(packages), _decisions(p, d.get("decisions")),
                       _model(p, d.get("model")))


def _decisions(p: Problems, value: Any) -> Mapping[str, PatchDecision]:
    """``genesis.decisions`` (YAML's bare on/off, read as true/false, taken as on/off)."""
    out: dict[str, PatchDecision] = {}
    for pid, entry in p.named("genesis.decisions", value).items():
        key = f"genesis.decisions.{pid}"
        if not isinstance(pid, str) or not _PATCH_ID_ANY.fullmatch(pid):
            p.bad(key, pid, "a Genesis patch id such as PN346 or G4_26")
            continue
        e = p.mapping(key, entry) or {}
        raw = e.get("decision")
        raw = {True: "on", False: "off"}.get(raw, raw) if isinstance(raw, bool) else raw
        choice = p.choice(f"{key}.decision", raw, ("on", "off", "default"))
        reason = p.string(f"{key}.reason", e.get("reason"))
        if choice and reason:
            out[pid] = PatchDecision(choice, reason)
    return MappingProxyType(out)


def _model(p: Problems, value: Any) -> Mapping[str, Any]:
    """``genesis.model``: each key read as the table's type says."""
    d = p.mapping("genesis.model", value, required=False) or {}
    out: dict[str, Any] = {}
    for name in (n for n in keys_of("genesis.model") if n in d):
        key = f"genesis.model.{name}"
        kind = BY_PATH[key].type
        if kind == "list" and d[name] == []:  # not a way to say "unknown": leave the key out
            p.bad(key, d[name], allowed(key), "is empty (leave the key out when unknown)")
            continue
        got = (p.boolean(key, d[name]) if kind == "boolean"
               else p.strings(key, d[name], _MODEL_ID, allowed(key).removeprefix("a list of "),
                              required=True) if kind == "list"
               else p.string(key, d[name], _MODEL_ID))
        if got is not None and got != []:
            out[name] = tuple(got) if isinstance(got, list) else got
    return MappingProxyType(out)


def _is_dir(path: Path) -> bool:
    """A directory this user can look into (a name too long, a parent it may not search: no)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _stack_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.yaml") if p.is_file())


@lru_cache(maxsize=16)
def _load(dirs: tuple[str, ...], fingerprint: tuple[tuple[str, int, int], ...]) -> Catalog:
    stacks: dict[str, StackSpec] = {}
    problems: list[str] = []
    for directory in map(Path, dirs):
        if not _is_dir(directory):
            problems.append(f"{directory}: stacks_dir: not a directory; allowed: a directory of "
                            "stack files (<name>.yaml)")
            continue
        for path in _stack_files(directory):
            try:
                spec = parse_stack(load_yaml(path, "a stack file"), str(path))
            except (YamlError, CatalogError) as e:
                problems += e.problems if isinstance(e, CatalogError) else [str(e)]
                continue
            if spec.name in stacks:
                problems.append(f"{path}: name: {spec.name!r} is already defined in "
                                f"{stacks[spec.name].source}; allowed: a name of its own")
                continue
            stacks[spec.name] = spec
    ports: dict[int, str] = {}
    for name, spec in stacks.items():  # in load order: the later file (the user's) is named
        if spec.port in ports:
            problems.append(f"{spec.source}: port: {spec.port} is stack {ports[spec.port]}'s "
                            "too; allowed: a loopback port of its own")
        ports[spec.port] = name
    if problems:
        raise CatalogError(problems)
    return Catalog(MappingProxyType(stacks), dirs)


def load_catalog(extra_dirs: Iterable[str | Path] = ()) -> Catalog:
    """The built-in stacks plus those in ``extra_dirs`` (host data ``stacks_dir``)."""
    dirs = (str(BUILTIN_DIR), *(str(Path(os.path.expanduser(d)).absolute()) for d in extra_dirs))
    # Read again when a file changed (a long-running process, the tests).
    files = [path for d in map(Path, dirs) if _is_dir(d) for path in _stack_files(d)]
    return _load(dirs, tuple((str(f), (st := f.stat()).st_mtime_ns, st.st_size) for f in files))


def builtin_catalog() -> Catalog:
    return load_catalog()
