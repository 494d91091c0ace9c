"""FuseAttention: the scaled dot-product attention chain of an exported encoder → ``nn.attention``.

Matches, at the output of the second product::

    nn.matmul(nn.softmax(add(divide(nn.matmul(q, kt), c), mask), axis=-1), v)

with the divide also a ``multiply`` by ``c`` (or absent) and the ``add`` of the mask optional
(either operand order), ``q`` ``[B, H, S, D]``, ``kt`` ``[B, H, D, T]``, ``v`` ``[B, H, T, E]``
(all rank 4, batch and heads equal: no broadcast of the operands), ``c`` a scalar constant,
``mask`` broadcastable to ``[B, H, S, T]`` — and rewrites it to
``nn.attention(q, kt, v, mask; scale)`` (kiln.relay.op.attention). Every intermediate must have
the next step as its only user (the scores are not needed elsewhere), and the keys a static
count (where the fused kernel measured faster; SYMBOLIC_KEYS). The division becomes a
multiplication by ``1 / c``, as onnxruntime's attention fusion does (its FusedMatMul ``alpha``).

Runs before FuseOps (kiln.driver.build_module). Source of the pattern: BERT-style ONNX exports
(paraphrase-MiniLM-L3-v2's three layers); docs/decisions/025-fused-attention.md.
"""

from __future__ import annotations

import numpy as np

from kiln.relay.graph import Call, Constant, Expr, Function, consumers, rewrite, same_call
from kiln.relay.op_registry import get_op

name = "FuseAttention"
#: most keys (a static count) for which the chain is fused; None: any static count. The
#: fused kernel computes blocks of four query rows (each loaded key and value row serves the
#: block) with a shorter exp; measured against the separate kernels (1 thread, 12 heads of 32,
#: thread CPU time, docs/decisions/025): 0.67-0.85 of their time from 16 to 384 keys. (One
#: query row at a time it was slower past 64 keys: 128 keys 708 vs 640 us.) The bound keeps
#: the block's row buffers, on the stack of each thread (a few of 4 rows x keys x 4 bytes),
#: under a few hundred KiB: past it the separate kernels run.
MAX_KEYS: int | None = 4096
#: whether a symbolic key count (the VM) is fused too: its row buffers are not static (the
#: kernel allocates them per block of rows), measured slower than the separate kernels on the
#: VM (128 tokens: 1.56 vs 1.24 ms; 32: 177 vs 160 us)
SYMBOLIC_KEYS = False


def _is(e: Expr, op: str) -> bool:
    return isinstance(e, Call) and e.op.name == op


def _scalar(e: Expr) -> float | None:
    if isinstance(e, Constant) and not e.is_symbolic and e.data.size == 1 \
            and e.data.dtype.kind == "f":
        return float(e.data.reshape(()))
    return None


def _match(call: Call, users: dict) -> tuple[list[Expr], float] | None:
    """``([q, kt, v, mask], scale)`` of the chain ending at ``nn.matmul`` ``call`` (the
    original graph's nodes), or None."""
    probs, v = call.args
    if not _is(probs, "nn.softmax") or probs.attrs["axis"] % 4 != 3 \
            or len(probs.checked_type.shape) != 4:
        return None
    chain = [probs]
    x = probs.args[0]
    dtype = call.checked_type.dtype
    mask: Expr = Constant(np.zeros((), dtype))
    if _is(x, "add"):
        a, b = x.args
        scores_first = _is(a, "nn.matmul") or _is(a, "divide") or _is(a, "multiply")
        x, mask = (a, b) if scores_first else (b, a)
        chain.append(probs.args[0])
    scale = 1.0
    if _is(x, "divide") or _is(x, "multiply"):
        c = _scalar(x.args[1])
        if c is None or (x.op.name == "divide" and c == 0):
            return None
        scale = 1.0 / c if x.op.name == "divide" else c
        chain.append(x)
        x = x.args[0]
    if not _is(x, "nn.matmul"):
        return None
    chain.append(x)
    q, kt = x.args
    if any(len(users.get(n.uid, ())) != 1 for n in chain):
        return None
    if mask.checked_type.dtype != dtype or any(t.checked_type.dtype != dtype for t in (q, kt, v)):
        return None
    types = [t.checked_type for t in (q, kt, v, mask)]
    try:
        out = get_op("nn.attention").infer(types, {"scale": scale})
    except Exception:  # noqa: BLE001 - any shape the op refuses: leave the chain as it is
        return None
    keys = kt.checked_type.shape[3]
    if out.shape != call.checked_type.shape:
        return None
    if not isinstance(keys, int) and not SYMBOLIC_KEYS:
        return None
    if isinstance(keys, int) and MAX_KEYS is not None and keys > MAX_KEYS:
        return None
    return [q, kt, v, mask], scale


def fuse_attention(func: Function) -> Function:
    """``func`` with every matched attention chain (module docstring) as ``nn.attention``."""
    users = consumers(func.outputs)
    new: dict[int, Expr] = {}  # original call -> its rewrite

    def visit(call: Call, args: list[Expr]) -> Expr:
        found = _match(call, users) if call.op.name == "nn.matmul" else None
        if found is None:
            out = same_call(call, args)
        else:
            operands, scale = found
            out = Call("nn.attention", [new.get(e.uid, e) for e in operands], {"scale": scale},
                       call.span)
        new[call.uid] = out
        return out

    return rewrite(func, visit)


fuse_attention.name = name  # type: ignore[attr-defined]
