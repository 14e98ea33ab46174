"""``nki.language`` of NKI 0.5.0 for the simulator (nki_spec.md §3, §6).

Allocation (``ndarray``, ``zeros``, ...), buffers, dtypes, ``tile_size``,
``ds``, loop helpers, SPMD ids, the ALU-op / activation identifiers and the
convenience ops. The identifiers are :class:`NlOp` objects: callable as the
``nl.*`` convenience op (``nl.exp(x)`` returns a new SBUF tile) and usable as
``op=`` of ``nki.isa`` instructions, which resolve them by ``.name``. The
convenience ops lower to ``nki.isa`` calls (imported lazily: sim.isa imports
this layer's tensor model), so they are checked and traced like any
instruction.
"""
from __future__ import annotations

import contextlib
import os
import warnings

import numpy as np

from . import dtypes as _dt
from . import control as _control
from . import tensor as _tensor
from . import trace as _trace
from . import version as _version
from .dtypes import (bfloat16, bool_, float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu,
                     float16, float32, int8, int16, int32, tfloat32, uint8, uint16, uint32)
from .errors import NkiValidationError
from .targets import current_target, psum_usable_banks
from .tensor import DynSlice, MemoryRegion, NkiTensor

# ----------------------------------------------------------------- buffers

sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
hbm = MemoryRegion.private_hbm  # documented alias
shared_hbm = MemoryRegion.shared_hbm


def is_hbm(buffer) -> bool:
    return _tensor.as_region(buffer, "is_hbm buffer").kind == "hbm"


def is_on_chip(buffer) -> bool:
    return _tensor.as_region(buffer, "is_on_chip buffer").kind != "hbm"


def is_psum(buffer) -> bool:
    return _tensor.as_region(buffer, "is_psum buffer") is MemoryRegion.psum


def is_sbuf(buffer) -> bool:
    return _tensor.as_region(buffer, "is_sbuf buffer") is MemoryRegion.sbuf


class NKIObject:
    """Base class for kernel configuration objects (passed as compile-time values)."""

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)


# ----------------------------------------------------------------- tile_size

class _TileSize:
    """``nl.tile_size``: hardware tile constants of the current target.

    Values the SDK does not document are our stated assumptions:
    ``sbuf_fmax_bytes`` = physical less the reserve in targets.py,
    ``sbuf_min_align`` = memory.SBUF_ALIGN, ``psum_min_align`` = 4 bytes (one
    fp32 accumulator), ``gemm_moving_fmax`` = 512 on every target (nc_matmul
    itself accepts more on trn3).
    """

    pmax = 128
    psum_fmax = 512            # deprecated alias of psum_bank_fmax
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4

    @property
    def sbuf_min_align(self) -> int:
        from .memory import SBUF_ALIGN
        return SBUF_ALIGN

    @property
    def psum_num_banks(self) -> int:
        return psum_usable_banks()

    @property
    def sbuf_size_bytes(self) -> int:
        return current_target().sbuf_bytes_per_partition * 128

    @property
    def sbuf_fmax_bytes(self) -> int:
        return current_target().sbuf_usable_bytes

    @property
    def sbuf_fmax(self) -> int:
        return current_target().sbuf_usable_bytes // 4

    @property
    def total_available_sbuf_size(self) -> int:
        return current_target().sbuf_usable_bytes


tile_size = _TileSize()

# ----------------------------------------------------------------- allocation


_jit_module = None


def _shared_alloc(shape, dtype, buffer, name, fill):
    """Allocate, sharing nl.shared_hbm tensors across the programs of an LNC grid."""
    global _jit_module
    if _jit_module is None:
        from . import jit as _jit_module_  # jit imports language lazily too
        _jit_module = _jit_module_
    return _jit_module.allocate_in_launch(shape, dtype, buffer, name, fill)


def ndarray(shape, dtype, buffer=sbuf, name: str = "", address=None) -> NkiTensor:
    """A new uninitialised tensor (simulator: NaN for floats, 4 for integers).

    ``address`` (explicit placement) is accepted and ignored: placement does
    not change results, and capacity is counted either way.
    """
    if address is not None and (not isinstance(address, tuple) or len(address) != 2):
        raise TypeError(f"nl.ndarray: address must be a (partition_offset, free_offset) tuple, "
                        f"got {address!r}")
    return _shared_alloc(shape, dtype, buffer, name, None)


def _typed_value(value, dtype, what: str):
    d = _dt.as_dtype(dtype, f"{what} dtype")
    return (float(value) if d.is_float else int(value)), d


def _filled(shape, value, dtype, buffer, name, what):
    v, d = _typed_value(value, dtype, what)
    region = _tensor.as_region(buffer, f"{what} buffer")
    t = _shared_alloc(shape, d, region, name, None)
    if region.kind == "hbm":
        t.write(np.asarray(v))
    else:
        # zeros/ones/full emit a runtime memset on device
        from . import isa as _isa
        _isa.memset(dst=t, value=v)
    return t


def zeros(shape, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    return _filled(shape, 0, dtype, buffer, name, "nl.zeros")


def ones(shape, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    return _filled(shape, 1, dtype, buffer, name, "nl.ones")


def full(shape, fill_value, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    if not isinstance(fill_value, (int, float, np.integer, np.floating)) or isinstance(fill_value, bool):
        raise TypeError(f"nl.full: fill_value must be an int or float, got {fill_value!r}")
    return _filled(shape, fill_value, dtype, buffer, name, "nl.full")


def _like(x, what):
    if not isinstance(x, NkiTensor):
        raise TypeError(f"{what}: x must be an NkiTensor, got {type(x).__name__}")


def zeros_like(x, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    _like(x, "nl.zeros_like")
    return zeros(x.shape, dtype or x.dtype, sbuf if buffer is None else buffer, name)


def empty_like(x, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    _like(x, "nl.empty_like")
    return ndarray(x.shape, dtype or x.dtype, x.storage.kind if buffer is None else buffer, name)


def rand(shape, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    """Uniform [0, 1) values from the launch's generator (see random_seed)."""
    from . import jit as _jit
    t = ndarray(shape, dtype, buffer, name)
    t.write(_jit.launch_rng().random(t.shape, dtype=np.float32))
    return t


def random_seed(seed) -> None:
    """Reseed the launch's generator from a 1x1 tensor (or an int)."""
    from . import jit as _jit
    value = int(seed.read().reshape(-1)[0]) if isinstance(seed, NkiTensor) else int(seed)
    _jit.seed_launch_rng(value)


def shared_constant(constant, dtype=None) -> NkiTensor:
    """A shared_hbm tensor holding ``constant`` (a NumPy array or a .npy path)."""
    arr = np.load(constant) if isinstance(constant, (str, os.PathLike)) else np.asarray(constant)
    if dtype is not None:
        arr = _dt.cast(arr, dtype)
    t = ndarray(arr.shape, dtype or _dt.from_numpy(arr.dtype), shared_hbm, "shared_constant")
    t.write(arr)
    return t


def shared_identity_matrix(n, dtype=uint8, dst=None) -> NkiTensor:
    """An ``n x n`` identity in SBUF (default dtype uint8, as the SDK: "Create an identity
    matrix in SBUF"; nki-library passes it straight to nc_matmul as ``moving``)."""
    t = dst if dst is not None else ndarray((n, n), dtype, sbuf, "identity")
    t.write(np.eye(n))
    return t


# ----------------------------------------------------------------- indexing / loops

def ds(start, size) -> DynSlice:
    """``start:start+size`` as an index."""
    return DynSlice(start, size)


def _range_alias(name: str):
    def alias(start, stop=None, step=1):
        if _version.at_least("0.7.0"):
            _version.warn_in_kernel(
                f"nl.{name} is deprecated in NKI 0.7.0 and means Python range: loops are "
                "unrolled while the kernel is traced; write range(...) (nki/deep-dives/"
                "nki-loops.rst, NKI 0.7.0)")
        return range(start, stop, step) if stop is not None else range(start)
    alias.__name__ = alias.__qualname__ = name
    alias.__doc__ = (f"``nl.{name}``: Python's range (the loop is unrolled); deprecated from "
                     "NKI 0.7.0 on, where it warns.")
    return alias


affine_range = _range_alias("affine_range")
sequential_range = _range_alias("sequential_range")
static_range = _range_alias("static_range")


def dynamic_range(start, stop=None, step=1):
    """A runtime loop: the body is compiled once; ``i`` is a frozen VirtualRegister.

    Deprecated by NKI 0.6.0 in favour of ``fori_loop`` / ``while_loop``: under 0.6.0 it
    warns (``DeprecationWarning``); NKI 0.7.0 removed it (nki/migration, "Migrating from
    NKI 0.6.0 to NKI 0.7.0": the release "removes the dynamic loop constructs deprecated in
    NKI 0.6.0"; only the old front end, ``NKI_COMPILER_FRONTEND=custom``, kept them). See
    ``nki_ssm.sim.control`` for what the simulator records and checks."""
    if _version.at_least("0.7.0"):
        raise NkiValidationError(
            f"nl.dynamic_range was removed in NKI 0.7.0 (nki/migration, \"Migrating from NKI "
            f"0.6.0 to NKI 0.7.0\"); use nl.fori_loop(lower, upper, body) "
            f"({_version.ENV_VAR}={_version.nki_version()})")
    if _version.at_least("0.6.0"):
        warnings.warn(
            "nl.dynamic_range for-loops are deprecated in NKI 0.6.0 and will be removed in a "
            "future release; use nl.fori_loop(lower, upper, body) (release-notes/components/"
            "nki.rst, 0.6.0, Deprecated and Removed APIs)", DeprecationWarning, stacklevel=2)
    return _control.dynamic_range(start, stop, step)


def _fori_loop(lower, upper, body_fun, step=1):
    """A runtime counted loop (NKI 0.6.0): ``body_fun(i)``, ``i`` passed by value (an
    NkiScalar from NKI 0.7.0 on unless a bound is a VirtualRegister); an int bound still makes
    a runtime loop. Absent under NKI 0.5.0."""
    _control.fori_loop(lower, upper, body_fun, step)


def _while_loop(init, body_fun):
    """A runtime loop (NKI 0.6.0) while register ``r`` is non-zero: ``r = body_fun(r)``;
    returns None. Absent under NKI 0.5.0."""
    _control.while_loop(init, body_fun)


_fori_loop.__name__ = _fori_loop.__qualname__ = "fori_loop"
_while_loop.__name__ = _while_loop.__qualname__ = "while_loop"


def _if_else(cond, then_fn, else_fn=None):
    """``nl.if_else`` (NKI 0.8.0): run ``then_fn()`` when ``cond`` is non-zero, else
    ``else_fn()``; a Python bool / int is folded now, a 32-bit NkiScalar is a compiled
    conditional (``sim.control.if_else``). Returns None."""
    _control.if_else(cond, then_fn, else_fn)


_if_else.__name__ = _if_else.__qualname__ = "if_else"


@contextlib.contextmanager
def no_reorder():
    """Program order is already the execution order in the simulator; runtime loops are
    rejected inside the block (nl.no_reorder API docs)."""
    _control.enter_no_reorder()
    try:
        yield
    finally:
        _control.exit_no_reorder()


def program_id(axis=0) -> int:
    """The running program's id in the LNC grid: 0, or 0 / 1 under ``kernel[2]`` (whose
    two programs run at once over shared HBM: ``sim.lnc``); a Python int at trace time."""
    from . import jit as _jit
    if axis != 0:
        raise NkiValidationError(f"nl.program_id: axis must be 0 (1-D LNC grid), got {axis}")
    return _jit.current_program_id()


def num_programs(axes=0) -> int:
    from . import jit as _jit
    if axes not in (0, None):
        raise NkiValidationError(f"nl.num_programs: axes must be 0 (1-D LNC grid), got {axes}")
    return _jit.current_num_programs()


def program_ndim() -> int:
    from . import jit as _jit
    return _jit.current_program_ndim()


def device_print(print_prefix, tensor) -> None:
    """Print ``tensor``'s values now (on device this happens at run time)."""
    if not isinstance(tensor, NkiTensor):
        raise TypeError(f"nl.device_print: tensor must be an NkiTensor, got {type(tensor).__name__}")
    print(print_prefix, tensor.read())


# ----------------------------------------------------------------- operators

_ARITH_BINARY = ("add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal",
                 "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or",
                 "logical_xor", "power", "abs_max", "abs_min", "divide")
_BITVEC_BINARY = ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift")
_UNARY = ("exp", "log", "sqrt", "rsqrt", "reciprocal", "silu", "silu_dx", "sigmoid", "softplus",
          "tanh", "gelu", "gelu_dx", "gelu_apprx_tanh", "gelu_apprx_sigmoid",
          "gelu_apprx_sigmoid_dx", "relu", "copy", "identity", "square", "abs", "sin", "cos",
          "tan", "arctan", "erf", "erf_dx", "mish", "sign", "negative", "ceil", "floor", "trunc",
          "invert", "logical_not")


class NlOp:
    """An ``nl`` operator: identifier for nisa ``op=`` arguments and a convenience op.

    ``name`` is what sim.isa resolves; ``arity`` 1 or 2; ``apply`` computes
    the float32 (or raw-bit) result with sim.isa's tables.
    """

    __slots__ = ("name", "arity", "__name__")

    def __init__(self, name: str, arity: int):
        self.name = name
        self.arity = arity
        self.__name__ = name

    def __repr__(self):
        return f"nl.{self.name}"

    def __eq__(self, other):
        if isinstance(other, NlOp):
            return self.name == other.name
        if isinstance(other, str):
            return self.name == other
        return NotImplemented

    def __hash__(self):
        return hash(self.name)

    def apply(self, *args):
        """NumPy result (float32 math) of this operator on arrays ``args``."""
        from .isa import _alu
        if self.arity == 2:
            table = _alu.BITVEC_BINARY if self.name in _BITVEC_BINARY else _alu.ARITH_BINARY
        else:
            table = dict(_alu.ACTIVATIONS, **_alu.ARITH_UNARY, **_alu.BITVEC_UNARY)
        fn = table.get("copy" if self.name == "identity" else self.name)
        if fn is None:
            raise NotImplementedError(f"nl.{self.name}: no NumPy implementation in the simulator")
        return fn(*args)

    def __call__(self, *args, **kwargs):
        if self.arity == 2:
            return _binary(self, *args, **kwargs)
        return _unary(self, *args, **kwargs)


def _tile_arg(x, what: str, arg: str) -> NkiTensor:
    if not isinstance(x, NkiTensor):
        raise TypeError(f"{what}: {arg} must be an NkiTensor tile, got {type(x).__name__}")
    if not x.on_chip:
        raise NkiValidationError(f"{what}: {arg} must be on SBUF or PSUM (load it first), got {x.buffer}")
    return x


def _is_scalar(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


# unary nl ops without a ScalarE function: lowered to VectorE, or not simulated
_VECTOR_UNARY = {"negative", "ceil", "floor", "trunc", "invert", "logical_not", "cos", "tan"}
_NOT_SIMULATED = {"ceil", "floor", "trunc", "cos", "tan"}


def _binary(op: NlOp, x, y, dtype=None):
    from . import isa as nisa
    what = f"nl.{op.name}"
    if op.name == "divide":
        raise NkiValidationError("nl.divide: there is no divide ALU op on NeuronCores; use "
                                 "nl.multiply(x, nl.reciprocal(y))")
    if _is_scalar(x) and isinstance(y, NkiTensor):
        if op.name in ("add", "multiply", "maximum", "minimum", "equal", "not_equal"):
            x, y = y, x
        else:
            _tile_arg(y, what, "y")
            out = ndarray(y.shape, dtype or y.dtype, sbuf)
            nisa.tensor_scalar(dst=out, data=y, op0=op, operand0=float(x), reverse0=True)
            return out
    x = _tile_arg(x, what, "x")
    out = ndarray(x.shape, dtype or x.dtype, sbuf)
    if _is_scalar(y):
        nisa.tensor_scalar(dst=out, data=x, op0=op, operand0=float(y))
        return out
    y = _tile_arg(y, what, "y")
    if tuple(y.shape) != tuple(x.shape):
        # 0.3.0-0.5.0 known issue: nl binary ops do not broadcast
        raise NkiValidationError(f"{what}: x {x.shape} and y {y.shape} must have the same shape "
                                 "(nl binary ops do not broadcast)")
    nisa.tensor_tensor(dst=out, data1=x, data2=y, op=op)
    return out


def _unary(op: NlOp, x, dtype=None):
    from . import isa as nisa
    what = f"nl.{op.name}"
    x = _tile_arg(x, what, "x")
    out = ndarray(x.shape, dtype or x.dtype, sbuf)
    if op.name in ("copy", "identity"):
        nisa.tensor_copy(dst=out, src=x)
    elif op.name == "negative":
        nisa.tensor_scalar(dst=out, data=x, op0=multiply, operand0=-1.0)
    elif op.name == "logical_not":
        nisa.tensor_scalar(dst=out, data=x, op0=equal, operand0=0.0)
    elif op.name == "invert":
        nisa.tensor_scalar(dst=out, data=x, op0=invert, operand0=0)
    elif op.name in _NOT_SIMULATED:
        raise NotImplementedError(f"{what}: not implemented in the nki_ssm simulator")
    else:
        nisa.activation(dst=out, op=op, data=x)
    return out


for _n in _ARITH_BINARY + _BITVEC_BINARY:
    globals()[_n] = NlOp(_n, 2)
for _n in _UNARY:
    globals()[_n] = NlOp(_n, 1)
# reduction / misc operator identifiers used by nisa
max = NlOp("maximum", 2)  # noqa: A001  (nl.max is also the reduction below)
min = NlOp("minimum", 2)  # noqa: A001
bypass = NlOp("bypass", 1)
prelu = NlOp("prelu", 1)
average = NlOp("average", 2)
del _n


# ----------------------------------------------------------------- data movement

def load(src, dtype=None) -> NkiTensor:
    """A new SBUF tile holding ``src`` (HBM; first dim -> partitions), through dma_copy."""
    from . import isa as nisa
    if not isinstance(src, NkiTensor):
        raise TypeError(f"nl.load: src must be an NkiTensor, got {type(src).__name__}")
    if src.ndim < 2:
        src = src.reshape((1, src.shape[0]))
    out = ndarray(src.shape, dtype or src.dtype, sbuf)
    nisa.dma_copy(dst=out, src=src)
    return out


def store(dst, value) -> None:
    """Write ``value`` (SBUF) into ``dst`` (HBM) through dma_copy."""
    from . import isa as nisa
    if not isinstance(dst, NkiTensor) or not isinstance(value, NkiTensor):
        raise TypeError("nl.store: dst and value must be NkiTensors")
    if value.storage.buffer == "psum":
        raise NkiValidationError("nl.store: value in PSUM is not supported; copy it to SBUF first")
    nisa.dma_copy(dst=dst, src=value)


def transpose(x, dtype=None) -> NkiTensor:
    """``x`` [P, F] transposed into a new PSUM tile [F, P] (TensorE)."""
    from . import isa as nisa
    x = _tile_arg(x, "nl.transpose", "x")
    if x.ndim != 2:
        raise NkiValidationError(f"nl.transpose: x must be 2-D, got {x.shape}")
    out = ndarray((x.shape[1], x.shape[0]), dtype or x.dtype, psum)
    nisa.nc_transpose(dst=out, data=x)
    return out


def matmul(x, y, transpose_x=False) -> NkiTensor:
    """``x.T @ y`` (``transpose_x=True``: x is already [K, M]) into a new fp32 PSUM tile."""
    from . import isa as nisa
    x = _tile_arg(x, "nl.matmul", "x")
    y = _tile_arg(y, "nl.matmul", "y")
    if not transpose_x:
        xt_psum = transpose(x)
        xt = ndarray(xt_psum.shape, x.dtype, sbuf)
        nisa.tensor_copy(dst=xt, src=xt_psum)
        del xt_psum
        x = xt
    out = ndarray((x.shape[1], y.shape[1]), float32, psum)
    nisa.nc_matmul(dst=out, stationary=x, moving=y)
    return out


def broadcast_to(x, shape, dtype=None) -> NkiTensor:
    """``x`` broadcast to ``shape`` (same rank) in a new SBUF tile.

    Free-dim broadcast copies a stride-0 view (tensor_copy); partition
    broadcast of a single row uses a ones-matmul on TensorE, as the
    architecture guide suggests.
    """
    from . import isa as nisa
    x = _tile_arg(x, "nl.broadcast_to", "x")
    shape = tuple(int(s) for s in shape)
    if len(shape) != x.ndim:
        raise NkiValidationError(f"nl.broadcast_to: shape {shape} must have the rank of x {x.shape}")
    for a, b in zip(x.shape, shape):
        if a != b and a != 1:
            raise NkiValidationError(f"nl.broadcast_to: cannot broadcast {x.shape} to {shape}")
    if shape == tuple(x.shape) and (dtype is None or dtype == x.dtype):
        return x
    src = x
    for d in range(1, x.ndim):
        if x.shape[d] == 1 and shape[d] != 1:
            src = src.broadcast(d, shape[d])
    out = ndarray(shape, dtype or x.dtype, sbuf)
    if shape[0] == x.shape[0]:
        nisa.tensor_copy(dst=out, src=src)
        return out
    with _trace.lowering("nl.broadcast_to"):
        return _broadcast_partitions(src, out, shape)


def _broadcast_partitions(src, out, shape) -> NkiTensor:
    """Partition broadcast: ones[1, P] (stationary) x row[1, F] (moving) -> [P, F]."""
    from . import isa as nisa
    row = ndarray((1,) + shape[1:], float32, sbuf)
    nisa.tensor_copy(dst=row, src=src)
    flat = row.reshape((1, int(np.prod(shape[1:]))))
    ones_row = ndarray((1, shape[0]), float32, sbuf)
    nisa.memset(dst=ones_row, value=1.0)
    out_flat = out.reshape((shape[0], flat.shape[1]))
    for c in range(0, flat.shape[1], 512):
        w = builtins_min(512, flat.shape[1] - c)
        acc = ndarray((shape[0], w), float32, psum)
        nisa.nc_matmul(dst=acc, stationary=ones_row, moving=flat[:, c:c + w])
        nisa.tensor_copy(dst=out_flat[:, c:c + w], src=acc)
    return out


def expand_dims(x, axis) -> NkiTensor:
    """A view of ``x`` with a size-1 dim inserted at ``axis``."""
    _like(x, "nl.expand_dims")
    return x.expand_dim(axis)


# ----------------------------------------------------------------- reductions

def _reduce(op_name, x, axis, dtype, keepdims, what):
    from . import isa as nisa
    x = _tile_arg(x, what, "x")
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a + x.ndim if a < 0 else a for a in axes)
    if 0 in axes:
        raise NkiValidationError(f"{what}: axis must be free dims (not 0), got {axis}")
    if keepdims:
        shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    else:
        shape = tuple(n for d, n in enumerate(x.shape) if d not in axes)
        if len(shape) < 2:
            shape = shape + (1,)
    out = ndarray(shape, dtype or x.dtype, sbuf)
    nisa.tensor_reduce(dst=out, op=globals()[op_name], data=x, axis=axes, keepdims=keepdims)
    return out


def sum(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce("add", x, axis, dtype, keepdims, "nl.sum")


def prod(x, axis, dtype=None, keepdims=False):
    return _reduce("multiply", x, axis, dtype, keepdims, "nl.prod")


def all(x, axis, dtype=None):  # noqa: A001
    return _reduce("logical_and", x, axis, dtype, False, "nl.all")


def mean(x, axis, dtype=None, keepdims=False):
    """Sum over ``axis`` times 1/count (VectorE reduce, then a scalar multiply)."""
    from . import isa as nisa
    total = _reduce("add", x, axis, float32, keepdims, "nl.mean")
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    count = 1
    for a in axes:
        count *= x.shape[a]
    out = ndarray(total.shape, dtype or x.dtype, sbuf)
    nisa.tensor_scalar(dst=out, data=total, op0=multiply, operand0=1.0 / count)
    return out


def softmax(x, axis=-1, dtype=None):
    """Row softmax over the last free dim of a 2-D tile: exp(x - max) / sum."""
    from . import isa as nisa
    x = _tile_arg(x, "nl.softmax", "x")
    if x.ndim != 2 or axis not in (-1, 1):
        raise NkiValidationError(f"nl.softmax: supports 2-D tiles over axis -1, got shape "
                                 f"{x.shape}, axis {axis}")
    P = x.shape[0]
    m = ndarray((P, 1), float32, sbuf)
    nisa.tensor_reduce(dst=m, op=maximum, data=x, axis=1, negate=True)
    e = ndarray(x.shape, float32, sbuf)
    s = ndarray((P, 1), float32, sbuf)
    nisa.activation_reduce(dst=e, op=exp, data=x, bias=m, reduce_op=add, reduce_res=s)
    r = ndarray((P, 1), float32, sbuf)
    nisa.reciprocal(dst=r, data=s)
    out = ndarray(x.shape, dtype or x.dtype, sbuf)
    nisa.tensor_scalar(dst=out, data=e, op0=multiply, operand0=r)
    return out


def load_transpose2d(src, dtype=None) -> NkiTensor:
    """A new SBUF tile holding the 2-D HBM ``src`` transposed (DMA transpose)."""
    from . import isa as nisa
    if not isinstance(src, NkiTensor) or src.ndim != 2:
        raise TypeError("nl.load_transpose2d: src must be a 2-D NkiTensor")
    out = ndarray((src.shape[1], src.shape[0]), src.dtype, sbuf)
    nisa.dma_transpose(dst=out, src=src)
    if dtype is not None and dtype != src.dtype:
        cast = ndarray(out.shape, dtype, sbuf)
        nisa.tensor_copy(dst=cast, src=out)
        return cast
    return out


def _reduce_max(x, axis, dtype=None, keepdims=False):
    return _reduce("maximum", x, axis, dtype, keepdims, "nl.max")


def _reduce_min(x, axis, dtype=None, keepdims=False):
    return _reduce("minimum", x, axis, dtype, keepdims, "nl.min")


class _ReduceOrOp(NlOp):
    """``nl.max`` / ``nl.min``: the reduction when called, the ALU op as ``op=``."""

    __slots__ = ("_fn",)

    def __init__(self, name, fn):
        super().__init__(name, 2)
        self._fn = fn

    def __call__(self, x, axis, dtype=None, keepdims=False):
        return self._fn(x, axis, dtype, keepdims)


max = _ReduceOrOp("maximum", _reduce_max)  # noqa: A001
min = _ReduceOrOp("minimum", _reduce_min)  # noqa: A001

import builtins as _builtins  # noqa: E402

builtins_min = _builtins.min


# newer API: an attribute only when the targeted version has it (sim.version.SINCE)
__getattr__ = _version.versioned_getattr(__name__, {
    "fori_loop": _fori_loop, "while_loop": _while_loop, "if_else": _if_else,
    "int64": _dt.int64, "fmod": NlOp("fmod", 2)})

__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations", "contextlib", "os", "np", "warnings")]
