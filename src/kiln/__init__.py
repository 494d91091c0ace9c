"""Kiln: a hackable ahead-of-time deep-learning compiler (ONNX → one self-contained shared library).

The deploy API follows Apache TVM's classic stack::

    mod, params = kiln.frontend.from_onnx(onnx.load("model.onnx"))
    lib = kiln.build(mod, target="c", params=params)        # GraphExecutorFactoryModule
    lib.export_library("model.so")
    loaded = kiln.runtime.load_module("model.so")
    gmod = kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))

Layering (docs/design.md §2): ``kiln.runtime`` never imports the compiler packages.

May import: anything in kiln (the facade: lazy attributes only).
"""

from kiln.errors import (  # noqa: F401
    CompileError,
    KilnError,
    ModuleLoadError,
    ShapeError,
    ToolchainError,
    UnsupportedOpError,
)

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy submodules keep `import kiln` cheap and keep kiln.runtime free of compiler imports.
    import importlib

    if name in ("frontend", "runtime", "graph_executor", "debug_executor", "vm", "relay", "tir",
                "topi", "arith", "driver", "codegen", "target", "schedules", "byoc", "llm",
                "models"):
        return importlib.import_module(f"kiln.{name}")
    if name == "build":
        from kiln.driver.build_module import build

        return build
    if name == "generate":
        from kiln.llm import generate

        return generate
    if name == "cpu":
        from kiln.runtime import cpu

        return cpu
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
