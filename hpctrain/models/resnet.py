"""ResNets written out in torch (torchvision does not import beside torch 2.13 here).

* ``resnet18`` / ``resnet50``: He et al. 2016 ImageNet networks for 224x224 inputs; ResNet-50
  is v1.5 (stride 2 on the 3x3 conv of a bottleneck, not on the first 1x1; the variant of
  torchvision, NVIDIA DeepLearningExamples and the MLPerf reference). Parameter counts equal
  torchvision's: 11,689,512 and 25,557,032 with 1000 classes.
* ``resnet20``: the CIFAR network of He et al. Sec. 4.2 (3 stages x 3 basic blocks, 16/32/64
  channels, 32x32 inputs). ``shortcut="A"`` (default, the paper's choice for CIFAR): identity
  shortcuts, subsampled and zero-padded where the shape changes, 0.27 M parameters
  (269,722 with 10 classes). ``shortcut="B"``: 1x1 conv + BN projections there
  (272,474 parameters with 10 classes).

``zero_init_residual=True`` zeroes the gamma of the last BN in every residual block, so each
block starts as the identity (Goyal et al. 2017, Sec. 5.1). Convs use He (fan_out) init.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["resnet18", "resnet50", "resnet20", "ResNet", "BasicBlock", "Bottleneck"]


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


def _projection(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(c_out))


class _PadShortcut(nn.Module):
    """Option-A shortcut: subsample spatially, zero-pad the new channels (no parameters)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.stride, self.extra = stride, c_out - c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, ::self.stride, ::self.stride]
        return F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int = 1, shortcut: str = "B"):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(c_in, width, stride), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv3x3(width, width), nn.BatchNorm2d(width)
        self.shortcut = _make_shortcut(c_in, width, stride, shortcut)

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride: v1.5), 1x1 expand by 4."""
    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int = 1, shortcut: str = "B"):
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv3x3(width, width, stride), nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.shortcut = _make_shortcut(c_in, c_out, stride, shortcut)

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


def _make_shortcut(c_in: int, c_out: int, stride: int, kind: str) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    if kind == "A":
        return _PadShortcut(c_in, c_out, stride)
    if kind == "B":
        return _projection(c_in, c_out, stride)
    raise ValueError(f"shortcut must be 'A' or 'B', got {kind!r}")


class ResNet(nn.Module):
    """Stem, stages of residual blocks, global average pool, linear classifier."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], blocks_per_stage: list[int], widths: list[int],
                 num_classes: int, in_channels: int = 3, imagenet_stem: bool = True,
                 shortcut: str = "B", zero_init_residual: bool = False):
        super().__init__()
        c = widths[0]
        if imagenet_stem:
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, c, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        else:
            self.stem = nn.Sequential(_conv3x3(in_channels, c), nn.BatchNorm2d(c),
                                      nn.ReLU(inplace=True))
        stages = []
        for i, (n_blocks, width) in enumerate(zip(blocks_per_stage, widths)):
            layers = []
            for j in range(n_blocks):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(block(c, width, stride, shortcut))
                c = width * block.expansion
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c, num_classes)
        self._init_weights(zero_init_residual)

    def _init_weights(self, zero_init_residual: bool) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(m.last_bn().weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet18(num_classes: int = 1000, in_channels: int = 3,
             zero_init_residual: bool = False) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], [64, 128, 256, 512], num_classes, in_channels,
                  zero_init_residual=zero_init_residual)


def resnet50(num_classes: int = 1000, in_channels: int = 3,
             zero_init_residual: bool = False) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], [64, 128, 256, 512], num_classes, in_channels,
                  zero_init_residual=zero_init_residual)


def resnet20(num_classes: int = 10, in_channels: int = 3, zero_init_residual: bool = False,
             shortcut: str = "A") -> ResNet:
    return ResNet(BasicBlock, [3, 3, 3], [16, 32, 64], num_classes, in_channels,
                  imagenet_stem=False, shortcut=shortcut, zero_init_residual=zero_init_residual)
