"""Recorded kernel sequences that the VM replays instead of interpreting (decision 014).

A VM function without ``Goto``/``If``, VM calls or data-dependent builtins computes the same
storage plan, the same tensor views and the same kernel arguments whenever its shape heap holds
the same values. The first call at a heap tuple is interpreted while a :class:`Recorder` turns
each kernel call into a prepared C call (``PreparedCall``, arguments converted once); later calls
at that tuple skip the interpreter and run the recording, whose runs of C calls go through one
``KilnRunPackedCalls`` (``CallBatch``), as the graph executor's ``run`` does.

What changes between calls is only where the *inputs* live: every kernel argument that views a
parameter (the parameter itself or a ``reshape`` of it) gets a ``DLTensor`` struct of the
recording's own, whose ``data`` is re-pointed at the new input before each replay. Everything
else is either a constant or a view of VM storage, whose address is fixed while its storage
keeps its generation (:meth:`Recording.valid`).
"""

from __future__ import annotations

import bisect
import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.runtime import c_types as C
from kiln.runtime.call_batch import batch_calls
from kiln.runtime.graph_storage import overlaps
from kiln.runtime.ndarray import NDArray
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.vm_storage import Storage

#: (param index, byte offset, shape, dtype): a tensor viewing a parameter
ParamRef = tuple[int, int, tuple[int, ...], str]


def param_view(params: list[NDArray], ref: ParamRef) -> NDArray:
    """The tensor ``ref`` describes, over the current ``params``."""
    i, off, shape, dtype = ref
    p = params[i]
    if off == 0 and p._arr.shape == shape and p.dtype == dtype:
        return p
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    arr = p._arr.reshape(-1).view(np.uint8)[off:off + nbytes].view(dtype).reshape(shape)
    return NDArray._checked(arr, dtype, p.device)


class Recording:
    """Kernel calls of one function at one heap tuple, ready to run again.

    Attributes
    ----------
    ops : list of callable
        Prepared C calls (runs of them batched) and Python calls, in order.
    storages : list of (Storage, int)
        Each storage used, with its generation when recorded.
    """

    def __init__(self, ops: list[Callable[[], Any]], rebinds: list[tuple[Any, int, int, Any]],
                 box: list, storages: list[tuple[Storage, int]], output: Callable[[], Any]):
        self.ops = batch_calls(ops)
        self.num_calls = len(ops)
        self._rebinds = rebinds
        self._box = box
        self.storages = storages
        self._output = output

    def valid(self) -> bool:
        """True while every storage it uses still has the buffer it was recorded with."""
        for st, gen in self.storages:
            if st.generation != gen:
                return False
        return True

    def replay(self, params: list[NDArray]) -> Any:
        """Run the recorded calls over ``params`` (same shapes as when recorded); returns
        the function's result (views of VM storage, or of ``params``)."""
        for struct, i, off, _shape in self._rebinds:
            struct.data = params[i].data_ptr + off
        self._box[0] = params
        try:
            for op in self.ops:
                op()
            return self._output()
        finally:
            self._box[0] = None


class Recorder:
    """Runs one interpreted call's kernel calls while recording them.

    Parameters
    ----------
    params : list
        The call's parameter values. Recording is off (:attr:`ok` False) unless all are
        tensors whose memory does not overlap (an overlap would make "which parameter does this
        argument view" ambiguous).
    """

    def __init__(self, params: list[Any]):
        self.params = params
        self.ok = all(type(p) is NDArray for p in params) and not any(
            overlaps(a, b) for i, a in enumerate(params) for b in params[i + 1:])
        # (sorted by address: a view's parameter is found by bisection, for many parameters)
        self._ranges = sorted((p.data_ptr, p.data_ptr + p.nbytes, i)
                              for i, p in enumerate(params) if p.nbytes) if self.ok else []
        self._starts = [lo for lo, _, _ in self._ranges]
        self._ids = {id(p): i for i, p in enumerate(params)} if self.ok else {}
        self._ops: list[Callable[[], Any]] = []
        self._rebinds: list[tuple[Any, int, int, Any]] = []  # struct, param, offset, shape
        self._proxies: dict[int, tuple[Any, ...]] = {}
        self._box: list = [params]
        self._storages: list[tuple[Storage, int]] = []

    # -- classification
    def _param_ref(self, t: NDArray) -> ParamRef | None:
        i = self._ids.get(id(t))
        if i is not None:
            return (i, 0, tuple(t._arr.shape), t.dtype)
        if t._arr.nbytes:
            ptr = t._dltensor.data  # the struct kernels get anyway; cheaper than arr.ctypes
            k = bisect.bisect_right(self._starts, ptr) - 1  # params do not overlap
            if k >= 0:
                lo, hi, i = self._ranges[k]
                if ptr < hi:
                    return (i, ptr - lo, tuple(t._arr.shape), t.dtype)
        return None

    def _c_arg(self, x: Any) -> Any:
        if type(x) is not NDArray:
            return x
        ref = self._param_ref(x)
        if ref is None:
            return x
        # (x is alive while the call runs, so its id names it; the recording keeps only the
        # struct and its shape array, not the caller's memory)
        hit = self._proxies.get(id(x))
        if hit is None:
            dl = x._dltensor
            shape_arr = (ctypes.c_int64 * max(x.ndim, 1))(*x._arr.shape)
            struct = C.DLTensor(dl.data, dl.device, dl.ndim, dl.dtype,
                                ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64)), None, 0)
            hit = (ctypes.pointer(struct), shape_arr, struct)
            self._proxies[id(x)] = hit
            self._rebinds.append((struct, ref[0], ref[1], shape_arr))
        return hit[0]

    def _py_args(self, args: list) -> Callable[[], list]:
        refs = [self._param_ref(x) if type(x) is NDArray else None for x in args]
        specs = [(ref, None if ref is not None else x) for ref, x in zip(refs, args)]
        if all(ref is None for ref in refs):
            fixed = list(args)
            return lambda: fixed
        box = self._box
        return lambda: [x if ref is None else param_view(box[0], ref) for ref, x in specs]

    # -- events from the interpreter
    def kernel(self, func: PackedFunc, args: list) -> Any:
        """Run kernel ``func`` on ``args`` and record the call."""
        if func._cfunc is not None:
            call = func.prepare(*[self._c_arg(x) for x in args])
            call()
            self._ops.append(call)
            return None
        get_args = self._py_args(args)
        py = func._pyfunc
        assert py is not None, "a PackedFunc wraps a C function or a Python callable"

        def op() -> Any:
            return py(*get_args())

        out = op()
        if out is not None:  # a result the replay could not reproduce: do not record
            self.ok = False
        self._ops.append(op)
        return out

    def builtin(self, run: Callable[..., Any], frame: Any, args: list, effect: str) -> Any:
        """Run a builtin with a replay-relevant ``effect`` ("storage" or "copy")."""
        out = run(frame, args)
        if effect == "storage":
            self._storages.append((out, out.generation))
        elif effect == "copy":
            get_args = self._py_args(args)
            self._ops.append(lambda: run(None, get_args()))
        else:
            self.ok = False
        return out

    # -- result
    def _capture(self, v: Any) -> Callable[[], Any]:
        if type(v) is NDArray:
            ref = self._param_ref(v)
            if ref is None:
                return lambda: v
            box = self._box
            return lambda: param_view(box[0], ref)
        if type(v) is tuple:
            parts = [self._capture(x) for x in v]
            return lambda: tuple(p() for p in parts)
        if v is None or isinstance(v, (bool, int, float, str)):
            return lambda: v
        self.ok = False  # a storage or another object: not worth replaying
        return lambda: v

    def finish(self, result: Any) -> Recording | None:
        """The recording of this call, or None when it cannot be replayed."""
        output = self._capture(result) if self.ok else None
        if not self.ok or output is None:
            return None
        if any(st.generation != gen for st, gen in self._storages):
            return None  # a storage grew during the call: earlier calls saw another buffer
        self._box[0] = None
        return Recording(self._ops, self._rebinds, self._box, self._storages, output)


__all__ = ["Recorder", "Recording", "param_view"]
