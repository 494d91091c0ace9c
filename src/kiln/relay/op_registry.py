"""The registry of graph operators (``OpDef``): type relation, pattern kind, numpy reference,
compute.

An op is registered once with :func:`register_op` (in ``kiln.relay.op.*``: its type relation,
fusion pattern and numpy reference) and gets its loop-level compute definition from
``kiln.topi`` (``kiln.topi.registry.register_compute``). Tests list the registry with
:func:`list_ops`.

Pattern kinds follow TVM's ``relay.op.OpPattern`` (include/tvm/relay/op_attr_types.h).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from kiln.errors import CompileError


class OpPattern(IntEnum):
    """Fusion pattern kinds, TVM's numbering: lower fuses more freely."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    OPAQUE = 8


@dataclass
class OpDef:
    """One graph op.

    Attributes
    ----------
    name : relay-style name ("nn.conv2d", "add", ...).
    infer : ``(arg_types: list[TensorType], attrs: dict) -> TensorType``; raises ShapeError.
    pattern : fusion pattern kind.
    ref : numpy reference ``(*arrays, **attrs) -> np.ndarray``; the executable definition used by
        FoldConstant and as a test oracle.
    compute : ``(inputs: list[te.Tensor], attrs, out_type) -> te.Tensor`` (set by kiln.topi).
    runtime : run by the VM executor itself (a builtin over its registers and shape heap:
        a view that refines a shape, an error raised in a branch), never compiled into a
        kernel; FuseOps leaves such calls as they are, and the graph executor cannot run them.
    """

    name: str
    infer: Callable[..., Any]
    pattern: OpPattern
    ref: Callable[..., Any]
    runtime: bool = False

    @property
    def compute(self) -> Callable[..., Any] | None:
        from kiln.topi.registry import get_compute

        return get_compute(self.name)

    def __reduce__(self):
        # by name: a graph function (a tuning task's kernel) pickles into another process,
        # which finds the same registered op (its infer / ref are lambdas)
        return (get_op, (self.name,))


_OPS: dict[str, OpDef] = {}


def register_op(name: str, infer: Callable[..., Any], pattern: OpPattern,
                ref: Callable[..., Any], runtime: bool = False) -> OpDef:
    """Register graph op ``name``. Registering a name twice is a programming error."""
    assert name not in _OPS, f"op {name} registered twice"
    _OPS[name] = OpDef(name, infer, pattern, ref, runtime)
    return _OPS[name]


def get_op(name: str) -> OpDef:
    """Look up op ``name``; an unknown name raises CompileError."""
    _load_all()
    try:
        return _OPS[name]
    except KeyError:
        raise CompileError(f"unknown graph op '{name}'") from None


def list_ops() -> list[str]:
    """Names of every registered graph op, sorted."""
    _load_all()
    return sorted(_OPS)


_loaded = False


def _load_all() -> None:
    # Op definitions and computes register themselves on import; import them lazily so that
    # kiln.relay.graph stays importable on its own.
    global _loaded
    if _loaded:
        return
    _loaded = True
    import kiln.relay.op  # noqa: F401
