"""The hub fixture: ``Lorbus/Qwen3.6-27B-int4-AutoRound`` with two deterministic commits.

1. The known-good upload (``commit``), the revision the testbed's fleet is pinned at.
2. A later upload on ``main`` (``later_commit``), re-quantised: same files, shapes and sizes,
   downloads and boots, but every full-attention layer's ``self_attn.o_proj.qweight`` holds
   only the int4 zero point (an all-zero projection). The serving simulator reads that from the
   weights (``vllm/sim/weights.py``) and loses long-context recall, so verify-stress's needles
   fail on it.

Writes the layout that the services container's hub serves (documented in
``testbed/rigfleet_testbed/images/services/services/hubstore.py``)::

    <hub_root>/<org>/<name>/repo.json          commits, refs, per-file size/sha256/git oid/LFS
    <hub_root>/<org>/<name>/blobs/<sha256>     file contents, content-addressed
    <hub_root>/_hub.json                       users and tokens (only if write_hub_users is used)

Usage::

    from rigfleet_testbed.model_fixture import build_model_fixture
    fx = build_model_fixture(Path(".testbed/services/hub"), shard_mib=2)
    fx.repo      # "Lorbus/Qwen3.6-27B-int4-AutoRound"
    fx.commit    # 40-hex, the same on every build with the same shard_mib
    fx.later_commit   # the re-quantised commit after it (main points here)
    fx.files["model-00001-of-00004.safetensors"]  # (size, sha256) at fx.commit

The commit id is computed the way git computes it (blob -> tree -> commit objects, LFS files as
their pointer blobs) from the content, a fixed author and a fixed date, so it only changes when
the content does (e.g. another ``shard_mib``). Weights are valid safetensors files (8-byte
little-endian header length, JSON header, data) filled with deterministic pseudo-random bytes.
"""

from __future__ import annotations

import calendar
import fnmatch
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_FORMAT = "rigfleet-hub-repo/1"
MODEL_REPO = "Lorbus/Qwen3.6-27B-int4-AutoRound"
# A second model (the Qwen3.8-27B family the community moved to, upstream-2026-12.md): today's
# small file set under another name with other weights, one commit, for a fleet of two models.
NEXT_MODEL_REPO = "Lorbus/Qwen3.8-27B-int4-AutoRound"
MODEL_DATE = "2026-05-01T12:00:00Z"
MODEL_AUTHOR = ("Lorbus", "lorbus@users.noreply.huggingface.co")
MODEL_TITLE = "Upload folder using huggingface_hub"
NUM_SHARDS = 4
NUM_LAYERS = 64

# The patterns of a Hub repository's default .gitattributes that matter here: they decide which
# files are stored in LFS (sha256 ETag, X-Linked-* headers) and which are plain git blobs.
DEFAULT_LFS_PATTERNS: tuple[str, ...] = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gguf", "*.gz", "*.h5",
    "*.joblib", "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot",
    "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors",
    "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*",
)  # fmt: skip

_DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4}


@dataclass(frozen=True)
class HubRepo:
    """What :func:`write_hub_repo` wrote: repo id, the commit and every file's (size, sha256)."""

    repo: str
    commit: str
    files: dict[str, tuple[int, str]]
    path: Path
    lfs_files: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ModelFixture(HubRepo):
    """The model repository plus the model facts tests and the simulator want.

    ``commit``/``files`` are the known-good revision; ``later_commit``/``later_files`` the
    re-quantised one that ``main`` points at.
    """

    config: dict[str, Any] = field(default_factory=dict)
    weight_map: dict[str, str] = field(default_factory=dict)
    later_commit: str = ""
    later_files: dict[str, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class HubUser:
    """A hub account: its token and the private/gated repos (or ``"*"``) it may read."""

    name: str
    token: str
    access: tuple[str, ...] = ("*",)


# ---- generic hub repository writer ---------------------------------------------------------


def git_blob_oid(data: bytes) -> str:
    """The id git gives a blob with this content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file that git stores in place of an LFS file."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def _tree_oid(entries: list[tuple[str, str, str]]) -> str:
    def key(e: tuple[str, str, str]) -> bytes:
        return (e[1] + ("/" if e[0] == "40000" else "")).encode()

    body = b"".join(
        f"{mode} {name}".encode() + b"\0" + bytes.fromhex(oid)
        for mode, name, oid in sorted(entries, key=key)
    )
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def _root_tree_oid(oids: Mapping[str, str]) -> str:
    """Git tree id of the root folder for ``{path: blob oid}`` (nested folders included)."""
    files: dict[str, str] = {}
    subdirs: dict[str, dict[str, str]] = {}
    for path, oid in oids.items():
        head, sep, rest = path.partition("/")
        if sep:
            subdirs.setdefault(head, {})[rest] = oid
        else:
            files[head] = oid
    entries = [("100644", name, oid) for name, oid in files.items()]
    entries += [("40000", name, _root_tree_oid(sub)) for name, sub in subdirs.items()]
    return _tree_oid(entries)


def _commit_oid(
    tree: str, parents: Sequence[str], author: tuple[str, str], date: str, msg: str
) -> str:
    epoch = calendar.timegm(time.strptime(date, "%Y-%m-%dT%H:%M:%SZ"))
    ident = f"{author[0]} <{author[1]}> {epoch} +0000"
    lines = [
        f"tree {tree}",
        *(f"parent {p}" for p in parents),
        f"author {ident}",
        f"committer {ident}",
    ]
    body = ("\n".join(lines) + "\n\n" + msg.rstrip("\n") + "\n").encode()
    return hashlib.sha1(b"commit %d\0" % len(body) + body).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class CommitSpec:
    """One commit of a repository's history: the full file set and its git metadata."""

    files: Mapping[str, bytes]
    title: str = MODEL_TITLE
    date: str = MODEL_DATE
    message: str = ""


def write_hub_repo(
    hub_root: Path,
    repo_id: str,
    files: Mapping[str, bytes],
    *,
    title: str = MODEL_TITLE,
    date: str = MODEL_DATE,
    author: tuple[str, str] | None = None,
    lfs_patterns: Sequence[str] = DEFAULT_LFS_PATTERNS,
    private: bool = False,
    gated: str | bool = False,
    info: Mapping[str, Any] | None = None,
) -> HubRepo:
    """Write ``files`` as the single commit of ``repo_id`` (branch ``main``) under ``hub_root``.

    Replaces whatever the repository held; blobs no commit references are removed. Files whose
    name matches ``lfs_patterns`` are LFS files. ``gated`` is ``False``, ``"auto"`` or
    ``"manual"``; with it (or ``private``) only users given access (:func:`write_hub_users`) can
    download the files.
    """
    return write_hub_history(hub_root, repo_id, [CommitSpec(files, title, date)], author=author,
                             lfs_patterns=lfs_patterns, private=private, gated=gated,
                             info=info)[0]


def write_hub_history(
    hub_root: Path,
    repo_id: str,
    history: Sequence[CommitSpec],
    *,
    author: tuple[str, str] | None = None,
    lfs_patterns: Sequence[str] = DEFAULT_LFS_PATTERNS,
    private: bool = False,
    gated: str | bool = False,
    info: Mapping[str, Any] | None = None,
) -> list[HubRepo]:
    """Write a linear history (oldest first; ``main`` -> the newest) of ``repo_id``.

    Each commit's id is git's, from its tree, its parent (the one before) and metadata, so a
    commit keeps its id when later commits are added. Returns one :class:`HubRepo` per commit.
    """
    if not history:
        raise ValueError(f"{repo_id}: a repository needs at least one commit")
    org = repo_id.split("/")[0]
    author = author or (org, f"{org.lower()}@users.noreply.huggingface.co")
    repo_dir = hub_root / repo_id
    blobs = repo_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)

    commits: dict[str, Any] = {}
    out: list[HubRepo] = []
    wanted: set[str] = set()
    parents: list[str] = []
    for spec in history:
        entries = []
        oids: dict[str, str] = {}
        summary: dict[str, tuple[int, str]] = {}
        lfs_files = set()
        for path in sorted(spec.files):
            data = spec.files[path]
            sha256 = hashlib.sha256(data).hexdigest()
            is_lfs = any(fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], p) for p in lfs_patterns)
            lfs = None
            if is_lfs:
                pointer = lfs_pointer(sha256, len(data))
                oid = git_blob_oid(pointer)
                lfs = {"sha256": sha256, "size": len(data), "pointerSize": len(pointer)}
                lfs_files.add(path)
            else:
                oid = git_blob_oid(data)
            blob = blobs / sha256
            if not blob.is_file() or blob.stat().st_size != len(data):
                _atomic_write(blob, data)
            oids[path] = oid
            summary[path] = (len(data), sha256)
            entries.append({"path": path, "size": len(data), "sha256": sha256, "oid": oid,
                            "lfs": lfs})
        tree = _root_tree_oid(oids)
        message = spec.title + (f"\n\n{spec.message}" if spec.message else "")
        commit = _commit_oid(tree, parents, author, spec.date, message)
        commits[commit] = {
            "title": spec.title,
            "message": message,
            "date": spec.date,
            "authors": [author[0]],
            "parents": list(parents),
            "tree": tree,
            "files": entries,
        }
        parents = [commit]
        wanted |= {sha for _, sha in summary.values()}
        out.append(HubRepo(repo_id, commit, summary, repo_dir, frozenset(lfs_files)))

    document = {
        "format": REPO_FORMAT,
        "id": repo_id,
        "private": private,
        "gated": gated,
        "branches": {"main": out[-1].commit},
        "tags": {},
        "created_at": history[0].date,
        "info": dict(info or {}),
        "commits": commits,
    }
    _atomic_write(repo_dir / "repo.json", (json.dumps(document, indent=1) + "\n").encode())
    for blob in blobs.iterdir():
        if blob.name not in wanted:
            blob.unlink()
    return out


def write_hub_users(hub_root: Path, users: Sequence[HubUser]) -> Path:
    """Write the hub's accounts (``_hub.json``); the file holds tokens, so it is mode 0600.

    The services container runs as root and reads it regardless of the mode.
    """
    hub_root.mkdir(parents=True, exist_ok=True)
    path = hub_root / "_hub.json"
    doc = {"users": [{"name": u.name, "token": u.token, "access": list(u.access)} for u in users]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)
    return path


def remove_hub_repo(hub_root: Path, repo_id: str) -> None:
    """Delete a repository from the fixture (the hub answers RepoNotFound afterwards)."""
    shutil.rmtree(hub_root / repo_id, ignore_errors=True)


# ---- the model ------------------------------------------------------------------------------


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


def model_config() -> dict[str, Any]:
    """``config.json``: Qwen3.6-27B (hybrid Gated DeltaNet + full attention, MTP head),
    AutoRound int4."""
    layer_types = [
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(NUM_LAYERS)
    ]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.57.0.dev0",
        "text_config": {
            "model_type": "qwen3_5_text",
            "hidden_size": 5120,
            "intermediate_size": 17408,
            "num_hidden_layers": NUM_LAYERS,
            "num_attention_heads": 24,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_act": "silu",
            "layer_types": layer_types,
            "full_attention_interval": 4,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            "attn_output_gate": True,
            "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000000,
                "partial_rotary_factor": 0.25,
                "mrope_interleaved": True,
                "mrope_section": [11, 11, 10],
            },
            "vocab_size": 248320,
            "bos_token_id": None,
            "eos_token_id": 248044,
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False,
            "use_cache": True,
            "dtype": "bfloat16",
        },
        "vision_config": {
            "model_type": "qwen3_5",
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_heads": 16,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 5120,
            "in_channels": 3,
        },
        "quantization_config": {
            "quant_method": "auto-round",
            "packing_format": "auto_round:auto_gptq",
            "autoround_version": "0.9.1",
            "bits": 4,
            "group_size": 128,
            "sym": True,
            "data_type": "int",
            "iters": 200,
            "low_gpu_mem_usage": True,
            "block_name_to_quantize": "model.language_model.layers",
            # The MTP projection stays BF16 (unquantized): the speculative head needs it.
            "extra_config": {"mtp.fc": {"bits": 16, "data_type": "bfloat"}},
        },
    }


def generation_config() -> dict[str, Any]:
    return {
        "bos_token_id": 248044,
        "pad_token_id": 248044,
        "eos_token_id": [248046, 248044],
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "transformers_version": "4.57.0.dev0",
    }


SPECIAL_TOKENS = {
    "<|endoftext|>": 248044,
    "<|im_start|>": 248045,
    "<|im_end|>": 248046,
    "<|vision_start|>": 248053,
    "<|vision_end|>": 248054,
    "<|image_pad|>": 248056,
    "<|video_pad|>": 248057,
    "<tool_call>": 248058,
    "</tool_call>": 248059,
    "<think>": 248068,
    "</think>": 248069,
}


def _byte_level_alphabet() -> list[str]:
    """GPT-2's bytes -> printable characters mapping (the base vocabulary of byte-level BPE)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer_json() -> dict[str, Any]:
    """A small but valid ``tokenizers`` file: byte-level BPE over 256 bytes plus the special
    tokens."""
    special = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": tid,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": tok in special or tok.startswith("<|"),
            }
            for tok, tid in SPECIAL_TOKENS.items()
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": True,
        },
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {ch: i for i, ch in enumerate(_byte_level_alphabet())},
            "merges": [],
        },
    }


def tokenizer_config() -> dict[str, Any]:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(tid): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": tok.startswith("<|"),
            }
            for tok, tid in SPECIAL_TOKENS.items()
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "extra_special_tokens": {},
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'user' or message.role == 'system' %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content or '' %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' + content }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- set call = tool_call.function if tool_call.function is defined else tool_call %}
            {{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' + (call.arguments | tojson) + '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""

README = """\
---
license: apache-2.0
base_model:
- Qwen/Qwen3.6-27B
library_name: transformers
pipeline_tag: image-text-to-text
tags:
- auto-round
- int4
---

# Qwen3.6-27B int4 AutoRound

INT4 (W4A16, group size 128, symmetric) quantization of
[Qwen/Qwen3.6-27B](https://huggingface.co/Qwen/Qwen3.6-27B) made with
[AutoRound](https://github.com/intel/auto-round). The MTP projection (`mtp.fc`) is kept in BF16,
so multi-token-prediction speculative decoding works.

This is the rigfleet testbed's stand-in: same file layout as the real repository, small shards
filled with deterministic bytes. It is not a usable model.

## Serving with vLLM

```bash
vllm serve Lorbus/Qwen3.6-27B-int4-AutoRound --quantization auto_round --dtype float16 \\
  --tensor-parallel-size 2 --max-model-len 262144 \\
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}'
```
"""


def _gitattributes(patterns: Sequence[str]) -> bytes:
    return "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in patterns).encode()


def _shard_tensors(shard: int, budget: int) -> list[tuple[str, str, list[int]]]:
    """``(name, dtype, shape)`` of one shard's tensors, about ``budget`` bytes in all."""
    per = NUM_LAYERS // NUM_SHARDS
    layers = range(shard * per, (shard + 1) * per)
    # (name, dtype, share of the budget); shapes are derived so sizes add up to the budget.
    plan: list[tuple[str, str, float]] = []
    if shard == 0:
        plan.append(("model.language_model.embed_tokens.weight", "BF16", 4.0))
    for i in layers:
        prefix = f"model.language_model.layers.{i}"
        attn = "self_attn.o_proj" if (i + 1) % 4 == 0 else "linear_attn.out_proj"
        plan += [
            (f"{prefix}.{attn}.qweight", "I32", 1.0),
            (f"{prefix}.mlp.down_proj.qweight", "I32", 2.0),
            (f"{prefix}.mlp.down_proj.scales", "F16", 0.125),
            (f"{prefix}.input_layernorm.weight", "BF16", 0.0),
        ]
    if shard == NUM_SHARDS - 1:
        plan += [
            ("model.language_model.norm.weight", "BF16", 0.0),
            ("mtp.fc.weight", "BF16", 1.0),
            ("mtp.layers.0.mlp.down_proj.weight", "BF16", 1.0),
            ("lm_head.weight", "BF16", 4.0),
        ]
    total = sum(w for _, _, w in plan)
    cols = 64
    out = []
    for name, dtype, weight in plan:
        item = _DTYPE_SIZE[dtype]
        if weight == 0.0:
            out.append((name, dtype, [cols]))  # norms: one small vector
            continue
        rows = max(1, math.floor(budget * weight / total / (cols * item)))
        out.append((name, dtype, [rows, cols]))
    return out


# AutoRound's auto_round:auto_gptq packing: symmetric int4, eight values per int32, zero point 8.
# A qweight of nothing but zero-point nibbles dequantizes to an all-zero matrix.
ZERO_POINT_BYTE = b"\x88"


def safetensors_bytes(tensors: Sequence[tuple[str, str, list[int]]], seed: str,
                      zeroed: frozenset[str] = frozenset()) -> bytes:
    """A valid safetensors file with deterministic pseudo-random tensor data.

    Tensors named in ``zeroed`` (packed int4 weights) hold only the zero point instead.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    chunks = []
    offset = 0
    for name, dtype, shape in tensors:
        nbytes = math.prod(shape) * _DTYPE_SIZE[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        chunks.append(ZERO_POINT_BYTE * nbytes if name in zeroed
                      else hashlib.shake_256(f"{seed}:{name}".encode()).digest(nbytes))
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # writers pad the header so the data starts 8-byte aligned
    return len(raw).to_bytes(8, "little") + raw + b"".join(chunks)


def full_attention_o_proj() -> frozenset[str]:
    """The packed output projections of the full-attention layers (every fourth layer)."""
    return frozenset(f"model.language_model.layers.{i}.self_attn.o_proj.qweight"
                     for i in range(NUM_LAYERS) if (i + 1) % 4 == 0)


def model_files(shard_mib: float = 2, zeroed: frozenset[str] = frozenset(),
                repo: str = MODEL_REPO,
                ) -> tuple[dict[str, bytes], dict[str, Any], dict[str, str]]:
    """All files of the model repository: ``({path: bytes}, safetensors info, weight_map)``.

    ``zeroed``: packed weights that hold only the zero point (see :data:`REQUANT`); ``repo``
    seeds the weights' bytes.
    """
    if shard_mib <= 0:
        raise ValueError(f"shard_mib must be > 0, got {shard_mib}")
    budget = int(shard_mib * 1024 * 1024)
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    params: dict[str, int] = {}
    total_size = 0
    for shard in range(NUM_SHARDS):
        name = f"model-{shard + 1:05d}-of-{NUM_SHARDS:05d}.safetensors"
        tensors = _shard_tensors(shard, budget)
        files[name] = safetensors_bytes(tensors, seed=f"{repo}:{name}", zeroed=zeroed)
        for tname, dtype, shape in tensors:
            weight_map[tname] = name
            count = math.prod(shape)
            params[dtype] = params.get(dtype, 0) + count
            total_size += count * _DTYPE_SIZE[dtype]
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    files["model.safetensors.index.json"] = _json_bytes(index)
    files["config.json"] = _json_bytes(model_config())
    files["generation_config.json"] = _json_bytes(generation_config())
    files["tokenizer.json"] = _json_bytes(tokenizer_json())
    files["tokenizer_config.json"] = _json_bytes(tokenizer_config())
    files["chat_template.jinja"] = CHAT_TEMPLATE.encode()
    files["README.md"] = README.encode()
    files[".gitattributes"] = _gitattributes(DEFAULT_LFS_PATTERNS)
    safetensors_info = {"parameters": dict(sorted(params.items())), "total": sum(params.values())}
    return files, safetensors_info, weight_map


REQUANT_DATE = "2026-05-20T08:15:00Z"
REQUANT_NOTE = """
## Changelog

- 2026-05-20: re-quantised in AutoRound's RTN mode (`--iters 0`), a much faster run; same
  format, group size and file layout.
"""


def requantised_files(shard_mib: float = 2) -> dict[str, bytes]:
    """The later commit's files: the re-quantisation zeroed the full-attention o_proj."""
    files, _, _ = model_files(shard_mib, zeroed=full_attention_o_proj())
    cfg = model_config()
    cfg["quantization_config"] = {**cfg["quantization_config"], "iters": 0}
    files["config.json"] = _json_bytes(cfg)
    files["README.md"] = (README + REQUANT_NOTE).encode()
    return files


def build_model_fixture(hub_root: Path, shard_mib: float = 2) -> ModelFixture:
    """Write ``Lorbus/Qwen3.6-27B-int4-AutoRound`` (two commits, ``main`` -> the later) under
    ``hub_root``.

    Idempotent and deterministic: the same ``shard_mib`` always gives the same commits and
    bytes; the first commit's id does not depend on the second.
    """
    files, st_info, weight_map = model_files(shard_mib)
    cfg = model_config()
    info = {
        "library_name": "transformers",
        "pipeline_tag": "image-text-to-text",
        "tags": [
            "transformers", "safetensors", "qwen3_5", "image-text-to-text", "conversational",
            "auto-round", "4-bit", "base_model:Qwen/Qwen3.6-27B",
            "base_model:quantized:Qwen/Qwen3.6-27B", "license:apache-2.0", "region:us",
        ],
        "cardData": {
            "license": "apache-2.0",
            "base_model": ["Qwen/Qwen3.6-27B"],
            "library_name": "transformers",
            "pipeline_tag": "image-text-to-text",
            "tags": ["auto-round", "int4"],
        },
        "config": {
            "architectures": cfg["architectures"],
            "model_type": cfg["model_type"],
            "quantization_config": {"bits": 4, "quant_method": "auto-round"},
            "tokenizer_config": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        },
        "transformersInfo": {
            "auto_model": "AutoModelForImageTextToText",
            "pipeline_tag": "image-text-to-text",
            "processor": "AutoProcessor",
        },
        "safetensors": st_info,
    }  # fmt: skip
    history = [CommitSpec(files), CommitSpec(requantised_files(shard_mib), date=REQUANT_DATE)]
    repo, later = write_hub_history(hub_root, MODEL_REPO, history, author=MODEL_AUTHOR,
                                    info=info)
    return ModelFixture(
        repo=repo.repo,
        commit=repo.commit,
        files=repo.files,
        path=repo.path,
        lfs_files=repo.lfs_files,
        config=cfg,
        weight_map=weight_map,
        later_commit=later.commit,
        later_files=later.files,
    )


def build_next_model_fixture(hub_root: Path, shard_mib: float = 2) -> HubRepo:
    """Write ``NEXT_MODEL_REPO`` (one commit, ``main`` at it) under ``hub_root``: shaped like
    today's model, so the simulator boots it; its own weights, so its own files and commit."""
    files, _, _ = model_files(shard_mib, repo=NEXT_MODEL_REPO)
    return write_hub_repo(hub_root, NEXT_MODEL_REPO, files, author=MODEL_AUTHOR)


if __name__ == "__main__":  # python -m rigfleet_testbed.model_fixture <hub_root> [shard_mib]
    import sys

    fx = build_model_fixture(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 2)
    print(json.dumps({"repo": fx.repo, "commit": fx.commit, "later_commit": fx.later_commit,
                      "files": fx.files}, indent=1))
