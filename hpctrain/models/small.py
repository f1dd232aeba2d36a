"""Small models for the default job: a CNN for the 8×8 digits (and any small image input)."""
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
