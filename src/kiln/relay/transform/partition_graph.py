"""PartitionGraph: outline each annotated region into an external function (TVM:
src/relay/transforms/partition_graph.cc).

Each region (``annotated_regions``) becomes ``FunctionCall(Function(params, outputs, attrs),
args)`` with attrs ``Compiler`` (the external compiler), ``global_symbol``
(``kiln_<mod_name>_<compiler>_main_<i>``, ``i`` counting that compiler's regions in execution
order; TVM: ``tvmgen_<mod>_<compiler>_main_<i>``), ``Primitive=1`` and ``Inline=1``. Its
parameters are the region's distinct inputs; its outputs the region's results used outside, in
execution order (several outputs are read through ``TupleGetItem``). A constant input is bound
into the function when ``bind_constants(compiler)`` says so (TVM's ``bind_constants``: the
codegen then sees the weights, e.g. to hand them to a const loader), else it stays an argument
(it then becomes a graph param the executor passes in, as for Kiln's own kernels).

All annotations are removed, and a composite left outside every region (its compiler was not
asked for) is inlined back into plain op calls.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.errors import CompileError
from kiln.relay.graph import (
    CALL_NODES,
    Call,
    Constant,
    Expr,
    Function,
    FunctionCall,
    TupleGetItem,
    Var,
    post_order,
    with_args,
)
from kiln.relay.transform.annotated_regions import (
    Region,
    RegionSet,
    annotated_regions,
    is_begin,
    is_end,
)

name = "PartitionGraph"


def global_symbol(mod_name: str, compiler: str, index: int) -> str:
    """The symbol of the ``index``-th external function of ``compiler`` in model ``mod_name``."""
    return f"kiln_{mod_name}_{compiler}_main_{index}"


def partition_graph(func: Function, mod_name: str = "default",
                    bind_constants: Callable[[str], bool] = lambda compiler: True) -> Function:
    """Outline the regions of annotated ``func`` (see the module doc).

    Parameters
    ----------
    func : Function
        Annotated by AnnotateTarget (and usually MergeCompilerRegions).
    mod_name : str
        The model's name in the symbols (``kiln.build``'s ``mod_name``).
    bind_constants : callable
        ``bind_constants(compiler) -> bool``: keep constant inputs inside that compiler's
        functions (default: yes, as TVM).

    Raises
    ------
    CompileError
        Malformed annotations (see ``annotated_regions``).
    """
    rs = annotated_regions(func)
    counters: dict[str, int] = {}
    memo: dict[int, Expr] = {}
    region_out: dict[int, dict[int, Expr]] = {}  # rid → member uid → value outside

    def value(e: Expr) -> Expr:
        if is_end(e):
            return region_out[rs.region_of[e.args[0].uid].rid][e.args[0].uid]
        return memo[e.uid]

    for unit in _units_in_order(func, rs):
        if isinstance(unit, Region):
            sym_index = counters.get(unit.compiler, 0)
            counters[unit.compiler] = sym_index + 1
            region_out[unit.rid] = _outline(unit, rs, value, mod_name, sym_index,
                                            bind_constants(unit.compiler))
        elif isinstance(unit, CALL_NODES):
            args = [value(a) for a in unit.args]
            if isinstance(unit, FunctionCall) and "Composite" in unit.body.attrs:
                memo[unit.uid] = inline(unit.body, args)
            else:
                memo[unit.uid] = with_args(unit, args)
        else:
            memo[unit.uid] = unit
    return Function(func.params, [value(o) for o in func.outputs], list(func.output_names),
                    dict(func.attrs))


def _units_in_order(func: Function, rs: RegionSet) -> list:
    """Regions and the nodes outside them in an order where every unit comes after the units
    it reads (regions are contracted to one unit; begin/end annotations are dropped)."""

    def unit_of(e: Expr):
        if is_end(e):
            e = e.args[0]
        r = rs.region_of.get(e.uid)
        return r if r is not None else e

    def deps(u) -> list:
        if isinstance(u, Region):
            return [unit_of(b.args[0]) for b in u.ins]
        if isinstance(u, CALL_NODES):
            assert not any(is_begin(a) for a in u.args), "compiler_begin outside a region"
            return [unit_of(a) for a in u.args]
        return []

    def key(u) -> int:
        return id(u) if isinstance(u, Region) else u.uid

    done: set[int] = set()
    order: list = []
    for out in func.outputs:
        stack = [(unit_of(out), False)]
        while stack:
            u, expanded = stack.pop()
            if key(u) in done:
                continue
            if expanded:
                done.add(key(u))
                order.append(u)
                continue
            stack.append((u, True))
            for d in reversed(deps(u)):
                if key(d) not in done:
                    stack.append((d, False))
    return order


def _outline(region: Region, rs: RegionSet, value, mod_name: str, index: int,
             bind: bool) -> dict[int, Expr]:
    inner: dict[int, Expr] = {}
    params: list[Var] = []
    args: list[Expr] = []
    by_source: dict[int, Expr] = {}
    for b in sorted(region.ins, key=lambda b: rs.position[b.uid]):
        src = b.args[0]
        if src.uid in by_source:  # one parameter per distinct input
            inner[b.uid] = by_source[src.uid]
            continue
        outer = value(src)
        if bind and isinstance(outer, Constant):
            inner[b.uid] = outer
        else:
            v = Var(f"{region.compiler}_{index}_i{len(params)}", outer.checked_type)
            params.append(v)
            args.append(outer)
            inner[b.uid] = v
        by_source[src.uid] = inner[b.uid]
    for n in region.nodes:
        missing = [a for a in n.args if a.uid not in inner]
        if missing:
            raise CompileError(f"PartitionGraph: {n!r} in a {region.compiler} region reads "
                               f"{missing[0]!r} without a compiler_begin annotation")
        inner[n.uid] = with_args(n, [inner[a.uid] for a in n.args])
    outs: list[Expr] = []
    for e in sorted(region.outs, key=lambda e: rs.position[e.args[0].uid]):
        if all(o is not e.args[0] for o in outs):
            outs.append(e.args[0])
    attrs = {"Compiler": region.compiler,
             "global_symbol": global_symbol(mod_name, region.compiler, index),
             "Primitive": 1, "Inline": 1}
    call = FunctionCall(Function(params, [inner[o.uid] for o in outs], attrs=attrs), args)
    if len(outs) == 1:
        return {outs[0].uid: call}
    return {o.uid: TupleGetItem(call, k) for k, o in enumerate(outs)}


def inline(body: Function, args: list[Expr]) -> Expr:
    """The single output of ``body`` applied to ``args``, as plain calls (a composite undone)."""
    inner: dict[int, Expr] = {p.uid: a for p, a in zip(body.params, args)}
    for n in post_order(body.outputs):
        if n.uid not in inner:
            inner[n.uid] = (Call(n.op.name, [inner[a.uid] for a in n.args], n.attrs, n.span)
                            if isinstance(n, Call) else n)
    return inner[body.outputs[0].uid]
