"""Log output in vLLM's and uvicorn's formats.

vLLM logs ``LEVEL MM-DD HH:MM:SS [file.py:line] message`` on stdout; uvicorn adds
``INFO:     ...`` lines; uncaught exceptions print Python tracebacks on stderr. Tools (and
people) grep these, so the shapes matter more than the details.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence

_lock = threading.Lock()

# A frame of a synthetic traceback: (file, line, function, source line).
Frame = tuple[str, int, str, str]


def _stamp() -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime())


def _write(stream, text: str) -> None:
    with _lock:
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass  # stdout closed (e.g. the reader went away); logging must never kill us


_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}


def _threshold() -> int:
    # VLLM_LOGGING_LEVEL=WARNING (Genesis' scripts set it) hides the INFO progress lines.
    return _LEVELS.get(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper(), 20)


def log(level: str, where: str, message: str, stream=None) -> None:
    """One vLLM log record; multi-line messages get the prefix on every line, like vLLM."""
    if _LEVELS.get(level, 20) < _threshold():
        return
    prefix = f"{level} {_stamp()} [{where}] "
    lines = message.split("\n")
    _write(stream or sys.stdout, "".join(prefix + line + "\n" for line in lines))


def info(where: str, message: str) -> None:
    log("INFO", where, message)


def warning(where: str, message: str) -> None:
    log("WARNING", where, message)


def error(where: str, message: str) -> None:
    log("ERROR", where, message)


def plain(line: str) -> None:
    """A line without a log prefix (tqdm progress bars, as vLLM's graph capture prints)."""
    _write(sys.stdout, line + "\n")


def uvicorn(message: str) -> None:
    """A uvicorn-style line (``INFO:     Application startup complete.``)."""
    _write(sys.stdout, f"INFO:     {message}\n")


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 500: "Internal Server Error", 503: "Service Unavailable"}


def access(client: str, method: str, path: str, status: int) -> None:
    """uvicorn's access log line."""
    _write(sys.stdout,
           f'INFO:     {client} - "{method} {path} HTTP/1.1" {status} {_REASONS.get(status, "")}\n')


def format_traceback(frames: Sequence[Frame], exc_line: str) -> str:
    """A Python traceback as text (``Traceback (most recent call last):`` ... exception)."""
    out = ["Traceback (most recent call last):"]
    for file, line, func, src in frames:
        out.append(f'  File "{file}", line {line}, in {func}')
        if src:
            out.append(f"    {src}")
    out.append(exc_line)
    return "\n".join(out)


def print_traceback(frames: Sequence[Frame], exc_line: str) -> None:
    """Print a traceback on stderr, as the interpreter does for an uncaught exception."""
    _write(sys.stderr, format_traceback(frames, exc_line) + "\n")


def error_traceback(where: str, frames: Sequence[Frame], exc_line: str) -> None:
    """A traceback logged through vLLM's logger (every line carries the ERROR prefix)."""
    log("ERROR", where, format_traceback(frames, exc_line), stream=sys.stdout)
