"""``kiln tune``: measure schedule candidates of a model's kernels on this CPU, write records.

::

    kiln tune model.onnx [--target "llvm -mcpu=native"] (--trials N | --time-budget 10m)
              -o records.jsonl [--tuning-records old.jsonl ...] [--input-shape NAME:SHAPE]
              [--search model|random] [--batch-size N] [--early-stopping N] [--ray ADDRESS]
              [--repeat N] [--no-in-model]
              [--quiet]

Then ``kiln compile model.onnx --tuning-records records.jsonl -o model.so`` applies them (on a
CPU with the same fingerprint, for the same target string). As tvmc's ``tvmc tune``
(``python/tvm/driver/tvmc/autotuner.py``); docs/decisions/024-tuner.md.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from kiln.cli.arguments import parse_input_shape, positive_int
from kiln.driver.tuning_records import MEASURE_METHODS, RECORD_MEASURE
from kiln.errors import KilnError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smh]?)")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``--time-budget``: ``90`` or ``90s`` (seconds), ``10m``, ``1.5h`` → seconds.

    Raises
    ------
    argparse.ArgumentTypeError
        Anything else, or zero.
    """
    match = _DURATION.fullmatch(text.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive duration such as 90s, 10m or 1h, got {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _non_negative_int(text: str) -> int:
    """``--confirm``'s count: an integer ≥ 0 (argparse.ArgumentTypeError otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def add_parser(sub) -> None:
    """Register ``kiln tune`` on the ``kiln`` subparsers."""
    p = sub.add_parser("tune", help="tune a model's kernels on this CPU (records for compile)",
                       description="Measure schedule candidates of the model's kernels on "
                                   "this CPU (each checked against the default schedule's "
                                   "output) and append one record per candidate to -o; "
                                   "kiln compile --tuning-records applies the best.")
    p.add_argument("model", help="the ONNX model file")
    p.add_argument("-o", "--output", required=True,
                   help="records file (JSON lines), appended to; configs already in it are "
                        "not measured again")
    p.add_argument("--target", default=None,
                   help='the compilation target the records are for (default: "llvm '
                        '-mcpu=native"; must be given to kiln compile the same way)')
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--trials", type=positive_int,
                        help="measure at most N new candidates, over all kernels")
    budget.add_argument("--time-budget", type=parse_duration, metavar="DURATION",
                        help="stop starting new candidates after this long: 90s, 10m, 1h")
    p.add_argument("--tuning-records", action="append", default=[], metavar="FILE",
                   help="earlier records: their configs are not measured again, and their "
                        "records of this model are copied into -o (repeatable)")
    p.add_argument("--input-shape", dest="input_shapes", action="append", default=[],
                   type=parse_input_shape, metavar="NAME:SHAPE",
                   help="fix an input's shape, e.g. data:1x3x224x224 (repeatable)")
    p.add_argument("--search", default="model", metavar="model|random",
                   help="model: candidates ranked by the learned cost model (default); "
                        "random: the same loop in a random order (the baseline)")
    p.add_argument("--batch-size", type=positive_int, default=8, metavar="N",
                   help="candidates of one kernel per round, built in parallel (default: 8; "
                        "every kernel gets one round first)")
    p.add_argument("--early-stopping", type=positive_int, metavar="N",
                   help="stop tuning a kernel after N measurements without improving it")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="build and measure on this Ray cluster (HOST:PORT or auto); "
                        "measurements only on nodes started with the resources "
                        "'python -m kiln.tune.ray_executor' prints on a CPU like this one")
    p.add_argument("--repeat", type=positive_int, default=5,
                   help="timed repeats per candidate (default: 5)")
    p.add_argument("--measure", default=RECORD_MEASURE, choices=MEASURE_METHODS,
                   help="flush: caches evicted before every timed run, as inside the model "
                        "(default); hot: back-to-back runs on warm data; hot-prepared: hot "
                        "with the arguments converted once (records say which; kiln compile "
                        "--tuning-measure picks the method it applies)")
    p.add_argument("--confirm", type=_non_negative_int, default=2, metavar="N",
                   help="after the search, measure each kernel's best config again next to "
                        "its default until it has N+1 records (ranked by median; default 2, "
                        "0: off)")
    p.add_argument("--no-in-model", dest="in_model", action="store_false",
                   help="skip the last stage: by default the best candidates are timed inside "
                        "the whole model against the defaults, and only the choices that make "
                        "it faster are kept (a quarter of --time-budget is kept for it)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=_cmd_tune)


def _cmd_tune(args: argparse.Namespace) -> int:
    tune_model(args.model, args.output, target=args.target, trials=args.trials,
               time_budget=args.time_budget, resume=args.tuning_records,
               input_shapes=args.input_shapes, repeat=args.repeat, search=args.search,
               batch_size=args.batch_size, early_stopping=args.early_stopping,
               ray=args.ray, measure=args.measure, confirm=args.confirm,
               in_model=args.in_model)
    return 0


def tune_model(model: str, output: str, target: str | None = None, trials: int | None = None,
               time_budget: float | None = None, resume: list[str] | None = None,
               input_shapes: list[tuple[str, tuple[int, ...]]] | None = None,
               repeat: int = 5, search: str = "model", batch_size: int = 8,
               early_stopping: int | None = None, ray: str | None = None, echo=print,
               measure: str = "flush", confirm: int = 2, in_model: bool = True):
    """Tune ``model``'s kernels for ``target`` on this CPU; records go to ``output``.

    Parameters
    ----------
    model : str
        Path of the ONNX model (static shapes, or fixed by ``input_shapes``).
    output : str
        Records file (JSON lines), appended to.
    target : str, optional
        An ``llvm`` or ``c`` target string (default :func:`kiln.target.default_target`).
    trials, time_budget : int, float (seconds)
        The most new candidates / the wall time after which no round starts (one needed).
    resume : list of str
        Earlier records files (``--tuning-records``).
    input_shapes : list of (name, shape)
        ``--input-shape``.
    repeat : int
        Timed repeats per candidate.
    search, batch_size, early_stopping : str, int, int
        :func:`kiln.tune.tuner.tune`'s (``--search``, ``--batch-size``,
        ``--early-stopping``).
    measure : str
        How candidates are timed (:data:`kiln.tune.measure.MEASURE_METHODS`).
    confirm : int
        Re-measurements of each kernel's winner (:func:`kiln.tune.tuner.tune`'s).
    in_model : bool
        Time the best candidates inside the whole model and keep only the confirmed choices
        (:class:`kiln.tune.in_model.GraphModelTimer`, :func:`kiln.tune.tuner.tune`'s
        ``model_timer``).
    ray : str, optional
        A Ray cluster's address: builds and measurements go through
        :class:`kiln.tune.ray_executor.RayExecutor` (Ray is imported only then).
    echo : callable
        Receives the summary lines.

    Returns
    -------
    kiln.tune.tuner.TuneResult

    Raises
    ------
    KilnError
        A model that cannot be read or compiled, a multi-level or non-CPU target, a
        records file that cannot be read or written, an output folder that does not exist,
        a Ray cluster that cannot be reached or has no measuring node of this CPU.
    """
    from kiln import progress
    from kiln.cli.files import check_output_file
    from kiln.driver.build_module import symbolic_params
    from kiln.frontend import from_onnx, load_onnx
    from kiln.target import default_target
    from kiln.tune.measure import MEASURE_METHODS
    from kiln.tune.tasks import extract_tasks
    from kiln.tune.tuner import SEARCHES, tune

    if search not in SEARCHES:
        raise KilnError(f"--search must be one of {', '.join(SEARCHES)}, got {search!r}")
    if measure not in MEASURE_METHODS:
        raise KilnError(f"--measure must be one of {', '.join(MEASURE_METHODS)}, got "
                        f"{measure!r}")
    target = target or default_target()
    out = Path(output)
    check_output_file(str(out))
    for path in resume or []:
        if not Path(path).is_file():
            raise KilnError(f"--tuning-records {path}: no such file")
    with progress.stage(f"Extracting tasks from {Path(model).name}"):
        proto = load_onnx(model)
        mod, params = from_onnx(proto, shape=dict(input_shapes or []))
        symbolic = symbolic_params(mod["main"])
        if symbolic:  # kernels over symbolic shapes have no fixed workload to time
            raise KilnError(f"kiln tune times kernels at fixed shapes, but these inputs have "
                            f"symbolic dims: {', '.join(symbolic)}; give the shapes you deploy "
                            "with --input-shape NAME:SHAPE (records apply to those shapes)")
        tasks = extract_tasks(mod, params, target)
    if not tasks:
        echo(f"{model}: no kernel with schedule choices to tune")
        return None
    echo(f"{len(tasks)} tasks ({sum(t.weight for t in tasks)} kernel calls, "
         f"{sum(t.size() for t in tasks)} candidates) for target {target}")
    timer = None
    if in_model:
        from kiln.driver.tuning_records import cpu_fingerprint
        from kiln.tune.in_model import GraphModelTimer

        timer = GraphModelTimer(mod, params, target, cpu_fingerprint(), measure)
    executor = None
    if ray is not None:
        from kiln.tune.ray_executor import RayExecutor

        executor = RayExecutor(ray)
    try:
        result = tune(tasks, target, out, trials=trials, time_budget=time_budget,
                      resume=resume or [], repeat=repeat, executor=executor, search=search,
                      batch_size=batch_size, early_stopping=early_stopping,
                      measure=measure, confirm=confirm, model_timer=timer)
    finally:
        if executor is not None:
            executor.close()
        if timer is not None:
            timer.close()
    for s in sorted(result.states, key=lambda s: -s.task.weight * s.best
                    if s.best != float("inf") else 0.0):
        if s.best != float("inf"):
            echo(f"  {s.task.name} ×{s.task.weight}: {s.best * 1e6:.1f} us "
                 f"(default {s.default_cost * 1e6:.1f} us) {s.best_config}")
    echo(f"measured {result.trials} candidates ({result.resumed} from earlier records; "
         f"{result.confirmed} re-measurements of the winners) in "
         f"{result.elapsed:.1f} s; tuned kernels' time per run ≈ "
         f"{result.latency(default=True) * 1e3:.3f} ms default → {result.latency() * 1e3:.3f} "
         f"ms; records in {out}")
    if result.stop_note:
        echo(result.stop_note)
    if result.in_model is not None:
        echo(result.in_model.summary())
    if result.in_model_skipped:
        echo(result.in_model_skipped)
    return result
