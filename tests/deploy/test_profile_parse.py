"""Parsing of neuron-explorer summary-json (checked-in FABRICATED samples, data/README.md),
capture / view command lines, NTFF names, percentiles, toolchain checks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.bench import profiler as PR
from deploy.bench import toolchain as TC

DATA = Path(__file__).parent / "data"


def test_summary_keyed_by_hash():
    s = PR.parse_summary((DATA / "summary_keyed.json").read_text())
    assert s["total_time"] == pytest.approx(6.12e-4)
    assert s["mbu_estimated_percent"] == 0.61 and s["hardware_flops"] == 268435456
    assert "_note" not in s                       # only the documented fields are kept


def test_summary_bare_object_and_missing_time():
    assert PR.parse_summary(json.loads((DATA / "summary_bare.json").read_text()))["total_time"] == 1.3e-4
    with pytest.raises(ValueError, match="no 'total_time'"):
        PR.parse_summary((DATA / "summary_no_time.json").read_text())
    with pytest.raises(ValueError, match="positive"):
        PR.parse_summary({"k": {"total_time": 0}})
    with pytest.raises(ValueError, match="expected an object"):
        PR.parse_summary("[1, 2]")


def test_commands_and_ntff_names():
    assert PR.ntff_names(1) == ["profile.ntff"]
    assert PR.ntff_names(3) == ["profile.ntff", "profile_exec_2.ntff", "profile_exec_3.ntff"]
    with pytest.raises(ValueError):
        PR.ntff_names(0)
    assert PR.capture_argv("ne", "k.neff", "p.ntff", [("x", "x.bin"), ("w", "w.bin")], 23) == [
        "ne", "capture", "-n", "k.neff", "-s", "p.ntff", "--num-exec", "23", "x", "x.bin", "w", "w.bin"]
    assert PR.view_argv("ne", "k.neff", "p.ntff") == [
        "ne", "view", "-n", "k.neff", "-s", "p.ntff", "--output-format", "summary-json"]


def test_stats_drop_the_warmup():
    times = [9e-5, 8e-5, 1e-5, 2e-5, 3e-5, 4e-5]
    st = PR.stats_ns(times, warmup=2)
    assert st["p50_ns"] == pytest.approx(25e3) and st["min_ns"] == pytest.approx(10e3)
    assert st["p90_ns"] == pytest.approx(37e3) and st["runs"] == 4 and st["warmup"] == 2
    with pytest.raises(ValueError, match="more than warmup"):
        PR.stats_ns(times[:2], warmup=2)


def test_profile_pairs_summaries_with_executions(tmp_path):
    """profile() with a scripted runner: one view per execution, the median run's summary kept."""
    neff = tmp_path / "kernel.neff"
    neff.write_bytes(b"x")
    seen = []
    times = {"profile": 5e-5, "profile_exec_2": 3e-5, "profile_exec_3": 1e-5, "profile_exec_4": 2e-5}

    def run(argv, cwd, stdout_path, timeout):
        seen.append(argv[1])
        if argv[1] == "capture":
            for name in PR.ntff_names(int(argv[argv.index("--num-exec") + 1])):
                (cwd / name).write_text("")
        else:
            key = Path(argv[argv.index("-s") + 1]).stem
            stdout_path.write_text(json.dumps({"h": {"total_time": times[key], "mbu_estimated_percent": key}}))

    st = PR.profile(neff, [("x", "x.bin")], tmp_path / "prof", warmup=1, runs=3, tool="ne", run=run)
    assert seen == ["capture", "view", "view", "view", "view"]
    assert st["per_exec_s"] == [5e-5, 3e-5, 1e-5, 2e-5]
    assert st["p50_ns"] == pytest.approx(20e3) and st["summary"]["mbu_estimated_percent"] == "profile_exec_4"


def test_toolchain_pins():
    pins = {"nki": "0.5.0", "aws-neuronx-tools": "2.31.13.0"}
    assert TC.mismatches({"nki": "0.5.0", "aws-neuronx-tools": "2.31.13.0-abcdef"}, pins, "2.31.0") == []
    bad = TC.mismatches({"nki": "0.6.0", "aws-neuronx-tools": None}, pins, "2.31.0")
    assert bad == ["nki: 0.6.0 installed, SDK 2.31.0 pins 0.5.0",
                   "aws-neuronx-tools: not installed (want 2.31.13.0)"]
    assert TC.mismatches({"nki": "0.5.01"}, {"nki": "0.5.0"}) != []        # no prefix matching
    assert TC.neuron_devices('[{"neuron_device": 0}, {"neuron_device": 1}]') == 2
    assert TC.neuron_devices("[]") == 0
