"""Auto-tuning (issue 19): schedules declare knobs, a search measures candidates, records
apply them at compile time. See docs/decisions/024-tuner.md.

Modules (one concept each). The contract the schedules and the build see lives below this
package: the knob API in :mod:`kiln.schedules.space` (``Knob`` / ``Config`` / ``Task``) and
:mod:`kiln.schedules.knobs` (how a schedule declares a knob and reads the applied config); the
records in :mod:`kiln.driver.tuning_records` (JSON lines, CPU fingerprint) and
:mod:`kiln.driver.apply_history` (applying them at compile time, ``kiln.build(...,
tuning_records=)``, and saying what fell back). Here, above the driver:

- ``tasks`` — task extraction from a model (unique kernels, weight = occurrences);
- ``measure`` — build one candidate, check it against the default schedule's output, time it;
- ``tuner`` — ``kiln tune``'s loop: the scheduler's search through an executor, records appended
  per round, resume;
- ``features`` / ``cost_model`` / ``search`` / ``task_scheduler`` — loop-nest features, the
  learned cost model (LightGBM), evolutionary search per task, and the scheduler across tasks;
- :mod:`kiln.tune.executor` — where builds and measurements run: local worker processes, or Ray
  (``ray_executor``, measuring nodes marked by ``tuning_records.fingerprint_id``).

May import: kiln.driver, kiln.backend, kiln.codegen, kiln.schedules, kiln.relay, kiln.tir,
kiln.runtime, kiln.target, kiln.progress (and kiln.errors).
"""
