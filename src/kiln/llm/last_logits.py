"""A decoder that computes the logits of the last position only (what generation reads).

A prompt of N tokens runs the LM head — the decoder's largest matrix, ``hidden x vocab`` — over
all N positions, while :func:`kiln.llm.generate` and ``kiln serve`` read the last row
(``logits[:, -1]``; prompts are left-padded, so it is every row's last token). llama.cpp
computes that row only by default (``logits_all`` off). :func:`last_position_logits` rewrites
the ONNX decoder so that its LM head takes ``hidden[:, -1:]``: SmolLM2-135M's 576 x 49152 head
is 21 % of a 512-token prefill's multiply-adds.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

log = logging.getLogger("kiln.llm")

INT64_MAX = np.iinfo(np.int64).max


def last_position_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its first output, ``logits [batch, sequence, vocab]``, computed from the
    last position of the hidden states: ``MatMul(h, W)`` becomes ``MatMul(h[:, -1:], W)`` and
    the output ``[batch, 1, vocab]``.

    A decoder whose logits are not a ``MatMul`` of 3-D hidden states by a 2-D initializer (a
    Gemm, a bias after the head, a transposed head) is returned unchanged (all positions), with
    a debug message: its logits are still right, only not cheaper.

    Parameters
    ----------
    model : onnx.ModelProto
        A decoder of :mod:`kiln.models.llama_onnx`'s interface; not modified.

    Returns
    -------
    onnx.ModelProto
        A copy with the head sliced, or ``model`` itself.
    """
    graph = model.graph
    logits = graph.output[0]
    head = next((n for n in graph.node if logits.name in n.output), None)
    weights = {t.name: t for t in graph.initializer}
    dims = logits.type.tensor_type.shape.dim
    if head is None or head.op_type != "MatMul" or len(dims) != 3 \
            or head.input[1] not in weights or len(weights[head.input[1]].dims) != 2:
        log.debug("%s: the logits are not a MatMul of the hidden states by a 2-D weight; "
                  "computing them at every position", graph.name)
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    at = next(i for i, n in enumerate(graph.node) if logits.name in n.output)
    hidden = graph.node[at].input[0]
    last = f"{hidden}_last_position"
    bounds = {f"{last}_{k}": np.array([v], np.int64)
              for k, v in (("starts", -1), ("ends", INT64_MAX), ("axes", 1))}
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in bounds.items())
    graph.node.insert(at, helper.make_node("Slice", [hidden, *bounds], [last], name=last))
    graph.node[at + 1].input[0] = last
    sequence = graph.output[0].type.tensor_type.shape.dim[1]
    sequence.Clear()
    sequence.dim_value = 1
    return out
