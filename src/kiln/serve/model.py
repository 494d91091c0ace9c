"""The model a server serves: a decoder, its tokenizer and chat template, its context length.

``kiln serve smollm2`` is the built-in SmolLM2-135M-Instruct (fetched, converted and compiled
as ``kiln demo chat`` does); ``kiln serve model.onnx`` compiles an ONNX decoder of
:mod:`kiln.models.llama_onnx`'s interface (cached, :func:`kiln.llm.kiln_decoder`); ``kiln serve
model.so`` loads a VM decoder library compiled before (``compiled_decoder_path``'s output, or
``kiln compile --executor vm`` of such a decoder with the dims of
:data:`kiln.llm.decoder.DIM_BOUNDS`). The last two take the tokenizer of a GGUF file
(``--tokenizer``; default: SmolLM2's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kiln.errors import KilnError
from kiln.llm.decoder import DIM_BOUNDS, Decoder


class Tokenizer(Protocol):
    """What the server needs of a tokenizer (:class:`kiln.models.gguf_tokenizer.ChatTokenizer`
    has it)."""

    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str: ...


@dataclass
class ServedModel:
    """One model behind the API.

    Attributes
    ----------
    name : str
        The ``model`` id clients send (``/v1/models`` lists it).
    decoder : Decoder
    tokenizer : Tokenizer
    context_length : int
        The most tokens (prompt + reply) of one sequence.
    """

    name: str
    decoder: Decoder
    tokenizer: Any
    context_length: int


#: SmolLM2-135M-Instruct's context (its GGUF's llama.context_length)
SMOLLM2_CONTEXT = 8192


def load_model(model: str, target: str = "llvm -mcpu=native",
               quantize_weights: str | None = None, tokenizer: str | None = None,
               context_length: int | None = None) -> ServedModel:
    """The :class:`ServedModel` of ``kiln serve MODEL``.

    Raises
    ------
    KilnError
        If ``model`` is neither ``smollm2`` nor an existing ``.onnx``/``.so`` file, or it
        cannot be fetched, compiled or loaded.
    """
    from kiln.llm import kiln_decoder
    from kiln.models import smollm2, smollm2_tokenizer
    from kiln.models.gguf_tokenizer import ChatTokenizer

    limit = DIM_BOUNDS["past"][1]
    context = min(context_length or SMOLLM2_CONTEXT, limit)
    tok = ChatTokenizer(Path(tokenizer)) if tokenizer else None
    if model == "smollm2":
        dec = kiln_decoder(smollm2(), target, quantize_weights, last_logits=True)
        return ServedModel("smollm2-135m-instruct", dec, tok or smollm2_tokenizer(), context)
    path = Path(model)
    if not path.is_file():
        raise KilnError(f"{model}: not 'smollm2' and no such file")
    if path.suffix == ".onnx":
        dec = kiln_decoder(path, target, quantize_weights, last_logits=True)
    elif path.suffix == ".so":
        if quantize_weights:
            raise KilnError(f"{model}: --quantize-weights applies when compiling; this "
                            "library is compiled already")
        dec = vm_decoder(path)
    else:
        raise KilnError(f"{model}: expected an ONNX decoder (.onnx) or a VM library (.so)")
    return ServedModel(path.stem, dec, tok or smollm2_tokenizer(), context)


def vm_decoder(path: Path) -> Decoder:
    """A :class:`Decoder` over a VM library compiled before (what :func:`kiln.llm.kiln_decoder`
    does after compiling).

    Raises
    ------
    KilnError
        If the library cannot be loaded or its ``main`` is not a decoder's.
    """
    from kiln.runtime import cpu, load_module
    from kiln.vm import VirtualMachine

    vm = VirtualMachine(load_module(str(path)), cpu())
    exe = vm.module.exe
    if "main" not in exe.func_index:
        raise KilnError(f"{path}: a VM library with a 'main' function expected")
    params = exe.functions[exe.func_index["main"]].params
    names = [p.name for p in params]
    if names[:3] != ["input_ids", "attention_mask", "position_ids"] or len(names) < 5:
        raise KilnError(f"{path}: 'main' takes {names[:4]}..., not a decoder's input_ids, "
                        "attention_mask, position_ids, past_key_values.*")
    dims = params[3].dims
    if len(dims) != 4 or not all(isinstance(d, int) for d in dims[2:]):
        raise KilnError(f"{path}: cache input {names[3]} has dims {list(dims)}, expected "
                        "[past, batch, heads, head_dim]")
    main = vm["main"]
    return Decoder(lambda inputs: main(*inputs), names, (int(dims[2]), int(dims[3])), "kiln")
