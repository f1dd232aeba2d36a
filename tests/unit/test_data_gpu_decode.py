"""The device decode path (data.decode=gpu, hpctrain/data/gpudecode.py) on the CPU, through its seam.

nvJPEG is replaced by a Pillow decode (``gpudecode.DEVICE_DECODE``) and the "device" is the CPU:
what is left is the path's own logic, which must cut the boxes the CPU workers cut (the same
plan, by construction: checked here box by box) and give the same pixels within the stated
tolerance. nvJPEG decodes at full size, so the CPU side's DCT-domain scaling is switched off for
the comparison (its own difference is test_data_decode.py's); then both resize the same
whole-pixel box with torch's antialiased bilinear filter, one batched on the device, one per
image: mean absolute difference at most 1 grey level, 99th percentile at most 12. What runs on a
real GPU (nvJPEG, CUDA streams) has not run here: docs/gpus.md.
"""
import io

import numpy as np
import pytest
import torch
from PIL import Image

from hpctrain.data import decoders, gpudecode
from hpctrain.errors import ConfigError
from tests.unit.test_data_jpeg_loader import blobs, loader, shards  # noqa: F401 (fixtures)


def pil_decode(data, device):
    return [torch.from_numpy(np.asarray(Image.open(io.BytesIO(d.numpy().tobytes())).convert("RGB"))
                             .transpose(2, 0, 1).copy()).to(device) for d in data]


def test_device_path_cuts_the_cpu_boxes(shards, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gpudecode, "DEVICE_DECODE", pil_decode)
    monkeypatch.setattr(decoders, "dct_scale", lambda *a, **k: 1)
    dev_boxes, cpu_boxes = [], []
    real_crop, real_decode = gpudecode.crop_resize, decoders.decode_crop
    monkeypatch.setattr(gpudecode, "crop_resize", lambda imgs, boxes, *a: (dev_boxes.extend(boxes),
                                                                           real_crop(imgs, boxes, *a))[1])
    monkeypatch.setattr(decoders, "decode_crop", lambda blob, crop, *a: (cpu_boxes.append(crop),
                                                                        real_decode(blob, crop, *a))[1])
    on_dev = loader(shards, 1, raw=True, decode="gpu", decode_device=torch.device("cpu"), prefetch=0)
    on_cpu = loader(shards, 1, raw=True, decode="cpu", prefetch=0)
    assert "decoded on cpu" in on_dev.describe()
    for augment in (True, False):
        got, want = list(on_dev.epoch(1, augment=augment)), list(on_cpu.epoch(1, augment=augment))
        assert len(got) == len(want) and dev_boxes == cpu_boxes and len(cpu_boxes) == 5 * len(want)
        for (x, y), (u, v) in zip(got, want):
            assert x.dtype == u.dtype == torch.uint8 and x.shape == u.shape and torch.equal(y, v)
            d = (x.int() - u.int()).abs().float()
            assert d.mean() <= 1.0 and torch.quantile(d.flatten(), 0.99) <= 12
        dev_boxes.clear()
        cpu_boxes.clear()


def test_decode_choice():
    auto = dict(raw=True, whole=True, node=False)
    assert gpudecode.resolve("cpu", **auto) == "cpu"
    assert gpudecode.resolve("auto", **auto) == ("gpu" if gpudecode.available() else "cpu")
    assert gpudecode.resolve("auto", **{**auto, "whole": False}, device=torch.device("cpu")) == "cpu"
    with pytest.raises(ConfigError, match="data.decode: gpu, but the shards store images fitted"):
        gpudecode.resolve("gpu", **{**auto, "whole": False})
    with pytest.raises(ConfigError, match="one reader per node"):
        gpudecode.resolve("gpu", **{**auto, "node": True})
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="does not train on a GPU"):
            gpudecode.resolve("gpu", **auto)


def test_device_batches_for_a_host_consumer_are_normalised(shards, monkeypatch):  # noqa: F811
    """Not raw, nothing after the normalisation: the host workers would normalise, but a batch
    decoded on the device never passes through them, so the loader's own prep must."""
    monkeypatch.setattr(gpudecode, "DEVICE_DECODE", pil_decode)
    monkeypatch.setattr(decoders, "dct_scale", lambda *a, **k: 1)
    on_dev = loader(shards, 1, transform=None, decode="gpu", decode_device=torch.device("cpu"), prefetch=0)
    on_cpu = loader(shards, 2, transform=None, decode="cpu", prefetch=0)
    got, want = list(on_dev.epoch(0)), list(on_cpu.epoch(0))
    assert len(got) == len(want) > 0
    for (x, _), (u, _) in zip(got, want):
        assert x.dtype == u.dtype == torch.float32
        assert (x - u).abs().mean() <= 1.0           # the fixture normalises by mean 0, std 1: grey levels
    on_dev.close()
    on_cpu.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without a GPU")
def test_decode_gpu_without_a_gpu_is_refused_before_any_shard_is_opened(shards, monkeypatch):  # noqa: F811
    from types import SimpleNamespace

    from hpctrain.data import factory, read_index
    monkeypatch.setattr(factory, "ShardSet", lambda *a, **k: pytest.fail("a shard was opened"))
    with pytest.raises(ConfigError, match="config data.decode: gpu, but the job does not train on a GPU"):
        factory.train_loader(read_index(shards), SimpleNamespace(), batch_size=4, raw=True, decode="gpu")


class _Planner:
    """The CPU plan's stand-in: every box the whole 4 x 4 image, no flip."""
    shape = (1, 4, 4)

    def plan(self, data, train, **kw):
        from hpctrain.data.crops import Crop
        return None, [Crop(0, 0, 4, 4)] * len(data)


def test_a_corrupt_body_on_the_device_names_its_sample_and_grey_is_libjpegs_luma(monkeypatch):
    from hpctrain.data.decodepool import SampleError
    rgb = torch.tensor([200, 100, 50], dtype=torch.uint8).view(3, 1, 1).expand(3, 4, 4).contiguous()

    def nvjpeg_like(data, device):                    # refuses the whole batch when one body is bad
        if any(bytes(d.numpy()) == b"bad" for d in data):
            raise RuntimeError("nvjpegDecodeBatched failed")
        return [rgb.to(device) for _ in data]
    monkeypatch.setattr(gpudecode, "DEVICE_DECODE", nvjpeg_like)
    dec = gpudecode.DeviceCropDecoder(_Planner(), torch.device("cpu"))
    x = dec.decode([b"ok", b"ok"], False)
    assert x.shape == (2, 1, 4, 4) and x.dtype == torch.uint8
    assert int(x[0, 0, 0, 0]) == round(0.299 * 200 + 0.587 * 100 + 0.114 * 50)            # 125, not the mean 117
    assert int(x[0, 0, 0, 0]) == np.asarray(Image.new("RGB", (1, 1), (200, 100, 50)).convert("L"))[0, 0]
    with pytest.raises(SampleError) as info:
        dec.decode([b"ok", b"ok", b"bad", b"ok"], False)
    assert info.value.k == 2 and "nvjpegDecodeBatched failed" in str(info.value)
