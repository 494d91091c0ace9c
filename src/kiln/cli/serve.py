"""``kiln serve``: an OpenAI-compatible HTTP server for a compiled decoder
(:mod:`kiln.serve`; needs the ``serve`` extra: starlette, uvicorn)."""

from __future__ import annotations

import argparse

from kiln.cli.arguments import positive_int
from kiln.errors import KilnError


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_parser(sub) -> None:
    """Register ``kiln serve`` on the ``kiln`` subparsers."""
    p = sub.add_parser(
        "serve", help="serve a decoder over an OpenAI-compatible HTTP API",
        description="Serve a language model over OpenAI's /v1/chat/completions, "
                    "/v1/completions and /v1/models (streaming too), with continuous "
                    "batching: requests join the running batch between decode steps. "
                    "MODEL: 'smollm2' (SmolLM2-135M-Instruct, fetched and compiled on first "
                    "use), an ONNX decoder (.onnx, compiled and cached) or a VM decoder "
                    "library compiled before (.so).")
    p.add_argument("model", metavar="MODEL", help="smollm2, model.onnx or model.so")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=positive_int, default=8000, help="TCP port (default: 8000)")
    p.add_argument("--max-batch", type=positive_int, default=8,
                   help="sequences decoded together, 1..64 (default: 8)")
    p.add_argument("--queue", type=_non_negative_int, default=64,
                   help="requests that may wait for a free slot; more are answered 429 "
                        "(default: 64)")
    p.add_argument("--context", type=positive_int,
                   help="the most tokens of one sequence, prompt and reply (default: 8192, "
                        "SmolLM2's)")
    p.add_argument("--target", default="llvm -mcpu=native",
                   help="the Kiln target when compiling (default: llvm -mcpu=native)")
    p.add_argument("--quantize-weights", choices=("int8", "q4"),
                   help="weight-only quantization of the matmul weights when compiling")
    p.add_argument("--tokenizer", metavar="GGUF",
                   help="a GGUF file whose tokenizer and chat template to use (default: "
                        "SmolLM2's)")
    p.add_argument("-q", "--quiet", action="store_true", help="no access log")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.max_batch > 64:
        raise KilnError(f"--max-batch must be in 1..64 (the decoder's batch bound), got "
                        f"{args.max_batch}")
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401 (fail here, before the model is compiled)

        from kiln.serve.server import serve
    except ImportError as err:
        raise KilnError(f"kiln serve needs the serve extra (pip install 'kiln[serve]'): "
                        f"{err}") from err
    from kiln.serve.model import load_model

    model = load_model(args.model, args.target, args.quantize_weights, args.tokenizer,
                       args.context)
    print(f"kiln serve: {model.name} on http://{args.host}:{args.port}/v1 (max batch "
          f"{args.max_batch}, queue {args.queue}, context {model.context_length})", flush=True)
    serve(model, args.host, args.port, args.max_batch, args.queue,
          "warning" if args.quiet else "info")
    return 0
