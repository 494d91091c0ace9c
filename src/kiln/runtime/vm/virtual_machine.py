"""The VM runtime module: runs a :class:`VMExecutable`'s bytecode (decision 014).

TVM's Relax ``VirtualMachine`` (src/runtime/relax_vm/vm.cc; docs/formats.md §9): a register
machine with four opcodes (Call, Ret, Goto, If) whose calls reach kernels of the library and the
builtins of ``vm_builtins``. ``exe["vm_load_executable"]()`` creates it; ``vm_initialization(
device_type, device_id, alloc_type)`` resolves the function table (kernels through the
executable's imports, once) and prepares every call site; then each VM function is a function
of this module, called by name.

Speed. Instructions are decoded once into tuples whose constant and immediate arguments are
already in place, so a call resolves only its register and heap arguments. Kernel calls reuse
their prepared argument arrays while their arguments are the same objects (storage views are
cached per shape, so in loops and repeated shapes they are; each call site keeps its last
arguments, inputs included, until it runs again). A function without control flow
replays its recorded kernel calls for any values of its shape heap (``vm_replay``), through
the graph executor's batch runner; where it has data-dependent shapes, while they take the
values it was recorded at (guards, decision 041). A replay with the last one's shapes and
input addresses makes only its C calls (decision 054).

Outputs. A function called by name returns **copies** of its result tensors: storage is reused
by the next call, so views of it would change under the caller (the graph executor's
``get_output`` copies for the same reason). Key/value caches (``vm.builtin.kv_append``,
``vm_kv_cache``) are the exception: they are returned as read-only views of the VM's append
buffers, which no later call overwrites, and are appended to in place when fed back.

Threads: one VM holds mutable state (storage, registers of the running call, traces); use
it from one thread at a time. VMs created from one executable may run concurrently.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kiln.errors import KilnError, ModuleLoadError, ShapeError
from kiln.runtime import c_types as C
from kiln.runtime.module import Module
from kiln.runtime.ndarray import NDArray, array
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.vm.builtins import PREFIX, Frame, Site, prepare_builtin
from kiln.runtime.vm.bytecode import CONST, FUNC, HEAP, IMM, OP_CALL, OP_GOTO, OP_IF, REG, Instr
from kiln.runtime.vm.executable import VMExecutable
from kiln.runtime.vm.executable_format import VMFunction
from kiln.runtime.vm.inputs import Staging, as_input
from kiln.runtime.vm.kv_cache import AppendBuffer, KVCache
from kiln.runtime.vm.profile import BenchmarkResult, Profiler, ProfileReport, time_calls
from kiln.runtime.vm.replay import GuardFailed, Retrace, Trace
from kiln.runtime.vm.storage import Arena, Storage
from kiln.runtime.vm.trace import Tracer

TYPE_KEY = "relax.VirtualMachine"
#: nested VM calls before a call is refused (runaway recursion)
MAX_DEPTH = 128
#: failed guards in a row of one function's traces (a data-dependent shape that changed) after
#: which it is no longer traced: shapes that change on most calls gain nothing from a recording
MAX_GUARD_FAILURES = 8

# decoded op kinds
_BUILTIN, _KERNEL, _VMCALL, _RET, _GOTO, _IF = range(6)


class _Plan:
    """One VM function, prepared: its ops and, when replayable, the split into checks (the
    shape checks, ``bind_shape`` of parameters included, and the shape programs before the
    last of them: they decide the heap tuple), derived (the shape programs after them:
    functions of that tuple), both run on every call, and body (interpreted once while it is
    traced, then replayed)."""

    __slots__ = ("body", "checks", "derived", "fidx", "func", "ops", "replayable")

    def __init__(self, fidx: int, func: VMFunction, ops: list[tuple]):
        self.fidx = fidx
        self.func = func
        self.ops = ops
        self.checks: list[tuple] = []
        self.derived: list[tuple] = []
        self.body: list[tuple] = []
        self.replayable = False


def _copy_out(value: Any) -> Any:
    """``value`` with each tensor in VM storage copied (the next call reuses that storage);
    key/value cache views (``vm_kv_cache``) are returned as they are: no call writes rows
    they can see."""
    if type(value) is NDArray:
        return value if type(value._owner) is AppendBuffer else array(value)
    if type(value) is tuple:
        return tuple(_copy_out(v) for v in value)
    return value


def _truth(value: Any) -> bool:
    if type(value) is NDArray:
        if value._arr.size != 1:
            raise KilnError(f"VM: the condition of an If is a tensor of shape "
                            f"{list(value.shape)}, not one value")
        return bool(value._arr.reshape(-1)[0])
    return bool(value)


def _checks_parameter(op: tuple, nparams: int) -> bool:
    """True for a builtin that reads only the shape of a parameter (``bind_shape`` of an
    input: a shape check, whatever its ``data`` effect says of computed values)."""
    regpos = op[4]
    return (op[0] == _BUILTIN and getattr(op[2], "shape_only", False) and len(regpos) == 1
            and regpos[0][0] == 0 and regpos[0][1] < nparams)


class VirtualMachine(Module):
    """The VM module over one executable (create it with ``exe["vm_load_executable"]()``).

    Functions: ``vm_initialization``, every VM function by name, ``set_input``,
    ``invoke_stateful``, ``get_outputs``, ``time_evaluator``, ``profile``, ``memory_stats``,
    ``replay_stats``. ``kiln.vm.VirtualMachine`` wraps them with docs.

    Parameters
    ----------
    exe : VMExecutable
        Its imports hold the kernels.
    """

    type_key = TYPE_KEY

    def __init__(self, exe: VMExecutable):
        super().__init__()
        if not isinstance(exe, VMExecutable):
            raise KilnError(f"VirtualMachine expects a VMExecutable, got {type(exe).__name__}")
        self.exe = exe
        self.import_module(exe)  # keeps the executable and its library alive
        self.arena = Arena(self._on_storage_grow)
        self.kv = KVCache()
        self._plans: dict[int, _Plan] = {}
        self._active: dict[int, int] = {}
        self._depth = 0
        self._initialized = False
        self._traces: dict[tuple[int, int], Trace] = {}
        self._untraceable: set[tuple[int, int]] = set()
        self._reshapes: dict[object, tuple[NDArray, tuple[int, ...], NDArray]] = {}
        self._inputs: dict[str, list[NDArray]] = {}
        self._staging = Staging()
        self._outputs: dict[str, Any] = {}
        self._profiler: Profiler | None = None
        self.counters = {"calls": 0, "replays": 0, "recordings": 0, "interpreted": 0,
                         "guard_failures": 0}
        self._guard_failures: dict[tuple[int, int], int] = {}
        self._own: dict[str, Callable[..., Any]] = {
            "vm_initialization": self.vm_initialization, "set_input": self.set_input,
            "invoke_stateful": self.invoke_stateful, "get_outputs": self.get_outputs,
            "time_evaluator": self.time_evaluator, "profile": self.profile,
            "memory_stats": self.memory_stats, "replay_stats": self.replay_stats,
            "get_function_names": exe.vm_function_names,
        }

    # ----------------------------------------------------------------- module functions
    def _get_own_function(self, name: str) -> PackedFunc | None:
        fn = self._own.get(name)
        if fn is not None:
            return PackedFunc(fn, name)
        fidx = self.exe.func_index.get(name)
        if fidx is None or not self.exe.functions[fidx].is_vm:
            return None
        return PackedFunc(lambda *args: self.call(name, *args), name)

    def list_function_names(self) -> list[str]:
        return [*self._own, *self.exe.vm_function_names()]

    # ------------------------------------------------------------------- initialization
    def vm_initialization(self, *devices: int) -> None:
        """Pick the devices and prepare every function (TVM's ``vm_initialization(
        device_type, device_id, alloc_type, ...)``: one triple per device, the host last).

        Raises
        ------
        KilnError
            Not whole triples, a non-CPU device, an unknown allocator type (1 naive, 2 pooled:
            both mean the arena here), a kernel missing from the library, or an unknown builtin.
        ModuleLoadError
            A call site whose arguments do not fit its builtin or callee.
        """
        if not devices or len(devices) % 3:
            raise KilnError(f"vm_initialization: expected (device_type, device_id, alloc_type) "
                            f"triples, got {len(devices)} values")
        for k in range(0, len(devices), 3):
            dev_type, _, alloc = (int(v) for v in devices[k:k + 3])
            if dev_type != C.kDLCPU:
                raise KilnError(f"vm_initialization: device type {dev_type} is not supported: "
                                "the Kiln VM runs on cpu (device type 1) only")
            if alloc not in (1, 2):
                raise KilnError(f"vm_initialization: unknown allocator type {alloc} (1 naive, "
                                "2 pooled)")
        values = self._function_values()
        self._plans = {fidx: self._plan(fidx, values) for fidx in self.exe.decoded}
        self._traces.clear()  # made with the previous plans' calls
        self._untraceable.clear()
        self._guard_failures.clear()
        self._initialized = True

    def _function_values(self) -> list[Any]:
        """Per function table entry: its PackedFunc (kernels), None (builtins) or a callable
        invoking it (VM functions)."""
        out: list[Any] = []
        for fidx, f in enumerate(self.exe.functions):
            if f.is_vm:
                out.append(PackedFunc(self._vm_callable(fidx), f.name))
            elif f.name.startswith(PREFIX):
                out.append(None)
            else:
                kernel = self.exe.find_packed(f.name)
                if kernel is None:
                    lib = self.exe.lib
                    where = f"'{lib.type_key}'" if lib is not None else "(no library imported)"
                    raise KilnError(f"VM: kernel {f.name!r} (function table entry {fidx}) not "
                                    f"found in the executable's library {where} or its imports")
                out.append(kernel)
        return out

    def _vm_callable(self, fidx: int) -> Callable[..., Any]:
        return lambda *args: _copy_out(self._invoke(fidx, list(args)))

    def _plan(self, fidx: int, values: list[Any]) -> _Plan:
        func = self.exe.functions[fidx]
        ops = [self._op(fidx, func, ins, values) for ins in self.exe.decoded[fidx]]
        if ops[-1][0] not in (_RET, _GOTO):
            raise ModuleLoadError(f"VM executable: function {func.name!r} can run past its last "
                                  "instruction (it must end with ret or goto)")
        plan = _Plan(fidx, func, ops)
        self._split_for_replay(plan)
        return plan

    def _op(self, fidx: int, func: VMFunction, ins: Instr, values: list[Any]) -> tuple:
        if ins.op == OP_GOTO:
            return (_GOTO, -1, ins.target, None, (), (), None)
        if ins.op == OP_IF:
            return (_IF, ins.dst, ins.target, None, (), (), None)
        if ins.op != OP_CALL:
            return (_RET, ins.dst, None, None, (), (), None)
        template: list[Any] = []
        regpos, heappos = [], []
        for pos, (kind, value) in enumerate(ins.args):
            if kind == REG:
                regpos.append((pos, value))
            elif kind == HEAP:
                heappos.append((pos, value))
            template.append(self._static_value(kind, value, values, func, ins))
        callee = self.exe.functions[ins.func_idx]
        where = f"function {func.name!r} instruction {ins.index}"
        fixed = (tuple(template), tuple(regpos), tuple(heappos))
        if callee.is_vm:
            if len(ins.args) != len(callee.params):
                raise ModuleLoadError(f"VM executable: {where}: {callee.name!r} takes "
                                      f"{len(callee.params)} arguments, the call passes "
                                      f"{len(ins.args)}")
            return (_VMCALL, ins.dst, ins.func_idx, *fixed, None)
        if callee.name.startswith(PREFIX):
            run = prepare_builtin(Site(callee.name, ins.args, func, self.exe.symbols,
                                       self.exe.constants, where))
            run.builtin_name = callee.name  # type: ignore[attr-defined]  # (for traces)
            return (_BUILTIN, ins.dst, run, *fixed, getattr(run, "effect", None))
        return (_KERNEL, ins.dst, values[ins.func_idx], *fixed,
                [None, None, callee.name, self.exe.sources.get((func.name, ins.pc))])

    def _static_value(self, kind: int, value: int, values: list[Any], func: VMFunction,
                      ins: Instr) -> Any:
        if kind == IMM:
            return value
        if kind == CONST:
            return self.exe.constants[value]
        if kind == FUNC:
            if values[value] is None:
                raise ModuleLoadError(f"VM executable: function {func.name!r} instruction "
                                      f"{ins.index} passes builtin "
                                      f"{self.exe.functions[value].name!r} as a value")
            return values[value]
        return None  # REG / HEAP: filled per call

    def _split_for_replay(self, plan: _Plan) -> None:
        """Mark ``plan`` replayable when it has no VM calls, never writes its parameter
        registers, and checks every parameter with ``match_shape``. Its shape checks
        then run first, on every call, and decide the heap tuple: ``match_shape``, the shape
        programs, and ``bind_shape`` of a parameter (a ``match_cast`` of an input: it reads
        only the input's shape). The other data-dependent builtins stay in the body; from the
        first that writes heap slots on, shape programs stay there too (they may read what it
        bound), and a replay guards on the values they write (``vm_replay``)."""
        nparams = len(plan.func.params)
        # With control flow the body keeps every op's index (jumps are absolute): a check
        # taken out leaves a jump to the next op; an op after the first jump may not run, so
        # none is a check
        flows = any(op[0] in (_GOTO, _IF) for op in plan.ops)
        checked: set[int] = set()
        checks, body = [], []
        late = False  # a builtin of the body has written heap slots
        branched = False
        for index, op in enumerate(plan.ops):
            kind, dst, target = op[0], op[1], op[2]
            if kind == _VMCALL or (0 <= dst < nparams and kind != _RET):
                return
            branched = branched or kind in (_GOTO, _IF)
            stage = getattr(target, "stage", None) if kind == _BUILTIN else None
            if not late and _checks_parameter(op, nparams):
                stage = "check"
            if stage is None or branched or (late and stage != "match"):
                body.append(op)
                late = late or (kind == _BUILTIN and bool(getattr(target, "writes", ())))
                continue
            if stage == "match":
                regpos = op[4]
                if not regpos or regpos[0][0] != 0 or regpos[0][1] >= nparams:
                    return  # matches a value computed in the function
                checked.add(regpos[0][1])
            checks.append(op)
            if flows:
                body.append((_GOTO, -1, index + 1, (), (), (), None))
        if checked != set(range(nparams)):
            return
        last = max((i for i, op in enumerate(checks)
                    if getattr(op[2], "stage", None) != "compute"), default=-1)
        plan.checks, plan.derived = checks[:last + 1], checks[last + 1:]
        plan.body, plan.replayable = body, True

    # ------------------------------------------------------------------------ running
    def _require_init(self) -> None:
        if not self._initialized:
            raise KilnError("VM: call vm_initialization(device_type, device_id, alloc_type) "
                            "before running functions")

    def _lookup(self, name: str) -> int:
        self._require_init()
        fidx = self.exe.func_index.get(name)
        if fidx is None or fidx not in self._plans:
            raise KilnError(f"VM has no function {name!r}; functions: "
                            f"{self.exe.vm_function_names()}")
        return fidx

    def _convert(self, fidx: int, args: tuple, copy: bool = False) -> list[NDArray]:
        func = self.exe.functions[fidx]
        if len(args) != len(func.params):
            names = ", ".join(p.name for p in func.params)
            raise KilnError(f"VM function {func.name!r} takes {len(func.params)} inputs "
                            f"({names}), got {len(args)}")
        staging = self._staging
        try:
            return [as_input(v, s, copy, staging, (fidx, i))
                    for i, (v, s) in enumerate(zip(args, func.params))]
        except KilnError as err:  # (a dtype's ShapeError stays one)
            cls = ShapeError if isinstance(err, ShapeError) else KilnError
            raise cls(f"VM function {func.name!r}: {err}") from None

    def call(self, name: str, *args: Any) -> Any:
        """Run VM function ``name`` on ``args``; returns a copy of its result (an NDArray or a
        tuple). See ``kiln.vm.VirtualMachine`` for the errors."""
        fidx = self._lookup(name)
        return _copy_out(self._invoke(fidx, self._convert(fidx, args)))

    def _invoke(self, fidx: int, args: list[Any]) -> Any:
        plan = self._plans[fidx]
        func = plan.func
        level = self._active.get(fidx, 0)
        if self._depth >= MAX_DEPTH:
            raise KilnError(f"VM: more than {MAX_DEPTH} nested calls (in {func.name!r})")
        self._active[fidx] = level + 1
        self._depth += 1
        self.counters["calls"] += 1
        try:
            regs = [*args, *([None] * (func.num_regs - len(args)))]
            frame = Frame(self, fidx, level, regs, [0] * func.heap_size)
            if plan.replayable and self._profiler is None:
                return self._replay_or_record(plan, frame, args)
            self.counters["interpreted"] += 1
            return self._exec(plan.ops, frame)
        finally:
            self._active[fidx] = level
            self._depth -= 1

    def _replay_or_record(self, plan: _Plan, frame: Frame, args: list[Any]) -> Any:
        """Run the shape checks and programs, then the function's trace (``vm_replay``) when
        it has one, else interpret the call while tracing it."""
        self._exec(plan.checks, frame)
        self._exec(plan.derived, frame)
        key = (plan.fidx, frame.level)
        trace = self._traces.get(key)
        if trace is not None:
            try:
                result = trace.replay(frame, args)
            except GuardFailed:  # another data-dependent shape: trace again, a few times
                self.counters["guard_failures"] += 1
                failures = self._guard_failures[key] = self._guard_failures.get(key, 0) + 1
                if failures >= MAX_GUARD_FAILURES:
                    self._traces.pop(key)
                    self._untraceable.add(key)
                    self.counters["interpreted"] += 1
                    return self._exec(plan.body, frame)
            except Retrace:  # interpreted (raising the interpreter's error, or traced again)
                pass
            else:
                self.counters["replays"] += 1
                if self._guard_failures:
                    self._guard_failures.pop(key, None)  # (counted in a row)
                return result
        elif key in self._untraceable:
            self.counters["interpreted"] += 1
            return self._exec(plan.body, frame)
        tracer = Tracer(args, plan.func.heap_size)
        frame.recorder = tracer if tracer.ok else None
        self.counters["interpreted"] += 1
        result = self._exec(plan.body, frame)
        trace = tracer.finish(tracer.result)
        if trace is None:
            self._untraceable.add(key)
            self._traces.pop(key, None)
        else:
            self._traces[key] = trace
            self.counters["recordings"] += 1
        return result

    def _exec(self, ops: list[tuple], frame: Frame) -> Any:
        """Interpret ``ops`` from the first; returns the value of the Ret reached (None when
        ``ops`` ends without one: the checks of a replayable function)."""
        regs, heap, rec = frame.regs, frame.heap, frame.recorder
        n = len(ops)
        pc = 0
        while pc < n:
            op = ops[pc]
            kind, dst, target, template, regpos, heappos, extra = op
            pc += 1
            if kind <= _VMCALL:
                a = list(template)
                for p, r in regpos:
                    a[p] = regs[r]
                for p, s in heappos:
                    a[p] = heap[s]
                if kind == _KERNEL:
                    value = (self._kernel(target, a, extra) if rec is None
                             else rec.kernel(op, a))
                elif kind == _BUILTIN:
                    value = target(frame, a) if rec is None else rec.builtin(op, frame, a)
                else:  # the callee's storage is reused by its next call: copy its result
                    value = _copy_out(self._invoke(target, a))
                if dst >= 0:
                    regs[dst] = value
            elif kind == _RET:
                if rec is not None:
                    rec.result = dst
                return regs[dst]
            elif kind == _GOTO:
                pc = target
            else:  # If: falls through when true
                taken = _truth(regs[dst])
                if rec is not None:
                    rec.branch(dst, taken)
                if not taken:
                    pc = target
        return None

    def _kernel(self, func: PackedFunc, a: list, cache: list) -> Any:
        if self._profiler is not None:
            return self._profiler.kernel(cache[2], func, a, cache[3])
        if func._cfunc is None:
            return func._pyfunc(*a)  # type: ignore[misc]
        # the same argument objects as the last call here: reuse its converted arrays
        # (NDArrays compare by identity; the cached key keeps them alive)
        key = tuple(a)
        if cache[0] != key:
            cache[1] = func.prepare(*a)
            cache[0] = key
        cache[1]()
        return None

    # ------------------------------------------------------------------ builtin helpers
    def reshaped(self, t: NDArray, shape: tuple[int, ...], site: object) -> NDArray:
        """A view of ``t`` with ``shape`` (size checked by the caller). The last view made at
        each call ``site`` is kept, so a repeated call hands kernels the same tensor (and the
        same prepared arguments); one per site bounds what the cache keeps alive."""
        hit = self._reshapes.get(site)
        if hit is not None and hit[0] is t and hit[1] == shape:
            return hit[2]
        out = NDArray._checked(t._arr.reshape(shape), t.dtype, t.device)
        self._reshapes[site] = (t, shape, out)
        return out

    def _on_storage_grow(self, st: Storage) -> None:
        # Drop every reference to the old buffer so it is freed now: prepared calls and
        # reshapes over its views.
        for plan in self._plans.values():
            for op in plan.ops:
                if op[0] == _KERNEL:
                    op[6][0] = op[6][1] = None
        self._reshapes.clear()  # (traces read each storage's address on every replay)

    # ---------------------------------------------------------------- stateful calls
    def set_input(self, name: str, *args: Any) -> None:
        """Keep copies of ``args`` as the inputs of VM function ``name`` for
        :meth:`invoke_stateful`."""
        fidx = self._lookup(name)
        self._inputs[name] = self._convert(fidx, args, copy=True)

    def invoke_stateful(self, name: str) -> None:
        """Run ``name`` on the inputs of :meth:`set_input`; keep the result for
        :meth:`get_outputs`."""
        fidx = self._lookup(name)
        if name not in self._inputs:
            raise KilnError(f"invoke_stateful({name!r}): call set_input({name!r}, ...) first")
        self._outputs[name] = _copy_out(self._invoke(fidx, list(self._inputs[name])))

    def get_outputs(self, name: str) -> Any:
        """The result of the last :meth:`invoke_stateful` of ``name``."""
        if name not in self._outputs:
            raise KilnError(f"get_outputs({name!r}): call invoke_stateful({name!r}) first")
        return self._outputs[name]

    # ------------------------------------------------------------------- measurement
    def time_evaluator(self, name: str, dev: Any = None, number: int = 10, repeat: int = 1,
                       min_repeat_ms: float = 0.0) -> Callable[..., BenchmarkResult]:
        """A function timing ``name``: called with inputs, it times calls on them (converted
        once); with none, it times :meth:`invoke_stateful` on the :meth:`set_input` values.
        One warm-up call first; ``repeat`` results of the mean over ``number`` calls."""
        fidx = self._lookup(name)
        if dev is not None:
            getattr(dev, "_check_cpu", lambda: None)()
        if number < 1 or repeat < 1:
            raise KilnError(f"time_evaluator: number ({number}) and repeat ({repeat}) must be "
                            ">= 1")

        def evaluate(*args: Any) -> BenchmarkResult:
            if args:
                inputs = self._convert(fidx, args)

                def once() -> None:
                    _copy_out(self._invoke(fidx, list(inputs)))
            else:
                def once() -> None:
                    self.invoke_stateful(name)
            return time_calls(once, number, repeat, min_repeat_ms)

        return evaluate

    def profile(self, name: str, *args: Any) -> ProfileReport:
        """Run ``name`` once, interpreted, timing every kernel call; with no ``args``, on the
        :meth:`set_input` values. Returns the report (``report.table()``)."""
        fidx = self._lookup(name)
        if args:
            inputs = self._convert(fidx, args)
        elif name in self._inputs:
            inputs = list(self._inputs[name])
        else:
            inputs = self._convert(fidx, ())
        outs = {f.name: len(f.outputs) for f in self.exe.functions if not f.is_vm}
        self._profiler = prof = Profiler(outs)
        try:
            t0 = prof.start = time.perf_counter()
            self._invoke(fidx, inputs)
            prof.report.total_us = (time.perf_counter() - t0) * 1e6
        finally:
            self._profiler = None
        return prof.report

    def memory_stats(self) -> dict[str, int]:
        """Storage held now and at most, in bytes: ``{"storage_bytes",
        "peak_storage_bytes", "num_storages", "allocations"}``. (Not counted: the buffers that
        misaligned inputs are copied into, :attr:`staging_bytes`, which depend on where the
        caller's arrays happen to lie.)"""
        return self.arena.stats()

    @property
    def staging_bytes(self) -> int:
        """Bytes of the buffers misaligned inputs were copied into (each at most the largest
        such input seen)."""
        return self._staging.nbytes

    def replay_stats(self) -> dict[str, int]:
        """Counters: ``calls`` (VM function calls), ``replays`` (served by a recording),
        ``recordings`` (traces made), ``interpreted``, ``guard_failures`` (replays abandoned
        because a data-dependent shape differed from the traced one: interpreted instead), and
        ``kept`` (traces held now)."""
        return {**self.counters, "kept": len(self._traces)}

    def __repr__(self) -> str:
        return (f"<kiln.runtime.VirtualMachine functions={self.exe.vm_function_names()} "
                f"initialized={self._initialized}>")


__all__ = ["TYPE_KEY", "VirtualMachine"]
