"""Task extraction: a model's unique kernels, how often it runs each, and their knob spaces.

The model goes through ``kiln.build``'s own graph pipeline
(:func:`kiln.driver.build_module.optimize`
under the target) up to its fused primitive functions; identical ones (one
:func:`kiln.relay.graph.structural_key`) are one task whose weight is their count. Each unique
kernel is lowered once under :func:`kiln.schedules.knobs.configured` to learn the knobs its schedule
declares. As AutoTVM's ``extract_from_program`` (``python/tvm/autotvm/task/relay_integration.py``)
and MetaSchedule's ``extract_tasks`` (``python/tvm/meta_schedule/relay_integration.py``), but
the kernels are Kiln's own fused functions, so a task is exactly what ``kiln.build`` compiles.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kiln.driver.apply_history import workload_key
from kiln.errors import KilnError
from kiln.relay.graph import Constant, Function, IRModule, PrimitiveCall
from kiln.schedules.knobs import check_config, configured
from kiln.schedules.space import Config, Task
from kiln.target import Target, default_target
from kiln.tir import loop as L

log = logging.getLogger("kiln")


@dataclass(frozen=True)
class KernelPayload:
    """What another process needs to lower, build and run one task's kernel (picklable).

    ``body``: the fused primitive function (graph IR; ops pickle by name); ``name``: the
    kernel's symbol; ``target``: the target string the workload key was made with;
    ``constants``: per parameter of ``body``, the model's value of that argument (weights,
    shape tensors) or None where the argument is computed at run time (then random inputs);
    ``key``: the workload key."""

    body: Function
    name: str
    target: str
    constants: tuple[np.ndarray | None, ...]
    key: str

    def call(self) -> PrimitiveCall:
        """A PrimitiveCall of ``body`` for the lowering (which reads only its body)."""
        return PrimitiveCall(self.body, list(self.body.params), self.name)


def extract_tasks(mod: IRModule | Function, params: Mapping[str, np.ndarray] | None = None,
                  target: str | Target | None = None,
                  include_untunable: bool = False) -> list[Task]:
    """The tuning tasks of a model: its unique kernels, in the order the model first runs them.

    Parameters
    ----------
    mod : IRModule or Function
        The model (``kiln.frontend.from_onnx``'s first result) with static input shapes.
    params : dict of name to ndarray, optional
        The weights (``from_onnx``'s second result).
    target : str or Target, optional
        An ``llvm`` or ``c`` target (default: :func:`kiln.target.default_target`).
    include_untunable : bool
        Also return kernels whose schedule declares no knob with more than one value.

    Returns
    -------
    list of Task
        ``key`` (:func:`workload_key`), ``name`` (the fused function's), ``weight`` (its
        occurrences), ``space`` (the declared knobs), ``payload`` (:class:`KernelPayload`).
        Kernels with symbolic shapes are skipped (logged): they have no fixed workload to time.

    Raises
    ------
    KilnError
        A multi-level or non-CPU target; anything :func:`kiln.build` would raise for the model.
    """
    from kiln.driver.build_module import optimize, primitive_calls

    tgt = _tuning_target(target)
    func = mod["main"] if isinstance(mod, IRModule) else mod
    with tgt:
        calls = primitive_calls(optimize(func, dict(params) if params else None))
    groups: dict[str, list[PrimitiveCall]] = {}
    for call in calls:
        groups.setdefault(workload_key(call.body, str(tgt)), []).append(call)
    tasks = []
    for key, group in groups.items():
        call = group[0]
        if not all(p.checked_type.is_static for p in call.body.params):
            log.info("tune: skipping %s (symbolic shapes)", call.name)
            continue
        payload = KernelPayload(call.body, call.name, str(tgt), _constants(call), key)
        task = Task(key, call.name, len(group), kernel_space(payload), payload)
        if include_untunable or task.size() > 1:
            tasks.append(task)
    return tasks


def _tuning_target(target: str | Target | None) -> Target:
    tgt = Target(target if target is not None else default_target())
    if tgt.levels:
        raise KilnError(f"cannot tune for the multi-level target '{tgt}': tune each level's "
                        "-mcpu on a CPU of that level")
    if tgt.kind not in ("llvm", "c"):
        raise KilnError(f"cannot tune for target '{tgt}': tuning measures kernels on this CPU "
                        "(an llvm or c target)")
    return tgt


def _constants(call: PrimitiveCall) -> tuple[np.ndarray | None, ...]:
    return tuple(a.data if isinstance(a, Constant) and not a.is_symbolic else None
                 for a in call.args)


def kernel_space(payload: KernelPayload):
    """The knobs the kernel's schedule declares (lowered once with the default config)."""
    with Target(payload.target), configured(payload.name) as ctx:
        _lower(payload, packed=False)
    return ctx.space()


def lower_candidate(task: Task | KernelPayload, config: Config | None = None,
                    packed: bool = True) -> L.PrimFunc:
    """The kernel of ``task`` scheduled with ``config`` (the cost model's features read it).

    Parameters
    ----------
    task : Task or KernelPayload
    config : mapping of knob name to value, optional
        Missing knobs take their default (empty or None: the default schedule).
    packed : bool
        True: after MakePackedAPI, what the codegen compiles; False: before it, what the
        loop-IR interpreter runs (params: the inputs, then the output).

    Raises
    ------
    KilnError
        A knob value that is not legal for this kernel, or a knob its schedule does not
        declare (the message names the kernel and the knob).
    """
    payload = task.payload if isinstance(task, Task) else task
    if not isinstance(payload, KernelPayload):
        raise KilnError(f"task {getattr(task, 'name', task)!r} has no kernel payload")
    with Target(payload.target), configured(payload.name, config) as ctx:
        func = _lower(payload, packed)
    check_config(ctx)
    return func


def _lower(payload: KernelPayload, packed: bool) -> L.PrimFunc:
    from kiln.backend.te_compiler import lower_primitive, lower_unpacked

    lower = lower_primitive if packed else lower_unpacked
    return lower(payload.call(), payload.name)
