"""Decoding a crop at decode time (hpctrain/data/decoders.py) against plain Pillow.

The reference decodes the whole JPEG with Pillow (no DCT scaling), cuts the same box and resizes
it to the output with Pillow's bilinear filter, then mirrors: what a torchvision user's
``RandomResizedCrop`` does. Tolerance: where the box is too small for DCT scaling the pixels must
be identical (both backends run libjpeg-turbo's full IDCT and the same resize). Where the decoder
scales by 1/2..1/8 in the DCT domain the low-pass filter differs from Pillow's bilinear one: mean
absolute difference at most 3 grey levels and 99th percentile at most 32 (measured here on these
photos: means 1.3-2.6, 99th percentiles 13-26, largest single pixel 79 on an edge).
"""
import io

import numpy as np
import pytest
from PIL import Image

from hpctrain.bench.input_data import photos
from hpctrain.data import crops, decoders

TOL_MEAN, TOL_P99 = 3.0, 32


def reference(blob, crop, out_h, out_w):
    with Image.open(io.BytesIO(blob)) as img:
        img = img.convert("RGB")
        box = (crop.left, crop.top, crop.left + crop.width, crop.top + crop.height)
        img = img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=box)
        if crop.flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(img).transpose(2, 0, 1)


def backends():
    return ["pil"] + (["simplejpeg"] if decoders.simplejpeg_module() else [])


@pytest.fixture(scope="module")
def blobs():
    return photos(6, seed=3) + photos(2, seed=4, size=(1200, 1600), spread=0.05)


@pytest.mark.parametrize("backend", backends())
def test_crops_agree_with_pillow_within_tolerance(blobs, backend):
    out_h = out_w = 224
    for k, blob in enumerate(blobs):
        size = decoders.image_size(blob, backend)
        with Image.open(io.BytesIO(blob)) as img:
            assert size == (img.height, img.width)
        for crop in [crops.rrc_box(*size, crops.sample_rng(0, 0, 0, k)), crops.center_box(*size, out_h, out_w),
                     crops.Crop(0, 0, size[0], size[1], True)]:
            out = np.empty((3, out_h, out_w), np.uint8)
            decoders.decode_crop(blob, crop, size, out_h, out_w, 3, out, backend)
            d = np.abs(out.astype(int) - reference(blob, crop, out_h, out_w))
            if crops.dct_scale(crop, out_h, out_w) == 1:
                assert d.max() == 0, (k, crop)
                continue
            assert d.mean() <= TOL_MEAN and np.percentile(d, 99) <= TOL_P99, (k, crop, d.mean(), np.percentile(d, 99))


@pytest.mark.parametrize("backend", backends())
def test_large_photo_is_decoded_scaled_in_the_dct_domain(blobs, backend, monkeypatch):
    """A 1200 x 1600 photo cut whole to 224: the decoder hands Pillow a picture a quarter the size."""
    seen = []
    real = decoders._finish
    monkeypatch.setattr(decoders, "_finish", lambda img, *a: (seen.append(img.size), real(img, *a)))
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
