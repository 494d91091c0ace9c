"""Autoregressive generation with a key/value cache: prefill the prompts, then one token per
step until a stop token or ``max_new_tokens``.

Batches are left-padded (Hugging Face's convention for decoder-only models): row ``b``'s
prompt sits at the right end, ``attention_mask`` is 0 over its padding and the position ids
count only real tokens (``cumsum(mask) - 1``), so every row computes what it would alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.errors import KilnError
from kiln.llm.decoder import Decoder
from kiln.llm.sampling import SamplingConfig, next_tokens


@dataclass
class Generation:
    """The result of :func:`generate`.

    Attributes
    ----------
    tokens : list of list of int
        The new tokens of each row (a stop token that ended a row is not included).
    finish_reasons : list of str
        ``"stop"`` (a stop token) or ``"length"`` (``max_new_tokens``) per row.
    prefill_s : float
        Seconds of the prompt step (which also yields the first new token).
    decode_s : float
        Seconds of all later steps.
    decode_steps : int
        Number of later steps (one token per unfinished row each).
    """

    tokens: list[list[int]]
    finish_reasons: list[str]
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    step_s: list[float] = field(default_factory=list)

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode steps per second (tokens per second per row)."""
        return self.decode_steps / self.decode_s if self.decode_s > 0 else float("nan")


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``input_ids``, ``attention_mask`` and ``position_ids`` (int64 ``[batch, longest]``) of
    left-padded prompts.

    Raises
    ------
    KilnError
        If there are no prompts or a prompt is empty.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise KilnError("generate needs at least one prompt, each with at least one token")
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_token_id, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = p
        mask[b, width - len(p):] = 1
    return ids, mask, np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def generate(decoder: Decoder, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32,
             sampling: SamplingConfig | None = None, stop_token_ids: Sequence[int] = (),
             pad_token_id: int = 0, use_cache: bool = True,
             on_token: Callable[[int, int], None] | None = None) -> Generation:
    """Generate up to ``max_new_tokens`` tokens after each prompt.

    Parameters
    ----------
    decoder : Decoder
        Kiln's (:func:`kiln.llm.kiln_decoder`) or onnxruntime's (:func:`kiln.llm.ort_decoder`).
    prompts : list of list of int
        Token ids; several prompts run as one left-padded batch.
    max_new_tokens : int
    sampling : SamplingConfig, optional
        Greedy by default. Its repetition penalty counts each row's prompt and new tokens.
    stop_token_ids : list of int
        A row ends at the first of these it produces.
    pad_token_id : int
        Fills the left padding and the steps of rows that have ended.
    use_cache : bool
        False recomputes the whole sequence every step (no cache): the reference that cached
        decoding must match.
    on_token : callable, optional
        ``on_token(row, token_id)`` for every new token as soon as it is picked (streaming).

    Raises
    ------
    KilnError
        For empty prompts or ``max_new_tokens < 1``.
    """
    if max_new_tokens < 1:
        raise KilnError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    sampling = sampling or SamplingConfig()
    rng = np.random.default_rng(sampling.seed)
    stops = set(stop_token_ids)
    ids, mask, pos = left_pad(prompts, pad_token_id)
    batch = len(prompts)
    out = Generation([[] for _ in range(batch)], ["length"] * batch)
    done = np.zeros(batch, bool)
    past = decoder.empty_cache(batch)
    step_in = (ids, mask, pos)
    # each row's tokens so far, for the repetition penalty (the prompt counts, as in HF)
    context = [list(p) for p in prompts] if sampling.repetition_penalty != 1.0 else None
    for step in range(max_new_tokens):
        start = time.perf_counter()
        logits, present = decoder(*step_in, past if use_cache else decoder.empty_cache(batch))
        token = next_tokens(logits[:, -1], sampling, rng, context)
        out.step_s.append(time.perf_counter() - start)
        for b in np.flatnonzero(~done):
            t = int(token[b])
            if t in stops:
                done[b] = True
                out.finish_reasons[b] = "stop"
                continue
            out.tokens[b].append(t)
            if context is not None:
                context[b].append(t)
            if on_token is not None:
                on_token(int(b), t)
        if done.all() or step == max_new_tokens - 1:
            break
        token = np.where(done, pad_token_id, token)[:, None]
        mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
        if use_cache:
            past = present
            step_in = (token, mask, pos[:, -1:] + 1)
            pos = step_in[2]
        else:
            ids = np.concatenate([ids, token], axis=1)
            pos = np.concatenate([pos, pos[:, -1:] + 1], axis=1)
            step_in = (ids, mask, pos)
    out.prefill_s = out.step_s[0]
    out.decode_s = float(sum(out.step_s[1:]))
    out.decode_steps = len(out.step_s) - 1
    return out


class TextStreamer:
    """``on_token`` for one row that writes the decoded text as it grows (holding back an
    incomplete UTF-8 character, which the tokenizer decodes as U+FFFD).

    Parameters
    ----------
    decode : callable
        ``decode(ids) -> str`` (e.g. ``ChatTokenizer.decode``).
    write : callable
        Receives each new piece of text (e.g. ``sys.stdout.write`` plus a flush).
    """

    def __init__(self, decode: Callable[[list[int]], str], write: Callable[[str], object]):
        self._decode = decode
        self._write = write
        self._ids: list[int] = []
        self._shown = 0

    def __call__(self, row: int, token_id: int) -> None:
        self._ids.append(token_id)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return
        self._write(text[self._shown:])
        self._shown = len(text)
