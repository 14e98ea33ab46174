"""The on-host steps against the FAKE Neuron toolchain (conftest.fake_toolchain): the
worker drives the op through nki_ssm.ops with backend="neuron", the fake compiler
writes a NEFF, the fake device runs the simulator, the fake neuron-explorer times it."""
from __future__ import annotations

import json

import pytest

from deploy.bench.__main__ import main as bench_main

CASE = "short_conv_decode/tiny/4seq/bf16,w-bf16,bias,pool-bf16"


def _run(tmp_path, *extra, lnc="1"):
    # LNC=1 unless a test asks: the bench's mechanics on one program (the LNC=2 tests below;
    # a kernel that does not shard yet updates its state twice at LNC=2 and fails its check)
    out = tmp_path / "bench"
    code = bench_main(["--set", "smoke", "--case", CASE, "--out", str(out), "--warmup", "3",
                       "--runs", "6", *(["--lnc", lnc] if lnc else []), *extra])
    return code, json.loads((out / "results.json").read_text()), out


def test_device_run_checks_times_and_models(tmp_path, fake_toolchain):
    code, data, out = _run(tmp_path)
    assert code == 0
    assert data["mode"] == "device" and data["toolchain"]["ok"] and data["toolchain"]["devices"] == 1
    # simulate's results.json keys, plus the measured rows
    assert {"target", "case_set", "command", "wall_s", "hardware", "hardware_sources",
            "calibrated_constants", "time_unit", "cases", "calibration", "measured"} <= set(data)
    assert data["hardware"]["name"] == "trn2"
    (m,) = data["measured"]
    assert m["case_id"] == CASE and m["status"] == "passed"
    assert m["err_out"] <= m["tol"] == 3e-3 and m["err_state"] <= 3e-3
    assert m["pool_untouched"] is True and m["padding_zero"] is True
    assert m["neff_bytes"] > 4096 and m["compile_s"] is not None and m["compile_s"] >= 0
    assert any("fake compile" in w for w in m["warnings"])        # compiler output kept
    # fake times: executions 1-3 are warm-up (60 us), then 10 + k % 3 us for k = 4..9
    kept = sorted(10.0 + k % 3 for k in range(4, 10))
    assert m["runs"] == 6 and m["warmup"] == 3
    assert m["measured_ns_p50"] == pytest.approx(1e3 * (kept[2] + kept[3]) / 2)
    assert m["measured_ns_min"] == pytest.approx(10e3)
    assert m["profile_summary"]["mbu_estimated_percent"] == 0.42
    # the modeled row of the same case, in simulate's schema, and its figures beside the measured
    (c,) = data["cases"]
    assert c["case_id"] == CASE and c["status"] == "kernel" and c["modeled_ns"] > 0
    assert m["modeled_ns"] == c["modeled_ns"]
    assert m["modeled_ns_low"] <= m["modeled_ns"] <= m["modeled_ns_high"]
    assert m["ratio"] == pytest.approx(m["measured_ns_p50"] / c["modeled_ns"])
    # the kernel's array inputs went to neuron-explorer under their parameter names
    launch = json.loads((out / "cases" / "short_conv_decode__tiny__4seq__bf16_w-bf16_bias_pool-bf16"
                         / "worker.json").read_text())["launches"][0]
    ntff = json.loads((out / "cases" / "short_conv_decode__tiny__4seq__bf16_w-bf16_bias_pool-bf16"
                       / "profile" / "launch_0" / "profile.ntff").read_text())
    assert ntff["inputs"] == [i["name"] for i in launch["inputs"]] and len(ntff["inputs"]) >= 3
    assert (out / "report.md").is_file() and (out / "measured_vs_modeled.png").stat().st_size > 1000


def test_compile_only_needs_no_device(tmp_path, fake_toolchain, monkeypatch):
    monkeypatch.setenv("FAKE_NEURON_DEVICE", "0")   # the fake execution fails, as on a CPU host
    code, data, _ = _run(tmp_path, "--compile-only", "--no-model")
    assert code == 0 and data["mode"] == "compile-only"
    (m,) = data["measured"]
    assert m["status"] == "compiled" and m["neff_bytes"] > 0
    assert m["err_out"] is None and m["measured_ns_p50"] is None   # nothing run, nothing timed
    assert data["toolchain"]["devices"] is None                    # neuron-ls not asked


def test_compile_error_is_reported_not_fatal(tmp_path, fake_toolchain, monkeypatch):
    monkeypatch.setenv("FAKE_NKI_COMPILE_ERROR", "short_conv_decode")
    code, data, out = _run(tmp_path, "--no-model")
    assert code == 1
    (m,) = data["measured"]
    assert m["status"] == "compile_error" and "PSUM allocation failed" in m["error"]
    assert "compile_error" in (out / "report.md").read_text()


def test_lost_pool_writes_fail_the_check_with_a_hint(tmp_path, fake_toolchain, monkeypatch):
    monkeypatch.setenv("FAKE_NKI_NO_WRITEBACK", "1")
    code, data, _ = _run(tmp_path, "--no-model")
    assert code == 1
    (m,) = data["measured"]
    assert m["status"] == "failed" and m["err_state"] > m["tol"] and m["pool_untouched"] is True
    assert "did not come back to the host array" in m["error"]
    assert m["measured_ns_p50"] is None                # a wrong answer is not timed


def test_version_mismatch_stops_before_compiling(tmp_path, fake_toolchain, monkeypatch):
    from deploy import config as C

    monkeypatch.setitem(C.PIP_PINS, "nki", "0.7.0")
    out = tmp_path / "bench"
    code = bench_main(["--set", "smoke", "--case", CASE, "--out", str(out), "--no-model"])
    assert code == 2 and not (out / "cases").exists()


def test_dry_run_lists_every_case_and_command(capsys):
    from deploy.bench.cases import select

    assert bench_main(["--compile-only", "--dry-run"]) == 0
    text = capsys.readouterr().out
    from simulate.cases import judged_cases, smoke_cases

    cases = select()
    # every smoke and judged serving case of the main job, each once (backward: simulate only)
    serving = [c for c in smoke_cases() + judged_cases() if c.entry != "backward"]
    assert {c.id for c in cases} == {c.id for c in serving}
    assert len(cases) == len(serving)
    assert f"{len(cases)} cases, compile only" in text
    for c in cases:
        assert c.id in text
    assert text.count("-m deploy.bench.worker --case") == len(cases)
    assert text.count("--compile-only") == len(cases)
    assert "NKI_ARTIFACTS_DIR=" in text and "neuron-explorer capture" not in text
    assert "(SDK 2.34.0, NKI 0.8.0)" in text


def test_every_smoke_op_passes_on_the_fake_device(tmp_path, fake_toolchain):
    """All six ops through nki_ssm.ops(backend="neuron") on the fake SDK: the same check
    the real device gets (the fake device is the simulator, so every case must pass)."""
    out = tmp_path / "bench"
    code = bench_main(["--set", "smoke", "--out", str(out), "--no-model", "--timer", "none", "--lnc", "1"])
    data = json.loads((out / "results.json").read_text())
    assert [m["status"] for m in data["measured"]] == ["passed"] * 6, [
        (m["case_id"], m["error"]) for m in data["measured"]]
    assert code == 0
    assert {m["op"] for m in data["measured"]} == {
        "short_conv_prefill", "short_conv_decode", "ssd_prefill", "ssd_decode",
        "gated_delta_prefill", "gated_delta_decode"}
    assert all(m["pool_untouched"] and m["neff_bytes"] for m in data["measured"])


def test_runtime_and_worker_env_follow_the_lnc(tmp_path):
    from deploy.bench.__main__ import runtime_env, worker_env

    assert runtime_env(2) == {"NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_RT_VISIBLE_CORES": "0"}
    assert runtime_env(1) == {"NEURON_LOGICAL_NC_CONFIG": "1", "NEURON_RT_VISIBLE_CORES": "0"}
    with pytest.raises(ValueError, match="lnc"):
        runtime_env(4)
    d = tmp_path / "case"
    assert worker_env(d, "trn2") == {
        "NKI_ARTIFACTS_DIR": str(d / "artifacts"), "NKI_SSM_BACKEND": "neuron",
        "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "NEURON_FRAMEWORK_DEBUG": "1",
        "NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_RT_VISIBLE_CORES": "0"}
    assert worker_env(d, "trn3", 1)["NEURON_LOGICAL_NC_CONFIG"] == "1"


@pytest.mark.parametrize("lnc", ["2", "1"])
def test_dry_run_commands_carry_the_lnc(capsys, lnc):
    args = ["--set", "smoke", "--case", CASE, "--dry-run"] + ([] if lnc == "2" else ["--lnc", "1"])
    assert bench_main(args) == 0
    text = capsys.readouterr().out
    assert f"LNC={lnc};" in text
    # the compile (worker) and the timing (profiler) run the same LNC on core 0
    assert text.count(f"NEURON_LOGICAL_NC_CONFIG={lnc} NEURON_RT_VISIBLE_CORES=0") == 2
    assert f"NEURON_LOGICAL_NC_CONFIG={3 - int(lnc)}" not in text


def test_default_bench_launches_two_programs_and_records_the_lnc(tmp_path, fake_toolchain):
    code, data, out = _run(tmp_path, "--timer", "none", lnc=None)
    (m,) = data["measured"]
    assert data["lnc"] == 2 and m["lnc"] == 2
    # compiled as kernel[2] and run by a runtime at LNC=2 (the fake runtime rejects a mismatch)
    neff = next((out / "cases").rglob("launch_0/kernel.neff")).read_bytes()
    assert b"lnc=2" in neff
    worker = json.loads(next((out / "cases").rglob("worker.json")).read_text())
    assert [ln["lnc"] for ln in worker["launches"]] == [2]
    assert m["status"] in ("passed", "failed"), m["error"]
    (c,) = data["cases"]
    assert c["lnc"] == 2 and len(c["program_ns"]) == 2       # the cost model timed the same LNC


def test_fake_runtime_rejects_a_grid_that_differs_from_its_lnc(tmp_path, fake_toolchain, monkeypatch):
    # what the bench's one NEURON_LOGICAL_NC_CONFIG for compiler and runtime prevents
    import sys

    # the fake `nki` (and its submodules) leave sys.modules with the test: later tests
    # import the real choice
    before = {m: sys.modules[m] for m in sys.modules if m == "nki" or m.startswith("nki.")}
    for name in before:
        del sys.modules[name]
    try:
        import nki

        _grid_mismatch_is_refused(nki, tmp_path, monkeypatch)
    finally:
        for name in [m for m in sys.modules if m == "nki" or m.startswith("nki.")]:
            del sys.modules[name]
        sys.modules.update(before)


def _grid_mismatch_is_refused(nki, tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setenv("NKI_ARTIFACTS_DIR", str(tmp_path))
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")

    def copy(x):
        return x

    with pytest.raises(RuntimeError, match="compiled for LNC=1, the runtime runs LNC=2"):
        nki.jit(copy)[1](np.zeros(4, dtype=np.float32))


def test_modeled_rows_are_taken_at_the_bench_lnc():
    from deploy.bench.__main__ import at_lnc

    both = {"case_id": "c", "lnc": 1, "modeled_ns": 10.0, "lnc2": {"case_id": "c", "lnc": 2, "modeled_ns": 6.0}}
    assert at_lnc(both, 1)["modeled_ns"] == 10.0 and at_lnc(both, 2)["modeled_ns"] == 6.0
    assert at_lnc({"case_id": "c", "lnc": 1, "modeled_ns": 10.0, "lnc2": None}, 2) is None
    assert at_lnc({"case_id": "c", "modeled_ns": 10.0}, 1)["modeled_ns"] == 10.0   # older files: LNC=1
