"""``kiln compile``: ONNX file → one shared library, with progress and a one-line summary."""

from __future__ import annotations

import time
from pathlib import Path

from kiln.errors import KilnError


def compile_model(model: str, output: str, target: str = "c",
                  input_shapes: list[tuple[str, tuple[int, ...]]] | None = None,
                  echo=print, byoc: list[str] | None = None,
                  target_host: str | None = None) -> Path:
    """Compile ``model`` for ``target`` and export it to ``output``.

    Parameters
    ----------
    model : str
        Path of the ONNX model.
    output : str
        Library to write: ``.so`` (linked shared object) or ``.tar`` (objects); written
        atomically by ``export_library``.
    target : str
        Kiln target string, e.g. ``"c"``, ``"llvm -mcpu=native"`` or ``"jit"``.
    input_shapes : list of (name, shape), optional
        Static shapes for graph inputs (``--input-shape``). A name the model does not have, or
        a shape that contradicts a fixed-shape input, raises :class:`~kiln.errors.ShapeError`.
    echo : callable
        Receives the summary line.
    byoc : list of str, optional
        External compilers to offload to (``kiln.build``'s ``byoc``), e.g. ``["cblas"]``.
    target_host : str, optional
        The host target (``--target-host``; for ``jit``: ``"c"`` or ``"llvm"``).

    Returns
    -------
    Path
        The written library.

    Raises
    ------
    KilnError
        Bad model file, unsupported op, shape errors, compile or toolchain failures, an
        unknown BYOC compiler.
    """
    import kiln
    from kiln import progress
    from kiln.frontend import from_onnx, load_onnx
    from kiln.target import Target

    tgt = Target(target, host=target_host)

    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in input_shapes or []:
        if name in shapes and shapes[name] != shape:
            raise KilnError(f"--input-shape given twice for {name!r}: {shapes[name]} and {shape}")
        shapes[name] = shape
    out = Path(output)
    if out.parent and not out.parent.exists():
        raise KilnError(f"cannot write {output}: directory {out.parent} does not exist")
    start = time.perf_counter()
    with progress.stage(f"Importing {Path(model).name}"):
        proto = load_onnx(model)
        mod, params = from_onnx(proto, shape=shapes)
    lib = kiln.build(mod, target=tgt, params=params, byoc=list(byoc or []))
    with progress.stage(f"Exporting {out.name}"):
        lib.export_library(str(out))
    size = out.stat().st_size
    offload = f", byoc {','.join(byoc)}" if byoc else ""
    host = f" (host {tgt.host})" if target_host else ""
    echo(f"wrote {out} ({size / 1e6:.1f} MB, target {target}{host}{offload}) "
         f"in {time.perf_counter() - start:.1f} s")
    return out
