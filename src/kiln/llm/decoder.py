"""A causal language model as one step function over its key/value cache, run by Kiln's VM or
by onnxruntime.

A :class:`Decoder` runs the ONNX decoder interface of :mod:`kiln.models.llama_onnx`: inputs
``input_ids``, ``attention_mask``, ``position_ids`` and ``past_key_values.{i}.key/value``
(sequence-major ``[past, batch, G, D]``), outputs ``logits`` then ``present.{i}.key/value``.
The same call serves prompt processing (``past = 0``, any length) and decoding (one token).

:func:`kiln_decoder` compiles the ONNX file once per (model content, target, weight
quantization, Kiln source) into one VM library, cached in ``$KILN_CACHE_DIR/llm`` (bounded by
``KILN_CACHE_MAX_SIZE`` with Kiln's other caches of compiled code, least recently used first:
:mod:`kiln.runtime.toolchain.cache_limit`); loading it again takes a second. :func:`ort_decoder` is
the
onnxruntime reference on the same file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError

#: the symbolic dims of the decoder's inputs and their bounds (``from_onnx``'s dim_bounds);
#: ``past`` starts at 0 (the prompt), ``attention_mask`` spans past + sequence
DIM_BOUNDS = {"past": (0, 8192), "sequence": (1, 8192), "batch": (1, 64)}
MASK_SHAPE = ("batch", "past+sequence")


@dataclass
class Decoder:
    """One step of a causal LM.

    Attributes
    ----------
    run : callable
        ``run(inputs) -> outputs``: inputs in :attr:`input_names` order, outputs logits then
        the present cache tensors (numpy arrays or NDArrays).
    input_names : list of str
    kv_shape : tuple of int
        ``(G, D)``: key/value heads and head dim of every cache tensor.
    engine : str
        ``"kiln"`` or ``"onnxruntime"``.
    vm : kiln.vm.VirtualMachine or None
        The VM running Kiln's step (its ``replay_stats()`` say whether decode steps replay
        their trace or are interpreted; ``profile()`` times each kernel); None otherwise.
    """

    run: Callable[[list[Any]], Sequence[Any]]
    input_names: list[str]
    kv_shape: tuple[int, int]
    engine: str
    vm: Any = None

    @property
    def num_cache_tensors(self) -> int:
        return len(self.input_names) - 3

    def empty_cache(self, batch: int) -> list[np.ndarray]:
        """The cache before the prompt: ``[0, batch, G, D]`` float32 per tensor."""
        return [np.zeros((0, batch, *self.kv_shape), np.float32)
                for _ in range(self.num_cache_tensors)]

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 position_ids: np.ndarray, past: list[Any]) -> tuple[np.ndarray, list[Any]]:
        """Logits ``[batch, sequence, vocab]`` (``[batch, 1, vocab]`` from a decoder compiled with
        ``last_logits``; numpy float32) and the present cache (``past``
        with the new tokens appended, in the engine's own arrays: pass them back as is)."""
        out = self.run([input_ids, attention_mask, position_ids, *past])
        return np.asarray(out[0]), list(out[1:])


def _kv_shape(dims: Sequence[Any], where: str) -> tuple[int, int]:
    if len(dims) != 4 or not all(isinstance(d, int) for d in dims[2:]):
        raise KilnError(f"{where}: a cache input must be [past, batch, heads, head_dim] with "
                        f"static heads and head_dim, got {list(dims)}")
    return int(dims[2]), int(dims[3])


def ort_decoder(model_path: Path, threads: int = 1) -> Decoder:
    """The onnxruntime reference (CPU provider, ``threads`` intra-op threads, no spinning)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    kv = _kv_shape(sess.get_inputs()[3].shape, str(model_path))
    return Decoder(lambda inputs: sess.run(None, dict(zip(names, inputs))), names, kv,
                   "onnxruntime")


def _source_digest() -> str:
    """SHA-256 over Kiln's own source files: a compiled decoder is reused only by the code
    that built it."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.suffix in (".py", ".c", ".h") and f.is_file():
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def compiled_decoder_path(model_path: Path, target: str,
                          quantize_weights: str | None = None,
                          last_logits: bool = False) -> Path:
    """The cached VM library of ``model_path`` for ``target``, compiled on first use (with
    ``last_logits``, of the decoder whose logits are the last position's only, ``[batch, 1,
    vocab]``: :func:`kiln.llm.last_logits.last_position_logits`). A hit
    refreshes the library's modification time; a compile may trim the caches to
    ``KILN_CACHE_MAX_SIZE`` (the libraries of older Kiln sources go first, being least
    recently used).

    Raises
    ------
    KilnError
        If the model cannot be imported or compiled, or ``KILN_CACHE_MAX_SIZE`` is not a size.
    """
    from kiln.models.fetch import file_lock
    from kiln.runtime.toolchain import cache_limit
    from kiln.runtime.toolchain.private_dir import private_dir, user_cache_dir

    key = hashlib.sha256(":".join([_file_digest(model_path), target, str(quantize_weights),
                                   *(["last_logits"] if last_logits else []),
                                   _source_digest()]).encode()).hexdigest()[:20]
    root = private_dir(user_cache_dir() / "llm", "llm cache")
    path = root / f"{model_path.stem}-{key}.so"
    if path.exists():
        cache_limit.touch(path)
        return path
    with file_lock(root / f".{key}.lock"):
        if path.exists():
            cache_limit.touch(path)
            return path
        _compile(model_path, target, quantize_weights, last_logits, path)
    cache_limit.note_stored(path)
    return path


def _compile(model_path: Path, target: str, quantize_weights: str | None, last_logits: bool,
             path: Path) -> None:
    import tempfile

    from kiln import progress
    from kiln.driver.build_module import build
    from kiln.frontend import from_onnx, load_onnx
    from kiln.llm.last_logits import last_position_logits

    with progress.stage(f"Importing {model_path.name}"):
        model = load_onnx(str(model_path))
        if last_logits:
            model = last_position_logits(model)
        mod, params = from_onnx(model, shape={"attention_mask": MASK_SHAPE},
                                dim_bounds=DIM_BOUNDS)
    options = {"quantize_weights": quantize_weights} if quantize_weights else {}
    exe = build(mod, target=target, params=params, executor="vm", **options)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        staged = Path(tmp) / path.name
        with progress.stage(f"Exporting {path.name}"):
            exe.export_library(str(staged))
        staged.replace(path)


def kiln_decoder(model_path: Path, target: str = "llvm -mcpu=native",
                 quantize_weights: str | None = None, last_logits: bool = False) -> Decoder:
    """The decoder compiled by Kiln for the VM (cached: see :func:`compiled_decoder_path`).

    Parameters
    ----------
    model_path : Path
        The ONNX decoder.
    target : str
        A Kiln target (``"llvm -mcpu=native"``, ``"c"``, ``"jit"``, ...).
    quantize_weights : {None, "int8", "q4"}
        Weight-only quantization of the matmul weights, dequantized inside the kernels.
    last_logits : bool
        Logits of the last position only, ``[batch, 1, vocab]`` (what generation reads: a
        prompt skips the LM head at its other positions). The cache outputs are unchanged.
    """
    from kiln.runtime import cpu, load_module
    from kiln.vm import VirtualMachine

    lib = load_module(str(compiled_decoder_path(model_path, target, quantize_weights,
                                                last_logits)))
    vm = VirtualMachine(lib, cpu())
    main = vm["main"]
    exe = vm.module.exe
    params = exe.functions[exe.func_index["main"]].params
    names = [p.name for p in params]
    kv = _kv_shape(params[3].dims, str(model_path))

    def run(inputs: list[Any]) -> Sequence[Any]:
        return main(*inputs)

    return Decoder(run, names, kv, "kiln", vm)
