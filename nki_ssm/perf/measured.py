"""Calibration rows from measured runs (``python -m deploy.bench``'s results.json).

Each measured row with an on-device p50 and a modeled figure for the same
case becomes a :class:`~nki_ssm.perf.calibration.CalibrationRow`: the
measured p50 in place of the published time, the cost model's central figure
as ``modeled_ns``, kind "check" (no constant of the model is set from it).
Rows that did not pass their check on the device (or were not timed) are left
out: a wrong answer's time calibrates nothing.

    python -m nki_ssm.perf.measured reports/<run>/results.json   # the table

Reads plain JSON (no import of deploy/): the perf layer stays below it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from nki_ssm.perf.calibration_row import CalibrationRow, table_markdown


def load_measured(results) -> tuple[list[dict], dict]:
    """(measured rows, run metadata) of a results.json path, folder or already-loaded dict."""
    if isinstance(results, dict):
        data = results
    else:
        p = Path(results)
        data = json.loads((p / "results.json" if p.is_dir() else p).read_text())
    rows = data.get("measured")
    if not isinstance(rows, list):
        raise ValueError("results: no 'measured' list (not a deploy.bench results.json)")
    meta = {k: data.get(k) for k in ("instance_type", "target", "command", "mode")}
    meta["sdk_release"] = (data.get("toolchain") or {}).get("sdk_release")
    return rows, meta


def calibration_rows(results) -> list[CalibrationRow]:
    """Measured rows -> calibration rows (only passed, timed rows with a modeled figure)."""
    rows, meta = load_measured(results)
    out = []
    for m in rows:
        p50, modeled = m.get("measured_ns_p50"), m.get("modeled_ns")
        if m.get("status") != "passed" or not p50 or p50 <= 0 or not modeled:
            continue
        where = m.get("instance_type") or meta.get("instance_type") or "unknown host"
        out.append(CalibrationRow(
            name=m["case_id"], target=m.get("target") or meta.get("target") or "trn2",
            workload=f"{m['case_id']} (one NeuronCore)", published_ns=float(p50),
            source=f"measured: deploy.bench on {where}, SDK {meta.get('sdk_release')}, "
                   f"p50 of {m.get('runs')} runs",
            kind="check",
            note=(f"p90 {m.get('measured_ns_p90')} ns; modeled range "
                  f"[{m.get('modeled_ns_low')}, {m.get('modeled_ns_high')}] ns"),
            modeled_ns=float(modeled),
            extra={"measured_ns_p90": m.get("measured_ns_p90"), "modeled_ns_low": m.get("modeled_ns_low"),
                   "modeled_ns_high": m.get("modeled_ns_high"), "runs": m.get("runs"),
                   "compile_s": m.get("compile_s")}))
    return out


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m nki_ssm.perf.measured <results.json>", file=sys.stderr)
        return 2
    rows = calibration_rows(args[0])
    print(table_markdown(rows) if rows else "no passed, timed row with a modeled figure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
