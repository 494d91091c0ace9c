"""The tokenizer and chat template stored in a GGUF file, as a ``tokenizers`` BPE tokenizer.

GGUF keeps a byte-level BPE vocabulary (``tokenizer.ggml.model == "gpt2"``) as the token
strings, their types (3 = control, i.e. special) and the merge list, plus the model's Jinja chat
template (``tokenizer.chat_template``). :class:`ChatTokenizer` rebuilds the tokenizer with Hugging
Face's ``tokenizers`` library (not a BPE of our own) and renders the template with Jinja2 in a
sandbox, as ``transformers``' ``apply_chat_template`` does.

The pre-tokenizer follows llama.cpp's ``smollm`` / ``gpt2`` pre-types (``llama-vocab.cpp``):
``smollm`` splits every digit on its own before the GPT-2 byte-level split.

Reading the vocabulary and merges out of a GGUF takes seconds (``gguf.GGUFReader`` parses every
array element; SmolLM2's 49 152 tokens and 48 900 merges: ~5 s of CPU), rebuilding the
tokenizer from its ``tokenizers`` JSON ~0.2 s: :func:`cached_chat_tokenizer` keeps that JSON
(:meth:`ChatTokenizer.to_json`) in a file the caller names by the GGUF's content.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from kiln.errors import KilnError
from kiln.models.fetch import _write_atomic
from kiln.models.gguf_llama import _field, _gguf

log = logging.getLogger("kiln")

_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
_PRE_TYPES = ("gpt2", "smollm")
#: layout of :meth:`ChatTokenizer.to_json` (another layout reads as a cache miss)
JSON_FORMAT = 1


class ChatTokenizer:
    """Encode, decode and format chats for a GGUF model.

    Attributes
    ----------
    tokenizer : tokenizers.Tokenizer
    eos_token_id : int
        The end-of-sequence (end-of-turn for chat models) token.
    pad_token_id : int
    special_ids : set of int
        Control tokens (never printed by :meth:`decode`).
    """

    def __init__(self, path: Path):
        gguf = _gguf()
        reader = gguf.GGUFReader(str(path))
        model = _field(reader, "tokenizer.ggml.model", path)
        pre = _field(reader, "tokenizer.ggml.pre", path)
        if model != "gpt2" or pre not in _PRE_TYPES:
            raise KilnError(f"{path}: tokenizer {model!r}/{pre!r} is not supported "
                            f"(byte-level BPE with pre-type {'/'.join(_PRE_TYPES)})")
        tokens = _field(reader, "tokenizer.ggml.tokens", path)
        types = _field(reader, "tokenizer.ggml.token_type", path)
        merges = _field(reader, "tokenizer.ggml.merges", path)
        self.tokenizer = _build(tokens, types, merges, digits=pre == "smollm")
        self.eos_token_id = int(_field(reader, "tokenizer.ggml.eos_token_id", path))
        pad = reader.fields.get("tokenizer.ggml.padding_token_id")
        self.pad_token_id = int(pad.contents()) if pad is not None else self.eos_token_id
        self.special_ids = {i for i, t in enumerate(types) if t == _CONTROL}
        template = reader.fields.get("tokenizer.chat_template")
        self.chat_template = template.contents() if template is not None else None

    def to_json(self) -> str:
        """The whole tokenizer as JSON text (the ``tokenizers`` JSON inside), for
        :meth:`from_json`."""
        return json.dumps({"format": JSON_FORMAT, "tokenizer": self.tokenizer.to_str(),
                           "eos_token_id": self.eos_token_id, "pad_token_id": self.pad_token_id,
                           "special_ids": sorted(self.special_ids),
                           "chat_template": self.chat_template})

    @classmethod
    def from_json(cls, text: str) -> ChatTokenizer:
        """The tokenizer saved by :meth:`to_json`.

        Raises
        ------
        KilnError
            If ``text`` is not :meth:`to_json` output of this :data:`JSON_FORMAT`.
        """
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != JSON_FORMAT:
                raise ValueError(f"not a tokenizer of format {JSON_FORMAT}")
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(data["tokenizer"])
            fields = (int(data["eos_token_id"]), int(data["pad_token_id"]),
                      {int(i) for i in data["special_ids"]}, data["chat_template"])
        except Exception as err:  # json, the fields, or tokenizers' own (plain) Exception
            raise KilnError(f"not a saved chat tokenizer: {err}") from err
        tok = cls.__new__(cls)
        tok.tokenizer = tokenizer
        tok.eos_token_id, tok.pad_token_id, tok.special_ids, tok.chat_template = fields
        return tok

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens written in the text are recognized)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (dicts with ``role`` and ``content``), rendered from
        the model's own Jinja template.

        Raises
        ------
        KilnError
            If the model has no chat template or the template fails to render.
        """
        if self.chat_template is None:
            raise KilnError("this model has no chat template")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt)
        except TemplateError as err:
            raise KilnError(f"chat template failed: {err}") from err


def cached_chat_tokenizer(gguf_path: Path, cache_path: Path) -> ChatTokenizer:
    """``ChatTokenizer(gguf_path)``, read from ``cache_path`` when that holds it (written there
    on first use, atomically).

    ``cache_path`` must name the GGUF's content (e.g. its pinned SHA-256) and the
    ``tokenizers`` version: the cache is not checked against the GGUF. A cache file that does
    not load is rebuilt.

    Raises
    ------
    KilnError
        If the GGUF's tokenizer is not supported (see :class:`ChatTokenizer`).
    """
    if cache_path.exists():
        try:
            return ChatTokenizer.from_json(cache_path.read_text(encoding="utf-8"))
        except (KilnError, OSError, ValueError) as err:
            log.debug("tokenizer cache %s unreadable, rebuilt: %s", cache_path, err)
    tok = ChatTokenizer(gguf_path)
    _write_atomic(cache_path, tok.to_json().encode("utf-8"))
    return tok


def _build(tokens: list[str], types: list[int], merges: list[str], digits: bool):
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError as err:  # pragma: no cover - depends on the install
        raise KilnError("the tokenizer needs the tokenizers package: "
                        "pip install 'kiln[llm]'") from err
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), byte_level]) if digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == _CONTROL])
    return tok
