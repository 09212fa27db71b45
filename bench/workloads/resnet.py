"""`resnet`: ResNets with BatchNorm, written here with torchvision's exact shapes (ResNet v1.5).

`resnet18/34/50/101` match torchvision's parameter counts with 1000 classes; `tiny` is a CPU-sized
ResNet (one basic block per stage, widths 16-128, 10 classes). BatchNorm buffers make these the
workloads that exercise `broadcast_buffers`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Batch, SyntheticDataset, Workload

# name -> (block, blocks per stage, stem width, classes, default image side)
RESNET_SIZES = {
    "tiny": ("basic", (1, 1, 1, 1), 16, 10, 32),
    "resnet18": ("basic", (2, 2, 2, 2), 64, 1000, 224),
    "resnet34": ("basic", (3, 4, 6, 3), 64, 1000, 224),
    "resnet50": ("bottleneck", (3, 4, 6, 3), 64, 1000, 224),
    "resnet101": ("bottleneck", (3, 4, 23, 3), 64, 1000, 224),
}
MAX_DISTINCT_IMAGES = 1024   # images are reused beyond this: 616 MB at 224 px fp32 is enough variety


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(*conv_bn(cin, width, 3, stride), nn.ReLU(inplace=True),
                                  *conv_bn(width, cout, 3))
        self.downsample = (nn.Sequential(*conv_bn(cin, cout, 1, stride))
                           if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return F.relu(self.body(x) + self.downsample(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride, as torchvision's v1.5 does), 1x1 expand ×4."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(*conv_bn(cin, width, 1), nn.ReLU(inplace=True),
                                  *conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),
                                  *conv_bn(width, cout, 1))
        self.downsample = (nn.Sequential(*conv_bn(cin, cout, 1, stride))
                           if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return F.relu(self.body(x) + self.downsample(x))


class ResNet(nn.Module):
    def __init__(self, block: str, stages: tuple[int, ...], width: int, classes: int):
        super().__init__()
        block_cls = BasicBlock if block == "basic" else Bottleneck
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, padding=3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, padding=1))
        layers, cin = [], width
        for i, n in enumerate(stages):
            w = width * 2**i
            for j in range(n):
                layers.append(block_cls(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w * block_cls.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():   # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class ImageDataset(SyntheticDataset):
    """Gaussian images and uniform labels generated on the device; at most MAX_DISTINCT_IMAGES images."""

    def __init__(self, num_samples: int, side: int, classes: int, device: torch.device, seed: int):
        gen = torch.Generator(device=device).manual_seed(seed)
        self.images = torch.randn(min(num_samples, MAX_DISTINCT_IMAGES), 3, side, side,
                                  generator=gen, device=device)
        self.labels = torch.randint(0, classes, (num_samples,), generator=gen, device=device)

    def __len__(self) -> int:
        return self.labels.shape[0]

    def batch(self, indices: torch.Tensor) -> Batch:
        indices = indices.to(self.labels.device)
        return {"x": self.images.index_select(0, indices % self.images.shape[0]),
                "y": self.labels.index_select(0, indices)}


def forward_macs(model: nn.Module, side: int) -> int:
    """Multiply-adds of one image's forward through every Conv2d and Linear, from shapes alone.

    The model is traced on the meta device (no memory, no arithmetic): each layer's MACs are
    output elements × input channels per group × kernel area (Linear: in × out).
    """
    total = 0

    def count(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            total += output.numel() * (module.in_channels // module.groups) * kh * kw
        else:
            total += module.in_features * module.out_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        model.eval()(torch.empty(1, 3, side, side, device="meta"))   # eval: BatchNorm accepts 1 image
    finally:
        for h in hooks:
            h.remove()
    return total


class ResNetWorkload(Workload):
    """A ResNet on synthetic images; `size` is a key of RESNET_SIZES."""

    family = "resnet"
    uses_options = ("image_size",)

    def __init__(self, size, options=None):
        if size not in RESNET_SIZES:
            raise ValueError(f"model_size={size!r} is not a resnet size; choose from {sorted(RESNET_SIZES)}")
        super().__init__(size, options)
        self.block, self.stages, self.width, self.classes, default_side = RESNET_SIZES[size]
        self.image_size = self.options.image_size or default_side
        if self.image_size < 32:
            raise ValueError(f"image_size={self.image_size} is too small for a ResNet (5 stride-2 stages); "
                             "use at least 32")
        self._flops: float | None = None

    def build_model(self) -> nn.Module:
        return ResNet(self.block, self.stages, self.width, self.classes)

    def make_dataset(self, num_samples, device, seed):
        return ImageDataset(num_samples, self.image_size, self.classes, device, seed)

    def loss(self, model, batch):
        return F.cross_entropy(model(batch["x"]), batch["y"])

    def train_flops_per_sample(self, batch=None):
        """6 · (forward MACs of every conv and the fc layer): 2 FLOPs per MAC, backward = 2× forward.

        BatchNorm, ReLU and pooling are not counted. The stem's input gradient is counted too although
        no one computes it (the images need no gradient), the usual convention: the FLOP counter sees
        exactly the stem's forward FLOPs fewer.
        """
        if self._flops is None:
            with torch.device("meta"):
                model = self.build_model()
            self._flops = 6.0 * forward_macs(model, self.image_size)
        return self._flops
