"""``nki.isa`` on the CPU: the instruction set of the bundled NKI simulator.

Import it as ``nisa`` (``from nki_ssm.sim import isa as nisa``). Every call is
destination-first with keyword arguments, validates its operands against the
hardware rules of the current target (``NEURON_PLATFORM_TARGET_OVERRIDE``,
default trn2), executes eagerly on NumPy, appends one
:class:`nki_ssm.sim.trace.Instruction` to the active trace (if any) and
returns an :class:`NkiInstruction` handle. Violations raise
:class:`NkiValidationError` (a ``ValueError``) naming the instruction, the
operand and the limit; a wrong Python type raises ``TypeError``.

Numerics: Vector/Scalar/GpSimd arithmetic reads operands as float32, computes
in float32 and rounds once to ``dst.dtype`` (round-to-nearest-even through
ml_dtypes; float->int rounds to even and saturates). Bitvec operators act on
raw integer bits. ``nc_matmul`` sums products in float64 and rounds once to
float32 before adding into PSUM. DMA casts through float32 unless dtypes
match (bit copy). ScalarE functions are the exact functions in float32/64:
the hardware's piecewise polynomials (including ``sin`` without range
reduction) are not modelled, and out-of-range inputs are not poisoned.

Module layout: ``dma`` (dma_copy, dma_transpose), ``matmul`` (TensorE:
nc_matmul, nc_transpose; not named ``tensor_engine``, which would shadow the
``nisa.tensor_engine`` engine constant), ``vector`` (copies, fills, elementwise,
reductions), ``scan`` (tensor_tensor_scan, tensor_scalar_cumulative),
``select`` (range/select_reduce, nc_stream_shuffle, bn_stats/aggr),
``scalar`` (activation), ``gpsimd`` (iota, affine_select, partition reduce,
local_gather, ...), ``extra`` (exponential, activate2, max8, ...),
``random``, ``registers``, ``nki_scalar`` (NkiScalar, scalar_load / scalar_store /
scalar_alu: NKI 0.7.0+), ``sync`` (core_barrier, sendrecv); shared checks
in ``_core``, ALU/activation tables in ``_alu``, accumulator and PRNG state in
``_state``.

Assumptions beyond the documentation (each marked in the code):

- the start-partition rule (0 / 0,64 / 0,32,64,96 by partition count) is
  applied to every compute instruction's operands (documented for NC-v2 and
  nc_stream_shuffle; UNVERIFIED for other instructions on v3/v4); DMA is
  exempt;
- ``accumulate=None`` is tracked per PSUM element (first matmul write
  overwrites, later ones add); ``accumulate=True`` on an element no matmul
  has written raises on trn1/trn2 (undefined behaviour on hardware);
- VectorE / ScalarE accumulator registers start as NaN, persist across
  instructions per SPMD program, and are indexed by absolute partition;
  ``select_reduce`` / ``exponential`` with ``reduce_cmd.idle`` leave them NaN
  (the docs: "accumulator state unknown");
- ``memset`` rejects an int value for float dtypes as well as a float for
  integer dtypes (the 0.3.0 rule "value must match the dtype" read both
  ways); float values are fp32 immediates;
- ``tensor_partition_reduce`` writes a ``(1, F)`` dst;
- ``activate2`` ``prelu`` is ``x if x > 0 else relu_param * x``;
- the random instructions run XORWOW per lane with our own state layout and
  seeding (see ``isa.random``): deterministic streams, not the hardware's
  bits;
- ``local_gather`` and ``sequence_bounds`` follow the NumPy references in
  the SDK's legacy tests (test_nki_isa_local_gather / _sequence_bounds).

Not implemented (documented nki.isa API of NKI 0.5/0.6; each raises
NotImplementedError naming itself): ``nc_matmul_mx`` and ``quantize_mx``
(MX formats; the packed x4 dtypes are not in sim.dtypes), ``topk`` (its
"16P input snake" layout is not specified precisely enough to model).

LNC=2 synchronisation (``sync``): ``core_barrier`` and ``sendrecv`` are
rendezvous of the two programs, which run in lock-step (``sim.lnc``); HBM
races between them are errors (``sim.races``).

Partially implemented: ``get_nc_sub_version`` always returns 0;
``dma_transpose`` lacks the indirect (swdge gather-transpose) form;
``priority`` has no effect on ``dma_copy``; no ``.indirect()`` tensor indirection (v4) on compute
instructions; ``nc_transpose`` on trn1 TensorE is bit-exact (the hardware's
identity-matmul NaN/Inf smearing is not modelled); ``nc_matmul`` rounds
tfloat32 operands to 10 mantissa bits with round-to-nearest-even (the
hardware's rounding of tf32 is undocumented; float32 operands are exact); ScalarE activation
functions are exact (no polynomial approximation); of the range-limited
ones only ``sin`` and ``arctan`` (no range reduction on hardware) return NaN
outside their valid ranges.
"""
from __future__ import annotations

from .. import version as _version
from ..errors import NkiValidationError
from ._enums import (NkiInstruction, dge_mode, dma_engine, engine, gpsimd_engine, matmul_perf_mode,
                     nc_version, oob_mode, reduce_cmd, scalar_engine, tensor_engine, unknown_engine,
                     vector_engine)
from .dma import dma_copy, dma_transpose
from .extra import (activate2, dma_compute, exponential, max8, nc_find_index8, nc_match_replace8,
                    nc_n_gather, tensor_copy_predicated)
from .random import dropout, rand2, rand_get_state, rand_set_state, rng, set_rng_seed
from .registers import VirtualRegister as _VirtualRegister
from .registers import register_alloc, register_load, register_move, register_store
from .nki_scalar import NkiScalar as _NkiScalar
from .nki_scalar import scalar_alu as _scalar_alu
from .nki_scalar import scalar_load as _scalar_load
from .nki_scalar import scalar_store as _scalar_store
from .gpsimd import (affine_select, iota, local_gather, nonzero_with_count, sequence_bounds,
                     tensor_partition_reduce)
from .scalar import activation, activation_reduce
from .sync import core_barrier, sendrecv
from .matmul import nc_matmul, nc_transpose
from .scan import tensor_scalar_cumulative, tensor_tensor_scan
from .select import FP32_MIN, bn_aggr, bn_stats, nc_stream_shuffle, range_select, select_reduce
from .vector import (memset, reciprocal, scalar_tensor_tensor, tensor_copy, tensor_reduce,
                     tensor_scalar, tensor_scalar_reduce, tensor_tensor)


def get_nc_version() -> nc_version:
    """The ``nc_version`` of the current target (trn1 gen2, trn2 gen3, trn3 gen4)."""
    from ..targets import current_target
    return nc_version(current_target().nc_version)


def get_nc_sub_version() -> int:
    """Silicon sub-revision of the target; the simulator models revision 0 only."""
    return 0


def _missing(api: str):
    def fn(*args, **kwargs):
        raise NotImplementedError(
            f"nki.isa.{api} is not implemented by the nki_ssm simulator yet "
            f"(see nki_ssm.sim.isa docstring for the list)")
    fn.__name__ = api
    fn.__qualname__ = api
    fn.__doc__ = f"Not implemented by the simulator yet: calling it raises NotImplementedError."
    return fn


NOT_IMPLEMENTED = (
    "nc_matmul_mx", "quantize_mx", "topk",
)
# NKI 0.6.0 API: an attribute only when the targeted version has it (sim.version.SINCE)
_SINCE_0_6 = ("topk",)
for _api in NOT_IMPLEMENTED:
    if _api not in _SINCE_0_6:
        globals()[_api] = _missing(_api)
del _api
# newer API: an attribute only when the targeted version has it (sim.version.SINCE)
_versioned = _version.versioned_getattr(__name__, {
    **{a: _missing(a) for a in _SINCE_0_6}, "NkiScalar": _NkiScalar, "scalar_load": _scalar_load,
    "scalar_store": _scalar_store, "scalar_alu": _scalar_alu})


def __getattr__(name):
    if name == "VirtualRegister":       # deprecated by NKI 0.8.0 (isa.registers)
        from .registers import deprecated_under_08
        deprecated_under_08("VirtualRegister")
        return _VirtualRegister
    return _versioned(name)

__all__ = [
    "NkiValidationError", "NkiInstruction", "engine", "reduce_cmd", "dge_mode", "oob_mode",
    "matmul_perf_mode", "nc_version", "dma_engine", "tensor_engine", "vector_engine",
    "scalar_engine", "gpsimd_engine", "unknown_engine", "FP32_MIN", "get_nc_version",
    "get_nc_sub_version",
    "dma_copy", "dma_transpose", "tensor_copy", "memset", "nc_matmul", "nc_transpose",
    "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor", "activation", "activation_reduce",
    "tensor_reduce", "tensor_scalar_reduce", "tensor_tensor_scan", "tensor_scalar_cumulative",
    "iota", "affine_select", "range_select", "select_reduce", "nc_stream_shuffle", "reciprocal",
    "tensor_partition_reduce", "bn_stats", "bn_aggr", "exponential", "activate2",
    "tensor_copy_predicated", "max8", "nc_n_gather", "nc_find_index8", "nc_match_replace8",
    "dma_compute", "VirtualRegister", "register_alloc", "register_move", "register_load",
    "register_store", "local_gather", "sequence_bounds", "nonzero_with_count", "rng", "rand2", "dropout", "set_rng_seed", "rand_set_state", "rand_get_state",
    "core_barrier", "sendrecv",
    *(a for a in NOT_IMPLEMENTED if a not in _SINCE_0_6),
]
