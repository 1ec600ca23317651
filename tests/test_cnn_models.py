"""CNNs through ``torch.compile(backend="neuron")``: a training step (forward and backward) of a
ResNet-style and a MobileNet-style network against eager.

The issue-7 model line: every FLOP on the device. ``profile().to_dict()`` reports device share by
node count only (``neuron-eval`` divides TensorE FLOPs, zero products of block-diagonal
depthwise convolutions included, by the model's FLOPs), so these tests state it structurally:
nothing falls back at all (so every op torch's FLOP counter counts ran in a device partition): batch norm's ``num_batches_tracked += 1`` (an
int64 graph input) runs on GpSimdE's integer ALU, exact, and the tests assert that the
counters advanced as eager's did (buffers compared exactly). Each test also
asserts that the CNN ops ran in device partitions by name (a fallback would make every
comparison pass).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import neuron_compiler
from neuron_compiler.testing import ensure_backends_registered


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Basic(nn.Module):
    """ResNet basic block (stride 2 with a 1x1 projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.proj = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.proj(x))


class ResNetish(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(Basic(8, 8, 1), Basic(8, 16, 2))        # identity and projection
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise (explicit reflection pad), 1x1 project."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6())
        self.dw = nn.Conv2d(mid, mid, 3, stride, 0, groups=mid, bias=False)
        self.bn = nn.BatchNorm2d(mid)
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.expand(x)
        y = F.relu6(self.bn(self.dw(F.pad(y, (1, 1, 1, 1), mode="reflect"))))
        y = self.project(y)
        return x + y if self.residual else y


class MobileNetish(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(8, 8, 1, 2), InvertedResidual(8, 16, 2, 3))
        self.pool = nn.AdaptiveAvgPool2d((2, 2))         # not global: the _adaptive_avg_pool2d op
        self.fc = nn.Linear(16 * 4, classes)

    def forward(self, x):
        y = self.blocks(self.stem(F.pad(x, (1, 1, 1, 1), mode="replicate")))
        return self.fc(self.pool(y).flatten(1))


def _train_step(model: nn.Module, x: torch.Tensor, labels: torch.Tensor):
    """One compiled and one eager forward + backward; (loss, ref loss, grads, ref grads, profile)."""
    ensure_backends_registered()
    ref = copy.deepcopy(model)
    cm = torch.compile(model, backend="neuron")
    with neuron_compiler.profile() as prof:
        loss = F.cross_entropy(cm(x), labels)
        loss.backward()
    ref_loss = F.cross_entropy(ref(x), labels)
    ref_loss.backward()
    names = [n for n, _ in model.named_parameters()]
    grads = {n: p.grad for n, p in model.named_parameters()}
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    assert all(grads[n] is not None for n in names), [n for n in names if grads[n] is None]
    return loss, ref_loss, grads, ref_grads, prof.to_dict(), (model, ref)


def _device_ops(d: dict) -> set[str]:
    return {op for p in d["partitions"] for op in p["ops"]}


def _assert_flops_on_device(d: dict, must_run: set[str]) -> None:
    assert d["partitions"], f"no device partition ran; fallbacks: {d['fallbacks']}"
    assert not d["fallbacks"] and d["fallback_nodes"] == 0, f"fell back: {d['fallbacks']}"
    assert d["device_nodes"] > 0
    on = _device_ops(d)
    missing = {m for m in must_run if not any(op.startswith(m) for op in on)}
    assert not missing, f"not in any device partition: {sorted(missing)}"


def _assert_matches(loss, ref_loss, grads, ref_grads, models, rtol=1e-4, atol=1e-4) -> None:
    torch.testing.assert_close(loss, ref_loss, rtol=rtol, atol=atol)
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=rtol, atol=atol, msg=lambda m, n=n: f"{n}: {m}")
    model, ref = models
    for (n, b), (_, rb) in zip(model.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(b, rb, rtol=rtol, atol=atol, msg=lambda m, n=n: f"buffer {n}: {m}")
        if "num_batches_tracked" in n:                   # the int64 counter, advanced on the device
            assert b.dtype == torch.int64 and int(b) == int(rb) == 1, (n, b, rb)


@pytest.mark.parametrize("make,labels,must_run", [
    (ResNetish, [1, 7], {"aten.convolution.default", "aten.convolution_backward",
                         "aten.max_pool2d_with_indices.default",
                         "aten.max_pool2d_with_indices_backward", "aten.mm", "aten.mean"}),
    (MobileNetish, [3, 0], {"aten.convolution.default", "aten.convolution_backward",
                            "aten.reflection_pad2d.default", "aten.reflection_pad2d_backward",
                            "aten.replication_pad2d.default", "aten._adaptive_avg_pool2d.default",
                            "aten._adaptive_avg_pool2d_backward"}),
], ids=["resnet_style", "mobilenet_style"])
def test_cnn_training_step_on_device(make, labels, must_run):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 12)
    out = _train_step(make(), x, torch.tensor(labels))
    _assert_matches(*out[:4], out[5])
    _assert_flops_on_device(out[4], must_run)


class PatchEmbedViT(nn.Module):
    """ViT-B/16's stem: a 16x16 stride-16 patch embedding 3 -> 768 (its weights need passes:
    ``tiling/conv_plan.py``), class token, position embedding, one layer norm, a head."""

    def __init__(self, classes: int = 10, px: int = 64):
        super().__init__()
        self.patch = nn.Conv2d(3, 768, 16, 16)
        self.cls = nn.Parameter(torch.randn(1, 1, 768) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (px // 16) ** 2 + 1, 768) * 0.02)
        self.norm = nn.LayerNorm(768)
        self.head = nn.Linear(768, classes)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(t)[:, 0])


class ASPP(nn.Module):
    """DeepLabV3's head on MobileNetV3-Large features (960 channels): 1x1, three atrous 3x3
    (dilation 12, 24, 36: halos larger than the map), image pooling, projection."""

    def __init__(self, cin: int = 960, mid: int = 256, classes: int = 21):
        super().__init__()
        self.branches = nn.ModuleList(
            [nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU())]
            + [nn.Sequential(nn.Conv2d(cin, mid, 3, padding=d, dilation=d, bias=False),
                             nn.BatchNorm2d(mid), nn.ReLU()) for d in (12, 24, 36)])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, mid, 1, bias=False), nn.ReLU())
        self.project = nn.Sequential(nn.Conv2d(5 * mid, mid, 1, bias=False), nn.BatchNorm2d(mid),
                                     nn.ReLU(), nn.Conv2d(mid, classes, 1))

    def forward(self, x):
        ys = [b(x) for b in self.branches]
        ys.append(self.pool(x).expand(-1, -1, x.shape[2], x.shape[3]))
        return self.project(torch.cat(ys, dim=1))


class Decoder(nn.Module):
    """A segmentation decoder: transposed convolutions (2x upsampling, output_padding) between
    3x3 convolutions."""

    def __init__(self):
        super().__init__()
        self.up1 = nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1)
        self.c1 = nn.Conv2d(32, 32, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1)
        self.out = nn.Conv2d(16, 3, 1)

    def forward(self, x):
        y = F.relu(self.c1(F.relu(self.up1(x))))
        return self.out(F.relu(self.up2(y)))


@pytest.mark.parametrize("make,shape", [
    (PatchEmbedViT, (2, 3, 64, 64)), (ASPP, (1, 960, 4, 4)), (Decoder, (1, 64, 9, 8)),
], ids=["vit_patch16", "deeplab_aspp", "transposed_decoder"])
def test_inference_convolutions_fit_on_device(make, shape):
    """The layers that sent whole partitions to eager (a patch embedding's weights, atrous
    convolutions on 960 channels) and transposed convolutions: every node on the device,
    matching eager."""
    ensure_backends_registered()
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    cm = torch.compile(model, backend="neuron")
    with torch.no_grad(), neuron_compiler.profile() as prof:
        out = cm(x)
    with torch.no_grad():
        want = model(x)
    d = prof.to_dict()
    _assert_flops_on_device(d, {"aten.convolution.default"})
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
