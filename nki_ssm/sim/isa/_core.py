"""Shared machinery of the ISA: operand checks, fp32 reads, writes, tracing.

Every instruction validates its operands with these helpers, which raise
:class:`NkiValidationError` naming the instruction, the operand and the
limit. Reads return 2-D ``[partitions, elements_per_partition]`` arrays, the
layout every engine streams.
"""
from __future__ import annotations

import numpy as np

from .. import control as _control
from .. import memory as _memory
from .. import races as _races
from .. import trace as _trace
from ..errors import NkiValidationError  # noqa: F401  (re-exported for submodules)
from ..targets import current_target
from ._enums import NkiInstruction, engine

PMAX = 128
_F32 = np.dtype(np.float32)
ENGINE_NAMES = {engine.tensor: "tensor", engine.vector: "vector", engine.scalar: "scalar",
                engine.gpsimd: "gpsimd", engine.dma: "dma", engine.sync: "dma"}

_TensorCls = None


def tensor_cls():
    """sim.tensor.NkiTensor, imported on first use (sim.tensor may import sim.isa)."""
    global _TensorCls
    if _TensorCls is None:
        from ..tensor import NkiTensor
        _TensorCls = NkiTensor
    return _TensorCls


def fail(inst: str, msg: str):
    raise NkiValidationError(f"{inst}: {msg}")


def target():
    return current_target()


def buffer_of(t) -> str:
    """'hbm', 'sbuf' or 'psum' (shared/private HBM are 'hbm')."""
    return t.storage.buffer


def is_tensor(x) -> bool:
    return isinstance(x, tensor_cls())


def start_partition_ok(start: int, n: int) -> bool:
    """The NC-v2 start-partition placement rule (trainium_inferentia2_arch.rst)."""
    if n > 64:
        return start == 0
    if n > 32:
        return start in (0, 64)
    return start in (0, 32, 64, 96)


# "Within each SBUF/PSUM partition, the tensor read/write logic ... supports accessing
# elements from up to four-dimensional arrays, though most instructions only support
# 1D/2D/3D in the free dimension" (nki/deep-dives/nki-aps.rst). Which instructions take
# the 4th is not documented; we enforce the hard limit of 4.
MAX_FREE_DIMS = 4


def free_dims(t) -> int:
    """Free-dim pattern entries of an on-chip view: size-1 dims dropped, a dim merged
    into the next inner one when it steps exactly over it."""
    dims = [(n, st) for n, st in zip(t.shape[1:], t.strides[1:]) if n != 1]
    count = 0
    inner = None
    for n, st in reversed(dims):
        if inner is not None and st == inner[0] * inner[1]:
            inner = (n * inner[0], inner[1])     # merges with the inner dim
            continue
        count += 1
        inner = (n, st)
    return count


def tile(inst: str, arg: str, t, buffers=("sbuf", "psum"), *, quadrant: bool = True):
    """Check an on-chip operand ``t`` of instruction ``inst`` and return it.

    Checks: it is an NkiTensor, lives in one of ``buffers``, spans at most 128
    partitions, occupies a contiguous partition range and (``quadrant``)
    starts where the placement rule allows.
    """
    if not isinstance(t, _TensorCls or tensor_cls()):
        raise TypeError(f"{inst}: {arg} must be an NkiTensor, got {type(t).__name__}")
    buf = t.storage.buffer
    if buf not in buffers:
        where = " or ".join(b.upper() for b in buffers)
        fail(inst, f"{arg} must be in {where}, got a tensor in {buf.upper()}")
    if buf == "hbm":
        return t
    shape = t.shape
    if len(shape) < 2:
        fail(inst, f"{arg} must be at least 2-D [partitions, free...], got shape {tuple(shape)}")
    n = shape[0]
    if n > PMAX:
        fail(inst, f"{arg} partition dimension {n} exceeds the maximum of {PMAX}")
    if n > 1:
        row = t.storage.row_elements(t.dtype.itemsize)
        if t.strides[0] != row:
            fail(inst, f"{arg} must occupy a contiguous range of partitions "
                       f"(partition stride {t.strides[0]}, expected {row} elements)")
    nd = free_dims(t)
    if nd > MAX_FREE_DIMS:
        fail(inst, f"{arg} needs {nd} free-dim access-pattern entries (after dropping size-1 "
                   f"dims and merging contiguous ones); the SBUF/PSUM access logic has at most "
                   f"{MAX_FREE_DIMS} (APS guide, 'Hardware Capability')")
    if quadrant:
        # The placement rule is documented for NC-v2 (and for nc_stream_shuffle,
        # .indirect() on v4). We assume it holds for every compute instruction on
        # v3/v4 too: UNVERIFIED there (nki_spec.md §3.4), strict on purpose.
        start = t.partition_start
        if not start_partition_ok(start, n):
            fail(inst, f"{arg} starts at partition {start} with {n} partitions; allowed starts are "
                       f"{_allowed_starts(n)} (start-partition rule)")
    return t


def _allowed_starts(n: int) -> str:
    if n > 64:
        return "0"
    if n > 32:
        return "0/64"
    return "0/32/64/96"


def free_size(t) -> int:
    """Elements per partition of an on-chip tensor."""
    return t.elements_per_partition


def same_shape(inst: str, a_name: str, a, b_name: str, b):
    """Same partition count and same elements per partition (the ISA's "same shape")."""
    if a.shape[0] != b.shape[0]:
        fail(inst, f"{b_name} has {b.shape[0]} partitions but {a_name} has {a.shape[0]} "
                   f"(partition counts must match)")
    fa, fb = a.elements_per_partition, b.elements_per_partition
    if fa != fb:
        fail(inst, f"{b_name} has {fb} elements per partition but {a_name} has {fa} (must match)")


def not_both_psum(inst: str, a_name: str, a, b_name: str, b):
    if a.storage.buffer == "psum" and b.storage.buffer == "psum":
        fail(inst, f"{a_name} and {b_name} cannot both be in PSUM")


def column(inst: str, arg: str, t, P: int, *, fp32: bool = False):
    """Check a per-partition ``(P, 1)`` operand tile."""
    tile(inst, arg, t)
    if t.shape[0] != P or t.elements_per_partition != 1:
        fail(inst, f"{arg} must have shape ({P}, 1) (one element per partition), got {tuple(t.shape)}")
    if fp32 and t.dtype.np != _F32:
        fail(inst, f"{arg} must be float32, got {t.dtype}")
    return t


def scalar_or_column(inst: str, arg: str, v, P: int, *, fp32: bool = True, allow_none=False):
    """A compile-time scalar (float32) or a ``(P, 1)`` tile read as float32 ``(P, 1)``.

    Returns a float32 scalar or a float32 ``(P, 1)`` array.
    """
    if v is None:
        if allow_none:
            return None
        fail(inst, f"{arg} is required (a scalar or a ({P}, 1) tile), got None")
    if isinstance(v, tensor_cls()):
        column(inst, arg, v, P, fp32=fp32)
        return read_f32(v)
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{inst}: {arg} must be a float scalar or a ({P}, 1) tile, got bool {v!r}")
    if isinstance(v, (int, float, np.integer, np.floating)):
        return np.float32(v)
    raise TypeError(f"{inst}: {arg} must be a float scalar or a ({P}, 1) tile, got {type(v).__name__}")


# ---- data access -----------------------------------------------------------

def read_raw(t) -> np.ndarray:
    """A copy of the values of an on-chip tensor in its storage dtype, shaped [P, F]."""
    return t.read().reshape(t.shape[0], -1)


def read_f32(t) -> np.ndarray:
    """Values as the engines see them: float32, shaped [P, F].

    May be a live view of the tensor (no copy for float32): callers must not
    write into it.
    """
    a = t.read(copy=False)
    if a.dtype != _F32:
        a = a.astype(_F32)
    return a.reshape(t.shape[0], -1)


_scratch: dict[tuple, np.ndarray] = {}


def scratch(shape) -> np.ndarray:
    """A reusable float32 buffer of ``shape`` (avoids a fresh large allocation per instruction).

    Valid until the next call with the same shape; never hand it to user code.
    """
    buf = _scratch.get(shape)
    if buf is None:
        if len(_scratch) > 64:
            _scratch.clear()
        buf = np.empty(shape, dtype=_F32)
        _scratch[shape] = buf
    return buf


def write(t, values: np.ndarray):
    """Write [P, F] (or t.shape) values into t (cast to t.dtype by the tensor, RNE)."""
    t.write(values.reshape(t.shape))


def unrun() -> bool:
    """Inside a body whose loop runs zero times (``sim.control``): data-dependent checks
    (values the body would read) do not apply, its effects are suppressed."""
    return bool(_control.SUPPRESS_FLOOR)


def writable(t) -> bool:
    """False for memory older than a body whose loop runs zero times (``sim.control``):
    state an instruction keeps beside the data (e.g. the PSUM written-bitmap) stays too."""
    floor = _control.SUPPRESS_FLOOR
    return not floor or t.storage.id >= floor[0]


def is_16bit_float(t) -> bool:
    d = t.dtype
    return d.is_float and d.itemsize == 2


def inner_contiguous(t) -> bool:
    return len(t.shape) < 2 or t.shape[-1] <= 1 or t.strides[-1] == 1


# ---- tracing ---------------------------------------------------------------

_program_id_fn = None


def _program_id() -> int:
    """The SPMD program id of the running kernel instance (0 outside jit)."""
    global _program_id_fn
    if _program_id_fn is None:
        try:
            from ..jit import current_program_id as fn  # sim-core's launcher
        except ImportError:  # single-program use without the launcher
            def fn():
                return 0
        _program_id_fn = fn
    return int(_program_id_fn())


_ACTIVE = _trace._active   # the trace stack (trace.current() without the call)
_MEMORY = _memory._active  # the capacity trackers of running launches
_RACES = _races.ACTIVE     # the HBM access log of a running LNC=2 launch (sim.races)


def emit(op: str, eng: str, name, *, reads=(), writes=(), num_partitions: int, free: int,
         num_inputs: int, nbytes: int, attrs: dict | None = None, operands: dict | None = None,
         compute=None, reduce: bool = False):
    """Return the instruction handle; append an Instruction to the active trace, if any.

    ``reads``/``writes``: tensors (their ``region()`` is recorded);
    ``operands``: {arg name: tensor or None} for the dtypes/shapes maps;
    ``compute``: tensors whose VectorE/ScalarE/GpSimd attrs (all_16bit,
    psum_operand, contiguous, ``reduce``) are added to ``attrs`` — computed
    only when a trace is active.
    """
    if _control._state:
        _control.note_instruction(op, eng)
    if _MEMORY:
        # capacity by access liveness: this instruction touches its operands
        _MEMORY[-1].instruction(op, (*reads, *writes))
    if _RACES and not _control.SUPPRESS_FLOOR and op != "core_barrier":
        # LNC=2: which HBM bytes this program touched in this epoch (a body whose loop runs
        # zero times touches nothing; a barrier's ``data`` names what it orders, unread)
        _RACES[-1].note(_program_id(), op, reads, writes)
    if not _ACTIVE:
        return NkiInstruction(op, name)
    tr = _ACTIVE[-1]
    unrun = bool(_control.SUPPRESS_FLOOR)   # a body whose loop runs zero times (sim.control)
    if not tr.target:
        tr.target = current_target().name
    if compute is not None:
        a = compute_attrs(compute, reduce=reduce)
        if attrs:
            a.update(attrs)
        attrs = a
    dtypes, shapes = {}, {}
    if operands:
        for k, t in operands.items():
            if t is not None:
                dtypes[k] = t.dtype.name
                shapes[k] = t.shape
    inst = _trace.Instruction(
        0, op, eng, tuple([t.region() for t in reads if t is not None]),
        tuple([t.region() for t in writes if t is not None]),
        int(num_partitions), int(free), int(num_inputs), int(nbytes), dtypes, shapes,
        attrs if attrs is not None else {}, name, _program_id(), _control.loop_path())
    if unrun:
        tr.append_unrun(inst)      # program size only: never executed, never timed
        return NkiInstruction(op, name)
    tr.append(inst)
    return NkiInstruction(op, name, inst.index)


def compute_attrs(tensors, *, reduce: bool = False) -> dict:
    """attrs for VectorE/ScalarE/GpSimd instructions (trace.py docstring)."""
    all16 = True
    psum = False
    contig = True
    for t in tensors:
        if t is None:
            continue
        d = t.dtype
        if all16 and not (d.itemsize == 2 and d.is_float):
            all16 = False
        if t.storage.buffer == "psum":
            psum = True
        if contig:
            shp = t.shape
            if len(shp) >= 2 and shp[-1] > 1 and t.strides[-1] != 1:
                contig = False
    return {"all_16bit": all16, "psum_operand": psum, "contiguous": contig, "reduce": bool(reduce)}


def check_name(inst: str, name):
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{inst}: name must be a str or None, got {type(name).__name__}")
