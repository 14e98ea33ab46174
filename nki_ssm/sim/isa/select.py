"""VectorE selects, partition shuffles and batch-norm statistics."""
from __future__ import annotations

import numpy as np

from . import _alu as A
from . import _core as C
from . import _state as S
from ._enums import check_enum, reduce_cmd as _rc
from .vector import _acc_start, _lanes

_F32 = np.float32


# ---- selects -----------------------------------------------------------------

FP32_MIN = float(np.finfo(np.float32).min)


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=_rc.reset_reduce,
                 reduce_res=None, reduce_op=None, range_start=0, on_false_value=FP32_MIN, name=None):
    """Keep element j where ``comp_op0(range_start + j, bound0) and comp_op1(range_start + j, bound1)``.

    Other elements become ``on_false_value`` (must be FP32_MIN). Max-reduces
    the result into the VectorE accumulator and ``reduce_res``. NeuronCore-v3+.
    """
    inst = "range_select"
    C.check_name(inst, name)
    if C.target().nc_version < 3:
        C.fail(inst, f"range_select needs NeuronCore-v3 or newer, target is {C.target().name}")
    reduce_cmd = check_enum(inst, "reduce_cmd", reduce_cmd, _rc)
    c0 = A.require_op(inst, "comp_op0", comp_op0, A.COMPARISONS[:1] + A.COMPARISONS[2:], "a comparison")
    c1 = A.require_op(inst, "comp_op1", comp_op1, A.COMPARISONS[:1] + A.COMPARISONS[2:], "a comparison")
    if reduce_op is not None:
        A.require_op(inst, "reduce_op", reduce_op, ("maximum",), "nl.maximum")
    if not isinstance(on_false_value, (float, np.floating)) or np.float32(on_false_value) != np.float32(FP32_MIN):
        C.fail(inst, f"on_false_value must be FP32_MIN ({FP32_MIN}) (hardware constraint), got {on_false_value!r}")
    if not isinstance(range_start, (int, np.integer)) or isinstance(range_start, bool):
        raise TypeError(f"{inst}: range_start must be a compile-time int, got {range_start!r}")
    C.tile(inst, "dst", dst)
    C.tile(inst, "on_true_tile", on_true_tile)
    C.same_shape(inst, "on_true_tile", on_true_tile, "dst", dst)
    if not on_true_tile.dtype.is_float:
        C.fail(inst, f"on_true_tile must have a float dtype, got {on_true_tile.dtype}")
    P, F = on_true_tile.shape[0], on_true_tile.elements_per_partition
    if int(range_start) + F > 2 ** 24:
        C.fail(inst, f"range_start + free index must stay below 2^24, got {range_start} + {F}")
    b0 = C.read_f32(C.column(inst, "bound0", bound0, P, fp32=True))
    b1 = C.read_f32(C.column(inst, "bound1", bound1, P, fp32=True))
    if reduce_res is not None:
        C.column(inst, "reduce_res", reduce_res, P)
    idx = (np.float32(range_start) + np.arange(F, dtype=_F32))[None, :]
    mask = A.ARITH_BINARY[c0](idx, b0).astype(bool) & A.ARITH_BINARY[c1](idx, b1).astype(bool)
    x = C.read_f32(on_true_tile)
    res = np.where(mask, x, np.float32(FP32_MIN)).astype(_F32)
    C.write(dst, res)
    acc = S.vector_acc()
    lanes = _lanes(on_true_tile)
    if reduce_cmd is not _rc.idle:
        start = _acc_start(inst, reduce_cmd, "maximum", acc[lanes], None, P,
                           (_rc.reset_reduce, _rc.reduce))
        acc[lanes] = np.maximum(start, res.max(axis=1))
    if reduce_res is not None:
        C.write(reduce_res, acc[lanes].reshape(P, 1))
    return C.emit(inst, "vector", name, reads=[on_true_tile, bound0, bound1],
                  writes=[dst] + ([reduce_res] if reduce_res is not None else []),
                  num_partitions=P, free=F, num_inputs=1, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, on_true_tile), reduce=reduce_cmd is not _rc.idle,
                  operands={"dst": dst, "on_true_tile": on_true_tile})


_PRED_DTYPES = ("int8", "uint8", "int16", "uint16")


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=_rc.idle,
                  reduce_op=None, reverse_pred=False, name=None):
    """``dst = where(predicate, on_true, on_false)`` with optional max-reduce into the accumulator.

    predicate int8/uint8/int16/uint16; on_true any dtype but tfloat32/int32/
    uint32; on_false a float32 scalar or (P, 1) tile; on_true and predicate
    not both in PSUM. With reduce_cmd idle the accumulator is left undefined
    (set to NaN here), as the documentation warns.
    """
    inst = "select_reduce"
    C.check_name(inst, name)
    reduce_cmd = check_enum(inst, "reduce_cmd", reduce_cmd, _rc)
    if reduce_op is not None:
        A.require_op(inst, "reduce_op", reduce_op, ("maximum",), "nl.maximum")
    C.tile(inst, "dst", dst)
    C.tile(inst, "predicate", predicate)
    C.tile(inst, "on_true", on_true)
    C.same_shape(inst, "on_true", on_true, "predicate", predicate)
    C.same_shape(inst, "on_true", on_true, "dst", dst)
    C.not_both_psum(inst, "on_true", on_true, "predicate", predicate)
    if predicate.dtype.name not in _PRED_DTYPES:
        C.fail(inst, f"predicate dtype must be one of {', '.join(_PRED_DTYPES)}, got {predicate.dtype}")
    if on_true.dtype.name in ("tfloat32", "int32", "uint32"):
        C.fail(inst, f"on_true dtype {on_true.dtype} is not supported (no tfloat32/int32/uint32)")
    P, F = on_true.shape[0], on_true.elements_per_partition
    if reduce_res is not None:
        C.column(inst, "reduce_res", reduce_res, P)
        if not reduce_res.dtype.is_float:
            C.fail(inst, f"reduce_res must have a float dtype, got {reduce_res.dtype}")
    if not C.is_tensor(on_false) and not isinstance(on_false, (float, np.floating)):
        C.fail(inst, f"on_false must be a float32 scalar or a ({P}, 1) tile, got {on_false!r}")
    f = C.scalar_or_column(inst, "on_false", on_false, P, fp32=False)  # fp32 rule is for scalars
    pred = C.read_raw(predicate) != 0
    if reverse_pred:
        pred = ~pred
    res = np.where(pred, C.read_f32(on_true), f).astype(_F32)
    C.write(dst, res)
    acc = S.vector_acc()
    lanes = _lanes(on_true)
    if reduce_cmd is _rc.idle:
        acc[lanes] = np.nan  # "accumulator state unknown" after idle
    else:
        start = _acc_start(inst, reduce_cmd, "maximum", acc[lanes], None, P,
                           (_rc.reset_reduce, _rc.reduce))
        acc[lanes] = np.maximum(start, res.max(axis=1))
    if reduce_res is not None:
        if reduce_cmd is _rc.idle:
            C.fail(inst, "reduce_res needs reduce_cmd reset_reduce or reduce (idle leaves the accumulator undefined)")
        C.write(reduce_res, acc[lanes].reshape(P, 1))
    reads = [predicate, on_true] + ([on_false] if C.is_tensor(on_false) else [])
    return C.emit(inst, "vector", name, reads=reads,
                  writes=[dst] + ([reduce_res] if reduce_res is not None else []),
                  num_partitions=P, free=F, num_inputs=2, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, predicate, on_true), reduce=reduce_cmd is not _rc.idle,
                  operands={"dst": dst, "predicate": predicate, "on_true": on_true})


# ---- cross-partition -----------------------------------------------------------

def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Per 32-partition quadrant: ``dst[q*32 + i] = src[q*32 + shuffle_mask[i]]``; 255 leaves dst[i].

    Same dtype and elements per partition; start partitions follow the rule for
    ``num_active = ceil(max(src_np, dst_np) / 32) * 32``. In place is allowed.
    """
    inst = "nc_stream_shuffle"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst, quadrant=False)
    C.tile(inst, "src", src, quadrant=False)
    mask = list(shuffle_mask) if isinstance(shuffle_mask, (list, tuple)) else None
    if mask is None or len(mask) != 32:
        C.fail(inst, f"shuffle_mask must be a list of 32 ints, got {shuffle_mask!r}")
    for m in mask:
        if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or not (0 <= m <= 31 or m == 255):
            C.fail(inst, f"shuffle_mask entries must be ints in [0, 31] or 255, got {m!r}")
    if dst.dtype.name != src.dtype.name:
        C.fail(inst, f"dst dtype must equal src dtype {src.dtype}, got {dst.dtype}")
    if dst.elements_per_partition != src.elements_per_partition:
        C.fail(inst, f"dst has {dst.elements_per_partition} elements per partition but src has "
                     f"{src.elements_per_partition} (must match)")
    sp, dp = src.shape[0], dst.shape[0]
    active = -(-max(sp, dp) // 32) * 32
    allowed = (0,) if active > 64 else (0, 64) if active > 32 else (0, 32, 64, 96)
    for arg, t in (("src", src), ("dst", dst)):
        if t.partition_start not in allowed:
            C.fail(inst, f"{arg} start partition {t.partition_start} is not allowed with "
                         f"{active} active partitions (allowed: {allowed})")
    s = C.read_raw(src)
    d = C.read_raw(dst).copy()
    for j in range(dp):
        m = mask[j % 32]
        if m == 255:
            continue
        k = (j // 32) * 32 + int(m)
        if k >= sp:
            C.fail(inst, f"shuffle_mask[{j % 32}] = {m} reads src partition {k} but src has {sp} partitions")
        d[j] = s[k]
    dst.write(d.reshape(dst.shape))
    F = dst.elements_per_partition
    return C.emit(inst, "vector", name, reads=[src], writes=[dst], num_partitions=max(sp, dp),
                  free=F, num_inputs=1, nbytes=dp * F * dst.dtype.itemsize,
                  compute=(dst, src), operands={"dst": dst, "src": src})


# ---- batch-norm statistics ---------------------------------------------------------

def bn_stats(dst, data, name=None):
    """Per partition: (count, mean, var*count) of the even-index and of the odd-index elements.

    ``data`` at most 512 elements per partition (nl.tile_size.bn_stats_fmax);
    ``dst`` 6 elements per partition.
    """
    inst = "bn_stats"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    P, F = data.shape[0], data.elements_per_partition
    fmax = C.target().bn_stats_fmax
    if F > fmax:
        C.fail(inst, f"data has {F} elements per partition, more than bn_stats_fmax = {fmax}")
    if dst.shape[0] != P or dst.elements_per_partition != 6:
        C.fail(inst, f"dst must be ({P}, 6), got {tuple(dst.shape)}")
    x = C.read_f32(data)
    out = np.zeros((P, 6), dtype=_F32)
    for k, part in enumerate((x[:, 0::2], x[:, 1::2])):
        n = part.shape[1]
        mean = part.mean(axis=1, dtype=_F32) if n else np.zeros(P, _F32)
        m2 = ((part - mean[:, None]) ** 2).sum(axis=1, dtype=_F32) if n else np.zeros(P, _F32)
        out[:, 3 * k] = n
        out[:, 3 * k + 1] = mean
        out[:, 3 * k + 2] = m2
    C.write(dst, out)
    return C.emit(inst, "vector", name, reads=[data], writes=[dst], num_partitions=P, free=F,
                  num_inputs=1, nbytes=P * 6 * dst.dtype.itemsize,
                  compute=(dst, data), reduce=True, operands={"dst": dst, "data": data})


def bn_aggr(dst, data, name=None):
    """Combine (count, mean, var*count) triples per partition into (mean, variance)."""
    inst = "bn_aggr"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    P, F = data.shape[0], data.elements_per_partition
    if F % 3:
        C.fail(inst, f"data elements per partition must be a multiple of 3 (count, mean, var*count), got {F}")
    if dst.shape[0] != P or dst.elements_per_partition != 2:
        C.fail(inst, f"dst must be ({P}, 2) (mean, variance), got {tuple(dst.shape)}")
    t = C.read_f32(data).astype(np.float64).reshape(P, -1, 3)
    n, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    tot = n.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = (n * mean).sum(axis=1) / tot
        var = (m2 + n * (mean - mu[:, None]) ** 2).sum(axis=1) / tot
    C.write(dst, np.stack([mu, var], axis=1).astype(_F32))
    return C.emit(inst, "vector", name, reads=[data], writes=[dst], num_partitions=P, free=F,
                  num_inputs=1, nbytes=P * 2 * dst.dtype.itemsize,
                  compute=(dst, data), reduce=True, operands={"dst": dst, "data": data})
