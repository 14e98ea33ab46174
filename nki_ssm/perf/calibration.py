"""Calibration table: modeled / published time for the measurements of nki_spec §9.

Each row runs one kernel of ``calibration_kernels`` through the simulator on
the published hardware's target and compares the cost model's figure with
the published one. ``kind`` is "check" when no constant of the model was set
from that row, "fit" when a constant was read off it (then the ratio only
shows the arithmetic is consistent; see hardware.CALIBRATED).

    rows = run_calibration()          # default set (seconds)
    print(table_markdown(rows))

Band (asserted by tests/perf/test_calibration.py): "check" rows within
0.5-2.0, "fit" rows within 0.9-1.1. Why 0.5-2.0: the documented rules are
approximations stated with "~" (nki_spec §8.2), the NC-v2 hardware of the
Mamba tutorial is inferred, and the spec's own consistency check (§9) finds
the VectorE two-input rate ~1.4x off the documented 2N rule; a model within
2x of every published figure, with the residual explained per row, is what
the sources can support.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from nki_ssm.perf.profile import profile
from nki_ssm.perf.timing import Timing

CHECK_BAND = (0.5, 2.0)
FIT_BAND = (0.9, 1.1)


@dataclass
class CalibrationRow:
    name: str
    target: str
    workload: str
    published_ns: float
    source: str
    kind: str                       # "check" or "fit"
    note: str
    modeled_ns: float | None = None
    error: str | None = None        # why the row could not run
    wall_s: float | None = None
    binding_engine: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return None if self.modeled_ns is None else self.modeled_ns / self.published_ns

    @property
    def within_band(self) -> bool | None:
        if self.ratio is None:
            return None
        lo, hi = CHECK_BAND if self.kind == "check" else FIT_BAND
        return lo <= self.ratio <= hi

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        d["within_band"] = self.within_band
        return d


def _mamba_inputs(rng, batch, channels, seq, state):
    # tutorial-like magnitudes; values do not change the timing
    delta = rng.uniform(0.01, 0.1, (batch, channels, seq)).astype(np.float32)
    u = rng.standard_normal((batch, channels, seq)).astype(np.float32)
    A = -rng.uniform(0.5, 2.0, (channels, state)).astype(np.float32)
    B = rng.standard_normal((batch, state, seq)).astype(np.float32)
    C = rng.standard_normal((batch, state, seq)).astype(np.float32)
    return delta, u, A, B, C


def _mamba_ref(delta, u, A, B, C):
    """float64 selective scan y[b, c, t] = sum_n C[b,n,t] h[b,c,n,t]."""
    d, uu, a, bb, cc = (np.asarray(v, np.float64) for v in (delta, u, A, B, C))
    batch, channels, seq = d.shape
    h = np.zeros((batch, channels, a.shape[1]))
    y = np.zeros_like(d)
    for t in range(seq):
        h = np.exp(d[:, :, t, None] * a[None]) * h + (d[:, :, t] * uu[:, :, t])[..., None] * bb[:, None, :, t]
        y[:, :, t] = np.einsum("bcn,bn->bc", h, cc[:, :, t])
    return y


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# --- rows -----------------------------------------------------------------

def _row_dma_32k(kernels, rng):
    import ml_dtypes

    x = rng.standard_normal((4, 4096)).astype(ml_dtypes.bfloat16)
    out, t = profile(kernels["dma_roundtrip"], x, target="trn2")
    if not np.array_equal(np.asarray(out), x):
        raise AssertionError("dma_roundtrip returned different data")
    s = t.schedule
    load = next(i for i, u in enumerate(s.unit) if u == "dma")
    # published figure is the engine's transfer time as shown by the profiler
    return s.end[load] - s.dma_data_start[load], t, {"engines": bin(int(s.dma_mask[load])).count("1")}


def _row_dma_fixed(kernels, rng):
    x = rng.standard_normal((128, 1)).astype(np.float32)
    _, t = profile(kernels["dma_roundtrip"], x, target="trn2")
    s = t.schedule
    load = next(i for i, u in enumerate(s.unit) if u == "dma")
    return s.end[load] - s.start[load], t, {}


def _row_scalar_chain(kernels, rng, steps=32):
    x = rng.standard_normal((128, 1)).astype(np.float32)
    _, t = profile(kernels["scalar_chain"], x, steps, target="trn1")
    s = t.schedule
    acts = [i for i, op in enumerate(s.op) if s.unit[i] == "scalar"]
    ii = (s.end[acts[-1]] - s.end[acts[0]]) / (len(acts) - 1)
    return ii, t, {"instructions": len(acts)}


def _mamba_row(version, channels, seq, check_values=False):
    def run(kernels, rng):
        args = _mamba_inputs(rng, 1, channels, seq, 16)
        y, t = profile(kernels[version], *args, target="trn1")
        extra = {"vector_share": t.share["vector"]}
        if check_values:
            extra["rel_err_vs_float64"] = _rel(y, _mamba_ref(*args))
        return t.time_ns, t, extra
    return run


def _row_selective_scan(kernels, rng):
    x = rng.standard_normal((1, 128, 256)).astype(np.float32)
    dt = np.abs(rng.standard_normal((1, 128, 256))).astype(np.float32) * 0.1
    A = -np.abs(rng.standard_normal((128, 16))).astype(np.float32) * 0.5
    B = rng.standard_normal((1, 16, 256)).astype(np.float32)
    C = rng.standard_normal((1, 16, 256)).astype(np.float32)
    h0 = np.zeros((1, 128, 16), np.float32)
    (y, _), t = profile(kernels["selective_scan_v1"], x, dt, A, B, C, h0, target="trn1")
    return t.time_ns, t, {"rel_err_vs_float64": _rel(y, _mamba_ref(dt, x, A, B, C)),
                          "dma_transfers": t.dma_transfers}


_ROWS = [
    # name, target, workload, published ns, source, kind, note, runner, in_default
    ("dma_32k_one_engine", "trn2", "[4, 4096] bf16 HBM->SBUF, one DMA engine", 1416.0,
     "nki_spec §9 row 9 [DMA Example 1]", "check",
     "transfer time only (fixed latency excluded, as the profiler bar); 4 partitions -> 1 engine; "
     "23 B/ns x eff(8 KiB/partition)=0.98", _row_dma_32k, True),
    ("dma_fixed_cost", "trn2", "[128, 1] fp32 load (512 B), end to end", 1300.0,
     "nki_spec §9 row 12 [DMABW]", "fit",
     "dma_fixed_ns is this figure; the row shows the tiny transfer adds little", _row_dma_fixed, True),
    ("scalar_dependent_chain", "trn1", "dependent 1-element ScalarE activations, II", 189.0,
     "nki_spec §9 row 10 [PERF Opt #5a]", "fit",
     "scalar_raw_cycles was set from this row", _row_scalar_chain, True),
    ("mamba_v1_256ch", "trn1", "fused Mamba v1 [1, 512, 256, 16] fp32", 172.93e3,
     "nki_spec §9 row 2 [MAMBA]", "check",
     "VectorE-bound: 5 two-input fp32 passes per (state, tile) at the documented ~2N cycles. The published "
     "figures disagree with each other: this one implies 5.3 us of VectorE per (state, tile), row 4 implies "
     "3.1 us (launch overhead in this small run is a likely cause); the model (4.9 us) sits between",
     _mamba_row("mamba_v1", 256, 512, check_values=True), True),
    ("mamba_v1_4096ch", "trn1", "fused Mamba v1, channels 4096, seq 512", 2.34e6,
     "nki_spec §9 row 3 [MAMBA]", "check",
     "the model buffers without limit, so the measured u/delta reload stalls (VectorE 92%) are absent",
     _mamba_row("mamba_v1", 4096, 512), True),
    ("mamba_v2_4096ch", "trn1", "fused Mamba v2, channels 4096, seq 512", 1.61e6,
     "nki_spec §9 row 4 [MAMBA]", "check",
     "measured VectorE rate implies ~1.4N cycles per two-input fp32 op (spec §9 check) vs the "
     "documented 2N the model uses", _mamba_row("mamba_v2", 4096, 512), True),
    ("selective_scan_v1", "trn1", "nki-library selective_scan [1, 128, 256, 16] (before A hoist)", 129.5e3,
     "nki_spec §9 row 8 [nki-library ebe57b2]", "check",
     "modeled VectorE-bound (8 nc_stream_shuffle + 3 tensor_tensor + 1 scan per state); 83 static DMAs "
     "(avg 5.4 KB vs published 4.6 KB over 100). Under by ~1.8x: fixed per-launch overhead (not modelled, "
     "weighs most on this smallest workload) and the unpublished details of the library kernel are the "
     "likely causes",
     _row_selective_scan, True),
    ("mamba_v3_4096ch_8k", "trn1", "fused Mamba v3, channels 4096, seq 8192", 27.8e6,
     "nki_spec §9 row 6 [MAMBA]", "check",
     "seq tiled by 512 with scan carries; ~1e5 instructions (full set only)",
     _mamba_row("mamba_v3", 4096, 8192), False),
]


def run_calibration(full: bool = False, names=None, seed: int = 0) -> list[CalibrationRow]:
    """Run the calibration rows (default set, or all with ``full``); never raises for a row.

    A row whose kernel cannot run yet (simulator missing an instruction) keeps
    ``modeled_ns=None`` and says why in ``error``.
    """
    rows = []
    try:
        from nki_ssm.perf import calibration_kernels

        kernels = calibration_kernels.build()
        build_error = None
    except Exception as exc:  # simulator not importable yet
        kernels, build_error = None, f"{type(exc).__name__}: {exc}"
    for name, target, workload, pub, src, kind, note, runner, default in _ROWS:
        if names is not None and name not in names:
            continue
        if names is None and not (full or default):
            continue
        row = CalibrationRow(name, target, workload, pub, src, kind, note)
        if kernels is None:
            row.error = build_error
        else:
            t0 = time.perf_counter()
            try:
                modeled, timing, extra = runner(kernels, np.random.default_rng(seed))
                row.modeled_ns = float(modeled)
                row.binding_engine = timing.binding_engine
                row.extra = extra
            except Exception as exc:
                row.error = f"{type(exc).__name__}: {str(exc)[:300]}"
            row.wall_s = time.perf_counter() - t0
        rows.append(row)
    return rows


def fmt_ns(ns: float | None) -> str:
    """A time in ns as ns / us / ms text ("—" for None); also used by simulate/'s report."""
    if ns is None:
        return "—"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.4g} us"
    return f"{ns:.4g} ns"


def table_markdown(rows: list[CalibrationRow]) -> str:
    """The calibration table as Markdown (modeled times labelled with their target)."""
    lines = ["| row | target | workload | published | modeled | modeled / published | kind | binding | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "not run: " + (r.error or "?") if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(
            f"| {r.name} | {r.target} | {r.workload} | {fmt_ns(r.published_ns)} ({r.source}) | "
            f"{fmt_ns(r.modeled_ns)} modeled, {r.target} | {ratio} | {r.kind} | "
            f"{r.binding_engine or '—'} | {r.note} |")
    lo, hi = CHECK_BAND
    lines.append("")
    lines.append(f"Band: check rows {lo}-{hi}, fit rows {FIT_BAND[0]}-{FIT_BAND[1]} "
                 "(fit = a model constant was read off that row).")
    return "\n".join(lines)


def summarize(rows: list[CalibrationRow]) -> str:
    return "\n".join(
        f"{r.name:24s} {r.target}: published {fmt_ns(r.published_ns):>10s}  modeled "
        f"{fmt_ns(r.modeled_ns):>10s}  ratio {('%.2f' % r.ratio) if r.ratio else 'n/a':>5s}  "
        f"[{r.kind}] {r.error or ''}" for r in rows)


def main() -> None:  # python -m nki_ssm.perf.calibration [--full]
    import sys

    rows = run_calibration(full="--full" in sys.argv)
    print(table_markdown(rows))


if __name__ == "__main__":
    main()


__all__ = ["CalibrationRow", "run_calibration", "table_markdown", "summarize", "fmt_ns", "CHECK_BAND",
           "FIT_BAND", "Timing"]
