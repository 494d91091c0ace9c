"""The ``cblas`` BYOC backend: GEMM composites on OpenBLAS (DSO-exportable C source, type_key
``c``; TVM's counterpart is the ``cblas`` contrib library, src/runtime/contrib/cblas/).

What it takes (pattern table, largest first): ``nn.conv2d`` (any groups but depthwise, which
Kiln's own schedule runs better), ``nn.dense``, ``nn.matmul`` (2-D, or batched with each
operand either batched like the output or not batched at all: ``batch_matmul``), each optionally
followed by a per-channel bias (``nn.bias_add`` or ``add`` of a ``[C,1,1]`` / ``[N]`` tensor), a
residual ``add`` of a tensor of the output's shape (conv2d) and one of ``nn.relu``, ``clip``,
``hardswish``; all float32. Weights are not bound into the functions (``bind_constants=False``):
they reach the C functions as graph params, so no const loader is needed.

Needs OpenBLAS at build time (``pkg-config --libs openblas``: a :class:`ToolchainError` names
what to install) and at load time (the exported library links it dynamically).
"""

from __future__ import annotations

from kiln.byoc.cblas.codegen import cblas_codegen, openblas_link_flags
from kiln.byoc.gemm_composites import ACTIVATIONS, ANCHORS, GemmComposite, gemm_patterns
from kiln.byoc.registry import register_external_codegen, register_pattern_table

NAME = "cblas"


def supported(c: GemmComposite) -> bool:
    """Whether cblas takes composite ``c`` (float32; conv2d not depthwise; matmul batches as
    described in the module doc)."""
    tensors = [c.data_arg, c.weight_arg, c.anchor]
    tensors += [t for t in (c.bias_arg, c.residual_arg) if t is not None]
    if any(t.checked_type.dtype != "float32" for t in tensors):
        return False
    if c.kind == "conv2d":
        channels, groups = c.data_arg.checked_type.shape[1], c.anchor.attrs["groups"]
        return groups == 1 or channels // groups > 1
    if c.kind in ("matmul", "batch_matmul"):
        out_batch = c.out_type.shape[:-2]
        for t in (c.data_arg, c.weight_arg):
            batch = t.checked_type.shape[:-2]
            padded = (1,) * (len(out_batch) - len(batch)) + tuple(batch)
            if any(d != 1 for d in batch) and padded != out_batch:
                return False
    return True


@register_pattern_table(NAME)
def pattern_table() -> list[tuple]:
    """cblas's composites: ``cblas.<anchor>[_bias][_add][_<activation>]``."""
    return gemm_patterns(NAME, ANCHORS, ACTIVATIONS, residual=True, check=supported)


register_external_codegen(NAME, cblas_codegen, bind_constants=False)

__all__ = ["cblas_codegen", "openblas_link_flags", "pattern_table", "supported"]
