"""Symbolic dims in the CLI: ``--dim`` parsing, resolving ``--input-shape``/``--dim`` against an
ONNX model's symbols, the executor choice, and the VM signature helpers of ``kiln run`` /
``kiln inspect`` (no C toolchain: compile errors here all happen before code generation)."""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kiln.cli import main as cli
from kiln.cli.symbols import DimSpec, fix_symbols, input_dims, parse_dim, resolve_symbols
from kiln.cli.vm import input_shapes, inspect_vm_lines, vm_signature
from kiln.errors import KilnError, ShapeError


@pytest.mark.parametrize(("text", "spec"), [
    ("sequence_length=1..512", DimSpec("sequence_length", lo=1, hi=512)),
    ("seq=8..512:8", DimSpec("seq", lo=8, hi=512, divisor=8)),
    ("batch_size=1..", DimSpec("batch_size", lo=1, hi=None)),
    ("n=..64", DimSpec("n", lo=1, hi=64)),
    ("n=0..4", DimSpec("n", lo=0, hi=4)),
    ("batch_size=1", DimSpec("batch_size", value=1)),
    ("a=b=3..4", DimSpec("a=b", lo=3, hi=4)),
])
def test_parse_dim(text, spec):
    assert parse_dim(text) == spec
    assert parse_dim(spec.text) == spec


@pytest.mark.parametrize("text", ["seq", "=1..2", "seq=", "seq=5..3", "seq=1..8:0", "seq=0",
                                  "seq=a..4", "seq=1..4:x", "seq=-1..4", "seq=1.5"])
def test_parse_dim_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_dim(text)


def test_compile_dim_and_executor_arguments():
    parse = cli.build_parser().parse_args
    args = parse(["compile", "m.onnx", "-o", "m.so"])
    assert (args.dims, args.executor) == ([], None)
    args = parse(["compile", "m.onnx", "-o", "m.so", "--dim", "seq=1..512:8", "--dim",
                  "batch=1", "--executor", "vm"])
    assert args.dims == [DimSpec("seq", lo=1, hi=512, divisor=8), DimSpec("batch", value=1)]
    assert args.executor == "vm"
    args = parse(["run", "m.so", "--input-shape", "input_ids:1x77"])
    assert args.input_shapes == [("input_ids", (1, 77))]
    assert parse(["inspect", "m.so", "--bytecode"]).bytecode


@pytest.mark.parametrize("argv", [["--dim", "seq"], ["--dim", "seq=4..2"],
                                  ["--executor", "relay"]])
def test_compile_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["compile", "m.onnx", "-o", "m.so", *argv])
    assert exc.value.code == 2
    assert "usage: kiln" in capsys.readouterr().err


def _model() -> onnx.ModelProto:
    """z = x + y, x and y [batch, seq] float32; k [?, 4] (an unnamed symbolic dim)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])
    k = helper.make_tensor_value_info("k", TensorProto.FLOAT, [None, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "seq"])
    r = helper.make_tensor_value_info("r", TensorProto.FLOAT, [None, 4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"]),
                               helper.make_node("Relu", ["k"], ["r"])], "g", [x, y, k], [z, r])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_input_dims_names_symbols_as_the_importer_does():
    assert input_dims(_model()) == {"x": ["batch", "seq"], "y": ["batch", "seq"],
                                    "k": ["k_dim0", 4]}


def test_one_input_shape_fixes_the_symbols_of_every_input():
    from kiln.frontend import from_onnx

    model = _model()
    dims = input_dims(model)
    fixed, bounds = resolve_symbols(dims, {"x": (2, 3)}, [parse_dim("k_dim0=1..16:2")])
    assert fixed == {"batch": 2, "seq": 3} and bounds == {"k_dim0": (1, 16, 2)}
    fix_symbols(model, fixed)
    mod, _ = from_onnx(model, shape={"x": (2, 3)}, dim_bounds=bounds)
    x, y, k = (p.checked_type.shape for p in mod["main"].params)
    assert tuple(x) == tuple(y) == (2, 3)
    assert str(k[0]) == "k_dim0" and (k[0].hi, k[0].divisor) == (16, 2) and k[1] == 4


def test_dim_fixes_a_symbol_and_bounds_the_rest():
    dims = input_dims(_model())
    fixed, bounds = resolve_symbols(dims, {}, [parse_dim("batch=1"), parse_dim("seq=1..512")])
    assert fixed == {"batch": 1} and bounds == {"seq": (1, 512, 1)}
    # a bound for a symbol an --input-shape fixes is checked, then dropped
    fixed, bounds = resolve_symbols(dims, {"y": (1, 64)}, [parse_dim("seq=8..512:8")])
    assert fixed == {"batch": 1, "seq": 64} and bounds == {}


@pytest.mark.parametrize(("shapes", "specs", "error", "words"), [
    ({"x": (1, 10), "y": (1, 12)}, [], ShapeError,
     ["symbol seq", "10", "x:1x10 (dim 1)", "12", "y:1x12 (dim 1)"]),
    ({"x": (1, 600)}, ["seq=1..512"], ShapeError, ["seq is 600", "--dim seq=1..512"]),
    ({"x": (1, 12)}, ["seq=8..512:8"], ShapeError, ["seq is 12", "--dim seq=8..512:8"]),
    ({"x": (2, 3)}, ["batch=1"], ShapeError, ["batch is 2", "--dim batch=1"]),
    ({}, ["sequence=1..4"], KilnError, ["sequence", "batch, k_dim0, seq"]),
    ({}, ["seq=1..4", "seq=2..8"], KilnError, ["twice", "seq"]),
])
def test_resolve_symbols_errors_name_the_symbol(shapes, specs, error, words):
    with pytest.raises(error) as exc:
        resolve_symbols(input_dims(_model()), shapes, [parse_dim(s) for s in specs])
    for word in words:
        assert word in str(exc.value)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kiln: error: "), err
    return err


@pytest.mark.parametrize(("argv", "words"), [
    (["--executor", "graph"], ["graph executor needs static shapes", "x[batch, seq]",
                               "y[batch, seq]", "k[k_dim0, 4]", "--input-shape", "--dim"]),
    (["--executor", "aot", "-o", "m.a", "--input-shape", "x:1x2"], ["k[k_dim0, 4]"]),
    (["--system-lib", "--dim", "batch=1"], ["--system-lib) needs static shapes",
                                            "x[1, seq]"]),
    (["--dim", "nope=1..2"], ["nope", "batch, k_dim0, seq"]),
    (["--input-shape", "x:1x10", "--input-shape", "y:1x12"], ["symbol seq", "y:1x12"]),
])
def test_compile_symbol_errors_exit_2(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KILN_LOG", raising=False)
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    assert cli.main(["compile", str(path), "-o", str(tmp_path / "m.so"), "-q", *argv]) == 2
    line = _error_line(capsys)
    for word in words:
        assert word in line
    assert not (tmp_path / "m.so").exists()


def _executable():
    """A VM executable by hand: main(x: int64[batch, seq], m: float32[batch, seq, 4]) -> x."""
    from kiln.runtime import array
    from kiln.runtime.vm.executable import Symbol, VMExecutable, VMFunction, ret

    code = [*ret(0)]
    main = VMFunction(1, "main", 0, len(code), 2, 2,
                      params=[("x", "int64", ["batch", "seq"]),
                              ("m", "float32", ["batch", "seq", 4])],
                      outputs=[("y", "int64", ["batch", "seq"])])
    return VMExecutable([Symbol("batch", 1, None, 1), Symbol("seq", 3, 512, 8)], [main],
                        [array(np.zeros((2, 4), np.float32))], code)


def test_vm_signature_and_random_input_shapes():
    sig = vm_signature(_executable())
    assert [(t.name, t.dtype, t.dims) for t in sig.inputs] == [
        ("x", "int64", ("batch", "seq")), ("m", "float32", ("batch", "seq", 4))]
    assert [t.shape_text() for t in sig.outputs] == ["[batch, seq]"]
    # no shape given: every symbol at its smallest allowed value (seq >= 3, a multiple of 8)
    assert input_shapes(sig, {}) == ({"x": (1, 8), "m": (1, 8, 4)}, {"batch": 1, "seq": 8})
    # one input's shape sizes the inputs that share its symbols
    assert input_shapes(sig, {"x": (2, 16)}) == ({"x": (2, 16), "m": (2, 16, 4)}, {})
    # given shapes are checked against the symbols; their fixed dims are left to the VM
    assert input_shapes(sig, {"m": (2, 16, 5)})[0] == {"x": (2, 16), "m": (2, 16, 5)}
    bad = "--input-shape m:1x12x4: dim 1: symbol seq = 12 is outside seq in [3, 512] divisible by 8"
    for shapes, words in [({"m": (1, 12, 4)}, bad),
                          ({"x": (1, 8), "m": (2, 8, 4)}, "m:2x8x4: dim 0: symbol batch is 1"),
                          ({"x": (8,)}, "input 'x' has rank 2 ([batch, seq]), got 1")]:
        with pytest.raises(ShapeError) as exc:
            input_shapes(sig, shapes)
        assert words in str(exc.value)
    with pytest.raises(KilnError, match="unknown input.*'q'"):
        input_shapes(sig, {"q": (1,)})
    with pytest.raises(KilnError, match="no function 'other'"):
        vm_signature(_executable(), "other")


def test_inspect_vm_lines():
    text = "\n".join(inspect_vm_lines(_executable()))
    assert "executor: VM (1 VM function, 0 kernels" in text
    assert "batch in [1, inf]" in text and "seq in [3, 512] divisible by 8" in text
    assert "main(x: int64[batch, seq], m: float32[batch, seq, 4]) -> (y: int64[batch, seq])" \
        in text
    assert "  m: [batch, seq, 4] float32" in text
    assert "constants: 1 (1 tensors, 32 bytes" in text


def test_two_question_mark_dims_take_different_sizes():
    """``--input-shape x:1x3x48x192`` on ``x[?, 3, '?', '?']``: two ``?`` are two symbols."""
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", f, [None, 3, "?", "?"])],
        [helper.make_tensor_value_info("y", f, [None, 3, "?", "?"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert input_dims(model) == {"x": ["x_dim0", 3, "x_dim2", "x_dim3"]}
    fixed, _ = resolve_symbols(input_dims(model), {"x": (1, 3, 48, 192)}, [])
    assert fixed == {"x_dim0": 1, "x_dim2": 48, "x_dim3": 192}
