"""Regression guard on the simulator's per-instruction overhead (see bench_overhead.py).

The goal is < 30 us per [128, 512] float32 tensor_tensor; the machine running
the suite is shared, so the guard allows 4x that before failing.
"""
from __future__ import annotations

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "bench_overhead", pathlib.Path(__file__).with_name("bench_overhead.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_tensor_tensor_overhead_within_guard():
    plain = bench.measure(calls=100, batches=5)
    traced = bench.measure(calls=100, batches=5, traced=True)
    print(f"tensor_tensor overhead: {plain * 1e6:.1f} us, traced {traced * 1e6:.1f} us")
    assert plain < 120e-6
    assert traced < 120e-6
