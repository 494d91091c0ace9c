"""Run the external codegens of a partitioned model and collect their modules and constants
(TVM: ``relay.build``'s external-codegen step, src/relay/backend/te_compiler.cc ``LowerExternal
Functions``, and the constant naming of src/relay/backend/contrib/constant_transforms /
``ConstantUpdater``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.byoc.registry import get_compiler
from kiln.errors import CompileError, KilnError
from kiln.relay.graph import Constant, Function, FunctionCall, post_order
from kiln.runtime.module import Module


def external_functions(func: Function) -> list[Function]:
    """The external functions ``func`` calls (attrs ``Compiler``), in execution order."""
    return [n.body for n in post_order(func.outputs)
            if isinstance(n, FunctionCall) and "Compiler" in n.body.attrs]


def constant_names(func: Function) -> dict[str, Constant]:
    """The constants bound in external function ``func``, named ``<global_symbol>_const_<i>``
    in execution order (TVM's names): the names its module lists in ``get_const_vars`` and the
    const loader's keys."""
    symbol = func.attrs["global_symbol"]
    out: dict[str, Constant] = {}
    for n in post_order(func.outputs):
        if isinstance(n, Constant):
            out[f"{symbol}_const_{len(out)}"] = n
    return out


def build_external(func: Function) -> tuple[list[Module], dict[str, np.ndarray]]:
    """Run each compiler's codegen over its functions in ``func`` (a partitioned model).

    Returns
    -------
    (modules, constants)
        The runtime modules to import into the kernel library, and every bound constant by its
        ``constant_names`` name (the const loader keeps those a module asks for).

    Raises
    ------
    CompileError
        A codegen fails or returns something other than modules.
    """
    by_compiler: dict[str, list[Function]] = {}
    for f in external_functions(func):
        by_compiler.setdefault(str(f.attrs["Compiler"]), []).append(f)
    modules: list[Module] = []
    consts: dict[str, np.ndarray] = {}
    for name, funcs in by_compiler.items():
        reg = get_compiler(name)
        try:
            out = reg.codegen(funcs)
        except KilnError:
            raise
        except Exception as err:  # a bug in the codegen: say whose
            raise CompileError(f"external codegen {name!r} failed: {err!r}") from err
        mods: Sequence[object] = out if isinstance(out, (list, tuple)) else [out]
        for m in mods:
            if not isinstance(m, Module):
                raise CompileError(f"external codegen {name!r} returned "
                                   f"{type(m).__name__}, not a kiln.runtime.Module")
            modules.append(m)
        for f in funcs:
            consts.update({k: c.data for k, c in constant_names(f).items()})
    return modules, consts


