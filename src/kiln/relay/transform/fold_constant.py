"""FoldConstant: evaluate every call whose arguments are all constants (TVM: FoldConstant).

One bottom-up walk: a call is folded as soon as its (already rewritten) arguments are all
:class:`Constant`, so whole constant subgraphs — weight transposes, batch-norm scale/shift
arithmetic, shape computations — collapse into single constants.
"""

from __future__ import annotations

from kiln.arith import SymbolicValueError, UndecidedError
from kiln.relay.graph import Call, Constant, Expr, Function, rewrite, same_call
from kiln.relay.interpreter import evaluate_call

name = "FoldConstant"


def fold_constant(func: Function) -> Function:
    """Fold constant subexpressions of ``func``.

    Parameters
    ----------
    func : Function
        Any graph function (bind the weights first with :func:`bind_params` to fold them).

    Returns
    -------
    Function
        An equivalent function in which no call has only constant arguments. Folded constants
        are named after the op and the first named constant they came from.
    """

    def visit(call: Call, args: list[Expr]) -> Expr:
        if not all(isinstance(a, Constant) for a in args) or not call.checked_type.is_static:
            return same_call(call, args)  # (a symbolic output shape is known at run time only)
        try:
            value = evaluate_call(call, [a.data for a in args])  # type: ignore[union-attr]
        except (UndecidedError, SymbolicValueError):  # a comparison of symbolic dims, or
            return same_call(call, args)  # a number made of one: computed at run time
        source = next((a.name for a in args if a.name), None)  # type: ignore[union-attr]
        name = f"{source}.{call.op.name}" if source else None
        return Constant(value, name=name)

    return rewrite(func, visit)


fold_constant.name = name  # type: ignore[attr-defined]
