"""The ``vllm/vllm-openai`` builds the testbed knows, what each can do, and Docker Hub's retention.

Every build is one simulator image (``images/vllm-sim`` plus a per-build layer written by
:func:`layer_files`). What a build can do is decided here, from its version and build date, by
rules that each cite the fact they come from (``reference/upstream-2026.md``, ``genesis.md``);
the result is baked into the image as ``vllm/_build_info.json`` and read by the simulator,
never by a test::

    from rigfleet_testbed import vllm_builds as vb
    b = vb.by_tag("v0.27.1")
    vb.build_info(b)["regressions"]    # ["vllm-50021-gdn-spec-decode-wild-write", ...]
    kept, purged = vb.retention(vb.BUILDS)   # what Docker Hub serves today, and what it 404s

Retention (vLLM's ``.buildkite/scripts/cleanup-nightly-builds.sh``, vllm#24102): of the tags
starting with ``nightly-``, sorted by ``last_updated``, only the 14 newest are kept; every other
nightly tag is deleted. Release tags (``vX.Y.Z``) are never touched. The testbed's mirror serves
exactly the kept set; the purged May-2026 nightlies exist only as the archive an operator kept
(``docker save``, :attr:`Build.archived`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from rigfleet_testbed.layout import SIM_IMAGE_REPO

NIGHTLY_PREFIX = "nightly-"
KEEP_NIGHTLIES = 14  # cleanup-nightly-builds.sh: tags_to_keep=14
# "Today" for the twin: the newest nightly is built on this day.
TODAY = dt.date(2026, 12, 1)
VARIANTS = Path(__file__).resolve().parent / "images" / "vllm-build" / "variants"

# Regressions a build can carry (the values of "regressions" in _build_info.json).
# post-#41434 nightlies + transformers 5.8: speculator auto-detection treats a local model path
# as a Hub repo id and aborts the boot (club-3090 570fa712; genesis.md 2.3).
SPECULATORS_OSERROR = "speculators-local-path-oserror"
# Fictional (kept for the gate's own tests): MTP acceptance collapses, generations stop early.
SPEC_ACCEPTANCE_COLLAPSE = "spec-decode-acceptance-collapse"
# vllm#50021: GDN spec-decode wild write; with MTP and async scheduling (the default) the engine
# core dies with an illegal memory access. "OPEN and LIVE IN THIS PIN" (club-3090 fp8-mtp.yml
# on v0.27.1); mitigation --no-async-scheduling or SPEC=off (UPSTREAM.md #1052 row).
GDN_SPEC_WILD_WRITE = "vllm-50021-gdn-spec-decode-wild-write"
# vllm#43559: MTP x prefix caching corrupts GDN state, "LIVE on v0.27.1"; the alternative to the
# vendored fix (vllm#48375) is --no-enable-prefix-caching.
MTP_PREFIX_CACHE_GDN = "vllm-43559-mtp-prefix-cache-gdn-state"
# Fictional (the throughput nightlies test these; the simulator's perf model reads them): decode
# ~30% slower than the neighbouring nightlies, everything else identical.
DECODE_THROUGHPUT_REGRESSION = "decode-throughput-regression"
# Fictional: decode speed alternates 1.7x / 0.3x request by request (CV ~70-90%), mean unchanged.
DECODE_THROUGHPUT_UNSTABLE = "decode-throughput-unstable"

# Every string a build's --kv-cache-dtype accepts, oldest first.
KV_BASE = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
           "fp8_ds_mla")
# TurboQuant landed with vllm#38479; users run turboquant_*_nc on v0.20.0 (2026-04-29).
KV_TURBOQUANT = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                 "turboquant_3bit_nc")
# vllm#38378 (per-token-head INT8/FP8 KV): "NATIVE ... since v0.22.0" (club-3090 vllm-stable).
KV_PER_TOKEN_HEAD = ("int8_per_token_head", "fp8_per_token_head")


@dataclass(frozen=True)
class Build:
    """One image tag of ``vllm/vllm-openai``.

    + tag: ``v0.27.1`` or ``nightly-<40-hex>``
    + version: ``vllm.__version__`` inside the image
    + built: when the tag was pushed (Docker Hub's ``last_updated``), ``YYYY-MM-DD``
    + commit: the vLLM commit, where known
    + regressions: build-specific bugs (beyond the version-ranged ones of :func:`regressions`)
    + archived: an operator kept a ``docker save`` of it (the testbed writes that archive)
    + source: where the tag, version and date come from
    """

    tag: str
    version: str
    built: str
    commit: str = ""
    regressions: tuple[str, ...] = ()
    archived: bool = False
    source: str = ""

    @property
    def nightly(self) -> bool:
        return self.tag.startswith(NIGHTLY_PREFIX)

    @property
    def image(self) -> str:
        return f"{SIM_IMAGE_REPO}:{self.tag}"

    @property
    def v(self) -> Version:
        return Version(self.version)


def _nightly(sha: str, version: str, built: str, source: str,
             regressions: tuple[str, ...] = (), archived: bool = False) -> Build:
    return Build(f"{NIGHTLY_PREFIX}{sha}", version, built, sha, regressions, archived, source)


RELEASES: tuple[Build, ...] = (
    Build("v0.20.0", "0.20.0", "2026-04-28",
          source="server log 'version 0.20.0' in a vllm#38479 comment, 2026-04-29"),
    Build("v0.21.0", "0.21.0", "2026-05-15", source="Genesis guards.py comments"),
    Build("v0.22.0", "0.22.0", "2026-05-29", source="Genesis guards.py comments"),
    Build("v0.24.0", "0.24.0", "2026-07-01", source="aws/deep-learning-containers#6329"),
    Build("v0.27.1", "0.27.1", "2026-08-13",
          source="vllm-metal#603 (2026-08-13); club-3090 vllm-stable since 2026-08-16"),
    Build("v0.28.0", "0.28.0", "2026-08-26", "2cf0a6915ce544dc493a0990f2ea38d81601128a",
          source="coreweave/ml-containers#218"),
)

# Nightlies of May-July 2026 (versions from Genesis' guards.py; dates from club-3090, Genesis and
# issue threads, approximate where marked ~). All long purged; two were kept by an operator.
_OLD_NIGHTLIES: tuple[Build, ...] = (
    _nightly("01d4d1ad375dc5854779c593eee093bcebb0cada", "0.20.2rc1.dev9+g01d4d1ad3",
             "2026-05-04", "Genesis v7.72.2 pin; 404 by 2026-05-20, 16 days after its "
             "2026-05-04 build (club-3090#167)", archived=True),
    _nightly("e47c98ef7a38792996e452ef53914e21e41928e9", "0.20.2rc1.dev60+ge47c98ef7",
             "2026-05-07", "Genesis guards: '2026-05-07 pin-bump candidate'; 404 (club-3090)"),
    _nightly("1acd67a795ebccdf9b9db7697ae9082058301657", "0.20.2rc1.dev129+g1acd67a79",
             "2026-05-09", "club-3090 int8.yml pin from 755e5199 (2026-05-10); post-#41434",
             regressions=(SPECULATORS_OSERROR,), archived=True),
    # Fictional (the twin's own bump tests name them; Genesis fixture v7.73.0 lists them).
    _nightly("3f9c2a7e5b1d4c8a9e0f6b2d7c1a5e8f9b3d6c02", "0.20.2rc1.dev212+g3f9c2a7e5",
             "2026-05-11", "fictional"),
    _nightly("b7e4d1c9a2f5e8b3d6c0a9f2e5b8d1c4a7f0e3b6", "0.20.2rc1.dev240+gb7e4d1c9a",
             "2026-05-12", "fictional", regressions=(SPEC_ACCEPTANCE_COLLAPSE,)),
    _nightly("bf610c2f56764e1b30bc6065f4ceace3d6e59036", "0.20.2rc1.dev371+gbf610c2f5",
             "2026-05-20", "~date; club-3090 vllm-nightly-clean, 404 by 2026-06-06"),
    _nightly("626fa9bba5663a5cf6a870debf031ee344ddb822", "0.20.2rc1.dev733+g626fa9bba5",
             "2026-05-28", "the 2026-05-28 :nightly (Genesis)"),
    _nightly("da1daf40bf18e5eaae04f26a80a537c8168a8bc2", "0.22.1rc1.dev195+gda1daf40b",
             "2026-06-08", "~date; Genesis guards.py"),
    _nightly("4c626633159887b0f2c962058c17c78f1434556d", "0.23.1rc1.dev101+g4c6266331",
             "2026-06-16", "~date; graduated to KNOWN_GOOD 2026-06-17 (Genesis)"),
    _nightly("3f5a1e1733200760169ff31ebe60a271072b199e", "0.23.1rc1.dev424+g3f5a1e173",
             "2026-06-24", "~date; Genesis v12.0.0 pin, 404 by 2026-07-19 (genesis#89)"),
    _nightly("93d8f834dd8acf33eb0e2a75b2711b628cb6e226", "0.23.1rc1.dev672+g93d8f834d",
             "2026-06-30", "~date; graduated 2026-07-01 (Genesis)"),
    _nightly("09663abde0f50944a8d5ea30120666024b503faa", "0.23.1rc1.dev714+g09663abde",
             "2026-07-01", "~date; graduated 2026-07-02 (Genesis)"),
    _nightly("2dfaae752b4db0d43cfc0715c780e33be030d0f1", "0.23.1rc1.dev748+g2dfaae752",
             "2026-07-03", "~date; Genesis v12.1.0 pin, 404 by 2026-07-19 (genesis#89)"),
)


def recent_nightlies(until: dt.date = TODAY, days: int = 21) -> tuple[Build, ...]:
    """One nightly a day for the ``days`` days before ``until`` (fictional SHAs and dev counts).

    The newest release the reference knows is v0.32.0, so the nightlies are 0.32.1rc1.devN; they
    share every layer but their build-info one, which keeps publishing them cheap.
    """
    out = []
    for i in range(days):
        day = until - dt.timedelta(days=days - i)
        sha = hashlib.sha1(f"rigfleet-testbed vllm nightly {day.isoformat()}".encode()).hexdigest()
        out.append(_nightly(sha, f"0.32.1rc1.dev{120 + 37 * i}+g{sha[:9]}", day.isoformat(),
                            "fictional daily nightly (the twin's 'today' is 2026-12-01)"))
    return tuple(out)


# Fictional: two more nightlies of late November that only decode differently (what a
# throughput canary must catch; a correctness gate passes them). Their dev counts fall between
# the daily nightlies of their day and the next, as a second build of the day would.
THROUGHPUT_NIGHTLIES: tuple[Build, ...] = (
    _nightly("f090c883507d730ae76900d4ae60b673430b4bbf", "0.32.1rc1.dev761+gf090c8835",
             "2026-11-27", "fictional: only slower (decode ~30% below its neighbours)",
             regressions=(DECODE_THROUGHPUT_REGRESSION,)),
    _nightly("90af5e72337defb8797b5f3e486906bb1411b336", "0.32.1rc1.dev803+g90af5e723",
             "2026-11-28", "fictional: unstable decode speed (alternating, CV ~70-90%)",
             regressions=(DECODE_THROUGHPUT_UNSTABLE,)),
)
NIGHTLIES: tuple[Build, ...] = _OLD_NIGHTLIES + recent_nightlies() + THROUGHPUT_NIGHTLIES
BUILDS: tuple[Build, ...] = RELEASES + NIGHTLIES


def by_tag(tag: str) -> Build:
    """The build with ``tag`` (``v0.27.1``, ``nightly-<sha>``, or a bare 40-hex sha)."""
    for b in BUILDS:
        if tag in (b.tag, b.commit) and tag:
            return b
    raise KeyError(f"no vLLM build {tag!r}; known: releases {', '.join(r.tag for r in RELEASES)} "
                   f"and {len(NIGHTLIES)} nightlies")


def retention(
    builds: Iterable[Build], keep: int = KEEP_NIGHTLIES
) -> tuple[list[Build], list[Build]]:
    """(kept, purged): cleanup-nightly-builds.sh applied to ``builds``.

    Nightly tags sorted by last_updated, the ``keep`` newest kept, the rest deleted; every
    non-nightly tag is kept. Order of the result: as given.
    """
    builds = list(builds)
    nightlies = sorted((b for b in builds if b.nightly), key=lambda b: (b.built, b.tag))
    purged = {b.tag for b in nightlies[:-keep]} if keep else {b.tag for b in nightlies}
    return ([b for b in builds if b.tag not in purged], [b for b in builds if b.tag in purged])


# --- what a version can do --------------------------------------------------------------------

def kv_cache_dtypes(v: Version) -> tuple[str, ...]:
    """The ``--kv-cache-dtype`` choices of a build (argparse refuses anything else)."""
    out = KV_BASE + (KV_TURBOQUANT if v >= Version("0.20.0") else ())
    return out + (KV_PER_TOKEN_HEAD if v >= Version("0.22.0") else ())


def turboquant_hybrid(v: Version) -> bool:
    """TurboQuant KV on hybrid (GDN) models: Sander's vllm#39931, in 0.20.2rc1.dev60+ge47c98ef7
    (Genesis guards.py); older builds raise NotImplementedError unless Genesis P4 is applied."""
    return v >= Version("0.20.2rc1.dev60")


def marlin_sub_tile_n(v: Version) -> str:
    """How Marlin treats an AutoRound INT4 layer whose per-rank out_features is below
    GPTQ_MARLIN_MIN_THREAD_N (Qwen3.6 GDN at tensor-parallel-size 2):

    - ``needs-pad``: before v0.21.0 the boot dies unless the pad fix (vllm#40361 as an overlay,
      or Genesis P87) is in the image's marlin.py;
    - ``model-native``: "validated 2026-05-25: marlin-pad ... unnecessary" on stable v0.21.0
      (club-3090 fp8-mtp.yml @d77d4acf);
    - ``native``: general ``marlin_padded_nk`` tile pad (vllm#45295), upstream at
      0.22.1rc1.dev491 (Genesis P87 drift marker) and first released in v0.24.0 (club-3090).
    """
    if v >= Version("0.22.1rc1.dev491"):
        return "native"
    return "model-native" if v >= Version("0.21.0") else "needs-pad"


def cli_args_module(v: Version) -> str:
    """Where ``make_arg_parser`` (the ``vllm serve`` options) lives: "in vLLM 0.29,
    make_arg_parser moved from vllm.entrypoints.openai.cli_args to
    vllm.entrypoints.launchers.cli_args (same signature)" (runpod-workers/worker-vllm#338)."""
    package = "launchers" if v >= Version("0.29.0") else "openai"
    return f"vllm/entrypoints/{package}/cli_args.py"


def has_qwen3coder_tool_parser(b: Build) -> bool:
    """tool_parsers/qwen3coder_tool_parser.py was deleted by the streaming parser refactor
    (vllm#45413/#45171/#45588, merged 2026-06-15; Genesis registry P64)."""
    return b.built < "2026-06-15"


def regressions(b: Build) -> tuple[str, ...]:
    """The build's own regressions plus the version-ranged upstream bugs it carries.

    vllm#50021 and vllm#43559 are known live on v0.27.1 (club-3090 @4a29ab57); their fixes
    (vllm#50021 itself, open 2026-08-20; vllm#48375, vendored, not known merged) are in no
    build the reference knows, so every later build carries them too. Builds before v0.27.1 are
    not known to carry them and do not.
    """
    out = list(b.regressions)
    if b.v >= Version("0.27.1"):
        out += [GDN_SPEC_WILD_WRITE, MTP_PREFIX_CACHE_GDN]
    return tuple(out)


def build_info(b: Build) -> dict[str, object]:
    """The contents of ``vllm/_build_info.json`` (the simulator's only source of behaviour)."""
    return {
        "tag": b.tag,
        "version": b.version,
        "commit": b.commit,
        "built": b.built,
        "kv_cache_dtypes": list(kv_cache_dtypes(b.v)),
        "turboquant_hybrid": turboquant_hybrid(b.v),
        "marlin_sub_tile_n": marlin_sub_tile_n(b.v),
        "regressions": list(regressions(b)),
    }


# --- the per-build image layer ----------------------------------------------------------------

@dataclass(frozen=True)
class LayerFile:
    path: str  # relative to the image's dist-packages
    data: bytes


@dataclass(frozen=True)
class Layer:
    files: tuple[LayerFile, ...] = field(default_factory=tuple)

    def write(self, site: Path) -> None:
        """Write the layer's files under ``site`` (a dist-packages directory)."""
        for f in self.files:
            dest = site / f.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.data)


def _variant(name: str) -> bytes:
    return (VARIANTS / name).read_bytes()


def layer_files(b: Build, info_overrides: dict[str, object] | None = None) -> Layer:
    """What the build adds on top of the shared simulator image: its build info, pip metadata
    and the vLLM source files whose text differs between versions (Genesis text-patches them).

    ``info_overrides`` (tests only) replace build-info keys, e.g. a hypothetical regression.
    """
    info = {**build_info(b), **(info_overrides or {})}
    version = str(info["version"])
    files = [LayerFile("vllm/_build_info.json", (json.dumps(info, indent=1) + "\n").encode())]
    dist = f"vllm-{version}.dist-info"
    files += [
        LayerFile(f"{dist}/METADATA", (
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: A high-throughput "
            "and memory-efficient inference and serving engine for LLMs (rigfleet simulator)\n"
            "Home-page: https://github.com/vllm-project/vllm\nLicense: Apache 2.0\n").encode()),
        LayerFile(f"{dist}/INSTALLER", b"pip\n"),
        LayerFile(f"{dist}/RECORD", b""),
    ]
    if not info["turboquant_hybrid"]:
        files.append(LayerFile("vllm/v1/attention/backends/turboquant_attn.py",
                               _variant("turboquant_attn.pre-hybrid.py")))
    if info["marlin_sub_tile_n"] != "native":
        files.append(LayerFile("vllm/model_executor/kernels/linear/mixed_precision/marlin.py",
                               _variant("marlin.pre-pad.py")))
    # The serving CLI's options, where this version keeps them (the simulator's table).
    cli_args = cli_args_module(Version(version))
    files += [LayerFile(str(Path(cli_args).with_name("__init__.py")), b""),
              LayerFile(cli_args, b'"""vLLM serve options (simulator)."""\n\n'
                                  b"from vllm.sim.args import "
                                  b"make_arg_parser, validate_parsed_serve_args\n\n"
                                  b'__all__ = ["make_arg_parser", "validate_parsed_serve_args"]\n')]
    if has_qwen3coder_tool_parser(b):
        files.append(LayerFile("vllm/tool_parsers/qwen3coder_tool_parser.py",
                               _variant("qwen3coder_tool_parser.py")))
    return Layer(tuple(files))


def summary(builds: Sequence[Build]) -> list[dict[str, object]]:
    """One row per build (for fixtures.json and the docs)."""
    kept, _ = retention(builds)
    kept_tags = {b.tag for b in kept}
    return [{"tag": b.tag, "version": b.version, "built": b.built,
             "served": b.tag in kept_tags, "archived": b.archived} for b in builds]
