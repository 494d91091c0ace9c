"""The regions of an annotated graph (TVM: src/relay/analysis/annotated_region_set.cc).

A *region* is a set of calls one external compiler runs as one function. In an annotated graph
(AnnotateTarget's output, possibly merged), it is a connected set of call-like nodes whose
inputs come through ``annotation.compiler_begin`` and whose results leave through
``annotation.compiler_end``, all of the same ``compiler``; calls of one region are linked
directly (without an end → begin pair between them). Everything else is Kiln's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.errors import CompileError
from kiln.relay.graph import CALL_NODES, Call, Expr, Function, consumers, post_order
from kiln.relay.op.annotation import BEGIN, END


def is_begin(node: Expr) -> bool:
    return isinstance(node, Call) and node.op.name == BEGIN


def is_end(node: Expr) -> bool:
    return isinstance(node, Call) and node.op.name == END


def is_annotation(node: Expr) -> bool:
    return isinstance(node, Call) and node.op.name in (BEGIN, END)


@dataclass
class Region:
    """One region: its ``compiler``, member calls (``nodes``, producers first), the begin
    annotations its members read (``ins``) and the end annotations of its results (``outs``)."""

    rid: int
    compiler: str
    nodes: list[Expr] = field(default_factory=list)
    ins: list[Call] = field(default_factory=list)
    outs: list[Call] = field(default_factory=list)


@dataclass
class RegionSet:
    """The regions of a function, and the order and users of its nodes."""

    regions: list[Region]
    region_of: dict[int, Region]  # member uid → region
    order: list[Expr]
    position: dict[int, int]
    users: dict[int, list[Expr]]


def annotated_regions(func: Function) -> RegionSet:
    """Find the regions of ``func`` (see the module doc), ordered by their first member.

    Raises
    ------
    CompileError
        If one region is annotated for two compilers, or a begin annotation feeds an op that is
        not in a region (malformed annotations).
    """
    order = list(post_order(func.outputs))
    position = {n.uid: i for i, n in enumerate(order)}
    users = consumers(func.outputs)
    by_uid = {n.uid: n for n in order}

    def member_like(n: Expr) -> bool:
        return isinstance(n, CALL_NODES) and not is_annotation(n)

    compiler_of: dict[int, str] = {}
    for n in order:
        if is_begin(n):
            for u in users.get(n.uid, []):
                if not member_like(u):
                    raise CompileError(f"annotation: compiler_begin feeds {u!r}, not an op")
                _seed(compiler_of, u, n.attrs["compiler"])
        elif is_end(n) and member_like(n.args[0]):
            _seed(compiler_of, n.args[0], n.attrs["compiler"])
    # Members reach each other through direct edges: grow each seed over them.
    parent: dict[int, int] = {}

    def find(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    stack = list(compiler_of)
    for u in stack:
        parent[u] = u
    while stack:
        u = stack.pop()
        node = by_uid[u]
        neighbours = [a for a in node.args if member_like(a)]
        neighbours += [c for c in users.get(u, []) if member_like(c)]
        for v in neighbours:
            if v.uid not in parent:
                parent[v.uid] = v.uid
                stack.append(v.uid)
            ru, rv = find(u), find(v.uid)
            if ru != rv:
                parent[rv] = ru
    regions: dict[int, Region] = {}
    region_of: dict[int, Region] = {}
    for n in order:
        if n.uid not in parent:
            continue
        root = find(n.uid)
        region = regions.get(root)
        if region is None:
            region = regions[root] = Region(len(regions), "")
        region.nodes.append(n)
        region_of[n.uid] = region
    for n in order:
        if is_begin(n):
            for u in users.get(n.uid, []):
                r = region_of[u.uid]
                if all(b is not n for b in r.ins):
                    r.ins.append(n)
        elif is_end(n) and n.args[0].uid in region_of:
            region_of[n.args[0].uid].outs.append(n)
    for r in regions.values():
        names = {b.attrs["compiler"] for b in (*r.ins, *r.outs)}
        if len(names) != 1:
            raise CompileError(f"annotation: region of {r.nodes[0]!r} is annotated for "
                               f"{sorted(names) or 'no compiler'}")
        r.compiler = names.pop()
    return RegionSet(list(regions.values()), region_of, order, position, users)


def _seed(compiler_of: dict[int, str], node: Expr, compiler: str) -> None:
    seen = compiler_of.setdefault(node.uid, compiler)
    if seen != compiler:
        raise CompileError(f"annotation: {node!r} is annotated for both {seen} and {compiler}")
