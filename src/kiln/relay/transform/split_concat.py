"""SplitConcat: let channel concatenations disappear into the ops that consume them.

A channel concatenation (``concatenate`` on axis 1 of NCHW values, SqueezeNet's fire modules,
Inception's branches) copies every element once more. Two exact rewrites avoid most of it:

- a pool over a concatenation is the concatenation of the pools (pooling works per channel):
  ``max_pool2d(concat(a, b))`` → ``concat(max_pool2d(a), max_pool2d(b))``, so the copy moves
  the pooled (smaller) values;
- a convolution over a concatenation is the sum of convolutions over its parts, each with the
  weights of its input channels: ``conv2d(concat(a, b), W)`` →
  ``conv2d(a, W[:, :Ca]) + conv2d(b, W[:, Ca:])``; FuseOps puts the add into the second
  convolution's epilogue (as a residual add), so the concatenated tensor is never written.
  The sum of the partial convolutions rounds differently from one reduction (float32: a few
  ulps).

Each applies only when the concatenation has no other user (otherwise it is computed anyway),
the second only when the convolution has fewer outputs than the concatenation has elements per
extra part (every partial sum but the last is written and read back).
Run after FoldConstant (the weights must be constants), before AlterOpLayout.
docs/decisions/013-split-concat.md has the measurements.
"""

from __future__ import annotations

from kiln import arith
from kiln.relay.graph import Call, Constant, Expr, Function, consumers, rewrite, same_call

name = "SplitConcat"

#: per-channel pools, which commute with a channel concatenation
POOLS = ("nn.max_pool2d", "nn.avg_pool2d")


def split_concat(func: Function) -> Function:
    """Rewrite pools and convolutions over single-use channel concatenations (module doc).

    Parameters
    ----------
    func : Function
        A graph function, after FoldConstant.

    Returns
    -------
    Function
        An equivalent function (convolution sums reassociated).
    """
    return _split_convs(_push_pools(func))


def _single_use_concat(arg: Expr, users: dict[int, list[Expr]]) -> Call | None:
    """``arg`` if it is a channel concatenation of NCHW values used by one call only."""
    if not (isinstance(arg, Call) and arg.op.name == "concatenate"
            and arg.checked_type.ndim == 4 and arg.attrs["axis"] % 4 == 1):
        return None
    return arg if len(users.get(arg.uid, ())) == 1 else None


def _size(e: Expr) -> arith.Dim:
    return arith.prod(e.checked_type.shape)


def _surely_less(a: arith.Dim, b: arith.Dim) -> bool:
    """``a < b`` for every value of the symbols (a plain comparison for static sizes); False
    where the bounds cannot tell, which keeps the graph as it is."""
    hi = arith.bounds(arith.sub(a, b))[1]
    return hi is not None and hi < 0


def _push_pools(func: Function) -> Function:
    users = consumers(func.outputs)

    def visit(call: Call, args: list[Expr]) -> Expr:
        concat = _single_use_concat(call.args[0], users) if call.op.name in POOLS else None
        if concat is None or call.attrs.get("layout", "NCHW") != "NCHW":
            return same_call(call, args)
        parts = [Call(call.op.name, [p], call.attrs, call.span) for p in args[0].args]
        return Call("concatenate", parts, args[0].attrs, args[0].span)

    return rewrite(func, visit)


def _split_convs(func: Function) -> Function:
    users = consumers(func.outputs)

    def visit(call: Call, args: list[Expr]) -> Expr:
        if call.op.name != "nn.conv2d" or call.attrs["groups"] != 1 or \
                not isinstance(args[1], Constant) or not _single_use_concat(call.args[0], users):
            return same_call(call, args)
        parts = args[0].args
        if not _surely_less((len(parts) - 1) * _size(call), _size(call.args[0])):
            # Each partial sum but the last is written and read back: cheaper than the copy
            # only for convolutions with fewer outputs than inputs (SqueezeNet's squeeze
            # layers, not its 512 -> 1000 classifier).
            return same_call(call, args)
        weight = args[1]
        total: Expr | None = None
        start = 0
        for part in parts:
            channels = part.checked_type.shape[1]
            w = Constant(weight.data[:, start:start + channels].copy(), weight.name)
            start += channels
            conv = Call("nn.conv2d", [part, w], call.attrs, call.span)
            total = conv if total is None else Call("add", [total, conv], span=call.span)
        assert total is not None  # a concatenation has at least one part
        return total

    return rewrite(func, visit)


split_concat.name = name  # type: ignore[attr-defined]
