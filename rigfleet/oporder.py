"""pyinfra's operation order, read from ``frame.f_lineno`` rather than ``inspect.stack()``
(which reads each frame's source line too: ms per operation call; docs/architecture.md)::

    fast_operation_order()        # run_deploy does this; idempotent
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any

import pyinfra
from pyinfra.api.state import State
from pyinfra.api.util import PYINFRA_INSTALL_DIR, get_operation_order_from_stack


def operation_order(state: State) -> list[int]:
    """What ``get_operation_order_from_stack`` returns, from the caller's frames up."""
    frames = [frame for frame, _ in traceback.walk_stack(sys._getframe(1))][::-1]
    start = 0
    if state.current_deploy_filename:  # its first frame, or the last frame as pyinfra's does
        start = next((i for i, f in enumerate(frames)
                      if f.f_code.co_filename == state.current_deploy_filename), len(frames) - 1)
    lines = [state.current_op_file_number] if pyinfra.is_cli else []
    lines += [f.f_lineno for f in frames[start:]
              if not f.f_code.co_filename.startswith(PYINFRA_INSTALL_DIR)]
    return lines


# The module (``pyinfra.api.operation`` as an attribute is the decorator of that name).
OPERATION: Any = importlib.import_module("pyinfra.api.operation")


def fast_operation_order() -> None:
    if OPERATION.get_operation_order_from_stack is get_operation_order_from_stack:
        OPERATION.get_operation_order_from_stack = operation_order
