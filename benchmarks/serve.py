"""kiln serve under concurrent streaming clients: throughput and time between tokens.

For each concurrency C of ``--clients`` (default 1, 4, 16), C clients each send ``--requests``
streaming chat requests one after another (``max_tokens`` ``--max-tokens``, sampled with a
seed per request so that replies differ but runs repeat) over raw HTTP (httpx, server-sent
events). Reported per C:

- throughput: completion tokens (the replies' ``usage``) of all clients over the wall time;
- time between tokens (TBT): the gaps between a stream's successive content chunks, p50 and
  p99 over all streams (a chunk may carry more than one token when text was held back);
- time to first token (TTFT), p50 and p99.

Two short untimed requests warm the server up first.

By default the Kiln server runs in this process (``kiln.serve.server.ServerThread``, loopback,
``--max-batch``). ``--url http://127.0.0.1:PORT/v1 --model-name NAME`` measures any other
OpenAI-compatible server instead with the same clients: this is the hook for llama.cpp's server
(``python -m llama_cpp.server --model smollm2.gguf``, llama-cpp-python, not installed here).

    .venv/bin/python benchmarks/serve.py [--model smollm2] [--clients 1,4,16]
                                         [--max-tokens 32] [--requests 2] [--max-batch 16]
                                         [--url URL --model-name NAME] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import httpx

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "Explain what a compiler does.", "Name three colours.", "Why is the sky blue?",
             "Give me a tip for learning Python.", "What is 12 times 7?",
             "Describe a cat in one sentence."]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="kiln serve's MODEL (default: smollm2)")
    p.add_argument("--clients", default="1,4,16", help="concurrencies (default: 1,4,16)")
    p.add_argument("--requests", type=int, default=2, help="requests per client (default: 2)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--quantize-weights", choices=("int8", "q4"))
    p.add_argument("--url", help="an OpenAI-compatible server's base URL (…/v1) instead of "
                                 "starting Kiln's")
    p.add_argument("--model-name", help="the model id to send with --url")
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def _one(client: httpx.AsyncClient, url: str, model: str, question: str, seed: int,
               max_tokens: int) -> tuple[list[float], float, int]:
    body = {"model": model, "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0.7, "top_p": 0.9, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    times, tokens = [], 0
    async with client.stream("POST", url + "/chat/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    gaps = [b - a for a, b in zip(times, times[1:])]
    return gaps, (times[0] - start) if times else float("nan"), tokens


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
    flat = [r for per_client in runs for r in per_client]
    gaps = [g for r in flat for g in r[0]]
    ttft = [r[1] for r in flat]
    tokens = sum(r[2] for r in flat)
    return {"clients": clients, "requests": len(flat), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "tbt_p50_ms": _pct(gaps, 0.5) * 1e3,
            "tbt_p99_ms": _pct(gaps, 0.99) * 1e3, "ttft_p50_ms": _pct(ttft, 0.5) * 1e3,
            "ttft_p99_ms": _pct(ttft, 0.99) * 1e3}


def main(argv=None) -> int:
    args = parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    server = None
    if args.url:
        url, model = args.url.rstrip("/"), args.model_name or args.model
        name = url
    else:
        from kiln.serve.model import load_model
        from kiln.serve.server import ServerThread

        served = load_model(args.model, args.target, args.quantize_weights)
        server = ServerThread(served, max_batch=args.max_batch, max_queue=256).start()
        url, model, name = server.url + "/v1", served.name, f"kiln ({args.target})"
    try:
        # the first calls of a freshly loaded decoder allocate its buffers: not timed
        asyncio.run(_level(url, model, 2, 1, 4))
        results = []
        print(f"{name}, model {model}, max_tokens {args.max_tokens}, {args.requests} "
              "request(s) per client")
        print(f"{'clients':>7} {'tokens/s':>9} {'TBT p50':>9} {'TBT p99':>9} {'TTFT p50':>9} "
              f"{'TTFT p99':>9}  (ms)")
        for clients in levels:
            r = asyncio.run(_level(url, model, clients, args.requests, args.max_tokens))
            results.append(r)
            print(f"{clients:>7} {r['tokens_per_s']:>9.1f} {r['tbt_p50_ms']:>9.1f} "
                  f"{r['tbt_p99_ms']:>9.1f} {r['ttft_p50_ms']:>9.1f} {r['ttft_p99_ms']:>9.1f}",
                  flush=True)
        if server is not None:
            print(f"peak batch {server.scheduler.peak_batch}, decode steps "
                  f"{server.scheduler.steps}")
    finally:
        if server is not None:
            server.stop()
    if args.json:
        args.json.write_text(json.dumps({"server": name, "model": model,
                                         "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
