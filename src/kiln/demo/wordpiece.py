"""BERT's uncased WordPiece tokenizer over a ``vocab.txt``, for the sentence-embedding demo.

The algorithm of BERT's reference tokenizer (Devlin et al. 2019, google-research/bert
``tokenization.py``: ``BasicTokenizer`` then ``WordpieceTokenizer``), written from its
description:

1. clean: drop NUL, U+FFFD and control characters; every whitespace character becomes a space;
2. put spaces around CJK ideographs (each is a word of its own);
3. split on whitespace; lowercase each word and strip accents (NFD, drop combining marks);
4. split each word before and after every punctuation character (ASCII symbols and Unicode
   category P*);
5. WordPiece: greedy longest-match-first over the vocabulary, pieces after the first prefixed
   ``##``; a word with an unmatchable rest, or longer than 100 characters, is ``[UNK]``.

:meth:`WordPiece.encode` adds ``[CLS]`` and ``[SEP]`` and pads with ``[PAD]`` to a fixed length,
with the attention mask marking the real tokens.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np

from kiln.errors import KilnError

MAX_WORD_CHARS = 100
_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


def _is_control(ch: str) -> bool:
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True  # ASCII symbols such as $ ^ ` count as punctuation, as in BERT
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    """CJK Unified Ideographs blocks (not Hangul or kana, which are written with spaces)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokens(text: str) -> list[str]:
    """Steps 1-4: the lowercased, accent-free words and punctuation marks of ``text``."""
    chars = []
    for ch in text:
        if ch in ("\0", "\ufffd") or _is_control(ch):
            continue
        if ch.isspace():
            chars.append(" ")
        elif _is_cjk(ord(ch)):
            chars.append(f" {ch} ")
        else:
            chars.append(ch)
    out: list[str] = []
    for word in "".join(chars).split():
        word = "".join(c for c in unicodedata.normalize("NFD", word.lower())
                       if unicodedata.category(c) != "Mn")
        current = ""
        for ch in word:
            if _is_punctuation(ch):
                if current:
                    out.append(current)
                out.append(ch)
                current = ""
            else:
                current += ch
        if current:
            out.append(current)
    return out


class WordPiece:
    """A WordPiece vocabulary and tokenizer.

    Parameters
    ----------
    vocab_path : str or Path
        ``vocab.txt``: one token per line, the line number (from 0) being its id; must hold
        ``[PAD]``, ``[UNK]``, ``[CLS]`` and ``[SEP]``.

    Raises
    ------
    KilnError
        If the file cannot be read or lacks a special token.
    """

    def __init__(self, vocab_path: str | Path):
        try:
            lines = Path(vocab_path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise KilnError(f"cannot read vocabulary {vocab_path}: {err}") from None
        self.vocab = {token: i for i, token in enumerate(lines)}
        missing = [t for t in _SPECIAL if t not in self.vocab]
        if missing:
            raise KilnError(f"vocabulary {vocab_path} lacks {', '.join(missing)}")

    def word_pieces(self, word: str) -> list[str]:
        """Step 5 for one word: its pieces, or ``["[UNK]"]``."""
        if len(word) > MAX_WORD_CHARS:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text`` (no special tokens)."""
        return [p for word in basic_tokens(text) for p in self.word_pieces(word)]

    def encode(self, text: str, length: int) -> tuple[np.ndarray, np.ndarray]:
        """``[CLS] tokens [SEP]`` as ids, truncated or padded with ``[PAD]`` to ``length``.

        Returns
        -------
        input_ids, attention_mask : numpy.ndarray
            int64, shape ``(length,)``; the mask is 1 on real tokens (with CLS and SEP), 0 on
            padding.
        """
        if length < 2:
            raise KilnError(f"sequence length {length} leaves no room for [CLS] and [SEP]")
        tokens = ["[CLS]", *self.tokenize(text)[: length - 2], "[SEP]"]
        ids = np.full(length, self.vocab["[PAD]"], dtype=np.int64)
        ids[: len(tokens)] = [self.vocab[t] for t in tokens]
        mask = np.zeros(length, dtype=np.int64)
        mask[: len(tokens)] = 1
        return ids, mask
