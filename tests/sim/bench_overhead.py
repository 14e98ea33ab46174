"""Simulator overhead per instruction: a [128, 512] float32 tensor_tensor inside a running kernel.

Run from the repo root: ``PYTHONPATH=. python3 tests/sim/bench_overhead.py [calls]``
(or plain ``python3`` in the installed venv). Prints the median
microseconds per call over several batches, without and with an active
trace (goal: under 30 us). ``measure()`` is also used by
tests/sim/test_isa_overhead.py.
"""
from __future__ import annotations

import importlib
import statistics
import sys
import time

import numpy as np

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.trace import record

nki = importlib.import_module("nki_ssm.sim.jit")


def _kernel_factory(calls: int, batches: int, samples: list):
    @nki.jit
    def overhead_kernel(x):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        a = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=x)
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(calls):
                nisa.tensor_tensor(dst=b, data1=a, data2=b, op=nl.add)
            samples.append((time.perf_counter() - t0) / calls)
        nisa.dma_copy(dst=out, src=b)
        return out
    return overhead_kernel


def measure(calls: int = 200, batches: int = 7, traced: bool = False) -> float:
    """Median seconds per tensor_tensor call (median over ``batches`` batches)."""
    samples: list[float] = []
    k = _kernel_factory(calls, batches, samples)
    x = np.zeros((128, 512), np.float32)
    if traced:
        with record() as tr:
            nki.simulate(k)(x)
        assert len(tr) == calls * batches + 3
    else:
        nki.simulate(k)(x)
    return statistics.median(samples)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    plain = measure(n) * 1e6
    traced = measure(n, traced=True) * 1e6
    print(f"tensor_tensor [128, 512] float32, median per call over 7 batches of {n}: "
          f"{plain:.1f} us without trace, {traced:.1f} us with trace (goal < 30 us)")
