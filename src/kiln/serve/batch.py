"""The running batch's key/value cache: one row per sequence, right-aligned.

The decoder takes one past length for the whole batch (cache tensors ``[past, batch, G, D]``,
``attention_mask`` ``[batch, past + sequence]``). Sequences of different lengths share it the
way :func:`kiln.llm.left_pad` shares a prompt batch: row ``b``'s ``lengths[b]`` real entries
are the last ones of the past axis, the columns before them are padding that its mask hides,
and its position ids count only its real tokens. A joining row is padded on the left (or the
others are, when it is the longest); a leaving row is cut out, and the padding columns no row
needs any more are trimmed, so the past is always as long as the longest row.

Between joins and leaves the cache is the decoder's own ``present`` passed back as is, so the
VM appends in place (decision 019); a join or a leave copies the cache once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class KVBatch:
    """The shared cache of the rows being decoded.

    Parameters
    ----------
    num_tensors : int
        Cache tensors of the decoder (two per layer).
    kv_shape : tuple of int
        ``(G, D)``: key/value heads and head dim.

    Attributes
    ----------
    cache : list
        ``[width, batch, G, D]`` float32 per tensor (numpy arrays or the engine's own).
    lengths : list of int
        Real (unpadded) cache entries of each row.
    """

    def __init__(self, num_tensors: int, kv_shape: tuple[int, int]):
        self.kv_shape = kv_shape
        self.cache: list[Any] = [np.zeros((0, 0, *kv_shape), np.float32)
                                 for _ in range(num_tensors)]
        self.lengths: list[int] = []

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return max(self.lengths, default=0)

    def add(self, row_cache: Sequence[Any]) -> int:
        """Append one row (its cache ``[length, 1, G, D]`` per tensor, e.g. a lone prefill's
        present); returns its index."""
        rows = [np.asarray(t) for t in row_cache]
        length = rows[0].shape[0]
        width = max(self.width, length)
        self.cache = [np.concatenate([_pad_left(np.asarray(c), width),
                                      _pad_left(r, width)], axis=1)
                      for c, r in zip(self.cache, rows, strict=True)]
        self.lengths.append(length)
        return self.size - 1

    def remove(self, indices: Sequence[int]) -> None:
        """Drop the rows at ``indices`` and the padding columns no remaining row needs."""
        drop = set(indices)
        keep = [b for b in range(self.size) if b not in drop]
        old = self.width
        self.lengths = [self.lengths[b] for b in keep]
        start = old - self.width
        self.cache = [np.ascontiguousarray(np.asarray(c)[start:, keep]) for c in self.cache]

    def step_inputs(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``input_ids`` ``[batch, 1]``, ``attention_mask`` ``[batch, width + 1]`` and
        ``position_ids`` ``[batch, 1]`` (int64) of one decode step feeding ``tokens``."""
        width = self.width + 1
        mask = np.zeros((self.size, width), np.int64)
        for b, n in enumerate(self.lengths):
            mask[b, width - n - 1:] = 1
        ids = np.asarray(tokens, np.int64).reshape(self.size, 1)
        return ids, mask, np.asarray(self.lengths, np.int64).reshape(self.size, 1)

    def advance(self, present: Sequence[Any]) -> None:
        """Take the decoder's ``present`` after a step: every row is one entry longer."""
        self.cache = list(present)
        self.lengths = [n + 1 for n in self.lengths]


def _pad_left(t: np.ndarray, width: int) -> np.ndarray:
    if t.shape[0] == width:
        return t
    pad = np.zeros((width - t.shape[0], *t.shape[1:]), t.dtype)
    return np.concatenate([pad, t], axis=0)
