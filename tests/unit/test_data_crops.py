"""The crop boxes cut at decode time (hpctrain/data/crops.py) against an independent computation.

The reference is the ImageNet box procedure as torchvision documents it (``RandomResizedCrop``),
written here with Python's own ``random`` module: a different generator and code. Thousands of
boxes from each are compared by distribution (two-sample Kolmogorov–Smirnov distance under the
0.1 % critical value) on the area fraction, the log aspect ratio and the box centre, and the
hard properties are checked on every box.
"""
import math
import random

import numpy as np
import pytest

from hpctrain.data import crops

N = 3000


def reference_box(h, w, rnd, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    for _ in range(10):
        target = h * w * rnd.uniform(*scale)
        aspect = math.exp(rnd.uniform(math.log(ratio[0]), math.log(ratio[1])))
        bw, bh = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < bw <= w and 0 < bh <= h:
            return rnd.randint(0, h - bh), rnd.randint(0, w - bw), bh, bw
    r = w / h
    if r < ratio[0]:
        bw, bh = w, int(round(w / ratio[0]))
    elif r > ratio[1]:
        bh, bw = h, int(round(h * ratio[1]))
    else:
        bh, bw = h, w
    return (h - bh) // 2, (w - bw) // 2, bh, bw


def features(boxes, h, w):
    b = np.asarray(boxes, float)
    top, left, bh, bw = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return {"area": bh * bw / (h * w), "log_aspect": np.log(bw / bh),
            "cy": (top + bh / 2) / h, "cx": (left + bw / 2) / w}


def ks_distance(a, b):
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return np.abs(fa - fb).max()


@pytest.mark.parametrize("h,w", [(340, 400), (500, 120), (64, 64)])
def test_box_statistics_match_the_reference_procedure(h, w):
    ours = [crops.rrc_box(h, w, crops.sample_rng(7, 1, p)) for p in range(N)]
    rnd = random.Random(12345)
    ref = [reference_box(h, w, rnd) for _ in range(N)]
    fo, fr = features([c[:4] for c in ours], h, w), features(ref, h, w)
    critical = 1.95 * math.sqrt(2 / N)             # two-sample KS, alpha = 0.001
    for key in fo:
        assert ks_distance(fo[key], fr[key]) < critical, key
    for c in ours:                                  # every box: whole pixels, inside the image
        assert c.top == int(c.top) and c.left == int(c.left) and c.height >= 1 and c.width >= 1
        assert 0 <= c.top and c.top + c.height <= h and 0 <= c.left and c.left + c.width <= w
    flips = sum(c.flip for c in ours)
    assert abs(flips - N / 2) < 4 * math.sqrt(N / 4)


def test_area_and_aspect_stay_in_the_recipe_ranges_when_the_first_try_fits():
    """A large square image: the area fraction is in [0.08, 1] and the aspect in [3/4, 4/3]
    (up to the rounding of the sides to whole pixels) for boxes that were not the fallback."""
    h = w = 1000
    f = features([crops.rrc_box(h, w, crops.sample_rng(0, 3, p))[:4] for p in range(N)], h, w)
    assert f["area"].min() >= 0.08 - 0.002 and f["area"].max() <= 1.0
    assert np.exp(f["log_aspect"]).min() >= 0.75 - 0.003 and np.exp(f["log_aspect"]).max() <= 4 / 3 + 0.003
    # uniform area fraction among accepted boxes: its mean is below 0.54 (= mean of U(0.08, 1))
    # because large boxes with extreme aspects are rejected more often
    assert 0.45 < f["area"].mean() < 0.54


def test_a_box_is_a_function_of_its_coordinates_only():
    a = crops.rrc_box(300, 400, crops.sample_rng(1, 2, 4))
    assert a == crops.rrc_box(300, 400, crops.sample_rng(1, 2, 4))
    others = {crops.rrc_box(300, 400, crops.sample_rng(*k)) for k in [(0, 2, 4), (1, 0, 4), (1, 2, 5)]}
    assert a not in others
    batch = crops.train_crops([(300, 400)] * 3, 1, 2, 2)
    assert batch[2] == a


def test_center_box_is_resize_256_then_centre_224():
    """Independent arithmetic: the shorter side 340 → 256 scales by 256/340, so the 224 window is
    224·340/256 = 297.5 stored pixels, centred."""
    c = crops.center_box(340, 400, 224, 224)
    assert c.height == pytest.approx(297.5) and c.width == pytest.approx(297.5)
    assert c.top == pytest.approx((340 - 297.5) / 2) and c.left == pytest.approx((400 - 297.5) / 2)
    assert not c.flip


@pytest.mark.parametrize("box,out,want", [((1200, 1600), 224, 4), ((400, 400), 224, 1), ((448, 900), 224, 2),
                                          ((3000, 3000), 224, 8), ((300, 3000), 224, 1)])
def test_dct_scale_never_shrinks_the_box_below_the_output(box, out, want):
    c = crops.Crop(0, 0, *box)
    s = crops.dct_scale(c, out, out)
    assert s == want
    assert box[0] / s >= out or s == 1
