"""Run-time loops and calls between VM functions in the native runtime's VM
(src/kiln/native/src/rt_vm*.c): ONNX ``Loop`` models compiled for the VM — a data trip count and
condition (a backward ``goto``), scan
outputs stacked by the list builtins (``list_new``, ``list_append``, ``list_stack``) with the
count bound by ``bind_shape``, stacked outputs feeding kernels, loops that run no iteration —
exported once each, run by ``kiln_run`` (also under ASan + UBSan) vs the Python VM on the same
file and the ONNX references (tests/helpers/onnx_loops.py, the programs the Python VM's tests run);
hand-written executables calling VM functions (two calls of one callee, runaway recursion).
"""

from __future__ import annotations

import numpy as np
import onnx_loops
import pytest
from onnx.reference import ReferenceEvaluator
from test_native_json import SANITIZER_ENV
from test_native_vm import kiln_run_vm
from test_vm_control_flow import LOOP_CASES, _loop_model

import kiln
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine


def _loop_feeds():
    for shape, trips, cond in LOOP_CASES:
        yield {"x": np.full(shape, 0.5, "float32"), "M": np.array(trips, np.int64),
               "c0": np.array(cond)}


def _loop_check(model, feed, got):
    np.testing.assert_allclose(got[0], ReferenceEvaluator(model).run(None, feed)[0], rtol=1e-6)


MODELS = {
    "data_loop": (_loop_model, _loop_feeds, _loop_check),
    "trip_count": (onnx_loops.trip_count_model, onnx_loops.trip_count_feeds,
                   onnx_loops.check_references),
    "threshold": (onnx_loops.threshold_model, onnx_loops.threshold_feeds,
                  onnx_loops.check_references),
    "downstream": (onnx_loops.downstream_model, onnx_loops.downstream_feeds,
                   onnx_loops.check_references),
}


@pytest.fixture(scope="module")
def loop_libs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vm-loops")
    out = {}
    for name, (make, _, _) in MODELS.items():
        mod, params = from_onnx(make())
        path = folder / f"{name}.so"
        kiln.build(mod, target="c", params=params).export_library(str(path))
        out[name] = path
    return out


@pytest.mark.parametrize("build", ["native_rt", "native_rt_asan"], ids=["O2", "sanitizers"])
@pytest.mark.parametrize("name", list(MODELS))
def test_loops_match_the_python_vm(request, build, name, loop_libs, tmp_path):
    make, feeds, check = MODELS[name]
    model, so = make(), loop_libs[name]
    runner = request.getfixturevalue(build) / "kiln_run"
    vm = VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())
    for k, feed in enumerate(feeds()):
        res = vm["main"](*feed.values())
        py = [t.numpy() for t in (res if isinstance(res, (list, tuple)) else [res])]
        case = tmp_path / str(k)
        case.mkdir()
        got, _ = kiln_run_vm(runner, so, feed, py, case, repeat=1, env=SANITIZER_ENV)
        for g, p in zip(got, py):
            np.testing.assert_array_equal(g, p)  # the same kernels, so the same bits
        check(model, feed, got)


def _calls_exe(runaway: bool):
    """``main(x, y) -> (pair(x, y), pair(y, x))`` with ``pair(a, b) -> (a, b)``: two calls of
    one VM function whose tuples must stay apart; ``runaway``: main calls a function that
    calls itself without end."""
    from kiln.runtime.vm.bytecode import call, reg, ret
    from kiln.runtime.vm.executable import VMExecutable, VMFunction

    sig = [("x", "float32", [3]), ("y", "float32", [3])]
    main = ([*call(2, 3, [reg(0)]), *ret(2)] if runaway else
            [*call(2, 1, [reg(0), reg(1)]), *call(3, 1, [reg(1), reg(0)]),
             *call(4, 2, [reg(2), reg(3)]), *ret(4)])
    pair = [*call(2, 2, [reg(0), reg(1)]), *ret(2)]
    deep = [*call(1, 3, [reg(0)]), *ret(1)]
    a, b = len(main), len(main) + len(pair)
    return VMExecutable([], [VMFunction(1, "main", 0, a, 5, 0, params=sig),
                             VMFunction(1, "pair", a, b, 3, 0, params=sig),
                             VMFunction(0, "vm.builtin.make_tuple"),
                             VMFunction(1, "deep", b, b + len(deep), 2, 0, params=sig[:1])],
                        [], main + pair + deep)


def test_calls_between_vm_functions(native_rt_asan, tmp_path):
    so = tmp_path / "calls.so"
    _calls_exe(False).export_library(str(so))
    x, y = np.arange(3, dtype="float32"), np.arange(3, 6, dtype="float32")
    res = VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())["main"](x, y)
    py = [t.numpy() for pair in res for t in pair]
    got, _ = kiln_run_vm(native_rt_asan / "kiln_run", so, {"x": x, "y": y}, py, tmp_path,
                         repeat=2, env=SANITIZER_ENV)
    for g, want in zip(got, [x, y, y, x]):
        np.testing.assert_array_equal(g, want)
    runaway = tmp_path / "runaway.so"
    _calls_exe(True).export_library(str(runaway))
    with pytest.raises(Exception, match="more than 128 nested calls"):
        VirtualMachine(kiln.runtime.load_module(str(runaway)), kiln.cpu())["main"](x, y)
    with pytest.raises(AssertionError, match=r"more than 128 nested calls \(in 'deep'\)"):
        kiln_run_vm(native_rt_asan / "kiln_run", runaway, {"x": x, "y": y}, [x], tmp_path,
                    env=SANITIZER_ENV)
