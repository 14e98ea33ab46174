"""Measure the numerics figures the README states (run from the repository root).

    .venv/bin/python docs/measure_numerics.py precision   # ssd_prefill precision="bf16" vs "fp32", float32 I/O (simulator)
    .venv/bin/python docs/measure_numerics.py drift       # SSD state pool dtype drift over many decode steps

``precision``: relative Frobenius error of y and of the updated pool slots
against the float64 reference (``ssd_recurrent``), float32 inputs and pool,
realistic gates (``reference.inputs``), on the simulator; then the default
precision over 72 small random batches.

``drift``: a pool of float32 or bfloat16 carried through ``ops.ssd_decode``
one token per call (the pool is stored in its dtype after every call, as a
serving engine does) against a float64 pool carried by the reference; error
= relative Frobenius error of the pool slots after k steps. Weak decays:
A = -1 and a constant dt' = 1e-3 or 1e-2 (the state keeps 0.999 or 0.990
of itself per step; Mamba-2's dt_bias init puts dt' in [1e-3, 1e-1]);
"realistic": the generator's gates (A in [-16, -1], dt' from softplus of
N(0, 1.5^2) + dt_bias, with spikes).
Backend ``reference`` by default (the storage rounding is the same on every
backend: one round-to-nearest-even per call); ``--backend sim`` runs the
kernel (slow for thousands of steps).
"""
from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

from nki_ssm import ops
from nki_ssm.reference import inputs as gen
from nki_ssm.reference.mamba2_ssd import ssd_decode as ref_decode
from nki_ssm.reference.mamba2_ssd import ssd_recurrent
from nki_ssm.reference.metrics import rel_fro

BF16 = ml_dtypes.bfloat16


def precision(seed: int = 0) -> None:
    cases = [("small", dict(seqlens=[37, 0, 19], H=2, P=8, N=16, G=1), 16),
             ("medium", dict(seqlens=[200, 77], H=4, P=64, N=128, G=1), 128),
             ("2.7B heads/8", dict(seqlens=[300], H=10, P=64, N=128, G=1), 128)]
    print("case          precision  y rel_fro   state rel_fro")
    for name, shape, chunk in cases:
        for prec in ("bf16", "fp32"):
            kw = gen.make_ssd_inputs(np.random.default_rng(seed), **shape, z=True)
            y_ref, pool_ref = ssd_recurrent(**kw)
            named = kw["state_indices"][kw["state_indices"] >= 0]
            y = ops.ssd_prefill(**kw, chunk_size=chunk, precision=prec, backend="sim")
            ey = rel_fro(y.astype(np.float64), y_ref)
            es = rel_fro(kw["ssm_states"][named].astype(np.float64), pool_ref[named])
            print(f"{name:13s} {prec:9s}  {ey:.2e}    {es:.2e}")
    # the default precision over small random batches (seeds x shapes x dt conventions)
    errs = []
    for seed in range(12):
        for shape in (dict(seqlens=[37, 0, 19], H=2, P=8, N=16), dict(seqlens=[5], H=1, P=4, N=8),
                      dict(seqlens=[130], H=2, P=16, N=64, G=2)):
            for dt_mode in ("softplus", "raw"):
                kw = gen.make_ssd_inputs(np.random.default_rng(seed), **shape, dt_mode=dt_mode)
                y_ref, _ = ssd_recurrent(**kw)
                y = ops.ssd_prefill(**kw, chunk_size=16, backend="sim")
                errs.append(rel_fro(y.astype(np.float64), y_ref))
    print(f"bf16 over {len(errs)} small random batches: y rel_fro median {np.median(errs):.2e}, "
          f"max {max(errs):.2e}")


# decay pattern -> constant dt' with A = -1 (None: the generator's realistic gates)
PATTERNS = {"dt'A=-1e-3": 1e-3, "dt'A=-1e-2": 1e-2, "realistic": None}


def _decode_inputs(rng, pattern: str, H: int, P: int, N: int):
    kw = gen.make_ssd_decode_inputs(rng, num_seqs=2, H=H, P=P, N=N, slots=2, dt_mode="raw")
    if PATTERNS[pattern] is not None:
        kw["A"] = np.full(H, -1.0, np.float32)
        kw["dt"] = np.full_like(kw["dt"], PATTERNS[pattern])
    return kw


def drift(backend: str, steps: int, seed: int = 0) -> None:
    H, P, N = 4, 16, 32
    marks = sorted({1, 10, 100, 1000, steps} & set(range(1, steps + 1)))
    print("decay       pool      " + "  ".join(f"{k:>8d}" for k in marks))
    for pattern in PATTERNS:
        for pool_dtype in (np.float32, BF16):
            rng = np.random.default_rng(seed)
            pool = gen.make_ssd_decode_inputs(rng, num_seqs=2, H=H, P=P, N=N,
                                              slots=2)["ssm_states"].astype(pool_dtype)
            truth = pool.astype(np.float64)
            errs = []
            for step in range(1, steps + 1):
                kw = _decode_inputs(rng, pattern, H, P, N)
                kw["state_indices"] = np.array([0, 1], np.int32)
                kw.pop("ssm_states")
                _, truth = ref_decode(**kw, ssm_states=truth)
                ops.ssd_decode(**kw, ssm_states=pool, backend=backend)
                if step in marks:
                    errs.append(rel_fro(pool.astype(np.float64), truth))
            name = "bfloat16" if pool_dtype is BF16 else "float32"
            print(f"{pattern:11s} {name:9s} " + "  ".join(f"{e:8.1e}" for e in errs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("precision", "drift"))
    ap.add_argument("--backend", default="reference", help="drift: reference or sim")
    ap.add_argument("--steps", type=int, default=2000, help="drift: decode steps")
    args = ap.parse_args()
    if args.what == "precision":
        precision()
    else:
        drift(args.backend, args.steps)


if __name__ == "__main__":
    main()
