"""Row-major addressing of buffer accesses whose indices split one value over two dimensions.

A fused schedule axis (:meth:`kiln.tir.lower.Stage.fuse`, e.g. a 1×1 conv's output rows and
columns as one flattened plane ``f``) reads ``buf[n, c, f // W, f % W, b]``. Row-major, the two
middle terms add up to ``((f // W) * W + f % W) * s = f * s`` (floor division, any ``f``), so
the codegens address such a pair as one dimension of extent ``H * W`` indexed by ``f``: the
offsets of a register block's pixels are then constants apart instead of a division and a
remainder each (LLVM does not fold ``(f / W) * W + f % W`` back).
"""

from __future__ import annotations

from kiln.tir import loop as L


def same_expr(a: L.PrimExpr, b: L.PrimExpr) -> bool:
    """Whether ``a`` and ``b`` are the same integer index expression: the same variables,
    constants, casts and arithmetic, structurally. Conservative: anything else (loads, calls,
    selects) is only the same as itself."""
    if a is b:
        return True
    if type(a) is not type(b) or a.dtype != b.dtype:
        return False
    if isinstance(a, L.IntImm):
        return a.value == b.value
    if isinstance(a, L.Binary):
        return a.op == b.op and same_expr(a.a, b.a) and same_expr(a.b, b.b)
    if isinstance(a, L.Cast):
        return same_expr(a.value, b.value)
    return False


def _split_of(div: L.PrimExpr, mod: L.PrimExpr, extent: object) -> L.PrimExpr | None:
    """``f`` when ``div`` is ``f // extent`` and ``mod`` is ``f % extent`` (a static extent),
    else None."""
    if not (isinstance(div, L.Binary) and div.op == "//" and isinstance(mod, L.Binary)
            and mod.op == "%" and isinstance(extent, int)):
        return None
    if not (isinstance(div.b, L.IntImm) and isinstance(mod.b, L.IntImm)
            and div.b.value == mod.b.value == extent):
        return None
    return div.a if same_expr(div.a, mod.a) else None


def merge_split_indices(shape: tuple, indices: list[L.PrimExpr]
                        ) -> tuple[tuple, list[L.PrimExpr]]:
    """``(shape, indices)`` of the same row-major element offset with every adjacent pair
    ``[f // E, f % E]`` over dimensions ``(D, E)`` (``E`` static) merged into ``[f]`` over one
    dimension ``D * E``. Shapes: any rank; the result has at most as many dimensions.
    Example: ``(1, 4, 7, 7, 16)``, ``[0, c, f // 7, f % 7, b]`` → ``(1, 4, 49, 16)``,
    ``[0, c, f, b]``."""
    shape, indices = list(shape), list(indices)
    k = len(indices) - 2
    while k >= 0:
        f = _split_of(indices[k], indices[k + 1], shape[k + 1])
        if f is not None:
            d, e = shape[k], shape[k + 1]
            merged = d * e if isinstance(d, int) else L.as_index(d) * L.as_index(e)
            shape[k:k + 2] = [merged]
            indices[k:k + 2] = [f]
        k -= 1
    return tuple(shape), indices
