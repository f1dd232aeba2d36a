"""Decoding a crop at decode time (hpctrain/data/decoders.py) against plain Pillow.

The reference decodes the JPEG with Pillow, cuts the same box with sub-pixel precision
(``resize(box=...)``), resizes it to the output with Pillow's bilinear filter and mirrors: what a
torchvision user's ``RandomResizedCrop`` does. Tolerances (grey levels, stated and measured on these
photos):

* no DCT scaling (the box is under twice the output): mean absolute difference at most 1, 99th
  percentile at most 12 (measured: integer boxes 0.01 / 0-1; the evaluation box, rounded to whole
  pixels here, 0.4-0.9 / 4-10);
* DCT scaling (1/2..1/4 here): against Pillow with the same ``draft`` scale, mean at most 1.5 and
  99th percentile at most 16 (measured 0-1.2 / 0-14: the scaled box is rounded to whole pixels);
  against the full decode, mean at most 3.5 and 99th percentile at most 36 (measured 1.3-3.0 /
  15-32: libjpeg's scaled IDCT is another low-pass filter than Pillow's bilinear one).

Both backends run libjpeg-turbo and the same resize: they must agree bit for bit.
"""
import io

import numpy as np
import pytest
from PIL import Image

from hpctrain.tools.bench.input_data import photos
from hpctrain.data import crops, decoders

FULL, SAME_DRAFT, DRAFT_VS_FULL = (1.0, 12), (1.5, 16), (3.5, 36)     # (mean, 99th percentile)


def reference(blob, crop, out_h, out_w, draft=1):
    with Image.open(io.BytesIO(blob)) as img:
        w, h = img.size
        if draft > 1:
            img.draft("RGB", (w // draft, h // draft))
        img = img.convert("RGB")
        sx, sy = img.width / w, img.height / h
        box = (crop.left * sx, crop.top * sy, (crop.left + crop.width) * sx, (crop.top + crop.height) * sy)
        img = img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=box)
        if crop.flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(img).transpose(2, 0, 1)


def backends():
    return ["pil"] + (["simplejpeg"] if decoders.simplejpeg_module() else [])


@pytest.fixture(scope="module")
def blobs():
    return photos(6, seed=3) + photos(2, seed=4, size=(1200, 1600), spread=0.05)


def within(d, tol):
    return d.mean() <= tol[0] and np.percentile(d, 99) <= tol[1]


@pytest.mark.parametrize("backend", backends())
def test_crops_agree_with_pillow_within_tolerance(blobs, backend):
    out_h = out_w = 224
    for k, blob in enumerate(blobs):
        size = decoders.image_size(blob, backend)
        with Image.open(io.BytesIO(blob)) as img:
            assert size == (img.height, img.width)
        for crop in [crops.rrc_box(*size, crops.sample_rng(0, 0, k)), crops.center_box(*size, out_h, out_w),
                     crops.Crop(0, 0, size[0], size[1], True)]:
            out = np.empty((3, out_h, out_w), np.uint8)
            decoders.decode_crop(blob, crop, size, out_h, out_w, 3, out, backend)
            d = np.abs(out.astype(int) - reference(blob, crop, out_h, out_w))
            s = crops.dct_scale(crop, out_h, out_w)
            if s == 1:
                assert within(d, FULL), (k, crop, d.mean(), np.percentile(d, 99))
                continue
            assert within(d, DRAFT_VS_FULL), (k, crop, d.mean(), np.percentile(d, 99))
            d = np.abs(out.astype(int) - reference(blob, crop, out_h, out_w, draft=s))
            assert within(d, SAME_DRAFT), (k, crop, d.mean(), np.percentile(d, 99))


def test_backends_agree_bit_for_bit(blobs):
    if len(backends()) < 2:
        pytest.skip("simplejpeg is not installed")
    for k, blob in enumerate(blobs):
        size = decoders.image_size(blob, "pil")
        crop = crops.rrc_box(*size, crops.sample_rng(1, 0, k))
        a, b = (np.empty((3, 64, 64), np.uint8) for _ in range(2))
        decoders.decode_crop(blob, crop, size, 64, 64, 3, a, "pil")
        decoders.decode_crop(blob, crop, size, 64, 64, 3, b, "simplejpeg")
        assert np.array_equal(a, b), k


@pytest.mark.parametrize("backend", backends())
def test_large_photo_is_decoded_scaled_in_the_dct_domain(blobs, backend, monkeypatch):
    """A 1200 x 1600 photo cut whole to 224: the decoder hands Pillow a picture a quarter the size."""
    seen = []
    real = decoders._finish
    monkeypatch.setattr(decoders, "_finish", lambda a, *rest: (seen.append(a.shape[1::-1]), real(a, *rest)))
    blob = blobs[-1]
    size = decoders.image_size(blob, backend)
    out = np.empty((3, 224, 224), np.uint8)
    decoders.decode_crop(blob, crops.Crop(0, 0, *size), size, 224, 224, 3, out, backend)
    w, h = seen[0]
    assert 224 <= h <= size[0] // 4 + 1 and 224 <= w <= size[1] // 4 + 1


def test_greyscale_output_and_greyscale_files():
    img = Image.fromarray(np.tile(np.arange(200, dtype=np.uint8), (150, 1)), "L")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95)
    for backend in backends():
        out = np.empty((1, 32, 32), np.uint8)
        decoders.decode_crop(buf.getvalue(), crops.Crop(0, 0, 150, 200), (150, 200), 32, 32, 1, out, backend)
        assert abs(float(out.mean()) - 99.5) < 3      # the mean of the ramp survives
        rgb = np.empty((3, 32, 32), np.uint8)
        decoders.decode_crop(buf.getvalue(), crops.Crop(0, 0, 150, 200), (150, 200), 32, 32, 3, rgb, backend)
        assert np.abs(rgb[0].astype(int) - rgb[2]).max() <= 1


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="JPEG backend 'nvjpeg'"):
        decoders.resolve("nvjpeg")
