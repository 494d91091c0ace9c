"""Helpers of the kiln serve tests: a decoder whose "cache" is the token ids themselves (so a
wrong mask, padding or position id changes its answer) and a character tokenizer with a
ChatML template for the tiny llama's 101-token vocabulary."""

from __future__ import annotations

import re

import numpy as np

from kiln.llm import Decoder

VOCAB = 101


def _next_token(seen: np.ndarray) -> int:
    """Any function of the whole visible sequence, order included."""
    weights = np.arange(1, seen.size + 1)
    return int((seen.astype(np.int64) * weights).sum() * 7 + seen.size) % VOCAB


def fake_decoder(check_positions: bool = True) -> Decoder:
    """A :class:`kiln.llm.Decoder` of one cache tensor ``[past, batch, 1, 1]`` that holds the
    token ids; logits are one-hot of :func:`_next_token` over what the mask lets each query
    see (causal, padding hidden). It checks that each position id counts the visible tokens
    before it."""

    def run(inputs):
        ids, mask, pos, past = inputs
        b, s = ids.shape
        present = np.concatenate([np.asarray(past), ids.T[:, :, None, None].astype(np.float32)])
        total = present.shape[0]
        assert mask.shape == (b, total), (mask.shape, present.shape)
        logits = np.zeros((b, s, VOCAB), np.float32)
        for row in range(b):
            for q in range(s):
                t = total - s + q
                seen = present[:t + 1, row, 0, 0][mask[row, :t + 1] == 1]
                if check_positions:
                    assert pos[row, q] == seen.size - 1, (pos[row], seen)
                logits[row, q, _next_token(seen)] = 1.0
        return [logits, present]

    return Decoder(run, ["input_ids", "attention_mask", "position_ids", "past.0"], (1, 1), "fake")


class CharTokenizer:
    """One token per printable ASCII character (ids 1..95), ``<|im_start|>`` 96,
    ``<|im_end|>`` 97 (the end of a turn: ``eos_token_id``), 0 and 98..100 unused specials."""

    SPECIAL = {"<|im_start|>": 96, "<|im_end|>": 97}
    eos_token_id = 97
    pad_token_id = 0
    vocab_size = VOCAB

    def encode(self, text: str) -> list[int]:
        out = []
        for part in re.split(r"(<\|im_start\|>|<\|im_end\|>)", text):
            if part in self.SPECIAL:
                out.append(self.SPECIAL[part])
            else:
                out += [ord(c) - 31 if 32 <= ord(c) < 127 else ord("?") - 31 for c in part]
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i + 31) for i in ids if 1 <= i <= 95)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                    "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
        return ImmutableSandboxedEnvironment().from_string(template).render(messages=messages)
