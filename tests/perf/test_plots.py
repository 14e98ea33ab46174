"""The timeline and roofline pictures are written and are valid images."""
from __future__ import annotations

import pytest

from nki_ssm import perf
from nki_ssm.perf.plots import roofline_png
from tests.perf.test_model import _loop

pytest.importorskip("matplotlib")


def test_timeline_png_is_an_image(tmp_path):
    import matplotlib.image as mpimg

    t = perf.model(_loop(6, True))
    out = perf.timeline_png(t, tmp_path / "timeline.png")
    img = mpimg.imread(out)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 800
    # from a trace as well
    out2 = perf.timeline_png(_loop(2, False), tmp_path / "t2.png", target="trn3")
    assert mpimg.imread(out2).shape[1] > 800


def test_roofline_png_is_an_image(tmp_path):
    import matplotlib.image as mpimg

    pts = [dict(label="a", flops=1e9, hbm_bytes=1e7, time_ns=1e5, roofline_fraction=0.3),
           dict(label="b", flops=0, hbm_bytes=1e6, time_ns=1e4)]
    out = roofline_png(pts, tmp_path / "roof.png", target="trn2")
    assert mpimg.imread(out).ndim == 3


def test_roofline_png_groups_many_points(tmp_path):
    import matplotlib.image as mpimg

    pts = [dict(label=f"op{k % 3}/model{k % 4}/x/bf16", flops=1e9 * (k + 1), hbm_bytes=1e7, time_ns=1e5)
           for k in range(20)]
    out = roofline_png(pts, tmp_path / "roof.png", target="trn3")
    img = mpimg.imread(out)
    assert img.ndim == 3 and img.shape[1] < 2000   # legend grouped, not one entry per point
