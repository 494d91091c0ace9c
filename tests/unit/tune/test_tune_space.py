"""Tuning knobs (kiln.schedules.knobs) and spaces (kiln.tune.tasks) without a toolchain: knobs read
the applied config, every candidate of a small conv2d (NCHWc) and dense (dense_pack) computes
the graph's numpy result on the loop-IR interpreter, and the default config lowers exactly
the loop IR of an ordinary build."""

from __future__ import annotations

import pickle
import re

import numpy as np
import onnx
import pytest
from tune_models import conv_model, dense_model, depthwise_model, einsum_model, matmul_model

from kiln.backend.te_compiler import lower_primitive
from kiln.errors import KilnError
from kiln.frontend import from_onnx
from kiln.relay.interpreter import evaluate
from kiln.schedules.knobs import check_config, configured, knob
from kiln.target import Target
from kiln.tir.interpreter import run
from kiln.tir.text import astext
from kiln.tune.measure import kernel_inputs
from kiln.tune.tasks import extract_tasks, lower_candidate

#: AVX-512 (32 registers: pixel blocks are divisors) and AVX2 (16: shifted last blocks)
TARGETS = ["llvm -mcpu=skylake-avx512", "llvm -mcpu=haswell"]


def _task(model: onnx.ModelProto, target: str, tag: str):
    mod, params = from_onnx(model)
    tasks = extract_tasks(mod, params, target)
    found = [t for t in tasks if tag in t.name]
    assert len(found) == 1, [t.name for t in tasks]
    return found[0]


def test_knob_outside_a_tuning_context_is_the_default_and_declares_nothing():
    assert knob("tile_ow", [1, 2, 7], 14) == 14
    with configured("k", {"tile_ow": 7}) as ctx:
        assert knob("tile_ow", [1, 2, 7], 14) == 7
        assert knob("unroll_k", [1, 2], 8) == 8  # not in the config: the default
    assert [k.values for k in ctx.space()] == [(14, 1, 2, 7), (8, 1, 2)]


def test_an_illegal_or_unknown_knob_value_names_the_kernel_and_knob():
    with (pytest.raises(KilnError, match=r"kernel k: knob tile_ow=5 is not legal.*\[14, 1, 2"),
          configured("k", {"tile_ow": 5})):
        knob("tile_ow", [1, 2], 14)
    with configured("k", {"nope": 1}) as ctx:
        knob("tile_ow", [1, 2], 14)
    with pytest.raises(KilnError, match="kernel k: unknown knob.*nope"):
        check_config(ctx)


@pytest.mark.parametrize("target", TARGETS)
def test_conv_space_enumerates_default_first_and_pickles(target):
    task = _task(conv_model(), target, "conv2d_NCHWc")
    names = [k.name for k in task.space]
    assert {"tile_ow", "unroll_ic"} <= set(names)
    configs = list(task.configs())
    assert len(configs) == task.size() > 1
    assert configs[0] == task.default_config()
    assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)
    again = pickle.loads(pickle.dumps(task))
    assert again.key == task.key and again.space == task.space
    assert _text(lower_candidate(again, configs[-1])) == _text(lower_candidate(task, configs[-1]))


def _text(func) -> str:
    """Loop IR text without the numbers of generated names (two lowerings count on)."""
    return re.sub(r"(?<=[A-Za-z])_\d+(?=\b|_)", "_N", astext(func))


def _one_knob_at_a_time(task) -> list[dict]:
    """The default config and each config that changes one knob of it."""
    default = task.default_config()
    return [default] + [{**default, k.name: v} for k in task.space for v in k.values[1:]]


def _check_every_candidate(task, configs=None) -> int:
    payload = task.payload
    inputs = kernel_inputs(payload)
    want = evaluate(payload.body, {p.name: a for p, a in zip(payload.body.params, inputs)})[0]
    texts = set()
    for config in configs or task.configs():
        func = lower_candidate(task, config, packed=False)
        texts.add(_text(func))
        out = np.zeros(want.shape, want.dtype)
        run(func, *inputs, out)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=str(config))
    return len(texts)


@pytest.mark.parametrize("target", TARGETS)
def test_every_conv2d_nchwc_candidate_matches_numpy_on_the_interpreter(target):
    task = _task(conv_model(channels=16, size=4), target, "conv2d_NCHWc")
    assert _check_every_candidate(task) > 1  # the knobs change the loop nest


@pytest.mark.parametrize("target", TARGETS)
def test_every_dense_pack_candidate_matches_numpy_on_the_interpreter(target):
    task = _task(dense_model(), target, "dense_pack")
    assert {"tile_y", "unroll_k"} <= {k.name for k in task.space}
    assert _check_every_candidate(task) > 1


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise_matmul_einsum_candidates_match_numpy_on_the_interpreter(target):
    depthwise = _task(depthwise_model(), target, "depthwise_conv2d_NCHWc")
    assert _check_every_candidate(depthwise) > 1
    matmul = _task(matmul_model(), target, "matmul")
    assert {"tile_y", "unroll_k"} <= {k.name for k in matmul.space}
    assert _check_every_candidate(matmul, _one_knob_at_a_time(matmul)) > 1
    einsum = _task(einsum_model(), target, "einsum")
    assert {"tile_y", "unroll_k"} <= {k.name for k in einsum.space}
    assert _check_every_candidate(einsum, _one_knob_at_a_time(einsum)) > 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("make", [conv_model, dense_model, depthwise_model, matmul_model,
                                  einsum_model])
def test_the_default_config_lowers_the_ordinary_kernel(target, make):
    mod, params = from_onnx(make())
    for task in extract_tasks(mod, params, target, include_untunable=True):
        call = task.payload.call()
        with Target(target):
            plain = _text(lower_primitive(call, task.name))
        assert _text(lower_candidate(task, task.default_config())) == plain
        assert _text(lower_candidate(task, {})) == plain


def _winograd_conv_model() -> onnx.ModelProto:
    """Conv 3x3 (pad 1) + Relu, 16 -> 16 channels at 6x6: a Winograd conv (decision 050)."""
    from onnx import TensorProto, helper, numpy_helper
    from tune_models import one_node_model

    w = np.random.default_rng(3).standard_normal((16, 16, 3, 3)).astype("float32") / 12
    return one_node_model(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 6])],
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6]),
        [numpy_helper.from_array(w, "w")])


@pytest.mark.parametrize("target", TARGETS)
def test_winograd_conv_task_offers_its_gemm_knobs(target):
    """A Winograd conv is its own task; its GEMM's register block (``tile_ow``: tiles a block)
    and input unroll are knobs, and each candidate changing one of them computes the graph's
    result on the interpreter."""
    task = _task(_winograd_conv_model(), target, "conv2d_winograd_NCHWc")
    assert {"tile_ow", "unroll_ic"} <= {k.name for k in task.space}
    assert _check_every_candidate(task, _one_knob_at_a_time(task)) > 1
