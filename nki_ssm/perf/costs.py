"""Cost of one traced instruction on its engine (the documented rules; sources in ``hardware.SOURCES``).

``compute_ns(inst, hw)`` is the occupancy of a TensorE / VectorE / ScalarE /
GpSimd instruction; ``dma_plan(inst, hw)`` says how many DMA engines a
transfer uses and how long it keeps them busy (its fixed latency is added by
the scheduler, not here). Only fields of ``nki_ssm.sim.trace.Instruction``
are read.
"""
from __future__ import annotations

import math

from nki_ssm.perf.hardware import HardwareSpec

# Ops whose VectorE cost is not the generic streaming rule.
_VECTOR_RECIPROCAL_FACTOR = 8  # reciprocal on VectorE: max(MIN_II, 8N) [SHARED]


def _attr(inst, key, default=None):
    return inst.attrs.get(key, default) if inst.attrs else default


def matmul_flops(inst) -> int:
    """2*K*M*N for a matmul (0 for transposes and non-TensorE instructions)."""
    if inst.engine != "tensor" or _attr(inst, "is_transpose", False) or "transpose" in inst.op:
        return 0
    k, m, n = _attr(inst, "K"), _attr(inst, "M"), _attr(inst, "N")
    if k is None or m is None or n is None:
        return 0
    # K is the contraction length as recorded (the simulator already doubles it for double_row)
    return 2 * int(k) * int(m) * int(n)


def tensor_cycles(inst, hw: HardwareSpec) -> float:
    """TensorE cycles: MM II = max(N, 64) x dtype factor; LS ~ M/4 hidden behind MM (max).

    fp32 operands (``hw.mm_fp32_ls_exposed``): the stationary load runs at the
    fp32 rate (M x 4 / ls_speedup cycles) before the matmul, not behind it.
    A ones-matmul lowered from ``nl.broadcast_to`` is priced as the compiler's
    lowering: its stationary is all ones, so the 0/1 rate applies.
    """
    n = int(_attr(inst, "N", inst.free_size) or 0)
    fp32 = bool(_attr(inst, "fp32", False))
    if _attr(inst, "is_transpose", False) or "transpose" in inst.op:
        return max(n, hw.mm_init_cycles) * (hw.transpose_fp32_factor if fp32 else 1.0)
    onezero = _attr(inst, "onezero", False) or _attr(inst, "lowering") == "nl.broadcast_to"
    if fp32:
        factor = hw.mm_fp32_onezero_factor if onezero else hw.mm_fp32_factor
    else:
        factor = 1.0
    mm = max(n, hw.mm_init_cycles) * factor
    m = int(_attr(inst, "M", 128) or 0)
    if fp32 and hw.mm_fp32_ls_exposed:
        return mm + m * hw.mm_fp32_factor / hw.ls_speedup
    return max(mm, m / hw.ls_speedup)


# The VectorE instructions the NC-v3 perf modes apply to, by input count (trainium2_arch.rst,
# "Vector Engine Performance Mode"): one input, tensor_copy / tensor_scalar (x4 SBUF contiguous,
# x2 non-contiguous or a PSUM side); two inputs, tensor_tensor (x2, both SBUF). Every other
# instruction (scans, reductions, scalar_tensor_tensor, shuffles, ...) streams at the base rate.
_PERF_MODE_OPS = {1: ("tensor_copy", "tensor_scalar"), 2: ("tensor_tensor",)}


def vector_cycles(inst, hw: HardwareSpec) -> float:
    """VectorE cycles: passes x N / rate + fixed overhead, with NC-v3+ bf16 perf modes
    for the instructions the architecture guide names (``_PERF_MODE_OPS``).

    Without a perf mode a k-input op makes 1 + (k - 1) x ``vector_second_input``
    passes (documented 2N for two inputs is the slow end; the published trn1
    profiles imply ~1.4N); with one, ``k`` passes at the multiplied rate.

    The fixed cost (SBUF access initiation and dispatch, ``vector_overhead_cycles``)
    is added to the stream, not used as a floor (the public trn2 microbenchmark log's
    [128, 512] op at N + ~150 cycles); the extra latency of dependent
    instructions is the scheduler's raw latency.
    """
    n = max(int(inst.free_size), 1)
    k = max(int(inst.num_inputs), 1)
    rate = hw.vector_elems_per_cycle
    passes = float(k)
    if hw.vector_perf_modes and _attr(inst, "all_16bit", False) and inst.op in _PERF_MODE_OPS[min(k, 2)]:
        psum = bool(_attr(inst, "psum_operand", False))
        contiguous = bool(_attr(inst, "contiguous", True))
        if k == 1:
            rate *= 4.0 if (contiguous and not psum) else 2.0
        elif not psum:
            rate *= 2.0
    if rate == hw.vector_elems_per_cycle and k > 1:
        # no perf mode: inputs after the first cost a share of a pass (vector_second_input)
        passes = 1.0 + (k - 1) * hw.vector_second_input
    stream = math.ceil(n * passes / rate)
    if "reciprocal" in inst.op:
        stream = n * _VECTOR_RECIPROCAL_FACTOR
    return stream + hw.vector_overhead_cycles


def scalar_cycles(inst, hw: HardwareSpec) -> float:
    """ScalarE cycles: N / lanes + fixed overhead (scale, bias and add-reduce are free) + accumulator read.

    The ~64-cycle ActReadAccumulator is charged when the instruction writes
    ``reduce_res`` (attrs ``reduce_res``), not for accumulating itself.
    """
    n = max(int(inst.free_size), 1)
    rate = hw.scalar_elems_per_cycle_16bit if _attr(inst, "all_16bit", False) else hw.scalar_elems_per_cycle
    k = max(int(inst.num_inputs), 1)
    cycles = math.ceil(n * k / rate) + hw.scalar_overhead_cycles
    if _attr(inst, "reduce_res", False):
        cycles += hw.scalar_reduce_cycles
    return cycles


def gpsimd_cycles(inst, hw: HardwareSpec) -> float:
    """GpSimd cycles: N / rate + fixed overhead, whatever the number of inputs.

    The only documented GpSimd throughput is "rsqrt 4x lower than ScalarE"
    on v2/v3 ([SHARED]) and "128 elements/cycle" on v4 ([A3]); both are
    per-element figures, so the input count is not multiplied in.
    """
    n = max(int(inst.free_size), 1)
    rate = hw.gpsimd_elems_per_cycle_16bit if _attr(inst, "all_16bit", False) else hw.gpsimd_elems_per_cycle
    return math.ceil(n / rate) + hw.gpsimd_overhead_cycles


_CLOCK = {"tensor": "tensor_ghz", "vector": "vector_ghz", "scalar": "scalar_ghz", "gpsimd": "gpsimd_ghz"}
_CYCLES = {"tensor": tensor_cycles, "vector": vector_cycles, "scalar": scalar_cycles, "gpsimd": gpsimd_cycles}


# Instructions the simulator emits inside a convenience op whose compiler lowering has
# no such instruction: ``nl.broadcast_to`` across partitions is one TensorE ones-matmul
# read by its consumer (fused_mamba.rst: "partition-dim broadcast often requires a
# separate instruction on TensorE"); the staging copy, the ones memset (a constant the
# compiler hoists) and the PSUM->SBUF copy cost nothing.
_FREE_IN_LOWERING = {"nl.broadcast_to": ("tensor_copy", "memset")}


def absent_in_lowering(inst) -> bool:
    """True for an instruction the compiler's lowering of its convenience op does not emit."""
    lowering = _attr(inst, "lowering")
    return lowering is not None and inst.engine != "tensor" and inst.op in _FREE_IN_LOWERING.get(lowering, ())


def compute_ns(inst, hw: HardwareSpec) -> float:
    """Occupancy in ns of a compute-engine instruction."""
    if absent_in_lowering(inst):
        return 0.0
    try:
        fn = _CYCLES[inst.engine]
    except KeyError:
        raise ValueError(
            f"instruction {inst.index} ({inst.op}): engine must be one of {sorted(_CYCLES)} or 'dma', "
            f"got {inst.engine!r}") from None
    return fn(inst, hw) / getattr(hw, _CLOCK[inst.engine])


def raw_latency_ns(engine: str, hw: HardwareSpec) -> float:
    """Extra wait when an instruction reads what the same engine just wrote (pipeline drain)."""
    if engine == "vector":
        return hw.vector_raw_cycles / hw.vector_ghz
    if engine == "scalar":
        return hw.scalar_raw_cycles / hw.scalar_ghz
    return 0.0


def result_latency_ns(engine: str, hw: HardwareSpec) -> float:
    """Time from an instruction's engine occupancy ending to its result being readable by
    another engine: the Vector/Scalar pipeline latency (``raw_latency_ns``) or the TensorE
    array drain to PSUM (``tensor_result_cycles``); 0 for GpSimd (no figure) and DMA
    (its completion semaphore is ``dma_completion_ns``)."""
    if engine == "tensor":
        return hw.tensor_result_cycles / hw.tensor_ghz
    return raw_latency_ns(engine, hw)


def dma_plan(inst, hw: HardwareSpec) -> tuple[int, float]:
    """(engines used, data-transfer time in ns) of a DMA instruction.

    SBUF side over P partitions: min(16, ceil(P / 8)) engines, each at
    ``dma_bw_per_engine * hw.dma_efficiency(run)``, ``run`` = the contiguous
    bytes of one descriptor: ``attrs["run_bytes"]`` when the trace records it,
    else the bytes per partition (a contiguous row per partition). HBM->HBM
    transfers (``partitions == 0``) have no partition side; they are treated as
    if laid over up to 128 rows of >= 512 B (an assumption: descriptors of that
    size are what the DMA engines split big copies into).
    """
    nbytes = int(inst.nbytes)
    parts = _attr(inst, "partitions", inst.num_partitions)
    parts = int(parts) if parts is not None else int(inst.num_partitions)
    if parts <= 0:
        parts = int(min(128, max(1, nbytes // 512)))
        bpp = nbytes / parts
    else:
        bpp = _attr(inst, "bytes_per_partition", None)
        bpp = float(bpp) if bpp else nbytes / max(parts, 1)
    run = _attr(inst, "run_bytes", None)
    run = float(run) if run else bpp
    engines = int(min(hw.dma_engines, max(1, math.ceil(parts / hw.dma_partitions_per_engine))))
    bw = engines * hw.dma_bw_per_engine * hw.dma_efficiency(run)
    if _attr(inst, "transpose", False):
        src_hbm = any(r.buffer == "hbm" for r in inst.reads)
        bw *= hw.dma_transpose_hbm_factor if src_hbm else hw.dma_transpose_sbuf_factor
    return engines, (nbytes / bw if nbytes > 0 else 0.0)


def dge_mode(inst, hw: HardwareSpec) -> str | None:
    """"hwdge", "swdge" or None (static descriptors, no on-device generation) for a DMA.

    ``none``: host-built descriptors. ``unknown`` (compiler's choice): static
    patterns are taken as ``none``; dynamic ones (``indirect``) as hwdge on
    targets that have it, else swdge. Vector-offset gathers are recorded as
    swdge by the simulator (nki-dge.rst: they force software DGE).
    """
    mode = _attr(inst, "dge_mode", "unknown") or "unknown"
    if mode == "unknown":
        if not _attr(inst, "indirect", False):
            return None
        mode = "hwdge" if hw.hwdge_instances > 0 else "swdge"
    if mode == "hwdge" and hw.hwdge_instances <= 0:
        mode = "swdge"
    return mode if mode in ("hwdge", "swdge") else None
