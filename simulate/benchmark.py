"""How fast the simulator and the cost model are: instructions per second (a benchmark, not a test).

    python -m simulate.benchmark            # three kernels of the default set (about a minute)
    python -m simulate.benchmark --quick    # tiny shapes (seconds)
    python -m simulate.benchmark --json out.json

For each case: the kernel simulated once at LNC=1 through the host API (every
instruction executed in NumPy and traced), the trace scheduled once by the cost
model (one of the 15 passes a case of ``python -m simulate`` pays at LNC=1), and
the float64 reference run once. Times are CPU seconds of this process (so a busy
machine inflates them less than wall time); rates are traced instructions per CPU
second. Compare runs on the same machine: the figures move with the CPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

# kernels of the default set that cover the three families and both kinds of kernel
# (compute-bound chunked prefill, DMA-bound decode)
CASES = ("short_conv_prefill/qwen3-next/1x2048/", "ssd_decode/mamba2-2.7b/32seq/",
         "gated_delta_prefill/qwen3-next-tp4/1x2048/")
QUICK = ("short_conv_prefill/tiny/", "ssd_decode/tiny/", "gated_delta_prefill/tiny/")


def measure(case, target: str = "trn2", seed: int = 0) -> dict:
    """One case: CPU seconds of the simulation, one cost-model pass and the reference."""
    from nki_ssm import ops, perf
    from nki_ssm.perf.profile import platform_target
    from nki_ssm.sim.trace import record
    from simulate.run import _reference_errors_of, logical_nc

    kw = case.make_inputs(seed)
    args = dict(kw, **{case.pool_name: kw[case.pool_name].copy()})
    t0 = time.process_time()
    with platform_target(target), logical_nc(1), record(target=target) as trace:
        getattr(ops, case.op)(**args, backend="sim")
    sim_s = time.process_time() - t0
    t0 = time.process_time()
    perf.model(trace, target=target, keep_schedule=False)
    model_s = time.process_time() - t0
    t0 = time.process_time()
    _reference_errors_of(case, kw, [(None, None)])
    ref_s = time.process_time() - t0
    n = len(trace.instructions)
    return dict(case=case.id, instructions=n, simulator_s=sim_s, cost_model_s=model_s, reference_s=ref_s,
                simulator_per_s=n / sim_s if sim_s else None,
                cost_model_per_s=n / model_s if model_s else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simulate.benchmark", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (seconds)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows to FILE")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from simulate import cases as C

    prefixes = QUICK if args.quick else CASES
    pool = C.smoke_cases() if args.quick else C.default_cases()
    selected = [next(c for c in pool if c.id.startswith(p)) for p in prefixes]
    rows = []
    print(f"{'case':52s} {'instructions':>12s} {'simulated/s':>12s} {'scheduled/s':>12s} {'reference':>10s}")
    for c in selected:
        r = measure(c)
        rows.append(r)
        print(f"{r['case'][:52]:52s} {r['instructions']:>12,} {r['simulator_per_s']:>12,.0f} "
              f"{r['cost_model_per_s']:>12,.0f} {r['reference_s']:>9.1f}s", flush=True)
    n = sum(r["instructions"] for r in rows)
    sim = sum(r["simulator_s"] for r in rows)
    model = sum(r["cost_model_s"] for r in rows)
    print(f"{'all':52s} {n:>12,} {n / sim:>12,.0f} {n / model:>12,.0f} "
          f"{sum(r['reference_s'] for r in rows):>9.1f}s")
    print("(instructions per CPU second: simulated = executed in NumPy and traced; scheduled = one "
          "cost-model pass)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
