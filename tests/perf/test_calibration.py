"""Calibration table: modeled / published for nki_spec §9 measurements, within the stated band.

Run with -s to see the table. The band is justified in nki_ssm/perf/calibration.py.
"""
from __future__ import annotations

import pytest

from nki_ssm.perf.calibration import CHECK_BAND, FIT_BAND, run_calibration, summarize, table_markdown


@pytest.fixture(scope="module")
def rows():
    pytest.importorskip("nki_ssm.sim.jit")
    return run_calibration()


def test_calibration_table_within_band(rows):
    print("\n" + table_markdown(rows) + "\n\n" + summarize(rows))
    assert len(rows) >= 7
    for r in rows:
        assert r.error is None, f"{r.name} did not run: {r.error}"
        lo, hi = CHECK_BAND if r.kind == "check" else FIT_BAND
        assert lo <= r.ratio <= hi, f"{r.name}: modeled/published = {r.ratio:.2f} outside [{lo}, {hi}]"
    assert sum(r.kind == "check" for r in rows) >= 5


def test_calibration_kernels_compute_the_scan(rows):
    # the timed kernels must also be right, or the timing means nothing
    for r in rows:
        if "rel_err_vs_float64" in r.extra:
            assert r.extra["rel_err_vs_float64"] < 1e-5, (r.name, r.extra)


def test_vector_bound_rows_bind_on_vector(rows):
    by = {r.name: r for r in rows}
    for name in ("mamba_v1_256ch", "mamba_v1_4096ch", "mamba_v2_4096ch"):
        assert by[name].binding_engine == "vector"
        assert by[name].extra["vector_share"] > 0.85   # the tutorial reports 92-99.6 % VectorE active
    assert by["dma_32k_one_engine"].extra["engines"] == 1
