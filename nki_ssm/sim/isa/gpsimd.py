"""GpSimd instructions: ``iota``, ``affine_select``, ``tensor_partition_reduce`` (SBUF only)."""
from __future__ import annotations

import numpy as np

from . import _alu as A
from . import _core as C

_F32 = np.float32


def _affine(inst, pattern, offset, channel_multiplier, P, F):
    """int64 [P, F] values ``offset + p*channel_multiplier + sum(idx_k * step_k)`` (int32 math)."""
    if not isinstance(pattern, (list, tuple)) or not 1 <= len(pattern) <= 4:
        C.fail(inst, f"pattern must be a list of 1 to 4 [step, num] pairs, got {pattern!r}")
    vals = np.zeros((), dtype=np.int64)
    total = 1
    for pair in pattern:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in pair):
            C.fail(inst, f"pattern entries must be [step, num] int pairs, got {pair!r}")
        step, num = int(pair[0]), int(pair[1])
        if num < 1:
            C.fail(inst, f"pattern num must be >= 1, got {num}")
        vals = vals[..., None] + np.arange(num, dtype=np.int64) * step
        total *= num
    if total != F:
        C.fail(inst, f"pattern covers {total} elements but dst has {F} elements per partition (must match)")
    from .registers import VirtualRegister
    if isinstance(offset, VirtualRegister):   # run-time offsets from a register (NKI 0.4.0+)
        offset = int(offset)
    for arg, v in (("offset", offset), ("channel_multiplier", channel_multiplier)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"{inst}: {arg} must be an int32 constant (or a register for offset), got {v!r}")
    out = int(offset) + np.arange(P, dtype=np.int64)[:, None] * int(channel_multiplier) + vals.reshape(1, F)
    # int32 arithmetic wraps
    return ((out + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int64)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[p, i] = offset + p*channel_multiplier + sum(i_k * step_k)`` in int32, cast to dst.dtype (SBUF)."""
    inst = "iota"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst, ("sbuf",))
    P, F = dst.shape[0], dst.elements_per_partition
    vals = _affine(inst, pattern, offset, channel_multiplier, P, F)
    from ..dtypes import cast
    v = vals.astype(np.int32)
    dst.write(cast(v if dst.dtype.is_int else v.astype(np.float32), dst.dtype).reshape(dst.shape))
    return C.emit(inst, "gpsimd", name, writes=[dst], num_partitions=P, free=F, num_inputs=0,
                  nbytes=P * F * dst.dtype.itemsize, compute=(dst,),
                  operands={"dst": dst})


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None,
                  offset=0, name=None):
    """``dst = on_true_tile where cmp_op(affine value, 0) else on_false_value`` (SBUF, GpSimd).

    The affine value is iota's: ``offset + p*channel_multiplier + sum(i_k*step_k)``;
    ``cmp_op`` defaults to nl.equal; ``on_false_value`` is a float32 scalar.
    """
    inst = "affine_select"
    C.check_name(inst, name)
    cmp_name = "equal" if cmp_op is None else A.require_op(inst, "cmp_op", cmp_op, A.COMPARISONS, "a comparison")
    C.tile(inst, "dst", dst, ("sbuf",))
    C.tile(inst, "on_true_tile", on_true_tile, ("sbuf",))
    C.same_shape(inst, "on_true_tile", on_true_tile, "dst", dst)
    if isinstance(on_false_value, (bool, np.bool_)) or not isinstance(on_false_value, (float, np.floating)):
        C.fail(inst, f"on_false_value must be a float32 scalar, got {on_false_value!r}")
    P, F = dst.shape[0], dst.elements_per_partition
    vals = _affine(inst, pattern, offset, channel_multiplier, P, F)
    pred = A.ARITH_BINARY[cmp_name](vals, np.int64(0)).astype(bool)
    if on_true_tile.dtype.np == dst.dtype.np:
        x = C.read_raw(on_true_tile)
        from ..dtypes import cast
        fv = cast(np.asarray([np.float32(on_false_value)]), dst.dtype)[0]
        res = np.where(pred, x, fv)
        dst.write(res.reshape(dst.shape))
    else:
        res = np.where(pred, C.read_f32(on_true_tile), np.float32(on_false_value))
        C.write(dst, res.astype(_F32))
    return C.emit(inst, "gpsimd", name, reads=[on_true_tile], writes=[dst], num_partitions=P,
                  free=F, num_inputs=1, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, on_true_tile),
                  operands={"dst": dst, "on_true_tile": on_true_tile})


_PR_OPS = ("add", "average", "maximum", "bitwise_or", "bitwise_and")


def tensor_partition_reduce(dst, op, data, name=None):
    """Reduce across partitions: ``dst[0, :] = op over p of data[p, :]`` (GpSimd, SBUF).

    ``op``: add, average, maximum, bitwise_or, bitwise_and. ``dst`` has one
    partition and data's elements per partition (our reading of the one-line
    API doc, which does not state the output shape).
    """
    inst = "tensor_partition_reduce"
    C.check_name(inst, name)
    opn = A.op_name(op)
    opn = {"mean": "average"}.get(opn, opn)
    if opn not in _PR_OPS:
        C.fail(inst, f"op must be one of {', '.join('nl.' + o for o in _PR_OPS)}, got {op!r}")
    C.tile(inst, "dst", dst, ("sbuf",))
    C.tile(inst, "data", data, ("sbuf",))
    P, F = data.shape[0], data.elements_per_partition
    if dst.shape[0] != 1 or dst.elements_per_partition != F:
        C.fail(inst, f"dst must be (1, {F}) (one partition, data's elements per partition), got {tuple(dst.shape)}")
    if opn.startswith("bitwise"):
        if not (data.dtype.is_int and dst.dtype.is_int):
            C.fail(inst, f"op=nl.{opn} needs integer dtypes, got data {data.dtype} and dst {dst.dtype}")
        r = A.BITVEC_REDUCE[opn].reduce(C.read_raw(data), axis=0)
        from ..dtypes import cast
        dst.write(cast(r, dst.dtype).reshape(dst.shape))
    else:
        x = C.read_f32(data)
        if opn == "add":
            r = x.sum(axis=0, dtype=_F32)
        elif opn == "average":
            r = (x.sum(axis=0, dtype=_F32) / np.float32(P)).astype(_F32)
        else:
            r = x.max(axis=0)
        C.write(dst, r.reshape(1, F))
    return C.emit(inst, "gpsimd", name, reads=[data], writes=[dst], num_partitions=P, free=F,
                  num_inputs=1, nbytes=F * dst.dtype.itemsize,
                  compute=(dst, data), reduce=True, operands={"dst": dst, "data": data})
