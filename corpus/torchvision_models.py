"""torchvision builders: random weights, batch norms with random statistics, eval mode.

torchvision on PyPI is a CUDA build whose C extension does not load beside the CPU torch; its
model code is pure Python. ``import torchvision`` registers fake kernels for ``nms``/``qnms``
without checking that the extension loaded, which fails when the ops do not exist: :func:`tv`
defines those two schemas first through ``torch.library`` (as torchvision's C++ does; the idea of
tests/helpers/torch_models.py on the torch branch). No model here calls them.
"""

from __future__ import annotations

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY = []  # keeps the torch.library.Library holding the schemas alive


def tv():
    """``torchvision.models``, importable without torchvision's C extension."""
    import torch

    def has(name):
        try:
            getattr(torch.ops.torchvision, name)
        except (AttributeError, RuntimeError):
            return False
        return True

    missing = [s for n, s in _SCHEMAS.items() if not has(n)]
    if missing and not _LIBRARY:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for schema in missing:
            lib.define(schema)
        _LIBRARY.append(lib)
    import torchvision.models

    return torchvision.models


def randomized(model):
    """Seeded random batch-norm statistics and affine weights (torchvision's identity init
    would hide a wrong scale or shift), then eval mode."""
    import torch

    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.rand(n, generator=gen) + 0.5)
                m.bias.data.copy_(torch.randn(n, generator=gen) * 0.1)
    return model.eval()


def classifier(name: str, **kwargs):
    """``torchvision.models.<name>(weights=None, **kwargs)``, seeded and randomized."""
    import torch

    torch.manual_seed(0)
    return randomized(getattr(tv(), name)(weights=None, **kwargs))


def tuple_outputs(inner):
    """``inner`` (whose output is a dict: segmentation, backbones) as a module returning the
    dict's tensors as a tuple, in key order."""
    import torch

    class TupleOutputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return tuple(self.inner(x).values())

    return TupleOutputs().eval()


def vit_tiny():
    """torchvision's VisionTransformer at 32×32, patch 8, 2 layers, hidden 64."""
    import torch

    tv()
    from torchvision.models.vision_transformer import VisionTransformer

    # eval-mode nn.MultiheadAttention's fast path is one aten::_native_multi_head_attention
    # call, which the legacy exporter has no symbolic for
    torch.backends.mha.set_fastpath_enabled(False)
    torch.manual_seed(0)
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                             hidden_dim=64, mlp_dim=128, num_classes=10).eval()


def swin_tiny():
    """torchvision's SwinTransformer (shifted windows), embed 32, depths 2+2, window 4."""
    import torch

    tv()
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                           window_size=[4, 4], num_classes=10).eval()


def segmentation(name: str):
    """A torchvision segmentation model (``out`` and, for FCN/DeepLab, ``aux`` heads)."""
    import torch

    torch.manual_seed(0)
    seg = getattr(tv().segmentation, name)(weights=None, weights_backbone=None, num_classes=5)
    return tuple_outputs(randomized(seg))


def resnet18_fpn():
    """Faster R-CNN's backbone: ResNet-18 with a feature pyramid (5 levels)."""
    import torch

    tv()
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    torch.manual_seed(0)
    return tuple_outputs(randomized(resnet_fpn_backbone(backbone_name="resnet18", weights=None,
                                                  trainable_layers=0)))


def mobilenet_v3_fpn():
    """Faster R-CNN mobile's backbone: MobileNetV3-Large with a feature pyramid."""
    import torch

    models = tv()
    torch.manual_seed(0)
    det = models.detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=3)
    return tuple_outputs(randomized(det.backbone))


def ssdlite_backbone():
    """SSDLite320's backbone: MobileNetV3-Large features and the extra layers (6 maps)."""
    import torch

    models = tv()
    torch.manual_seed(0)
    det = models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=3)
    return tuple_outputs(randomized(det.backbone))


def retinanet_head():
    """RetinaNet's classification and box heads over one 64-channel feature map."""
    import torch

    tv()
    from torchvision.models.detection.retinanet import RetinaNetHead

    torch.manual_seed(0)
    head = RetinaNetHead(in_channels=64, num_anchors=9, num_classes=4)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = head

        def forward(self, x):
            out = self.head([x])
            return out["cls_logits"], out["bbox_regression"]

    return Head().eval()


def classifier_video(name: str):
    """``torchvision.models.video.<name>(weights=None)``, seeded and randomized."""
    import torch

    torch.manual_seed(0)
    return randomized(getattr(tv().video, name)(weights=None))
