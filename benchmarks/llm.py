"""SmolLM2-135M-Instruct: prefill and decode speed, Kiln vs onnxruntime and llama.cpp, in one
process.

Engines, each on the same ONNX decoder (``kiln.models.smollm2``): onnxruntime fp32, Kiln fp32,
Kiln with int8 weights and Kiln with q4 (Q4_1) weights (``kiln.llm.kiln_decoder``, VM artifact,
compiled once and cached); and, when the ``llama_cpp`` package (llama-cpp-python, the ``bench``
extra) imports, llama.cpp on the GGUF file the ONNX decoder was made from (its own Q4_1
weights; ``n_threads`` = ``n_threads_batch`` = ``--threads``). Per engine:

- prefill: one call on a prompt of N random tokens (past 0), median of ``--repeat`` calls;
- decode: a cache of P positions (random values), then ``--steps`` single-token steps, each
  feeding back the cache the previous step returned (Kiln appends in place; onnxruntime's
  Concat copies), median step time → tokens/s;
- memory: peak RSS of the process after the engine ran (it only grows) and the RSS then.

The engines are timed in alternating rounds (all engines at one shape, then the next shape,
``--rounds`` times, best round reported) so that load on a shared machine hits them alike.
Ratios are onnxruntime's time over the engine's (above 1: faster than onnxruntime fp32).
The committed summary (``summary.py``, ``results/summary/llm-<threads>t-<machine class>``)
holds one row per Kiln engine and shape (decode in ms per token) beside its bar: onnxruntime
fp32 for Kiln fp32, llama.cpp for Kiln's int8 and q4 weights, and the change against the last
committed one.

    .venv/bin/python benchmarks/llm.py [--threads 1] [--engines ort,fp32,int8,q4,llama.cpp]
                                       [--prefill 16,128,512] [--past 16,256,1024] [--clock cpu]

llama.cpp's cache holds the keys and values of P random tokens it computed itself (its own
format: float16), Kiln's and onnxruntime's random float32 values; each step costs the same
either way. ``--engines llama.cpp --gguf PATH`` needs neither Kiln nor onnxruntime (a venv with
only llama-cpp-python and numpy).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import summary
from peers import module_version

ENGINES = ("ort", "fp32", "int8", "q4")
#: the optional peer on the GGUF file (used when ``llama_cpp`` imports)
LLAMA_CPP = "llama.cpp"


def default_engines() -> tuple[str, ...]:
    """ENGINES, and llama.cpp when its Python package is installed."""
    import importlib.util

    return ENGINES + ((LLAMA_CPP,) if importlib.util.find_spec("llama_cpp") else ())


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--engines", default=",".join(default_engines()))
    p.add_argument("--gguf", default=None,
                   help="llama.cpp's model (default: the GGUF that kiln.models.smollm2 reads)")
    p.add_argument("--prefill", default="16,128,512", help="prompt lengths")
    p.add_argument("--past", default="16,256,1024", help="cache lengths for decode")
    p.add_argument("--steps", type=int, default=16, help="decode steps per measurement")
    p.add_argument("--repeat", type=int, default=3, help="prefill calls per measurement")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: perf_counter; cpu: the calling thread's CPU time (what other "
                        "processes on a shared machine disturb least; with --threads 1 only: "
                        "it does not count worker threads)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--summary", default="llm",
                   help="name of the committed summary, benchmarks/results/summary/"
                   "NAME-<threads>t-<machine class>.{json,md}; '' writes none (default: llm)")
    p.add_argument("--note", default="", help="a sentence recorded with the summary")
    return p.parse_args(argv)


#: the clock of every measurement (``--clock``)
_clock = time.perf_counter


def _rss_mib() -> tuple[float, float]:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * resource.getpagesize() / 2**20
    return peak, now


class LlamaCpp:
    """llama.cpp (llama-cpp-python's ``Llama``, its default batches of 512 tokens):
    ``prefill(ids)`` empties the cache and runs the prompt, ``step(token)`` appends one token."""

    def __init__(self, gguf: Path, threads: int, context: int):
        import llama_cpp

        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=context, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)

    def prefill(self, ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(ids)

    def step(self, token: int) -> None:
        self.llm.eval([token])


def _llama_prefill_ms(llm: LlamaCpp, n: int, repeat: int, rng) -> float:
    ids = [int(t) for t in rng.integers(100, 40000, n)]
    times = []
    for _ in range(repeat):
        start = _clock()
        llm.prefill(ids)
        times.append(_clock() - start)
    return statistics.median(times) * 1e3


def _llama_decode_tokens_per_s(llm: LlamaCpp, past_len: int, steps: int, rng) -> float:
    llm.prefill([int(t) for t in rng.integers(100, 40000, past_len)])
    times = []
    for token in rng.integers(100, 40000, steps):
        start = _clock()
        llm.step(int(token))
        times.append(_clock() - start)
    return 1.0 / statistics.median(times)


def prefill(name: str, dec, n: int, repeat: int, rng) -> float:
    """Prefill time of engine ``name`` (ms)."""
    if name == LLAMA_CPP:
        return _llama_prefill_ms(dec, n, repeat, rng)
    return prefill_ms(dec, n, repeat, rng)


def decode(name: str, dec, past_len: int, steps: int, rng) -> float:
    """Decode speed of engine ``name`` at ``past_len`` (tokens/s)."""
    if name == LLAMA_CPP:
        return _llama_decode_tokens_per_s(dec, past_len, steps, rng)
    return decode_tokens_per_s(dec, past_len, steps, rng)


def _load(name: str, path: Path | None, args) -> object:
    if name == LLAMA_CPP:
        longest = max(int(x) for x in f"{args.prefill},{args.past}".split(",") if x)
        return LlamaCpp(Path(args.gguf), args.threads, longest + args.steps + 16)
    from kiln.llm import kiln_decoder, ort_decoder

    if name == "ort":
        return ort_decoder(path, args.threads)
    return kiln_decoder(path, args.target, None if name == "fp32" else name)


def prefill_ms(dec, n: int, repeat: int, rng) -> float:
    ids = rng.integers(100, 40000, (1, n)).astype(np.int64)
    feeds = (ids, np.ones((1, n), np.int64), np.arange(n)[None])
    times = []
    for _ in range(repeat):
        start = _clock()
        dec(*feeds, dec.empty_cache(1))
        times.append(_clock() - start)
    return statistics.median(times) * 1e3


def decode_tokens_per_s(dec, past_len: int, steps: int, rng) -> float:
    g, d = dec.kv_shape
    past = [rng.standard_normal((past_len, 1, g, d)).astype(np.float32)
            for _ in range(dec.num_cache_tensors)]
    token = np.array([[1234]])
    times = []
    for s in range(steps + 1):
        total = past_len + s + 1
        start = _clock()
        logits, past = dec(token, np.ones((1, total), np.int64), np.array([[total - 1]]), past)
        times.append(_clock() - start)
        token = logits[:, -1:].argmax(-1)
    return 1.0 / statistics.median(times[1:])  # the first step copies a foreign cache


def main(argv=None) -> int:
    import os

    global _clock
    args = parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu counts the calling thread only: use it with --threads 1")
    _clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    engines = [e for e in args.engines.split(",") if e]
    path = None
    if any(e != LLAMA_CPP for e in engines):
        from kiln.models import smollm2

        path = smollm2()
    if LLAMA_CPP in engines and args.gguf is None:
        from kiln.models import smollm2_gguf_path

        args.gguf = str(smollm2_gguf_path())
    prefills = [int(x) for x in args.prefill.split(",") if x]
    pasts = [int(x) for x in args.past.split(",") if x]
    decoders, memory = {}, {}
    for name in engines:
        decoders[name] = _load(name, path, args)
        prefill(name, decoders[name], 8, 1, np.random.default_rng(0))  # warm up
        memory[name] = _rss_mib()
    rng = np.random.default_rng(0)
    best: dict[tuple, float] = {}
    for _ in range(args.rounds):
        for n in prefills:
            for name in engines:
                ms = prefill(name, decoders[name], n, args.repeat, rng)
                best[(name, "prefill", n)] = min(best.get((name, "prefill", n), ms), ms)
        for p in pasts:
            for name in engines:
                tps = decode(name, decoders[name], p, args.steps, rng)
                best[(name, "decode", p)] = max(best.get((name, "decode", p), tps), tps)
    for name in engines:
        memory[name] = memory[name] + (_rss_mib()[0],)
    report = _table(engines, prefills, pasts, best, memory, args)
    print(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"llm-{args.threads}t.md").write_text(report + "\n")
    (out / f"llm-{args.threads}t.json").write_text(json.dumps(
        {f"{k[0]}:{k[1]}:{k[2]}": v for k, v in best.items()}, indent=1))
    if args.summary and any(e not in ("ort", LLAMA_CPP) for e in engines):  # Kiln ran
        _write_summary(engines, prefills, pasts, best, args)
    return 0


#: the summary's peer columns: onnxruntime fp32 is the bar of Kiln fp32, llama.cpp on the GGUF
#: the bar of Kiln's quantized weights (issue 31's targets)
SUMMARY_PEERS = {"ort": "onnxruntime fp32", "llama_cpp": "llama.cpp Q4_1"}


def summary_rows(engines, prefills, pasts, best, threads: int) -> list[dict]:
    """One summary row per Kiln engine and shape: ``"<engine> prefill <N>"`` (ms per call) and
    ``"<engine> decode @<P>"`` (ms per token), with ``ort_ms`` for fp32 and ``llama_cpp_ms``
    for int8/q4 (None where that peer did not run)."""
    def ms(name, phase, n):
        value = best.get((name, phase, n))
        if value is None:
            return None
        return value if phase == "prefill" else 1e3 / value  # tok/s → ms per token

    rows = []
    for name in (e for e in engines if e not in ("ort", LLAMA_CPP)):
        peer = "ort" if name == "fp32" else "llama_cpp"
        source = "ort" if name == "fp32" else LLAMA_CPP
        for phase, sizes, label in (("prefill", prefills, "prefill {}"),
                                    ("decode", pasts, "decode @{}")):
            for n in sizes:
                row = {"threads": threads, "kiln_ms": ms(name, phase, n),
                       f"{peer}_ms": ms(source, phase, n) if source in engines else None}
                rows.append(summary.summary_row(f"{name} {label.format(n)}", row,
                                                SUMMARY_PEERS))
    return rows


def _write_summary(engines, prefills, pasts, best, args) -> None:
    machine = summary.machine_info() | {"llama_cpp": module_version("llama_cpp")}
    clock = "thread CPU time" if args.clock == "cpu" else "wall clock"
    settings = (f"llm.py, target `{args.target}`, {args.threads} thread(s), {clock}, best of "
                f"{args.rounds} rounds, prefill median of {args.repeat} calls, decode median of "
                f"{args.steps} steps; decode rows in ms per token")
    path, text = summary.write_summary(
        f"{args.summary}-{args.threads}t" + ("-cpu" if args.clock == "cpu" else ""),
        summary_rows(engines, prefills, pasts, best, args.threads),
        machine, note=args.note, settings=settings, peers=SUMMARY_PEERS)
    print(f"\nsummary (commit it): {path}\n\n{text}")


def _table(engines, prefills, pasts, best, memory, args) -> str:
    names = {"ort": "onnxruntime fp32", "fp32": "Kiln fp32", "int8": "Kiln int8 weights",
             "q4": "Kiln q4 weights", LLAMA_CPP: "llama.cpp (GGUF Q4_1)"}
    clock = "thread CPU time" if args.clock == "cpu" else "wall clock"
    columns = (["engine"] + [f"prefill {n} (ms)" for n in prefills]
               + [f"decode @{p} (tok/s)" for p in pasts] + ["RSS after load / peak (MiB)"])
    lines = [f"SmolLM2-135M-Instruct, {args.threads} thread(s), target '{args.target}', {clock}",
             "",
             "| " + " | ".join(columns) + " |",
             "|---" * len(columns) + "|"]
    ref = "ort" if "ort" in engines else None
    for name in engines:
        cells = []
        for n in prefills:
            ms = best[(name, "prefill", n)]
            ratio = f" ({best[(ref, 'prefill', n)] / ms:.2f}×)" if ref and name != ref else ""
            cells.append(f"{ms:.0f}{ratio}")
        for p in pasts:
            tps = best[(name, "decode", p)]
            ratio = f" ({tps / best[(ref, 'decode', p)]:.2f}×)" if ref and name != ref else ""
            cells.append(f"{tps:.1f}{ratio}")
        cells.append(f"{memory[name][1]:.0f} / {memory[name][2]:.0f}")
        lines.append(f"| {names[name]} | " + " | ".join(cells) + " |")
    if "fp32" in engines and len(pasts) > 1:
        growth = best[("fp32", "decode", pasts[0])] / best[("fp32", "decode", pasts[-1])]
        lines += ["", f"Kiln fp32 decode step at past {pasts[-1]} / at past {pasts[0]}: "
                  + f"{growth:.2f}"]
    lines += ["", "(×: speed relative to onnxruntime fp32; above 1 is faster)"]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
