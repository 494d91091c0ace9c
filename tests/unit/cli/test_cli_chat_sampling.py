"""``kiln demo chat``'s sampling options: what SamplingConfig each combination gives, the
errors, and --compare decoding greedily (said on the console) — with a stand-in model, a
decoder whose greedy decoding loops (the SmolLM2 run itself is tests/models/llm)."""

from __future__ import annotations

import pytest
from test_cli import _one_error_line
from test_llm_sampling import _LoopingDecoder

import kiln.llm
import kiln.models
from kiln.cli import main as cli
from kiln.demo import chat
from kiln.llm import SamplingConfig


@pytest.fixture
def demo_calls(monkeypatch):
    """The keyword arguments of each ``kiln.demo.chat.run_demo`` call (the demo not run)."""
    calls = []
    monkeypatch.setattr(chat, "run_demo", lambda **kw: calls.append(kw) or 0)
    return calls


@pytest.mark.parametrize(("argv", "want"), [
    ([], None),
    (["--temperature", "0"], SamplingConfig()),
    (["--greedy"], SamplingConfig()),
    (["--greedy", "--repetition-penalty", "1.3"], SamplingConfig(repetition_penalty=1.3)),
    (["--temperature", "1", "--top-k", "0", "--seed", "5"],
     SamplingConfig(do_sample=True, temperature=1.0, top_k=0, top_p=0.9, seed=5,
                    repetition_penalty=1.1)),
    (["--top-p", "0.5", "--repetition-penalty", "1"],
     SamplingConfig(do_sample=True, temperature=0.7, top_k=50, top_p=0.5, seed=0)),
])
def test_sampling_options_make_the_sampling_config(argv, want, demo_calls):
    assert cli.main(["demo", "chat", *argv, "-q"]) == 0
    assert demo_calls[0]["sampling"] == want


def test_the_default_samples_with_a_repetition_penalty_and_a_seed():
    assert chat.DEFAULT_SAMPLING == SamplingConfig(do_sample=True, temperature=0.7, top_k=50,
                                                   top_p=0.9, seed=0, repetition_penalty=1.1)


@pytest.mark.parametrize(("argv", "message"), [
    (["chat", "--temperature", "-1"], "--temperature must be >= 0 (0: greedy), got -1.0"),
    (["chat", "--greedy", "--top-p", "0.5", "--seed", "1"],
     "--top-p, --seed set how tokens are sampled; greedy decoding"),
    (["chat", "--greedy", "--temperature", "0.5"], "--temperature set how tokens are sampled"),
    (["chat", "--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
    (["chat", "--repetition-penalty", "0"], "repetition_penalty must be > 0, got 0.0"),
    (["embed", "--seed", "1"], "the sampling options apply to 'kiln demo chat'"),
])
def test_bad_sampling_options_are_one_line_errors(argv, message, demo_calls, capsys):
    assert cli.main(["demo", *argv, "-q"]) == 2
    assert message in _one_error_line(capsys)
    assert demo_calls == []


class _Tokenizer:
    eos_token_id, pad_token_id = 9, 0

    def apply_chat_template(self, messages):
        return messages[0]["content"]

    def encode(self, text):
        return [1, 2]

    def decode(self, ids):
        return " ".join(map(str, ids))


@pytest.fixture
def stand_in_model(monkeypatch):
    """The chat demo on the looping decoder (Kiln's and onnxruntime's); records the
    SamplingConfig of every generate call."""
    configs = []
    generate = kiln.llm.generate

    def recording_generate(decoder, prompts, **kw):
        configs.append(kw["sampling"])
        return generate(decoder, prompts, **kw)

    monkeypatch.setattr(kiln.models, "smollm2", lambda: "model.onnx")
    monkeypatch.setattr(kiln.models, "smollm2_tokenizer", _Tokenizer)
    monkeypatch.setattr(kiln.llm, "kiln_decoder", lambda *a, **k: _LoopingDecoder())
    monkeypatch.setattr(kiln.llm, "ort_decoder", lambda *a: _LoopingDecoder())
    monkeypatch.setattr(kiln.llm, "generate", recording_generate)
    return configs


def test_compare_decodes_greedily_and_says_so(stand_in_model, capsys):
    from rich.console import Console

    assert chat.run_demo(compare=True, max_new_tokens=4, console=Console(width=60)) == 0
    out = capsys.readouterr().out
    assert ("--compare: Kiln and onnxruntime decode greedily (the sampling settings are "
            "ignored), so that their token ids can be compared") in out
    assert stand_in_model == [SamplingConfig(), SamplingConfig()]
    assert "5 5 5 5" in out and "token ids identical" in out  # greedy loops on this model


def test_the_demo_samples_by_default_and_says_how(stand_in_model, capsys):
    from rich.console import Console

    assert chat.run_demo(max_new_tokens=4, console=Console(width=60)) == 0
    out = capsys.readouterr().out
    assert ("sampling: temperature 0.7, top-p 0.9, top-k 50, repetition penalty 1.1, seed 0 "
            "(--greedy: greedy decoding)") in out
    assert stand_in_model == [chat.DEFAULT_SAMPLING]
