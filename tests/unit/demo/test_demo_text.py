"""The demos' text helpers, without models: BERT WordPiece tokenization over a small vocabulary,
and the OCR box extraction and CTC decoding."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.demo.ocr_pipeline import ctc_decode, det_input, rec_input, render_line, text_boxes
from kiln.demo.wordpiece import WordPiece, basic_tokens
from kiln.errors import KilnError

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "un", "##aff", "##able", ",",
         "!", "cafe", "深", "度", "e", "##s"]


@pytest.fixture
def wordpiece(tmp_path) -> WordPiece:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return WordPiece(path)


def test_basic_tokens():
    assert basic_tokens("Hello,\tWORLD!") == ["hello", ",", "world", "!"]
    assert basic_tokens("Café\u200b naïve") == ["cafe", "naive"]  # accents, a format char
    assert basic_tokens("深度x") == ["深", "度", "x"]
    assert basic_tokens("a$b") == ["a", "$", "b"]  # ASCII symbols split like punctuation


def test_word_pieces_greedy_longest_match(wordpiece):
    assert wordpiece.tokenize("Unaffable hello") == ["un", "##aff", "##able", "hello"]
    assert wordpiece.tokenize("unknowable") == ["[UNK]"]  # "##know" is not in the vocabulary
    assert wordpiece.tokenize("es " + "e" * 101) == ["e", "##s", "[UNK]"]


def test_encode_pads_and_truncates(wordpiece):
    ids, mask = wordpiece.encode("hello, world!", 8)
    assert ids.tolist() == [2, 4, 9, 5, 10, 3, 0, 0]
    assert mask.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    ids, mask = wordpiece.encode("hello world hello world", 4)
    assert ids.tolist() == [2, 4, 5, 3] and mask.all()


def test_vocabulary_needs_special_tokens(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("hello\n", encoding="utf-8")
    with pytest.raises(KilnError, match=r"lacks \[PAD\], \[UNK\], \[CLS\], \[SEP\]"):
        WordPiece(path)


def test_ctc_decode_merges_repeats_and_drops_blanks():
    chars = ["blank", "a", "b", " "]
    steps = [1, 1, 0, 1, 2, 2, 0, 0, 3, 2]
    probs = np.full((len(steps), 4), 0.1, np.float32)
    probs[np.arange(len(steps)), steps] = 0.7
    text, conf = ctc_decode(probs, chars)
    assert text == "aab b"
    assert conf == pytest.approx(0.7)
    with pytest.raises(KilnError, match="5 classes"):
        ctc_decode(np.zeros((3, 5), np.float32), chars)


def test_text_boxes_finds_lines():
    prob = np.zeros((40, 60), np.float32)
    prob[5:10, 10:50] = 0.9
    prob[20:26, 4:30] = 0.8
    prob[33, 33] = 0.9  # a speck: no box
    boxes = text_boxes(prob)
    assert len(boxes) == 2
    assert boxes[0].top < 5 and boxes[0].bottom > 10 and boxes[0].left < 10
    assert boxes[1].top < 20 and boxes[1].bottom > 26
    assert boxes[1].left < 4 and boxes[1].right > 30


def test_model_inputs():
    line = render_line("Kiln", 64, 128)
    assert line.shape == (64, 128, 3) and line.dtype == np.uint8 and line.min() < 100
    x = det_input(line)
    assert x.shape == (1, 3, 64, 128) and x.dtype == np.float32
    r = rec_input(line[16:48, 8:80])
    assert r.shape == (1, 3, 48, 320) and np.all(r[..., 120:] == 0) and r.min() >= -1
    with pytest.raises(KilnError, match="multiples of 32"):
        det_input(line[:50])
    with pytest.raises(KilnError, match="does not fit"):
        render_line("a long line of text", 64, 64)
