"""neuron-explorer commands and the parsing of their summary JSON.

Capture (integration notes §3.3; nki-library's ``test/utils/profiler_utils.py``
builds the same with the older ``neuron-profile`` binary): ``neuron-explorer
capture -n file.neff -s profile.ntff --num-exec N NAME1 file1 NAME2 file2 ...``.
Without ``--profile-nth-exec`` every execution is profiled: ``profile.ntff`` for
the first, ``profile_exec_<k>.ntff`` for k = 2..N. Each NTFF is summarised with
``neuron-explorer view -n file.neff -s <ntff> --output-format summary-json``,
whose output is ``{"<neff/ntff key>": {"total_time": <seconds on device>,
"mbu_estimated_percent": ..., "hardware_flops": ..., ...}}`` (nki-library's
metrics_collector reads ``total_time`` as the inference time in seconds from
the first value of that object). The first ``warmup`` executions are dropped;
p50 / p90 / min / mean are over the rest.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

TOOL = "neuron-explorer"
# summary fields kept beside the time when present (names of overview-summary-page.rst)
SUMMARY_FIELDS = ("total_time", "mbu_estimated_percent", "mfu_estimated_percent",
                  "hfu_estimated_percent", "hardware_flops", "transpose_flops",
                  "total_bandwidth_available", "average_dma_size", "useful_read_percent")


def tool_path(tools_bin: str | None = None, name: str = TOOL) -> str:
    """The tool on PATH, else in ``tools_bin`` (default /opt/aws/neuron/bin)."""
    found = shutil.which(name)
    if found:
        return found
    from deploy import config as C

    return os.path.join(tools_bin or C.NEURON_TOOLS_BIN, name)


def ntff_names(num_exec: int, base: str = "profile") -> list[str]:
    """NTFF file names of a capture that profiles every one of ``num_exec`` executions."""
    if num_exec < 1:
        raise ValueError(f"num_exec must be >= 1, got {num_exec}")
    return [f"{base}.ntff"] + [f"{base}_exec_{k}.ntff" for k in range(2, num_exec + 1)]


def capture_argv(tool: str, neff: str, ntff: str, inputs: list[tuple[str, str]], num_exec: int) -> list[str]:
    argv = [tool, "capture", "-n", neff, "-s", ntff, "--num-exec", str(num_exec)]
    for name, path in inputs:
        argv += [name, path]
    return argv


def view_argv(tool: str, neff: str, ntff: str) -> list[str]:
    return [tool, "view", "-n", neff, "-s", ntff, "--output-format", "summary-json"]


def parse_summary(data) -> dict:
    """One summary-json document -> {field: value} of SUMMARY_FIELDS (``total_time`` in s).

    Accepts the keyed form ``{"<key>": {...}}`` and a bare summary object.
    ValueError when no positive ``total_time`` is found.
    """
    if isinstance(data, (str, bytes)):
        data = json.loads(data)
    if not isinstance(data, dict):
        raise ValueError(f"summary-json: expected an object, got {type(data).__name__}")
    summary = data if "total_time" in data else next(
        (v for v in data.values() if isinstance(v, dict) and "total_time" in v), None)
    if summary is None:
        raise ValueError("summary-json: no 'total_time' in the document")
    t = summary.get("total_time")
    if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise ValueError(f"summary-json: total_time must be a positive number of seconds, got {t!r}")
    return {k: summary[k] for k in SUMMARY_FIELDS if k in summary}


def stats_ns(times_s: list[float], warmup: int) -> dict:
    """p50 / p90 / min / mean in ns over the executions after ``warmup``."""
    import numpy as np

    if warmup < 0 or len(times_s) <= warmup:
        raise ValueError(f"need more than warmup={warmup} executions, got {len(times_s)}")
    kept = np.asarray(times_s[warmup:], dtype=np.float64) * 1e9
    return {"p50_ns": float(np.percentile(kept, 50)), "p90_ns": float(np.percentile(kept, 90)),
            "min_ns": float(kept.min()), "mean_ns": float(kept.mean()), "runs": int(kept.size),
            "warmup": int(warmup)}


def profile(neff: Path, inputs: list[tuple[str, str]], out_dir: Path, *, warmup: int, runs: int,
            tool: str, run=None, timeout_s: float = 1800, env: dict | None = None) -> dict:
    """Capture ``warmup + runs`` executions of ``neff`` and summarise each.

    -> {"p50_ns", "p90_ns", "min_ns", "mean_ns", "runs", "warmup", "per_exec_s",
    "summary" (the median execution's summary fields), "commands", "ntff"}.
    ``run(argv, cwd, stdout_path, timeout_s)`` executes a command (default: a subprocess
    with ``env`` added to this process's environment: the runtime's LNC and cores must be
    those the NEFF was compiled for).
    """
    if run is None:
        def run(argv, cwd, stdout_path, timeout):
            _run(argv, cwd, stdout_path, timeout, env)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = warmup + runs
    first = out_dir / "profile.ntff"
    cap = capture_argv(tool, str(neff), str(first), inputs, n)
    run(cap, out_dir, out_dir / "capture.log", timeout_s)
    summaries, times, commands = [], [], [cap]
    for name in ntff_names(n):
        ntff = out_dir / name
        if not ntff.is_file():
            raise FileNotFoundError(f"{TOOL} capture did not write {ntff}")
        view = view_argv(tool, str(neff), str(ntff))
        commands.append(view)
        json_path = out_dir / (name[:-5] + ".summary.json")
        run(view, out_dir, json_path, timeout_s)
        s = parse_summary(json_path.read_text())
        summaries.append(s)
        times.append(float(s["total_time"]))
    st = stats_ns(times, warmup)
    kept = sorted(range(warmup, n), key=lambda k: times[k])
    st.update(per_exec_s=times, summary=summaries[kept[len(kept) // 2]],
              commands=[" ".join(c) for c in commands], ntff=[str(out_dir / m) for m in ntff_names(n)])
    return st


def _run(argv, cwd, stdout_path, timeout_s, env=None):
    import subprocess

    with open(stdout_path, "wb") as fh:
        proc = subprocess.run(argv, cwd=cwd, stdout=fh, stderr=subprocess.PIPE, timeout=timeout_s,
                              env=dict(os.environ, **(env or {})))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace')[-800:]}")
