"""The executor features on a real compiled model (squeezenet, light zoo graph with random
weights), exported and loaded back: executors in two threads from one factory, zero-copy I/O, and
the debug executor — all against onnxruntime."""

from __future__ import annotations

import json
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import kiln
import kiln.runtime as rt
from kiln import models
from kiln.debug_executor import GraphModuleDebug
from kiln.frontend import from_onnx
from kiln.graph_executor import GraphModule

pytestmark = pytest.mark.xdist_group("executor-squeezenet")
INPUT, SHAPE = "data_0", (1, 3, 224, 224)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    """The project's model tolerance: max abs error <= 1e-4 * max|reference| + 1e-5."""
    assert got.shape == want.shape and got.dtype == want.dtype
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    assert err <= 1e-4 * float(np.max(np.abs(want))) + 1e-5, err


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory):
    """(loaded factory, {seed: (input, onnxruntime output)})."""
    model = models.randomize_weights(onnx.load(models.light_model_path("squeezenet")), seed=7)
    mod, params = from_onnx(model, shape={INPUT: SHAPE})
    path = tmp_path_factory.mktemp("sq") / "squeezenet.so"
    kiln.build(mod, target="c", params=params).export_library(str(path))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    refs = {}
    for seed in (1, 2, 3, 4):
        x = np.random.default_rng(seed).standard_normal(SHAPE).astype("float32")
        refs[seed] = (x, sess.run(None, {INPUT: x})[0])
    return rt.load_module(str(path)), refs


def test_two_threads_one_factory(squeezenet):
    factory, refs = squeezenet
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def body(seeds):
        try:
            gm = GraphModule(factory["default"](rt.cpu()))
            barrier.wait()
            for seed in seeds:
                gm.run(**{INPUT: refs[seed][0]})
                got[seed] = gm.get_output(0).numpy()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.append(err)

    threads = [threading.Thread(target=body, args=(s,)) for s in ((1, 2), (3, 4))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for seed, (_, want) in refs.items():
        assert_close(got[seed], want)


def test_zero_copy_io(squeezenet):
    factory, refs = squeezenet
    gm = GraphModule(factory["default"](rt.cpu()))
    shapes, dtypes = gm.get_output_info()
    (name, shape), = shapes.items()
    x, out = rt.empty(SHAPE), rt.empty(shape, dtypes[name])
    gm.set_input_zero_copy(INPUT, x)
    gm.set_output_zero_copy(name, out)
    for seed in (1, 2):
        x.copyfrom(refs[seed][0])
        gm.run()
        assert_close(out.numpy(), refs[seed][1])


def test_debug_executor_on_exported_library(squeezenet, tmp_path):
    factory, refs = squeezenet
    dbg = GraphModuleDebug(factory["debug_create"]("default", rt.cpu()), dump_root=tmp_path)
    report = dbg.run(repeat=2, **{INPUT: refs[1][0]})
    n_ops = sum(1 for n in json.loads(factory["get_graph_json"]())["nodes"]
                if n["op"] == "tvm_op")
    assert len(report.nodes) == n_ops and report.total_us > 0
    assert_close(dbg.get_output(0).numpy(), refs[1][1])
    table = report.table(top=5).splitlines()
    assert any("conv2d" in line for line in table[2:7])  # the convolutions dominate
    manifest = json.loads((tmp_path / "nodes.json").read_text())
    last = np.load(tmp_path / manifest[-1]["files"][0])
    assert_close(last.reshape(refs[1][1].shape), refs[1][1])
    assert len(manifest) == n_ops + 1  # the input, then every node


def test_dump_onnx_tensors_match_onnxruntime(squeezenet, tmp_path):
    """``onnx_tensors.npz`` holds squeezenet's intermediate tensors by ONNX name in NCHW, equal
    to onnxruntime's values of the same names (the model's outputs extended to them); the
    conv-of-concat SplitConcat turns into a sum of two conv kernels names no partial sum."""
    factory, refs = squeezenet
    dbg = GraphModuleDebug(factory["debug_create"]("default", rt.cpu()), dump_root=tmp_path)
    dbg.run(**{INPUT: refs[2][0]})
    with np.load(tmp_path / "onnx_tensors.npz") as z:
        got = {k: z[k] for k in z.files}
    model = models.randomize_weights(onnx.load(models.light_model_path("squeezenet")), seed=7)
    produced = {o for n in model.graph.node for o in n.output}
    assert set(got) - {INPUT} <= produced and len(got) > 20
    heads = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in sorted(got)
                              if n not in heads and n != INPUT)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {INPUT: refs[2][0]})))
    for name in set(got) - {INPUT}:
        assert_close(got[name], want[name])
