"""What a traced VM function is made of, and the :class:`Tracer` that follows its first call
(the replay is :mod:`kiln.runtime.vm.replay`, whose docstring describes the whole scheme).

Per register the tracer notes *where* each value lives, symbolically: a source (a parameter, a
storage, or the result of a builtin that runs on every call), a byte offset and dims, each an
immediate, a heap slot or a source's dim (an :data:`Expr`). A builtin of the body that writes
heap slots (``bind_shape`` of a data-dependent result, ``tensor_to_heap``, a shape program
after them) gets a *guard*: the values it wrote, which the replay requires again (the trace
reads those slots as the constants they were).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.runtime.ndarray import NDArray
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.vm.storage import Storage

if TYPE_CHECKING:
    from kiln.runtime.vm.replay import Trace

#: builtins that only make views or tuples: followed symbolically, not run on replay
_VIEWS = ("vm.builtin.alloc_tensor", "vm.builtin.reshape", "vm.builtin.make_tuple",
          "vm.builtin.tuple_get")


class Untraceable(Exception):
    """A value or call the trace cannot follow (the function stays interpreted)."""



# ----------------------------------------------------------------------- descriptions
# An expression is a key: ("h", slot) a heap slot, ("c", value) an immediate, ("d", src, k)
# dim k of source src's value. They become indices into ``vals`` when the trace is finished.
Expr = tuple


class _Tensor:
    """A tensor: ``dims`` of ``dtype`` at byte ``off`` of source ``src``'s memory."""

    __slots__ = ("dims", "dtype", "off", "src")

    def __init__(self, src: int, off: Expr, dims: tuple[Expr, ...], dtype: str):
        self.src, self.off, self.dims, self.dtype = src, off, dims, dtype

    def key(self) -> tuple:
        return (self.src, self.off, self.dims, self.dtype)


class _Storage:
    __slots__ = ("size", "src")

    def __init__(self, src: int, size: Expr):
        self.src, self.size = src, size


class _Tuple:
    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items


class _Truth:
    """``read_bool`` of a traced tensor: an If's condition, read by the replay's guard."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: _Tensor):
        self.tensor = tensor


class _Const:
    """A value that is the same on every call (an immediate, a constant, None)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class _Int:
    __slots__ = ("expr",)

    def __init__(self, expr: Expr):
        self.expr = expr


#: Ifs a traced call may take (a loop takes one an iteration); beyond, it is interpreted
MAX_BRANCHES = 1024


class Retrace(Exception):
    """A replay met something the trace does not cover: interpret this call."""


class GuardFailed(Retrace):
    """A data-dependent shape, or the condition of an If, differs from the one the trace was
    recorded at."""


def _branch_guard(taken: bool):
    """The replay step of an If (``Tracer.branch``): raises GuardFailed unless the condition
    tensor's one value is ``taken``."""
    def run(frame: Any, args: list) -> None:
        if bool(args[0]._arr.reshape(-1)[0]) != taken:
            raise GuardFailed

    return run


def _own_dims(src: int, ndim: int) -> tuple[Expr, ...]:
    return tuple(("d", src, k) for k in range(ndim))


# ---------------------------------------------------------------------------- tracing
class Tracer:
    """Follows one interpreted call of a replayable function (the VM hands it every kernel
    and builtin call of the body) and builds its :class:`Trace`.

    Parameters
    ----------
    params : list of NDArray
        The call's parameters (registers ``0 .. len - 1``).
    heap_size : int
    """

    def __init__(self, params: list[Any], heap_size: int):
        self.ok = True
        self.why = ""
        self.heap_size = heap_size
        self.sources: list[tuple[str, int]] = []  # ("param", i) or ("step", step index)
        self.src_ndim: list[int] = []
        self.regs: dict[int, Any] = {}
        for i, p in enumerate(params):
            if type(p) is not NDArray:
                self.fail(Untraceable(f"parameter {i} is not a tensor"))
                return
            src = self._source(("param", i), p.ndim)
            self.regs[i] = _Tensor(src, ("c", 0), _own_dims(src, p.ndim), p.dtype)
        # ("c", func, arg descs) | ("py", run, arg descs, src, guard: ((slot, value), ...))
        self.steps: list[tuple] = []
        self.guarded: dict[int, int] = {}  # heap slot -> the value a guard requires
        self.result = -1  # the register the call returned (its Ret)
        self.branches = 0
        self.checks: list[tuple] = []  # ("alloc", tensor, storage) | ("reshape", new, old)

    def _source(self, kind: tuple[str, int], ndim: int) -> int:
        self.sources.append(kind)
        self.src_ndim.append(ndim)
        return len(self.sources) - 1

    def _args(self, op: tuple, a: list) -> list:
        """The description of each argument of ``op`` (resolved values ``a``)."""
        _, _, _, template, regpos, heappos, _ = op
        out: list[Any] = [_Const(v) for v in template]
        for p, r in regpos:
            desc = self.regs.get(r)
            if desc is None or type(desc) is _Truth:
                raise Untraceable(f"register {r} has a value from outside the trace")
            out[p] = desc
        for p, s in heappos:
            out[p] = _Int(("h", s))
        for p, d in enumerate(out):
            if type(d) is _Const and type(d.value) is int:
                out[p] = _Int(("c", d.value))
        return out

    def kernel(self, op: tuple, a: list) -> Any:
        """Run kernel call ``op`` on ``a`` and trace it (while :attr:`ok`)."""
        func: PackedFunc = op[2]
        out = func(*a)
        if self.ok:
            try:
                self._kernel(op, a, out)
            except Untraceable as err:
                self.fail(err)
        return out

    def builtin(self, op: tuple, frame: Any, a: list) -> Any:
        """Run builtin call ``op`` on ``a`` and trace it (while :attr:`ok`)."""
        value = op[2](frame, a)
        if self.ok:
            try:
                self._builtin(op, a, value, self._guard(op[2], frame.heap))
            except Untraceable as err:
                self.fail(err)
        return value

    def branch(self, reg: int, taken: bool) -> None:
        """An If on register ``reg`` went ``taken``: the trace follows that branch, and a
        replay checks the condition first (:class:`GuardFailed` when it differs: silero VAD
        branches on its sample rate, the same on every call of a stream)."""
        desc = self.regs.get(reg)
        if not self.ok:
            return
        if type(desc) is not _Truth:
            self.fail(Untraceable(f"an If on register {reg}, not read from a traced tensor"))
            return
        self.branches += 1
        if self.branches > MAX_BRANCHES:  # (a long loop: its trace would be as long)
            self.fail(Untraceable(f"more than {MAX_BRANCHES} Ifs taken in one call"))
            return
        self.steps.append(("py", _branch_guard(taken), [desc.tensor], -1, ()))

    def fail(self, err: Exception) -> None:
        self.ok = False
        self.why = str(err)

    def _kernel(self, op: tuple, a: list, out: Any) -> None:
        func: PackedFunc = op[2]
        if out is not None:
            raise Untraceable(f"kernel {func.name} returned a value")
        args = self._args(op, a)
        if func._cfunc is None:
            self.steps.append(("py", lambda frame, x, f=func._pyfunc: f(*x), args, -1, ()))
        else:
            self.steps.append(("c", func, args))
        self._set(op[1], _Const(None))

    def _guard(self, run: Any, heap: list[int]) -> tuple[tuple[int, int], ...]:
        """The slots builtin ``run`` just wrote and their values (empty for most builtins)."""
        guard = tuple((slot, heap[slot]) for slot in getattr(run, "writes", ()))
        for slot, v in guard:
            if self.guarded.setdefault(slot, v) != v:
                raise Untraceable(f"heap slot {slot} takes two values in one call")
        return guard

    def _builtin(self, op: tuple, a: list, value: Any, guard: tuple = ()) -> None:
        run = op[2]
        name = getattr(run, "builtin_name", "")
        args = self._args(op, a)
        if name in _VIEWS:
            self._set(op[1], self._view(name, args, value))
            return
        if name == "vm.builtin.read_bool" and type(args[0]) is _Tensor:
            self._set(op[1], _Truth(args[0]))  # (read again by the guard of its If)
            return
        if type(value) is NDArray:
            src = self._source(("step", len(self.steps)), value.ndim)
            desc: Any = _Tensor(src, ("c", 0), _own_dims(src, value.ndim), value.dtype)
        elif type(value) is Storage:
            src = self._source(("step", len(self.steps)), 0)
            desc = _Storage(src, args[1].expr if type(args[1]) is _Int else ("c", 0))
        elif value is None:
            src, desc = -1, _Const(None)
        else:
            raise Untraceable(f"{name} returned a {type(value).__name__}")
        self.steps.append(("py", run, args, src, guard))
        self._set(op[1], desc)

    def _view(self, name: str, args: list, value: Any) -> Any:
        if name == "vm.builtin.make_tuple":
            return _Tuple(args)
        if name == "vm.builtin.tuple_get":
            if type(args[0]) is not _Tuple:
                raise Untraceable("tuple_get of a value that is not a traced tuple")
            return args[0].items[args[1].expr[1]]
        dims = tuple(d.expr for d in args[3 if name == "vm.builtin.alloc_tensor" else 1:])
        base = args[0]
        if name == "vm.builtin.alloc_tensor":
            if type(base) is not _Storage or type(args[1]) is not _Int:
                raise Untraceable("alloc_tensor of a value that is not a traced storage")
            out = _Tensor(base.src, args[1].expr, dims, value.dtype)
            self.checks.append(("alloc", out, base))
            return out
        if type(base) is not _Tensor:
            raise Untraceable("reshape of a value that is not a traced tensor")
        out = _Tensor(base.src, base.off, dims, base.dtype)
        self.checks.append(("reshape", out, base))
        return out

    def _set(self, dst: int, desc: Any) -> None:
        if dst >= 0:
            self.regs[dst] = desc

    def finish(self, result_reg: int) -> Trace | None:
        """The trace of this call (whose result is register ``result_reg``), or None when
        something could not be followed (:attr:`why`)."""
        desc = self.regs.get(result_reg)
        if not self.ok or desc is None:
            return None
        try:
            from kiln.runtime.vm.replay import Trace  # (the replay imports this module)

            return Trace(self, desc)
        except Untraceable as err:
            self.fail(err)
            return None


__all__ = ["GuardFailed", "Retrace", "Tracer", "Untraceable"]
