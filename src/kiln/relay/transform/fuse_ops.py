"""FuseOps: group operator calls into primitive functions, each compiled as one kernel.

A simplified form of TVM's src/relay/transforms/fuse_ops.cc, on its pattern kinds:
- an elementwise/broadcast consumer joins the group of its producer when that producer is an
  out-elementwise-fusable op (conv2d, dense, pooling) or a reduction, and has the same shape
  (conv + bias_add + relu, conv + residual add);
- injective ops chain with elementwise/broadcast/injective producers (reshape → transpose ...);
- a producer joins only if the consumer is its single user and it is not a function output
  (its value never needs to be materialized outside the group) — or, for a producer with
  several element-wise users, when their paths meet again at one node before anything else
  reads them (a diamond, as TVM finds with its post-dominator tree: GELU's
  ``x · (1 + erf(x / √2)) / 2`` over a dense's biased output): the whole diamond joins.
- a small injective side input of an out-elementwise-fusable group's epilogue (a vector or
  scalar computed at run time: a quantized dense's ``zp · colsum(w)`` and ``scale_a · scale_w``,
  docs/decisions/021) or a reshape of a tensor it adds (a residual), read by that epilogue only,
  joins the group too (TVM fuses such injective producers through its post-dominator tree):
  one kernel instead of several launches of a few elements each (:func:`_absorb_side_inputs`).
Scalar constants are kept inside the primitive functions (they become immediates in the kernel),
except the scales and zero points of quantize/dequantize: they differ in every layer of a
quantized network, and as kernel arguments they let layers of one shape share one kernel (a QDQ
ResNet-50 compiles 30 kernels instead of 58, as many as the float model).
External function calls (BYOC: ``FunctionCall`` with ``Compiler``, and their ``TupleGetItem``
outputs) and the VM's own ops (``OpDef.runtime``: ``match_cast``, ``trap``) are not fused: they
stay as they are, over the fused values of their arguments. A symbolic constant (a shape value
known at run time) is always a kernel argument, never an immediate.
"""

from __future__ import annotations

from kiln import arith
from kiln.relay.graph import (
    CALL_NODES,
    Call,
    Constant,
    Expr,
    Function,
    PrimitiveCall,
    Var,
    consumers,
    post_order,
    with_args,
)
from kiln.relay.op_registry import OpPattern

name = "FuseOps"
#: ops whose scalar constant operands (scale, zero point) stay kernel arguments
QNN_OPS = ("qnn.quantize", "qnn.dequantize")


class _Group:
    def __init__(self, node: Call):
        self.members = [node]
        self.kind = node.op.pattern
        #: members absorbed as side inputs: their scalar constants stay kernel arguments
        self.side: set[int] = set()

    @property
    def output(self) -> Call:
        return self.members[-1]


def _can_join(group: _Group, producer: Call, consumer: Call) -> bool:
    pattern = consumer.op.pattern
    if group.kind in (OpPattern.OUT_ELEMWISE_FUSABLE, OpPattern.COMM_REDUCE):
        return (pattern <= OpPattern.BROADCAST
                and consumer.checked_type.shape == producer.checked_type.shape)
    if group.kind <= OpPattern.INJECTIVE:
        return pattern <= OpPattern.INJECTIVE
    return False


#: most nodes of a diamond (:func:`_diamond`) that joins a group at once
DIAMOND_LIMIT = 16


def _diamond(producer: Call, users: dict, pinned: set[int],
             position: dict[int, int]) -> list[Call] | None:
    """The element-wise or broadcast nodes (of ``producer``'s shape) between ``producer`` and
    the one node where all paths from it meet, in post order, when every other node among them
    is read only by them and none is a function output; None when the paths do not meet within
    DIAMOND_LIMIT nodes. Other operands must come before ``producer`` in post order (so they
    cannot depend on it)."""
    region: dict[int, Call] = {}
    shape = producer.checked_type.shape
    while True:
        open_ = [n for n in (producer, *region.values())
                 if n.uid in pinned or any(u.uid not in region for u in users.get(n.uid, ()))]
        if len(open_) == 1 and open_[0] is not producer:
            break
        node = min(open_, key=lambda n: position[n.uid])
        if node.uid in pinned:
            return None
        for u in users.get(node.uid, ()):
            if not (isinstance(u, Call) and not u.op.runtime
                    and u.op.pattern <= OpPattern.BROADCAST
                    and u.checked_type.shape == shape):
                return None
            region[u.uid] = u
        if len(region) > DIAMOND_LIMIT:
            return None
    start = position[producer.uid]
    for n in region.values():
        for a in n.args:
            if not (a is producer or a.uid in region or isinstance(a, (Constant, Var))
                    or position[a.uid] < start):
                return None
    return sorted(region.values(), key=lambda n: position[n.uid])


#: op names that only reinterpret their input's shape (a side input made of them is absorbed
#: whatever its size: it adds no work, only index arithmetic in the epilogue)
RESHAPES = ("reshape", "squeeze", "expand_dims")


def _absorb_side_inputs(target: _Group, node: Call, group_of: dict, groups: list,
                        users: dict, pinned: set[int], position: dict[int, int]) -> None:
    """Move into ``target`` (an out-elementwise-fusable group that ``node`` joins) each group
    of injective ops whose output is one of ``node``'s other operands, read by ``node`` only,
    not a function output, and small (at most ``node``'s last extent elements) or made of
    reshapes only; its operands must all come before ``target``'s first member (so they
    cannot depend on the group)."""
    if target.kind != OpPattern.OUT_ELEMWISE_FUSABLE:
        return
    start = position[target.members[0].uid]
    shape = node.checked_type.shape
    for arg in node.args:
        side = group_of.get(arg.uid)
        if (side is None or side is target or arg is not side.output
                or len(users[arg.uid]) != 1 or arg.uid in pinned
                or side.kind > OpPattern.INJECTIVE):
            continue
        small = _provably_at_most(arg.checked_type.size, shape[-1] if shape else 1)
        if not (small or all(m.op.name in RESHAPES for m in side.members)):
            continue
        inside = {m.uid for m in side.members}
        outside = [a for m in side.members for a in m.args if a.uid not in inside]
        if _reads_group(outside, target, start, position):
            continue
        groups.remove(side)
        target.members.extend(side.members)
        target.side |= inside
        group_of.update((uid, target) for uid in inside)


def _provably_at_most(a, b) -> bool:
    """``a <= b`` for sizes that may be symbolic; False when the symbols' bounds do not decide
    it (absorbing a side input is an optimization: no is always safe)."""
    try:
        return arith.compare("less_equal", a, b)
    except arith.UndecidedError:
        return False


def _reads_group(exprs: list[Expr], group: _Group, start: int,
                 position: dict[int, int]) -> bool:
    """Whether any of ``exprs`` is or depends on a member of ``group`` (whose first member is
    at ``start`` in post order: nodes before it cannot depend on the group)."""
    members = {m.uid for m in group.members}
    stack, seen = list(exprs), set()
    while stack:
        e = stack.pop()
        if e.uid in members:
            return True
        if e.uid in seen or position.get(e.uid, -1) < start:
            continue
        seen.add(e.uid)
        stack.extend(getattr(e, "args", ()))
    return False


def fuse_ops(func: Function) -> Function:
    """Return ``func`` with every Call moved into a :class:`PrimitiveCall` of a fused group."""
    users = consumers(func.outputs)
    pinned = {o.uid for o in func.outputs}
    group_of: dict[int, _Group] = {}
    groups: list[_Group] = []
    position: dict[int, int] = {}
    opaque: list[Expr] = []  # external calls and their outputs, kept as they are
    approved: dict[int, _Group] = {}  # diamond members (_diamond) -> the group they join
    nodes = list(post_order(func.outputs))
    position.update((n.uid, k) for k, n in enumerate(nodes))
    for node in nodes:
        if not isinstance(node, Call) or node.op.runtime:
            if isinstance(node, CALL_NODES):
                opaque.append(node)
            continue
        target = approved.get(node.uid)
        if target is None and node.op.pattern <= OpPattern.INJECTIVE:
            for arg in node.args:
                g = group_of.get(arg.uid)
                if (g is not None and arg is g.output and len(users[arg.uid]) == 1
                        and arg.uid not in pinned and _can_join(g, arg, node)):
                    target = g
                    break
                if (g is not None and arg is g.output and len(users[arg.uid]) > 1
                        and isinstance(arg, Call) and node.op.pattern <= OpPattern.BROADCAST):
                    region = _diamond(arg, users, pinned, position)
                    # every member still ahead (one placed in a group of its own earlier
                    # would leave the producer read from outside its kernel)
                    if (region and region[0] is node
                            and all(_can_join(g, arg, r) for r in region)):
                        approved.update((r.uid, g) for r in region)
                        target = g
                        break
        if target is None:
            target = _Group(node)
            groups.append(target)
        else:
            _absorb_side_inputs(target, node, group_of, groups, users, pinned, position)
            target.members.append(node)
            target.kind = max(target.kind, node.op.pattern) \
                if target.kind <= OpPattern.INJECTIVE else target.kind
        group_of[node.uid] = target
    # Build groups (and rebuild opaque nodes) in the order of their outputs: every external input
    # of a group is then ready.
    units: list[_Group | Expr] = [*groups, *opaque]
    units.sort(key=lambda u: position[u.output.uid if isinstance(u, _Group) else u.uid])
    return _materialize(func, units)


def _materialize(func: Function, units: list[_Group | Expr]) -> Function:
    new: dict[int, Expr] = {}

    def outer(e: Expr) -> Expr:
        return new.get(e.uid, e)

    for g in units:
        if not isinstance(g, _Group):
            new[g.uid] = with_args(g, [outer(a) for a in g.args])
            continue
        member_ids = {m.uid for m in g.members}
        params: list[Var] = []
        args: list[Expr] = []
        inner: dict[int, Expr] = {}
        for m in g.members:
            for a in m.args:
                if a.uid in member_ids or a.uid in inner:
                    continue
                if isinstance(a, Constant) and a.checked_type.size == 1 and \
                        not a.is_symbolic and m.op.name not in QNN_OPS \
                        and m.uid not in g.side:
                    inner[a.uid] = a  # scalar immediates stay in the kernel
                    continue
                v = Var(f"p{len(params)}", a.checked_type)
                params.append(v)
                args.append(outer(a))
                inner[a.uid] = v
            inner[m.uid] = Call(m.op.name, [inner[a.uid] for a in m.args], m.attrs, m.span)
        body = Function(params, [inner[g.output.uid]])
        kernel = "fused_" + "_".join(m.op.name.replace(".", "_") for m in g.members)
        new[g.output.uid] = PrimitiveCall(body, args, kernel[:96])
    return Function(func.params, [outer(o) for o in func.outputs], func.output_names,
                    dict(func.attrs))
