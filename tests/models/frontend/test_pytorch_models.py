"""PyTorch models through Kiln, against eager PyTorch: three torchvision CNNs and two tiny
transformers (random weights), each imported with ``kiln.frontend.from_pytorch`` and compiled
with ``torch.compile(backend="kiln")``. Skipped without torch, torchvision or transformers
(``pip install -c constraints.txt -e '.[torch-test]'``)."""

from __future__ import annotations

import logging

import pytest
from backend_helpers import assert_close_to_reference

torch = pytest.importorskip("torch")

import torch_models

MODELS = [*torch_models.CNNS, "bert", "gpt2"]


def build_model(name: str):
    return torch_models.cnn(name) if name in torch_models.CNNS else torch_models.transformer(name)


def eager_outputs(model, args) -> list:
    """The outputs of ``model(*args)`` as numpy arrays, in the exporters' order (a transformers
    ``ModelOutput``'s tensors in field order)."""
    with torch.no_grad():
        out = model(*args)
    if isinstance(out, torch.Tensor):
        out = (out,)
    elif hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t.numpy() for t in out]


@pytest.mark.parametrize("name", MODELS)
def test_from_pytorch_matches_eager(name):
    import kiln
    from kiln.frontend import from_pytorch
    from kiln.graph_executor import GraphModule

    model, args = build_model(name)
    mod, params = from_pytorch(model, args)
    gmod = GraphModule(kiln.build(mod, params=params)["default"](kiln.cpu()))
    for var, arg in zip(mod["main"].params, args):
        gmod.set_input(var.name, arg.numpy())
    gmod.run()
    got = [gmod.get_output(k).numpy() for k in range(gmod.get_num_outputs())]
    assert_close_to_reference(got, eager_outputs(model, args))


@pytest.mark.parametrize("name", MODELS)
def test_torch_compile_kiln_matches_eager(name, caplog):
    import kiln.driver.torch_backend  # noqa: F401  (registers backend="kiln" without the entry point)

    model, args = build_model(name)
    want = eager_outputs(model, args)
    compiled = torch.compile(model, backend="kiln")
    with caplog.at_level(logging.WARNING, logger="kiln"), torch.no_grad():
        out = compiled(*args)
        again = compiled(*args)  # the compiled artifact, called a second time
    assert not [r for r in caplog.records if "runs eagerly" in r.getMessage()], caplog.text
    for result in (out, again):
        tensors = (result,) if isinstance(result, torch.Tensor) else result
        tensors = tensors.to_tuple() if hasattr(tensors, "to_tuple") else tensors
        assert_close_to_reference([t.numpy() for t in tensors], want)


def test_dynamic_shapes_one_artifact_for_two_batch_sizes(tmp_path):
    """A torch.export ``Dim`` on the batch dim becomes a symbolic dim with its bounds: one VM
    library, exported and loaded back, runs batch 1 and batch 3."""
    import kiln
    from kiln.arith import SymVar
    from kiln.frontend import from_pytorch
    from kiln.runtime import VMExecutable, load_module
    from kiln.vm import VirtualMachine

    model, (x,) = torch_models.cnn("squeezenet1_0")
    batch = torch.export.Dim("batch", min=1, max=4)
    mod, params = from_pytorch(model, (x,), dynamic_shapes={"x": {0: batch}})
    dim = mod["main"].params[0].checked_type.shape[0]
    assert isinstance(dim, SymVar) and (dim.name, dim.lo, dim.hi) == ("batch", 1, 4)
    exe = kiln.build(mod, params=params)
    assert isinstance(exe, VMExecutable)
    exe.export_library(str(tmp_path / "squeezenet.so"))
    vm = VirtualMachine(load_module(str(tmp_path / "squeezenet.so")), kiln.cpu())
    for n in (1, 3):
        xs = torch.randn(n, *x.shape[1:], generator=torch.Generator().manual_seed(n))
        got = vm["main"](xs.numpy())
        got = got if isinstance(got, (list, tuple)) else [got]
        assert_close_to_reference([g.numpy() for g in got], eager_outputs(model, (xs,)))


def test_torch_compile_kiln_at_a_second_sequence_length(caplog):
    """At a new sequence length dynamo captures BERT again with a symbolic length; Kiln gives
    the eager result there too (one VM artifact, or per-shape builds where the VM path fails)
    and never runs it eagerly."""
    import kiln.driver.torch_backend  # noqa: F401

    model, (ids,) = torch_models.transformer("bert")
    compiled = torch.compile(model, backend="kiln")
    with caplog.at_level(logging.WARNING, logger="kiln"), torch.no_grad():
        for seq in (16, 24):
            x = torch.randint(0, 1000, (1, seq), generator=torch.Generator().manual_seed(seq))
            got = compiled(x).to_tuple()
            assert_close_to_reference([t.numpy() for t in got], eager_outputs(model, (x,)))
    assert not [r for r in caplog.records if "runs eagerly" in r.getMessage()], caplog.text
