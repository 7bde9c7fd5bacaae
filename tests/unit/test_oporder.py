"""The fast operation order gives what pyinfra's own gives, from the same call stack."""

from __future__ import annotations

from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api.util import PYINFRA_INSTALL_DIR, get_operation_order_from_stack

from rigfleet.oporder import OPERATION, fast_operation_order, operation_order

# Called from a frame that pyinfra counts as its own, as solve_operation_consistency does.
_AS_PYINFRA = compile("result = order(state)", f"{PYINFRA_INSTALL_DIR}/api/operation.py", "exec")


def _from_pyinfra(order, state):
    scope = {"order": order, "state": state}
    exec(_AS_PYINFRA, scope)
    return scope["result"]


def _role(depth: int, state):
    if depth:
        return _role(depth - 1, state)
    # One line, so that both are called from the same line number.
    pair = [_from_pyinfra(o, state) for o in (get_operation_order_from_stack, operation_order)]
    return pair[0], pair[1]


@pytest.mark.parametrize("cli", [True, False])
@pytest.mark.parametrize("deploy_file", [__file__, "/elsewhere/deploy.py", None])
def test_the_same_line_numbers_as_pyinfras_own(monkeypatch, cli, deploy_file):
    monkeypatch.setattr(pyinfra, "is_cli", cli)
    state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=7)
    for depth in (0, 3):
        theirs, ours = _role(depth, state)
        assert ours == theirs
        assert len(ours) > depth + 1 or deploy_file != __file__  # every frame below the deploy


def test_installed_once(monkeypatch):
    monkeypatch.setattr(OPERATION, "get_operation_order_from_stack",
                        get_operation_order_from_stack)
    fast_operation_order()
    fast_operation_order()
    assert OPERATION.get_operation_order_from_stack is operation_order
