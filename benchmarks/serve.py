"""Serving under concurrent streaming clients: Kiln's server vs llama-cpp-python's own OpenAI
server on the same GGUF (SmolLM2-135M-Instruct Q4_1): throughput and time between tokens.

For each concurrency C of ``--clients`` (default 1, 4, 16), C clients each send ``--requests``
streaming chat requests one after another (``max_tokens`` ``--max-tokens``, sampled with a
seed per request so that replies differ but runs repeat) over raw HTTP (httpx, server-sent
events). Reported per engine and C:

- throughput: completion tokens of all clients over the wall time. A stream's tokens are its
  ``usage`` (Kiln sends it with ``stream_options.include_usage``); llama-cpp-python 0.3 sends
  no usage in a stream but one content chunk per generated token (checked: as many as the
  ``usage.completion_tokens`` of the same request unstreamed), so its chunks are counted;
- time between tokens (TBT): the gaps between a stream's successive content chunks, p50 and
  p99 over all streams (a Kiln chunk may carry more than one token when text was held back);
- time to first token (TTFT), p50 and p99;
- Kiln / llama.cpp throughput.

Engines (``--engines``, default ``kiln,llama.cpp``, llama.cpp only when llama-cpp-python's
server extra imports), each a subprocess on a free loopback port (``serve_launch.py``), started
per round and terminated after it (also on errors and Ctrl-C):

- ``kiln``: ``kiln serve MODEL --max-batch B`` (continuous batching), ``KILN_NUM_THREADS`` =
  ``--threads``;
- ``llama.cpp``: ``python -m llama_cpp.server --model GGUF --n_threads T --n_threads_batch T
  --n_ctx CONTEXT --interrupt_requests False``. That server has no parallel decoding: it holds
  one llama.cpp context behind a lock and runs requests one after another, whatever its
  options; its default ``--interrupt_requests True`` ends the running stream as soon as another
  request waits, which truncates replies under concurrency, so it is turned off (what a user
  serving several clients does). Its other settings are its defaults (``n_batch`` 512).

Both apply the GGUF's chat template (Kiln's tokenizer and template are read from the same
file); the prompt tokens of one unstreamed request are printed per engine to show it. Both get
the same sampling: temperature 0.7, top_p 0.9, and the llama.cpp server's own extra filters
turned off (``top_k`` 0, ``min_p`` 0, ``repeat_penalty`` 1; Kiln has none of them by default,
and it ignores llama.cpp's field names as llama.cpp ignores Kiln's ``repetition_penalty``).
Replies still differ (two samplers, two numerics), and many end before ``max_tokens``: the
mean completion tokens per request is reported beside the throughput.

``--rounds`` R (default 2): each round starts every engine in turn (the order alternates
between rounds) and runs all concurrencies; per engine and C the round of the highest
throughput is kept. Two short untimed requests warm each server up first. ``--url URL
--model-name NAME`` measures an already running OpenAI-compatible server instead (one round).

Writes ``--out``/serve-<threads>t.{md,json} and, when Kiln ran, the committed summary
``results/summary/serve-<threads>t-<machine class>`` (``summary.py``): a row per C,
``kiln_ms`` = ms per token over all clients (1000 / throughput), a llama.cpp column.

    .venv/bin/python benchmarks/serve.py [--engines kiln,llama.cpp] [--threads 2]
        [--clients 1,4,16] [--requests 2] [--max-tokens 32] [--rounds 2] [--max-batch 16]
        [--context 2048] [--quantize-weights int8|q4] [--gguf PATH] [--note "..."]
        [--url URL --model-name NAME] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import time
from pathlib import Path

import httpx
import serve_launch
import summary
from peers import module_version

HERE = Path(__file__).resolve().parent
KILN, LLAMA_CPP = "kiln", "llama.cpp"
#: the model id both servers answer to (llama.cpp's ``--model_alias``)
ALIAS = "smollm2-135m-instruct"
#: the summary's peer column
SUMMARY_PEERS = {"llama_cpp": "llama.cpp server"}
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "Explain what a compiler does.", "Name three colours.", "Why is the sky blue?",
             "Give me a tip for learning Python.", "What is 12 times 7?",
             "Describe a cat in one sentence."]
#: the sampling of every request: llama-cpp-python's extra filters (defaults top_k 40, min_p
#: 0.05, repeat_penalty 1.1) off, so that both engines sample the same distribution
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
            "repetition_penalty": 1.0}


def default_engines() -> str:
    """``kiln``, and ``llama.cpp`` when llama-cpp-python and its server extra import."""
    server = ("llama_cpp", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
    return KILN + ("," + LLAMA_CPP if all(importlib.util.find_spec(m) for m in server) else "")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default=None,
                   help="kiln, llama.cpp, comma-separated (default: both when llama-cpp-python's "
                        "server imports)")
    p.add_argument("--threads", type=int, default=2, help="threads of each engine (default: 2)")
    p.add_argument("--model", default="smollm2", help="kiln serve's MODEL (default: smollm2)")
    p.add_argument("--gguf", default=None,
                   help="llama.cpp's model (default: the GGUF that kiln.models.smollm2 reads)")
    p.add_argument("--clients", default="1,4,16", help="concurrencies (default: 1,4,16)")
    p.add_argument("--requests", type=int, default=2, help="requests per client (default: 2)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--context", type=int, default=2048, help="both servers' context length")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--quantize-weights", choices=("int8", "q4"))
    p.add_argument("--url", help="an OpenAI-compatible server's base URL (…/v1) to measure "
                                 "instead of launching the engines")
    p.add_argument("--model-name", help="the model id to send with --url")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--summary", default="serve",
                   help="name of the committed summary, benchmarks/results/summary/"
                        "NAME-<threads>t-<machine class>.{json,md}; '' writes none")
    p.add_argument("--note", default="", help="a sentence recorded with the summary")
    return p.parse_args(argv)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; NaN when empty)."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def stream_stats(start: float, events: list[tuple[float, dict]]) -> dict:
    """One stream's ``{"gaps", "ttft", "tokens", "source"}`` from its ``(arrival time, chunk)``
    events (request sent at ``start``): gaps between content chunks and the first one's delay
    (s; NaN without content), completion tokens from the ``usage`` chunk (``source`` "usage")
    or, when there is none, the number of content chunks (``source`` "chunks")."""
    times = [t for t, c in events
             if c.get("choices") and c["choices"][0].get("delta", {}).get("content")]
    usage = [c["usage"]["completion_tokens"] for _, c in events if c.get("usage")]
    return {"gaps": [b - a for a, b in zip(times, times[1:])],
            "ttft": (times[0] - start) if times else float("nan"),
            "tokens": usage[-1] if usage else len(times),
            "source": "usage" if usage else "chunks"}


def request_body(model: str, question: str, seed: int, max_tokens: int,
                 stream: bool = True) -> dict:
    """The chat request every engine gets (:data:`SAMPLING`, seeded)."""
    body = {"model": model, "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "seed": seed, "stream": stream, **SAMPLING}
    return body | ({"stream_options": {"include_usage": True}} if stream else {})


async def _one(client: httpx.AsyncClient, url: str, model: str, question: str, seed: int,
               max_tokens: int) -> dict:
    start, events = time.perf_counter(), []
    body = request_body(model, question, seed, max_tokens)
    async with client.stream("POST", url + "/chat/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append((time.perf_counter(), json.loads(line[6:])))
    return stream_stats(start, events)


def level_stats(clients: int, streams: list[dict], wall: float) -> dict:
    """The result of one concurrency from its streams (:func:`stream_stats`) and wall time (s):
    tokens per second over all clients, TBT and TTFT p50/p99 in ms, mean tokens per request."""
    gaps = [g for s in streams for g in s["gaps"]]
    ttft = [s["ttft"] for s in streams]
    tokens = sum(s["tokens"] for s in streams)
    return {"clients": clients, "requests": len(streams), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "tokens_per_request": tokens / max(len(streams), 1),
            "token_source": ",".join(sorted({s["source"] for s in streams})),
            "tbt_p50_ms": pct(gaps, 0.5) * 1e3, "tbt_p99_ms": pct(gaps, 0.99) * 1e3,
            "ttft_p50_ms": pct(ttft, 0.5) * 1e3, "ttft_p99_ms": pct(ttft, 0.99) * 1e3}


async def _level(url: str, model: str, clients: int, requests: int, max_tokens: int) -> dict:
    async def client_loop(c: int, client: httpx.AsyncClient):
        out = []
        for r in range(requests):
            q = QUESTIONS[(c + r) % len(QUESTIONS)]
            out.append(await _one(client, url, model, q, c * 1000 + r, max_tokens))
        return out

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        runs = await asyncio.gather(*(client_loop(c, client) for c in range(clients)))
        wall = time.perf_counter() - start
    return level_stats(clients, [s for per_client in runs for s in per_client], wall)


def prompt_tokens(url: str, model: str) -> int | None:
    """The ``usage.prompt_tokens`` of QUESTIONS[0] unstreamed (the chat template's tokens)."""
    reply = httpx.post(url + "/chat/completions", timeout=600,
                       json=request_body(model, QUESTIONS[0], 0, 1, stream=False))
    reply.raise_for_status()
    return reply.json().get("usage", {}).get("prompt_tokens")


def model_id(url: str) -> str:
    """The id of the first model ``url``/models lists (what a request's ``model`` names)."""
    reply = httpx.get(url + "/models", timeout=30)
    reply.raise_for_status()
    return reply.json()["data"][0]["id"]


def measure(url: str, model: str, levels: list[int], args) -> dict:
    """Warm ``url`` up, then ``{"prompt_tokens", "levels": [one result per concurrency]}``."""
    # the first calls of a freshly loaded decoder allocate its buffers: not timed
    asyncio.run(_level(url, model, 2, 1, 4))
    prompt = prompt_tokens(url, model)
    results = []
    for clients in levels:
        results.append(asyncio.run(_level(url, model, clients, args.requests, args.max_tokens)))
        r = results[-1]
        print(f"  {clients:>3} clients: {r['tokens_per_s']:.1f} tokens/s, TBT p99 "
              f"{r['tbt_p99_ms']:.1f} ms", flush=True)
    return {"prompt_tokens": prompt, "levels": results}


def _launch(engine: str, args):
    port = serve_launch.free_port()
    if engine == KILN:
        cmd = serve_launch.kiln_command(args.model, port, max_batch=args.max_batch,
                                        context=args.context, target=args.target,
                                        quantize_weights=args.quantize_weights)
        return serve_launch.launched(cmd, port, {"KILN_NUM_THREADS": str(args.threads)})
    if engine == LLAMA_CPP:
        cmd = serve_launch.llama_cpp_command(args.gguf, port, threads=args.threads,
                                             context=args.context, alias=ALIAS)
        return serve_launch.launched(cmd, port)
    raise SystemExit(f"unknown engine {engine!r} (kiln, llama.cpp)")


def round_order(engines: list[str], round_index: int) -> list[str]:
    """The engines in the order of round ``round_index``: as given, reversed every other round
    (so that neither always runs first on a machine whose load drifts)."""
    return list(engines) if round_index % 2 == 0 else list(reversed(engines))


def best_levels(rounds: dict[str, list[list[dict]]]) -> dict[tuple[str, int], dict]:
    """Per (engine, clients), the result of the round with the highest throughput, from the
    engine → per round → per concurrency results ``rounds``."""
    best: dict[tuple[str, int], dict] = {}
    for engine, per_round in rounds.items():
        for results in per_round:
            for r in results:
                key = (engine, r["clients"])
                if key not in best or r["tokens_per_s"] > best[key]["tokens_per_s"]:
                    best[key] = r
    return best


def throughput_ratio(best: dict, clients: int) -> float | None:
    """Kiln's tokens/s over llama.cpp's at ``clients`` (None when either did not run)."""
    kiln, peer = best.get((KILN, clients)), best.get((LLAMA_CPP, clients))
    return kiln["tokens_per_s"] / peer["tokens_per_s"] if kiln and peer else None


def summary_rows(best: dict, levels: list[int], threads: int) -> list[dict]:
    """A summary row per concurrency Kiln ran at, ``"<C> clients"``: ``kiln_ms`` and
    ``llama_cpp_ms`` are ms per token over all clients (1000 / throughput)."""
    rows = []
    for c in levels:
        kiln, peer = best.get((KILN, c)), best.get((LLAMA_CPP, c))
        if kiln is None:
            continue
        row = {"threads": threads, "kiln_ms": 1e3 / kiln["tokens_per_s"],
               "llama_cpp_ms": 1e3 / peer["tokens_per_s"] if peer else None}
        rows.append(summary.summary_row(f"{c} clients", row, SUMMARY_PEERS))
    return rows


def table(engines: list[str], best: dict, levels: list[int], prompts: dict, args) -> str:
    """The report: a table per engine, then Kiln / llama.cpp throughput per concurrency."""
    lines = [f"serving, {args.threads} thread(s), max_tokens {args.max_tokens}, "
             f"{args.requests} request(s) per client, best of {args.rounds} round(s)", ""]
    for e in engines:
        lines += [f"{e} (prompt tokens of one chat request: {prompts.get(e)})",
                  f"{'clients':>7} {'tokens/s':>9} {'tok/req':>8} {'TBT p50':>8} "
                  f"{'TBT p99':>8} {'TTFT p50':>9} {'TTFT p99':>9}  (ms)"]
        for c in levels:
            r = best.get((e, c))
            if r is not None:
                lines.append(f"{c:>7} {r['tokens_per_s']:>9.1f} {r['tokens_per_request']:>8.1f} "
                             f"{r['tbt_p50_ms']:>8.1f} {r['tbt_p99_ms']:>8.1f} "
                             f"{r['ttft_p50_ms']:>9.1f} {r['ttft_p99_ms']:>9.1f}")
        lines.append("")
    if KILN in engines and LLAMA_CPP in engines:
        lines.append("Kiln / llama.cpp throughput: " + ", ".join(
            f"{c} clients {throughput_ratio(best, c):.2f}" for c in levels
            if throughput_ratio(best, c) is not None))
    return "\n".join(lines)


def _write_summary(best: dict, levels: list[int], args) -> None:
    machine = summary.machine_info() | {"llama_cpp": module_version("llama_cpp")}
    settings = (f"serve.py, target `{args.target}`, {args.threads} thread(s) per engine, Kiln "
                f"max batch {args.max_batch}"
                + (f" {args.quantize_weights} weights" if args.quantize_weights else "")
                + f", {args.requests} request(s) per client of max_tokens {args.max_tokens}, "
                f"best of {args.rounds} round(s); rows in ms per token over all clients "
                "(1000 / tokens per s)")
    path, text = summary.write_summary(
        f"{args.summary}-{args.threads}t", summary_rows(best, levels, args.threads), machine,
        note=args.note, settings=settings, peers=SUMMARY_PEERS)
    print(f"\nsummary (commit it): {path}\n\n{text}")


def main(argv=None) -> int:
    args = parse_args(argv)
    levels = [int(c) for c in args.clients.split(",") if c]
    if args.url:
        url = args.url.rstrip("/")
        result = measure(url, args.model_name or model_id(url), levels, args)
        engines, rounds = [url], {url: [result["levels"]]}
        prompts = {url: result["prompt_tokens"]}
    else:
        engines = [e for e in (args.engines or default_engines()).split(",") if e]
        if LLAMA_CPP in engines and args.gguf is None:
            from kiln.models import smollm2_gguf_path

            args.gguf = str(smollm2_gguf_path())
        rounds, prompts = {e: [] for e in engines}, {}
        for i in range(args.rounds):
            for engine in round_order(engines, i):
                print(f"round {i + 1}: {engine}", flush=True)
                with _launch(engine, args) as url:
                    result = measure(url, model_id(url), levels, args)
                rounds[engine].append(result["levels"])
                prompts[engine] = result["prompt_tokens"]
    best = best_levels(rounds)
    report = table(engines, best, levels, prompts, args)
    print("\n" + report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"settings": vars(args) | {"json": str(args.json)}, "prompt_tokens": prompts,
            "rounds": rounds}
    (out / f"serve-{args.threads}t.md").write_text(report + "\n")
    (out / f"serve-{args.threads}t.json").write_text(json.dumps(data, indent=1) + "\n")
    if args.json:
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    if args.summary and not args.url and KILN in engines:
        _write_summary(best, levels, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
