"""Calibration table: >= 12 check rows across trn1/trn2, fp32/bf16 and the engines that bind,
every check row within 0.77-1.30 of its published figure, fit rows apart.

Micro-kernel rows run here; published-kernel rows are read from the checked-in record
(nki_ssm/perf/calibration_published.json), which must have been produced by the current
model (fingerprint). With NKI_SSM_PUBLISHED_KERNELS=<checkout of aws-neuron-sdk> the
small published rows are re-run and must reproduce the record. Run with -s to see the table.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from nki_ssm.perf.calibration import (CHECK_BAND, FIT_BAND, fingerprint, load_published_data, off_regimes,
                                      run_calibration, run_published, summarize, table_markdown)


@pytest.fixture(scope="module")
def rows():
    pytest.importorskip("nki_ssm.sim.jit")
    return run_calibration()


def test_record_is_from_the_current_model():
    data = load_published_data()
    assert data.get("rows"), "calibration_published.json is missing: run python -m nki_ssm.perf.calibration --kernels-from"
    assert data["model_fingerprint"] == fingerprint(), (
        "the cost model changed since calibration_published.json was written: re-run "
        "python -m nki_ssm.perf.calibration --kernels-from <aws-neuron-sdk checkout>")
    assert data["sdk_commit"] and "github.com/aws-neuron/aws-neuron-sdk" in data["sdk"]
    assert data["nxdi_commit"] and "github.com/aws-neuron/neuronx-distributed-inference" in data["nxdi"]


def test_every_row_ran_and_sits_in_its_band(rows):
    print("\n" + table_markdown(rows) + "\n\n" + summarize(rows))
    for r in rows:
        assert r.error is None, f"{r.name} did not run: {r.error}"
        lo, hi = CHECK_BAND if r.kind == "check" else FIT_BAND
        assert lo <= r.ratio <= hi, f"{r.name}: modeled/published = {r.ratio:.2f} outside [{lo}, {hi}]"
    assert off_regimes(rows) == {}


def test_check_rows_cover_targets_dtypes_and_engines(rows):
    checks = [r for r in rows if r.kind == "check"]
    assert len(checks) >= 12
    assert {r.target for r in checks} >= {"trn1", "trn2"}
    assert {r.dtype for r in checks} >= {"fp32", "bf16"}
    assert {r.regime for r in checks} >= {"tensor", "dma", "vector", "scalar"}
    assert sum(r.origin == "published" for r in checks) >= 5     # the published kernels themselves
    for r in rows:
        assert "https://" in r.source or "SINGLE UNOFFICIAL SOURCE" in r.source, r.name
        assert r.kind in ("check", "fit")
    from nki_ssm.perf.hardware import CALIBRATED

    # every fitted constant names the row it was read off, and that row is a fit row
    fits = {r.name for r in rows if r.kind == "fit"}
    for const, why in CALIBRATED.items():
        assert any(name in why for name in fits) or "§9 row 10" in why, (const, why)


def test_published_kernels_computed_the_right_answer(rows):
    for r in rows:
        if r.origin != "published":
            continue
        err = r.extra.get("rel_err_first_rows", r.extra.get("rel_err_first_tile", r.extra.get("rel_err")))
        assert err is not None and err < (2e-2 if r.dtype == "bf16" else 1e-4), (r.name, err)


def test_ranges_bracket_the_central_figures(rows):
    for r in rows:
        if r.low_ns is not None:
            assert r.low_ns <= r.modeled_ns <= r.high_ns, r.name
        if r.p10_ns is not None:
            assert r.p10_ns <= r.modeled_ns <= r.p90_ns, r.name


# The check rows before issue 28: none of them may become a fit row.
CHECK_ROWS = ("matmul_tiled", "matmul_block_free", "matmul_fully_optimized", "mamba_v1_256ch", "mamba_v1_4096ch",
              "mamba_v3_4096ch_2k", "mamba_v3_4096ch_8k", "dma_4x4096_one_engine", "dma_128x128_16_engines",
              "exp_4x4096_instruction", "exp_128x128_instruction", "exp_kernel_4x4096_span",
              "exp_kernel_128x128_span", "vector_128x512_op")


def test_the_deltanet_slope_is_a_fit_row_and_the_old_checks_stay_checks(rows):
    by = {r.name: r for r in rows}
    assert all(by[name].kind == "check" for name in CHECK_ROWS)
    dn = by["deltanet_fused_slope"]
    assert (dn.kind, dn.measure, dn.origin, dn.target) == ("fit", "slope", "published", "trn2")
    assert dn.published_ns == pytest.approx((487e3 - 335e3) / 3)
    assert "neuronx-distributed-inference/blob/19feb8992f5e111421e498fa56e625f9c072df5f" in dn.source
    # the slope is the difference of the two modeled runs per chunk added
    at = dn.extra["modeled_ns_at"]
    assert dn.modeled_ns == pytest.approx((at["512"] - at["128"]) / 3)


def test_table_lists_fit_rows_apart(rows):
    md = table_markdown(rows)
    checks_at, fits_at = md.index("**Check rows"), md.index("**Fit rows")
    for r in rows:
        at = md.index(f"| {r.name} |")
        assert (checks_at < at < fits_at) if r.kind == "check" else at > fits_at


@pytest.mark.skipif(not os.environ.get("NKI_SSM_PUBLISHED_KERNELS"),
                    reason="set NKI_SSM_PUBLISHED_KERNELS to a checkout of aws-neuron/aws-neuron-sdk")
def test_published_small_rows_reproduce_the_record():
    # NKI_SSM_PUBLISHED_NXDI (optional): a checkout of aws-neuron/neuronx-distributed-inference
    pytest.importorskip("nki_ssm.sim.jit")
    stored = {r["name"]: r for r in load_published_data()["rows"]}
    dirs, names = [Path(os.environ["NKI_SSM_PUBLISHED_KERNELS"])], {"mamba_v1_256ch"}
    if os.environ.get("NKI_SSM_PUBLISHED_NXDI"):
        dirs.append(Path(os.environ["NKI_SSM_PUBLISHED_NXDI"]))
        names.add("deltanet_fused_slope")
    fresh = run_published(dirs, names=names)
    assert {r.name for r in fresh} == names
    for r in fresh:
        assert r.error is None, r.error
        assert r.modeled_ns == pytest.approx(stored[r.name]["modeled_ns"], rel=1e-9)
