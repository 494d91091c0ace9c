"""Symbolic dims for ``kiln compile``: ``--dim`` parsing, and resolving ``--input-shape`` and
``--dim`` against the symbols of an ONNX model's inputs before it is imported.

An input dim is fixed (``dim_value`` > 0) or a symbol: its ``dim_param``, or, for a dim with
neither, ``<input>_dim<k>`` (the names :func:`kiln.frontend.from_onnx` gives them). One symbol
is one variable across all inputs, so ``--input-shape input_ids:1x77`` also fixes the
``batch_size`` and ``sequence_length`` of ``attention_mask``: :func:`resolve_symbols` collects
the values that ``--input-shape`` and ``--dim NAME=N`` give to symbols, and :func:`fix_symbols`
writes them into the model's inputs, so the importer sees those dims as fixed and the others
stay symbolic (bounded by ``--dim NAME=LO..HI[:DIV]``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.importer import dim_symbol

#: a symbol's bounds as ``from_onnx(dim_bounds=...)`` takes them: (lo, hi or None, divisor)
Bound = tuple[int, int | None, int]


@dataclass(frozen=True)
class DimSpec:
    """One ``--dim`` argument: a symbol fixed to ``value``, or bounded by ``lo``..``hi``.

    Attributes
    ----------
    name : str
        The symbol (an ONNX ``dim_param``).
    value : int or None
        ``NAME=N``: the symbol is fixed to N (the dim is static).
    lo, hi, divisor : int, int or None, int
        ``NAME=LO..HI[:DIV]``: inclusive bounds (``hi`` None: unbounded) and divisibility.
    """

    name: str
    value: int | None = None
    lo: int = 1
    hi: int | None = None
    divisor: int = 1

    @property
    def bound(self) -> Bound:
        return (self.lo, self.hi, self.divisor)

    @property
    def text(self) -> str:
        """The argument back in ``--dim`` syntax (``seq=8..512:8``, ``batch=1``)."""
        if self.value is not None:
            return f"{self.name}={self.value}"
        hi = "" if self.hi is None else str(self.hi)
        div = f":{self.divisor}" if self.divisor != 1 else ""
        return f"{self.name}={self.lo}..{hi}{div}"


def _dim_int(text: str, what: str, arg: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(
            f"bad {what} {text!r} in --dim {arg!r}: expected a non-negative integer")
    return int(text)


def parse_dim(text: str) -> DimSpec:
    """Parse ``--dim``: ``NAME=LO..HI``, ``NAME=LO..HI:DIV``, ``NAME=LO..`` (no upper bound)
    or ``NAME=N`` (fix the symbol to N).

    The split is at the last ``=``. ``LO`` may be left out (``NAME=..512``: 1).

    Parameters
    ----------
    text : str
        The ``--dim`` argument, e.g. ``sequence_length=1..512`` or ``seq=8..512:8``.

    Returns
    -------
    DimSpec

    Raises
    ------
    argparse.ArgumentTypeError
        No ``=`` or an empty name, a bound that is not a non-negative integer, ``LO > HI``, a
        divisor below 1, a fixed value below 1.
    """
    name, sep, spec = text.rpartition("=")
    if not sep or not name or not spec:
        raise argparse.ArgumentTypeError(
            f"expected NAME=LO..HI[:DIV] or NAME=N such as sequence_length=1..512, got {text!r}")
    if ".." not in spec:
        value = _dim_int(spec, "value", text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"--dim {text!r}: a fixed dim must be at least 1")
        return DimSpec(name, value=value)
    rng, colon, div_text = spec.partition(":")
    lo_text, _, hi_text = rng.partition("..")
    lo = _dim_int(lo_text, "lower bound", text) if lo_text else 1
    hi = _dim_int(hi_text, "upper bound", text) if hi_text else None
    divisor = _dim_int(div_text, "divisor", text) if colon else 1
    if hi is not None and hi < lo:
        raise argparse.ArgumentTypeError(f"--dim {text!r}: upper bound {hi} is below the "
                                         f"lower bound {lo}")
    if divisor < 1:
        raise argparse.ArgumentTypeError(f"--dim {text!r}: the divisor must be at least 1")
    return DimSpec(name, lo=lo, hi=hi, divisor=divisor)


def input_dims(model) -> dict[str, list[int | str]]:
    """The model inputs' dims: an int where fixed, the symbol's name where symbolic.

    Parameters
    ----------
    model : onnx.ModelProto

    Returns
    -------
    dict
        ``{input name: [dim, ...]}`` for the graph inputs that are not initializers and have a
        known rank.
    """
    return {vi.name: [d.dim_value if _is_fixed(d) else _symbol_name(vi, k, d)
                      for k, d in enumerate(vi.type.tensor_type.shape.dim)]
            for vi in _shaped_inputs(model)}


def _shaped_inputs(model):
    """The graph inputs that are not initializers and have a known rank."""
    weights = {init.name for init in model.graph.initializer}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        if vi.name not in weights and vi.type.HasField("tensor_type") and tt.HasField("shape"):
            yield vi


def _is_fixed(d) -> bool:
    return d.HasField("dim_value") and d.dim_value > 0


def _symbol_name(vi, k: int, d) -> str:
    """The symbol of dim ``k`` of input ``vi``, as :func:`kiln.frontend.from_onnx` names it
    (:func:`kiln.frontend.onnx.importer.dim_symbol`: anonymous dims are fresh symbols)."""
    return dim_symbol(vi.name, k, d.dim_param)


def _symbol_values(dims: dict[str, list[int | str]], shapes: dict[str, tuple[int, ...]]
                   ) -> dict[str, tuple[int, str]]:
    """``{symbol: (value, where)}`` from the ``--input-shape``s; a symbol given two values is a
    ShapeError naming both inputs and dims. Unknown inputs and wrong ranks are left to the
    importer (it names them)."""
    values: dict[str, tuple[int, str]] = {}
    for name, shape in shapes.items():
        if name not in dims or len(dims[name]) != len(shape):
            continue
        for k, (d, v) in enumerate(zip(dims[name], shape)):
            if isinstance(d, int) or isinstance(v, str):
                continue
            where = f"--input-shape {name}:{'x'.join(map(str, shape))} (dim {k})"
            if d in values and values[d][0] != v:
                raise ShapeError(f"symbol {d} is {values[d][0]} by {values[d][1]} but {v} by "
                                 f"{where}")
            values.setdefault(d, (v, where))
    return values


def _check_in_bound(spec: DimSpec, value: int, where: str) -> None:
    if value < spec.lo or (spec.hi is not None and value > spec.hi) or value % spec.divisor:
        raise ShapeError(f"symbol {spec.name} is {value} by {where}, outside --dim "
                         f"{spec.text}")


def resolve_symbols(dims: dict[str, list[int | str]], shapes: dict[str, tuple[int, ...]],
                    specs: list[DimSpec]) -> tuple[dict[str, int], dict[str, Bound]]:
    """Split the model's symbols into fixed ones (with values) and bounded ones.

    Parameters
    ----------
    dims : dict
        :func:`input_dims` of the model.
    shapes : dict
        ``--input-shape`` by input name.
    specs : list of DimSpec
        ``--dim`` arguments.

    Returns
    -------
    fixed : dict
        ``{symbol: value}`` fixed by ``--input-shape`` or ``--dim NAME=N``.
    bounds : dict
        ``{symbol: (lo, hi, divisor)}`` of ``--dim`` ranges for symbols that stay symbolic.

    Raises
    ------
    KilnError
        ``--dim`` naming a symbol the model's inputs do not have (the message lists theirs), or
        the same symbol twice.
    ShapeError
        A symbol given two different values, or a value outside its ``--dim`` range.
    """
    known = sorted({d for ds in dims.values() for d in ds if isinstance(d, str)})
    seen: set[str] = set()
    for spec in specs:
        if spec.name not in known:
            raise KilnError(f"--dim {spec.name}: the model has no symbolic dim {spec.name!r}; "
                            f"its inputs' symbolic dims are {', '.join(known) or 'none'}")
        if spec.name in seen:
            raise KilnError(f"--dim given twice for symbol {spec.name}")
        seen.add(spec.name)
    values = _symbol_values(dims, shapes)
    for spec in specs:
        if spec.value is None:
            continue
        if spec.name in values and values[spec.name][0] != spec.value:
            value, where = values[spec.name]
            raise ShapeError(f"symbol {spec.name} is {value} by {where} but {spec.value} by "
                             f"--dim {spec.name}={spec.value}")
        values[spec.name] = (spec.value, f"--dim {spec.name}={spec.value}")
    bounds: dict[str, Bound] = {}
    for spec in specs:
        if spec.value is not None:
            continue
        if spec.name in values:
            _check_in_bound(spec, *values[spec.name])
        else:
            bounds[spec.name] = spec.bound
    return {name: v for name, (v, _) in values.items()}, bounds


def name_symbols(model, shapes: dict[str, tuple[int | str, ...]]) -> None:
    """Give the input dims that ``--input-shape`` names (``state:2xbatchx128``) those symbols
    in the model (in place: their ``dim_param``), so that unnamed dims of several inputs become
    one variable that ``--dim`` can bound.

    Raises
    ------
    ShapeError
        A name given to a dim the model fixes, or a shape of the wrong rank.
    """
    shaped = {vi.name for vi in _shaped_inputs(model)}
    for vi in model.graph.input:
        given = shapes.get(vi.name)
        if given is None or not any(isinstance(d, str) for d in given):
            continue
        dims = vi.type.tensor_type.shape.dim if vi.name in shaped else []
        if len(dims) != len(given):
            raise ShapeError(f"--input-shape {vi.name}: {len(given)} dims for an input of rank "
                             f"{len(dims)}")
        for k, (d, g) in enumerate(zip(dims, given)):
            if not isinstance(g, str):
                continue
            if _is_fixed(d):
                raise ShapeError(f"--input-shape {vi.name}: dim {k} is {d.dim_value} in the "
                                 f"model, it cannot be symbol {g!r}")
            d.dim_param = g


def fix_symbols(model, fixed: dict[str, int]) -> None:
    """Write ``fixed`` symbol values into the model's input dims (in place), so the importer
    sees them as static; other dims stay as they are.

    Parameters
    ----------
    model : onnx.ModelProto
    fixed : dict
        ``{symbol: value}`` (:func:`resolve_symbols`).
    """
    for vi in _shaped_inputs(model):
        for k, d in enumerate(vi.type.tensor_type.shape.dim):
            if not _is_fixed(d) and _symbol_name(vi, k, d) in fixed:
                d.dim_value = fixed[_symbol_name(vi, k, d)]  # clears dim_param (a oneof)


def describe_bound(name: str, bound: Bound | None) -> str:
    """``sequence_length in [1, 512]`` (and ``divisible by d``), as the VM's symbols print."""
    lo, hi, div = bound if bound is not None else (1, None, 1)
    text = f"{name} in [{lo}, {'inf' if hi is None else hi}]"
    return text + (f" divisible by {div}" if div != 1 else "")


def symbolic_inputs(dims: dict[str, list[int | str]], fixed: dict[str, int]) -> list[str]:
    """The inputs that keep symbolic dims once ``fixed`` is applied, as
    ``"input_ids[batch_size, sequence_length]"`` (fixed symbols shown as their values).

    Parameters
    ----------
    dims : dict
        :func:`input_dims` of the model.
    fixed : dict
        ``{symbol: value}`` (:func:`resolve_symbols`).
    """
    out = []
    for name, ds in dims.items():
        shown = [fixed.get(d, d) if isinstance(d, str) else d for d in ds]
        if any(isinstance(d, str) for d in shown):
            out.append(f"{name}[{', '.join(map(str, shown))}]")
    return out
