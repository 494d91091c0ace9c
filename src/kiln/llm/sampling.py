"""Picking the next token from logits: greedy, or sampling with temperature, top-k and top-p,
after a repetition penalty.

The same rules as Hugging Face ``transformers``' logits processors and warpers, applied in its
order: ``RepetitionPenaltyLogitsProcessor`` (CTRL, Keskar et al. 2019, arXiv:1909.05858 §4.1:
the logit of every token already in the context is divided by the penalty when positive and
multiplied by it when negative, so it becomes less likely either way), then
``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper``: top-p keeps the
smallest set of most likely tokens whose probabilities sum to at least ``top_p`` (always at
least one). The penalty applies to greedy decoding too, as in ``transformers``.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    repetition_penalty : float
        CTRL's penalty (> 0; 1: off) on the tokens already in the context (prompt and
        generated tokens): their positive logits are divided by it, negative ones multiplied.

    Raises
    ------
    KilnError
        A setting out of its range.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise KilnError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise KilnError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise KilnError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise KilnError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


def apply_repetition_penalty(logits: np.ndarray, context: Sequence[int],
                             penalty: float) -> np.ndarray:
    """A copy of one row of ``logits`` (``[vocab]``) with CTRL's repetition penalty on the
    token ids of ``context`` (each id once, however often it occurs): a positive logit is
    divided by ``penalty``, a negative one multiplied (``transformers``'
    ``RepetitionPenaltyLogitsProcessor``)."""
    out = np.array(logits, copy=True)
    ids = np.unique(np.asarray(context, np.int64))
    if ids.size and penalty != 1.0:
        seen = out[ids]
        out[ids] = np.where(seen < 0, seen * penalty, seen / penalty)
    return out


def token_probs(logits: np.ndarray, cfg: SamplingConfig,
                context: Sequence[int] = ()) -> np.ndarray:
    """The distribution :func:`next_tokens` samples one row from: ``logits`` (``[vocab]``)
    after the repetition penalty over ``context``, the temperature, top-k and top-p, as
    float64 probabilities summing to 1 (zero outside the kept tokens)."""
    row = apply_repetition_penalty(logits.astype(np.float64), context, cfg.repetition_penalty)
    return _filtered_probs(row / cfg.temperature, cfg.top_k, cfg.top_p)


def next_tokens(logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator,
                context: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """The next token of each row of ``logits`` (``[batch, vocab]`` float32) as int64
    ``[batch]``.

    ``context`` holds each row's token ids so far (prompt and generated, no padding) for the
    repetition penalty; without it there is none."""
    rows = [()] * logits.shape[0] if context is None else context
    penalize = cfg.repetition_penalty != 1.0 and context is not None
    if not cfg.do_sample:
        if penalize:
            logits = np.stack([apply_repetition_penalty(row, ids, cfg.repetition_penalty)
                               for row, ids in zip(logits, rows, strict=True)])
        return logits.argmax(axis=-1).astype(np.int64)
    out = np.empty(logits.shape[0], np.int64)
    for b, (row, ids) in enumerate(zip(logits, rows, strict=True)):
        probs = token_probs(row, cfg, ids if penalize else ())
        # the draw of rng.choice(vocab, p=probs) (its cdf, searched for one uniform), over the
        # kept ids only: the zeros add nothing to the cdf
        kept = np.flatnonzero(probs)
        out[b] = kept[rng.choice(kept.size, p=probs[kept])]
    return out


#: the tokens a top-p cut looks at first, doubled until their mass reaches top_p (the kept
#: tokens are usually far fewer than a vocabulary: sorting SmolLM2's 49152 took ~3 ms a token)
TOP_P_CANDIDATES = 256


def _largest(row: np.ndarray, k: int) -> np.ndarray:
    """The ids of ``row``'s ``k`` largest entries, and of any entry equal to the smallest of
    them, largest first, ties by ascending id: a prefix of ``np.argsort(-row, kind="stable")``
    (``np.partition`` finds the threshold in linear time)."""
    if k >= row.size:
        return np.argsort(-row, kind="stable")
    threshold = np.partition(row, row.size - k)[row.size - k]
    ids = np.flatnonzero(row >= threshold)
    return ids[np.argsort(-row[ids], kind="stable")]


def _top_p_candidates(row: np.ndarray, e: np.ndarray, total: float, top_p: float) -> np.ndarray:
    """``row``'s largest ids (:func:`_largest`: TOP_P_CANDIDATES of them, doubled until their
    probabilities ``e / total`` add up to ``top_p``), or all of them: a prefix of the sorted
    vocabulary that holds the top-p cut."""
    n = TOP_P_CANDIDATES
    while True:
        ids = _largest(row, n)
        if ids.size >= row.size or np.cumsum(e[ids] / total)[-1] >= top_p:
            return ids
        n *= 2


def _filtered_probs(row: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    e = np.exp(row - row.max())
    if top_k:
        keep = _largest(row, top_k)[:top_k]
        total = e[keep].sum()
    elif top_p >= 1.0:
        return e / e.sum()
    else:
        total = e.sum()
        keep = _top_p_candidates(row, e, total, top_p)
    p = e[keep] / total
    if top_p < 1.0:
        # the smallest prefix reaching top_p (shifted cumsum: the token crossing it stays)
        cut = int(np.searchsorted(np.cumsum(p), top_p)) + 1
        keep, p = keep[:cut], p[:cut] / p[:cut].sum()
    probs = np.zeros(row.size)
    probs[keep] = p
    return probs
