"""``kiln demo``: the command-line side of the demos in :mod:`kiln.demo` (which need the
``demo`` extra: Pillow, onnxruntime)."""

from __future__ import annotations

import argparse

from kiln.cli.arguments import positive_int
from kiln.errors import KilnError

#: ``kiln demo NAME`` → its module in kiln.demo
DEMOS = {"orientation": "orientation", "embed": "embed", "ocr": "ocr", "chat": "chat"}


def add_parser(sub) -> None:
    """Register ``kiln demo`` on the ``kiln`` subparsers."""
    p = sub.add_parser("demo", help="compile a real model and check it against onnxruntime",
                       description="orientation (default): PP-LCNet text orientation on a "
                                   "rendered page turned 0/90/180/270°; embed: MiniLM-L3 "
                                   "sentence embeddings, cosine similarities; ocr: PP-OCRv4 "
                                   "detection and recognition of a rendered line of text; "
                                   "chat: SmolLM2-135M-Instruct replying to a prompt. "
                                   "Each is compiled with Kiln and compared with onnxruntime.")
    p.add_argument("name", nargs="?", default="orientation", choices=DEMOS,
                   help="which demo (default: orientation)")
    p.add_argument("--runs", type=positive_int, default=5,
                   help="timed runs per image (median shown; default: 5)")
    p.add_argument("-o", "--output", help="keep the compiled library at this path (ocr: a "
                                          "folder for its two libraries)")
    p.add_argument("--text", help="ocr: the line of text to render and read")
    p.add_argument("--prompt", help="chat: the user's message (default: 'What is the capital "
                                    "of France?')")
    p.add_argument("--max-new-tokens", type=positive_int, default=64,
                   help="chat: the most tokens to generate (default: 64)")
    p.add_argument("--compare", action="store_true",
                   help="chat: also generate with onnxruntime and compare the token ids")
    p.add_argument("--target", default="llvm -mcpu=native",
                   help="chat: the Kiln target (default: llvm -mcpu=native)")
    p.add_argument("--quantize-weights", choices=("int8", "q4"),
                   help="chat: weight-only quantization of the matmul weights")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import importlib

    if args.text is not None and args.name != "ocr":
        raise KilnError("--text applies to 'kiln demo ocr' only")
    chat = {"prompt": args.prompt, "max_new_tokens": args.max_new_tokens,
            "compare": args.compare, "target": args.target,
            "quantize_weights": args.quantize_weights}
    if args.name != "chat" and (args.prompt is not None or args.compare
                                or args.quantize_weights):
        raise KilnError("--prompt, --compare and --quantize-weights apply to 'kiln demo chat'")
    try:
        module = importlib.import_module(f"kiln.demo.{DEMOS[args.name]}")
    except ImportError as err:  # Pillow or onnxruntime missing
        raise KilnError(f"kiln demo needs the demo extra (pip install 'kiln[demo]'): {err}") \
            from err
    extra = {"text": args.text} if args.text is not None else {}
    if args.name == "chat":
        return module.run_demo(**chat)
    return module.run_demo(runs=args.runs, output=args.output, **extra)
