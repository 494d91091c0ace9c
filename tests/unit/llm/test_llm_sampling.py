"""kiln.llm.sampling (checked against numpy written from the definitions: CTRL's repetition
penalty, Hugging Face's temperature, top-k and top-p warpers) and the padding / streaming
helpers of kiln.llm.generate."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import KilnError
from kiln.llm import (
    SamplingConfig,
    TextStreamer,
    apply_repetition_penalty,
    generate,
    left_pad,
    next_tokens,
    sampling,
    token_probs,
)


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
                                 {"top_p": 1.5}, {"repetition_penalty": 0},
                                 {"repetition_penalty": -1.1}])
def test_bad_sampling_settings_are_errors(bad):
    with pytest.raises(KilnError):
        SamplingConfig(**bad)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_once_per_id():
    logits = np.array([2.0, -1.0, 0.5, 3.0, -0.25], np.float32)
    got = apply_repetition_penalty(logits, [0, 1, 1, 4, 0], 2.0)
    np.testing.assert_array_equal(got, [1.0, -2.0, 0.5, 3.0, -0.5])  # exact in binary
    np.testing.assert_array_equal(logits, [2.0, -1.0, 0.5, 3.0, -0.25])  # the input is kept
    np.testing.assert_array_equal(apply_repetition_penalty(logits, [], 2.0), logits)


def _reference_probs(logits, context, temperature, top_k, top_p, penalty):
    """numpy from the definitions, in transformers' order and formulation: the penalty
    (gather, where, scatter), the temperature, top-k as -inf below the k-th logit, top-p as
    removing the ascending-sorted tokens whose cumulative probability is <= 1 - top_p."""
    x = logits.astype(np.float64).copy()
    ids = np.array(sorted(set(context)))
    x[ids] = np.where(x[ids] < 0, x[ids] * penalty, x[ids] / penalty)
    x = x / temperature
    x[x < np.sort(x)[-top_k]] = -np.inf
    asc = np.argsort(x)
    p = np.exp(x[asc] - x[asc].max())
    cum = np.cumsum(p / p.sum())
    remove = cum <= 1 - top_p
    remove[-1] = False
    x[asc[remove]] = -np.inf
    e = np.exp(x - x.max())
    return e / e.sum()


def test_token_probs_match_numpy_on_fixed_logits():
    logits = np.random.default_rng(4).standard_normal(50).astype(np.float32) * 3
    context = [3, 7, 7, 11, 42, int(np.argmax(logits))]
    for temperature, top_k, top_p, penalty in [(0.7, 20, 0.9, 1.1), (1.3, 5, 1.0, 1.5),
                                               (0.5, 50, 0.6, 0.8)]:
        cfg = SamplingConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p,
                             repetition_penalty=penalty)
        np.testing.assert_allclose(token_probs(logits, cfg, context),
                                   _reference_probs(logits, context, temperature, top_k, top_p,
                                                    penalty), rtol=1e-12, atol=1e-15)


def test_a_sampled_token_is_numpy_s_draw_from_that_distribution_with_the_same_seed():
    logits = np.random.default_rng(5).standard_normal((2, 40)).astype(np.float32)
    context = [[1, 2, 3], [int(np.argmax(logits[1]))]]
    cfg = SamplingConfig(do_sample=True, temperature=0.7, top_k=10, top_p=0.9, seed=0,
                         repetition_penalty=1.1)
    want = []
    rng = np.random.default_rng(11)
    for row, ids in zip(logits, context):
        want.append(rng.choice(40, p=_reference_probs(row, ids, 0.7, 10, 0.9, 1.1)))
    np.testing.assert_array_equal(next_tokens(logits, cfg, np.random.default_rng(11), context),
                                  want)


def test_greedy_with_a_repetition_penalty_takes_the_argmax_of_the_penalized_logits():
    logits = np.array([[3.0, 2.9, -1.0], [3.0, 2.9, -1.0]], np.float32)
    cfg = SamplingConfig(repetition_penalty=1.1)
    np.testing.assert_array_equal(next_tokens(logits, cfg, None, [[0], [1]]), [1, 0])
    np.testing.assert_array_equal(next_tokens(logits, cfg, None), [0, 0])  # no context


class _LoopingDecoder:
    """A decoder whose logits always favour token 5 a little over 6 and 7: greedy decoding
    repeats token 5 forever."""

    def empty_cache(self, batch):
        return None

    def __call__(self, ids, mask, pos, past):
        logits = np.zeros((ids.shape[0], ids.shape[1], 10), np.float32)
        logits[..., 5], logits[..., 6], logits[..., 7] = 2.0, 1.9, 1.85
        return logits, None


def test_generate_with_a_repetition_penalty_leaves_a_loop():
    greedy = generate(_LoopingDecoder(), [[1, 2]], max_new_tokens=4)
    assert greedy.tokens == [[5, 5, 5, 5]]
    penalized = generate(_LoopingDecoder(), [[1, 2]], max_new_tokens=4,
                         sampling=SamplingConfig(repetition_penalty=1.1))
    # 2.0/1.1 < 1.9, then 1.9/1.1 < 1.85; once all three are seen, each is divided once
    # (not once per occurrence), and 5 leads again
    assert penalized.tokens == [[5, 6, 7, 5]]


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


def _sorted_probs(row, top_k, top_p):
    """The filter on a full stable sort of the vocabulary (what next_tokens did before it
    looked at candidates only)."""
    order = np.argsort(-row, kind="stable")
    keep = order[:top_k] if top_k else order
    p = np.exp(row[keep] - row[keep[0]])
    p /= p.sum()
    cut = int(np.searchsorted(np.cumsum(p), top_p)) + 1 if top_p < 1.0 else keep.size
    probs = np.zeros(row.size)
    probs[keep[:cut]] = p[:cut] / p[:cut].sum()
    return probs


@pytest.mark.parametrize("top_k", [0, 100, 4000])
@pytest.mark.parametrize("top_p", [0.5, 0.95, 1.0])
def test_top_p_over_candidates_equals_a_full_sort(top_k, top_p):
    """top-p looks at the largest TOP_P_CANDIDATES logits first and doubles them until they
    hold top_p of the mass: the same kept tokens and probabilities as sorting the whole
    vocabulary, with a flat distribution (thousands kept) and with ties (rounded logits)."""
    rng = np.random.default_rng(7)
    flat = rng.standard_normal(5000) * 0.3
    tied = np.round(rng.standard_normal(5000) * 2) / 2
    for row in (flat, tied):
        cfg = SamplingConfig(do_sample=True, temperature=1.0, top_k=top_k, top_p=top_p)
        got, want = token_probs(row, cfg), _sorted_probs(row, top_k, top_p)
        np.testing.assert_array_equal(got > 0, want > 0)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_a_peaked_top_p_sorts_only_its_candidates(monkeypatch):
    """A language model's peaked logits keep few tokens under top-p: only the largest
    TOP_P_CANDIDATES are sorted, never the whole vocabulary (the full sort of SmolLM2's 49152
    logits was ~3 ms a token)."""
    sorted_sizes = []
    argsort = np.argsort
    monkeypatch.setattr(np, "argsort", lambda a, **kw: sorted_sizes.append(a.size) or
                        argsort(a, **kw))
    row = np.random.default_rng(8).standard_normal(49152) * 4
    cfg = SamplingConfig(do_sample=True, temperature=0.7, top_p=0.9)
    probs = token_probs(row, cfg)
    assert sorted_sizes and max(sorted_sizes) <= 2 * sampling.TOP_P_CANDIDATES
    np.testing.assert_allclose(probs, _sorted_probs(row / 0.7, 0, 0.9), rtol=1e-12, atol=1e-15)
