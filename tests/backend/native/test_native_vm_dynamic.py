"""The C VM's data-dependent builtins (decision 016, src/kiln/native/src/rt_vm_dynamic.c):
single-op ONNX models with NonZero, TopK (a data ``k``), Compress (a data condition),
Reshape, Expand, Tile and Slice (a data shape, repeats or bounds) run by
``kiln_run`` under ASan + UBSan, each result equal to the Python VM's on the same file and to
onnxruntime's, empty results included; a ``k`` outside the axis is an error naming TopK;
Range (scalar bounds) and ConstantOfShape through the C API."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from backend_helpers import run_onnxruntime
from onnx import TensorProto, helper
from test_native_vm import _export, kiln_run_vm, run_vm_fuzz
from test_native_vm_kv import CVM
from test_vm_data_dependent import _model

import kiln
from kiln.vm import VirtualMachine

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(3)


def _sparse(shape, dtype="float32"):
    return (RNG.integers(-3, 4, shape) * (RNG.random(shape) < 0.4)).astype(dtype)


def _topk(axis, largest, dtype=F, shape=(3, 5)):
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis,
                            largest=largest)
    return _model([node], [("x", dtype, list(shape)), ("k", I64, [1])],
                  [("values", dtype), ("indices", I64)])


def _compress(axis):
    n = 12 if axis is None else 4
    attrs = {} if axis is None else {"axis": axis}
    return _model([helper.make_node("Compress", ["x", "c"], ["y"], **attrs)],
                  [("x", F, [3, 4]), ("c", B, [n])], ["y"])


X35 = RNG.integers(0, 4, (3, 5)).astype("float32")  # ties: the lower index first
X34 = RNG.standard_normal((3, 4)).astype("float32")
X26 = RNG.standard_normal((2, 6)).astype("float32")
CASES = {
    "nonzero_f32": (_model([helper.make_node("NonZero", ["x"], ["y"])], [("x", F, [3, 5])],
                           [("y", I64)]),
                    [{"x": _sparse((3, 5))}, {"x": np.zeros((3, 5), "float32")},
                     {"x": np.ones((3, 5), "float32")}]),
    "nonzero_i64_rank3": (_model([helper.make_node("NonZero", ["x"], ["y"])],
                                 [("x", I64, [2, 3, 4])], [("y", I64)]),
                          [{"x": _sparse((2, 3, 4), "int64")}]),
    "topk_largest": (_topk(1, 1), [{"x": X35, "k": np.array([k])} for k in (2, 0, 5)]),
    "topk_smallest": (_topk(1, 0), [{"x": X35, "k": np.array([k])} for k in (3, 5)]),
    "topk_i64_axis0": (_topk(0, 1, I64, (4, 3)),
                       [{"x": RNG.integers(-9, 9, (4, 3)), "k": np.array([3])}]),
    "compress_flat": (_compress(None), [{"x": X34, "c": RNG.random(12) < 0.5},
                                        {"x": X34, "c": np.zeros(12, bool)}]),
    "compress_axis1": (_compress(1), [{"x": X34, "c": np.array([1, 0, 1, 1], bool)},
                                      {"x": X34, "c": np.ones(4, bool)}]),
    "reshape": (_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [("x", F, [2, 6]), ("shape", I64, [3])], ["y"]),
                [{"x": RNG.standard_normal((2, 6)).astype("float32"), "shape": np.array(v)}
                 for v in ([2, 0, -1], [-1, 4, 1], [12, 1, 1])]),
    "expand": (_model([helper.make_node("Expand", ["e", "shape"], ["y"])],
                      [("e", F, [3, 1]), ("shape", I64, [3])], ["y"]),
               [{"e": RNG.standard_normal((3, 1)).astype("float32"), "shape": np.array(v)}
                for v in ([2, 3, 4], [1, 1, 1], [3, 3, 1])]),
    "tile": (_model([helper.make_node("Tile", ["x", "reps"], ["y"])],
                    [("x", I64, [2, 3]), ("reps", I64, [2])], [("y", I64)]),
             [{"x": RNG.integers(-9, 9, (2, 3)), "reps": np.array(v)}
              for v in ([2, 1], [1, 3], [0, 2])]),
    "slice": (_model([helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])],
                     [("x", F, [2, 6])] + [(n, I64, [1]) for n in ("starts", "ends", "axes",
                                                                      "steps")], ["y"]),
              [{"x": X26, **{n: np.array([v]) for n, v in zip(("starts", "ends", "axes", "steps"),
                                                             sl)}}
               for sl in ((1, 5, 1, 2), (-1, -7, 1, -1), (0, 1, 0, 1), (10, -100, 1, -3),
                          (-100, 100, 0, 1), (0, 6, -1, 4), (3, 3, 1, 1), (2, 4, 1, -1))]),
}


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dyn")
    return {name: _export(model, "c", folder / f"{name}.so") for name, (model, _) in
            CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_builtin_matches_python_vm_and_onnxruntime(name, libraries, native_rt_asan, tmp_path):
    model, cases = CASES[name]
    vm = VirtualMachine(kiln.runtime.load_module(str(libraries[name])), kiln.cpu())
    for inputs in cases:
        py = vm["main"](*inputs.values())
        py = [t.numpy() for t in (py if isinstance(py, tuple) else (py,))]
        got, _ = kiln_run_vm(native_rt_asan / "kiln_run", libraries[name], inputs, py, tmp_path,
                             repeat=2)
        want = run_onnxruntime(model, inputs)
        for g, p, w in zip(got, py, want, strict=True):
            assert g.shape == p.shape == np.asarray(w).shape
            np.testing.assert_array_equal(g, p)
            np.testing.assert_array_equal(g, w)


BAD_INPUTS = {
    "topk_largest": ({"x": np.ones((3, 5), np.float32), "k": np.array([6])},
                     "TopK: k = 6 is outside [0, 5] (axis 1 of [3, 5])"),
    "reshape": ({"x": np.ones((2, 6), np.float32), "shape": np.array([5, -1, 1])},
                "Reshape: cannot infer -1 in [5, -1, 1] for 12 elements"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_data_is_an_error_naming_the_op(name, libraries, native_rt, tmp_path):
    inputs, message = BAD_INPUTS[name]
    cmd = [str(native_rt / "kiln_run"), str(libraries[name])]
    for key, a in inputs.items():
        cmd += ["--shape", f"{key}={'x'.join(map(str, a.shape))}"]
    for key, a in inputs.items():
        a.tofile(tmp_path / f"{key}.bin")
        cmd.append(str(tmp_path / f"{key}.bin"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert message in proc.stderr


@pytest.mark.parametrize("name", ["topk_largest", "compress_axis1"])
def test_damaged_executables_under_sanitizers(name, libraries, native_vm_drivers, tmp_path):
    """The VM fuzz of test_native_vm.py over these executables (their builtins' static
    arguments damaged too): no crash, the damage is an error."""
    run_vm_fuzz(native_vm_drivers, libraries[name], tmp_path, 150)


@pytest.mark.parametrize("dtype", ["int64", "float32"])
def test_range_and_constant_of_shape(dtype, native_rt, tmp_path):
    """``Range(s, l, d)`` and ``ConstantOfShape(Shape... = [2, n])`` over data, by the C VM
    (the C API) vs the Python VM and onnxruntime; a zero delta is an error naming Range."""
    code = I64 if dtype == "int64" else F
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["y"]),
             helper.make_node("ConstantOfShape", ["cshape"], ["c"],
                              value=helper.make_tensor("v", code, [1], [7]))]
    model = _model(nodes, [("s", code, []), ("l", code, []), ("d", code, []),
                           ("cshape", I64, [2])], [("y", code), ("c", code)])
    so = _export(model, "c", tmp_path / "range.so")
    vm = VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())
    cvm = CVM(native_rt / "libkiln_runtime.so", so)
    bounds = [(0, 10, 3), (5, 1, -1), (4, 2, 1), (-3, 3, 2)] + (
        [(1, 2, 0.25), (0, 1, 0.3)] if dtype == "float32" else [])
    for k, (s, lim, d) in enumerate(bounds):
        inputs = [np.array(v, dtype) for v in (s, lim, d)] + [np.array([2, k], np.int64)]
        got = cvm.run(inputs)
        py = [t.numpy() for t in vm["main"](*inputs)]
        want = run_onnxruntime(model, dict(zip(["s", "l", "d", "cshape"], inputs)))
        for g, p, w in zip(got, py, want, strict=True):
            assert g.dtype == p.dtype and g.shape == p.shape == w.shape
            np.testing.assert_array_equal(g, p)
            np.testing.assert_array_equal(g, w)
    with pytest.raises(RuntimeError, match="Range: delta is 0"):
        cvm.run([np.array(v, dtype) for v in (0, 1, 0)] + [np.array([1, 1], np.int64)])
