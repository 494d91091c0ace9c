"""Auto-tuning (issue 19): schedules declare knobs, a search measures candidates, records
apply them at compile time. See docs/decisions/024-tuner.md.

Modules (one concept each):

- :mod:`kiln.schedules.space` — ``Knob`` / ``Config`` / ``Task``: the contract every other module uses;
- ``knobs`` — how a schedule declares a knob and reads the value of the config being applied;
- ``tasks`` — task extraction from a model (unique kernels, weight = occurrences);
- ``measure`` — build one candidate, check it against the default schedule's output, time it;
- ``records`` — JSON-lines records, CPU fingerprint; ``apply_history`` — apply them at compile
  time (``kiln.build(..., tuning_records=)``) and say what fell back;
- ``tuner`` — ``kiln tune``'s loop: the scheduler's search through an executor, records appended
  per round, resume;
- ``features`` / ``cost_model`` / ``search`` / ``task_scheduler`` — loop-nest features, the
  learned cost model (LightGBM), evolutionary search per task, and the scheduler across tasks;
- :mod:`kiln.tune.executor` — where builds and measurements run: local worker processes, or Ray
  (``ray_executor``, measuring nodes marked by ``records.fingerprint_id``).
"""
