"""GEMM-shaped composites shared by the built-in backends: an anchor (``nn.conv2d``,
``nn.dense`` or ``nn.matmul``) followed by an optional per-channel bias, an optional residual
add and an optional activation — the fused "conv + bias + relu" of every vendor library (TVM's
DNNL pattern table, python/tvm/relay/op/contrib/dnnl.py, has the same shape).

:func:`gemm_patterns` builds the pattern-table entries; :func:`parse` reads a composite body (or
a matched root) back into a :class:`GemmComposite` that a codegen turns into one library call
plus an epilogue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kiln.relay.graph import Call, Expr, TensorType
from kiln.relay.pattern import Pattern, is_op, wildcard

ANCHORS = ("nn.conv2d", "nn.dense", "nn.matmul")
#: activation op → the name used in composite names
ACTIVATIONS = {"nn.relu": "relu", "clip": "clip", "hardswish": "hardswish"}


@dataclass
class GemmComposite:
    """One parsed composite. ``*_arg`` are the body's leaves (composite parameters)."""

    anchor: Call
    data_arg: Expr
    weight_arg: Expr
    bias_arg: Expr | None = None
    residual_arg: Expr | None = None
    activation: Call | None = None

    @property
    def kind(self) -> str:
        """``conv2d``, ``dense``, ``matmul`` (2-D) or ``batch_matmul`` (batched)."""
        op = self.anchor.op.name.split(".", 1)[1]
        if op == "matmul" and self.anchor.checked_type.ndim > 2:
            return "batch_matmul"
        return op

    @property
    def out_type(self) -> TensorType:
        return self.anchor.checked_type

    def channels(self) -> tuple[int, int, int]:
        """The output as ``(outer, channels, inner)`` around the bias axis."""
        shape = self.out_type.shape
        if self.kind == "conv2d":
            return shape[0], shape[1], shape[2] * shape[3]
        outer = 1
        for d in shape[:-1]:
            outer *= d
        return outer, shape[-1], 1


def _is_bias(anchor_kind: str, out: TensorType, op: Call, leaf: Expr) -> bool:
    t = leaf.checked_type
    if t.dtype != out.dtype:
        return False
    ch = out.shape[1] if anchor_kind == "conv2d" else out.shape[-1]
    if op.op.name == "nn.bias_add":
        axis = op.attrs["axis"] % out.ndim
        return t.shape == (ch,) and axis == (1 if anchor_kind == "conv2d" else out.ndim - 1)
    if anchor_kind == "conv2d":
        return t.shape in ((ch, 1, 1), (1, ch, 1, 1))
    return t.shape in ((ch,), (1, ch)) and out.ndim == 2


def parse(root: Expr) -> GemmComposite | None:
    """Read ``act(add(add(anchor(x, w), bias), residual))`` (each step optional, bias and
    residual in either order) from ``root``; None when ``root`` is not of that form."""
    node = root
    act = None
    if isinstance(node, Call) and node.op.name in ACTIVATIONS:
        act, node = node, node.args[0]
    adds: list[tuple[Call, Expr]] = []
    while isinstance(node, Call) and node.op.name in ("add", "nn.bias_add") and len(adds) < 2:
        a, b = node.args
        chain, leaf = (a, b) if _leads_to_anchor(a) else (b, a)
        if node.op.name == "nn.bias_add" and chain is not a:
            return None
        adds.append((node, leaf))
        node = chain
    if not isinstance(node, Call) or node.op.name not in ANCHORS:
        return None
    comp = GemmComposite(node, node.args[0], node.args[1], activation=act)
    kind = comp.kind
    for op, leaf in reversed(adds):
        if comp.bias_arg is None and _is_bias(kind, comp.out_type, op, leaf):
            comp.bias_arg = leaf
        elif (comp.residual_arg is None and op.op.name == "add"
              and leaf.checked_type == comp.out_type):
            comp.residual_arg = leaf
        else:
            return None
    return comp


def _leads_to_anchor(e: Expr) -> bool:
    while isinstance(e, Call):
        if e.op.name in ANCHORS:
            return True
        if e.op.name not in ("add", "nn.bias_add") + tuple(ACTIVATIONS):
            return False
        e = e.args[0]
    return False


def gemm_patterns(compiler: str, anchors: Iterable[str], activations: Iterable[str],
                  residual: bool, check: Callable[[GemmComposite], bool]) -> list[tuple]:
    """Pattern-table entries ``(f"{compiler}.{kind}[_bias][_add][_act]", pattern, check)``,
    largest first, for every combination of the optional steps (``kind``: ``conv2d``,
    ``dense``, ``matmul`` or ``batch_matmul``; ``_add`` is the residual, conv2d only).

    ``check(composite)`` decides what the backend takes (dtype, groups, ...); entries also
    require that :func:`parse` reads the match back (a bias of the right shape, a residual of
    the output's type).
    """
    def accepts(kind: str) -> Callable[[Expr], bool]:
        def accept(root: Expr) -> bool:
            comp = parse(root)
            return comp is not None and comp.kind == kind and check(comp)
        return accept

    entries = []
    acts = list(activations)
    for anchor in anchors:
        short = anchor.split(".", 1)[1]
        # nn.matmul gives two composites: 2-D "matmul" and batched "batch_matmul"
        for kind in (("batch_matmul", "matmul") if short == "matmul" else (short,)):
            for with_bias in (True, False):
                for with_res in ((True, False) if residual and anchor == "nn.conv2d"
                                 else (False,)):
                    for act in [*acts, None]:
                        name = (kind + ("_bias" if with_bias else "")
                                + ("_add" if with_res else "")
                                + (f"_{ACTIVATIONS[act]}" if act else ""))
                        entries.append((f"{compiler}.{name}",
                                        _pattern(anchor, with_bias, with_res, act),
                                        accepts(kind)))
    # larger composites first (stable): the table is applied in order
    entries.sort(key=lambda e: -e[0].split(".", 1)[1].replace("batch_", "").count("_"))
    return entries


def _pattern(anchor: str, with_bias: bool, with_res: bool, act: str | None) -> Pattern:
    p: Pattern = is_op(anchor)(wildcard(), wildcard())
    if with_bias:
        b = wildcard()
        p = is_op("nn.bias_add")(p, b) | is_op("add")(p, b)
    if with_res:
        r = wildcard()
        p = is_op("add")(p, r) | is_op("add")(r, p)
    if act is not None:
        p = is_op(act)(p)
    return p
