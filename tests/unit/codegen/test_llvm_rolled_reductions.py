"""A min / max reduction over several axes left scalar (its rows too short for the vectorized
partial results of :func:`kiln.schedules.reduce_rfactor.vectorize_reductions`) keeps its row
loop rolled in LLVM (``llvm.loop.unroll.disable``): each update waits for the previous one, so
unrolling gains nothing, and LLVM's optimizer took minutes over 8 rows of 32 unrolled
(openWakeWord's ReduceMax over its [1, 1, 8, 32] log-mel frames: the static melspectrogram
build, 690 s of wall time on a busy machine)."""

from __future__ import annotations

import re

import pytest

from kiln.backend.te_compiler import to_te
from kiln.codegen.llvm.build import codegen_ir
from kiln.driver.build_module import optimize
from kiln.relay.graph import Call, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.schedules import schedule_loops, schedule_te
from kiln.target import Target
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.make_packed_api import make_packed_api
from kiln.tir.transform.simplify import simplify

AVX512 = "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"


def _reduction_ir(op: str, shape: tuple, axis: tuple, dtype: str = "float32") -> str:
    """The LLVM IR (before optimization) of ``op`` over ``axis`` of ``shape``."""
    x = Var("x", TensorType(shape, dtype))
    func = optimize(Function([x], [Call(op, [x], {"axis": axis, "keepdims": False})]), {})
    (call,) = [c for c in post_order(func.outputs) if isinstance(c, PrimitiveCall)]
    target = Target(AVX512)
    with target:
        inputs, output = to_te(call.body)
        kernel = schedule_loops(simplify(lower(schedule_te(Schedule(output)), inputs, "k")))
        return codegen_ir([make_packed_api(kernel)], target)


def _rolled_loops(ir: str) -> set[str]:
    """Names of the loops whose back edge carries ``llvm.loop.unroll.disable``."""
    disable = {m.group(1) for m in re.finditer(
        r'^!(\d+) = !\{ !"llvm.loop.unroll.disable" \}', ir, re.M)}
    ids = {m.group(1) for m in re.finditer(r"^!(\d+) = !\{ !\1, !(\d+) \}", ir, re.M)
           if m.group(2) in disable}
    return {m.group(1) for m in re.finditer(r'br label %"([\w.]+)\.head", !llvm.loop !(\d+)', ir)
            if m.group(2) in ids}


@pytest.mark.parametrize("op", ["max", "min"])
def test_a_scalar_min_max_chain_stays_rolled(op):
    rolled = _rolled_loops(_reduction_ir(op, (1, 1, 8, 32), (0, 1, 2, 3)))
    assert len(rolled) == 1 and next(iter(rolled)).endswith("_r3"), rolled  # the row loop


def test_other_reductions_are_left_to_llvm():
    """A sum is not a min / max chain, and a chain over one axis (one row a result, as
    softmax's max) did not trouble LLVM: they are emitted as before."""
    assert _rolled_loops(_reduction_ir("sum", (1, 1, 8, 32), (0, 1, 2, 3))) == set()
    assert _rolled_loops(_reduction_ir("max", (4, 20), (1,))) == set()
    assert _rolled_loops(_reduction_ir("max", (20,), (0,))) == set()
