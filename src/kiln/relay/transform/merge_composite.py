"""MergeComposite: replace each match of a BYOC pattern by a call of a *composite* function
(TVM: src/relay/transforms/merge_composite.cc, with the grouping rules of
src/relay/ir/dataflow_matcher.cc ``PatternGrouper``).

The pattern table is an ordered list of ``(name, pattern, check)``: every pattern is applied to
the whole graph before the next one (earlier entries win, so list the larger patterns first), and
within one pattern the graph is visited consumers first. A match becomes
``FunctionCall(Function(params, [body], attrs={"Composite": name}), inputs)``: the nodes the
pattern's leaves matched (wildcards and constants) become the parameters, the matched calls the
body. A match is taken only if

- ``check(root)`` accepts it (``root``: the composite body's output call, a copy of the matched
  calls whose leaves are the composite's parameter Vars, so a check reads types and attrs
  without caring where the inputs come from);
- none of its calls belongs to an earlier composite;
- no interior value escapes: every matched call but the root is used only inside the match and is
  not a graph output (otherwise it would be computed twice).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln.relay.graph import (
    CALL_NODES,
    Call,
    Expr,
    Function,
    FunctionCall,
    Var,
    consumers,
    post_order,
    with_args,
)
from kiln.relay.pattern import Match, Pattern, match

name = "MergeComposite"

#: one pattern table entry: (composite name, pattern, check(root) -> bool)
PatternEntry = tuple[str, Pattern, Callable[[Expr], bool]]


def merge_composite(func: Function, pattern_table: Sequence[PatternEntry]) -> Function:
    """Return ``func`` with every accepted match of ``pattern_table`` turned into a composite
    call (see the module doc). ``func`` itself is not modified."""
    for entry in pattern_table:
        func = _apply(func, *entry)
    return func


def _valid(m: Match, users: dict[int, list[Expr]], outputs: set[int], claimed: set[int]) -> bool:
    interior = {n.uid for n in m.nodes}
    if interior & claimed or any(i.uid in interior for i in m.inputs):
        return False
    for n in m.nodes:
        if n is m.root:
            continue
        if n.uid in outputs or any(u.uid not in interior for u in users.get(n.uid, [])):
            return False
    return True


def _apply(func: Function, comp_name: str, pattern: Pattern,
           check: Callable[[Expr], bool] | None) -> Function:
    order = list(post_order(func.outputs))
    position = {n.uid: i for i, n in enumerate(order)}
    users = consumers(func.outputs)
    outputs = {o.uid for o in func.outputs}
    claimed: set[int] = set()
    found: dict[int, tuple[Match, Function]] = {}
    for node in reversed(order):
        if not isinstance(node, Call) or node.uid in claimed:
            continue
        m = match(pattern, node)
        if m is None or not _valid(m, users, outputs, claimed):
            continue
        body = _composite_body(m, comp_name, position)
        if check is not None and not check(body.outputs[0]):
            continue
        claimed.update(n.uid for n in m.nodes)
        found[node.uid] = (m, body)
    if not found:
        return func
    memo: dict[int, Expr] = {}
    for node in order:
        if node.uid in found:
            m, body = found[node.uid]
            memo[node.uid] = FunctionCall(body, [memo[i.uid] for i in m.inputs])
        elif isinstance(node, CALL_NODES):
            memo[node.uid] = with_args(node, [memo[a.uid] for a in node.args])
        else:
            memo[node.uid] = node
    return Function(func.params, [memo[o.uid] for o in func.outputs], list(func.output_names),
                    dict(func.attrs))


def _composite_body(m: Match, comp_name: str, position: dict[int, int]) -> Function:
    inner: dict[int, Expr] = {}
    params = []
    for k, i in enumerate(m.inputs):
        v = Var(f"p{k}", i.checked_type)
        params.append(v)
        inner[i.uid] = v
    for n in sorted(m.nodes, key=lambda n: position[n.uid]):
        assert isinstance(n, Call), "composite interior is made of op calls"
        inner[n.uid] = Call(n.op.name, [inner[a.uid] for a in n.args], n.attrs, n.span)
    return Function(params, [inner[m.root.uid]], attrs={"Composite": comp_name})
