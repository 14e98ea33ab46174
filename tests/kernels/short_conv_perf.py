"""Modeled trn2 figures of the short conv kernels at the issue's shapes (not a test).

    PYTHONPATH=. python3 tests/kernels/short_conv_perf.py [16k] [8x2k] [2k] [d32] [d512] [--target trn2]
        [--lnc 1|2]
    PYTHONPATH=. python3 tests/kernels/short_conv_perf.py judged [--target trn2]

Qwen3-Next conv shape: dim 8192, W 4, bfloat16 x / weight / pool, no bias,
SiLU. Prefill: 16K or 2K tokens in one sequence, or 8 x 2K ragged; decode: 32
or 512 sequences of one token. Each line also gives the program size (static
instructions, each runtime loop body once) beside the dynamic count; for decode it
is counted over the timed launch and a second launch forced to the other row layout
(``program_size``: each must give the whole compiled program, loop bodies and branches
run or not). Each case runs through nki_ssm.ops with
backend="sim" under nki_ssm.sim.trace.record() and is timed by
nki_ssm.perf.model. "bound" = minimal HBM bytes (x, y and the named pool
slots' state in and out) over the core's DMA bandwidth.

``--lnc 2`` launches the kernels as two programs (NEURON_LOGICAL_NC_CONFIG=2). The
line then also gives each program timed alone (``nki_ssm.perf.model`` over that
program's instructions: its own core, no dependency on the other program's
accesses) and the larger of the two, beside the whole trace's figure, plus both
programs' sizes.

``judged`` runs the judged short conv cases of ``simulate.cases.judged_cases()`` (the
same inputs as ``python -m simulate --set judged``, seed 0) at LNC=1 and LNC=2 and
prints, per case, the LNC=1 time, the LNC=2 time of the slower program timed alone
and of the whole two-program trace, and the ratios to LNC=1 (central figures of
``nki_ssm.perf.model``, no 10-90 % interval).
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


def program_size(traces, program_id: int = 0) -> int:
    """Static instructions of one compiled program (of program ``program_id`` of an LNC
    launch): ``Trace.program_instructions`` (each runtime loop body once and both sides of
    every ``nl.if_else``, run or not), which must be the same in every launch."""
    sizes = {trace.program_instructions(program_id) for trace in traces}
    if len(sizes) != 1:
        raise ValueError(f"launches of one program differ in size ({sorted(sizes)})")
    return sizes.pop()


def decode_traces(inp):
    """Traces of two decode launches on copies of inp: the launcher's own layout choice,
    then the other layout forced (nki_ssm.ops.launch.short_conv.use_wide_layout)."""
    from nki_ssm.ops.launch import short_conv as launch

    traces = []
    pick = launch.use_wide_layout
    for force in (None, "other"):
        kw = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inp.items()}
        x, weight, bias = kw.pop("x"), kw.pop("weight"), kw.pop("bias")
        if force:
            launch.use_wide_layout = lambda n, R: not pick(n, R)
        try:
            with record() as trace:
                ops.short_conv_decode(x, weight, bias, backend="sim", **kw)
        finally:
            launch.use_wide_layout = pick
        traces.append(trace)
    return traces


def program_times_us(trace, target: str) -> list:
    """Modeled time of each program of an LNC launch, its instructions timed alone (its
    own core; none of the other program's accesses can delay it)."""
    pids = sorted({inst.program_id for inst in trace.instructions})
    return [perf.model([inst for inst in trace.instructions if inst.program_id == p],
                       target=target).time_us for p in pids]


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
    if call is ops.short_conv_decode:
        traces = decode_traces(inp)
        trace = traces[0]
        program = program_size(traces)
    else:
        kw = dict(inp)
        x, weight, bias = kw.pop("x"), kw.pop("weight"), kw.pop("bias")
        with record() as trace:
            call(x, weight, bias, backend="sim", **kw)
        program = trace.program_instructions()
    timing = perf.model(trace, target=target)
    bound_ns = min_bytes / timing.dma_bw_bytes_per_ns
    lnc = ""
    if any(inst.program_id for inst in trace.instructions):
        times = program_times_us(trace, target)
        sizes = [trace.program_instructions(p) for p in range(len(times))]
        lnc = (f" [LNC=2: programs alone {' / '.join(f'{t:.1f}' for t in times)} us, max "
               f"{max(times):.1f} us; program sizes {sizes}]")
    return (f"{case}: modeled {timing.time_us:.1f} us on {timing.target}{lnc}, "
            f"{min_bytes / timing.time_ns:.0f} GB/s = {100 * bound_ns / timing.time_ns:.1f}% of "
            f"the core's {timing.dma_bw_bytes_per_ns:.0f} GB/s DMA bandwidth "
            f"({timing.time_ns / bound_ns:.2f}x the bytes-moved bound {bound_ns / 1e3:.1f} us); "
            f"binding {timing.binding_engine}; busy "
            + ", ".join(f"{e} {100 * v:.0f}%" for e, v in timing.share.items())
            + f"; {timing.dma_transfers} DMAs; program {program} static / "
            f"{len(trace)} dynamic instructions; simulated in {time.time() - t0:.0f} s")


def judged(target: str) -> None:
    """LNC=2 / LNC=1 modeled time at the judged short conv cases (module docstring)."""
    import os

    from simulate.cases import judged_cases

    for case in judged_cases():
        if case.family != "short_conv":
            continue
        times = {}
        for lnc in (1, 2):
            os.environ["NEURON_LOGICAL_NC_CONFIG"] = str(lnc)
            kw = case.make_inputs(0)
            with record() as trace:
                getattr(ops, case.op)(**kw, backend="sim")
            times[lnc] = (perf.model(trace, target=target).time_us,
                          max(program_times_us(trace, target)),
                          [trace.program_instructions(p) for p in range(lnc)])
            del trace, kw
        t1 = times[1][0]
        whole, alone, sizes = times[2]
        print(f"{case.id}: LNC=1 {t1:.1f} us (program {times[1][2][0]}); LNC=2 programs "
              f"alone {alone:.1f} us = {alone / t1:.3f}x, whole trace {whole:.1f} us = "
              f"{whole / t1:.3f}x (program sizes {sizes})", flush=True)


def main(argv):
    import os

    target = "trn2"
    if "--target" in argv:
        i = argv.index("--target")
        target = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if "--lnc" in argv:
        i = argv.index("--lnc")
        os.environ["NEURON_LOGICAL_NC_CONFIG"] = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if argv == ["judged"]:
        judged(target)
        return
    cases = argv or list(CASES)
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise SystemExit(f"cases must be among {CASES}, got {bad}")
    rng = np.random.default_rng(0)
    for case in cases:
        print(run_case(case, target, rng), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
