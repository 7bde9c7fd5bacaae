"""argparse types shared by the host tool's and rigfleet's own command lines (stdlib only, so
the control side's CLI can use them without importing the host tool's modules)."""

from __future__ import annotations

import argparse


def count(text: str, refused: str = ":") -> int:
    """An integer >= 0 (``refused``: what the refusal says between the value and "allowed")."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}{refused} allowed: an integer >= 0")
    return int(text)


def positive(text: str, refused: str = ":") -> float:
    """A finite number > 0 (0, negative, nan and inf are refused; ``refused``: as ``count``)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}{refused} allowed: a number > 0")
    return value
