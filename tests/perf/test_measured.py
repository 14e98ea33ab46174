"""nki_ssm.perf.measured: measured rows (deploy.bench results.json) -> calibration rows."""
from __future__ import annotations

import json

import pytest

from nki_ssm.perf.calibration import CalibrationRow
from nki_ssm.perf.measured import calibration_rows, load_measured, main


def _results():
    def row(case_id, status, p50, modeled, **kw):
        return dict({"case_id": case_id, "status": status, "target": "trn2", "measured_ns_p50": p50,
                     "measured_ns_p90": p50 and p50 * 1.1, "modeled_ns": modeled,
                     "modeled_ns_low": modeled and modeled * 0.7, "modeled_ns_high": modeled,
                     "runs": 20, "compile_s": 3.0}, **kw)
    return {"instance_type": "trn2.3xlarge", "target": "trn2", "mode": "device",
            "toolchain": {"sdk_release": "2.31.1"},
            "measured": [row("a/x/1seq/bf16", "passed", 2000.0, 1000.0),
                         row("b/x/1seq/bf16", "failed", 3000.0, 1000.0),     # wrong answer: out
                         row("c/x/1seq/bf16", "passed", None, 1000.0),       # not timed: out
                         row("d/x/1seq/bf16", "passed", 500.0, None),        # not modeled: out
                         row("e/x/1seq/bf16", "compiled", None, 800.0)]}


def test_only_passed_timed_modeled_rows_become_check_rows():
    (r,) = calibration_rows(_results())
    assert isinstance(r, CalibrationRow)
    assert r.name == "a/x/1seq/bf16" and r.target == "trn2" and r.kind == "check"
    assert r.published_ns == 2000.0 and r.modeled_ns == 1000.0 and r.ratio == pytest.approx(0.5)
    assert not r.within_band                  # 0.5 is outside the 0.77-1.30 check band (issue 11)
    assert "trn2.3xlarge" in r.source and "SDK 2.31.1" in r.source and "20 runs" in r.source
    assert r.extra["measured_ns_p90"] == pytest.approx(2200.0) and r.extra["modeled_ns_low"] == 700.0


def test_reads_a_file_or_folder_and_rejects_other_json(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    assert [r.name for r in calibration_rows(tmp_path)] == ["a/x/1seq/bf16"]
    rows, meta = load_measured(tmp_path / "results.json")
    assert len(rows) == 5 and meta["sdk_release"] == "2.31.1"
    with pytest.raises(ValueError, match="no 'measured' list"):
        calibration_rows({"cases": []})
    assert main([str(tmp_path / "results.json")]) == 0
    assert "a/x/1seq/bf16" in capsys.readouterr().out
    assert main([]) == 2


def test_calibration_cli_prints_measured_rows_after_the_table(capsys):
    """`python -m nki_ssm.perf.calibration --measured results.json` (issue 13 item 3)."""
    from pathlib import Path

    from nki_ssm.perf import calibration

    path = Path(__file__).parents[1] / "deploy" / "data" / "results_fabricated.json"
    want = [r.name for r in calibration_rows(str(path))]
    assert want
    assert calibration.main(["--only", "launch_overhead", "--measured", str(path)]) == 0
    out = capsys.readouterr().out
    assert "launch_overhead" in out and all(name in out for name in want)
