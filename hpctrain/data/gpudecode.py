"""JPEG batches decoded on the GPU (``data.decode = gpu``): nvJPEG through torchvision, crop and
resize on the device. **Not run on a GPU yet** (no GPU where it was written; docs/gpus.md).

The boxes are the CPU path's: :meth:`CropDecoder.plan` (image sizes from the JPEG headers on the
host, boxes from :mod:`crops` seeded by sample position) — the one seam both paths share, so a CPU
test checks that this path cuts the same boxes (:func:`crop_resize` runs on any device; the test
injects a Pillow decode in place of nvJPEG through :data:`DEVICE_DECODE`). Each box is rounded to
whole pixels on the device (as the CPU path rounds it: :func:`crops.whole_pixels`), then
resized with torch's antialiased bilinear interpolation (what Pillow's filter does) and mirrored.
A grey sample (C = 1) is the luma of the decoded RGB (0.299, 0.587, 0.114, libjpeg's weights). A
batch nvJPEG refuses is decoded again one sample at a time to name the bad one (the loader's
one-line error, status 2); tested here with a stand-in decoder, not nvJPEG.

torchvision is imported on first use only: it does not import beside this project's CPU torch.
What it would need on a GPU node: ``pip install torchvision`` matching the node's CUDA torch.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hpctrain.data.crops import whole_pixels
from hpctrain.data.decodepool import SampleError
from hpctrain.errors import MissingPackageError

DEVICE_DECODE: Callable | None = None     # (list of uint8 byte tensors, device) -> list of (C, H, W) uint8


def torchvision_decode(data: list, device: torch.device) -> list:
    """nvJPEG batch decode (``torchvision.io.decode_jpeg`` with ``device``), RGB."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception as exc:  # ImportError, or torchvision built for another torch
        raise MissingPackageError(f"data.decode=gpu needs torchvision built for this torch ({exc}); "
                                  f"install it or set data.decode=cpu") from None
    return list(decode_jpeg(data, device=device, mode=ImageReadMode.RGB))


def available() -> bool:
    """Whether ``auto`` may pick the device path: CUDA is there and torchvision imports."""
    if not torch.cuda.is_available():
        return False
    try:
        import torchvision.io  # noqa: F401
    except Exception:
        return False
    return True


def resolve(decode: str, *, raw: bool, whole: bool, node: bool, device=None) -> str:
    """Where a loader decodes JPEG batches: ``cpu`` or ``gpu`` (``data.decode``). ``auto`` picks the
    GPU when the job takes raw batches to CUDA, the shards store whole images and torchvision imports;
    ``gpu`` when that cannot work is a configuration error. ``device`` (a test's seam) skips the CUDA
    checks."""
    from hpctrain.errors import ConfigError
    if decode == "cpu":
        return "cpu"
    why = ("the shards store images fitted to the sample shape (convert again with --encode jpeg)" if not whole else
           "one reader per node (data.reader=node) fills host memory" if node else
           "the job does not train on a GPU" if device is None and not (raw and torch.cuda.is_available()) else None)
    if decode == "auto":
        return "gpu" if why is None and (device is not None or available()) else "cpu"
    if why:
        raise ConfigError(f"config data.decode: gpu, but {why}; set data.decode=cpu or auto")
    return "gpu"


def crop_resize(images: list, boxes: list, out_h: int, out_w: int) -> torch.Tensor:
    """Each ``(C, H, W)`` uint8 image's box (rounded to whole pixels) resized to ``out_h × out_w``,
    mirrored where the box says so; a ``(B, C, out_h, out_w)`` uint8 batch on the images' device."""
    out = []
    for img, c in zip(images, boxes):
        top, left, bottom, right = whole_pixels(c, img.shape[-2], img.shape[-1])
        region = img[:, top:bottom, left:right].unsqueeze(0).float()
        r = F.interpolate(region, size=(out_h, out_w), mode="bilinear", align_corners=False, antialias=True)
        if c.flip:
            r = r.flip(-1)
        out.append(r)
    return torch.cat(out).round_().clamp_(0, 255).to(torch.uint8)


LUMA = torch.tensor([0.299, 0.587, 0.114])      # ITU-R BT.601 weights, libjpeg's RGB -> grey


class DeviceCropDecoder:
    """Batches of whole stored JPEGs decoded and cut on ``device`` with ``planner``'s boxes (a
    :class:`~hpctrain.data.decodepool.CropDecoder`: the CPU path's plan)."""

    def __init__(self, planner, device: torch.device):
        self.planner, self.device = planner, torch.device(device)
        self.shape = planner.shape

    def decode(self, blobs, train: bool, **kw) -> torch.Tensor:
        _, boxes = self.planner.plan(blobs, train, **kw)
        data = [torch.from_numpy(np.frombuffer(bytes(b) if not isinstance(b, bytes) else b, np.uint8).copy())
                for b in blobs]
        images = self._decode(data)
        c, h, w = self.shape
        x = crop_resize(images, boxes, h, w)
        if c == 1:        # libjpeg's luma (Y of YCbCr), what the CPU path decodes a grey sample to
            x = (x.float() * LUMA.to(x.device).view(1, 3, 1, 1)).sum(1, keepdim=True).round_().to(torch.uint8)
        if self.device.type == "cuda":      # handed to another thread: finished before it is queued
            torch.cuda.current_stream(self.device).synchronize()
        return x

    def _decode(self, data: list) -> list:
        """The batch decoded on the device; a body that does not decode (nvJPEG raises for the
        whole batch) is found by decoding the samples one by one: :class:`SampleError` naming it."""
        decode = DEVICE_DECODE or torchvision_decode
        try:
            return decode(data, self.device)
        except MissingPackageError:
            raise
        except Exception as batch_exc:
            for k, d in enumerate(data):
                try:
                    decode([d], self.device)
                except MissingPackageError:
                    raise
                except Exception as exc:
                    raise SampleError(k, exc) from None
            raise batch_exc     # no sample fails alone: not the data's fault
