"""Small models: a CNN for the 8×8 digits (and any small image input); a BN-free 1-D CNN and MLP
for the generated held-out datasets (``signal1d``, ``tabular``)."""
from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv3×3(32)-BN-ReLU → conv3×3(64)-BN-ReLU → global-avg-pool to 4×4 → FC(128) → FC(classes).

    Adaptive pooling makes it accept any H×W ≥ 4; ``batchnorm=False`` gives a BN-free variant whose
    data-parallel result equals single-process training exactly (BN statistics are per-rank).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, batchnorm: bool = True):
        super().__init__()
        norm = (lambda c: nn.BatchNorm2d(c)) if batchnorm else (lambda c: nn.Identity())
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1, bias=not batchnorm), norm(32), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, padding=1, bias=not batchnorm), norm(64), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 16, 128), nn.ReLU(inplace=True),
                                  nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SignalCNN(nn.Module):
    """BN-free 1-D CNN for (C, L) signals: conv7(8)-ReLU-pool2 → conv5(16)-ReLU-pool2 → conv3(32)-ReLU
    → global average → FC(classes); narrow, to keep the held-out study's runs short on a CPU. Every
    conv and the FC have a bias: the 1-D parameters LARS and LAMB exclude from the trust ratio are
    the biases alone (no BatchNorm)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(in_channels, 8, 7, padding=3), nn.ReLU(inplace=True), nn.MaxPool1d(2),
            nn.Conv1d(8, 16, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool1d(2),
            nn.Conv1d(16, 32, 3, padding=1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool1d(1))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MLP(nn.Module):
    """BN-free MLP for flat feature vectors (N, F): FC(128)-ReLU → FC(128)-ReLU → FC(classes).
    ``in_channels`` is the number of features (the first axis of one sample)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 32, hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_channels, hidden), nn.ReLU(inplace=True),
                                 nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))
