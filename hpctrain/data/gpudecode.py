"""JPEG batches decoded on the GPU (``data.decode = gpu``): nvJPEG through torchvision, crop and
resize on the device (what has run where: docs/gpus.md).

The boxes are the CPU path's: :meth:`CropDecoder.plan` (image sizes from the JPEG headers on the
host, boxes from :mod:`crops` seeded by sample position) — the one seam both paths share, so a CPU
test checks that this path cuts the same boxes (:func:`crop_resize` runs on any device; the test
injects a Pillow decode in place of nvJPEG through :data:`DEVICE_DECODE`). Each box is rounded to
whole pixels on the device (as the CPU path rounds it: :func:`crops.whole_pixels`), then
resized with torch's antialiased bilinear interpolation (what Pillow's filter does) and mirrored.
A grey sample (C = 1) is the luma of the decoded RGB (0.299, 0.587, 0.114, libjpeg's weights). A
batch nvJPEG refuses is decoded again one sample at a time to name the bad one (the loader's
one-line error, status 2); tested here with a stand-in decoder, not nvJPEG.

Streams: the loader's thread decodes and cuts each batch on a stream of its own (never the
default stream, where it would queue behind the training kernels), records an event there and
hands the batch on without waiting; the consumer's stream waits for that event and marks the
batch as used there (``record_stream``, so the caching allocator does not give its memory back
to the loader's stream while training still reads it): :func:`take`, which
:func:`hpctrain.job.batches.to_device` calls for every batch. The loader's thread never blocks
on the device, so prefetch runs as deep as the loader's queue. Every stream and event call goes
through :data:`hpctrain.comm.streams.API` (a recording fake in the CPU tests).

torchvision is imported on first use only: it does not import beside this project's CPU torch.
What it would need on a GPU node: ``pip install torchvision`` matching the node's CUDA torch.
:func:`available` (what ``data.decode = auto`` asks) decodes a tiny JPEG on the GPU once, so
``auto`` never picks a decoder whose CUDA operator is missing (a torchvision built without
nvJPEG), which would then report sample 0 as a corrupt JPEG.
"""
from __future__ import annotations

import base64
import functools
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


PROBE_JPEG = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERXRTc4UG1RV19i"
    "Z2hnPk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2Nj"
    "Y2NjY2NjY2P/wAARCAAIAAgDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUF"
    "BAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVW"
    "V1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi"
    "4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAEC"
    "AxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVm"
    "Z2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq"
    "8vP09fb3+Pn6/9oADAMBAAIRAxEAPwDLooooPpj/2Q==")
"""An 8 x 8 RGB JPEG (Pillow, quality 50): what :func:`probe` decodes on the device."""


@functools.cache
def probe(device: str = "cuda") -> tuple[bool, str]:
    """``(ok, why)``: does the device decode operator itself run? Decodes :data:`PROBE_JPEG` on
    ``device`` once per process (an import that succeeds says nothing about nvJPEG)."""
    decode = DEVICE_DECODE or torchvision_decode
    try:
        (img,) = decode([torch.frombuffer(bytearray(PROBE_JPEG), dtype=torch.uint8)], torch.device(device))
    except Exception as exc:      # MissingPackageError, or the operator missing/failing on the device
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    if tuple(img.shape) != (3, 8, 8):
        return False, f"the probe JPEG decoded to shape {tuple(img.shape)}, not (3, 8, 8)"
    return True, "decodes on the device"


def available() -> bool:
    """Whether ``auto`` may pick the device path: CUDA is there and the device decode operator
    decodes a JPEG there (:func:`probe`)."""
    if not torch.cuda.is_available():
        return False
    return probe()[0]


def byte_tensor(blob) -> torch.Tensor:
    """A stored JPEG as the 1-D uint8 CPU tensor torchvision's decoder takes: a writable uint8
    NumPy array as it is (shared, no copy); anything else copied once."""
    if isinstance(blob, np.ndarray) and blob.dtype == np.uint8 and blob.ndim == 1 and blob.flags.writeable \
            and blob.flags.c_contiguous:
        return torch.from_numpy(blob)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def take(x: torch.Tensor) -> torch.Tensor:
    """Consumer side of a batch decoded on the device (any other batch passes as it is): the
    consumer's current stream waits for the decode's event (on the device, the host does not
    block), and the batch's memory is marked as used by that stream."""
    ready = getattr(x, "decoded_event", None)
    if ready is None:
        return x
    from hpctrain.comm import streams
    api = streams.API
    consumer = api.current_stream(x.device)
    consumer.wait_event(ready)
    api.record_stream(x, consumer)
    delattr(x, "decoded_event")
    return x


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
        from hpctrain.comm import streams
        self.planner, self.device = planner, torch.device(device)
        self.shape = planner.shape
        self.api = streams.API if streams.API.handles(self.device) else None
        self.stream = self.api.Stream(self.device) if self.api is not None else None   # the loader's own

    def decode(self, blobs, train: bool, **kw) -> torch.Tensor:
        """The batch on the device; on a stream of the loader's own, with ``decoded_event`` set
        for the consumer (:func:`take`) instead of a host wait."""
        _, boxes = self.planner.plan(blobs, train, **kw)
        data = [byte_tensor(b) for b in blobs]
        if self.api is None:
            return self._cut(self._decode(data), boxes)
        with self.api.stream(self.stream):
            x = self._cut(self._decode(data), boxes)
            ready = self.api.Event()
            ready.record(self.stream)
        x.decoded_event = ready     # type: ignore[attr-defined]  # read (and dropped) by take()
        return x

    def _cut(self, images: list, boxes: list) -> torch.Tensor:
        c, h, w = self.shape
        x = crop_resize(images, boxes, h, w)
        if c == 1:        # libjpeg's luma (Y of YCbCr), what the CPU path decodes a grey sample to
            x = (x.float() * LUMA.to(x.device).view(1, 3, 1, 1)).sum(1, keepdim=True).round_().to(torch.uint8)
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
