"""Modeled trn2 figures of the short conv kernels at the issue's shapes (not a test).

    PYTHONPATH=. python3 tests/kernels/short_conv_perf.py [16k] [8x2k] [2k] [d32] [d512] [--target trn2]

Qwen3-Next conv shape: dim 8192, W 4, bfloat16 x / weight / pool, no bias,
SiLU. Prefill: 16K or 2K tokens in one sequence, or 8 x 2K ragged; decode: 32
or 512 sequences of one token. Each line also gives the program size (static
instructions, each runtime loop body once) beside the dynamic count. Each case runs through nki_ssm.ops with
backend="sim" under nki_ssm.sim.trace.record() and is timed by
nki_ssm.perf.model. "bound" = minimal HBM bytes (x, y and the named pool
slots' state in and out) over the core's DMA bandwidth.
"""
from __future__ import annotations

import sys
import time

import ml_dtypes
import numpy as np

from nki_ssm import ops, perf
from nki_ssm.reference.inputs import make_short_conv_decode_inputs, make_short_conv_inputs
from nki_ssm.sim.trace import record

BF16 = ml_dtypes.bfloat16
DIM, W = 8192, 4
CASES = ("16k", "8x2k", "2k", "d32", "d512")


def run_case(case: str, target: str, rng) -> str:
    t0 = time.time()
    if case in ("16k", "8x2k", "2k"):
        lens = {"16k": [16384], "8x2k": [2048] * 8, "2k": [2048]}[case]
        inp = make_short_conv_inputs(rng, seqlens=lens, dim=DIM, W=W, dtype=BF16,
                                     pool_dtype=BF16, has_initial_state=True, bias=False)
        tokens, seqs = sum(lens), len(lens)
        call = ops.short_conv_prefill
    else:
        seqs = int(case[1:])
        inp = make_short_conv_decode_inputs(rng, num_seqs=seqs, T=1, dim=DIM, W=W, dtype=BF16,
                                            pool_dtype=BF16, bias=False)
        tokens = seqs
        call = ops.short_conv_decode
    min_bytes = 2 * tokens * DIM * 2 + 2 * seqs * DIM * (W - 1) * 2
    kw = dict(inp)
    x, weight, bias = kw.pop("x"), kw.pop("weight"), kw.pop("bias")
    with record() as trace:
        call(x, weight, bias, backend="sim", **kw)
    timing = perf.model(trace, target=target)
    bound_ns = min_bytes / timing.dma_bw_bytes_per_ns
    return (f"{case}: modeled {timing.time_us:.1f} us on {timing.target}, "
            f"{min_bytes / timing.time_ns:.0f} GB/s = {100 * bound_ns / timing.time_ns:.1f}% of "
            f"the core's {timing.dma_bw_bytes_per_ns:.0f} GB/s DMA bandwidth "
            f"({timing.time_ns / bound_ns:.2f}x the bytes-moved bound {bound_ns / 1e3:.1f} us); "
            f"binding {timing.binding_engine}; busy "
            + ", ".join(f"{e} {100 * v:.0f}%" for e, v in timing.share.items())
            + f"; {timing.dma_transfers} DMAs; program {trace.program_instructions()} static / "
            f"{len(trace)} dynamic instructions; simulated in {time.time() - t0:.0f} s")


def main(argv):
    target = "trn2"
    if "--target" in argv:
        i = argv.index("--target")
        target = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    cases = argv or list(CASES)
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise SystemExit(f"cases must be among {CASES}, got {bad}")
    rng = np.random.default_rng(0)
    for case in cases:
        print(run_case(case, target, rng), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
