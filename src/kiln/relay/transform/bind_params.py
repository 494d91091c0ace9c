"""BindParams: replace parameter Vars by named Constants (TVM: ``bind_params_by_name``)."""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import CALL_NODES, Constant, Expr, Function, Var, post_order, with_args

name = "BindParams"


def substitute(func: Function, mapping: dict[int, Expr], params: list[Var]) -> Function:
    """Rebuild ``func`` with nodes replaced per ``mapping`` (uid → Expr) and new ``params``."""
    memo: dict[int, Expr] = dict(mapping)
    for node in post_order(func.outputs):
        if node.uid in memo:
            continue
        if isinstance(node, CALL_NODES):
            memo[node.uid] = with_args(node, [memo[a.uid] for a in node.args])
        else:
            memo[node.uid] = node
    return Function(params, [memo[o.uid] for o in func.outputs], list(func.output_names),
                    dict(func.attrs))


def bind_params(func: Function, params: dict[str, np.ndarray]) -> Function:
    """Bind parameter values into ``func``.

    Parameters
    ----------
    func : Function
        A graph function whose weights are parameter Vars (as :func:`kiln.frontend.from_onnx`
        returns it).
    params : dict[str, np.ndarray]
        Values by Var name; names that are not parameters of ``func`` are ignored.

    Returns
    -------
    Function
        ``func`` with each bound Var replaced by a :class:`Constant` named like the Var, and the
        bound Vars removed from ``params`` (the others keep their order).

    Raises
    ------
    ShapeError
        If a value's shape differs from its Var's type.
    """
    mapping: dict[int, Expr] = {}
    remaining: list[Var] = []
    for var in func.params:
        if var.name not in params:
            remaining.append(var)
            continue
        value = np.asarray(params[var.name])
        want = var.checked_type
        if tuple(value.shape) != want.shape:
            raise ShapeError(f"bind_params: '{var.name}' has shape {value.shape}, expected "
                             f"{want.shape}")
        mapping[var.uid] = Constant(value.astype(want.dtype, copy=False), name=var.name)
    return substitute(func, mapping, remaining)


bind_params.name = name  # type: ignore[attr-defined]
