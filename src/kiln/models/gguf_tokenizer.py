"""The tokenizer and chat template stored in a GGUF file, as a ``tokenizers`` BPE tokenizer.

GGUF keeps a byte-level BPE vocabulary (``tokenizer.ggml.model == "gpt2"``) as the token
strings, their types (3 = control, i.e. special) and the merge list, plus the model's Jinja chat
template (``tokenizer.chat_template``). :class:`ChatTokenizer` rebuilds the tokenizer with Hugging
Face's ``tokenizers`` library (not a BPE of our own) and renders the template with Jinja2 in a
sandbox, as ``transformers``' ``apply_chat_template`` does.

The pre-tokenizer follows llama.cpp's ``smollm`` / ``gpt2`` pre-types (``llama-vocab.cpp``):
``smollm`` splits every digit on its own before the GPT-2 byte-level split.
"""

from __future__ import annotations

from pathlib import Path

from kiln.errors import KilnError
from kiln.models.gguf_llama import _field, _gguf

_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
_PRE_TYPES = ("gpt2", "smollm")


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
