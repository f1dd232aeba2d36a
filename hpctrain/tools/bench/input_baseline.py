"""What a PyTorch user writes in ten lines, for ``bench input`` to compare against: a ``Dataset`` of
JPEG bytes decoded with Pillow, the ImageNet random-resized crop (the same box procedure as
torchvision's ``RandomResizedCrop``, written with Python's ``random`` since torchvision does not
import here) cut and resized with Pillow, a random flip, to a uint8 tensor, normalised per batch;
fed by ``torch.utils.data.DataLoader`` with ``num_workers`` processes.
"""
from __future__ import annotations

import io
import math
import random

import numpy as np
import torch

MEAN = torch.tensor([123.7, 116.3, 103.5]).view(1, 3, 1, 1)
STD = torch.tensor([58.4, 57.1, 57.4]).view(1, 3, 1, 1)


def random_resized_crop(img, size: int, rnd: random.Random, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's ``RandomResizedCrop(size)`` + ``RandomHorizontalFlip`` on a PIL image."""
    from PIL import Image
    w, h = img.size
    for _ in range(10):
        target = w * h * rnd.uniform(*scale)
        aspect = math.exp(rnd.uniform(math.log(ratio[0]), math.log(ratio[1])))
        bw, bh = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < bw <= w and 0 < bh <= h:
            top, left = rnd.randint(0, h - bh), rnd.randint(0, w - bw)
            break
    else:
        bw, bh, top, left = min(w, h), min(w, h), (h - min(w, h)) // 2, (w - min(w, h)) // 2
    img = img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + bw, top + bh))
    return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rnd.random() < 0.5 else img


def pil_transform(blob: bytes, size: int, rnd: random.Random) -> torch.Tensor:
    from PIL import Image
    with Image.open(io.BytesIO(blob)) as img:
        img = random_resized_crop(img.convert("RGB"), size, rnd)
        return torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy())


class JpegBytes(torch.utils.data.Dataset):
    def __init__(self, blobs: list, labels, size: int = 224):
        self.blobs, self.labels, self.size = blobs, labels, size
        self.rnd = random.Random(0)

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        return pil_transform(self.blobs[i], self.size, self.rnd), int(self.labels[i])


def normalise(x: torch.Tensor) -> torch.Tensor:
    return (x.float() - MEAN) / STD


def dataloader(blobs: list, labels, batch: int, workers: int, size: int = 224):
    """The DataLoader contender (``workers`` 0: loads in the main process)."""
    return torch.utils.data.DataLoader(JpegBytes(blobs, labels, size), batch_size=batch, shuffle=True,
                                       num_workers=workers, drop_last=True, persistent_workers=workers > 0,
                                       prefetch_factor=2 if workers else None)


def one_core(blobs: list, labels, batch: int, size: int = 224):
    """The same transform in a loop in this process: one PIL core."""
    ds, rnd = JpegBytes(blobs, labels, size), random.Random(1)
    order = list(range(len(ds)))
    rnd.shuffle(order)
    for s in range(0, len(order) - batch + 1, batch):
        items = [ds[i] for i in order[s:s + batch]]
        yield torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])
