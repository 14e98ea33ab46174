"""VectorE scans: ``tensor_tensor_scan`` and ``tensor_scalar_cumulative`` (the SSM recurrences)."""
from __future__ import annotations

import numpy as np

from . import _alu as A
from . import _core as C
from . import _state as S
from ._enums import check_enum, reduce_cmd as _rc
from .vector import _acc_start, _gate, _lanes, _two_arith_ops

_F32 = np.float32


# ---- scans -------------------------------------------------------------------

def _scan_linear(a, b, h0):
    """h_i = a_i * h_{i-1} + b_i in float32, columns in order (a, b: [P, F])."""
    P, F = a.shape
    out = np.empty((F, P), dtype=_F32)
    at, bt = np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
    h = h0
    for i in range(F):
        h = at[i] * h + bt[i]  # two float32 roundings, as the ALU does op0 then op1
        out[i] = h
    return out.T


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False,
                       name=None):
    """Per partition, along the free elements: ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])``.

    ``r[-1] = initial`` (float32 scalar or (P, 1) tile). ``reverse0`` makes
    data0 the rhs of op0; ``reverse1`` makes data1 the lhs of op1. Both ops
    binary arithmetic; data0 and data1 not both in PSUM; fp32 math.
    """
    inst = "tensor_tensor_scan"
    C.check_name(inst, name)
    n0, n1 = _two_arith_ops(inst, op0, op1)
    C.tile(inst, "dst", dst)
    C.tile(inst, "data0", data0)
    C.tile(inst, "data1", data1)
    C.same_shape(inst, "data0", data0, "data1", data1)
    C.same_shape(inst, "data0", data0, "dst", dst)
    C.not_both_psum(inst, "data0", data0, "data1", data1)
    P = data0.shape[0]
    # a tile initial may be any dtype (doc: "a tile ... with one element per partition")
    h0 = C.scalar_or_column(inst, "initial", initial, P, fp32=False)
    h0 = np.broadcast_to(np.asarray(h0, dtype=_F32).reshape(-1), (P,)).copy()
    a, b = C.read_f32(data0), C.read_f32(data1)
    with np.errstate(all="ignore"):
        if n0 == "multiply" and n1 == "add" and not reverse1:
            res = _scan_linear(a, b, h0)
        else:
            f0, f1 = A.ARITH_BINARY[n0], A.ARITH_BINARY[n1]
            at, bt = np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
            out = np.empty_like(at)
            h = h0
            for i in range(at.shape[0]):
                t = f0(h, at[i]) if reverse0 else f0(at[i], h)
                h = (f1(bt[i], t) if reverse1 else f1(t, bt[i])).astype(_F32)
                out[i] = h
            res = out.T
    C.write(dst, res)
    reads = [data0, data1] + ([initial] if C.is_tensor(initial) else [])
    F = dst.elements_per_partition
    return C.emit(inst, "vector", name, reads=reads, writes=[dst], num_partitions=P, free=F,
                  num_inputs=2, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, data0, data1),
                  operands={"dst": dst, "data0": data0, "data1": data1})


_CUM_OPS = ("add", "subtract", "multiply", "maximum", "minimum")


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=_rc.reset_reduce,
                             name=None):
    """Running accumulation: ``reg = op1(op0(src[i], imm0), reg); dst[i] = reg``.

    ``reg`` starts at op1's identity (reset_reduce), ``imm1`` (load_reduce) or
    the VectorE accumulator left by the previous accumulating instruction
    (reduce); it is left in the accumulator afterwards. op1 in add, subtract,
    multiply, maximum, minimum; no int32/uint32 operands; imm0/imm1 float32.
    """
    inst = "tensor_scalar_cumulative"
    C.check_name(inst, name)
    reduce_cmd = check_enum(inst, "reduce_cmd", reduce_cmd, _rc)
    n0 = A.require_op(inst, "op0", op0, tuple(A.ARITH_BINARY), "an arithmetic operator")
    _gate(inst, "op0", n0)
    n1 = A.require_op(inst, "op1", op1, _CUM_OPS, "a cumulative operator")
    C.tile(inst, "dst", dst)
    C.tile(inst, "src", src)
    C.same_shape(inst, "src", src, "dst", dst)
    for arg, t in (("src", src), ("dst", dst)):
        if t.dtype.name in ("int32", "uint32", "tfloat32"):
            C.fail(inst, f"{arg} dtype {t.dtype} is not supported (no int32/uint32: ISA limitation)")
    if imm1 is not None and reduce_cmd is not _rc.load_reduce:
        C.fail(inst, f"imm1 is the load_reduce initial value; reduce_cmd is {reduce_cmd}")
    P = src.shape[0]
    v0 = C.scalar_or_column(inst, "imm0", imm0, P, fp32=True)
    acc = S.vector_acc()
    lanes = _lanes(src)
    reg = _acc_start(inst, reduce_cmd, n1, acc[lanes], imm1, P,
                     (_rc.reset_reduce, _rc.reduce, _rc.load_reduce))
    x = C.read_f32(src)
    f0, f1 = A.ARITH_BINARY[n0], A.ARITH_BINARY[n1]
    with np.errstate(all="ignore"):
        t = np.asarray(f0(x, v0), dtype=_F32)
        if n1 in ("add", "multiply", "maximum", "minimum"):
            # commutative op1: reg_i = op1(reg_{i-1}, t_i) is the ufunc's
            # accumulate, which runs strictly in order in float32
            tt = np.concatenate([np.asarray(reg, _F32).reshape(-1, 1), t], axis=1)
            out = f1.accumulate(tt, axis=1, dtype=_F32)[:, 1:]
        else:
            tt = np.ascontiguousarray(t.T)
            out = np.empty_like(tt)
            for i in range(tt.shape[0]):
                reg = np.asarray(f1(tt[i], reg), dtype=_F32)
                out[i] = reg
            out = out.T
    acc[lanes] = out[:, -1]
    C.write(dst, out)
    F = dst.elements_per_partition
    return C.emit(inst, "vector", name, reads=[src] + ([imm0] if C.is_tensor(imm0) else []),
                  writes=[dst], num_partitions=P, free=F, num_inputs=1,
                  nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, src), reduce=True, operands={"dst": dst, "src": src})
