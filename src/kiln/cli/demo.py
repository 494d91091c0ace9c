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
    sampling = p.add_argument_group(
        "chat sampling", "how the reply's tokens are picked (default: sampling with "
        "temperature 0.7, top-p 0.9, top-k 50, repetition penalty 1.1, seed 0: greedy "
        "decoding repeats itself on open prompts); --compare decodes greedily")
    sampling.add_argument("--temperature", type=float, metavar="T",
                          help="divide the logits by T before sampling (default: 0.7; 0: "
                               "greedy)")
    sampling.add_argument("--top-p", type=float, metavar="P",
                          help="sample from the most likely tokens whose probabilities reach P "
                               "(default: 0.9; 1: all)")
    sampling.add_argument("--top-k", type=int, metavar="K",
                          help="sample from the K most likely tokens (default: 50; 0: all)")
    sampling.add_argument("--seed", type=int,
                          help="seed of the sampler: the same seed gives the same reply "
                               "(default: 0)")
    sampling.add_argument("--repetition-penalty", type=float, metavar="R",
                          help="CTRL's penalty on tokens already in the context: positive "
                               "logits divided by R, negative ones multiplied (default: 1.1; "
                               "with --greedy 1: off)")
    sampling.add_argument("--greedy", action="store_true",
                          help="always pick the most likely token (the same as --temperature "
                               "0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=_run)


#: the sampling options, by their attribute names
SAMPLING_OPTIONS = ("temperature", "top_p", "top_k", "seed", "repetition_penalty", "greedy")


def sampling_given(args: argparse.Namespace) -> bool:
    """Whether any sampling option was given (``--temperature 0`` too: compared by identity,
    as ``0 == False``)."""
    return any(getattr(args, n) is not None and getattr(args, n) is not False
               for n in SAMPLING_OPTIONS)


def sampling_config(args: argparse.Namespace):
    """The chat demo's :class:`kiln.llm.SamplingConfig` from the options (None: none given,
    the demo's default, :data:`kiln.demo.chat.DEFAULT_SAMPLING`).

    Raises
    ------
    KilnError
        A negative temperature, ``--greedy`` with a temperature, top-p, top-k or seed (which
        only sampling uses), or a value out of its range (top-p outside (0, 1], top-k < 0, a
        repetition penalty <= 0).
    """
    from kiln.demo.chat import DEFAULT_SAMPLING
    from kiln.llm.sampling import SamplingConfig

    if not sampling_given(args):
        return None
    if args.temperature is not None and args.temperature < 0:
        raise KilnError(f"--temperature must be >= 0 (0: greedy), got {args.temperature}")
    greedy = args.greedy or args.temperature == 0
    if greedy:
        sampled = [f"--{n.replace('_', '-')}" for n in ("top_p", "top_k", "seed")
                   if getattr(args, n) is not None]
        if args.greedy and args.temperature:
            sampled.insert(0, "--temperature")
        if sampled:
            raise KilnError(f"{', '.join(sampled)} set how tokens are sampled; greedy decoding "
                            "(--greedy or --temperature 0) samples nothing")
        penalty = args.repetition_penalty
        return SamplingConfig(repetition_penalty=1.0 if penalty is None else penalty)

    def given(name: str):
        value = getattr(args, name)
        return getattr(DEFAULT_SAMPLING, name) if value is None else value

    return SamplingConfig(do_sample=True, temperature=given("temperature"),
                          top_k=given("top_k"), top_p=given("top_p"), seed=given("seed"),
                          repetition_penalty=given("repetition_penalty"))


def _run(args: argparse.Namespace) -> int:
    import importlib

    if args.text is not None and args.name != "ocr":
        raise KilnError("--text applies to 'kiln demo ocr' only")
    if args.name != "chat" and (args.prompt is not None or args.compare
                                or args.quantize_weights
                                or sampling_given(args)):
        raise KilnError("--prompt, --compare, --quantize-weights and the sampling options "
                        "apply to 'kiln demo chat'")
    chat = {"prompt": args.prompt, "max_new_tokens": args.max_new_tokens,
            "compare": args.compare, "target": args.target,
            "quantize_weights": args.quantize_weights,
            "sampling": sampling_config(args) if args.name == "chat" else None}
    try:
        module = importlib.import_module(f"kiln.demo.{DEMOS[args.name]}")
    except ImportError as err:  # Pillow or onnxruntime missing
        raise KilnError(f"kiln demo needs the demo extra (pip install 'kiln[demo]'): {err}") \
            from err
    extra = {"text": args.text} if args.text is not None else {}
    if args.name == "chat":
        return module.run_demo(**chat)
    return module.run_demo(runs=args.runs, output=args.output, **extra)
