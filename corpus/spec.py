"""The corpus entry types: a model, its inputs with symbolic dims, the shapes it runs at."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Input:
    """One graph input.

    Attributes
    ----------
    name : str
        The ONNX input name (the export names it so; a wheel model's file has it).
    dims : tuple of int or str
        Its shape; a str is a symbol (the ONNX ``dim_param``), shared by every input using it.
    dtype : str
        numpy dtype name (``float32``, ``int64``...).
    high : int or None
        Integer inputs: values are drawn from ``[0, high)`` (token ids below the vocabulary);
        None for an integer input means all ``fill`` (an attention mask, a sample rate).
    fill : int
        The value of an integer input without ``high``.
    """

    name: str
    dims: tuple[int | str, ...]
    dtype: str = "float32"
    high: int | None = None
    fill: int = 1

    def shape(self, symbols: dict[str, int]) -> tuple[int, ...]:
        """The concrete shape with ``symbols`` substituted (KeyError names a missing one)."""
        return tuple(symbols[d] if isinstance(d, str) else d for d in self.dims)


@dataclass(frozen=True)
class Model:
    """One corpus model.

    Attributes
    ----------
    name : str
        Unique name (a row of corpus/results/results.md).
    source : str
        ``torchvision``, ``transformers`` or ``wheel``.
    inputs : tuple of Input
    shapes : tuple of dict
        2-3 symbol assignments the symbolic build runs at (and onnxruntime with it); the last
        is the export's example input.
    fixed : dict
        The symbol assignment of the static build (``--input-shape`` of every input).
    builder : callable or None
        torch models: returns the ``torch.nn.Module`` in eval mode whose ``forward`` takes the
        inputs positionally in order and returns a tensor or a tuple of tensors. Its source
        (``inspect.getsource``) is part of the export's cache key.
    exporter : str
        ``legacy`` (TorchScript, ``dynamo=False``) or ``dynamo`` (``torch.export``).
    opset : int
    wheel : str or None
        Wheel models: the key of ``corpus.wheels.WHEELS``.
    note : str
        What the model is, for the table.
    """

    name: str
    source: str
    inputs: tuple[Input, ...]
    shapes: tuple[dict[str, int], ...]
    fixed: dict[str, int]
    builder: Callable | None = None
    exporter: str = "legacy"
    opset: int = 17
    wheel: str | None = None
    note: str = ""
    tags: tuple[str, ...] = field(default=())


def make_inputs(model: Model, symbols: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of ``model`` at ``symbols``: floats ~ N(0, 1), ids in ``[0, high)``,
    masks of ones."""
    rng = np.random.default_rng(seed)
    feed = {}
    for inp in model.inputs:
        shape = inp.shape(symbols)
        if np.issubdtype(np.dtype(inp.dtype), np.integer):
            arr = (np.full(shape, inp.fill) if inp.high is None
                   else rng.integers(0, inp.high, shape))
        else:
            arr = rng.standard_normal(shape)
        feed[inp.name] = np.ascontiguousarray(arr.astype(inp.dtype))
    return feed
