"""How a schedule declares a knob and reads the value of the config being applied.

A schedule calls :func:`knob` where it would use a constant or a rule's result::

    pixels = knob("tile_ow", _divisors(x.extent, REG_BLOCK), default=_row_block(...))

Outside a tuning context (an ordinary build) it returns ``default`` and costs nothing else.
Inside :func:`configured` (task extraction, a candidate's lowering, a build applying tuning
records) it records the declared :class:`~kiln.schedules.space.Knob` — its values with the default
first, so the default schedule is always candidate 0 — and returns the config's value for that
name when the config has one.

The idea is AutoTVM's ``cfg.define_knob`` / ``cfg.define_split`` inside a template
(``python/tvm/autotvm/task/space.py``: ``ConfigSpace`` while the space is collected,
``ConfigEntity`` while one config is applied), with two differences: the schedule is Kiln's
hand-written default schedule (no separate template), and one call both declares the knob and
reads its value.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from kiln.errors import KilnError
from kiln.schedules.space import Config, Knob


@dataclass
class KnobContext:
    """What one kernel's lowering under :func:`configured` saw: ``config`` (knob name →
    value, applied where legal) and ``declared`` (name → Knob, first declaration wins:
    a kernel's version for small symbolic extents declares its knobs again)."""

    kernel: str
    config: Mapping[str, int | str]
    strict: bool = True
    declared: dict[str, Knob] = field(default_factory=dict)
    legal: dict[str, tuple[int | str, ...]] = field(default_factory=dict)

    def space(self) -> tuple[Knob, ...]:
        """The declared knobs, in declaration order.

        Returns
        -------
        tuple of Knob
            Each with its measured values, the default first.
        """
        return tuple(self.declared.values())


_CURRENT: contextvars.ContextVar[KnobContext | None] = contextvars.ContextVar(
    "kiln_tune_knobs", default=None)


@contextlib.contextmanager
def configured(kernel: str, config: Config | None = None,
               strict: bool = True) -> Iterator[KnobContext]:
    """While active, :func:`knob` declares into the yielded :class:`KnobContext` and returns
    ``config``'s values.

    Parameters
    ----------
    kernel : str
        The kernel's name, for error messages.
    config : mapping of knob name to value, optional
        The candidate to apply (empty or None: every knob's default).
    strict : bool
        With True, a config value that is not one of its knob's legal values raises
        :class:`KilnError`; with False it is ignored (the default is used). After the
        lowering, :func:`check_config` reports names the schedule never declared.

    Yields
    ------
    KnobContext
        What the lowering declares (``declared``, ``legal``) while the context is active.
    """
    ctx = KnobContext(kernel, dict(config or {}), strict)
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def active() -> bool:
    """Whether a tuning context is active.

    Schedules may then compute alternatives that an ordinary build never needs (the
    ``parallel_extent`` space of :func:`kiln.schedules.cpu.schedule_loops`).

    Returns
    -------
    bool
        Whether :func:`configured` is active in this context.
    """
    return _CURRENT.get() is not None


def knob(name: str, values: Iterable[int | str], default: int | str,
         space: Iterable[int | str] | None = None) -> int | str:
    """The value of knob ``name``: the applied config's, else ``default`` (the rule's choice).

    Parameters
    ----------
    name : str
        Unique within one kernel's schedule (TVM's names where AutoTVM has one:
        ``tile_ow``, ``unroll_kw``...).
    values : iterable of int or str
        The legal values for this workload (divisors etc. as the schedule computes them);
        ``default`` is put first and duplicates are dropped.
    default : int or str
        What the schedule's rule chose; the value of an ordinary build.
    space : iterable of int or str, optional
        The values worth measuring, when fewer than the legal ones (those that give this
        workload another loop nest than the default); default: ``values``. A config may
        hold any legal value: the legal set must not depend on other knobs' values.

    Returns
    -------
    int or str
        The config's value when it is legal here; else ``default``: outside a tuning
        context, a knob the config does not name, or a value illegal here that is ignored
        (not strict, or legal in the knob's first declaration: a small-extents version).

    Raises
    ------
    KilnError
        In a strict context, a config value that is not legal for this kernel (the message
        names the kernel, the knob, the value and the legal values).
    """
    ctx = _CURRENT.get()
    if ctx is None:
        return default
    legal = tuple(dict.fromkeys([default, *values]))
    if name not in ctx.declared:
        tried = legal if space is None else tuple(dict.fromkeys([default, *space]))
        ctx.declared[name] = Knob(name, tried)
        ctx.legal[name] = legal
    if name not in ctx.config:
        return default
    value = ctx.config[name]
    if value in legal:
        return value
    if ctx.strict and value not in ctx.legal[name]:
        raise KilnError(f"kernel {ctx.kernel}: knob {name}={value!r} is not legal; "
                        f"legal values: {list(legal)}")
    return default  # the small-extents version of a kernel: its own legal values


def check_config(ctx: KnobContext) -> None:
    """Check that every knob ``ctx.config`` names was declared by the kernel's schedule.

    Parameters
    ----------
    ctx : KnobContext
        The context of one kernel's lowering under :func:`configured`.

    Raises
    ------
    KilnError
        A config name the schedule did not declare (a record for another version of the
        schedule); the message lists the declared knobs.
    """
    unknown = sorted(set(ctx.config) - set(ctx.declared))
    if unknown:
        raise KilnError(f"kernel {ctx.kernel}: unknown knob(s) {', '.join(unknown)}; its "
                        f"schedule declares {sorted(ctx.declared) or 'none'}")
