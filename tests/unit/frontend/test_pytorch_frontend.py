"""kiln.frontend.from_pytorch on small modules: Kiln without torch, what it rejects, how
torch.export Dims become symbolic dims, both exporters."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kiln.errors import KilnError, UnsupportedOpError


def test_kiln_imports_without_torch():
    """torch is optional: kiln, kiln.frontend and the CLI import with torch unimportable, and
    from_pytorch says how to install it."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # import torch raises ImportError
        import kiln, kiln.frontend, kiln.cli.main
        from kiln.frontend import from_pytorch
        try:
            from_pytorch(object(), ())
        except kiln.KilnError as err:
            print(err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'kiln[torch]'" in out.stdout


torch = pytest.importorskip("torch")

from kiln.frontend import from_pytorch  # noqa: E402
from kiln.frontend.pytorch import dim_bounds, export_reason  # noqa: E402


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(5, 3)

    def forward(self, x, y):
        return torch.relu(self.fc(x)) + y


def test_rejects_what_is_not_a_module_or_a_tensor():
    with pytest.raises(KilnError, match="needs a torch.nn.Module, got function"):
        from_pytorch(lambda x: x, (torch.ones(1),))
    with pytest.raises(KilnError, match=r"example_inputs\[1\] is a int, not a tensor"):
        from_pytorch(Two(), (torch.ones(2, 5), 3))
    with pytest.raises(KilnError, match="unknown exporter 'onnxruntime'"):
        from_pytorch(Two(), (torch.ones(2, 5), torch.ones(2, 3)), exporter="onnxruntime")


def test_dynamic_shapes_naming_an_unknown_input():
    dim = torch.export.Dim("batch")
    with pytest.raises(KilnError, match=r"names input 'z', but the inputs are \['x', 'y'\]"):
        from_pytorch(Two(), (torch.ones(2, 5), torch.ones(2, 3)), {"z": {0: dim}})
    with pytest.raises(KilnError, match="names input 5"):
        from_pytorch(Two(), (torch.ones(2, 5), torch.ones(2, 3)), {5: {0: dim}})


def test_dim_bounds_from_torch_export_dims():
    batch, seq = torch.export.Dim("batch", min=2, max=16), torch.export.Dim("seq")
    shapes = {"x": {0: batch, 1: seq}, 1: (batch, None), "z": None}
    assert dim_bounds(shapes) == {"batch": (2, 16), "seq": (1, None)}
    assert dim_bounds(({0: torch.export.Dim.AUTO},)) == {}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_dims_by_name_and_position_become_one_symbol(exporter):
    """One Dim shared by two inputs, one given by name and one by position, is one Kiln
    symbol with the Dim's bounds, whichever exporter wrote the ONNX model."""
    from kiln.arith import SymVar
    from kiln.relay.interpreter import evaluate

    batch = torch.export.Dim("batch", min=1, max=8)
    model, x, y = Two().eval(), torch.randn(3, 5), torch.randn(3, 3)
    mod, params = from_pytorch(model, (x, y), {"x": {0: batch}, 1: {0: batch}},
                               exporter=exporter)
    func = mod["main"]
    dims = [p.checked_type.shape[0] for p in func.params[:2]]
    assert all(isinstance(d, SymVar) for d in dims) and dims[0] == dims[1]
    assert (dims[0].name, dims[0].lo, dims[0].hi) == ("batch", 1, 8)
    got = evaluate(func, {func.params[0].name: x.numpy(), func.params[1].name: y.numpy(),
                           **params})
    got = got[0] if isinstance(got, (list, tuple)) else got
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(got), model(x, y).numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_export_failure_names_the_exporter_and_the_reason():
    class Histogram(torch.nn.Module):
        def forward(self, x):
            return torch.histc(x, 4)  # aten::histc: no ONNX symbolic

    with pytest.raises(KilnError, match=r"torch.onnx.export \(torchscript\) failed: "
                       r"UnsupportedOperatorError: .*aten::histc"):
        from_pytorch(Histogram(), (torch.rand(8),), exporter="torchscript")


def test_unsupported_onnx_op_raises_the_importers_error():
    class Sampled(torch.nn.Module):
        def forward(self, x):
            return torch.bernoulli(x)

    with pytest.raises(UnsupportedOpError, match="RandomUniformLike"):
        from_pytorch(Sampled(), (torch.rand(4),), exporter="torchscript")


def test_export_reason_is_the_innermost_cause_on_one_line():
    try:
        try:
            raise ValueError("\x1b[96mreal reason\x1b[0m\nmore text")
        except ValueError as inner:
            raise RuntimeError("Failed to export the model") from inner
    except RuntimeError as err:
        assert export_reason(err) == "ValueError: real reason"
