"""``torch.compile(backend="kiln")`` on small modules: what falls back to eager PyTorch (with one
log line) and still gives the eager result, graphs dynamo makes dynamic, the zero-copy outputs,
the compile cache, the entry point. Skipped without torch."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from kiln.driver import torch_artifacts, torch_backend  # noqa: E402, F401  (backend="kiln")


def eager_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "kiln" and "runs eagerly" in r.getMessage()]


class Mlp(torch.nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(width, 32), torch.nn.Linear(32, width)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Sampled(torch.nn.Module):
    """Bernoulli, whose ONNX function body draws with RandomUniformLike: no Kiln converter.
    ``p = 1`` makes the eager result deterministic."""

    def forward(self, x):
        return torch.relu(x) * torch.bernoulli(torch.ones_like(x))


class WritesInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # each test's graphs reach the backend (no cached dynamo frames)
    yield
    torch._dynamo.reset()


def test_op_kiln_lacks_falls_back_with_a_log_line(caplog):
    x = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="kiln"), torch.no_grad():
        got = torch.compile(Sampled(), backend="kiln")(x)
    assert torch.equal(got, torch.relu(x))
    (line,) = eager_warnings(caplog)
    assert "RandomUniformLike" in line and "UnsupportedOpError" in line, line


def test_write_into_an_input_falls_back_and_keeps_eager_semantics(caplog):
    x = torch.randn(4, 8)
    before = x.clone()
    with caplog.at_level(logging.WARNING, logger="kiln"), torch.no_grad():
        got = torch.compile(WritesInput(), backend="kiln")(x)
    assert torch.equal(x, before + 1), "the input is written once, as eagerly"
    assert torch.equal(got, (before + 1) * 2)
    (line,) = eager_warnings(caplog)
    assert "add_" in line and "in place" in line, line


def test_training_batch_norm_falls_back(caplog):
    """Batch norm in training mode updates its buffers (dynamo writes num_batches_tracked with
    add_ first): eager PyTorch runs it and the running statistics move as they do eagerly."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    eager = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    eager.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 8, 8)
    with caplog.at_level(logging.WARNING, logger="kiln"), torch.no_grad():
        got = torch.compile(model, backend="kiln")(x)
        want = eager(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(model[1].running_mean, eager[1].running_mean)
    assert not torch.equal(model[1].running_mean, torch.zeros(4))
    assert any("in place" in m or "running statistics" in m for m in eager_warnings(caplog)), (
        caplog.text)


def test_grad_mode_falls_back_and_keeps_autograd(caplog):
    model, x = Mlp(), torch.randn(3, 16)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        got = torch.compile(model, backend="kiln")(x)
    got.sum().backward()  # eager PyTorch ran it: a graph for autograd
    assert model.fc1.weight.grad is not None
    torch.testing.assert_close(got, model(x))
    assert any("torch.no_grad()" in m for m in eager_warnings(caplog)), caplog.text


def test_outputs_are_fresh_tensors_and_feed_back_as_inputs(caplog):
    """The kernels write each call's outputs into new tensors: an earlier result stays
    valid, and a result can be the next call's input (its memory is no output any more)."""
    model = Mlp().eval()
    compiled = torch.compile(model, backend="kiln")
    x1, x2 = torch.randn(3, 16), torch.randn(3, 16)
    with caplog.at_level(logging.WARNING, logger="kiln"), torch.no_grad():
        y1 = compiled(x1)
        y2 = compiled(x2)
        y3 = compiled(y2)
        want1, want3 = model(x1), model(model(x2))
    assert not eager_warnings(caplog), caplog.text
    assert y1.data_ptr() != y2.data_ptr()
    torch.testing.assert_close(y1, want1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(y3, want3, rtol=1e-4, atol=1e-5)


def test_non_contiguous_and_offset_inputs_are_copied():
    model = Mlp().eval()
    compiled = torch.compile(model, backend="kiln")
    base = torch.randn(17, 3)
    with torch.no_grad():
        compiled(torch.randn(3, 16))
        strided = base[1:].t()  # (3, 16), transposed and off the storage's start
        torch.testing.assert_close(compiled(strided), model(strided), rtol=1e-4, atol=1e-5)


def count_builds(monkeypatch) -> list:
    """The ``kiln.build`` calls from now on (one per artifact the backend builds)."""
    import kiln.driver.build_module as build_module

    torch_artifacts.clear_cache()
    calls = []
    real_build = build_module.build
    monkeypatch.setattr(build_module, "build", lambda *a, **k: calls.append(k.get("executor"))
                        or real_build(*a, **k))
    return calls


def test_dynamic_batch_is_one_vm_artifact(caplog, monkeypatch):
    """Dynamo makes the batch dim symbolic at the second size: Kiln builds one VM artifact for
    it (the symbol's range from dynamo's shape environment), which runs every later size."""
    builds = count_builds(monkeypatch)
    model = Mlp().eval()
    compiled = torch.compile(model, backend="kiln")
    with caplog.at_level(logging.INFO, logger="kiln"), torch.no_grad():
        for n in (2, 5, 7, 64):
            x = torch.randn(n, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert not eager_warnings(caplog), caplog.text
    assert builds == ["graph", "vm"], caplog.text


def test_dynamic_graph_the_vm_cannot_take_compiles_per_shape(caplog, monkeypatch):
    """A symbolic int input that is no tensor's size (dynamo makes an int argument dynamic):
    no VM artifact, a static one per value on first use, a value seen before compiles
    nothing."""
    builds = count_builds(monkeypatch)

    class Scale(torch.nn.Module):
        def forward(self, x, k: int):
            return torch.relu(x) * k

    compiled = torch.compile(Scale(), backend="kiln")
    x = torch.randn(3, 4)
    with caplog.at_level(logging.INFO, logger="kiln"), torch.no_grad():
        for k in (2, 3, 3, 4):
            torch.testing.assert_close(compiled(x, k), torch.relu(x) * k)
    assert not eager_warnings(caplog), caplog.text
    assert "compiling per shape" in caplog.text
    assert builds == ["graph"] * 3


def test_same_graph_compiles_once(monkeypatch):
    """Artifacts are cached by the ONNX model's content: a graph dynamo hands over again
    (after a reset) is not rebuilt."""
    builds = count_builds(monkeypatch)
    model, x = Mlp(8).eval(), torch.randn(2, 8)
    with torch.no_grad():
        first = torch.compile(model, backend="kiln")(x)
        torch._dynamo.reset()
        second = torch.compile(model, backend="kiln")(x)
    torch.testing.assert_close(first, second)
    assert builds == ["graph"]


def test_backend_is_listed_under_its_name():
    assert "kiln" in torch._dynamo.list_backends(exclude_tags=())


def test_entry_point_needs_no_import_of_kiln(tmp_path):
    """pyproject.toml's ``torch_dynamo_backends`` entry point, installed as pip installs it (a
    ``.dist-info`` folder on sys.path), lets ``backend="kiln"`` find the backend in a fresh
    interpreter that never imports Kiln itself."""
    import os
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    group = project["entry-points"]["torch_dynamo_backends"]
    assert group == {"kiln": "kiln.driver.torch_backend:kiln_backend"}
    info = tmp_path / "kiln_entry_points-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-entry-points\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\n" + "".join(f"{k} = {v}\n" for k, v in group.items()))
    code = textwrap.dedent("""
        import sys, torch
        m = torch.nn.Linear(4, 2).eval()
        x = torch.randn(3, 4)
        with torch.no_grad():
            y = torch.compile(m, backend="kiln")(x)
            torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-5)
        print(torch._dynamo.lookup_backend("kiln").__module__)
    """)
    path = os.pathsep.join([str(tmp_path), str(root / "src"), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "kiln.driver.torch_backend"


def test_unknown_option_is_the_callers_error():
    with pytest.raises(Exception, match=r"unknown option\(s\) \['opt_level'\]"):
        with torch.no_grad():
            torch.compile(Mlp().eval(), backend="kiln", options={"opt_level": 3})(
                torch.randn(2, 16))


def test_several_outputs_and_an_integer_output(caplog):
    class Parts(torch.nn.Module):
        def forward(self, x):
            return x.relu(), x.argmax(dim=1), (x * 2).sum()

    x = torch.randn(4, 6)
    with caplog.at_level(logging.WARNING, logger="kiln"), torch.no_grad():
        got = torch.compile(Parts(), backend="kiln")(x)
    assert not eager_warnings(caplog), caplog.text
    want = Parts()(x)
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_aligned_inputs_and_outputs_are_bound_without_copies(monkeypatch):
    """PyTorch's CPU allocator aligns to 64 bytes: a fresh contiguous input is read in place
    and every output written in place; a strided one is copied."""
    from kiln.graph_executor import GraphModule

    calls = []
    for name in ("set_input", "set_input_zero_copy", "set_output_zero_copy"):
        real = getattr(GraphModule, name)
        monkeypatch.setattr(GraphModule, name, lambda self, *a, _n=name, _r=real: (
            calls.append(_n), _r(self, *a))[1])
    compiled = torch.compile(Mlp().eval(), backend="kiln")
    with torch.no_grad():
        compiled(torch.randn(3, 16))
        assert calls == ["set_output_zero_copy", "set_input_zero_copy"]
        calls.clear()
        compiled(torch.randn(16, 3).t())
    assert calls == ["set_output_zero_copy", "set_input"]
