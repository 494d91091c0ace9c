"""Argument types shared by the ``kiln`` commands (argparse ``type=`` functions): a shape
``NAME:D0xD1...``, BYOC compiler names, positive integers. Each raises
``argparse.ArgumentTypeError``, which argparse reports with the usage (exit status 2).
"""

from __future__ import annotations

import argparse
import re

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: a dim written as a sum or product of symbols and ints (``past+sequence``)
_DIM_EXPR = re.compile(r"[A-Za-z0-9_+\-*() ]*[+\-*][A-Za-z0-9_+\-*() ]*")


def parse_input_shape(text: str) -> tuple[str, tuple[int | str, ...]]:
    """Parse ``NAME:D0xD1x...`` into ``(NAME, (D0, D1, ...))``.

    The split is at the last colon, so names holding a colon (``input:0``) work. A scalar
    input is written with an empty shape (``NAME:``). A dim may be a symbol's name instead of
    a size (``state:2xbatchx128``: ``kiln compile`` gives that dim the symbol ``batch``, so
    that unnamed dims of several inputs become one variable), or a sum or product of symbols
    and ints (``attention_mask:batchxpast+sequence``: a decoder's mask spans the past and the
    new tokens; checked at run time); dims holding an ``x`` are written with commas
    (``ids:1,max_len``).

    Parameters
    ----------
    text : str
        The ``--input-shape`` argument.

    Returns
    -------
    tuple
        ``(name, shape)`` with a non-empty name; each dim a positive int or a symbol name.

    Raises
    ------
    argparse.ArgumentTypeError
        If there is no colon, the name is empty or a dimension is neither a positive integer
        nor a name.
    """
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(
            f"expected NAME:SHAPE such as data:1x3x224x224, got {text!r}")
    if not dims:
        return name, ()
    shape: list[int | str] = []
    for d in dims.split(",") if "," in dims else re.split("[xX]", dims):
        if d.isdigit() and int(d) > 0:
            shape.append(int(d))
        elif (_SYMBOL.fullmatch(d) and not d.isdigit()) or (
                _DIM_EXPR.fullmatch(d) and re.search("[A-Za-z_]", d)):
            shape.append(d)
        else:
            raise argparse.ArgumentTypeError(
                f"bad dimension {d!r} in {text!r}: dimensions are positive integers, symbol "
                "names or sums of them (past+sequence), joined by 'x' (or by ',')")
    return name, tuple(shape)


def byoc_names(text: str) -> list[str]:
    """``--byoc``: one or more comma-separated compiler names (checked by the build)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a compiler name, e.g. cblas")
    return names


def positive_int(text: str) -> int:
    """A positive ``int`` (``--repeat``, ``--runs``, ``--trials``...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
