"""Errors a user can trigger. Every one is a :class:`KilnError`; the CLI prints one line and exits
2.

May import: nothing of kiln (the standard library only).
"""


class KilnError(Exception):
    """Base class of every error Kiln raises for bad input or a failing external tool."""


class UnsupportedOpError(KilnError):
    """An ONNX op, opset or attribute the frontend does not support (names op, node, opset)."""


class ShapeError(KilnError):
    """Shapes or dtypes that do not fit an operator or an executor input."""


class CompileError(KilnError):
    """The compiler could not lower or generate code for a function."""


class ToolchainError(KilnError):
    """An external tool (C compiler, linker) is missing or failed; the message holds its output."""


class ModuleLoadError(KilnError):
    """A compiled artifact could not be loaded: missing/corrupt blob, wrong architecture, no
    loader."""


class ScheduleError(KilnError):
    """A schedule primitive's preconditions do not hold."""
