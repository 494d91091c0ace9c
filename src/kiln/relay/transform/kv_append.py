"""KVAppend: a key/value cache that grows in place (VM builds; docs/decisions/019-kv-cache.md).

A decoder exported with a sequence-major cache writes ``present = concatenate([past, new],
axis=0)``, where ``past`` is a graph input. As a kernel, that copies the whole cache every
token. This pass rewrites it to the runtime op ``kv_append(past, new)``: the VM appends ``new``
behind a ``past`` it returned itself from the previous call (the rows ``[0, P)`` of one of its
append buffers) and copies only when it must, so the value is the concatenation all the same.

Only two-part concatenations on axis 0 whose first part is a parameter of the function are
rewritten (a concatenation of computed values stays a kernel: its first part is in the VM's
arena, not in a buffer the caller keeps). Run before FuseOps, which leaves runtime ops alone:
``new``'s producer kernel then writes it to the arena and the builtin copies it behind the past.
"""

from __future__ import annotations

from kiln.relay.graph import Call, Expr, Function, Var, rewrite, same_call

name = "KVAppend"


def kv_append(func: Function) -> Function:
    """Rewrite ``concatenate([param, x], axis=0)`` to ``kv_append(param, x)`` (module doc).

    Parameters
    ----------
    func : Function
        A graph function whose parameters are the executable's inputs (VM builds only: the
        graph and AOT executors cannot run runtime ops).

    Returns
    -------
    Function
        The same values; the rewritten concatenations are ``kv_append`` calls.
    """
    params = {p.uid for p in func.params}

    def visit(call: Call, args: list[Expr]) -> Expr:
        if _is_cache_concat(call, params):
            return Call("kv_append", args, {}, call.span)
        return same_call(call, args)

    return rewrite(func, visit)


def _is_cache_concat(call: Call, params: set[int]) -> bool:
    if call.op.name != "concatenate" or len(call.args) != 2:
        return False
    past = call.args[0]
    ndim = call.checked_type.ndim
    return (isinstance(past, Var) and past.uid in params and ndim >= 1
            and call.attrs["axis"] % ndim == 0)


kv_append.name = name  # type: ignore[attr-defined]
