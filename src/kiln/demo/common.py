"""What every demo does: compile an ONNX model to a loaded library, open an onnxruntime session
with the same thread budget, and time calls."""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.errors import KilnError
from kiln.runtime.threads import num_threads
from kiln.target import default_target

#: the fastest target for this machine (``kiln compile``'s default: ``llvm -mcpu=native``, or
#: ``c -mcpu=native`` without llvmlite): the demos run where they are built
TARGET = default_target()

#: the demos' modules that ``pip install kiln`` does not bring (the ``demo`` extra does), and
#: the distribution each comes from where its name differs
DEMO_DISTRIBUTIONS = {"PIL": "Pillow"}


def require_modules(demo: str, modules: tuple[str, ...]) -> None:
    """Check that the modules ``demo`` imports are installed, before it fetches or compiles
    anything (a missing onnxruntime would otherwise fail after the compile).

    Raises
    ------
    KilnError
        Naming the missing modules and the extra that installs them.
    """
    missing = [name for name in modules if not _installed(name)]
    if missing:
        names = ", ".join(f"{name} ({DEMO_DISTRIBUTIONS[name]})" if name in DEMO_DISTRIBUTIONS
                          else name for name in missing)
        raise KilnError(f"kiln demo {demo} needs {names}, not installed: "
                        "pip install 'kiln[demo]'")


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # in sys.modules without a spec: imported, so installed
        return True


def median_ms(fn: Callable[[], Any], runs: int) -> tuple[Any, float]:
    """Call ``fn`` once to warm up, then ``runs`` times; return the last result and the median
    wall time of the timed calls in ms."""
    times = []
    out = fn()
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return out, statistics.median(times)


def compile_model(model_path: Path, shapes: dict[str, tuple[int, ...]], so_path: Path):
    """Compile an ONNX model for :data:`TARGET` with fixed input ``shapes``, export it to
    ``so_path`` and load it back.

    Returns
    -------
    kiln.graph_executor.GraphModule
        An executor over the library loaded from ``so_path``.

    Raises
    ------
    KilnError
        If the model cannot be imported, compiled, exported or loaded.
    """
    import kiln
    from kiln import progress
    from kiln.frontend import from_onnx, load_onnx

    with progress.stage(f"Importing {model_path.name}"):
        mod, params = from_onnx(load_onnx(str(model_path)), shape=shapes)
    lib = kiln.build(mod, target=TARGET, params=params)
    with progress.stage(f"Exporting {so_path.name}"):
        lib.export_library(str(so_path))
    loaded = kiln.runtime.load_module(str(so_path))
    return kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))


def compile_vm(model_path: Path, dim_bounds: dict[str, tuple], so_path: Path):
    """Compile an ONNX model whose inputs keep their symbolic dims (bounded by ``dim_bounds``,
    as ``from_onnx`` takes them) into one VM library for :data:`TARGET`, export it to
    ``so_path`` and load it back.

    Returns
    -------
    kiln.vm.VirtualMachine
        A VM over the library loaded from ``so_path``; ``vm["main"](*inputs)`` takes any
        shape the symbols allow.

    Raises
    ------
    KilnError
        If the model cannot be imported, compiled, exported or loaded.
    """
    import kiln
    from kiln import progress
    from kiln.frontend import from_onnx, load_onnx
    from kiln.vm import VirtualMachine

    with progress.stage(f"Importing {model_path.name}"):
        mod, params = from_onnx(load_onnx(str(model_path)), dim_bounds=dim_bounds)
    exe = kiln.build(mod, target=TARGET, params=params, executor="vm")
    with progress.stage(f"Exporting {so_path.name}"):
        exe.export_library(str(so_path))
    return VirtualMachine(kiln.runtime.load_module(str(so_path)), kiln.cpu())


def run_vm(vm, inputs: list[Any]) -> list[Any]:
    """Call ``vm["main"]`` on ``inputs`` (in signature order); return every output as numpy."""
    out = vm["main"](*inputs)
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]


def run_graph(gmod, inputs: dict[str, Any]) -> list[Any]:
    """Set ``inputs`` on an executor, run it, return every output as numpy."""
    for name, value in inputs.items():
        gmod.set_input(name, value)
    gmod.run()
    return [gmod.get_output(i).numpy() for i in range(gmod.get_num_outputs())]


def ort_session(model_path: Path):
    """An onnxruntime CPU session with Kiln's thread budget (:func:`num_threads`), not
    spinning, so that it does not slow down Kiln's runs next to it."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = num_threads()
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])


def mark(value: str, truth: str) -> str:
    """``value`` in green when it equals ``truth``, else in red with a cross (rich markup)."""
    return f"[green]{value}[/green]" if value == truth else f"[red]{value} ✗[/red]"
