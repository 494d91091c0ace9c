"""The C runtime's code generation without a C compiler: the registry's names blob and source,
the kernel workspace peak, the deploy options, and the AOT executor's static memory plan on a
small graph JSON (the C programs themselves run in tests/backend/crt/test_crt.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from kiln.backend.aot_codegen import aot_codegen, c_identifier
from kiln.backend.kernel_workspace import workspace_bytes
from kiln.codegen.system_lib import c_registry_source, llvm_registry_ir, names_blob
from kiln.driver.build_module import deploy_prefix
from kiln.errors import CompileError
from kiln.tir import loop as L


def test_names_blob_is_count_names_and_an_extra_nul():
    assert names_blob(["f", "gg"]) == b"\x02\x00f\x00gg\x00\x00"
    assert names_blob([]) == b"\x00\x00\x00"
    with pytest.raises(CompileError, match="cannot be registered"):
        names_blob(["a\0b"])


def test_registry_maps_graph_names_to_prefixed_symbols():
    src = c_registry_source(["fused_add"], {"fused_add": "a_fused_add"}, "a_")
    assert "kiln_registry_funcs[1] = {a_fused_add}" in src
    assert "const TVMModule* a_TVMSystemLibEntryPoint(void)" in src
    assert "int32_t a_fused_add(" in src
    blob = re.search(r'kiln_registry_names\[(\d+)\] = "([^"]*)"', src)
    assert int(blob.group(1)) == len(names_blob(["fused_add"]))
    assert bytes(int(o, 8) for o in blob.group(2).split("\\")[1:]) == names_blob(["fused_add"])
    ir = llvm_registry_ir(["f"], {"f": "p_f"}, "p_", "x86_64-linux-gnu", "")
    assert "define ptr @p_TVMSystemLibEntryPoint()" in ir and "[ptr @p_f]" in ir
    with pytest.raises(CompileError, match="not a C identifier"):
        c_registry_source(["f"], {"f": "bad-name"})


def _alloc(n: int, body: L.Stmt, scope: str = "global") -> L.Allocate:
    return L.Allocate(L.Buffer(f"b{n}", (n,), "float32", scope), body)


def test_workspace_peak_adds_nested_and_shares_sequential_allocations():
    nop = L.Evaluate(L.IntImm(0))
    # 2000 floats = 8000 B → 64 header + 8000; 300 floats = 1200 B → 64 + 1216; 100 floats stay
    # on the stack (≤ 1 KiB), as do local buffers
    nested = _alloc(2000, _alloc(300, _alloc(100, nop)))
    seq = L.SeqStmt([nested, _alloc(4000, nop), _alloc(9999, nop, scope="local")])
    func = L.PrimFunc("k", [], seq)
    assert workspace_bytes(func) == max(64 + 8000 + 64 + 1216, 64 + 16000)
    assert workspace_bytes(L.PrimFunc("k", [], nested)) == 64 + 8000 + 64 + 1216


def test_deploy_options():
    assert deploy_prefix(None, "graph", "", "m") == ""
    assert deploy_prefix("crt", "graph", "a_", "m") == "a_"
    assert deploy_prefix(None, "aot", "", "my-net") == "kiln_my_net_"
    for args, msg in [(("cpp", "graph", "", "m"), "unknown runtime"),
                      ((None, "relay_vm", "", "m"), "unknown executor"),
                      ((None, "graph", "a_", "m"), "needs runtime='crt'")]:
        with pytest.raises(CompileError, match=msg):
            deploy_prefix(*args)
    assert c_identifier("3x-y", {"_3x_y"}) == "_3x_y_1"


def _graph() -> str:
    """x → k0 → t1 → k1 → t2 → k2 → y, p0 feeding k0: t1 and t2 share no storage (k1 reads t1
    while writing t2); y is an output (the caller's buffer)."""
    f32 = "float32"
    nodes = [{"op": "null", "name": "x", "inputs": []},
             {"op": "null", "name": "p0", "inputs": []}]
    for i, ins in enumerate([[[0, 0, 0], [1, 0, 0]], [[2, 0, 0]], [[3, 0, 0]]]):
        nodes.append({"op": "tvm_op", "name": f"k{i}", "inputs": ins,
                      "attrs": {"func_name": f"k{i}", "num_inputs": str(len(ins)),
                                "num_outputs": "1", "flatten_data": "0"}})
    return json.dumps({
        "nodes": nodes, "arg_nodes": [0, 1], "heads": [[4, 0, 0]],
        "node_row_ptr": [0, 1, 2, 3, 4, 5],
        "attrs": {"dltype": ["list_str", [f32] * 5],
                  "storage_id": ["list_int", [0, 1, 2, 3, 2]],
                  "shape": ["list_shape", [[4], [4], [100], [30], [4]]],
                  "device_index": ["list_int", [1] * 5],
                  "output_names": ["list_str", ["y:0"]]}})


def test_aot_static_plan_and_linked_params():
    p0 = np.arange(4, dtype="float32")
    src = aot_codegen(_graph(), {"p0": p0}, [], {"k0": "kiln_m_k0", "k1": "kiln_m_k1"}, "m")
    assert src.activation_bytes == 448 + 128  # t1 (400 B) and t2 (120 B), 64-byte rounded
    assert src.kernel_workspace_bytes == 0 and src.workspace_bytes == 576
    assert src.params_bin == p0.tobytes() + bytes(48)
    assert [(s.name, s.c_name, s.shape) for s in src.outputs] == [("y:0", "y_0", (4,))]
    assert "kiln_m_k0(kiln_m_args0" in src.run_c and "k2(kiln_m_args2" in src.run_c
    assert "(void*)(kiln_m_params + 0)" in src.run_c
    assert "kiln_m_workspace + 448" in src.run_c  # t2 after t1
    assert "outputs->y_0" in src.run_c and "inputs->x" in src.run_c
    assert "#define KILN_M_WORKSPACE_BYTES 576" in src.header
    assert '#define KILN_M_OUTPUT_0_NAME "y:0"' in src.header
    assert '.incbin "kiln_m_params.bin"' in src.params_asm
    bad = json.loads(_graph())
    bad["heads"] = [[0, 0, 0]]
    with pytest.raises(CompileError, match="graph input or param"):
        aot_codegen(json.dumps(bad), {"p0": p0}, [], {}, "m")
