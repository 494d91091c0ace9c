"""The VM executable's optional sources section (the ONNX nodes of each kernel call): round
trip, an executable without it is byte for byte as before, corrupt sections and sources at no
call instruction are load errors, and the profiler reports the nodes per call."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import vm_programs as P

import kiln
from kiln.errors import ModuleLoadError
from kiln.runtime.stream import StreamWriter
from kiln.runtime.vm.bytecode import OP_CALL
from kiln.runtime.vm.executable import VMExecutable
from kiln.runtime.vm.executable_format import OPT_SOURCES, read_sources
from kiln.vm import VirtualMachine


def kernel_pcs(exe: VMExecutable) -> dict[str, int]:
    """Kernel name → word index of its call in ``main``."""
    return {exe.functions[ins.func_idx].name: ins.pc for ins in exe.decoded[0]
            if ins.op == OP_CALL and not exe.functions[ins.func_idx].name.startswith("vm.")}


def with_sources(lib=None) -> VMExecutable:
    exe = P.add_mul(lib)
    pcs = kernel_pcs(exe)
    sources = {("main", pcs["add"]): (("Add_0",), ("Add",)),
               ("main", pcs["mul"]): (("Mul_1", "Relu_2"), ("Mul", "Relu"))}
    return VMExecutable(exe.symbols, exe.functions, exe.constants, exe.code, lib=lib,
                        sources=sources)


def section_ids(data: bytes) -> list[int]:
    n = struct.unpack_from("<I", data, 12)[0]
    return [struct.unpack_from("<IQQ", data, 16 + 20 * k)[0] for k in range(n)]


def test_round_trip_and_old_layout():
    exe = with_sources()
    data = exe.save_to_binary()
    assert section_ids(data) == [1, 2, 3, 4, OPT_SOURCES]
    back = VMExecutable.load_from_binary(data)
    assert back.sources == exe.sources and back.save_to_binary() == data
    plain = P.add_mul().save_to_binary()
    assert section_ids(plain) == [1, 2, 3, 4]  # no sources: the bytes of before
    assert read_sources(plain) == {} and VMExecutable.load_from_binary(plain).sources == {}


def test_source_at_no_call_is_a_load_error():
    exe = P.add_mul()
    with pytest.raises(ModuleLoadError, match=r"source of 'main' word 1: not a call"):
        VMExecutable(exe.symbols, exe.functions, exe.constants, exe.code,
                     sources={("main", 1): (("A",), ("Add",))})
    with pytest.raises(ModuleLoadError, match="source of 'other' word"):
        VMExecutable(exe.symbols, exe.functions, exe.constants, exe.code,
                     sources={("other", kernel_pcs(exe)["add"]): (("A",), ("Add",))})


def replace_sources(data: bytes, payload: bytes) -> bytes:
    """``data`` (sources last) with the sources section's payload replaced."""
    entry = 16 + 20 * 4  # the fifth section table entry
    offset = struct.unpack_from("<Q", data, entry + 4)[0]
    out = bytearray(data[:offset] + payload)
    struct.pack_into("<QQ", out, entry + 4, offset, len(payload))
    return bytes(out)


def test_corrupt_sources_section():
    data = with_sources().save_to_binary()
    pc = kernel_pcs(P.add_mul())["mul"]
    w = StreamWriter()
    w.u64(1)
    w.string("main")
    w.i64(pc)
    w.vec_str(["Mul_1", "Relu_2"])
    good = w.getvalue() + struct.pack("<Q", 2) + struct.pack("<Q", 3) + b"Mul"
    good += struct.pack("<Q", 4) + b"Relu"
    w.vec_str(["Mul"])  # one op type for two nodes
    with pytest.raises(ModuleLoadError, match="2 ONNX nodes but 1 op types"):
        VMExecutable.load_from_binary(replace_sources(data, w.getvalue()))
    assert VMExecutable.load_from_binary(replace_sources(data, good)).sources == {
        ("main", pc): (("Mul_1", "Relu_2"), ("Mul", "Relu"))}
    for cut in (4, 12, len(good) - 2, len(good) + 0):  # truncated (or, last, whole)
        payload = good[:cut]
        if cut == len(good):
            payload += b"x"  # a byte past the entries
        with pytest.raises(ModuleLoadError, match="section 'sources'"):
            VMExecutable.load_from_binary(replace_sources(data, payload))


def test_profile_reports_the_nodes_per_call():
    vm = VirtualMachine(with_sources(P.py_kernels()), kiln.cpu())
    x = np.ones((3, 4), "float32")
    report = vm.profile("main", x, x)
    assert [(r.name, r.onnx_nodes, r.onnx_op_types) for r in report.rows] == [
        ("add", ("Add_0",), ("Add",)), ("mul", ("Mul_1", "Relu_2"), ("Mul", "Relu"))]
    assert all(r.start_us >= 0 and r.num_outputs == 1 for r in report.rows)
    assert report.rows[1].start_us >= report.rows[0].start_us + report.rows[0].time_us
    lines = report.table().splitlines()
    assert lines[0].split()[-2:] == ["ONNX", "nodes"]
    assert lines[3].endswith("Mul_1, Relu_2")
    plain = VirtualMachine(P.add_mul(P.py_kernels()), kiln.cpu()).profile("main", x, x)
    assert "ONNX" not in plain.table() and plain.rows[0].onnx_nodes == ()


def test_compiled_model_sources_round_trip():
    """kiln.build of an ONNX model with symbolic dims: every kernel call has a source, and the
    executable's bytes load back to the same sources."""
    from onnx import TensorProto, helper

    from kiln.frontend import from_onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu"),
             helper.make_node("Mul", ["x", "y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info(
        "z", TensorProto.FLOAT, ["n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, target="llvm", params=params)
    assert sorted(exe.sources.values()) == [(("add", "relu", "Mul_2"), ("Add", "Relu", "Mul"))]
    assert VMExecutable.load_from_binary(exe.save_to_binary()).sources == exe.sources
