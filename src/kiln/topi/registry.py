"""The table of compute definitions by graph-op name: ``register_compute`` / ``get_compute``.

A compute definition is ``(inputs: list[te.Tensor], attrs: dict, out_type: TensorType) ->
te.Tensor``. Each ``kiln.topi`` module registers its computes under the graph op names of
``kiln.relay.op`` ("nn.conv2d", "add", ...); :attr:`kiln.relay.op_registry.OpDef.compute`
reads them from here. The table lives in ``topi`` so that compute definitions never import the
graph IR (TVM's ``relay/op/strategy`` likewise points from relay to topi, never back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_COMPUTES: dict[str, Callable[..., Any]] = {}


def register_compute(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register the compute definition of graph op ``name``.

    Registering a name twice is a programming error (``AssertionError``); tests/unit check
    that every op with a compute is a registered graph op.

    Parameters
    ----------
    name : str
        The graph op's name in :mod:`kiln.relay.op` (``"nn.conv2d"``, ``"add"``...).

    Returns
    -------
    callable
        The decorator; it returns the compute unchanged, so it stays importable by name.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        assert name not in _COMPUTES, f"compute for {name} registered twice"
        _COMPUTES[name] = fn
        return fn

    return wrap


def get_compute(name: str) -> Callable[..., Any] | None:
    """The compute definition of graph op ``name``, or ``None`` when it has none.

    Imports every ``kiln.topi`` module first (they register on import).

    Parameters
    ----------
    name : str
        The graph op's name.

    Returns
    -------
    callable or None
        ``fn(inputs: list[te.Tensor], attrs: dict, out_type: TensorType) -> te.Tensor``.
    """
    import kiln.topi  # noqa: F401

    return _COMPUTES.get(name)
