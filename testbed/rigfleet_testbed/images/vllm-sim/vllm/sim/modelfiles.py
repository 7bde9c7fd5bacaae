"""Model directory checks, done the way transformers/vLLM fail on a bad model directory.

- A model argument that is neither an existing directory nor a valid Hub repo id (an absolute
  path that is not there) fails in ``huggingface_hub.validate_repo_id`` with the
  "Repo id must be in the form ..." OSError; a valid repo id that is not cached fails offline.
- ``model.safetensors.index.json`` names the shards: a missing one is a FileNotFoundError; a
  shard whose header is not safetensors (an LFS pointer, a truncated download) fails in
  safetensors' header parser.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Used when config.json does not say (Qwen3.6-27B's native context).
DEFAULT_MAX_POSITION_EMBEDDINGS = 262144
# safetensors refuses headers above 100 MB.
_MAX_HEADER = 100_000_000
_REPO_ID_RE = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]+\b$")


class ModelFileError(Exception):
    """A model loading failure, carrying the exception type real vLLM would raise."""

    def __init__(self, exc_type: str, message: str, where: str = "config"):
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        # "config": raised in the API server while building the config (no engine wrapper);
        # "weights": raised in the engine core while loading weights.
        self.where = where


def repo_id_error(model: str) -> ModelFileError:
    """huggingface_hub's validate_repo_id failure, re-raised by transformers as OSError."""
    return ModelFileError(
        "OSError",
        f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{model}'. "
        "Use `repo_type` argument if needed.",
    )


def is_valid_repo_id(model: str) -> bool:
    return (bool(_REPO_ID_RE.match(model)) and "--" not in model and ".." not in model
            and len(model) <= 96)


def is_local_path(model: str) -> bool:
    """vLLM treats the model as local when the path exists or is spelled as a path."""
    return os.path.isdir(model) or model.startswith(("/", "./", "../", "~"))


def _hub_cache_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of a Hub repo, if any (HF_HUB_CACHE / HF_HOME layout)."""
    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    repo_dir = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    ref = repo_dir / "refs" / "main"
    try:
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    except OSError:
        pass
    snaps = sorted((repo_dir / "snapshots").glob("*")) if (repo_dir / "snapshots").is_dir() else []
    return snaps[-1] if snaps else None


def resolve(model: str) -> Path:
    """Where the model's files are, or raise ModelFileError like transformers would."""
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        if not (path / "config.json").is_file():
            # Treated as a repo id once the local lookup fails (same text as a missing dir).
            raise repo_id_error(model)
        return path
    if not is_valid_repo_id(model):
        raise repo_id_error(model)
    snap = _hub_cache_snapshot(model)
    if snap is not None and (snap / "config.json").is_file():
        return snap
    raise ModelFileError(
        "OSError",
        "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find "
        "them in the cached files.\nCheck your internet connection or see how to run the "
        "library in offline mode at "
        "'https://huggingface.co/docs/transformers/installation#offline-mode'.",
    )


@dataclass(frozen=True)
class ModelInfo:
    """What the simulator needs from config.json."""

    path: Path
    architectures: tuple[str, ...]
    model_type: str
    max_position_embeddings: int
    hybrid: bool
    mtp_layers: int | None
    # quantization_config: method and weight bits ("auto-round", 4), None when unquantized.
    quant_method: str | None = None
    quant_bits: int | None = None
    # Gated DeltaNet value heads (Qwen3.6-27B: 48); its in_proj_ba has 2x that many outputs.
    linear_num_value_heads: int | None = None

    @property
    def marlin_int4(self) -> bool:
        """Weights that vLLM runs through the Marlin WNA16 kernels (AutoRound/GPTQ/AWQ INT4)."""
        return self.quant_method in ("auto-round", "auto_round", "gptq", "awq") \
            and self.quant_bits == 4


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else cfg


def _is_hybrid(cfg: dict[str, Any]) -> bool:
    """Qwen3-Next style hybrid attention (linear/DeltaNet + full attention layers)?

    Qwen3.6-27B is hybrid; configs that say nothing are assumed to be this model.
    """
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return any(str(t) != "full_attention" for t in layer_types)
    if any(k in cfg for k in ("full_attention_interval", "linear_num_value_heads",
                              "linear_key_head_dim", "linear_conv_kernel_dim")):
        return True
    if cfg.get("sliding_window") and cfg.get("use_sliding_window"):
        return True
    return True


def load_config(path: Path) -> ModelInfo:
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ModelFileError(
            "OSError", f"It looks like the config file at '{path / 'config.json'}' is not a "
            f"valid JSON file.") from exc
    if not isinstance(raw, dict):
        raise ModelFileError("OSError", f"It looks like the config file at "
                             f"'{path / 'config.json'}' is not a valid JSON file.")
    cfg = _text_config(raw)
    archs = raw.get("architectures") or cfg.get("architectures") or ["Qwen3NextForCausalLM"]
    mtp = cfg.get("mtp_num_hidden_layers", cfg.get("num_nextn_predict_layers"))
    try:
        max_pos = int(cfg.get("max_position_embeddings") or DEFAULT_MAX_POSITION_EMBEDDINGS)
    except (TypeError, ValueError):
        max_pos = DEFAULT_MAX_POSITION_EMBEDDINGS
    quant = raw.get("quantization_config") or cfg.get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    heads = cfg.get("linear_num_value_heads")
    return ModelInfo(
        path=path,
        architectures=tuple(str(a) for a in archs),
        model_type=str(raw.get("model_type") or cfg.get("model_type") or "qwen3_next"),
        max_position_embeddings=max_pos,
        hybrid=_is_hybrid(cfg),
        mtp_layers=int(mtp) if isinstance(mtp, int) else None,
        quant_method=str(quant["quant_method"]) if quant.get("quant_method") else None,
        quant_bits=int(quant["bits"]) if isinstance(quant.get("bits"), int) else None,
        linear_num_value_heads=int(heads) if isinstance(heads, int) else None,
    )


def _safetensors_error(detail: str) -> ModelFileError:
    return ModelFileError("safetensors_rust.SafetensorError",
                          f"Error while deserializing header: {detail}", where="weights")


def check_shard(path: Path) -> int:
    """Validate one safetensors file's header; returns its size in bytes."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _safetensors_error("HeaderTooSmall")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or n > size - 8:
            raise _safetensors_error("HeaderTooLarge")
        blob = fh.read(n)
    if len(blob) < n:
        raise _safetensors_error("MetadataIncompleteBuffer")
    if not blob.lstrip(b" ").startswith(b"{"):
        raise _safetensors_error("InvalidHeaderStart")
    try:
        header = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _safetensors_error("InvalidHeaderDeserialization") from None
    if not isinstance(header, dict):
        raise _safetensors_error("InvalidHeaderDeserialization")
    data_len = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            entry["dtype"], entry["shape"]
        except (KeyError, TypeError, ValueError):
            raise _safetensors_error("InvalidHeaderDeserialization") from None
        if not (0 <= begin <= end <= data_len):
            raise _safetensors_error("MetadataIncompleteBuffer")
    return size


def check_weights(path: Path) -> list[Path]:
    """All weight shards, validated; raises ModelFileError like the weight loader would."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        except (ValueError, AttributeError):
            raise ModelFileError("json.decoder.JSONDecodeError",
                                 f"Expecting value: {index}", where="weights") from None
        names = sorted(set(str(v) for v in weight_map.values()))
    else:
        names = sorted(p.name for p in path.glob("*.safetensors"))
    if not names:
        raise ModelFileError("RuntimeError", f"Cannot find any model weights with `{path}`",
                             where="weights")
    shards = []
    for name in names:
        shard = path / name
        if not shard.is_file():
            raise ModelFileError("FileNotFoundError",
                                 f"[Errno 2] No such file or directory: '{shard}'",
                                 where="weights")
        check_shard(shard)
        shards.append(shard)
    return shards
