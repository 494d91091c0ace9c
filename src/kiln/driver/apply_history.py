"""Apply tuning records at compile time, and say what was applied.

``kiln.build(..., tuning_records=path)`` lowers each unique kernel through
:meth:`ApplyHistoryBest.lower`: the fastest error-free record for the kernel's workload key
(:func:`workload_key`, which includes the target string), measured on a CPU
with exactly this machine's fingerprint, is applied; every other kernel keeps the default
schedule, and :meth:`ApplyHistoryBest.summary` says why — ``symbolic shapes`` (the kernel has
symbolic dims: records time kernels at static shapes, ``kiln tune`` refuses symbolic ones),
``other workload`` (the records are for other kernels or shapes), ``no record`` (the records are
empty), ``other CPU`` (records for this kernel and target from a CPU with another fingerprint),
``other target`` (records for this kernel under another target string, which the summary
names), ``other threads`` (records for this kernel, target
and CPU measured at another ``KILN_NUM_THREADS``: parallel loops were chosen for another
thread count; ``no thread count``: records of this CPU written before they named it: re-tune,
or add ``"threads": N`` to their fingerprints), ``other measure`` (records for this kernel, target
and CPU timed with another measuring method, e.g. ``hot`` records from before cache flushing:
their times are not comparable with this method's), ``failed`` (only records with errors) or
``stale`` (the record's config is no longer legal for the kernel's schedule). Kernels whose
schedule declares no choice are not counted.

TVM's ``autotvm.apply_history_best`` (``python/tvm/autotvm/task/dispatcher.py``:
``ApplyHistoryBest``) and MetaSchedule's ``ApplyHistoryBest``
(``python/tvm/meta_schedule/relay_integration.py``, ``database.query_schedule``), with the
fallback counted and reported instead of a warning per kernel ("cannot find config").
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping

from kiln.driver.tuning_records import (
    RECORD_MEASURE,
    TuningRecord,
    best_records,
    cpu_fingerprint,
    load_records,
)
from kiln.errors import KilnError
from kiln.relay.graph import Function, PrimitiveCall, structural_key
from kiln.runtime.toolchain.compile_cache import make_key
from kiln.schedules.knobs import check_config, configured
from kiln.tir import loop as L


def workload_key(body: Function, target: str) -> str:
    """The workload key of a fused function for ``target``: SHA-256 (first 32 hex digits) of
    its structural key (ops, attrs, shapes, dtypes, wiring, scalar constants) and the target
    string. Stable across processes and runs."""
    return make_key("kiln-workload-v1", structural_key(body), str(target))[:32]


log = logging.getLogger("kiln")

#: the reasons a kernel fell back to its default schedule, in summary order
REASONS = ("symbolic shapes", "other workload", "no record", "other CPU", "other threads",
           "no thread count", "other target", "other measure", "failed", "stale")


class ApplyHistoryBest:
    """The best records of a records file (or list), applied to one build's kernels.

    Parameters
    ----------
    records : path or iterable of TuningRecord
        A JSON-lines file (:func:`kiln.driver.tuning_records.load_records`) or records.
    fingerprint : mapping, optional
        The CPU and kernel threads the build is for (default: this machine's and this
        process's ``KILN_NUM_THREADS``, :func:`kiln.driver.tuning_records.cpu_fingerprint`: compile
        with the thread count the library will run at).
    measure : str
        Apply only records timed with this method (default: the tuner's,
        :data:`kiln.tune.measure.DEFAULT_MEASURE`).

    Raises
    ------
    KilnError
        The file cannot be read or holds a line that is not a record.
    """

    def __init__(self, records: str | os.PathLike[str] | Iterable[TuningRecord],
                 fingerprint: Mapping[str, object] | None = None,
                 measure: str = RECORD_MEASURE) -> None:
        if isinstance(records, (str, os.PathLike)):
            self.source = str(records)
            self.records = load_records(records)
        else:
            self.source = "records"
            self.records = list(records)
        self.fingerprint = dict(fingerprint if fingerprint is not None else cpu_fingerprint())
        self.measure = measure
        self.target = ""
        self.best: dict[str, TuningRecord] = {}
        self.outcomes: dict[str, str] = {}  # kernel name -> "tuned" or a REASONS entry
        self.keys: dict[str, str] = {}  # kernel name -> workload key (per-kernel timing)
        self.other_targets: set[str] = set()  # the targets of the "other target" records
        self.skipped = ""

    def bind(self, target: str) -> None:
        """Select the records of ``target`` on this fingerprint (once per build)."""
        self.target = str(target)
        self.best = best_records(self.records, self.target, self.fingerprint, self.measure)
        self.outcomes.clear()
        self.keys.clear()
        self.other_targets.clear()

    def skip(self, why: str) -> None:
        """Apply nothing to this build (e.g. a multi-level target), and say so."""
        self.skipped = why

    def lower(self, call: PrimitiveCall, name: str) -> L.PrimFunc:
        """The packed kernel ``name`` of ``call``, with the best record's config if any."""
        from kiln.backend.te_compiler import lower_primitive

        key = workload_key(call.body, self.target)
        self.keys[name] = key
        record = self.best.get(key)
        if record is not None:
            try:
                with configured(name, record.config) as ctx:
                    func = lower_primitive(call, name)
                check_config(ctx)
                self.outcomes[name] = "tuned"
                log.debug("tuning records: %s <- %s", name, dict(record.config))
                return func
            except KilnError as err:
                log.warning("tuning records: %s: not applied (%s)", name, err)
        with configured(name) as ctx:
            func = lower_primitive(call, name)
        if math.prod(len(k.values) for k in ctx.space()) > 1 or record is not None:
            self.outcomes[name] = "stale" if record is not None else self._why(call, key)
        return func

    def _why(self, call: PrimitiveCall, key: str) -> str:
        same_key = [r for r in self.records if r.workload_key == key]
        here = [r for r in same_key if dict(r.fingerprint) == self.fingerprint]
        if any(r.measure == self.measure for r in here):
            return "failed"
        if any(r.best != float("inf") for r in here):
            return "other measure"
        if here:
            return "failed"
        cpu = {k: v for k, v in self.fingerprint.items() if k != "threads"}
        this_cpu = [r for r in same_key
                    if {k: v for k, v in r.fingerprint.items() if k != "threads"} == cpu]
        if any("threads" in r.fingerprint for r in this_cpu):
            return "other threads"
        if this_cpu:  # written before records named their thread count
            return "no thread count"
        if same_key:
            return "other CPU"
        others = {r.target for r in self.records if r.target != self.target}
        keys = {r.workload_key for r in self.records}
        matching = {t for t in others if workload_key(call.body, t) in keys}
        if matching:
            self.other_targets |= matching
            return "other target"
        body = call.body
        if not all(v.checked_type.is_static for v in [*body.params, *body.outputs]):
            return "symbolic shapes"
        return "other workload" if self.records else "no record"

    def summary(self) -> str:
        """One line: ``tuning records: 12 of 20 kernels tuned; 8 fell back to default (5 other
        workload, 2 other CPU, 1 other target: records for 'llvm -mcpu=haswell')``; the
        reasons that need it say what the records were for (:data:`REASONS`)."""
        if self.skipped:
            return f"tuning records: not applied ({self.skipped})"
        counts = Counter(self.outcomes.values())
        total, tuned = len(self.outcomes), counts["tuned"]
        line = f"tuning records: {tuned} of {total} kernels tuned"
        if total > tuned:
            why = ", ".join(f"{counts[r]} {r}{self._detail(r)}" for r in REASONS if counts[r])
            line += f"; {total - tuned} fell back to default ({why})"
        return line

    def _detail(self, reason: str) -> str:
        """What the records were for, where the reason alone does not say how to fix it."""
        if reason == "other target":
            names = ", ".join(repr(t) for t in sorted(self.other_targets))
            return f": records for {names}, this build is for {self.target!r}"
        if reason == "symbolic shapes":
            return (": records are for static shapes, these kernels' shapes are symbolic; "
                    "compile with --input-shape NAME:SHAPE at the tuned shapes")
        if reason == "other workload":
            return ": the records are for other kernels or shapes"
        return ""
