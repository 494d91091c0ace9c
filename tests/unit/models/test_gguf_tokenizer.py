"""The GGUF chat tokenizer and its on-disk cache, on a tiny byte-level BPE GGUF written here:
the cached tokenizer encodes, decodes and renders the chat template as the one read from the
GGUF, and a second load reads the cache, not the GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from kiln.models import gguf_tokenizer
from kiln.models.gguf_tokenizer import ChatTokenizer, cached_chat_tokenizer

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "Ġ w", "o r", "Ġw or", "1 2"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXTS = ["hello world", "hello 12 worlds 3456", "<|im_start|>user\nhé ☃<|im_end|>", "  \t x"]


def _write_gguf(path: Path) -> None:
    """Byte-level BPE ("gpt2" model, "smollm" pre-type): the control tokens, the 256 byte
    symbols, then the merges' results."""
    from tokenizers import pre_tokenizers

    tokens = SPECIAL + sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens += [m.replace(" ", "") for m in MERGES]
    types = [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL))
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_chat_template(TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def gguf_path(tmp_path) -> Path:
    path = tmp_path / "tiny.gguf"
    _write_gguf(path)
    return path


def _assert_same(a: ChatTokenizer, b: ChatTokenizer) -> None:
    for text in TEXTS:
        ids = a.encode(text)
        assert b.encode(text) == ids, text
        assert b.decode(ids) == a.decode(ids)
        assert b.decode(ids, skip_special_tokens=False) == a.decode(ids, skip_special_tokens=False)
    chat = [{"role": "user", "content": "hello 12"}]
    assert b.apply_chat_template(chat) == a.apply_chat_template(chat)
    assert (b.eos_token_id, b.pad_token_id, b.special_ids) == \
        (a.eos_token_id, a.pad_token_id, a.special_ids)


def test_tiny_gguf_tokenizer(gguf_path):
    """The test model itself: merges apply, digits split one by one, control tokens kept."""
    tok = ChatTokenizer(gguf_path)
    ids = tok.encode("hello 12<|im_end|>")
    assert tok.tokenizer.id_to_token(ids[0]) == "hell"
    assert [tok.tokenizer.id_to_token(i) for i in ids[-3:]] == ["1", "2", "<|im_end|>"]
    assert tok.decode(ids) == "hello 12"
    assert (tok.eos_token_id, tok.pad_token_id, tok.special_ids) == (2, 0, {0, 1, 2})


def test_json_round_trip_is_the_same_tokenizer(gguf_path):
    tok = ChatTokenizer(gguf_path)
    _assert_same(tok, ChatTokenizer.from_json(tok.to_json()))


def test_cache_is_written_then_read_instead_of_the_gguf(gguf_path, tmp_path, monkeypatch):
    cache = tmp_path / "tok.json"
    first = cached_chat_tokenizer(gguf_path, cache)
    assert cache.exists()
    _assert_same(ChatTokenizer(gguf_path), first)

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF was read although the cache holds the tokenizer")

    monkeypatch.setattr(gguf_tokenizer, "_gguf", no_gguf)
    _assert_same(first, cached_chat_tokenizer(gguf_path, cache))


@pytest.mark.parametrize("content", ["", "{not json", '{"format": 999}',
                                     '{"format": 1, "tokenizer": "{}"}'])
def test_unreadable_cache_is_rebuilt(gguf_path, tmp_path, content):
    cache = tmp_path / "tok.json"
    cache.write_text(content)
    _assert_same(ChatTokenizer(gguf_path), cached_chat_tokenizer(gguf_path, cache))
    _assert_same(ChatTokenizer(gguf_path), ChatTokenizer.from_json(cache.read_text()))
