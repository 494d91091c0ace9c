"""kiln.llm.sampling and the padding / streaming helpers of kiln.llm.generate."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import KilnError
from kiln.llm import SamplingConfig, TextStreamer, left_pad, next_tokens


def test_greedy_is_argmax_lowest_id_on_ties():
    logits = np.array([[0.0, 2.0, 2.0, 1.0], [5.0, 0.0, 0.0, 0.0]], np.float32)
    np.testing.assert_array_equal(next_tokens(logits, SamplingConfig(), None), [1, 0])


def test_sampling_is_reproducible_with_a_seed_and_follows_the_distribution():
    logits = np.log(np.array([[0.1, 0.2, 0.7]], np.float32))
    cfg = SamplingConfig(do_sample=True, seed=3)
    draws = [int(next_tokens(logits, cfg, np.random.default_rng(3))[0]) for _ in range(3)]
    assert len(set(draws)) == 1
    rng = np.random.default_rng(0)
    counts = np.bincount([next_tokens(logits, cfg, rng)[0] for _ in range(4000)], minlength=3)
    np.testing.assert_allclose(counts / 4000, [0.1, 0.2, 0.7], atol=0.03)


def test_top_k_and_top_p_keep_the_most_likely_tokens():
    logits = np.log(np.array([[0.05, 0.5, 0.15, 0.3]], np.float32))
    rng = np.random.default_rng(0)
    top2 = {int(next_tokens(logits, SamplingConfig(do_sample=True, top_k=2), rng)[0])
            for _ in range(300)}
    assert top2 == {1, 3}
    # 0.5 + 0.3 reaches 0.75: tokens 1 and 3 only; 0.5 alone does not reach 0.5 + eps
    nucleus = {int(next_tokens(logits, SamplingConfig(do_sample=True, top_p=0.75), rng)[0])
               for _ in range(300)}
    assert nucleus == {1, 3}
    only = {int(next_tokens(logits, SamplingConfig(do_sample=True, top_p=0.4), rng)[0])
            for _ in range(50)}
    assert only == {1}


def test_low_temperature_approaches_greedy():
    logits = np.array([[1.0, 1.5, 0.5]], np.float32)
    rng = np.random.default_rng(0)
    cold = SamplingConfig(do_sample=True, temperature=0.01)
    assert {int(next_tokens(logits, cold, rng)[0]) for _ in range(100)} == {1}


@pytest.mark.parametrize("bad", [{"temperature": 0}, {"top_k": -1}, {"top_p": 0},
                                 {"top_p": 1.5}])
def test_bad_sampling_settings_are_errors(bad):
    with pytest.raises(KilnError):
        SamplingConfig(**bad)


def test_left_pad_masks_and_positions():
    ids, mask, pos = left_pad([[5, 6, 7], [9]], pad_token_id=0)
    np.testing.assert_array_equal(ids, [[5, 6, 7], [0, 0, 9]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1]])
    np.testing.assert_array_equal(pos, [[0, 1, 2], [0, 0, 0]])
    with pytest.raises(KilnError, match="at least one token"):
        left_pad([[1], []], 0)


def test_text_streamer_holds_back_partial_characters():
    pieces = {1: b"caf", 2: b"\xc3", 3: b"\xa9!"}
    out: list[str] = []
    stream = TextStreamer(lambda ids: b"".join(pieces[i] for i in ids).decode(
        errors="replace"), out.append)
    for t in (1, 2, 3):
        stream(0, t)
    assert out == ["caf", "é!"]
