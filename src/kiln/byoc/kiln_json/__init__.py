"""The ``kiln_json`` BYOC backend: partitioned functions as JSON graphs with their weights,
run by ``kiln.runtime.JSONRuntimeModule`` (binary-serializable, type_key ``kiln_json``). The
worked example of a backend whose runtime takes a graph plus weights (TVM's JSON runtime as
used by DNNL and TensorRT); docs/byoc.md walks through it.

What it takes (float32 only):

- composites ``kiln_json.conv2d[_bias][_relu]`` (a convolution with its per-channel bias and
  relu as one kernel);
- ops ``nn.conv2d``, ``nn.dense``, ``nn.matmul``, ``nn.bias_add``, ``add``, ``multiply``,
  ``nn.relu``, ``clip``, ``nn.max_pool2d``, ``nn.global_avg_pool2d``, ``concatenate``,
  ``reshape``.

Weights are bound into the functions (``bind_constants=True``) and reach the runtime through
the const loader: ``__init_<symbol>`` receives them before the first call.
"""

from __future__ import annotations

from kiln.byoc.gemm_composites import GemmComposite, gemm_patterns
from kiln.byoc.kiln_json.codegen import kiln_json_codegen, serialize
from kiln.byoc.registry import (
    register_external_codegen,
    register_op_support,
    register_pattern_table,
)
from kiln.relay.graph import Call

NAME = "kiln_json"
OPS = ("nn.conv2d", "nn.dense", "nn.matmul", "nn.bias_add", "add", "multiply", "nn.relu",
       "clip", "nn.max_pool2d", "nn.global_avg_pool2d", "concatenate", "reshape")


def _float32(call: Call) -> bool:
    """Every input and the output are float32."""
    return all(t.checked_type.dtype == "float32" for t in (*call.args, call))


def _conv_composite(c: GemmComposite) -> bool:
    return all(t.checked_type.dtype == "float32"
               for t in (c.data_arg, c.weight_arg, c.anchor, *([c.bias_arg] if c.bias_arg
                                                               else [])))


@register_pattern_table(NAME)
def pattern_table() -> list[tuple]:
    """``kiln_json.conv2d[_bias][_relu]``."""
    return gemm_patterns(NAME, ["nn.conv2d"], ["nn.relu"], residual=False,
                         check=_conv_composite)


register_op_support(NAME, OPS, _float32)
register_external_codegen(NAME, kiln_json_codegen, bind_constants=True)

__all__ = ["OPS", "kiln_json_codegen", "pattern_table", "serialize"]
