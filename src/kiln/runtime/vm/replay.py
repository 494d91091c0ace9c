"""A traced VM function that the VM replays for any values of its shape heap (decision 014).

A VM function without ``Goto``/``If``, VM calls or data-dependent builtins runs the same
instructions whatever its inputs: only the shape heap's values (symbol values and what the shape
programs derive from them) and the inputs' addresses change. The first call is interpreted
while a :class:`Tracer` notes, per register, *where* each tensor lives, symbolically: a source
(a parameter, a storage, or the result of a builtin that runs on every call such as
``vm.builtin.kv_append``), a byte offset and dims, each an immediate or a heap slot. The
:class:`Trace` it makes runs later calls without the interpreter:

1. the heap (computed by the shape checks and programs, which run on every call) fills one
   int64 vector ``vals`` = heap slots | immediates | dims of each source's value;
2. every kernel argument is one ``DLTensor`` of one contiguous array (6 int64 words each), whose
   shapes live in one int64 array: ``shape[:] = vals[shape_index]`` and
   ``data = base[source] + vals[offset_index]`` are numpy index operations; integer arguments
   of the kernels (symbols they cannot read from tensors) are patched the same way;
3. the kernels run through one ``KilnRunPackedCalls`` per run between builtins that must run
   every call (``kv_append``; ``copy``...); after each, its result's address and dims are
   patched into the structs that depend on it. ``alloc_storage`` (it may grow and move a
   storage) runs before the first kernel when its size is known at the start, as it is unless
   a data-dependent builtin computes it: the kernels around it stay one run.

A replay at the last replay's heap values and input shapes, with no storage allocated by the
VM since (``Arena.allocations``), of a trace whose steps are all kernel runs
(:attr:`Trace.static`) finds every struct, shape and integer argument as it left them: it
points the inputs' structs at their addresses if they moved, and makes the C calls and the
result's views only (decision 054).

The views the interpreter would check (``alloc_tensor`` within its storage and 64-byte
aligned, ``reshape`` keeping the byte size) are checked the same way, vectorized and
remembered per heap tuple; a failing check, or a builtin whose result is not of the kind it
had when traced, makes the VM interpret the call instead (which raises the error, or traces
again).

Data-dependent shapes. A data-dependent builtin (``vm.builtin.nonzero``...) runs on every
replay like ``kv_append``: its result is a source whose address and dims are patched in. The
heap slots that ``bind_shape`` (or ``tensor_to_heap``, or a shape program after them) writes
are *guarded*: the trace holds the values they had when it was recorded, in ``vals`` from the
start, and each such builtin, run on replay, must write them again, else :class:`GuardFailed`
(the call is interpreted and traced again). Everything a replay wrote before a guard failed is
written again by the interpreter: kernels write VM storage, a reserved key/value append is
redone as a copy (the past no longer ends its buffer's filled rows).
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.runtime import c_types as C
from kiln.runtime.graph_executor.call_batch import KilnPackedCall, runner_of
from kiln.runtime.ndarray import ALIGNMENT, NDArray
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.vm.hoists import (
    hoist_appends,
    hoist_copies,
    hoist_shape_tensors,
    hoist_storages,
)
from kiln.runtime.vm.storage import Storage
from kiln.runtime.vm.trace import (
    Expr,
    GuardFailed,
    Retrace,
    Tracer,
    Untraceable,
    _Const,
    _Int,
    _own_dims,
    _Storage,
    _Tensor,
    _Tuple,
)

#: heap tuples whose static view checks passed, kept per trace
MAX_CHECKED = 256
_TENSOR_CODE = C.kTVMDLTensorHandle


# ---------------------------------------------------------------------------- replaying
class _Layout:
    """Expression keys → indices into ``vals``: heap slots, immediates, source dims."""

    def __init__(self, heap_size: int, src_ndim: list[int]):
        self.heap_size = heap_size
        self.consts: dict[int, int] = {}
        self.dim_start: list[int] = []
        n = 0
        for nd in src_ndim:
            self.dim_start.append(n)
            n += nd
        self.num_dims = n

    def index(self, e: Expr) -> int:
        if e[0] == "h":
            return e[1]
        if e[0] == "d":
            return self.heap_size + self.dim_start[e[1]] + e[2]
        return -1 - self.consts.setdefault(e[1], len(self.consts))  # fixed in finalize

    def vals(self) -> tuple[np.ndarray, int]:
        """The ``vals`` vector (constants in place) and where the constants start."""
        start = self.heap_size + self.num_dims
        out = np.zeros(start + len(self.consts) + 1, np.int64)
        for v, k in self.consts.items():
            out[start + k] = v
        return out, start

    def fix(self, idx: np.ndarray, start: int) -> np.ndarray:
        """Indices with the constants' placeholders (negative) moved to ``start``."""
        idx = np.asarray(idx, np.int64)
        return np.where(idx < 0, start + (-1 - idx), idx)


class Trace:
    """A replayable function's calls, valid for any heap values (module doc)."""

    def __init__(self, tr: Tracer, result: Any):
        self.num_sources = len(tr.sources)
        self.params = [(src, kind[1]) for src, kind in enumerate(tr.sources)
                       if kind[0] == "param"]
        lay = _Layout(tr.heap_size, tr.src_ndim)
        lay.index(("c", 0))  # (the checks' padding, before the constants are laid out)
        lay.index(("c", 1))
        self._lay = lay
        self.heap_size = tr.heap_size
        self._hoists = hoist_appends(tr, dict(self.params))
        hoist_copies(tr)
        self._allocs = [(s[1], [self._materializer(d) for d in s[2]], s[3])
                        for s in hoist_storages(tr)]
        self._shape_tensors = self._own_tensors(hoist_shape_tensors(tr))
        self._build_structs(tr, lay)
        self._build_calls(tr, lay)
        self._build_checks(tr, lay)
        self.vals, start = lay.vals()
        self._fix(start)
        self._output = self._materializer(result)
        self._checked: set[tuple] = set()
        self.num_calls = sum(1 for s in tr.steps if s[0] == "c")
        self._guard_slots = np.array(list(tr.guarded), np.int64)
        self._guard_values = np.array(list(tr.guarded.values()), np.int64)
        # the fast path (``_replay_again``): only kernel batches run, so a call at the last
        # replay's heap values and input shapes finds every struct as that replay left it
        # (but for the inputs' addresses: ``_repoint``)
        self.static = not self._hoisted and all(s[0] == "batch" for s in self.steps)
        self._last: tuple | None = None  # (heap, inputs' shapes, allocations)
        self._last_addrs: tuple = ()  # the inputs' data addresses the structs hold
        self._objs: list[Any] = [None] * self.num_sources  # the storages, between replays
        # per input with structs: (their indices, the input's index); after a patch, per
        # struct of an input: (its data word in ``_words``, its byte offset, the input's index)
        self._input_structs = [(self._src_structs[src], i) for src, i in self.params
                               if len(self._src_structs[src])]
        self._points: list[tuple] = []
        self._words = memoryview(self.structs).cast("B").cast("q")
        #: replays that wrote the structs and argument arrays (the others reused them), and
        #: those that only pointed the inputs' structs at new addresses
        self.patches = 0
        self.repoints = 0

    # -- key/value appends run ahead, their rows written by the batch
    def _own_tensors(self, steps: list[tuple]) -> list[list]:
        """``[source, run, value indices into vals, tensor]`` per hoisted ``shape_to_tensor``
        (``hoists.hoist_shape_tensors``); the tensor is made at the first replay."""
        return [[src, run, [self._lay.index(d.expr) for d in args[2:]], None]
                for _, run, args, src, _ in steps]

    def _fill_shape_tensors(self, frame: Any, objs: list, bases: np.ndarray) -> None:
        """Write each hoisted shape tensor's values for this call's heap (one numpy take);
        its address and dims go where the kernels read them."""
        vals, lay = self.vals, self._lay
        for entry in self._shape_tensors:
            src, run, idx, tensor = entry
            if tensor is None:
                tensor = entry[3] = run(frame, [None, None, *(int(v) for v in vals[idx])])
            else:
                tensor._arr.reshape(-1)[:] = vals[idx]
            objs[src] = tensor
            bases[src] = tensor.data_ptr
            s = self.heap_size + lay.dim_start[src]
            vals[s:s + tensor._arr.ndim] = tensor._arr.shape
            self._check(src)

    def _reserve_appends(self, frame: Any, params: list[NDArray], objs: list,
                         bases: np.ndarray) -> None:
        """The reservations of the hoisted appends (:meth:`_hoist_appends`) for this call:
        each present's view becomes its source's value, its address and dims go where the
        kernels read them, and the copy's destination points at the new rows."""
        vals, lay = self.vals, self._lay
        kv = frame.vm.kv
        for src, param, rows, dst in self._hoisted:
            present, address = kv.reserve(params[param], int(vals[rows]))
            objs[src] = present
            base = bases[src] = present.data_ptr
            s = self.heap_size + lay.dim_start[src]
            vals[s:s + present._arr.ndim] = present._arr.shape
            k = self._src_structs[src]
            self.structs[k, 0] = base + vals[self._struct_off[k]]
            self.structs[dst, 0] = address
            self._check(src)

    # -- structs: one DLTensor per distinct tensor argument of a C kernel
    def _build_structs(self, tr: Tracer, lay: _Layout) -> None:
        index: dict[tuple, int] = {}
        descs: list[_Tensor] = []
        for step in tr.steps:
            if step[0] == "c":
                for d in step[2]:
                    if type(d) is _Tensor and d.key() not in index:
                        index[d.key()] = len(descs)
                        descs.append(d)
        self._struct_index = index
        n = len(descs)
        self.structs = np.zeros((max(n, 1), 6), np.int64)
        seg = [0]
        for d in descs:
            seg.append(seg[-1] + max(len(d.dims), 1))
        self.shapes = np.zeros(max(seg[-1], 1), np.int64)
        shape_idx = np.zeros(len(self.shapes), np.int64)
        shape_ptr = self.shapes.ctypes.data
        self._struct_src = np.array([d.src for d in descs] or [0], np.int64)
        self._struct_off = np.array([lay.index(d.off) for d in descs] or [0], np.int64)
        ones = lay.index(("c", 1))
        for k, d in enumerate(descs):
            code, bits, lanes = C.dl_dtype(d.dtype)
            self.structs[k, 1] = C.kDLCPU
            self.structs[k, 2] = len(d.dims) | (code << 32) | (bits << 40) | (lanes << 48)
            self.structs[k, 3] = shape_ptr + 8 * seg[k]
            shape_idx[seg[k]:seg[k + 1]] = [lay.index(e) for e in d.dims] or [ones]
        self._shape_idx = shape_idx
        # per source: its structs and the shape entries holding its dims
        entry_src = np.full(len(shape_idx), -1, np.int64)
        for k, d in enumerate(descs):
            for j, e in enumerate(d.dims):
                if e[0] == "d":
                    entry_src[seg[k] + j] = e[1]
        self._src_structs = [np.flatnonzero(self._struct_src[:n] == s)
                             for s in range(self.num_sources)]
        self._src_entries = [np.flatnonzero(entry_src == s) for s in range(self.num_sources)]
        pstr = [self._src_structs[s] for s, _ in self.params]
        pstr += [self._src_structs[src] for _, _, src in self._allocs]
        pstr += [self._src_structs[entry[0]] for entry in self._shape_tensors]
        # (the structs of the parameters and hoisted storages: patched together per call)
        self._param_structs = np.concatenate(pstr) if pstr else np.zeros(0, np.int64)

    # -- the kernels' packed arguments, and the run of steps
    def _build_calls(self, tr: Tracer, lay: _Layout) -> None:
        cargs = [s[2] for s in tr.steps if s[0] == "c"]
        total = sum(len(a) for a in cargs) or 1
        self._argv = (ctypes.c_int64 * total)()
        self._codes = (ctypes.c_int32 * total)()
        argv = np.frombuffer(self._argv, np.int64)
        self._argv_np = argv
        self._keep: list[Any] = []
        self.calls = (KilnPackedCall * max(len(cargs), 1))()
        self._funcs: list[PackedFunc] = []
        int_pos: list[int] = []
        int_idx: list[int] = []
        base = self.structs.ctypes.data
        pos = 0
        self.steps: list[tuple] = []  # ("batch", start, count, runner) | ("py", ...)
        ci = 0
        runners: dict[int, Any] = {}
        for step in tr.steps:
            if step[0] == "py":
                _, run, args, src, guard = step
                self.steps.append(("py", run, [self._materializer(d) for d in args], src,
                                   guard))
                continue
            _, func, args = step
            for j, d in enumerate(args):
                self._codes[pos + j] = self._pack(d, argv, pos + j, base, int_pos, int_idx, lay)
            slot = self.calls[ci]
            slot.func = func._cfunc
            slot.args = ctypes.addressof(self._argv) + 8 * pos
            slot.type_codes = ctypes.addressof(self._codes) + 4 * pos
            slot.num_args = len(args)
            self._funcs.append(func)
            owner = id(func._keepalive)
            if owner not in runners:
                runners[owner] = runner_of(func)
            runner = runners[owner]
            last = self.steps[-1] if self.steps else None
            if last is not None and last[0] == "batch" and last[3] is runner is not None:
                self.steps[-1] = ("batch", last[1], last[2] + 1, runner)
            else:
                self.steps.append(("batch", ci, 1, runner))
            pos += len(args)
            ci += 1
        self._int_pos = np.array(int_pos, np.int64)
        self._int_idx = int_idx
        self._failed = ctypes.c_int64(-1)
        self._failed_ref = ctypes.byref(self._failed)
        size = ctypes.sizeof(KilnPackedCall)
        at = ctypes.addressof(self.calls)
        # each batch's first call as the runner's pointer argument (made once, not per run)
        self.steps = [s if s[0] != "batch" or s[3] is None else
                      (*s, ctypes.cast(at + s[1] * size, ctypes.POINTER(KilnPackedCall)))
                      for s in self.steps]

    def _pack(self, d: Any, argv: np.ndarray, at: int, base: int, int_pos: list[int],
              int_idx: list[int], lay: _Layout) -> int:
        """Write argument ``d`` at ``argv[at]``; returns its type code."""
        if type(d) is _Tensor:
            argv[at] = base + 48 * self._struct_index[d.key()]
            return _TENSOR_CODE
        if type(d) is _Int:
            int_pos.append(at)
            int_idx.append(lay.index(d.expr))
            return C.kTVMArgInt
        v = d.value if type(d) is _Const else None
        if type(v) is NDArray:  # a constant of the executable: its own DLTensor, for good
            self._keep.append(v)
            argv[at] = v.handle_address
            return _TENSOR_CODE
        if v is None:
            return C.kTVMNullptr
        if type(v) is float:
            argv[at] = np.float64(v).view(np.int64)
            return C.kTVMArgFloat
        raise Untraceable(f"a kernel argument of type {type(d).__name__}")

    # -- checks the interpreter's builtins would make
    def _build_checks(self, tr: Tracer, lay: _Layout) -> None:
        """Rows ``(nbytes dims, itemsize, bound dims or offset)`` grouped by the last source
        whose value they depend on (-1: the heap and parameters only)."""
        params = {s for s, _ in self.params}
        groups: dict[int, list[tuple]] = {}
        for kind, t, other in tr.checks:
            deps = [e[1] for e in (*t.dims, *getattr(other, "dims", ())) if e[0] == "d"
                    and e[1] not in params]
            groups.setdefault(max(deps, default=-1), []).append((kind, t, other))
        self._checks = {g: self._check_arrays(rows) for g, rows in groups.items()}

    def _fix(self, start: int) -> None:
        lay = self._lay
        self._hoisted = [(src, param, int(lay.fix([lay.index(rows)], start)[0]),
                          self._struct_index[dst.key()])
                         for src, param, rows, dst in self._hoists]
        self._struct_off = lay.fix(self._struct_off, start)
        self._shape_idx = lay.fix(self._shape_idx, start)
        self._int_idx = lay.fix(self._int_idx, start)
        for entry in self._shape_tensors:
            entry[2] = lay.fix(entry[2], start)
        for g, (new, size, is_alloc, old, old_size, off, cap) in self._checks.items():
            self._checks[g] = (lay.fix(new, start), size, is_alloc, lay.fix(old, start),
                               old_size, lay.fix(off, start), lay.fix(cap, start))

    def _check_arrays(self, rows: list[tuple]) -> tuple:
        """Index arrays of the checks ``rows`` (constants as placeholders, see ``_fix``)."""
        at = self._lay.index
        width = max([len(t.dims) for _, t, _ in rows] +
                    [len(o.dims) for k, _, o in rows if k == "reshape"] + [1])

        one = at(("c", 1))

        def dims(t: _Tensor) -> list[int]:
            return [at(e) for e in t.dims] + [one] * (width - len(t.dims))

        new = np.array([dims(t) for _, t, _ in rows], np.int64).reshape(len(rows), width)
        size = np.array([np.dtype(t.dtype).itemsize for _, t, _ in rows], np.int64)
        is_alloc = np.array([k == "alloc" for k, _, _ in rows])
        old = np.array([dims(o) if k == "reshape" else [one] * width for k, _, o in rows],
                       np.int64).reshape(len(rows), width)
        old_size = np.array([np.dtype(o.dtype).itemsize if k == "reshape" else 0
                             for k, _, o in rows], np.int64)
        off = np.array([at(t.off) if k == "alloc" else at(("c", 0)) for k, t, _ in rows])
        cap = np.array([at(o.size) if k == "alloc" else at(("c", 0)) for k, _, o in rows])
        return new, size, is_alloc, old, old_size, off, cap

    def _check(self, group: int) -> None:
        arrays = self._checks.get(group)
        if arrays is None:
            return
        new, size, is_alloc, old, old_size, off, cap = arrays
        v = self.vals
        dims = v[new]
        if (dims < 0).any():
            raise Retrace
        nbytes = dims.prod(axis=1) * size
        o = v[off]
        alloc_ok = (o >= 0) & (o % ALIGNMENT == 0) & (o + nbytes <= v[cap])
        view_ok = nbytes == v[old].prod(axis=1) * old_size
        if not np.where(is_alloc, alloc_ok, view_ok).all():
            raise Retrace

    # -- values for Python steps and the result
    def _materializer(self, d: Any) -> Callable[[list], Any]:
        if type(d) is _Const:
            v = d.value
            return lambda objs: v
        if type(d) is _Int:
            return self._int_of(d.expr)
        if type(d) is _Tuple:
            parts = [self._materializer(x) for x in d.items]
            return lambda objs: tuple(p(objs) for p in parts)
        if type(d) is _Storage:
            src = d.src
            return lambda objs: objs[src]
        return self._tensor_of(d)

    def _int_of(self, e: Expr) -> Callable[[list], int]:
        lay, vals = self._lay, lambda: self.vals
        if e[0] == "c":
            v = e[1]
            return lambda objs: v
        i = lay.index(e)
        return lambda objs: int(vals()[i])

    def _tensor_of(self, d: _Tensor) -> Callable[[list], NDArray]:
        src, dtype = d.src, d.dtype
        if d.off == ("c", 0) and d.dims == _own_dims(src, len(d.dims)) and d.dims:
            return lambda objs: objs[src]  # (a whole tensor; a 0-d one may be in a storage)
        off = self._int_of(d.off)
        dims = [self._int_of(e) for e in d.dims]

        def view(objs: list) -> NDArray:
            obj, o, shape = objs[src], off(objs), tuple(f(objs) for f in dims)
            if type(obj) is Storage:
                return obj.view(o, dtype, shape)
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            arr = obj._arr.reshape(-1).view(np.uint8)[o:o + n].view(dtype).reshape(shape)
            return NDArray._checked(arr, dtype, obj.device)

        return view

    # -- running
    def replay(self, frame: Any, params: list[NDArray]) -> Any:
        """Run the traced calls at the heap of ``frame`` over ``params``; returns the
        function's result (views of VM storage or of ``params``).

        Raises
        ------
        Retrace
            A view check fails or a builtin's result is not of its traced kind (nothing was
            written that the interpreter would not write again); :class:`GuardFailed` when a
            data-dependent shape differs from the traced one.
        KilnError
            A kernel fails.
        """
        if self.static:
            addrs = tuple([p._dl.data if p._dl is not None else p.data_ptr for p in params])
            shapes = tuple([p._arr.shape for p in params])
            state = (tuple(frame.heap), shapes, frame.vm.arena.allocations)
            if state == self._last:
                if addrs != self._last_addrs:  # new inputs of the same shapes
                    self._repoint(addrs)
                return self._replay_again(params)
        self._last = None  # (the structs are patched below: a failed check leaves them half)
        vals = self.vals
        vals[:self.heap_size] = frame.heap
        if len(self._guard_slots):  # the data-dependent dims the trace was recorded at
            vals[self._guard_slots] = self._guard_values
        objs: list[Any] = [None] * self.num_sources
        bases = np.zeros(max(self.num_sources, 1), np.int64)
        dim0 = self.heap_size
        lay = self._lay
        for src, i in self.params:
            p = params[i]
            objs[src] = p
            bases[src] = (p._dl.data if p._dl is not None else p.data_ptr) or 0
            s = dim0 + lay.dim_start[src]
            vals[s:s + p._arr.ndim] = p._arr.shape
        for run, args, src in self._allocs:
            st = objs[src] = run(frame, [m(objs) for m in args])
            bases[src] = (st.buf._dltensor.data if st.buf is not None else 0) or 0
        if self._shape_tensors:
            self._fill_shape_tensors(frame, objs, bases)
        if self._hoisted:
            self._reserve_appends(frame, params, objs, bases)
        key = tuple(frame.heap)
        if key not in self._checked:
            self._check(-1)
            if len(self._checked) >= MAX_CHECKED:
                self._checked.clear()
            self._checked.add(key)
        self.shapes[:] = vals[self._shape_idx]
        ps = self._param_structs
        structs = self.structs
        structs[ps, 0] = bases[self._struct_src[ps]] + vals[self._struct_off[ps]]
        if len(self._int_pos):
            self._argv_np[self._int_pos] = vals[self._int_idx]
        self.patches += 1
        if self.static:  # (the allocations above may have grown a storage: counted after)
            self._objs = [o if type(o) is Storage else None for o in objs]
            for entry in self._shape_tensors:  # (the heap is the same: so are their values)
                self._objs[entry[0]] = entry[3]
            self._last = (key, shapes, frame.vm.arena.allocations)
            self._last_addrs = addrs
            self._points = [(6 * int(k), int(off), i) for ks, i in self._input_structs
                            for k, off in zip(ks, vals[self._struct_off[ks]])]
        try:
            for step in self.steps:
                if step[0] == "batch":
                    self._run_batch(step)
                else:
                    self._run_py(step, frame, objs, bases)
            return self._output(objs)
        finally:
            objs.clear()

    def _repoint(self, addrs: tuple) -> None:
        """Point the structs of the inputs at ``addrs`` (the last replay's shapes and heap:
        their offsets are the ones it computed)."""
        words = self._words  # (a Python loop over a memoryview: a tenth of numpy's cost)
        for at, offset, i in self._points:
            words[at] = offset + (addrs[i] or 0)
        self._last_addrs = addrs
        self.repoints += 1

    def _replay_again(self, params: list[NDArray]) -> Any:
        """A replay at the last one's state (``replay``): only the kernels run."""
        for step in self.steps:
            self._run_batch(step)
        objs = self._objs.copy()
        for src, i in self.params:
            objs[src] = params[i]
        return self._output(objs)

    def _run_batch(self, step: tuple) -> None:
        start, count, runner = step[1], step[2], step[3]
        if runner is not None:
            rc = runner(step[4], count, self._failed_ref)
            if rc != 0:
                self._funcs[start + self._failed.value]._raise(rc)
            return
        for k in range(start, start + count):
            c = self.calls[k]
            ret, ret_code = C.TVMValue(), ctypes.c_int32(0)
            rc = c.func(ctypes.cast(c.args, ctypes.POINTER(C.TVMValue)),
                        ctypes.cast(c.type_codes, ctypes.POINTER(ctypes.c_int32)),
                        c.num_args, ctypes.byref(ret), ctypes.byref(ret_code), None)
            if rc != 0:
                self._funcs[k]._raise(rc)

    def _run_py(self, step: tuple, frame: Any, objs: list, bases: np.ndarray) -> None:
        _, run, args, src, guard = step
        value = run(frame, [m(objs) for m in args])
        heap = frame.heap
        for slot, v in guard:
            if heap[slot] != v:
                raise GuardFailed
        if src < 0:
            if value is not None:
                raise Retrace
            return
        if type(value) is Storage:
            ptr = value.buf._dltensor.data if value.buf is not None else 0
        elif type(value) is NDArray and value._arr.ndim == self._ndim(src):
            # (not value._dltensor: building a struct costs 30 us, ten times the address)
            ptr = value._dl.data if value._dl is not None else value.data_ptr
            s = self.heap_size + self._lay.dim_start[src]
            self.vals[s:s + value._arr.ndim] = value._arr.shape
        else:
            raise Retrace
        objs[src] = value
        bases[src] = ptr or 0
        k = self._src_structs[src]
        if len(k):
            self.structs[k, 0] = (ptr or 0) + self.vals[self._struct_off[k]]
        e = self._src_entries[src]
        if len(e):
            self.shapes[e] = self.vals[self._shape_idx[e]]
        self._check(src)

    def _ndim(self, src: int) -> int:
        start = self._lay.dim_start
        end = start[src + 1] if src + 1 < len(start) else self._lay.num_dims
        return end - start[src]


__all__ = ["GuardFailed", "Retrace", "Trace"]
