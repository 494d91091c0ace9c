"""AnnotateTarget: mark the ops each external compiler takes (TVM:
src/relay/transforms/annotate_target.cc).

For every op call, in order, the first compiler of ``checkers`` whose predicate accepts it
claims it; a composite call (``Composite="cblas.conv2d_bias"``) belongs to the compiler its name
starts with, when that compiler is listed. A claimed call gets every argument wrapped in
``annotation.compiler_begin(compiler=...)`` and its result wrapped in
``annotation.compiler_end``; the rest stays as it is (TVM also marks it ``default``; Kiln leaves
it unmarked). Each claimed call is then a region of its own, which MergeCompilerRegions grows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kiln.relay.graph import (
    CALL_NODES,
    Call,
    Expr,
    Function,
    FunctionCall,
    post_order,
    with_args,
)
from kiln.relay.op.annotation import BEGIN, END

name = "AnnotateTarget"


def composite_compiler(node: Expr) -> str | None:
    """The compiler a composite call belongs to (``"cblas"`` of ``"cblas.dense"``), or None."""
    if isinstance(node, FunctionCall):
        comp = node.body.attrs.get("Composite")
        if isinstance(comp, str):
            return comp.split(".", 1)[0]
    return None


def annotate_target(func: Function, checkers: Mapping[str, Callable[[Call], bool]]) -> Function:
    """Annotate ``func`` for the compilers of ``checkers`` (compiler name → predicate on an op
    call, in priority order).

    Raises
    ------
    Whatever a predicate raises (a predicate should return False for what it cannot take).
    """
    memo: dict[int, Expr] = {}
    for node in post_order(func.outputs):
        if not isinstance(node, CALL_NODES):
            memo[node.uid] = node
            continue
        args = [memo[a.uid] for a in node.args]
        target = _target_of(node, checkers)
        if target is None:
            memo[node.uid] = with_args(node, args)
            continue
        attrs = {"compiler": target}
        begins = [Call(BEGIN, [a], attrs) for a in args]
        inner = (FunctionCall(node.body, begins) if isinstance(node, FunctionCall)
                 else Call(node.op.name, begins, node.attrs, node.span))
        memo[node.uid] = Call(END, [inner], attrs)
    return Function(func.params, [memo[o.uid] for o in func.outputs], list(func.output_names),
                    dict(func.attrs))


def _target_of(node: Expr, checkers: Mapping[str, Callable[[Call], bool]]) -> str | None:
    comp = composite_compiler(node)
    if comp is not None:
        return comp if comp in checkers else None
    if not isinstance(node, Call) or node.op.name in (BEGIN, END):
        return None
    for compiler, check in checkers.items():
        if check(node):
            return compiler
    return None
