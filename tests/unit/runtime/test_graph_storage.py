"""The executor's storage bookkeeping without a C toolchain: live ranges and aliasing of planned
storage, re-pointing entries, the params header reader, and the executor over Python kernels."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln.runtime as rt
from kiln.errors import ModuleLoadError
from kiln.runtime.graph_executor.graph_json import parse_graph
from kiln.runtime.graph_executor.storage import GraphStorage, aliased_entries, live_ranges
from kiln.runtime.params import param_dict_names


def graph(ops, heads, storage, n_inputs=1, shapes=None):
    """Graph JSON: inputs i0.. then ``ops`` = [(func, [input node ids])], all float32."""
    nodes = [{"op": "null", "name": f"i{k}", "inputs": []} for k in range(n_inputs)]
    for k, (func, args) in enumerate(ops):
        nodes.append({"op": "tvm_op", "name": f"n{k}", "inputs": [[a, 0, 0] for a in args],
                      "attrs": {"func_name": func, "num_inputs": str(len(args)),
                                "num_outputs": "1"}})
    n = len(nodes)
    return json.dumps({
        "nodes": nodes, "arg_nodes": list(range(n_inputs)), "heads": [[h, 0, 0] for h in heads],
        "attrs": {"dltype": ["list_str", ["float32"] * n], "storage_id": ["list_int", storage],
                  "shape": ["list_shape", shapes or [[4]] * n]}})


def test_live_ranges_and_reuse_without_aliasing():
    # i0 → n0 → n1 → n2(out); n2 reuses n0's storage once n0 is dead (Kiln's plan does this).
    g = parse_graph(graph([("f", [0]), ("f", [1]), ("f", [2])], [3], [0, 1, 2, 1]))
    inf = float("inf")
    assert live_ranges(g) == [(-inf, inf), (1, 2), (2, 3), (3, inf)]
    assert aliased_entries(g) == [False] * 4


@pytest.mark.parametrize("ops, heads, storage, want", [
    # a __nop view of n0 shares its storage while n0 is still read by n2
    ([("f", [0]), ("__nop", [1]), ("f", [1, 2])], [3], [0, 1, 1, 2],
     [False, True, True, False]),
    # in place: n1 writes the storage its input n0 is read from
    ([("f", [0]), ("f", [1])], [2], [0, 1, 1], [False, True, True]),
    # a graph input shares storage with an op output: inputs live across runs
    ([("f", [0])], [1], [0, 0], [True, True]),
    # an output shares storage with a later entry
    ([("f", [0]), ("f", [1])], [1, 2], [0, 1, 1], [False, True, True]),
])
def test_aliased_entries(ops, heads, storage, want):
    assert aliased_entries(parse_graph(graph(ops, heads, storage))) == want


def test_repoint_changes_only_the_entry():
    g = parse_graph(graph([("f", [0]), ("f", [1])], [2], [0, 1, 1]))
    st = GraphStorage(g, rt.cpu())
    st.aliased = [False] * 3  # pretend the plan had no in-place pair
    t1, t2 = st.tensor(1), st.tensor(2)
    assert t1.contents.data == t2.contents.data == st.pool_view[1].data_ptr
    buf = rt.empty((4,))
    st.repoint(2, buf)
    assert st.tensor(2).contents.data == buf.data_ptr == t2.contents.data
    assert t1.contents.data == st.pool_view[1].data_ptr
    flat = st.tensor(2, flat=True)
    assert flat.contents.ndim == 1 and flat.contents.data == buf.data_ptr
    st.reset(2)
    assert t2.contents.data == flat.contents.data == st.pool_view[2].data_ptr


def test_param_dict_names():
    blob = rt.save_param_dict({"w": np.zeros(3, "float32"), "b": np.ones((), "int64")})
    assert param_dict_names(blob) == ["w", "b"]
    with pytest.raises(ModuleLoadError, match="not a params blob"):
        param_dict_names(b"\1" * 40)
    with pytest.raises(ModuleLoadError, match="truncated"):
        param_dict_names(blob[:20])


def _py_kernels() -> rt.Module:
    def add(a, b, out):
        np.add(a._arr, b._arr, out=out._arr)

    def neg(a, out):
        np.negative(a._arr, out=out._arr)

    return rt.PyFunctionModule({"add": add, "neg": neg})


def test_python_kernels_see_zero_copy_memory():
    # i0, i1 → n0 = i0 + i1 → n1 = -n0 (out, reusing nothing)
    ex = rt.GraphExecutor(graph([("add", [0, 1]), ("neg", [2])], [3], [0, 1, 2, 3], n_inputs=2),
                          _py_kernels())
    x, y, out = (rt.array(np.full(4, v, "float32")) for v in (1.0, 2.0, 0.0))
    ex.set_input_zero_copy("i0", x)
    ex.set_input_zero_copy("i1", y)
    ex.set_output_zero_copy(0, out)
    ex.run()
    np.testing.assert_array_equal(out.numpy(), -3.0)
    x.copyfrom(np.full(4, 5.0, "float32"))
    ex.run()
    np.testing.assert_array_equal(out.numpy(), -7.0)


def test_debug_executor_python_kernels():
    from kiln.runtime.graph_executor.debug import GraphExecutorDebug

    ex = GraphExecutorDebug(graph([("add", [0, 1]), ("neg", [2])], [3], [0, 1, 2, 2],
                                  n_inputs=2), _py_kernels())
    ex.set_input("i0", np.ones(4, "float32"))
    ex.set_input("i1", np.ones(4, "float32"))
    times = ex.run_individual(number=2, repeat=3)
    assert list(times) == [2, 3] and all(len(t) == 3 for t in times.values())
    np.testing.assert_array_equal(ex.get_output(0).numpy(), -2.0)
    ex.execute_node(2)
    np.testing.assert_array_equal(ex.get_node_output(2).numpy(), 2.0)
    times = ex.run_individual_node(3, number=3)
    assert len(times) == 1
    ex.execute_node(3)
    np.testing.assert_array_equal(ex.get_node_output(3).numpy(), -2.0)
