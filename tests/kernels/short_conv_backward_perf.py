"""Modeled trn2 figures of the short conv backward kernel at the judged conv shape (not a test).

    PYTHONPATH=. python3 tests/kernels/short_conv_backward_perf.py [LNC] [TOKENS]

Qwen3-Next conv shape: dim 8192, W 4, bfloat16 x / dy / weight / states, no bias, SiLU,
one sequence of TOKENS (default 16384) with an initial state and d_final_states; LNC
(default 1) programs. The case runs through nki_ssm.ops with backend="sim" under
nki_ssm.sim.trace.record() and is timed by nki_ssm.perf.model (central figure). "bound" =
minimal HBM bytes (x and dy in, dx out) over the DMA bandwidth of the LNC cores.
"""
from __future__ import annotations

import os
import sys
import time

import ml_dtypes
import numpy as np

DIM, W = 8192, 4


def main(lnc: int, tokens: int) -> None:
    os.environ["NEURON_LOGICAL_NC_CONFIG"] = str(lnc)
    from nki_ssm import ops, perf
    from nki_ssm.sim.trace import record

    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng(0)
    x = rng.standard_normal((tokens, DIM), dtype=np.float32).astype(bf16)
    dy = rng.standard_normal((tokens, DIM), dtype=np.float32).astype(bf16)
    weight = rng.uniform(-0.5, 0.5, (DIM, W)).astype(bf16)
    states = rng.standard_normal((2, 1, DIM, W - 1), dtype=np.float32).astype(bf16)
    t0 = time.time()
    with record(target="trn2") as trace:
        ops.short_conv_backward(x, weight, None, dy, activation="silu",
                                cu_seqlens=np.array([0, tokens], np.int32),
                                initial_states=states[0], d_final_states=states[1],
                                backend="sim")
    timing = perf.model(trace, "trn2")
    sizes = [trace.program_instructions(p) for p in range(lnc)]
    bound_us = 3 * tokens * DIM * 2 / (timing.dma_bw_bytes_per_ns * lnc) / 1e3
    print(f"LNC={lnc} tokens={tokens}: modeled {timing.time_ns / 1e3:.1f} us, bound "
          f"{bound_us:.1f} us ({bound_us * 1e3 / timing.time_ns:.1%} of roofline), program "
          f"{sizes} static instructions, binding {timing.binding_engine} "
          f"(simulated in {time.time() - t0:.0f} s)")
    print("busy us", {k: round(v / 1e3, 1) for k, v in timing.busy_ns.items()})


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1,
         int(sys.argv[2]) if len(sys.argv) > 2 else 16384)
