"""The VM runtime on hand-written bytecode over Python kernels (no C toolchain): symbolic shapes
(binding, conflicts, bounds, divisibility), shape programs, storage growth and reuse, control
flow, tuples, VM calls, the stateful API, replay of recorded calls, profile and time_evaluator,
and the errors of initialization."""

from __future__ import annotations

import numpy as np
import pytest
import vm_programs as P

import kiln
import kiln.runtime as rt
from kiln.errors import KilnError, ModuleLoadError, ShapeError
from kiln.runtime.vm.executable import VMExecutable, VMFunction
from kiln.runtime.vm.executable_format import Sym, Symbol
from kiln.runtime.vm.storage import Arena
from kiln.vm import VirtualMachine

RNG = np.random.default_rng(0)


def _xy(n: int, dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    return (RNG.standard_normal((n, 4)).astype(dtype), RNG.standard_normal((n, 4)).astype(dtype))


@pytest.fixture
def vm():
    return VirtualMachine(P.add_mul(P.py_kernels()), kiln.cpu())


def test_symbolic_shapes(vm):
    for n in (1, 3, 64, 7):
        x, y = _xy(n)
        out = vm["main"](x, y)
        assert isinstance(out, rt.NDArray) and out.shape == (n, 4)
        np.testing.assert_allclose(out.numpy(), (x + y) * x, rtol=1e-6)


def test_inputs_as_ndarrays_and_unaligned_numpy(vm):
    x, y = _xy(5)
    np.testing.assert_allclose(vm["main"](rt.array(x), rt.array(y)).numpy(), (x + y) * x)
    raw = np.empty(5 * 4 + 1, np.float32)[1:].reshape(5, 4)  # 4 bytes off a 64-byte boundary
    raw[...] = x
    np.testing.assert_allclose(vm["main"](raw, y).numpy(), (x + y) * x)
    np.testing.assert_allclose(vm["main"](x.tolist(), y).numpy(), (x + y) * x)


def test_aligned_numpy_inputs_are_used_in_place():
    seen = []

    def add(a, b, out):
        seen.append(a.data_ptr)
        np.add(a._arr, b._arr, out=out._arr)

    kernels = rt.PyFunctionModule({"add": add, "mul": P._mul})
    vm = VirtualMachine(P.add_mul(kernels))
    x = rt.empty((3, 4), "float32").numpy()  # a copy: not necessarily aligned
    aligned = rt.empty((3, 4), "float32")
    aligned.copyfrom(x)
    view = np.from_dlpack(aligned)
    vm["main"](view, view)
    assert seen == [aligned.data_ptr]


def test_results_do_not_alias_storage(vm):
    x, y = _xy(4)
    first = vm["main"](x, y)
    keep = first.numpy()
    vm["main"](*_xy(4))
    np.testing.assert_array_equal(first.numpy(), keep)


@pytest.mark.parametrize("shapes, message", [
    (((3, 4), (2, 4)), r"input 'y' dim 0: symbol n is 3 \(from an earlier input\) but got 2"),
    (((3, 5), (3, 5)), "input 'x' dim 1: expected 4 but got 5"),
    (((65, 4), (65, 4)), r"input 'x' dim 0: symbol n = 65 is outside its bounds \[1, 64\]"),
    (((0, 4), (0, 4)), "symbol n = 0 is outside its bounds"),
    (((3, 4, 1), (3, 4)), r"input 'x': expected rank 2, got shape \(3, 4, 1\)"),
])
def test_match_shape_errors(vm, shapes, message):
    args = [np.zeros(s, np.float32) for s in shapes]
    with pytest.raises(ShapeError, match=message):
        vm["main"](*args)


def test_dtype_and_count_errors(vm):
    x, y = _xy(2, "float64")
    with pytest.raises(ShapeError, match="input 'x': expected dtype float32, got float64"):
        vm["main"](x, y)
    with pytest.raises(KilnError, match=r"takes 2 inputs \(x, y\), got 1"):
        vm["main"](x)
    with pytest.raises(KilnError, match="no function 'nope'"):
        vm["nope"]


def test_divisor():
    vm = VirtualMachine(P.add_mul(P.py_kernels(), [Symbol("n", 2, 64, 2)]))
    vm["main"](*_xy(4))
    with pytest.raises(ShapeError, match="symbol n = 3 is not a multiple of 2"):
        vm["main"](*_xy(3))


def test_storage_grows_only_when_needed_and_stays_bounded(vm):
    for n in [1, 8, 3, 64, 2, 64, 17, 5, 33, 1] * 3:
        x, y = _xy(n)
        np.testing.assert_allclose(vm["main"](x, y).numpy(), (x + y) * x, rtol=1e-6)
    stats = vm.memory_stats()
    assert stats["num_storages"] == 2
    assert stats["storage_bytes"] == 2 * 64 * 16  # two tensors of the largest shape
    assert stats["peak_storage_bytes"] == stats["storage_bytes"]
    assert stats["allocations"] == 2 * 3  # n = 1, 8, 64: grown three times each
    assert vm.replay_stats()["kept"] <= 8


def test_one_trace_replays_new_inputs_and_new_shapes(vm):
    x1, y1 = _xy(6)
    x2, y2 = _xy(6)
    np.testing.assert_allclose(vm["main"](x1, y1).numpy(), (x1 + y1) * x1, rtol=1e-6)
    stats = vm.replay_stats()
    assert stats["recordings"] == 1 and stats["replays"] == 0  # traced on the first call
    np.testing.assert_allclose(vm["main"](x2, y2).numpy(), (x2 + y2) * x2, rtol=1e-6)
    np.testing.assert_allclose(vm["main"](x1, y1).numpy(), (x1 + y1) * x1, rtol=1e-6)
    x3, y3 = _xy(7)  # another heap tuple: the same trace, its views patched
    np.testing.assert_allclose(vm["main"](x3, y3).numpy(), (x3 + y3) * x3, rtol=1e-6)
    stats = vm.replay_stats()
    assert stats["replays"] == 3 and stats["recordings"] == 1


def test_trace_survives_storage_growth(vm):
    for n in (2, 2, 9, 2, 33):  # 9 and 33 grow (move) both storages: addresses re-read
        x, y = _xy(n)
        np.testing.assert_allclose(vm["main"](x, y).numpy(), (x + y) * x, rtol=1e-6)
    assert vm.replay_stats() == {"calls": 5, "replays": 4, "recordings": 1, "interpreted": 1,
                                 "guard_failures": 0, "kept": 1}


@pytest.mark.parametrize("k", [0, 1, 5])
def test_loop_from_data(k):
    vm = VirtualMachine(P.loop(P.py_kernels()))
    x = RNG.standard_normal(7).astype(np.float32)
    out = vm["main"](x, np.array(k, np.int64))
    np.testing.assert_allclose(out.numpy(), x * (k + 1), rtol=1e-5)
    assert vm.replay_stats()["replays"] == 0  # control flow: always interpreted


def test_tuple_outputs_and_vm_calls():
    vm = VirtualMachine(P.tuple_prog(P.py_kernels()))
    x, y = _xy(3)
    s, p = vm["pair"](x, y)
    np.testing.assert_allclose(s.numpy(), x + y, rtol=1e-6)
    assert p.shape == (12,)
    np.testing.assert_allclose(p.numpy(), (x * y).reshape(-1), rtol=1e-6)
    np.testing.assert_allclose(vm["first"](x, y).numpy(), x + y, rtol=1e-6)
    np.testing.assert_allclose(vm["first"](x, y).numpy(), x + y, rtol=1e-6)
    a, b = vm["twice"](x, y)  # the second call of pair must not overwrite the first result
    np.testing.assert_allclose(a.numpy(), x + y, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), y + y, rtol=1e-6)


def test_stateful_api(vm):
    x, y = _xy(3)
    x0 = x.copy()
    vm.set_input("main", x, y=y)
    x[...] = 0  # set_input copied the inputs
    vm.invoke_stateful("main")
    np.testing.assert_allclose(vm.get_outputs("main").numpy(), (x0 + y) * x0, rtol=1e-6)
    with pytest.raises(KilnError, match="inputs \\['x'\\] are not set"):
        vm.set_input("main", y=y)
    with pytest.raises(KilnError, match="has no input 'z'"):
        vm.set_input("main", x, z=y)
    other = VirtualMachine(P.add_mul(P.py_kernels()))
    with pytest.raises(KilnError, match="set_input"):
        other.invoke_stateful("main")
    with pytest.raises(KilnError, match="invoke_stateful"):
        other.get_outputs("main")


def test_profile(vm):
    x, y = _xy(5)
    report = vm.profile("main", x, y)
    assert [r.name for r in report.rows] == ["add", "mul"]
    add = report.rows[0]
    assert add.shapes == ((5, 4), (5, 4), (5, 4))
    assert add.bytes_read == 2 * 80 and add.bytes_written == 80
    assert report.total_us >= report.kernel_us > 0
    table = report.table()
    assert "add" in table and "VM overhead" in table and "Total" in table
    assert report.to_dict()["rows"][1]["name"] == "mul"
    vm.set_input("main", x, y)
    assert len(vm.profile("main").rows) == 2


def test_time_evaluator(vm):
    x, y = _xy(5)
    res = vm.time_evaluator("main", kiln.cpu(), number=3, repeat=4)(x, y)
    assert len(res.results) == 4 and res.min <= res.median <= res.max and res.mean > 0
    assert "mean (ms)" in str(res)
    vm.set_input("main", x, y)
    assert len(vm.time_evaluator("main", number=2)().results) == 1
    with pytest.raises(KilnError, match="must be >= 1"):
        vm.time_evaluator("main", number=0)


def test_initialization_errors():
    exe = P.add_mul(P.py_kernels())
    mod = exe["vm_load_executable"]()
    with pytest.raises(KilnError, match="vm_initialization"):
        mod["main"](*_xy(2))
    with pytest.raises(KilnError, match="device type 2 is not supported"):
        mod["vm_initialization"](2, 0, 2)
    with pytest.raises(KilnError, match="allocator type 7"):
        mod["vm_initialization"](1, 0, 7)
    with pytest.raises(KilnError, match="triples"):
        mod["vm_initialization"](1, 0)
    mod["vm_initialization"](1, 0, 1, 1, 0, 2)  # a device then the host, as TVM passes them
    with pytest.raises(KilnError, match="cpu"):
        VirtualMachine(exe, rt.Device(2, 0))
    with pytest.raises(KilnError, match="no VM executable"):
        VirtualMachine(rt.PyFunctionModule({}))
    with pytest.raises(KilnError, match="expects a loaded module"):
        VirtualMachine(42)


def test_missing_kernel_is_named():
    with pytest.raises(KilnError, match="kernel 'mul' .* not found"):
        VirtualMachine(P.add_mul(rt.PyFunctionModule({"add": P._add})))
    with pytest.raises(KilnError, match="no library imported"):
        VirtualMachine(P.add_mul())


def _one_builtin(name: str, *args: int, constants=(), heap_size: int = 1) -> VMExecutable:
    code = [*P.call(-1, 1, list(args)), *P.ret(0)]
    return VMExecutable([Symbol("n")], [
        VMFunction(1, "main", 0, len(code), 2, heap_size, [("x", "float32", [Sym(0)])]),
        VMFunction(0, "vm.builtin." + name)], list(constants), code)


@pytest.mark.parametrize("exe, message", [
    (_one_builtin("match_shape", P.R(0), P.I(0), P.I(3)), "constant int64 array"),
    (_one_builtin("match_shape", P.R(0), P.I(0)), "expects 3 arguments"),
    (_one_builtin("match_shape", P.R(0), P.I(0), P.const(0), constants=[np.array([2, 32, 3],
                                                                                 np.int64)]),
     "malformed match spec"),
    (_one_builtin("match_shape", P.R(0), P.I(0), P.const(0), constants=[np.array(
        [2, 32, 1, 1, 5], np.int64)]), "heap slot 5 out of range"),
    (_one_builtin("match_shape", P.R(0), P.I(0), P.const(0), constants=[np.array(
        [9, 32, 0], np.int64)]), "no supported numpy dtype"),
    (_one_builtin("shape_compute", P.const(0), constants=[np.arange(5, dtype=np.int64)]),
     "6 words per step"),
    (_one_builtin("shape_compute", P.const(0), constants=[np.array([9, 0, 0, 0, 0, 0],
                                                                   np.int64)]), "unknown op 9"),
    (_one_builtin("alloc_storage", P.I(1 << 20), P.I(8)), "storage id"),
    (_one_builtin("alloc_storage", P.I(0), P.R(0)), "immediate or a heap slot"),
    (_one_builtin("alloc_tensor", P.R(0), P.I(0), P.const(0), constants=["complex64"]),
     "not supported"),
    (_one_builtin("tuple_get", P.R(0), P.R(0)), "must be an immediate"),
    (_one_builtin("tensor_to_heap", P.R(0), P.const(0), constants=[np.array([4], np.int64)]),
     "heap slot 4"),
])
def test_builtin_call_sites_checked_at_initialization(exe, message):
    with pytest.raises(ModuleLoadError, match=message):
        VirtualMachine(exe)


def test_unknown_builtin():
    with pytest.raises(KilnError, match="unknown builtin 'vm.builtin.frobnicate'"):
        VirtualMachine(_one_builtin("frobnicate"))


def _program(steps: list[int]) -> VirtualMachine:
    exe = _one_builtin("shape_compute", P.const(0),
                       constants=[np.array(steps, np.int64)], heap_size=2)
    return VirtualMachine(exe)


def test_shape_program_errors():
    with pytest.raises(ShapeError, match="divides by zero"):
        _program([3, 1, 1, 5, 1, 0])["main"](np.zeros(2, np.float32))
    with pytest.raises(ShapeError, match="modulo zero"):
        _program([4, 1, 1, 5, 1, 0])["main"](np.zeros(2, np.float32))
    with pytest.raises(ShapeError, match="overflows int64"):
        _program([2, 1, 1, 1 << 40, 1, 1 << 40])["main"](np.zeros(2, np.float32))


def test_storage_limit_refused_before_allocating():
    arena = Arena(lambda st: None, limit=1000)
    with pytest.raises(ShapeError, match="would need 2000 bytes"):
        arena.alloc((0, 0, 0), 2000)
    st = arena.alloc((0, 0, 0), 100)
    assert st.nbytes == 128 and st.buf.data_ptr % 64 == 0
    with pytest.raises(KilnError, match="does not fit"):
        st.view(64, "float32", (32,))
    with pytest.raises(KilnError, match="not a multiple of 64"):
        st.view(4, "float32", (1,))


def test_loaded_executable_runs():
    data = P.tuple_prog().save_to_binary()
    exe = VMExecutable.load_from_binary(data)
    exe.import_module(P.py_kernels())
    x, y = _xy(2)
    np.testing.assert_allclose(VirtualMachine(exe)["first"](x, y).numpy(), x + y, rtol=1e-6)


def test_runtime_module_functions():
    mod = P.add_mul(P.py_kernels())["vm_load_executable"]()
    assert {"vm_initialization", "main", "profile", "memory_stats"} <= set(
        mod.list_function_names())
    mod["vm_initialization"](1, 0, 2)
    x, y = _xy(2)
    np.testing.assert_allclose(mod["main"](x, y).numpy(), (x + y) * x, rtol=1e-6)
    assert mod["memory_stats"]()["num_storages"] == 2
    assert not mod.is_binary_serializable


def _misaligned(a: np.ndarray) -> np.ndarray:
    raw = np.empty(a.nbytes + 64 + 4, np.uint8)
    start = (-raw.ctypes.data) % 64 + 4
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def test_misaligned_inputs_are_staged_and_replayed(vm):
    for _ in range(3):
        x, y = (_misaligned(a) for a in _xy(5))
        np.testing.assert_allclose(vm["main"](x, y).numpy(), (x + y) * x, rtol=1e-6)
    assert vm.module.staging_bytes == 2 * 5 * 4 * 4
    assert "staging_bytes" not in vm.memory_stats()
    assert vm.replay_stats()["replays"] == 2
    x, y = _xy(5)
    np.testing.assert_allclose(vm["main"](x[:, ::-1], y).numpy(), (x[:, ::-1] + y) * x[:, ::-1],
                               rtol=1e-6)  # strided: staged too


def test_runaway_recursion_is_an_error():
    a = P.Asm([Symbol("n")])
    f = a.begin("f", [("x", "float32", [Sym(0)])], [], num_regs=2, heap_size=1)
    a.vmcall(1, f, P.R(0))
    a.emit(P.ret(1))
    a.end(f)
    vm = VirtualMachine(a.build())
    with pytest.raises(KilnError, match="nested calls"):
        vm["f"](np.zeros(2, np.float32))
    assert vm.module._depth == 0 and not any(vm.module._active.values())


def test_checks_against_computed_slots_run_on_replay():
    """``y: f32[2n]``: a shape program between the two checks computes 2n; it must run before
    the second check on every call, replayed or not."""
    a = P.Asm([Symbol("n", 1)])
    f = a.begin("main", [("x", "float32", [Sym(0)]), ("y", "float32", [Sym(0)])], [],
                num_regs=2, heap_size=2)
    a.call(-1, P.B + "match_shape", P.R(0), P.I(0), a.spec(2, 32, [(1, 0)]))
    a.call(-1, P.B + "shape_compute", a.prog((2, 1, 0, 0, 1, 2)))
    a.call(-1, P.B + "match_shape", P.R(1), P.I(1), a.spec(2, 32, [(2, 1)]))
    a.emit(P.ret(1))
    a.end(f)
    vm = VirtualMachine(a.build())
    for n in (3, 3, 4, 3):
        y = np.arange(2 * n, dtype=np.float32)
        np.testing.assert_array_equal(vm["main"](np.zeros(n, np.float32), y).numpy(), y)
        with pytest.raises(ShapeError, match=f"input 'y' dim 0: symbol n is {2 * n}"):
            vm["main"](np.zeros(n, np.float32), np.zeros(2 * n + 1, np.float32))
    assert vm.replay_stats()["replays"] == 3


def test_shape_program_results_follow_the_symbols_between_calls():
    """Shape programs remember their results by the values they read (``n``): alternating
    ``n`` must still give ``3n`` for each (2n, then 2n + n: a slot written then read)."""
    a = P.Asm([Symbol("n", 1)])
    f = a.begin("main", [("x", "float32", [Sym(0)]), ("y", "float32", [Sym(0)])], [],
                num_regs=2, heap_size=3)
    a.call(-1, P.B + "match_shape", P.R(0), P.I(0), a.spec(2, 32, [(1, 0)]))
    a.call(-1, P.B + "shape_compute", a.prog((2, 1, 0, 0, 1, 2), (0, 2, 0, 1, 0, 0)))
    a.call(-1, P.B + "match_shape", P.R(1), P.I(1), a.spec(2, 32, [(2, 2)]))
    a.emit(P.ret(1))
    a.end(f)
    vm = VirtualMachine(a.build())
    for n in (2, 5, 2, 7, 5):
        y = np.arange(3 * n, dtype=np.float32)
        np.testing.assert_array_equal(vm["main"](np.zeros(n, np.float32), y).numpy(), y)
        with pytest.raises(ShapeError, match=f"symbol n is {3 * n}"):
            vm["main"](np.zeros(n, np.float32), np.zeros(2 * n, np.float32))


def test_inputs_are_not_kept_alive(vm):
    import gc
    import weakref

    for make in (lambda a: a, rt.array):
        x, y = (make(a) for a in _xy(4))
        refs = [weakref.ref(x), weakref.ref(y)]
        vm["main"](x, y)  # recorded
        vm["main"](x, y)  # replayed
        del x, y
        gc.collect()
        assert all(r() is None for r in refs)


def _stack_program(dims: list[int]) -> VMExecutable:
    """``main(x: f32[n])``: a list with x appended twice (then x overwritten, as a loop body's
    arena would be), stacked with element ``dims``."""
    a = P.Asm([Symbol("n", 0)])
    f = a.begin("main", [("x", "float32", [Sym(0)])], [], num_regs=3, heap_size=1)
    a.call(-1, P.B + "match_shape", P.R(0), P.I(0), a.spec(2, 32, [(1, 0)]))
    a.call(1, P.B + "list_new")
    a.call(-1, P.B + "list_append", P.R(1), P.R(0))
    a.call(-1, P.B + "list_append", P.R(1), P.R(0))
    a.call(-1, P.B + "copy", a.c(rt.array(np.zeros(3, np.float32))), P.R(0))
    a.call(2, P.B + "list_stack", P.R(1), a.c("loop 'L' scan output 0"), a.c("float32"),
           *dims)
    a.emit(P.ret(2))
    a.end(f)
    return a.build()


def test_scan_lists_stack_copies_of_their_elements():
    x = np.arange(3, dtype=np.float32)
    want = np.stack([x, x])  # (before the call: the program then zeroes its input, which is
    # x itself when x happens to be aligned for a zero-copy view)
    got = VirtualMachine(_stack_program([P.H(0)]))["main"](x).numpy()
    np.testing.assert_array_equal(got, want)  # copies: not the zeros copied later
    with pytest.raises(ShapeError, match=r"loop 'L' scan output 0: iteration 0 gave "
                                         r"float32\[3\], expected float32\[4\]"):
        VirtualMachine(_stack_program([P.I(4)]))["main"](x)


@pytest.mark.parametrize("exe, message", [
    (_one_builtin("list_new", P.R(0)), "expects 0 arguments"),
    (_one_builtin("list_stack", P.R(0), P.const(0), P.const(0), constants=[np.zeros(1, np.int64)]),
     "argument 1 must be a constant label"),
    (_one_builtin("list_stack", P.R(0), P.const(0), P.const(1), P.R(0),
                  constants=["label", "float32"]), "immediate or a heap slot"),
])
def test_scan_list_call_sites_checked_at_initialization(exe, message):
    with pytest.raises(ModuleLoadError, match=message):
        VirtualMachine(exe)


def _fixed_storage_copy() -> VMExecutable:
    """``main(x: f32[n]) = copy of x`` in a storage of a fixed 256 bytes: the view fits for
    ``n <= 64`` only (a sloppy executable: the interpreter's check rejects larger ``n``)."""
    a = P.Asm([Symbol("n", 1)])
    f = a.begin("main", [("x", "float32", [Sym(0)])], [], num_regs=3, heap_size=1)
    a.call(-1, P.B + "match_shape", P.R(0), P.I(0), a.spec(2, 32, [(1, 0)]))
    a.call(1, P.B + "alloc_storage", P.I(0), P.I(256))
    a.call(2, P.B + "alloc_tensor", P.R(1), P.I(0), a.c("float32"), P.H(0))
    a.call(-1, P.B + "copy", P.R(0), P.R(2))
    a.emit(P.ret(2))
    a.end(f)
    return a.build()


def test_a_replay_whose_view_check_fails_is_interpreted():
    vm = VirtualMachine(_fixed_storage_copy())
    for n in (4, 8, 64):
        x = RNG.standard_normal(n).astype(np.float32)
        np.testing.assert_array_equal(vm["main"](x).numpy(), x)
    with pytest.raises(KilnError, match="does not fit storage 0 of 256 bytes"):
        vm["main"](np.zeros(65, np.float32))  # the replay's check fails: interpreted, raises
    x = RNG.standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(vm["main"](x).numpy(), x)
    stats = vm.replay_stats()
    assert stats["recordings"] == 1 and stats["replays"] == 3 and stats["interpreted"] == 2


def test_replay_at_random_shapes_matches_the_interpreter():
    """``add_mul`` over ``[n, 4]`` with random n, replayed, against numpy and an interpreted
    VM (``profile`` interprets)."""
    vm = VirtualMachine(P.add_mul(P.py_kernels()))
    ref = VirtualMachine(P.add_mul(P.py_kernels()))
    for n in RNG.integers(1, 65, 12):
        x, y = _xy(int(n))
        got = vm["main"](x, y).numpy()
        ref.profile("main", x, y)
        np.testing.assert_allclose(got, (x + y) * x, rtol=1e-6)
    assert vm.replay_stats()["replays"] == 11


def _identity_exe() -> VMExecutable:
    """``vec(x: f32[2]) -> x`` and ``scalar(s: f32[]) -> s``, without ``match_shape``: the
    conversion of the inputs alone decides their dtype."""
    a = P.Asm([])
    for name, dims in (("vec", [2]), ("scalar", [])):
        f = a.begin(name, [("x", "float32", dims)], [("out", "float32", dims)], num_regs=1,
                    heap_size=0)
        a.emit(P.ret(0))
        a.end(f)
    return a.build(P.py_kernels())


class _Subclass(np.ndarray):
    pass


@pytest.mark.parametrize("fn, value, given", [
    ("vec", np.ones(2), "float64"),
    ("vec", np.ones(2, np.int32), "int32"),
    ("vec", rt.array(np.ones(2)), "float64"),
    ("vec", np.ones(2).view(_Subclass), "float64"),
    ("scalar", np.float64(1.5), "float64"),  # a numpy scalar has a dtype
])
def test_tensors_of_another_dtype_are_refused_not_converted(fn, value, given):
    vm = VirtualMachine(_identity_exe())
    match = (rf"VM function '{fn}': input 'x': expected dtype float32, got {given} \(tensors are "
             r"not converted: cast with .astype\('float32'\)\)")
    with pytest.raises(ShapeError, match=match):
        vm[fn](value)
    with pytest.raises(ShapeError, match=match):
        vm.set_input(fn, value)


def test_python_scalars_and_lists_take_the_input_dtype():
    vm = VirtualMachine(_identity_exe())
    out = vm["vec"]([1, 2.5])
    assert out.dtype == "float32" and out.numpy().tolist() == [1.0, 2.5]
    assert vm["scalar"](1.5).dtype == "float32"
    assert vm["vec"](np.ones(2, np.float32)).dtype == "float32"
    big_endian = np.array([1, 2], ">f4")  # the same dtype in another byte order: copied
    np.testing.assert_array_equal(vm["vec"](big_endian).numpy(), [1, 2])
