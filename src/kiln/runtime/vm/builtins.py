"""The VM's builtins (``vm.builtin.*``, decision 014), prepared once per call site.

TVM's Relax VM builtins (src/runtime/relax_vm/builtin.cc: ``match_shape``, ``alloc_storage``,
``alloc_tensor``, ``reshape``, ``make_tuple``, ``tuple_getitem``...). Each builtin here is a
*factory*: at ``vm_initialization`` it receives the call site's decoded arguments, checks the
static ones (immediates, constant specs and programs; a malformed executable fails there, not at
run time) and returns ``run(frame, args) -> value``, which sees only the resolved arguments.

Builtins that matter to the replay of recorded calls (``replay.py``) carry ``run.effect``:
``"storage"`` (its result's generation must still be current), ``"copy"`` (a side effect that a
replay repeats), ``"data"`` (its result or the heap slots it writes depend on tensor data: a
replay runs it and guards on the slots); the shape checks carry ``run.stage`` (``"match"``,
``"compute"``): they run on every call, before a replay is chosen. ``run.writes`` lists the
heap slots a builtin writes; ``run.shape_only`` marks ``bind_shape``, which reads only its
tensor's shape (of a parameter, that is a shape check like ``match_shape``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import KilnError, ModuleLoadError, ShapeError
from kiln.runtime import c_types as C
from kiln.runtime.ndarray import NDArray, array, checked_nbytes
from kiln.runtime.vm.bytecode import CONST, HEAP, IMM, REG
from kiln.runtime.vm.dynamic_builtins import DYNAMIC_BUILTINS
from kiln.runtime.vm.executable_format import Sym, Symbol, VMFunction
from kiln.runtime.vm.kv_cache import KV_BUILTINS
from kiln.runtime.vm.list_builtins import LIST_BUILTINS
from kiln.runtime.vm.storage import Storage

PREFIX = "vm.builtin."
#: storage ids a function may use
MAX_STORAGE_ID = 1 << 16
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_SHAPE_OPS = ("add", "sub", "mul", "floordiv", "floormod", "min", "max")

Run = Callable[["Frame", list], Any]


class Frame:
    """One call's state: registers, shape heap, and where storage ids are scoped."""

    __slots__ = ("func", "heap", "level", "recorder", "regs", "vm")

    def __init__(self, vm: Any, func: int, level: int, regs: list, heap: list[int]):
        self.vm = vm
        self.func = func
        self.level = level
        self.regs = regs
        self.heap = heap
        self.recorder: Any = None


@dataclass(frozen=True)
class Site:
    """What a builtin factory knows about its call site."""

    name: str
    args: tuple[tuple[int, int], ...]
    func: VMFunction
    symbols: Sequence[Symbol]
    constants: Sequence[Any]
    where: str  # "function 'main' instruction 3", for messages

    def fail(self, msg: str) -> ModuleLoadError:
        return ModuleLoadError(f"VM executable: {self.where}: {self.name}: {msg}")

    def nargs(self, lo: int, hi: int | None = None) -> None:
        n = len(self.args)
        if n < lo or (hi is not None and n > hi):
            want = str(lo) if hi == lo else f"{lo}..{'' if hi is None else hi}"
            raise self.fail(f"expects {want} arguments, got {n}")

    def imm(self, i: int) -> int:
        kind, value = self.args[i]
        if kind != IMM:
            raise self.fail(f"argument {i} must be an immediate")
        return value

    def int_array(self, i: int) -> list[int]:
        kind, value = self.args[i]
        c = self.constants[value] if kind == CONST else None
        if not isinstance(c, np.ndarray):
            raise self.fail(f"argument {i} must be a constant int64 array")
        return c.tolist()

    def str_const(self, i: int, what: str) -> str:
        """Argument ``i``, which must be a constant string (a label, a dtype, a message)."""
        kind, value = self.args[i]
        c = self.constants[value] if kind == CONST else None
        if not isinstance(c, str):
            raise self.fail(f"argument {i} must be a constant {what}")
        return c

    def size_arg(self, i: int) -> None:
        if self.args[i][0] not in (IMM, HEAP):
            raise self.fail(f"argument {i} must be an immediate or a heap slot")

    def reg_arg(self, i: int) -> None:
        if self.args[i][0] != REG:
            raise self.fail(f"argument {i} must be a register")

    def slot(self, value: int, what: str) -> int:
        if not 0 <= value < self.func.heap_size:
            raise self.fail(f"{what}: heap slot {value} out of range "
                            f"(0..{self.func.heap_size - 1})")
        return value


# ------------------------------------------------------------------------- match_shape
@dataclass(frozen=True)
class _DimCheck:
    kind: int  # 0 equal to value, 1 bind slot value, 2 equal to slot value
    value: int
    symbol: str
    lo: int
    hi: int | None
    divisor: int


def _symbol_name(site: Site, param: int, dim: int, slot: int) -> str:
    if slot < len(site.symbols):
        return site.symbols[slot].name
    params = site.func.params
    if 0 <= param < len(params) and dim < len(params[param].dims):
        d = params[param].dims[dim]
        if isinstance(d, Sym):
            return site.symbols[d.index].name
    return f"heap[{slot}]"


def _parse_spec(site: Site, param: int) -> tuple[str, list[_DimCheck]]:
    spec = site.int_array(2)
    if len(spec) < 3:
        raise site.fail("the match spec is shorter than its 3-word header")
    code, bits, ndim = spec[:3]
    if not (0 <= code < 256 and 0 <= bits < 256) or ndim < 0 or len(spec) != 3 + 2 * ndim:
        raise site.fail(f"malformed match spec header {spec[:3]} for {len(spec)} words")
    try:
        dtype = C.dtype_from_dl(code, bits, 1)
    except KilnError as err:
        raise site.fail(str(err)) from None
    checks = []
    for i in range(ndim):
        kind, value = spec[3 + 2 * i], spec[4 + 2 * i]
        if kind == 0:
            if value < 0:
                raise site.fail(f"dim {i} must equal {value}, a negative size")
            checks.append(_DimCheck(0, value, "", 0, None, 1))
            continue
        if kind not in (1, 2):
            raise site.fail(f"dim {i}: unknown check kind {kind}")
        site.slot(value, f"dim {i}")
        sym = site.symbols[value] if value < len(site.symbols) else Symbol("")
        checks.append(_DimCheck(kind, value, _symbol_name(site, param, i, value), sym.lo,
                                sym.hi, sym.divisor))
    return dtype, checks


def check_bounds(what: str, sym: str, v: int, lo: int, hi: int | None, divisor: int) -> None:
    """Raise ShapeError when ``v`` breaks a symbol's bounds or divisibility, naming the
    relation it breaks (``needs sequence_length <= 512``: declared, or assumed by the
    compiler, kiln.relay.assume)."""
    if v < lo or (hi is not None and v > hi):
        need = f"{sym} >= {lo}" if v < lo else f"{sym} <= {hi}"
        raise ShapeError(f"{what}: symbol {sym} = {v} is outside its bounds [{lo}, "
                         f"{'inf' if hi is None else hi}] (needs {need})")
    if v % divisor:
        raise ShapeError(f"{what}: symbol {sym} = {v} is not a multiple of {divisor} (needs "
                         f"{sym} % {divisor} == 0)")


def match_shape(site: Site) -> Run:
    """``match_shape(tensor, IMM param, CONST spec)``: check a parameter's type, dtype, rank
    and dims; bind (first occurrence) or check (later ones) the heap slots of its symbols."""
    site.nargs(3, 3)
    param = site.imm(1)
    dtype, checks = _parse_spec(site, param)
    params = site.func.params
    name = params[param].name if 0 <= param < len(params) else f"#{param}"
    label = f"input {name!r}"
    ndim = len(checks)

    def run(frame: Frame, args: list) -> None:
        t = args[0]
        if type(t) is not NDArray:
            raise ShapeError(f"{label}: expected a tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise ShapeError(f"{label}: expected dtype {dtype}, got {t.dtype}")
        shape = t._arr.shape
        if len(shape) != ndim:
            raise ShapeError(f"{label}: expected rank {ndim}, got shape {tuple(shape)}")
        heap = frame.heap
        for i, c in enumerate(checks):
            d = shape[i]
            if c.kind == 0:
                if d != c.value:
                    raise ShapeError(f"{label} dim {i}: expected {c.value} but got {d}")
            elif c.kind == 1:
                check_bounds(f"{label} dim {i}", c.symbol, d, c.lo, c.hi, c.divisor)
                heap[c.value] = d
            elif heap[c.value] != d:
                raise ShapeError(f"{label} dim {i}: symbol {c.symbol} is {heap[c.value]} (from "
                                 f"an earlier input) but got {d}")

    run.stage = "match"  # type: ignore[attr-defined]
    return run


def bind_shape(site: Site) -> Run:
    """``bind_shape(tensor, CONST label, CONST spec)``: bind the late symbols of a value an op
    computed (a data-dependent shape, decision 016) from its actual shape; the spec is
    ``match_shape``'s (dims equal, bind a slot, check a slot). A symbol outside its bounds,
    or a dim that differs from what was bound or known, raises ShapeError naming ``label``
    (the op and node) and the symbol."""
    site.nargs(3, 3)
    dtype, checks = _parse_spec(site, -1)
    label = site.str_const(1, "label")
    ndim = len(checks)

    def run(frame: Frame, args: list) -> None:
        t = args[0]
        if type(t) is not NDArray or t.dtype != dtype or t._arr.ndim != ndim:
            got = f"{t.dtype}{list(t.shape)}" if type(t) is NDArray else type(t).__name__
            raise ShapeError(f"{label}: expected a rank-{ndim} {dtype} tensor, got {got}")
        heap = frame.heap
        for i, (c, d) in enumerate(zip(checks, t._arr.shape)):
            if c.kind == 1:
                check_bounds(f"{label} dim {i}", c.symbol, d, c.lo, c.hi, c.divisor)
                heap[c.value] = d
            elif d != (c.value if c.kind == 0 else heap[c.value]):
                want = c.value if c.kind == 0 else heap[c.value]
                if c.kind == 2 and not c.symbol.startswith("heap["):  # a named symbol
                    want = f"{c.symbol} = {want}"
                raise ShapeError(f"{label} dim {i}: expected {want} but got {d}")

    run.effect = "data"  # type: ignore[attr-defined]
    # (it reads only its tensor's shape: on a parameter, a shape check like match_shape)
    run.shape_only = True  # type: ignore[attr-defined]
    run.writes = tuple(c.value for c in checks if c.kind == 1)  # type: ignore[attr-defined]
    return run


# ----------------------------------------------------------------------- shape_compute
def _floordiv(a: int, b: int) -> int:
    if b == 0:
        raise ShapeError("shape computation divides by zero")
    return a // b


def _floormod(a: int, b: int) -> int:
    if b == 0:
        raise ShapeError("shape computation takes a value modulo zero")
    return a % b


_OPS: tuple[Callable[[int, int], int], ...] = (
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, _floordiv, _floormod, min, max)


def shape_compute(site: Site) -> Run:
    """``shape_compute(CONST program)``: ``[op, dst, a_kind, a, b_kind, b]*`` over the heap
    (kind 0 slot, 1 immediate); results must fit in int64."""
    site.nargs(1, 1)
    prog = site.int_array(0)
    if len(prog) % 6:
        raise site.fail(f"a shape program has 6 words per step, got {len(prog)} words")
    steps = []
    for s in range(0, len(prog), 6):
        op, dst, ak, a, bk, b = prog[s:s + 6]
        if not 0 <= op < len(_OPS):
            raise site.fail(f"step {s // 6}: unknown op {op}")
        site.slot(dst, f"step {s // 6} destination")
        for kind, v in ((ak, a), (bk, b)):
            if kind not in (0, 1):
                raise site.fail(f"step {s // 6}: unknown operand kind {kind}")
            if kind == 0:
                site.slot(v, f"step {s // 6} operand")
        steps.append((_OPS[op], dst, ak == 1, a, bk == 1, b, _SHAPE_OPS[op]))
    inputs = _program_inputs(steps)
    dsts = [step[1] for step in steps]
    memo: dict[tuple[int, ...], list[int]] = {}

    def run(frame: Frame, args: list) -> None:
        heap = frame.heap
        key = tuple([heap[s] for s in inputs])
        values = memo.get(key)
        if values is not None:  # the same symbol values as an earlier call: same results
            for dst, v in zip(dsts, values):
                heap[dst] = v
            return
        for fn, dst, a_imm, a, b_imm, b, opname in steps:
            v = fn(a if a_imm else heap[a], b if b_imm else heap[b])
            if not _I64_MIN <= v <= _I64_MAX:
                raise ShapeError(f"shape computation overflows int64 ({opname} gives {v})")
            heap[dst] = v
        if len(memo) >= _SHAPE_MEMO:
            memo.clear()
        memo[key] = [heap[d] for d in dsts]

    run.stage = "compute"  # type: ignore[attr-defined]
    run.writes = tuple(dict.fromkeys(dsts))  # type: ignore[attr-defined]
    return run


#: shape-program results kept per call site, by the values of the slots the program reads
#: (a program is a pure function of them; silero VAD's 118 steps cost ~110 µs a call in Python)
_SHAPE_MEMO = 64


def _program_inputs(steps: list[tuple]) -> list[int]:
    """The heap slots a shape program reads before (or without) writing them."""
    written: set[int] = set()
    inputs: list[int] = []
    for _, dst, a_imm, a, b_imm, b, _ in steps:
        for is_imm, v in ((a_imm, a), (b_imm, b)):
            if not is_imm and v not in written and v not in inputs:
                inputs.append(v)
        written.add(dst)
    return inputs


# -------------------------------------------------------------------------- storage
def alloc_storage(site: Site) -> Run:
    """``alloc_storage(IMM id, size)``: the function's storage ``id`` with at least ``size``
    bytes (kept across calls, grown only when needed)."""
    site.nargs(2, 2)
    sid = site.imm(0)
    if not 0 <= sid < MAX_STORAGE_ID:
        raise site.fail(f"storage id {sid} out of range (0..{MAX_STORAGE_ID - 1})")
    site.size_arg(1)

    def run(frame: Frame, args: list) -> Any:
        return frame.vm.arena.alloc((frame.func, frame.level, sid), args[1])

    run.effect = "storage"  # type: ignore[attr-defined]
    return run


def _dims_args(site: Site, first: int) -> None:
    for i in range(first, len(site.args)):
        site.size_arg(i)


def alloc_tensor(site: Site) -> Run:
    """``alloc_tensor(storage, offset, CONST dtype, dims...)``: an NDArray view of the
    storage."""
    site.nargs(3)
    site.size_arg(1)
    dtype_const = site.str_const(2, "dtype string")
    try:
        dtype = C.dtype_name(dtype_const)
    except KilnError as err:
        raise site.fail(str(err)) from None
    _dims_args(site, 3)

    def run(frame: Frame, args: list) -> NDArray:
        st = args[0]
        if type(st) is not Storage:
            raise KilnError(f"vm.builtin.alloc_tensor: argument 0 is {type(st).__name__}, not "
                            "a storage")
        return st.view(args[1], dtype, tuple(args[3:]))

    return run


# ---------------------------------------------------------------------- tensor builtins
def _tensor(v: Any, builtin: str, i: int = 0) -> NDArray:
    if type(v) is not NDArray:
        raise KilnError(f"vm.builtin.{builtin}: argument {i} is {type(v).__name__}, not a "
                        "tensor")
    return v


def reshape(site: Site) -> Run:
    """``reshape(tensor, dims...)``: a view with another shape (the same bytes)."""
    site.nargs(1)
    _dims_args(site, 1)
    key = object()  # this call site, for the VM's cache of the last view made here

    def run(frame: Frame, args: list) -> NDArray:
        t = _tensor(args[0], "reshape")
        shape = tuple(args[1:])
        if t._arr.shape == shape:
            return t
        n = checked_nbytes(shape, t._arr.itemsize)
        if n != t._arr.nbytes:
            raise ShapeError(f"vm.builtin.reshape: cannot view {t.dtype}{list(t.shape)} as "
                             f"{list(shape)}")
        return frame.vm.reshaped(t, shape, key)

    return run


def copy(site: Site) -> Run:
    """``copy(src, dst)``: copy the bytes of ``src`` into ``dst`` (same shape and dtype)."""
    site.nargs(2, 2)

    def run(frame: Frame, args: list) -> None:
        src, dst = _tensor(args[0], "copy"), _tensor(args[1], "copy", 1)
        if src._arr.shape != dst._arr.shape or src.dtype != dst.dtype:
            raise ShapeError(f"vm.builtin.copy: {src.dtype}{list(src.shape)} into "
                             f"{dst.dtype}{list(dst.shape)}")
        np.copyto(dst._arr, src._arr)

    run.effect = "copy"  # type: ignore[attr-defined]
    return run


def tensor_to_heap(site: Site) -> Run:
    """``tensor_to_heap(int tensor, CONST slots)``: the tensor's values into heap slots
    (symbol slots are checked against their bounds)."""
    site.nargs(2, 2)
    slots = [site.slot(s, "slot list") for s in site.int_array(1)]
    bounds = [site.symbols[s] if s < len(site.symbols) else None for s in slots]

    def run(frame: Frame, args: list) -> None:
        t = _tensor(args[0], "tensor_to_heap")
        if t._arr.dtype.kind not in "iu":
            raise ShapeError(f"vm.builtin.tensor_to_heap: expected an integer tensor, got "
                             f"{t.dtype}")
        values = t._arr.reshape(-1).tolist()
        if len(values) != len(slots):
            raise ShapeError(f"vm.builtin.tensor_to_heap: {len(values)} values for "
                             f"{len(slots)} slots")
        heap = frame.heap
        for slot, v, sym in zip(slots, values, bounds):
            if sym is not None:
                check_bounds("data-dependent shape", sym.name, v, sym.lo, sym.hi, sym.divisor)
            heap[slot] = int(v)

    run.effect = "data"  # type: ignore[attr-defined]
    run.writes = tuple(dict.fromkeys(slots))  # type: ignore[attr-defined]
    return run


def shape_to_tensor(site: Site) -> Run:
    """``shape_to_tensor(CONST dtype, CONST shape, values...)``: a new tensor of ``shape``
    holding the values (immediates or heap slots): shape arithmetic used as data."""
    site.nargs(2)
    dtype = site.str_const(0, "integer dtype name")
    if np.dtype(dtype).kind not in "iu":
        raise site.fail("argument 0 must be a constant integer dtype name")
    shape = tuple(site.int_array(1))
    _dims_args(site, 2)
    if any(d < 0 for d in shape) or math.prod(shape) != len(site.args) - 2:
        raise site.fail(f"{len(site.args) - 2} values for shape {list(shape)}")

    def run(frame: Frame, args: list) -> NDArray:
        return array(np.array(args[2:], dtype=dtype).reshape(shape))

    return run


def trap(site: Site) -> Run:
    """``trap(CONST message)``: raise ``message`` (a branch that cannot run at these
    shapes)."""
    site.nargs(1, 1)
    message = site.str_const(0, "message")

    def run(frame: Frame, args: list) -> None:
        raise ShapeError(message)

    run.effect = "data"  # type: ignore[attr-defined]
    return run


def read_bool(site: Site) -> Run:
    """``read_bool(tensor)``: a one-element tensor's truth value (``If``'s condition)."""
    site.nargs(1, 1)

    def run(frame: Frame, args: list) -> bool:
        v = args[0]
        if type(v) is not NDArray:
            return bool(v)
        if v._arr.size != 1:
            raise ShapeError(f"vm.builtin.read_bool: expected one element, got shape "
                             f"{list(v.shape)}")
        return bool(v._arr.reshape(-1)[0])

    run.effect = "data"  # type: ignore[attr-defined]
    return run


def make_tuple(site: Site) -> Run:
    """``make_tuple(values...)``: a tuple (several outputs)."""
    return lambda frame, args: tuple(args)


def tuple_get(site: Site) -> Run:
    """``tuple_get(tuple, IMM index)``: one item."""
    site.nargs(2, 2)
    index = site.imm(1)

    def run(frame: Frame, args: list) -> Any:
        t = args[0]
        if type(t) is not tuple or not 0 <= index < len(t):
            n = len(t) if type(t) is tuple else None
            raise KilnError(f"vm.builtin.tuple_get: item {index} of "
                            f"{'a tuple of ' + str(n) if n is not None else type(t).__name__}")
        return t[index]

    return run


BUILTINS: dict[str, Callable[[Site], Run]] = {
    PREFIX + f.__name__: f for f in (match_shape, bind_shape, shape_compute, alloc_storage,
                                     alloc_tensor, reshape, copy, tensor_to_heap,
                                     shape_to_tensor, trap, read_bool, make_tuple, tuple_get)
}
BUILTINS.update((PREFIX + name, f) for name, f in DYNAMIC_BUILTINS.items())
BUILTINS.update((PREFIX + name, f) for name, f in LIST_BUILTINS.items())
BUILTINS.update((PREFIX + name, f) for name, f in KV_BUILTINS.items())
#: builtins (names without :data:`PREFIX`) that the native runtime's C VM does not implement,
#: with the reason; it refuses them at ``vm_initialization`` naming the builtin and pointing to
#: this runtime (the list is generated into its ``rt_vocabulary.h``, and
#: tests/unit/native/test_c_vocabulary.py checks every other name here against the C dispatch)
PYTHON_ONLY_BUILTINS: dict[str, str] = {
    "unique": "not ported to C yet (decision 022, left for later): numpy's sorted unique with "
              "first indices, inverse and counts, four data-dependent outputs",
    "non_max_suppression": "not ported to C yet (decision 022, left for later): ONNX's greedy "
                           "per-batch, per-class IoU selection",
}


def prepare_builtin(site: Site) -> Run:
    """The prepared builtin of a call site.

    Raises
    ------
    KilnError
        ``site.name`` is not a builtin (naming the known ones).
    ModuleLoadError
        Malformed static arguments.
    """
    factory = BUILTINS.get(site.name)
    if factory is None:
        raise KilnError(f"VM executable: {site.where}: unknown builtin {site.name!r} (known: "
                        f"{', '.join(sorted(BUILTINS))})")
    return factory(site)


__all__ = ["BUILTINS", "PREFIX", "PYTHON_ONLY_BUILTINS", "Frame", "Site", "check_bounds",
           "prepare_builtin"]
