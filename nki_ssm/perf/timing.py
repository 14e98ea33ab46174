"""The result of timing one kernel run: :class:`Timing`.

Every time is *modeled* for ``Timing.target`` on one logical NeuronCore: one
physical core at LNC=1, the two physical cores running their programs at once
at LNC=2 (``program_time_ns``), in nanoseconds unless a name says otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd")
ENGINE_ORDER = COMPUTE_ENGINES + ("dma",)


@dataclass
class Schedule:
    """Per-instruction placement, in trace order (arrays of length num_instructions).

    ``unit`` is the engine name, or ``"dma"`` for transfers whose queues are in
    ``dma_mask`` (bit q set = DMA engine q used). ``start`` is when the engine
    (or the data transfer) begins, ``end`` when the result is ready.
    """

    start: np.ndarray
    end: np.ndarray
    unit: list
    op: list
    dma_mask: np.ndarray
    dma_data_start: np.ndarray
    program_id: np.ndarray
    pred: np.ndarray | None = None   # instruction that released each one (-1: none); critical path
    issue_start: np.ndarray | None = None   # DMA descriptor generation (NaN: static descriptors)
    issue_end: np.ndarray | None = None
    issue_unit: list | None = None          # "hwdge", "swdge" or None

    def critical_path(self) -> list:
        """Indices of the critical path, first to last."""
        if self.pred is None or len(self.end) == 0:
            return []
        i, out = int(np.argmax(self.end)), []
        while i >= 0:
            out.append(i)
            i = int(self.pred[i])
        return out[::-1]


@dataclass
class Timing:
    """Modeled timing of one kernel run on one target.

    ``binding_engine`` is the engine that owns the largest share of the
    critical path: walking back from the instruction that finishes last,
    each instruction's predecessor is whichever released it last (its
    engine's previous instruction, or the producer it waited on); each step's
    time (end minus predecessor's end) is charged to the instruction's
    engine, so ``critical_ns`` sums to ``time_ns``. ``busiest_engine`` is
    the engine with the largest busy share (DMA: time any queue is active).
    """

    target: str
    time_ns: float
    busy_ns: dict
    critical_ns: dict
    binding_engine: str
    busiest_engine: str
    dma_queue_busy_ns: list
    dma_bytes: int
    dma_transfers: int
    matmul_flops: int
    num_instructions: int
    op_counts: dict
    bf16_peak_flops: float            # the logical core's (physical cores x one core's), as the next
    dma_bw_bytes_per_ns: float
    num_cores: int = 1                # physical cores = programs (LNC)
    program_time_ns: list = field(default_factory=list)   # each program's end; time_ns is the latest
    op_time_ns: dict = field(default_factory=dict)   # "engine:op" -> busy ns
    schedule: Schedule | None = field(default=None, repr=False)
    # kernel launch (prologue + epilogue): its own line, not part of time_ns
    launch_ns: float = 0.0
    act_table_loads: int = 0          # ScalarE activation-table loads charged
    loop_iterations: int = 0          # runtime-loop iterations (each charged a boundary)
    loop_overhead_ns: float = 0.0     # iterations x (barrier + branch) charged
    program_instructions: int | None = None   # static instructions (runtime loop bodies once)
    # the range from the documented ranges of the constants (perf.model_range); None if not run:
    # the 10-90 % interval of independent draws, and the all-fast / all-slow extremes
    time_p10_ns: float | None = None
    time_p90_ns: float | None = None
    time_low_ns: float | None = None
    time_high_ns: float | None = None
    launch_p10_ns: float | None = None
    launch_p90_ns: float | None = None
    launch_low_ns: float | None = None
    launch_high_ns: float | None = None
    range_samples: int = 0            # constant tables drawn for the 10-90 % interval
    range_clamped: bool = False       # a draw's schedule crossed the central one (list-scheduling anomaly)

    def top_ops(self, k: int = 5) -> list:
        """The k "engine:op" pairs with the most busy time: [(name, count, ns), ...]."""
        items = sorted(self.op_time_ns.items(), key=lambda kv: -kv[1])[:k]
        return [(name, int(self.op_counts.get(name, 0)), float(ns)) for name, ns in items]

    @property
    def time_us(self) -> float:
        return self.time_ns / 1e3

    @property
    def time_with_launch_ns(self) -> float:
        """Kernel time plus launch overhead (what a device profile of one call shows)."""
        return self.time_ns + self.launch_ns

    @property
    def share(self) -> dict:
        """Busy time / modeled time per engine (0..1)."""
        t = self.time_ns * self.num_cores
        return {e: (b / t if t > 0 else 0.0) for e, b in self.busy_ns.items()}

    @property
    def dma_queue_utilization(self) -> float:
        """Mean busy fraction of the DMA engines."""
        t = self.time_ns * self.num_cores
        q = self.dma_queue_busy_ns
        return float(sum(q) / (len(q) * t)) if (t > 0 and q) else 0.0

    def roofline_ns(self, min_flops: float, min_hbm_bytes: float) -> float:
        """max(min_flops / TensorE bf16 peak, min_hbm_bytes / core DMA bandwidth), in ns."""
        if min_flops < 0 or min_hbm_bytes < 0:
            raise ValueError(
                f"min_flops and min_hbm_bytes must be >= 0, got {min_flops} and {min_hbm_bytes}")
        compute = min_flops / self.bf16_peak_flops * 1e9
        memory = min_hbm_bytes / self.dma_bw_bytes_per_ns
        return max(compute, memory)

    def roofline(self, min_flops: float, min_hbm_bytes: float) -> float:
        """Achieved fraction of the roofline: roofline time / modeled time (1.0 = at the roof)."""
        if self.time_ns <= 0:
            return 0.0
        return self.roofline_ns(min_flops, min_hbm_bytes) / self.time_ns

    def roofline_bound(self, min_flops: float, min_hbm_bytes: float) -> str:
        """'compute' or 'memory': which roofline term is larger."""
        compute = min_flops / self.bf16_peak_flops * 1e9
        return "compute" if compute >= min_hbm_bytes / self.dma_bw_bytes_per_ns else "memory"

    def summary(self) -> str:
        share = ", ".join(f"{e} {100 * s:.0f}%" for e, s in self.share.items())
        rng = ""
        if self.time_p10_ns is not None and self.time_p90_ns is not None:
            rng = f" (10-90 % {self.time_p10_ns / 1e3:.2f}-{self.time_p90_ns / 1e3:.2f})"
        return (f"{self.time_us:.2f} us{rng} modeled on {self.target} + {self.launch_ns / 1e3:.0f} us launch; "
                f"binding {self.binding_engine}; "
                f"busy {share}; {self.dma_transfers} DMAs / {self.dma_bytes / 1e6:.3f} MB; "
                f"{self.matmul_flops / 1e9:.3f} GFLOP matmul; {self.num_instructions} instructions"
                + (f" ({self.program_instructions} in the program)" if self.program_instructions is not None else "")
                + (f"; {self.loop_iterations} loop iterations ({self.loop_overhead_ns / 1e3:.2f} us sync)"
                   if self.loop_iterations else "")
                + (f"; {self.act_table_loads} ACT table loads" if self.act_table_loads else "")
                + ("; programs end at " + " / ".join(f"{t / 1e3:.2f}" for t in self.program_time_ns) + " us"
                   if len(self.program_time_ns) > 1 else ""))

    def to_dict(self) -> dict:
        return {
            "target": self.target, "time_ns": self.time_ns, "busy_ns": dict(self.busy_ns),
            "share": self.share, "critical_ns": dict(self.critical_ns),
            "binding_engine": self.binding_engine, "busiest_engine": self.busiest_engine,
            "dma_queue_utilization": self.dma_queue_utilization, "dma_bytes": self.dma_bytes,
            "dma_transfers": self.dma_transfers, "matmul_flops": self.matmul_flops,
            "num_instructions": self.num_instructions, "op_counts": dict(self.op_counts),
            "num_cores": self.num_cores, "program_time_ns": list(self.program_time_ns), "op_time_ns": dict(self.op_time_ns),
            "launch_ns": self.launch_ns, "act_table_loads": self.act_table_loads,
            "loop_iterations": self.loop_iterations, "loop_overhead_ns": self.loop_overhead_ns,
            "program_instructions": self.program_instructions,
            "time_p10_ns": self.time_p10_ns, "time_p90_ns": self.time_p90_ns,
            "time_low_ns": self.time_low_ns, "time_high_ns": self.time_high_ns,
            "range_samples": self.range_samples,
            "range_clamped": self.range_clamped,
        }
