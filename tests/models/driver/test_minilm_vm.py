"""paraphrase-MiniLM-L3-v2 with symbolic (batch_size, sequence_length): one VM artifact per target
runs every shape and matches onnxruntime; bad shapes are errors naming the input, dim and symbol.

Sentences are tokenized unpadded by Kiln's WordPiece tokenizer where a shape fits one; longer
shapes use random token ids (any id is a valid input)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.demo.wordpiece import WordPiece
from kiln.errors import KilnError, ShapeError
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine

SHAPES = [(1, 1), (1, 7), (1, 128), (4, 33), (2, 384)]
TARGETS = {"c": "c", "llvm": "llvm -mcpu=native", "jit": "jit"}
JIT_SHAPES = [(1, 7), (4, 33)]
BOUNDS = {"sequence_length": (1, 512)}  # its position table has 512 rows


@pytest.fixture(scope="module")
def minilm_path(wheel_file):
    return wheel_file("minilm_l3")


def _compile(path, target: str, build_once) -> VirtualMachine:
    """The model's VM for ``target``: compiled and exported once per session (``build_once``:
    every fixture, module setup and xdist worker asking for the same target shares the
    library), loaded by each caller."""

    def build(folder):
        mod, params = from_onnx(onnx.load(path), dim_bounds=BOUNDS)
        exe = kiln.build(mod, target=TARGETS[target], params=params)
        assert isinstance(exe, kiln.runtime.VMExecutable)
        exe.export_library(str(folder / "minilm.so"))

    out = build_once(f"minilm-vm-{target}", build) / "minilm.so"
    return VirtualMachine(kiln.runtime.load_module(str(out)), kiln.cpu())


@pytest.fixture(scope="module", params=list(TARGETS))
def vm(request, minilm_path, build_once):
    vm = _compile(minilm_path, request.param, build_once)
    vm.target = request.param
    return vm


def _inputs(batch: int, seq: int, tokenizer: WordPiece) -> dict[str, np.ndarray]:
    if (batch, seq) == (1, 7):  # a real sentence of exactly 7 tokens, unpadded
        ids, mask = tokenizer.encode("Kiln compiles every length.", 7)
        assert mask.all()
        return {"input_ids": ids[None], "attention_mask": mask[None]}
    rng = np.random.default_rng(batch * 1000 + seq)
    ids = rng.integers(1000, 30000, (batch, seq)).astype("int64")
    mask = np.ones((batch, seq), "int64")
    mask[-1, seq // 2 + 1:] = 0  # a padded row: the mask matters
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def tokenizer(wheel_file) -> WordPiece:
    return WordPiece(wheel_file("bert_uncased_vocab"))


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{s}" for b, s in SHAPES])
def test_one_artifact_matches_onnxruntime_at_every_shape(vm, shape, tokenizer, minilm_path,
                                                         reference):
    if vm.target == "jit" and shape not in JIT_SHAPES:
        pytest.skip("the jit artifact runs the same kernels as c: two shapes suffice")
    inputs = _inputs(*shape, tokenizer)
    got = vm["main"](inputs["input_ids"], inputs["attention_mask"])
    want = reference(minilm_path, inputs)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        g = g.numpy()
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


@pytest.fixture(scope="module")
def vm_c(minilm_path, build_once):
    """The c target's VM (the library ``vm["c"]`` runs)."""
    return _compile(minilm_path, "c", build_once)


def test_symbol_conflict_names_input_dim_and_symbol(vm_c):
    ids = np.ones((1, 10), "int64")
    with pytest.raises(ShapeError, match=r"attention_mask.*dim 1.*sequence_length"):
        vm_c["main"](ids, np.ones((1, 12), "int64"))


def test_dims_outside_bounds_rank_and_dtype_are_errors(vm_c):
    with pytest.raises(ShapeError, match="sequence_length"):
        vm_c["main"](np.ones((1, 600), "int64"), np.ones((1, 600), "int64"))
    with pytest.raises(ShapeError, match="sequence_length"):  # symbols are >= 1 by default
        vm_c["main"](np.ones((1, 0), "int64"), np.ones((1, 0), "int64"))
    with pytest.raises(KilnError, match="input_ids"):
        vm_c["main"](np.ones((1, 2, 3), "int64"), np.ones((1, 2), "int64"))
    with pytest.raises(KilnError, match="input_ids"):
        vm_c["main"](np.ones((1, 4), "float32"), np.ones((1, 4), "int64"))


def test_memory_stays_bounded_over_varying_shapes(vm_c):
    rng = np.random.default_rng(3)
    vm_c["main"](np.ones((1, 384), "int64"), np.ones((1, 384), "int64"))
    peak = vm_c.memory_stats()
    for seq in rng.integers(1, 385, 40):
        ids = rng.integers(1000, 30000, (1, int(seq))).astype("int64")
        vm_c["main"](ids, np.ones_like(ids))
    after = vm_c.memory_stats()
    assert after == peak, (peak, after)


def test_the_assumed_import_is_the_declared_one(minilm_path):
    """No flags give the graph ``--dim sequence_length=1..512`` gives: the same symbols in
    every type, so the same kernels (the declaration only skips the second walk)."""
    model = onnx.load(minilm_path)
    assumed, _ = from_onnx(model)
    declared, _ = from_onnx(model, dim_bounds=BOUNDS)
    assert declared["main"].attrs["assumptions"] == ()
    for a, d in zip(assumed["main"].params + assumed["main"].outputs,
                    declared["main"].params + declared["main"].outputs):
        assert a.checked_type == d.checked_type


@pytest.fixture(scope="module")
def vm_assumed(minilm_path, build_once):
    """The model compiled with no declaration at all, for the default target: the importer
    assumes ``sequence_length <= 512`` (its position table) and the VM checks it."""

    def build(folder):
        mod, params = from_onnx(onnx.load(minilm_path))
        made = mod["main"].attrs["assumptions"]
        assert [a.relation() for a in made] == ["sequence_length <= 512"], made
        exe = kiln.build(mod, params=params)
        assert isinstance(exe, kiln.runtime.VMExecutable)
        exe.export_library(str(folder / "minilm.so"))

    out = build_once("minilm-vm-assumed", build) / "minilm.so"
    return VirtualMachine(kiln.runtime.load_module(str(out)), kiln.cpu())


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{s}" for b, s in SHAPES])
def test_no_declaration_one_artifact_matches_onnxruntime(vm_assumed, shape, tokenizer,
                                                         minilm_path, reference):
    inputs = _inputs(*shape, tokenizer)
    got = vm_assumed["main"](inputs["input_ids"], inputs["attention_mask"])
    want = reference(minilm_path, inputs)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert g.numpy().shape == w.shape
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=2e-5)


def test_no_declaration_a_length_the_table_cannot_take_is_a_shape_error(vm_assumed):
    with pytest.raises(ShapeError, match=r"input 'input_ids' dim 1: symbol sequence_length = 600 "
                                         r"is outside its bounds \[1, 512\] \(needs "
                                         r"sequence_length <= 512\)"):
        vm_assumed["main"](np.ones((1, 600), "int64"), np.ones((1, 600), "int64"))
    with pytest.raises(ShapeError, match=r"attention_mask.*dim 1.*sequence_length"):
        vm_assumed["main"](np.ones((1, 9), "int64"), np.ones((1, 10), "int64"))
