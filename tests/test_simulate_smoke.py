"""The main job end to end on tiny shapes: report files, JSON fields, valid PNGs."""
from __future__ import annotations

import json

import pytest

from simulate.__main__ import main
from simulate.run import NO_KERNEL

pytest.importorskip("matplotlib")


def test_smoke_run_writes_report(tmp_path):
    import matplotlib.image as mpimg

    out = tmp_path / "report"
    code = main(["--smoke", "--out", str(out), "--no-calibration"])
    assert (out / "report.md").is_file() and (out / "results.json").is_file()
    data = json.loads((out / "results.json").read_text())
    assert data["target"] == "trn2" and data["case_set"] == "smoke"
    cases = data["cases"]
    assert len(cases) == 6
    for c in cases:
        for key in ("case_id", "status", "err_out", "err_state", "modeled_ns", "tokens_per_s",
                    "bytes_per_s", "roofline_fraction", "binding_engine", "min_flops", "min_hbm_bytes"):
            assert key in c
        assert c["status"] in ("kernel", NO_KERNEL, "error")
        if c["status"] == "kernel":
            assert c["modeled_ns"] > 0 and 0 < c["roofline_fraction"] <= 1.0
            assert 0 < c["modeled_ns_optimistic"] <= c["modeled_ns"] * 1.05
            assert c["binding_engine"] in ("tensor", "vector", "scalar", "gpsimd", "dma")
            assert c["err_out"] < 1e-2, c
        if c["status"] == NO_KERNEL:
            assert c["modeled_ns"] is None  # no invented times
    assert code == (1 if any(c["status"] == "error" for c in cases) else 0)
    md = (out / "report.md").read_text()
    assert "modeled, trn2" in md or not any(c["status"] == "kernel" for c in cases)
    img = mpimg.imread(out / "roofline.png")
    assert img.ndim == 3 and img.shape[0] > 100
    if any(c["status"] == "kernel" for c in cases):
        for name in ("timeline.png", "timeline_zoom.png", "engines.png"):
            assert mpimg.imread(out / name).shape[1] > 500


def test_selection_and_list(capsys):
    assert main(["--smoke", "--op", "ssd_decode", "--list"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines == ["ssd_decode/tiny/2seq/bfloat16"]
    assert main(["--smoke", "--model", "no-such-model", "--list"]) == 0
    assert capsys.readouterr().out == ""


def test_flop_models_match_peers_yardstick_counts():
    # peers.md §10.1: GDN 180,224 FLOP per token per value head (K=V=128, C=64);
    # SSD 131,072 per token per head (P=64, N=128, C=256)
    from nki_ssm.reference import shapes as S
    from simulate.cases import Case

    gdn = Case("gated_delta", "prefill", "x", S.GDNShape("g", H=1, HV=1, K=128, V=128), seqlens=(10,))
    assert gdn.min_flops() == 10 * 180_224
    ssd = Case("mamba2_ssd", "prefill", "x", S.SSDShape("s", H=1, P=64, N=128, G=1), seqlens=(10,),
               chunk_size=256)
    assert ssd.min_flops() == 10 * 131_072


def test_min_hbm_bytes_counts_inputs_outputs_and_named_slots():
    import numpy as np

    from nki_ssm.reference import shapes as S
    from simulate.cases import Case

    c = Case("gated_delta", "decode", "x", S.GDNShape("g", H=1, HV=2, K=128, V=128), num_seqs=3)
    kw = c.make_inputs(0)
    live = int((kw["state_indices"] >= 0).sum())
    state = 2 * 128 * 128 * np.dtype(c.pool_dtype).itemsize
    small = sum(v.nbytes for k, v in kw.items()
                if isinstance(v, np.ndarray) and k != "ssm_states" and v.dtype.kind == "f")
    assert c.min_hbm_bytes(kw) == small + 2 * live * state + kw["v"].nbytes


def test_failing_kernel_is_reported_not_fatal(monkeypatch):
    from simulate import run as run_mod
    from simulate.cases import smoke_cases

    case = next(c for c in smoke_cases() if c.op == "ssd_decode")
    monkeypatch.setattr(run_mod, "has_kernel", lambda c: True)

    def boom(**kw):
        raise RuntimeError("kernel exploded")

    import nki_ssm.ops as ops
    monkeypatch.setattr(ops, "ssd_decode", boom)
    res, timing = run_mod.run_case(case)
    assert res.status == "error" and "kernel exploded" in res.error
    assert timing is None and res.modeled_ns is None


def test_cases_over_the_pool_budget_are_skipped(tmp_path):
    out = tmp_path / "r"
    assert main(["--smoke", "--op", "ssd_decode", "--max-pool-gb", "0", "--no-calibration",
                 "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    (c,) = data["cases"]
    assert c["status"] == "skipped" and "state pool" in c["error"] and c["modeled_ns"] is None


def test_grouped_decode_reference_matches_one_call(monkeypatch):
    import numpy as np

    from nki_ssm.reference import metrics
    from nki_ssm.reference import shapes as S
    from simulate import run as run_mod
    from simulate.cases import Case

    for case in (Case("mamba2_ssd", "decode", "x", S.SSDShape("s", H=2, P=8, N=16, G=1), num_seqs=7),
                 Case("gated_delta", "decode", "x", S.GDNShape("g", H=1, HV=2, K=16, V=16), num_seqs=7, T=2),
                 Case("short_conv", "decode", "x", S.ConvShape("c", dim=32, W=4), num_seqs=7)):
        kw = case.make_inputs(3)
        kw["state_indices"][2] = -1      # a padding sequence in the middle
        pool = run_mod._pool_name(case)
        idx = kw["state_indices"]
        ref_out, ref_pool = run_mod._reference_fn(case)(**kw)[:2]
        noisy = np.asarray(ref_pool)[idx[idx >= 0]] * (1 + 1e-3)   # a "kernel" state 1e-3 off
        whole_out, whole_err = run_mod._reference_errors(case, kw, pool, noisy)
        monkeypatch.setattr(run_mod, "_REF_GROUP_BYTES", kw[pool][0].size * 8 * 3)  # groups of 3
        out, err = run_mod._reference_errors(case, kw, pool, noisy)
        monkeypatch.undo()
        np.testing.assert_array_equal(out, whole_out)
        np.testing.assert_array_equal(out, ref_out)
        assert whole_err == pytest.approx(1e-3, rel=1e-6)
        assert err == pytest.approx(whole_err, rel=1e-12)
        assert err == pytest.approx(metrics.rel_fro(noisy, np.asarray(ref_pool)[idx[idx >= 0]]), rel=1e-12)
