"""Default CPU schedules.

Tensor-level (per fused function, chosen by its master op's tag, registered with
:func:`register_schedule`): which stages are inlined, the loop order of reductions. Loop-level
(every function): each top-level loop nest gets its outer loops fused until there is enough
parallel work, and that loop runs in parallel (outlined and launched on the support code's
thread pool, both targets).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from kiln.schedules import knobs
from kiln.schedules import primitives as P
from kiln.schedules.pad_guards import hoist_pad_guards
from kiln.schedules.reduce_rfactor import vectorize_reductions
from kiln.schedules.row_fusion import fuse_rows
from kiln.tir import loop as L
from kiln.tir.lower import Schedule
from kiln.tir.te import SMALL_EXTENTS, Tensor

_TE_SCHEDULES: dict[str, Callable[[Schedule, Tensor], None]] = {}

# Fuse outer loops until a parallel loop has at least this many iterations (so both cores, and
# more, get balanced work), but stop before fusing into tiny inner loops.
MIN_PARALLEL_EXTENT = 16
# Nests with fewer scalar iterations than this run serially (a pool launch costs ~1 us).
MIN_PARALLEL_WORK = 4096
#: the tuner's choices of the least parallel extent (knob ``parallel_extent``: how many outer
#: loops the parallel loop fuses, so which loop the threads split)
PARALLEL_EXTENT_CHOICES = (1, 4, 16, 64, 256)


@contextlib.contextmanager
def small_extents(version: int = 1):
    """Context manager: while active, schedules block no symbolic axis with a tail.

    The version of a kernel for extents smaller than its blocks (see
    ``te_compiler.lower_primitive``); :func:`tails_allowed` reads it. ``version`` 2 is the
    version for extents below the blocks that version 1 still takes
    (:data:`kiln.tir.te.SMALL_EXTENTS`).

    Yields
    ------
    None
    """
    token = SMALL_EXTENTS.set(version)
    try:
        yield
    finally:
        SMALL_EXTENTS.reset(token)


def tails_allowed() -> bool:
    """Whether a schedule may split a symbolic axis into blocks with a partial last one.

    Returns
    -------
    bool
        False inside :func:`small_extents`, else True.
    """
    return SMALL_EXTENTS.get() == 0


def register_schedule(tag: str):
    """Decorator: ``fn(schedule, stage_tensor)`` adjusts the schedule of stages tagged ``tag``.

    TVM's ``@autotvm.register_topi_schedule`` / strategy table, keyed by the stage's tag
    (:mod:`kiln.topi`). A schedule may declare tuning knobs (:func:`kiln.schedules.knobs.knob`:
    a :class:`KilnError` for an illegal config value in a strict tuning context).

    Parameters
    ----------
    tag : str
        The tag of the stages ``fn`` schedules (``"conv2d"``, ``"dense_pack"``...). A schedule
        reads the target it schedules for from :meth:`kiln.target.Target.current`.

    Returns
    -------
    callable
        The decorator; it returns ``fn`` unchanged (a later registration of the same tag wins).
    """

    def wrap(fn: Callable[[Schedule, Tensor], None]):
        _TE_SCHEDULES[tag] = fn
        return fn

    return wrap


def schedule_te(sch: Schedule) -> Schedule:
    """The default tensor-level schedule: inline injective stages, then per-tag overrides.

    Every non-reduction stage but the output is inlined (:meth:`Schedule.inline_injective`),
    then each stage in order whose tag has a registered schedule gets it.

    Parameters
    ----------
    sch : Schedule
        The fused function's tensor-level schedule (changed in place).

    Returns
    -------
    Schedule
        ``sch``.
    """
    sch.inline_injective()
    for t in sch.order:
        fn = _TE_SCHEDULES.get(t.tag)
        if fn is not None:
            fn(sch, t)
    return sch


def schedule_loops(func: L.PrimFunc) -> L.PrimFunc:
    """The default loop-level schedule: every top-level loop nest of ``func`` parallelized.

    First the nests of a row-fused kernel are fused row by row when the tensor-level schedule
    set ``attrs["fuse_rows"]`` (:func:`kiln.schedules.row_fusion.fuse_rows`), otherwise float
    min / max reductions are split into vector lanes
    (:func:`kiln.schedules.reduce_rfactor.vectorize_reductions`), and padding tests are
    hoisted out of reductions (:func:`kiln.schedules.pad_guards.hoist_pad_guards`). Then each
    nest of at least MIN_PARALLEL_WORK (4096) scalar iterations (a symbolic extent counts as
    SYMBOLIC_EXTENT_GUESS) has its outer loops fused until the loop has MIN_PARALLEL_EXTENT
    (16) iterations (:func:`_parallelize`), and that loop is parallel. Knob (tuning contexts only):
    ``parallel_extent``, the least extent, from PARALLEL_EXTENT_CHOICES (1, 4, 16, 64, 256);
    measured: those that parallelize differently (:func:`_parallel_extents`).

    Parameters
    ----------
    func : PrimFunc
        A lowered kernel.

    Returns
    -------
    PrimFunc
    """
    if func.attrs.get("fuse_rows"):
        func = fuse_rows(func)
    else:
        func = vectorize_reductions(func)
    func = hoist_pad_guards(func)
    least = MIN_PARALLEL_EXTENT
    if knobs.active():  # the alternatives cost a lowering each: only while tuning
        least = int(knobs.knob("parallel_extent", PARALLEL_EXTENT_CHOICES, least,
                               space=_parallel_extents(func)))
    return _parallelize(func, least)[0]


def _parallelize(func: L.PrimFunc, least: int) -> tuple[L.PrimFunc, tuple[int, ...]]:
    """``func`` with each nest's outer loops fused until the loop has ``least`` iterations,
    that loop parallel; and the number of fusions per nest."""
    fusions = []
    for nest in P.top_level_nests(func):
        if _work(nest) < MIN_PARALLEL_WORK:
            continue
        loop, count = nest, 0
        while _may_be_small(loop, least) and \
                isinstance(inner := P.peel_lets(loop.body)[1], L.For) and _fusable(inner, loop):
            func, loop = P.fuse(func, loop)
            count += 1
        func = P.parallel(func, loop)
        fusions.append(count)
    return func, tuple(fusions)


def _parallel_extents(func: L.PrimFunc) -> list[int]:
    """The PARALLEL_EXTENT_CHOICES that parallelize ``func`` differently from the default
    and from each other (the first of each outcome)."""
    seen = {_parallelize(func, MIN_PARALLEL_EXTENT)[1]}
    out = []
    for least in PARALLEL_EXTENT_CHOICES:
        fusions = _parallelize(func, least)[1]
        if fusions not in seen:
            seen.add(fusions)
            out.append(least)
    return out


def _may_be_small(loop: L.For, least: int = MIN_PARALLEL_EXTENT) -> bool:
    """Whether the loop may have fewer than ``least`` iterations: a small constant, or a
    symbolic extent (a batch or a sequence length may be 1 at run time)."""
    return not isinstance(loop.extent, L.IntImm) or loop.extent.value < least


def _fusable(loop: L.For, outer: L.For) -> bool:
    """Whether fusion may take ``loop`` into ``outer``: both of constant extent (as for static
    kernels), or a serial loop that is not the innermost (fusing that one would put a division
    by a symbolic extent on every element and stop vectorization)."""
    if isinstance(loop.extent, L.IntImm) and isinstance(outer.extent, L.IntImm):
        return True
    return loop.kind == "serial" and isinstance(loop.body, (L.For, L.Allocate, L.SeqStmt))


#: what a symbolic extent counts as in the work estimate (a sequence length, a batch...)
SYMBOLIC_EXTENT_GUESS = 64


def _work(s: L.Stmt) -> int:
    """Scalar iterations of the innermost statements (a symbolic extent counts as
    SYMBOLIC_EXTENT_GUESS)."""
    if isinstance(s, L.For):
        n = s.extent.value if isinstance(s.extent, L.IntImm) else SYMBOLIC_EXTENT_GUESS
        return n * _work(s.body)
    if isinstance(s, L.SeqStmt):
        return sum(_work(x) for x in s.stmts)
    if isinstance(s, (L.Allocate, L.AssertStmt, L.LetStmt)):
        return _work(s.body)
    if isinstance(s, L.IfThenElse):
        return _work(s.then_case)
    return 1
