"""MergeCompilerRegions: grow the regions of one compiler into larger ones (TVM:
src/relay/transforms/merge_compiler_regions.cc).

After AnnotateTarget every claimed op is a region of its own. Two regions of the same compiler
where one feeds the other (``compiler_begin(compiler_end(x))`` between them) merge, unless the
merge would create a dependency cycle: a path from the producer region to the consumer region
through anything else (Kiln's ops or another region) means the merged function would have to
run both before and after that thing. Candidates are visited producers first; the end → begin
pairs inside a merged region are removed (an end that other consumers still read stays for them).
"""

from __future__ import annotations

from kiln.relay.graph import CALL_NODES, Expr, Function, with_args
from kiln.relay.transform.annotated_regions import (
    RegionSet,
    annotated_regions,
    is_annotation,
    is_begin,
    is_end,
)

name = "MergeCompilerRegions"


def merge_compiler_regions(func: Function) -> Function:
    """Return ``func`` with adjacent same-compiler regions merged (see the module doc)."""
    rs = annotated_regions(func)
    parent = {r.rid: r.rid for r in rs.regions}
    members = {r.rid: {n.uid for n in r.nodes} for r in rs.regions}
    last = {r.rid: max(rs.position[n.uid] for n in r.nodes) for r in rs.regions}

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    def group(uid: int) -> int | None:
        r = rs.region_of.get(uid)
        return find(r.rid) if r is not None else None

    compiler = {r.rid: r.compiler for r in rs.regions}
    for node in rs.order:
        if not (is_begin(node) and is_end(node.args[0])):
            continue
        src = node.args[0].args[0]
        a = group(src.uid)
        if a is None or node.attrs["compiler"] != node.args[0].attrs["compiler"]:
            continue
        for user in rs.users.get(node.uid, []):
            a, b = find(a), group(user.uid)
            if b is None or a == b or compiler[a] != compiler[b]:
                continue
            if _reaches_indirectly(rs, members[a], members[b], last[b]):
                continue
            parent[b] = a
            members[a] |= members.pop(b)
            last[a] = max(last[a], last.pop(b))
    return _drop_inner_pairs(func, rs, group)


def _reaches_indirectly(rs: RegionSet, src: set[int], dst: set[int], dst_last: int) -> bool:
    """Whether a path leaves ``src`` and reaches ``dst`` through a node that is neither an
    annotation nor in ``src``/``dst`` (a merge would then make a cycle)."""
    seen: set[tuple[int, bool]] = set()
    stack: list[tuple[Expr, bool]] = []
    for uid in src:
        for u in rs.users.get(uid, []):
            stack.append((u, False))
    while stack:
        node, indirect = stack.pop()
        if (node.uid, indirect) in seen or rs.position[node.uid] > dst_last:
            continue  # producers come first: nothing after dst's last member leads back to it
        seen.add((node.uid, indirect))
        if node.uid in dst:
            if indirect:
                return True
            continue
        if node.uid in src:
            continue
        indirect = indirect or not is_annotation(node)
        for u in rs.users.get(node.uid, []):
            stack.append((u, indirect))
    return False


def _drop_inner_pairs(func: Function, rs: RegionSet, group) -> Function:
    memo: dict[int, Expr] = {}
    for node in rs.order:
        if not isinstance(node, CALL_NODES):
            memo[node.uid] = node
            continue
        g = group(node.uid) if not is_annotation(node) else None
        args = []
        for a in node.args:
            if (g is not None and is_begin(a) and is_end(a.args[0])
                    and group(a.args[0].args[0].uid) == g):
                args.append(memo[a.args[0].args[0].uid])
            else:
                args.append(memo[a.uid])
        memo[node.uid] = with_args(node, args)
    return Function(func.params, [memo[o.uid] for o in func.outputs], list(func.output_names),
                    dict(func.attrs))
