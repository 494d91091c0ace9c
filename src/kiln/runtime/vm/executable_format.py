"""The VM executable's byte format: a versioned section table (decision 014).

Little-endian. Header: magic ``b"KILNVMEX"``, ``u32`` version (1), ``u32 n_sections``, then
``n_sections × (u32 id, u64 offset, u64 length)``; offsets count from the start of the bytes.
Sections: 1 symbols, 2 functions, 3 constants, 4 code (payloads: docs/formats.md §9.2), and the
optional 5 sources (the ONNX nodes of each kernel call, for profiles; readers that do not
profile, the C runtime among them, skip it as an unknown id).
Strings use the stream encoding (``u64`` length + UTF-8, docs/formats.md §1), tensors the
NDArray format of §5.

Reading checks every offset, length and count against the bytes present *before* allocating,
skips unknown section ids, and raises :class:`ModuleLoadError` naming the section and the field
for anything malformed (never ``IndexError``/``struct.error``/``MemoryError``).

The C reader's copy of the magic, version, section ids, function kinds and constant tags
(``rt_vocabulary.h`` of the native runtime) is generated from this module by ``make
vocabulary`` (tools/gen_c_vocabulary.py); a unit test fails when it is stale.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from kiln.errors import KilnError, ModuleLoadError
from kiln.runtime import c_types as C
from kiln.runtime.ndarray import NDArray
from kiln.runtime.params import read_ndarray, write_ndarray
from kiln.runtime.stream import StreamReader, StreamWriter

MAGIC = b"KILNVMEX"
VERSION = 1
SEC_SYMBOLS = 1
SEC_FUNCTIONS = 2
SEC_CONSTANTS = 3
SEC_CODE = 4
SECTION_NAMES = {SEC_SYMBOLS: "symbols", SEC_FUNCTIONS: "functions",
                 SEC_CONSTANTS: "constants", SEC_CODE: "code"}
#: optional sections (not SEC_*: the C vocabulary lists the required ones only)
OPT_SOURCES = 5
OPTIONAL_SECTION_NAMES = {OPT_SOURCES: "sources"}
#: ``(VM function name, word index of a kernel call) → (ONNX node names, their op types)``
Sources = dict[tuple[str, int], tuple[tuple[str, ...], tuple[str, ...]]]
_ENTRY = struct.Struct("<IQQ")
_HEADER = struct.Struct("<8sII")
#: bytes of the header (magic, version, section count) and of one section table entry
HEADER_SIZE = _HEADER.size
ENTRY_SIZE = _ENTRY.size

KIND_PACKED = 0
KIND_VM = 1

# constant pool tags
TAG_NDARRAY = 0
TAG_INT_ARRAY = 1
TAG_STRING = 2
TAG_INT = 3

#: a dim of a signature: an int (>= 0) or the index of a symbol (``Sym(i)``)
Dim = int


@dataclass(frozen=True)
class Sym:
    """A signature dim that is symbol ``index`` of the executable's symbol table."""

    index: int


@dataclass(frozen=True)
class Symbol:
    """A symbolic dim: its name, bounds (``hi`` None: unbounded) and divisibility.

    Attributes
    ----------
    name : str
        The model's name for it (ONNX ``dim_param``), e.g. ``"sequence_length"``.
    lo : int
        Smallest allowed value (>= 0).
    hi : int or None
        Largest allowed value, or None.
    divisor : int
        Values must be multiples of it (1: any).
    """

    name: str
    lo: int = 0
    hi: int | None = None
    divisor: int = 1

    def describe(self) -> str:
        """``name in [lo, hi] divisible by d`` (the parts that constrain it)."""
        text = f"{self.name} in [{self.lo}, {'inf' if self.hi is None else self.hi}]"
        return text + (f" divisible by {self.divisor}" if self.divisor != 1 else "")


@dataclass(frozen=True)
class TensorSig:
    """A parameter or output of a function: name, dtype and dims (ints or :class:`Sym`)."""

    name: str
    dtype: str
    dims: tuple[int | Sym, ...]


@dataclass(frozen=True)
class VMFunction:
    """An entry of the function table.

    Attributes
    ----------
    kind : int
        0 packed (a kernel of the library, or a ``vm.builtin.*``), 1 VM bytecode.
    name : str
    start, end : int
        VM functions: their instruction words ``code[start:end]``.
    num_regs : int
        VM functions: registers per call; parameters arrive in ``0..len(params)-1``.
    heap_size : int
        VM functions: shape-heap slots per call (at least the number of symbols).
    params, outputs : tuple of TensorSig
        The signature (packed functions may leave them empty).
    """

    kind: int
    name: str
    start: int = 0
    end: int = 0
    num_regs: int = 0
    heap_size: int = 0
    params: tuple[TensorSig, ...] = ()
    outputs: tuple[TensorSig, ...] = ()

    @property
    def is_vm(self) -> bool:
        return self.kind == KIND_VM


Constant = NDArray | np.ndarray | str | int


# ------------------------------------------------------------------------------- writing
def _write_sigs(w: StreamWriter, sigs: tuple[TensorSig, ...]) -> None:
    w.u64(len(sigs))
    for s in sigs:
        w.string(s.name)
        w.string(s.dtype)
        w.u64(len(s.dims))
        for d in s.dims:
            w.i64(-1 - d.index if isinstance(d, Sym) else int(d))


def _symbols_bytes(symbols: list[Symbol]) -> bytes:
    w = StreamWriter()
    w.u64(len(symbols))
    for s in symbols:
        w.string(s.name)
        w.i64(s.lo)
        w.i64(-1 if s.hi is None else s.hi)
        w.i64(s.divisor)
    return w.getvalue()


def _functions_bytes(functions: list[VMFunction]) -> bytes:
    w = StreamWriter()
    w.u64(len(functions))
    for f in functions:
        w.i32(f.kind)
        w.string(f.name)
        for v in (f.start, f.end, f.num_regs, f.heap_size):
            w.i64(v)
        _write_sigs(w, f.params)
        _write_sigs(w, f.outputs)
    return w.getvalue()


def _constants_bytes(constants: list[Constant]) -> bytes:
    w = StreamWriter()
    w.u64(len(constants))
    for c in constants:
        if isinstance(c, NDArray):
            w.u32(TAG_NDARRAY)
            write_ndarray(w, c)
        elif isinstance(c, np.ndarray):
            w.u32(TAG_INT_ARRAY)
            w.u64(c.size)
            w.raw(np.ascontiguousarray(c, dtype="<i8").tobytes())
        elif isinstance(c, str):
            w.u32(TAG_STRING)
            w.string(c)
        else:
            w.u32(TAG_INT)
            w.i64(int(c))
    return w.getvalue()


def _code_bytes(code: np.ndarray) -> bytes:
    w = StreamWriter()
    w.u64(code.size)
    w.raw(np.ascontiguousarray(code, dtype="<i8").tobytes())
    return w.getvalue()


def _sources_bytes(sources: Sources) -> bytes:
    w = StreamWriter()
    w.u64(len(sources))
    for (func, pc), (nodes, op_types) in sorted(sources.items()):
        w.string(func)
        w.i64(pc)
        w.vec_str(list(nodes))
        w.vec_str(list(op_types))
    return w.getvalue()


def write_executable(symbols: list[Symbol], functions: list[VMFunction],
                     constants: list[Constant], code: np.ndarray,
                     sources: Sources | None = None) -> bytes:
    """The executable's bytes (see the module doc); the sources section only when
    ``sources`` has entries (an executable without them is byte for byte as before)."""
    sections = [(SEC_SYMBOLS, _symbols_bytes(symbols)),
                (SEC_FUNCTIONS, _functions_bytes(functions)),
                (SEC_CONSTANTS, _constants_bytes(constants)),
                (SEC_CODE, _code_bytes(code))]
    if sources:
        sections.append((OPT_SOURCES, _sources_bytes(sources)))
    offset = _HEADER.size + _ENTRY.size * len(sections)
    table = []
    for sid, data in sections:
        table.append(_ENTRY.pack(sid, offset, len(data)))
        offset += len(data)
    return b"".join([_HEADER.pack(MAGIC, VERSION, len(sections)), *table,
                     *(data for _, data in sections)])


# ------------------------------------------------------------------------------- reading
def _read_sections(data: memoryview) -> dict[int, memoryview]:
    r = StreamReader(data, "VM executable")
    magic = bytes(r.raw(8, "magic"))
    if magic != MAGIC:
        raise r.error(f"not a Kiln VM executable: magic {magic!r} (expected {MAGIC!r})")
    version = r.u32("format version")
    if version != VERSION:
        raise r.error(f"format version {version} is not supported (this runtime reads "
                      f"version {VERSION})")
    n = r.u32("section count")
    if n * _ENTRY.size > r.remaining:
        raise r.error(f"corrupt section table: {n} entries cannot fit in {r.remaining} bytes")
    sections: dict[int, memoryview] = {}
    for i in range(n):
        sid, off, length = _ENTRY.unpack(r.raw(_ENTRY.size, f"section table entry {i}"))
        if off > len(data) or length > len(data) - off:
            raise r.error(f"section {SECTION_NAMES.get(sid, sid)} (entry {i}): offset {off} + "
                          f"length {length} runs past the end ({len(data)} bytes)")
        if sid in sections:
            raise r.error(f"section {SECTION_NAMES.get(sid, sid)} appears twice")
        sections[sid] = data[off:off + length]
    for sid, name in SECTION_NAMES.items():
        if sid not in sections:
            raise ModuleLoadError(f"VM executable: required section {name!r} is missing")
    return {sid: v for sid, v in sections.items()
            if sid in SECTION_NAMES or sid in OPTIONAL_SECTION_NAMES}


def _reader(sections: dict[int, memoryview], sid: int) -> StreamReader:
    name = SECTION_NAMES.get(sid) or OPTIONAL_SECTION_NAMES[sid]
    return StreamReader(sections[sid], f"VM executable section {name!r}")


def _done(r: StreamReader) -> None:
    if r.remaining:
        raise r.error(f"{r.remaining} unexpected trailing bytes")


def _read_symbols(r: StreamReader) -> list[Symbol]:
    n = r.count(32, "symbol count")  # name length + lo + hi + divisor
    out = []
    for i in range(n):
        name = r.string(f"symbol {i} name")
        lo, hi, div = r.i64(f"symbol {name!r} lo"), r.i64(f"symbol {name!r} hi"), \
            r.i64(f"symbol {name!r} divisor")
        if lo < 0 or hi < -1 or (hi != -1 and hi < lo) or div < 1:
            raise r.error(f"corrupt symbol {name!r}: lo {lo}, hi {hi}, divisor {div}")
        out.append(Symbol(name, lo, None if hi == -1 else hi, div))
    _done(r)
    return out


def _read_sigs(r: StreamReader, what: str) -> tuple[TensorSig, ...]:
    n = r.count(24, f"{what} count")  # name + dtype + ndim
    out = []
    for i in range(n):
        name = r.string(f"{what} {i} name")
        dtype = r.string(f"{what} {name!r} dtype")
        try:
            dtype = C.dtype_name(dtype)
        except KilnError as err:
            raise r.error(f"{what} {name!r}: {err}") from None
        ndim = r.count(8, f"{what} {name!r} ndim")
        raw = np.frombuffer(r.raw(8 * ndim, f"{what} {name!r} dims"), dtype="<i8").tolist()
        dims = tuple(Sym(-1 - d) if d < 0 else d for d in raw)
        out.append(TensorSig(name, dtype, dims))
    return tuple(out)


def _read_functions(r: StreamReader) -> list[VMFunction]:
    n = r.count(60, "function count")  # the fixed part of an entry
    out = []
    for i in range(n):
        kind = r.i32(f"function {i} kind")
        name = r.string(f"function {i} name")
        if kind not in (KIND_PACKED, KIND_VM):
            raise r.error(f"function {name!r}: unknown kind {kind}")
        start, end, num_regs, heap_size = (r.i64(f"function {name!r} {f}") for f in
                                           ("start", "end", "num_regs", "heap_size"))
        params = _read_sigs(r, f"function {name!r} param")
        outputs = _read_sigs(r, f"function {name!r} output")
        out.append(VMFunction(kind, name, start, end, num_regs, heap_size, params, outputs))
    _done(r)
    return out


def _read_constant(r: StreamReader, i: int) -> Constant:
    tag = r.u32(f"constant {i} tag")
    if tag == TAG_NDARRAY:
        return read_ndarray(r, f"constant {i}")
    if tag == TAG_INT_ARRAY:
        n = r.count(8, f"constant {i} length")
        return np.frombuffer(r.raw(8 * n, f"constant {i} values"), dtype="<i8").astype(np.int64)
    if tag == TAG_STRING:
        return r.string(f"constant {i}")
    if tag == TAG_INT:
        return r.i64(f"constant {i}")
    raise r.error(f"constant {i}: unknown tag {tag}")


def _read_constants(r: StreamReader) -> list[Constant]:
    n = r.count(4, "constant count")  # at least the tag
    out = [_read_constant(r, i) for i in range(n)]
    _done(r)
    return out


def _read_code(r: StreamReader) -> np.ndarray:
    n = r.count(8, "code length")
    code = np.frombuffer(r.raw(8 * n, "code words"), dtype="<i8").astype(np.int64)
    _done(r)
    return code


def _read_sources(r: StreamReader) -> Sources:
    n = r.count(8 + 8 + 8 + 8, "source count")
    sources: Sources = {}
    for _ in range(n):
        func, pc = r.string("source function"), r.i64("source word index")
        nodes, op_types = r.vec_str("source ONNX nodes"), r.vec_str("source op types")
        if len(nodes) != len(op_types):
            raise r.error(f"source of {func!r} word {pc}: {len(nodes)} ONNX nodes but "
                          f"{len(op_types)} op types")
        sources[(func, pc)] = (tuple(nodes), tuple(op_types))
    _done(r)
    return sources


def read_sources(data: bytes | bytearray | memoryview) -> Sources:
    """The optional sources section of an executable's bytes; empty when it has none (an
    executable written before it, or of a graph not imported from ONNX).

    Raises
    ------
    ModuleLoadError
        As :func:`read_executable`, and for a malformed sources section.
    """
    sections = _read_sections(memoryview(data).cast("B"))
    return _read_sources(_reader(sections, OPT_SOURCES)) if OPT_SOURCES in sections else {}


def read_executable(data: bytes | bytearray | memoryview
                    ) -> tuple[list[Symbol], list[VMFunction], list[Constant], np.ndarray]:
    """Parse the executable's bytes into (symbols, functions, constants, code) (the optional
    sources: :func:`read_sources`).

    Cross-references (function ranges, registers, symbol indices) are checked by
    ``VMExecutable``'s constructor, which the loader calls next.

    Raises
    ------
    ModuleLoadError
        Bad magic or version, a section table entry outside the bytes, a missing or repeated
        section, any truncated or implausible count, length or field.
    """
    sections = _read_sections(memoryview(data).cast("B"))
    return (_read_symbols(_reader(sections, SEC_SYMBOLS)),
            _read_functions(_reader(sections, SEC_FUNCTIONS)),
            _read_constants(_reader(sections, SEC_CONSTANTS)),
            _read_code(_reader(sections, SEC_CODE)))


__all__ = ["KIND_PACKED", "KIND_VM", "MAGIC", "VERSION", "Constant", "Sources", "Sym", "Symbol",
           "TensorSig", "VMFunction", "read_executable", "read_sources", "write_executable"]
