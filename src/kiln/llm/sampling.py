"""Picking the next token from logits: greedy, or sampling with temperature, top-k and top-p.

The same rules as Hugging Face ``transformers``' logits warpers (``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper``, applied in that order): top-p keeps the smallest
set of most likely tokens whose probabilities sum to at least ``top_p`` (always at least one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.errors import KilnError


@dataclass(frozen=True)
class SamplingConfig:
    """How :func:`next_tokens` picks.

    Attributes
    ----------
    do_sample : bool
        False: greedy (argmax; the lowest id wins a tie). True: sample.
    temperature : float
        Logits are divided by it before sampling (> 0).
    top_k : int
        Keep only the k most likely tokens (0: all).
    top_p : float
        Nucleus sampling threshold in (0, 1] (1: off).
    seed : int or None
        Seed of the sampler's generator (numpy PCG64): the same seed gives the same text.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise KilnError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise KilnError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise KilnError(f"top_p must be in (0, 1], got {self.top_p}")


def next_tokens(logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator) -> np.ndarray:
    """The next token of each row of ``logits`` (``[batch, vocab]`` float32) as int64
    ``[batch]``."""
    if not cfg.do_sample:
        return logits.argmax(axis=-1).astype(np.int64)
    out = np.empty(logits.shape[0], np.int64)
    for b, row in enumerate(logits.astype(np.float64) / cfg.temperature):
        probs = _filtered_probs(row, cfg.top_k, cfg.top_p)
        out[b] = rng.choice(probs.size, p=probs)
    return out


def _filtered_probs(row: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    order = np.argsort(-row, kind="stable")
    keep = order[:top_k] if top_k else order
    z = row[keep] - row[keep[0]]
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        # the smallest prefix reaching top_p (shifted cumsum: the token crossing it stays)
        cut = int(np.searchsorted(np.cumsum(p), top_p)) + 1
        keep, p = keep[:cut], p[:cut] / p[:cut].sum()
    probs = np.zeros(row.size)
    probs[keep] = p
    return probs
