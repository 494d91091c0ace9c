"""The support code's thread pool (``support/backend.c``, docs/decisions/020-thread-pool.md).

Its semantics through a small C harness (``pool_harness.c``) calling ``TVMBackendParallelLaunch``
and ``TVMBackendParallelBarrier`` directly: thread ids per task, many launches of every
``num_task``, barriers, nested launches (serial, on the task's own thread), a failing worker's
message reaching the caller, ``fork`` with workers running, a launch from a second thread
during one (serial), a second library in the same process (its own pool), and the team size from
``KILN_NUM_THREADS`` or the affinity mask. Then a small conv net, for the c and llvm targets, at 1
and 2 threads, equal to each other and to onnxruntime. Each setting runs in its own process
(the team is fixed at a library's first launch).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from backend_helpers import HELPERS, TARGETS, assert_close_to_reference, run_onnxruntime
from onnx import TensorProto, helper

import kiln
import kiln.runtime as rt
from kiln.frontend import from_onnx
from kiln.runtime.module import modules_dfs

HARNESS = HELPERS / "pool_harness.c"
FUNCS = ["pool_tids", "pool_stress", "pool_barrier", "pool_nested", "pool_fail", "pool_fork",
         "pool_concurrent"]
MAXT = 64

_POOL_SCRIPT = r"""
import json, sys
import numpy as np
import kiln.runtime as rt
from kiln.errors import KilnError
lib = rt.load_module(sys.argv[1])
out = {}
ids = rt.empty((65,), "int64")
team = lib["pool_tids"](ids, 0)
seen = set()
for _ in range(200):
    n = lib["pool_tids"](ids, 0)
    t = ids.numpy()
    assert n == team and t[1] == t[0], (n, team, t[:4])  # task 0 runs on the caller
    seen.update(int(x) for x in t[1:1 + n])
out["team"], out["distinct_threads"] = team, len(seen)
out["one_task"] = lib["pool_tids"](ids, 1)
out["over_team"] = lib["pool_tids"](ids, team + 5)
out["stress_bad"] = lib["pool_stress"](10000)
out["barrier_bad"] = lib["pool_barrier"]()
nest = rt.empty((4 * 64,), "int64")
n = lib["pool_nested"](nest)
rows = nest.numpy().reshape(64, 4)[:n]
out["nested"] = [n, rows[:, 0].tolist() == rows[:, 1].tolist(), rows[:, 2].tolist(),
                 rows[:, 3].tolist()]
msgs = []
for first in (team - 1, 0):
    try:
        lib["pool_fail"](first)
        msgs.append(None)
    except KilnError as err:
        msgs.append(str(err))
out["fail"] = msgs
out["fork_status"] = lib["pool_fork"]()
out["concurrent"] = lib["pool_concurrent"]()
other = rt.load_module(sys.argv[2])  # a second library: its own pool, its own workers
n = other["pool_tids"](ids, 0)
out["other_library"] = [n, len(set(ids.numpy()[2:1 + n].tolist()) & seen)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pool") / "pool.so"
    rt.CSourceModule(HARNESS.read_text(), FUNCS).export_library(str(path))
    shutil.copyfile(path, path.with_name("pool2.so"))  # loaded again as another library
    return str(path)


def _run(script: str, *args: str, threads: str | None, cpus: set[int] | None = None) -> str:
    env = dict(os.environ)
    env.pop("KILN_NUM_THREADS", None)
    if threads is not None:
        env["KILN_NUM_THREADS"] = threads
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=120, preexec_fn=preexec, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_pool_semantics(harness, threads):
    other = str(Path(harness).with_name("pool2.so"))
    res = json.loads(_run(_POOL_SCRIPT, harness, other, threads=threads))
    team = int(threads)
    assert res["team"] == team
    assert res["distinct_threads"] == team  # the caller and team - 1 persistent workers
    assert res["one_task"] == 1 and res["over_team"] == team
    assert res["stress_bad"] == 0
    assert res["barrier_bad"] == 0
    # nested launches: serial (one task), on the outer task's own thread, run once
    assert res["nested"] == [team, True, [1] * team, [1] * team]
    last, first = res["fail"]
    assert f"pool test: task {team - 1} of {team} failed" in last  # a worker's message
    assert "pool test: task" in first and f"of {team} failed" in first
    assert res["fork_status"] == 0
    assert res["concurrent"] == 1  # a second thread's launch during one runs serially
    assert res["other_library"] == [team, 0]  # shares no worker with the first library


def test_team_defaults_to_the_affinity_mask(harness):
    script = ("import sys, kiln.runtime as rt; lib = rt.load_module(sys.argv[1]); "
              "print(lib['pool_tids'](rt.empty((65,), 'int64'), 0))")
    cpu = min(os.sched_getaffinity(0))
    assert _run(script, harness, threads=None, cpus={cpu}).strip() == "1"
    assert _run(script, harness, threads=None).strip() == str(len(os.sched_getaffinity(0)))


# ------------------------------------------------------------------ a model at 1 and 2 threads
def _conv_net() -> onnx.ModelProto:
    """Conv 3→16 3x3 + Relu, Conv 16→32 3x3 stride 2 + Relu, GlobalAveragePool, Gemm 32→10."""
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape,
                                  (rng.standard_normal(shape) * 0.2).astype("float32").ravel())

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "pool_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [init("w1", 16, 3, 3, 3), init("b1", 16), init("w2", 32, 16, 3, 3), init("b2", 32),
         init("w3", 10, 32), init("b3", 10)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


_MODEL_SCRIPT = r"""
import sys, numpy as np, kiln.runtime as rt
from kiln.graph_executor import GraphModule
gm = GraphModule(rt.load_module(sys.argv[1])["default"](rt.cpu()))
x = np.load(sys.argv[2])
outs = []
for _ in range(20):
    gm.run(x=x)
    outs.append(gm.get_output(0).numpy())
assert all(np.array_equal(o, outs[0]) for o in outs), "runs differ"
np.save(sys.argv[3], outs[0])
"""


@pytest.mark.parametrize("target", TARGETS)
def test_conv_net_same_on_1_and_2_threads_and_onnxruntime(tmp_path, target):
    model = _conv_net()
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype("float32")
    mod, params = from_onnx(model, shape={"x": x.shape})
    lib = kiln.build(mod, target=target, params=params)
    sources = [m.get_source() for m in modules_dfs(lib) if m.type_key in ("c", "llvm")]
    assert any("TVMBackendParallelLaunch" in s for s in sources), "no parallel loop to test"
    path = str(tmp_path / "net.so")
    lib.export_library(path)
    if shutil.which("readelf"):  # no OpenMP runtime is linked any more
        dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                                 check=True).stdout
        assert "libgomp" not in dynamic and "libomp" not in dynamic, dynamic
    np.save(tmp_path / "x.npy", x)
    got = []
    for threads in ("1", "2"):
        out = str(tmp_path / f"y{threads}.npy")
        _run(_MODEL_SCRIPT, path, str(tmp_path / "x.npy"), out, threads=threads)
        got.append(np.load(out))
    np.testing.assert_array_equal(got[0], got[1])
    assert_close_to_reference([got[1]], run_onnxruntime(model, {"x": x}))
