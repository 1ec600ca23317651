"""The torchvision and timm architectures of ``bench/bench_zoo.py``, loaded without torchvision's
C extension.

The package index's torchvision wheel is built against CUDA torch: beside the CPU torch its C
extension does not load, and ``import torchvision`` then stops in ``torchvision/_meta_registrations.py``
("operator torchvision::nms does not exist": it registers fake kernels for ops the extension
should have defined). The model definitions are pure Python and use none of those ops
(detection ops such as nms and roi_align are not among the architectures below), so
``load_torchvision`` imports torchvision normally and, only when that fails this way, imports it
again with that one module replaced by an empty one. timm imports torchvision for its
transforms, so it is imported after.

Where they come from: ``import`` as usual, after putting ``$NEURON_ZOO_SITE`` (default
``~/.cache/neuron-zoo/site``) at the end of ``sys.path`` when it exists: the packages can be
installed there (``pip install --no-deps --target ...``, see docs/zoo.md) so that nothing else in
the environment sees a torchvision it cannot import (transformers imports it when present).
This module is only imported by the sweep's worker process of a torchvision/timm row.

Models: weights random (``weights=None``; ``pretrained=False``), seeded, batch-norm statistics
calibrated on a random batch (``calibrate``: else the outputs vanish). ``fp32``: 32 px images
(vit_b_16 and the timm ViT/Mixer at 64 px: their patch grids need it), batch 1, 10 classes.
``bf16``: 64 px, batch 1, 1000 classes: the real channel widths and depths (the layer shapes of
the public models), at a small image size.
"""
from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable

import torch


class Unavailable(RuntimeError):
    """torchvision / timm cannot be imported here (the message says why)."""


def _site() -> None:
    site = os.environ.get("NEURON_ZOO_SITE", os.path.expanduser("~/.cache/neuron-zoo/site"))
    if os.path.isdir(site) and site not in sys.path:
        sys.path.append(site)


def load_torchvision():
    _site()
    try:
        import torchvision
        return torchvision
    except ImportError as exc:
        raise Unavailable(f"torchvision is not installed ({exc}); see docs/zoo.md") from exc
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    stub = types.ModuleType("torchvision._meta_registrations")
    stub.__doc__ = "replaced by bench/zoo_vision.py: the C extension's ops do not exist here"
    sys.modules["torchvision._meta_registrations"] = stub
    import torchvision
    return torchvision


def load_timm():
    load_torchvision()
    try:
        import timm
    except ImportError as exc:
        raise Unavailable(f"timm is not installed ({exc}); see docs/zoo.md") from exc
    return timm


def _image(mode: str, fp32_px: int = 32, bf16_px: int = 64) -> torch.Tensor:
    px = fp32_px if mode == "fp32" else bf16_px
    return torch.randn(1, 3, px, px, generator=torch.Generator().manual_seed(6))


def calibrate(model: torch.nn.Module, mode: str, fp32_px: int = 32) -> torch.nn.Module:
    """Batch-norm running statistics set to those of a random batch of 16 images.

    With random weights and the initial statistics (mean 0, variance 1), eval-mode batch norm
    normalises nothing and the activations of a deep CNN shrink layer after layer (torchvision's
    mobilenet_v3_small ends near 1e-16, shufflenet at exactly 0): every comparison would pass.
    A trained model's statistics normalise its activations; these do the same for the random
    weights (one train-mode forward with a cumulative average, ``momentum=None``).

    Zero-initialised weights (torchvision's ViT head, timm's Mixer head) are drawn from
    N(0, 0.02) first: a zero head makes every output 0, which any program would match."""
    with torch.no_grad():
        for m in model.modules():
            w = getattr(m, "weight", None)
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) and not w.any():
                w.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(8))
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model.eval()
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    px = fp32_px if mode == "fp32" else 64
    model.train()
    with torch.no_grad():
        model(torch.randn(16, 3, px, px, generator=torch.Generator().manual_seed(7)))
    for m, momentum in zip(norms, saved):
        m.momentum = momentum
    return model.eval()


def _tv(fn: str, fp32_px: int = 32, **extra):
    def build(mode: str) -> tuple[torch.nn.Module, tuple]:
        tvm = load_torchvision().models
        torch.manual_seed(0)
        kw = dict(extra)
        if fn == "vit_b_16":
            kw["image_size"] = fp32_px if mode == "fp32" else 64
        model = getattr(tvm, fn)(weights=None, num_classes=10 if mode == "fp32" else 1000, **kw)
        return calibrate(model, mode, fp32_px), (_image(mode, fp32_px),)
    return build


class _SegOut(torch.nn.Module):
    """DeepLabV3 returns an OrderedDict; the sweep compares its ``out`` map."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def _deeplab(mode: str) -> tuple[torch.nn.Module, tuple]:
    seg = load_torchvision().models.segmentation
    torch.manual_seed(0)
    model = seg.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None,
                                             num_classes=4 if mode == "fp32" else 21)
    return calibrate(_SegOut(model), mode), (_image(mode),)


def _timm(name: str, fp32_px: int = 32, **extra):
    def build(mode: str) -> tuple[torch.nn.Module, tuple]:
        timm = load_timm()
        torch.manual_seed(0)
        kw = dict(extra)
        if "img_size" in kw:
            kw["img_size"] = fp32_px if mode == "fp32" else 64
        model = timm.create_model(name, pretrained=False,
                                  num_classes=10 if mode == "fp32" else 1000, **kw)
        return calibrate(model, mode, fp32_px), (_image(mode, fp32_px),)
    return build


VISION: dict[str, tuple[Callable, str, str]] = {
    # name: (builder, family, what it exercises)
    "tv_resnet18": (_tv("resnet18"), "torchvision", "basic blocks, batch norm, max pool"),
    "tv_mobilenet_v3_small": (_tv("mobilenet_v3_small"), "torchvision",
                              "depthwise conv, squeeze-excite, hardswish"),
    "tv_efficientnet_b0": (_tv("efficientnet_b0"), "torchvision", "MBConv, SiLU, squeeze-excite"),
    "tv_regnet_y_400mf": (_tv("regnet_y_400mf"), "torchvision", "grouped conv, squeeze-excite"),
    "tv_shufflenet_v2": (_tv("shufflenet_v2_x0_5"), "torchvision", "channel shuffle, chunk"),
    "tv_densenet121": (_tv("densenet121"), "torchvision", "dense concatenation, avg pool"),
    "tv_vit_b_16": (_tv("vit_b_16", fp32_px=64), "torchvision",
                    "16x16 patch conv (768 channels), nn.MultiheadAttention"),
    "tv_swin_t": (_tv("swin_t"), "torchvision", "shifted windows, roll, relative bias"),
    "tv_deeplabv3_mobilenet_v3_large": (_deeplab, "torchvision",
                                        "atrous conv, ASPP, bilinear upsampling"),
    "tv_convnext_tiny": (_tv("convnext_tiny"), "torchvision",
                         "7x7 depthwise conv, LayerNorm2d, layer scale"),
    "timm_mixer_s16_224": (_timm("mixer_s16_224", fp32_px=64, img_size=64), "timm",
                           "token-mixing MLP over patches"),
    "timm_efficientnet_b0": (_timm("efficientnet_b0"), "timm", "timm's MBConv, same padding"),
    "timm_vit_tiny_patch16_224": (_timm("vit_tiny_patch16_224", fp32_px=64, img_size=64), "timm",
                                  "timm attention (fused sdpa), layer scale off"),
}
