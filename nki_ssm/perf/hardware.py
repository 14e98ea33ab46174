"""Per-target hardware constants for the cost model, one table per target.

Every number lives in a :class:`HardwareSpec` (one per target: ``trn1`` for
calibration against the published NC-v2 figures, ``trn2`` the default,
``trn3``) and its source sits next to it in ``SOURCES[name]``. Sources are
published documents, cited by the tags of the source table in
``nki_ssm/perf/README.md`` (e.g. [A2] = the Trainium2 architecture guide). Where a documented range left a
choice, the comment says which value was taken and why. Calibration
(``perf/calibration.py``) checks these numbers against published timings; no
constant here has been moved by calibration unless ``CALIBRATED`` says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class HardwareSpec:
    """Timing constants of one NeuronCore of a target (times in ns, rates per cycle)."""

    name: str
    nc_version: int
    # --- TensorE ---------------------------------------------------------
    tensor_ghz: float
    mm_init_cycles: int           # MM initiation-interval floor (MM_INIT_LATENCY)
    mm_fp32_factor: float         # a float32 operand: quarter rate (tf32 x tf32: bf16 rate)
    mm_fp32_onezero_factor: float  # fp32 with a 0/1 operand: up to 2x faster than fp32
    ls_speedup: float             # Fast LoadStationary: LS ~ M / ls_speedup cycles (hidden behind MM)
    transpose_fp32_factor: float  # nc_transpose of fp32 data on TensorE
    bf16_peak_flops: float        # dense bf16 FLOP/s per core (roofline)
    fp32_peak_flops: float
    # --- VectorE ---------------------------------------------------------
    vector_ghz: float
    vector_elems_per_cycle: float  # per partition per input, fp32 / no perf mode
    vector_overhead_cycles: int    # fixed cycles added to every instruction (access + dispatch)
    vector_raw_cycles: int         # extra when the input was just produced on the same engine
    vector_second_input: float     # share of a full pass each input after the first costs (no perf mode)
    vector_perf_modes: bool        # NC-v3+ bf16/fp16 perf modes (x2 / x4)
    # --- ScalarE ---------------------------------------------------------
    scalar_ghz: float
    scalar_elems_per_cycle: float      # per partition, fp32
    scalar_elems_per_cycle_16bit: float
    scalar_overhead_cycles: int
    scalar_raw_cycles: int
    scalar_reduce_cycles: int          # ActReadAccumulator when reduce_res is read
    # --- GpSimd ----------------------------------------------------------
    gpsimd_ghz: float
    gpsimd_elems_per_cycle: float      # per partition, 32-bit
    gpsimd_elems_per_cycle_16bit: float
    gpsimd_overhead_cycles: int
    # --- DMA -------------------------------------------------------------
    dma_engines: int
    dma_bw_per_engine: float       # bytes / ns of one DMA engine at full efficiency
    dma_fixed_ns: float            # descriptor + semaphore-to-start latency per DMA
    dma_partitions_per_engine: int
    dma_transpose_hbm_factor: float   # DMA transpose throughput relative to a copy, HBM source
    dma_transpose_sbuf_factor: float  # SBUF -> SBUF
    # efficiency vs bytes per partition (p_dim=128), piecewise log-linear
    dma_eff_bytes: tuple = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    dma_eff_value: tuple = (0.014, 0.026, 0.05, 0.10, 0.21, 0.42, 0.81, 0.97, 0.98, 0.99, 1.0)
    # --- cross-engine ----------------------------------------------------
    semaphore_ns: float = 100.0    # added when a consumer waits on another compute engine's producer
    dma_completion_ns: float = 300.0  # added when a consumer waits on a DMA's completion semaphore
    # --- DMA descriptors: efficiency by contiguous run, sustained rate ------
    dma_min_run_bytes: int = 512   # a descriptor's contiguous run below this moves at run / this of peak
    dma_sustained: float = 0.85    # sustained fraction of the per-engine peak rate
    # --- ScalarE activation tables -------------------------------------------
    act_table_load_ns: float = 1300.0  # ScalarE time to load another function's table
    # --- TensorE fp32 weights ------------------------------------------------
    mm_fp32_ls_exposed: bool = True    # fp32 stationary load not hidden behind the previous matmul
    tensor_result_cycles: int = 256    # TensorE: array drain from engine free to the PSUM result readable
    # --- launch and runtime loops ------------------------------------------
    launch_ns: float = 16000.0     # kernel prologue + epilogue (reported apart from the kernel time)
    loop_branch_ns: float = 50.0   # per runtime-loop iteration, on each engine's sequencer
    loop_barrier_ns: float = 200.0  # per iteration: cross-engine sync at the iteration boundary
    # --- descriptor generation (DGE) for dynamic DMAs -----------------------
    hwdge_instances: int = 0       # hardware DGE blocks per core (0: none)
    hwdge_issue_ns: float = 600.0  # per hwdge DMA instruction
    swdge_issue_ns: float = 600.0  # GpSimd time per software-DGE DMA instruction
    # --- memory / roofline -----------------------------------------------
    hbm_bw_per_core: float = 0.0   # bytes / ns: a physical core's share of the device HBM (0: no cap)
    cores_per_hbm_bank: int = 1    # physical cores sharing one HBM bank (the two programs of an LNC=2 core)
    # --- on-chip capacity (buffer reuse waits for the previous occupant) ---
    sbuf_bytes_per_partition: int = 0   # usable bytes per partition
    psum_banks: int = 8
    psum_bank_bytes: int = 2048
    extra: dict = field(default_factory=dict)

    @property
    def dma_bw_per_core(self) -> float:
        """Aggregate DMA bandwidth of one core in bytes/ns (= GB/s); the roofline's memory term."""
        return self.dma_engines * self.dma_bw_per_engine

    def dma_efficiency(self, run_bytes: float) -> float:
        """Fraction of an engine's peak rate reached by descriptors of ``run_bytes`` contiguous bytes.

        ``dma_sustained * min(1, run / dma_min_run_bytes)``: runs of at least
        ``dma_min_run_bytes`` stream at the sustained rate, shorter ones pay
        per descriptor as if they were that long. (The old curve, ``dma_eff_value``,
        is whole-transfer throughput including the
        fixed latency the scheduler adds separately; it stays in the table for
        reference only.)
        """
        run = max(float(run_bytes), 1.0)
        return self.dma_sustained * min(1.0, run / self.dma_min_run_bytes)

    def with_overrides(self, **kw) -> "HardwareSpec":
        """A copy with some constants replaced (for what-if studies and tests)."""
        return replace(self, **kw)


# Shared sources: most rules are stated once for NC-v2 and assumed for later cores.
_COMMON_SOURCES = {
    "mm_init_cycles": "MM II ~ max(N, MM_INIT_LATENCY=64) cycles [A1, PERF Opt #7] (stated for NC-v2; assumed for v3/v4)",
    "mm_fp32_factor": "fp32 at 1/4 of bf16 rate (23 vs 92 / 20 vs 79 TFLOPS) [A1-A3]; tfloat32 operands (both) run at the BF16/FP16/TF32 rate (79 TFLOPS on trn2) and are not charged this",
    "mm_fp32_onezero_factor": "is_*_onezero on an fp32 operand up to 2x faster [ISA] -> factor 2",
    "ls_speedup": "Fast LoadStationary up to 4x faster than MM; background LS so a pair costs max(LS, MM) [PERF]",
    "vector_elems_per_cycle": "NC-v2 one input ~N cycles, two inputs ~2N [A1] => 1 element/partition/cycle per input",
    "vector_overhead_cycles": "added to the streaming cycles, not used as a floor (the public trn2 microbenchmark log): [SHARED] MIN_II ~64 cycles and [A1] SBUF/PSUM access initiation ~60 cycles 'partly hidden by ILP' -> central 64; range 32 (half hidden, estimate) to 150 (public trn2 microbenchmark log, single unofficial source: [128, 512] VectorE op ~685 ns = N + ~150 cycles). [A1]'s '+~100 cycles' for dependent instructions is vector_raw_cycles, not this",
    "vector_second_input": "a two-input op without a perf mode costs N x (1 + this) / rate: [A1] documents ~2N (this = 1, the slow end); the NKI fused-Mamba tutorial's VectorE-saturated trn1 profile (mamba_v2 at 4096 channels, 99.63% VectorE) fits 0.1 (CALIBRATED; an earlier check estimated 1.0-1.4N); fast end 0 (both inputs in one pass). Bf16 perf modes keep the documented rule",
    "vector_raw_cycles": "'+~100 cycles' when an instruction depends on the previous one's output [A1]",
    "scalar_overhead_cycles": "as vector_overhead_cycles (central 64, range 32-150); AWS's trn2 DMA-overview profiles show an isolated exp costing ~300 ns over its N/1.2 GHz stream (latency, of which this is the pipelined part)",
    "scalar_raw_cycles": "dependent 1-element ScalarE chain II = 264 cycles = 1 + scalar_overhead_cycles (64) + 199 (this term); NC-v2 figure reused for v3/v4",
    "scalar_reduce_cycles": "ActReadAccumulator ~64 ScalarE cycles [A1]",
    "gpsimd_elems_per_cycle": "rsqrt on GpSimd has 4x lower throughput than on ScalarE (N cycles) [SHARED] => 0.25 element/partition/cycle; the only documented GpSimd rate, applied to every GpSimd op ('no rule of thumb' [A1])",
    "gpsimd_overhead_cycles": "estimate: as vector_overhead_cycles (central 64, range 32-150); GpSimd has 'no rule of thumb' [A1]",
    "dma_engines": "16 DMA engines per NC [DMA, DMABW]",
    "dma_partitions_per_engine": "each SBUF-side engine covers 8 partitions (128/16) [DMA]",
    "dma_fixed_ns": "trigger to first data, as latency (queues prefetch descriptors), not as queue occupancy: AWS's trn2 DMA-overview profiles (nki-dma-intro-3/-5.png) show ~700-900 ns from trigger to data; [DMABW] quotes ~1300 ns for setup + sync + semaphore-to-start (the completion part is dma_completion_ns). Central 900, range 700-1300",
    "dma_completion_ns": "AWS's trn2 DMA-overview profiles (nki-dma-intro-3/-5.png): the consumer (ScalarE) starts ~275-320 ns after the last DMA engine finishes. Central 300, range 250-350 (two samples)",
    "dma_min_run_bytes": "a descriptor's contiguous run r below this moves at r / this of the sustained rate: the '>= 512 B' rule quoted from the public trn2 microbenchmark log (the sentence was not found in the pinned docs), central 512; range 256 (estimate) to 2048 ([DMABW]: '256 B - 2 KiB improving but still below peak', >= 2 KiB recommended). The NKI matmul tutorial's DMA-bound trn1 rows are insensitive to the row length (256 B and 1 KiB rows move at the same ~120 GB/s): trn1's dma_sustained, not this, carries them",
    "dma_sustained": "trn2/trn3: a single trn2 engine reaches 23 B/ns = dma_bw_per_engine [DMA Example 1] and 16 engines ~21 B/ns each (nki-dma-intro-5.png); [PERF Opt #9] 'close to 70%' for large DMAs -> central 0.85, range 0.60-1.0 (the low end allows for the trn1 finding below on strided tiles, unmeasured on trn2)",
    "act_table_load_ns": "ScalarE activation-table load when an activation needs another function's table: 1.32 / 1.34 us bars in AWS's trn2 DMA-overview profiles (nki-dma-intro-5/-3.png); 1283 ns in the public trn2 microbenchmark log (single unofficial source). Central 1300, range 1283-1340. Which functions share a table is undocumented: every distinct function is taken as its own table, copy/identity as none (estimate)",
    "mm_fp32_ls_exposed": "estimate: Fast/background LoadStationary is documented for bf16-class operands [PERF]; an fp32 stationary is loaded at the fp32 rate (M x 4 / ls_speedup cycles) before its matmul instead of behind the previous one",
    "launch_ns": "kernel prologue + epilogue ~16 us measured on trn2 (public trn2 microbenchmark log, single unofficial source); estimate range 12-20 us; also charged for trn1 (no figure). Reported as its own line, not in time_ns",
    "loop_branch_ns": "estimate (no public figure): each engine's sequencer takes a branch per runtime-loop iteration; central 50 ns, range 25-100",
    "loop_barrier_ns": "estimate (no public figure): the compiler synchronises the engines at a runtime-loop iteration boundary (a semaphore round trip across engines, ~2 x semaphore_ns); central 200 ns, range 100-400",
    "dma_eff_value": "reference only (no longer used): whole-transfer throughput vs bytes/partition digitized from nki-dma-intro-1.jpg [DMABW]; it includes the fixed latency the scheduler adds, so the model keys efficiency on descriptor runs (dma_min_run_bytes) instead",
    "dma_transpose_hbm_factor": "DMA transpose up to 90% of copy throughput HBM->SBUF (Trn2) [A2]; assumed for all targets",
    "dma_transpose_sbuf_factor": "DMA transpose 50% of copy throughput SBUF->SBUF (Trn2) [A2]; assumed for all targets",
    "scalar_elems_per_cycle": "ScalarE 128 lanes => 1 element/partition/cycle (W_S = 128 on v2/v3, 128 for non-16-bit on v4)",
    "scalar_elems_per_cycle_16bit": "ScalarE 128 lanes for every dtype on v2/v3 [A1, A2]",
    "gpsimd_elems_per_cycle_16bit": "as gpsimd_elems_per_cycle: no 16-bit GpSimd rate is documented for v2/v3",
    "psum_banks": "PSUM 8 banks x 2 KiB per partition [A1-A3]",
    "psum_bank_bytes": "2 KiB (512 fp32) per bank per partition [A1]",
    "hwdge_issue_ns": "each hardware-DGE DMA instruction takes ~600 ns [A2, DGE]",
    "swdge_issue_ns": "not documented: software DGE 'consumes GpSimd cycles' [DGE]; assumed equal to the hwdge figure (600 ns per instruction)",
    "semaphore_ns": "not documented (the docs: 'fit it'): estimate, central 100 ns, range 64-150 ns (the two settings the cost-model audit tried); a DMA consumer waits dma_completion_ns instead. Paid after the producer's result latency (costs.result_latency_ns)",
    "tensor_result_cycles": "estimate (undocumented): a matmul's result reaches PSUM after the last moving column has crossed the 128x128 array, so a consumer on another engine sees it this long after TensorE is free for its next instruction: the fill-and-drain latency of an n x n systolic array, ~2n cycles; central 256 (128 rows + 128 columns), range 128-384. [PERF Opt #5a]: a dependent instruction 'cannot start data read until the previous instruction has all of its output committed'",
}

SOURCES: dict[str, dict[str, str]] = {}

# The HBM bandwidth a physical core gets and what the two programs of an LNC=2 core share
# (model.py: an HBM-side DMA moves at most this share; an LNC=2 program moving HBM data while
# the other does not may use the whole bank's).
_TRN2_HBM_SOURCE = (
    "about-neuron/arch/neuron-hardware/trainium2.rst (aws-neuron-sdk 81ce03ae): '96 GiB of device memory with 2.9 "
    "TB/sec of bandwidth', eight NeuronCore-v3 -> 362.5 GB/s per physical core ([A2] says 3 TB/s: 375). Binding "
    "on the DMA path: a core's HBM-side transfers move at most this share when the other core of its bank moves "
    "HBM data too (at LNC=1 the per-chip figures assume every core busy, so always). The 16 DMA engines' 368 GB/s "
    "x dma_sustained stays below it except at dma_sustained > 0.985 (the range's fast end)")
_TRN2_BANK_SOURCE = (
    "about-neuron/arch/neuron-features/logical-neuroncore-config.rst (aws-neuron-sdk 81ce03ae): 'Trainium2 devices "
    "contain four 24GB HBM banks. Each bank is shared by two physical NeuronCore-v3'; at LNC=2 the two physical "
    "cores of a logical core are those two (they 'share a single address space'); nki.isa.core_barrier (NKI API, "
    "v2.33): cores=(0, 1) are 'two NeuronCores that share the same HBM stack'")

_NC3_OVERHEAD_SOURCE = (
    "fitted (CALIBRATED) on NC-v3: the static cost of every Vector/Scalar/GpSimd instruction (dispatch, "
    "semaphore check, SBUF/PSUM access start), added to its stream, read off the NxD Inference contrib "
    "Qwen3.5-27B fused DeltaNet kernel's per-chunk slope on trn2 (calibration row deltanet_fused_slope: "
    "a serial chain of ~135 [128, 128] fp32 instructions per chunk, half of them VectorE): 199 cycles. Same "
    "order as [PERF Opt #5a] 'static instruction overhead in the order of ~100 cycles'; one figure for the "
    "three engines as that text gives one. Range 132-254: the fit redone with semaphore_ns and "
    "tensor_result_cycles at their range ends. NC-v2 keeps 64 (its dependent-chain II, scalar_raw_cycles)")

# The values of the constants _COMMON_SOURCES documents (each stated once for
# NC-v2 and assumed for later cores; a later target overrides one only with its
# own source, as trn3 does below). Constants with a dataclass default are not repeated.
_COMMON_VALUES = dict(
    mm_init_cycles=64, mm_fp32_factor=4.0, mm_fp32_onezero_factor=2.0, ls_speedup=4.0,
    vector_elems_per_cycle=1.0, vector_overhead_cycles=64, vector_raw_cycles=100,
    vector_second_input=0.1,
    scalar_elems_per_cycle=1.0, scalar_elems_per_cycle_16bit=1.0,
    scalar_overhead_cycles=64, scalar_raw_cycles=199, scalar_reduce_cycles=64,
    gpsimd_elems_per_cycle=0.25, gpsimd_elems_per_cycle_16bit=0.25, gpsimd_overhead_cycles=64,
    dma_engines=16, dma_fixed_ns=900.0, dma_partitions_per_engine=8,
    dma_transpose_hbm_factor=0.9, dma_transpose_sbuf_factor=0.5,
)

TRN1 = HardwareSpec(
    name="trn1", nc_version=2, **_COMMON_VALUES,
    tensor_ghz=2.8, transpose_fp32_factor=4.0,
    bf16_peak_flops=92e12, fp32_peak_flops=23e12,
    vector_ghz=1.12, vector_perf_modes=False,
    scalar_ghz=1.4, gpsimd_ghz=1.4,
    dma_bw_per_engine=17.0, dma_sustained=0.40,
    hbm_bw_per_core=410.0,
    sbuf_bytes_per_partition=(192 - 16) * 1024,
)
SOURCES["trn1"] = dict(
    _COMMON_SOURCES,
    hwdge_instances="no hardware DGE on NC-v2 (software DGE on GpSimd) [A2, DGE]",
    sbuf_bytes_per_partition="192 KiB per partition [A1] less the 16 KiB reserve nki_ssm.sim.targets keeps (usable size undocumented)",
    tensor_ghz="TensorE 2.8 GHz [A1]",
    bf16_peak_flops="92 TFLOPS dense bf16 per NC-v2 [A1]",
    fp32_peak_flops="23 TFLOPS fp32 [A1]",
    transpose_fp32_factor="fp32 transpose 4x on v2 (identity matmul at fp32 rate)",
    vector_ghz="VectorE 1.12 GHz, 128 lanes [A1]",
    vector_perf_modes="NC-v2 has no bf16 perf modes (introduced with NC-v3) [A2]",
    scalar_ghz="ScalarE 1.4 GHz / 128 lanes [A1]",
    scalar_elems_per_cycle="W_S = 128 lanes on v2 -> 1 element/partition/cycle",
    gpsimd_ghz="GpSimd 1.4 GHz [A1]",
    dma_bw_per_engine="17 B/ns per engine (272 GB/s per NC) [DMABW]; the 27.2 GB/s 'theoretical' figure [DMA] is not reached",
    dma_sustained="fitted (CALIBRATED): the NKI matmul tutorial's DMA-bound trn1 kernels move their [128, 512] / [128, 128] bf16 tiles (1 KiB / 256 B rows, 8-16 KiB apart) at ~100-120 GB/s per core, ~0.40 of 16 x 17 B/ns, whatever the row length; range 0.35-0.70 ([PERF Opt #9] 'close to 70%')",
    hbm_bw_per_core="820 GB/s / 2 NCs [A1]; caps a core's HBM-side DMA rate (never binds: 16 x 17 B/ns = 272 GB/s; the roofline uses the DMA aggregate)",
    cores_per_hbm_bank="trn1 has no LNC: one program per core, no bank sharing between programs",
)

# NC-v3 static cost of every Vector/Scalar/GpSimd instruction, read off the published
# trn2 DeltaNet kernel's per-chunk slope (calibration row deltanet_fused_slope; CALIBRATED).
NC3_INSTRUCTION_OVERHEAD_CYCLES = 199

TRN2 = HardwareSpec(
    name="trn2", nc_version=3, **dict(_COMMON_VALUES, vector_overhead_cycles=NC3_INSTRUCTION_OVERHEAD_CYCLES,
                                      scalar_overhead_cycles=NC3_INSTRUCTION_OVERHEAD_CYCLES,
                                      gpsimd_overhead_cycles=NC3_INSTRUCTION_OVERHEAD_CYCLES),
    tensor_ghz=2.4, transpose_fp32_factor=2.0,
    bf16_peak_flops=79e12, fp32_peak_flops=20e12,
    vector_ghz=0.96, vector_perf_modes=True,
    scalar_ghz=1.2, gpsimd_ghz=1.2,
    dma_bw_per_engine=23.0,
    hbm_bw_per_core=2900.0 / 8,
    cores_per_hbm_bank=2,
    sbuf_bytes_per_partition=(224 - 16) * 1024,
    hwdge_instances=2,
)
SOURCES["trn2"] = dict(
    _COMMON_SOURCES,
    hwdge_instances="nki-dge.rst: 'Each TRN2 NeuronCore has two DGE instances' [DGE]",
    **dict.fromkeys(("vector_overhead_cycles", "scalar_overhead_cycles", "gpsimd_overhead_cycles"), _NC3_OVERHEAD_SOURCE),
    sbuf_bytes_per_partition="224 KiB per partition [A2] less the 16 KiB reserve nki_ssm.sim.targets keeps (usable size undocumented)",
    tensor_ghz="TensorE 2.4 GHz [A2]",
    bf16_peak_flops="79 TFLOPS dense bf16 per NC-v3 [A2, NC3]",
    fp32_peak_flops="20 TFLOPS fp32 [A2]",
    transpose_fp32_factor="v3 transpose mode makes fp32 transposes 2x faster than fp32 matmul rate [A2]",
    vector_ghz="VectorE 0.96 GHz [A2]",
    vector_elems_per_cycle="v3 fp32 per-cycle throughput unclear (128 or 256/cycle); took 128 (1/partition/cycle) because the perf-mode text implies no fp32 gain over NC-v2",
    vector_perf_modes="NC-v3 bf16/fp16 perf modes: 1-input SBUF contiguous x4, non-contiguous or PSUM x2, 2-input all-SBUF x2 [A2]",
    scalar_ghz="ScalarE 1.2 GHz / 128 lanes [A2]",
    gpsimd_ghz="GpSimd 1.2 GHz [A2]",
    dma_bw_per_engine="23 B/ns per engine (368 GB/s per NC) [DMABW]; matches 32 KiB in 1416 ns on one engine [DMA]",
    hbm_bw_per_core=_TRN2_HBM_SOURCE,
    cores_per_hbm_bank=_TRN2_BANK_SOURCE,
)

# trn3 = trn2 except the values below. The values it shares (e.g. TensorE 2.4 GHz,
# 79/20 TFLOPS, two DGE instances) keep their own NC-v4 sources in SOURCES["trn3"].
TRN3 = replace(
    TRN2, name="trn3", nc_version=4,
    vector_ghz=1.2,
    scalar_elems_per_cycle_16bit=2.0,
    gpsimd_elems_per_cycle=1.0, gpsimd_elems_per_cycle_16bit=1.0,
    dma_bw_per_engine=33.0,
    hbm_bw_per_core=4900.0 / 8,
    sbuf_bytes_per_partition=(256 - 16) * 1024,
)
SOURCES["trn3"] = dict(
    _COMMON_SOURCES,
    hwdge_instances="not restated for NC-v4; trn2's two instances assumed",
    **dict.fromkeys(("vector_overhead_cycles", "scalar_overhead_cycles", "gpsimd_overhead_cycles"),
                    "NC-v3's fitted figure assumed for NC-v4: " + _NC3_OVERHEAD_SOURCE),
    sbuf_bytes_per_partition="256 KiB per partition [A3] less the 16 KiB reserve nki_ssm.sim.targets keeps (usable size undocumented)",
    tensor_ghz="TensorE 2.4 GHz [A3]",
    bf16_peak_flops="79 TFLOPS dense bf16 per NC-v4 [A3, NC4] (MXFP8 315 not used: kernels here are bf16)",
    fp32_peak_flops="20 TFLOPS fp32 [A3]",
    transpose_fp32_factor="transpose mode as v3 (assumed; v4 background transpose not modelled)",
    vector_ghz="VectorE 1.2 GHz [A3]",
    vector_elems_per_cycle="as trn2 (v4 fp32 rate not stated)",
    vector_perf_modes="v3 perf modes assumed on v4 (512 bf16 elem/cycle data path [A3])",
    scalar_ghz="ScalarE 1.2 GHz [A3]",
    scalar_elems_per_cycle_16bit="ScalarE 256 lanes for bf16/fp16/fp8 on v4 [A3] -> 2/partition/cycle",
    gpsimd_ghz="GpSimd 1.2 GHz [A3]",
    gpsimd_elems_per_cycle="v4 GpSimd 128 elem/cycle for all dtypes [A3] => 1/partition/cycle",
    gpsimd_elems_per_cycle_16bit="v4 GpSimd 128 elem/cycle for all dtypes [A3]",
    dma_bw_per_engine="33 B/ns per engine (528 GB/s per NC) [DMABW]",
    hbm_bw_per_core=("about-neuron/arch/neuron-hardware/trainium3.rst (aws-neuron-sdk 81ce03ae): 144 GiB of device "
                     "memory with 4.9 TB/sec, eight NeuronCore-v4 -> 612.5 GB/s per core ([A3] says 4.7 TB/s); "
                     "binding as on trn2 (16 x 33 B/ns = 528 GB/s of DMA stays below it at every dma_sustained)"),
    cores_per_hbm_bank=("assumed as trn2 (trainium3.rst: LNC 'similar to Trainium2'; the bank layout of Trainium3 is "
                        "not stated; nki.isa.core_barrier: 'two NeuronCores that share the same HBM stack')"),
)

TARGETS: dict[str, HardwareSpec] = {"trn1": TRN1, "trn2": TRN2, "trn3": TRN3}
_ALIASES = {"inf2": "trn1", "gen2": "trn1", "gen3": "trn2", "gen4": "trn3"}

# Constants whose value was set or moved by fitting a published measurement
# (name -> which calibration row). Everything else is read from the docs.
CALIBRATED: dict[str, str] = {
    "scalar_raw_cycles": "the published dependent ScalarE chain (II 264 cycles; calibration row scalar_dependent_chain) — the only data point for it",
    "act_table_load_ns": "read off the 1.32-1.34 us bars of AWS's trn2 DMA-overview profiles and the trn2 log's 1283 ns (calibration row act_table_load)",
    "launch_ns": "the trn2 log's ~16 us (calibration row launch_overhead)",
    "vector_second_input": "fitted to the fused-Mamba tutorial's mamba_v2 at 4096 channels (1.61 ms, VectorE 99.63%; calibration row mamba_v2_4096ch); the documented 2N rule puts that row at 1.73x",
    "dma_sustained": "trn1 only: fitted to the NKI matmul tutorial's nki_matmul_hoist_load_ (42.96 ms; calibration row matmul_hoist_load); trn2/trn3 keep the profile-based 0.85",
    "vector_overhead_cycles": "NC-v3 (trn2, and trn3 by assumption) only: fitted to the NxD Inference Qwen3.5-27B fused DeltaNet kernel's per-chunk slope (calibration row deltanet_fused_slope); also scalar_overhead_cycles and gpsimd_overhead_cycles (one figure for the three engines)",
}


# The documented (or estimated) range of each uncertain constant, per target:
# name -> (value at the fast end, value at the slow end). The tables above hold
# the central value; ``bracket(spec, "low")`` / ``bracket(spec, "high")`` give
# the tables whose modeled times bound the central one. Nothing here is fitted.
_COMMON_RANGES = {
    "vector_overhead_cycles": (32, 150),
    "vector_second_input": (0.0, 1.0),
    "scalar_overhead_cycles": (32, 150),
    "gpsimd_overhead_cycles": (32, 150),
    "semaphore_ns": (64.0, 150.0),
    "tensor_result_cycles": (128, 384),
    "dma_completion_ns": (250.0, 350.0),
    "dma_fixed_ns": (700.0, 1300.0),
    "dma_min_run_bytes": (256, 2048),
    "act_table_load_ns": (1283.0, 1340.0),
    "launch_ns": (12000.0, 20000.0),
    "loop_branch_ns": (25.0, 100.0),
    "loop_barrier_ns": (100.0, 400.0),
    "swdge_issue_ns": (300.0, 900.0),
}
NC3_OVERHEAD_RANGE = (132, 254)
RANGE_SOURCES = {
    "vector_elems_per_cycle": "VectorE data path 256 elements/cycle for non-16-bit dtypes on v3/v4 "
                              "(= 2/partition/cycle, fast end); v2: 128 lanes, no range (its two-input evidence "
                              "is vector_second_input's)",
    "gpsimd_elems_per_cycle": "8 cores x 16 fp32 lanes = 128 lanes => 1/partition/cycle (v2/v3 fast end)",
    "gpsimd_elems_per_cycle_16bit": "as gpsimd_elems_per_cycle",
    "swdge_issue_ns": "undocumented; assumed 600 ns (hwdge figure), range 300-900",
    "dma_sustained": "see SOURCES",
    **{k: "see SOURCES (central value and its range)" for k in _COMMON_RANGES if k != "swdge_issue_ns"},
}


def ranges(spec: "HardwareSpec | str") -> dict:
    """name -> (fast-end value, slow-end value) for ``spec``'s uncertain constants."""
    spec = get_target(spec)
    out = dict(_COMMON_RANGES)
    out["dma_sustained"] = (0.70, 0.35) if spec.nc_version == 2 else (1.0, 0.60)
    if spec.nc_version >= 3:
        # the fitted NC-v3 instruction overhead: its fit with the wait constants at their ends
        for name in ("vector_overhead_cycles", "scalar_overhead_cycles", "gpsimd_overhead_cycles"):
            out[name] = NC3_OVERHEAD_RANGE
    if spec.nc_version >= 3:
        out["vector_elems_per_cycle"] = (2.0, spec.vector_elems_per_cycle)
    out["gpsimd_elems_per_cycle"] = (max(1.0, spec.gpsimd_elems_per_cycle), spec.gpsimd_elems_per_cycle)
    out["gpsimd_elems_per_cycle_16bit"] = (max(1.0, spec.gpsimd_elems_per_cycle_16bit),
                                           spec.gpsimd_elems_per_cycle_16bit)
    return out


def bracket(spec: "HardwareSpec | str", end: str) -> HardwareSpec:
    """``spec`` with every uncertain constant at its fast (``end="low"``) or slow (``"high"``) end."""
    spec = get_target(spec)
    if end not in ("low", "high"):
        raise ValueError(f"end must be 'low' or 'high', got {end!r}")
    k = 0 if end == "low" else 1
    return spec.with_overrides(**{name: pair[k] for name, pair in ranges(spec).items()})


# How the 10-90 % interval is drawn (model.model_range): this many tables, this seed.
RANGE_SAMPLES = 12
RANGE_SEED = 2026


def _split_uniform(q, fast, central, slow):
    """The value at quantile ``q`` of a split uniform: half the mass uniformly between the
    fast end and the central value, half between the central value and the slow end."""
    if q < 0.5:
        return fast + (central - fast) * (q / 0.5)
    return central + (slow - central) * ((q - 0.5) / 0.5)


def sampled(spec: "HardwareSpec | str", samples: int = RANGE_SAMPLES, seed: int = RANGE_SEED) -> list:
    """``samples`` copies of ``spec``, each uncertain constant drawn independently of the others.

    Each constant follows a split uniform about its central value (half its
    mass between the fast end and the central value, half between the central
    value and the slow end), so the central value is its median whatever the
    asymmetry of its range. The draws are stratified (Latin hypercube): each
    constant's ``samples`` draws fall one in each of ``samples`` equal
    quantile bins, in an order drawn independently per constant, so a dozen
    tables cover every range evenly while the constants stay independent of
    one another. Integer constants are rounded. Seeded (``seed``): the same
    spec gives the same tables on every run, so reports and CI are deterministic.
    """
    spec = get_target(spec)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    rng = np.random.default_rng(seed)
    table = ranges(spec)
    columns = {}
    for name in sorted(table):
        fast, slow = table[name]
        central = getattr(spec, name)
        quantiles = (rng.permutation(samples) + rng.random(samples)) / samples
        values = [_split_uniform(q, fast, central, slow) for q in quantiles]
        integer = isinstance(central, (int, np.integer)) and not isinstance(central, bool)
        columns[name] = [int(round(v)) if integer else float(v) for v in values]
    return [spec.with_overrides(**{name: col[k] for name, col in columns.items()}) for k in range(samples)]


def optimistic(spec: "HardwareSpec | str") -> HardwareSpec:
    """The fast end of every range (``bracket(spec, "low")``; kept for older callers)."""
    return bracket(spec, "low")


def get_target(target: "str | HardwareSpec | None" = None) -> HardwareSpec:
    """The spec of a target name (``trn1``/``trn2``/``trn3`` or gen2/3/4 aliases); None -> trn2."""
    if isinstance(target, HardwareSpec):
        return target
    if target is None or target == "":
        return TRN2
    if not isinstance(target, str):
        raise TypeError(f"target must be a str or HardwareSpec, got {type(target).__name__}")
    key = _ALIASES.get(target.lower(), target.lower())
    if key not in TARGETS:
        raise ValueError(f"target must be one of {sorted(TARGETS)} (or gen2/gen3/gen4), got {target!r}")
    return TARGETS[key]


def source_of(target: str, constant: str) -> str:
    """Where a constant of a target comes from (raises KeyError if undocumented)."""
    return SOURCES[get_target(target).name][constant]
