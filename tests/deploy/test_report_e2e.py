"""Measured vs modeled end to end on a FABRICATED results file (data/README.md): the report
(table + plot), the CLI verb, and the calibration rows the cost model takes from it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from deploy import report as REP
from deploy.__main__ import main as deploy_main

DATA = Path(__file__).parent / "data"


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir()
    shutil.copy(DATA / "results_fabricated.json", path)
    return path


def test_report_table_and_plot(results):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg

    paths = REP.write(results)
    md = Path(paths["report"]).read_text()
    assert "| case | status | compile |" in md
    # the passed conv row: measured p50 / p90, modeled central and range, ratio, in range
    assert "610 us / 640 us (measured, 20 runs)" in md
    assert "700 us [520 us–700 us] (modeled, trn2)" in md
    assert "| 0.87 | yes |" in md
    # SSD decode measured above the modeled range: ratio 1.37, not in range
    assert "| 1.37 | no |" in md
    assert "failed: rel err out 0.4" in md and "compile_error: RuntimeError: fabricated" in md
    assert "## Compiler warnings" in md and "WARNING: fabricated warning" in md
    img = mpimg.imread(paths["plot"])
    assert img.shape[0] > 300 and img.shape[1] > 300


def test_report_verb(results, capsys):
    pytest.importorskip("matplotlib")
    assert deploy_main(["report", str(results.parent)]) == 0
    out = capsys.readouterr().out
    assert "ssd_decode/mamba2-2.7b/32seq/bf16,state-fp32" in out and "report:" in out
    assert (results.parent / "measured_vs_modeled.png").is_file()


def test_report_refuses_a_simulate_results_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"target": "trn2", "cases": []}))
    with pytest.raises(ValueError, match="no 'measured' rows"):
        REP.write(path)


def test_measured_rows_become_calibration_rows(results, capsys):
    from nki_ssm.perf import measured

    rows = measured.calibration_rows(results)
    # only passed, timed rows with a modeled figure: the failed and the uncompiled ones are out
    assert [r.name for r in rows] == ["short_conv_prefill/qwen3-next/1x16384/bf16,w-bf16,nobias,pool-bf16",
                                      "ssd_decode/mamba2-2.7b/32seq/bf16,state-fp32"]
    conv, ssd = rows
    assert conv.published_ns == 610000.0 and conv.modeled_ns == 700000.0
    assert conv.ratio == pytest.approx(700 / 610) and conv.kind == "check" and conv.within_band
    assert "trn2.3xlarge" in conv.source and "2.31.1" in conv.source
    assert ssd.extra["modeled_ns_low"] == 61000.0
    assert measured.main([str(results)]) == 0
    assert "ssd_decode/mamba2-2.7b/32seq" in capsys.readouterr().out
