"""The einsum compute: one reduction over the letters missing from the output, of the product
of the operands read at their letters (a size-1 axis under a longer letter reads index 0)."""

from __future__ import annotations

from kiln.ir import loop as L
from kiln.ir import te
from kiln.ir.op_registry import register_compute
from kiln.ir.ops.einsum import letter_extents, parse_einsum


@register_compute("einsum")
def einsum(inputs, attrs, out_type):
    terms, out = parse_einsum(attrs["equation"])
    extents = letter_extents(terms, [t.shape for t in inputs])
    summed = [c for c in extents if c not in out]
    raxes = {c: te.reduce_axis(extents[c], f"r_{c}") for c in summed}

    def body(*o):
        var = {c: o[k] for k, c in enumerate(out)} | {c: r.var for c, r in raxes.items()}
        value = None
        for t, term in zip(inputs, terms):
            idx = tuple(L.IntImm(0) if n == 1 and extents[c] != 1 else var[c]
                        for c, n in zip(term, t.shape))
            load = t[idx]
            value = load if value is None else value * load
        if not raxes:
            return value
        return te.sum(value, list(raxes.values()))

    return te.compute(out_type.shape, body, name="einsum", tag="einsum")
