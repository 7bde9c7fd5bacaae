"""A deterministic, lossless tokenizer standing in for Qwen's BPE.

Text is cut into pieces: special tokens (``<|im_start|>`` ...), letter runs with their
leading space, single digits (Qwen splits digits), punctuation runs, whitespace runs; long
pieces are split into chunks of at most 4 characters (6 UTF-8 bytes). English comes out at
about 4 characters per token, like the real tokenizer.

Token ids: special tokens keep Qwen's ids; any other piece's id is its UTF-8 bytes read as a
big-endian integer (< 2**48), so decoding needs no vocabulary and ``decode(encode(t)) == t``.
"""

from __future__ import annotations

import re

SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}
_SPECIAL_BY_ID = {v: k for k, v in SPECIAL_TOKENS.items()}

_MAX_CHARS = 4  # per piece, leading space not counted
_MAX_BYTES = 6  # keeps ids below 2**48 (exact in JSON numbers and JavaScript)

_PIECE_RE = re.compile(
    "|".join(re.escape(s) for s in sorted(SPECIAL_TOKENS, key=len, reverse=True))
    + r"| ?[^\W\d_]+"  # letters, with the space before them
    + r"| ?\d"  # one digit
    + r"| ?(?:[^\w\s]|_)+"  # punctuation run
    + r"|\n+|[^\S\n]+"  # newlines; other whitespace
    + r"|.",  # anything else (safety net: the tokenizer must be lossless)
    re.DOTALL,
)


def _split_long(piece: str) -> list[str]:
    if len(piece) <= _MAX_CHARS and len(piece.encode("utf-8")) <= _MAX_BYTES:
        return [piece]
    out: list[str] = []
    cur = ""
    for ch in piece:
        if cur and (len(cur.lstrip(" ")) >= _MAX_CHARS
                    or len((cur + ch).encode("utf-8")) > _MAX_BYTES):
            out.append(cur)
            cur = ""
        cur += ch
    if cur:
        out.append(cur)
    return out


def pieces(text: str) -> list[str]:
    """The token strings of ``text``; ``"".join(pieces(t)) == t``."""
    out: list[str] = []
    for m in _PIECE_RE.finditer(text):
        piece = m.group(0)
        if piece in SPECIAL_TOKENS:
            out.append(piece)
        else:
            out.extend(_split_long(piece))
    return out


def piece_id(piece: str) -> int:
    special = SPECIAL_TOKENS.get(piece)
    if special is not None:
        return special
    # A leading NUL would vanish in the integer; map it to U+FFFD (lossy, never in practice).
    if piece.startswith("\x00"):
        piece = "\ufffd" + piece[1:]
    return int.from_bytes(piece.encode("utf-8"), "big")


def encode(text: str) -> list[int]:
    return [piece_id(p) for p in pieces(text)]


def count(text: str) -> int:
    return sum(1 for _ in pieces(text))


def id_to_piece(token_id: int) -> str:
    special = _SPECIAL_BY_ID.get(token_id)
    if special is not None:
        return special
    if token_id < 0:
        raise ValueError(f"token id {token_id} out of range")
    raw = token_id.to_bytes(max(1, (token_id.bit_length() + 7) // 8), "big")
    return raw.decode("utf-8", errors="replace")


def decode(ids: list[int]) -> str:
    return "".join(id_to_piece(int(i)) for i in ids)


def truncate(text: str, max_tokens: int) -> tuple[str, int, bool]:
    """The first ``max_tokens`` tokens of ``text``: (text, tokens, truncated?)."""
    ps = pieces(text)
    if len(ps) <= max_tokens:
        return text, len(ps), False
    return "".join(ps[:max_tokens]), max_tokens, True
