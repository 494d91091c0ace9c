"""PyTorch test models with random weights: three torchvision CNNs, two tiny transformers.

torchvision on PyPI is a CUDA build whose C extension (``torchvision/_C.so``) does not load
beside the CPU torch the tests install. Its model code is pure Python and needs none of it, but
``import torchvision`` runs ``torchvision/_meta_registrations.py``, whose
``torch.library.register_fake("torchvision::nms")`` fails when the extension did not define the
op ("operator torchvision::nms does not exist"; the other fake kernels there are guarded by
``extension._has_ops()``, these two are not). :func:`torchvision_models` defines the schemas of
those two ops (``nms``, ``qnms``, as torchvision's C++ ``TORCH_LIBRARY_FRAGMENT`` does) through
torch's public ``torch.library`` API first, so that import succeeds; the ops get no kernel (the
models never call them). Nothing of torchvision is patched and nothing is stubbed in
``sys.modules``; with a torchvision whose extension loads, the schemas exist already and nothing
is defined.
"""

from __future__ import annotations

import pytest

#: the ops torchvision's _meta_registrations.py registers fake kernels for without checking
#: that its extension loaded (schemas of torchvision/csrc/ops/nms.cpp, qnms)
_UNGUARDED_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY = []  # the torch.library.Library that holds the schemas lives as long as the process


def torchvision_models():
    """``torchvision.models`` (the test skips without torch or torchvision)."""
    define_torchvision_schemas()
    return pytest.importorskip("torchvision.models")


def define_torchvision_schemas() -> None:
    """Define the ops torchvision's Python code registers fake kernels for, unless its
    extension loaded and defined them (see the module docstring). Also before transformers
    is used: it imports torchvision when installed."""
    torch = pytest.importorskip("torch")
    missing = [s for n, s in _UNGUARDED_SCHEMAS.items() if not _has_op(torch, n)]
    if missing and not _LIBRARY:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for schema in missing:
            lib.define(schema)
        _LIBRARY.append(lib)


def _has_op(torch, name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _randomize_norms(model):
    """Batch norms with random statistics and affine weights (torchvision initializes them to
    the identity, which would hide a wrong scale or shift), then eval mode."""
    import torch

    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=gen) * 0.1)
    return model.eval()


#: the CNNs: torchvision builder name -> input shape (small, to keep compiles short)
CNNS = {"resnet18": (1, 3, 64, 64), "mobilenet_v2": (1, 3, 64, 64),
        "squeezenet1_0": (1, 3, 64, 64)}


def cnn(name: str, size: int | None = None):
    """``(model, (input,))``: torchvision's ``name`` with random weights, in eval mode; the
    input is ``CNNS[name]``, or 1x3x``size``x``size``."""
    import torch

    models = torchvision_models()
    torch.manual_seed(0)
    model = _randomize_norms(getattr(models, name)(weights=None))
    shape = CNNS[name] if size is None else (1, 3, size, size)
    return model, (torch.randn(*shape, generator=torch.Generator().manual_seed(2)),)


def transformer(name: str, seq: int = 16, batch: int = 1):
    """``(model, (input_ids,))``: a 2-layer, 64-wide ``BertModel`` or ``GPT2Model`` built from
    its config with random weights, in eval mode, without a KV cache (the test skips without
    transformers)."""
    torch = pytest.importorskip("torch")
    define_torchvision_schemas()  # transformers imports torchvision when it is installed
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "bert":
        config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=128,
                                         vocab_size=1000, max_position_embeddings=64)
        model = transformers.BertModel(config)
    elif name == "gpt2":
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000,
                                         n_positions=64, use_cache=False)
        model = transformers.GPT2Model(config)
    else:
        raise ValueError(f"unknown transformer {name!r}")
    ids = torch.randint(0, 1000, (batch, seq), generator=torch.Generator().manual_seed(3))
    return model.eval(), (ids,)
