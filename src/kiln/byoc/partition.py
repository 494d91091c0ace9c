"""``partition_for``: the BYOC pass sequence for a list of external compilers (TVM's
``partition_for_<compiler>`` helpers, e.g. python/tvm/relay/op/contrib/dnnl.py).

MergeComposite (each compiler's pattern table, in the order of ``compilers``) → AnnotateTarget
(composites, then per-op support predicates; earlier compilers win) → MergeCompilerRegions →
PartitionGraph. ``kiln.build`` runs it after FoldConstant/FoldScaleAxis and before
AlterOpLayout and FuseOps (docs/decisions/006-byoc.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln.byoc.registry import get_compiler
from kiln.errors import CompileError
from kiln.relay.graph import Call, Function
from kiln.relay.transform.annotate_target import annotate_target
from kiln.relay.transform.merge_compiler_regions import merge_compiler_regions
from kiln.relay.transform.merge_composite import merge_composite
from kiln.relay.transform.partition_graph import partition_graph


def partition_for(func: Function, compilers: Sequence[str], mod_name: str = "default",
                  merge_regions: bool = True) -> Function:
    """Partition ``func`` onto ``compilers`` (registered names, in priority order).

    Parameters
    ----------
    func : Function
        The model after constant folding (weights bound as constants).
    compilers : list of str
        External compilers, e.g. ``["cblas"]``; an op two of them support goes to the first.
    mod_name : str
        The model name in the external symbols (``kiln_<mod_name>_<compiler>_main_<i>``).
    merge_regions : bool
        Run MergeCompilerRegions (default); without it every op or composite is its own
        external function.

    Returns
    -------
    Function
        ``func`` with each region replaced by a call of an external function (attrs
        ``Compiler``, ``global_symbol``); what no compiler takes is unchanged.

    Raises
    ------
    CompileError
        An unregistered compiler, a name given twice, or a composite name that does not start
        with ``"<compiler>."``.
    """
    names = list(compilers)
    if len(set(names)) != len(names):
        raise CompileError(f"byoc: a compiler is listed twice in {names}")
    regs = [get_compiler(n) for n in names]
    for reg in regs:
        if reg.pattern_table is None:
            continue
        table = list(reg.pattern_table())
        for entry in table:
            if not str(entry[0]).startswith(reg.name + "."):
                raise CompileError(f"byoc: composite {entry[0]!r} of compiler {reg.name!r} "
                                   f"must be named '{reg.name}.<name>'")
        func = merge_composite(func, [(e[0], e[1], e[2] if len(e) > 2 else None)
                                      for e in table])
    checkers = {reg.name: _checker(reg.op_support) for reg in regs}
    func = annotate_target(func, checkers)
    if merge_regions:
        func = merge_compiler_regions(func)
    bind = {reg.name: reg.bind_constants for reg in regs}
    return partition_graph(func, mod_name, lambda c: bind[c])


def _checker(support: dict[str, Callable[[Call], bool]]) -> Callable[[Call], bool]:
    def check(call: Call) -> bool:
        pred = support.get(call.op.name)
        return bool(pred(call)) if pred is not None else False
    return check
