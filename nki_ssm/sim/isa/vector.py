"""VectorE (and multi-engine elementwise) instructions.

Arithmetic reads every operand as float32, computes in float32 and rounds
once into ``dst.dtype``; bitvec operators work on the raw integer bits.
"""
from __future__ import annotations

import numpy as np

from . import _alu as A
from . import _core as C
from . import _state as S
from ._enums import check_enum, engine as _engine, reduce_cmd as _rc

_F32 = np.float32
_INT_NAMES = ("int8", "int16", "int32", "uint8", "uint16", "uint32")


def _binary(inst, arg, op):
    """(name, kind) for a binary ALU op: kind 'arith' or 'bitvec'; version-gated."""
    name = A.op_name(op)
    if name in A.ARITH_BINARY:
        kind = "arith"
    elif name in A.BITVEC_BINARY:
        kind = "bitvec"
    else:
        C.fail(inst, f"{arg} must be a binary ALU operator (nl.add, nl.multiply, nl.bitwise_and, ...), got {op!r}")
    _gate(inst, arg, name)
    return name, kind


def _gate(inst, arg, name):
    if name in A.GEN4_ONLY and C.target().nc_version < 4:
        C.fail(inst, f"{arg}=nl.{name} is NeuronCore-v4 (trn3) only, target is {C.target().name}")


def _require_int(inst, tensors):
    for arg, t in tensors:
        if not t.dtype.is_int:
            C.fail(inst, f"bitvec operators need integer dtypes; {arg} is {t.dtype}")


def _engine_name(e):
    return C.ENGINE_NAMES[e]


# ---- copies and fills ---------------------------------------------------------

def tensor_copy(dst, src, engine=_engine.unknown, name=None):
    """``dst = src`` on VectorE (default), ScalarE (v3+) or GpSimd (SBUF only).

    Same dtype: bit-exact; different dtypes: through float32.
    """
    inst = "tensor_copy"
    C.check_name(inst, name)
    engine = check_enum(inst, "engine", engine, _engine)
    if engine is _engine.unknown:
        engine = _engine.vector
    if engine not in (_engine.vector, _engine.scalar, _engine.gpsimd):
        C.fail(inst, f"engine must be vector, scalar, gpsimd or unknown, got {engine}")
    bufs = ("sbuf",) if engine is _engine.gpsimd else ("sbuf", "psum")
    C.tile(inst, "dst", dst, bufs)
    C.tile(inst, "src", src, bufs)
    C.same_shape(inst, "src", src, "dst", dst)
    if engine is _engine.scalar and C.target().nc_version < 3:
        C.fail(inst, "tensor_copy on the Scalar engine is not supported on NeuronCore-v2 "
                     "(use activation(op=nl.copy))")
    if src.dtype.np == dst.dtype.np:
        dst.write(src.read().reshape(dst.shape))
    else:
        C.write(dst, C.read_f32(src))
    return C.emit(inst, _engine_name(engine), name, reads=[src], writes=[dst],
                  num_partitions=dst.shape[0], free=src.elements_per_partition, num_inputs=1,
                  nbytes=dst.shape[0] * dst.elements_per_partition * dst.dtype.itemsize,
                  compute=(dst, src), operands={"dst": dst, "src": src})


def memset(dst, value, engine=_engine.unknown, name=None):
    """Fill ``dst`` with the compile-time constant ``value`` (VectorE default, or GpSimd).

    ``value`` must match the dtype kind: an int for integer dtypes (a float is
    rejected, NKI 0.3.0); an int or float for float dtypes.
    """
    inst = "memset"
    C.check_name(inst, name)
    engine = check_enum(inst, "engine", engine, _engine)
    if engine is _engine.unknown:
        engine = _engine.vector
    if engine not in (_engine.vector, _engine.gpsimd):
        C.fail(inst, f"engine must be vector, gpsimd or unknown, got {engine}")
    C.tile(inst, "dst", dst, ("sbuf",) if engine is _engine.gpsimd else ("sbuf", "psum"))
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{inst}: value must be a Python int or float constant, got {type(value).__name__}")
    if dst.dtype.is_int and not isinstance(value, (int, np.integer)):
        C.fail(inst, f"value must be an int for integer dst dtype {dst.dtype}, got {value!r} "
                     f"(memset value type must match the dtype)")
    P, F = dst.shape[0], dst.elements_per_partition
    from ..dtypes import cast
    # float constants are fp32 immediates (rounded to fp32 first, then to dst)
    fill = cast(np.asarray([value], dtype=np.float32 if not isinstance(value, (int, np.integer))
                           else np.int64), dst.dtype)
    dst.write(np.broadcast_to(fill.reshape(1), dst.shape))
    return C.emit(inst, _engine_name(engine), name, writes=[dst], num_partitions=P, free=F,
                  num_inputs=0, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst,), operands={"dst": dst})


# ---- elementwise -------------------------------------------------------------

def tensor_tensor(dst, data1, data2, op, engine=_engine.unknown, name=None):
    """``dst = op(data1, data2)`` elementwise (no broadcasting).

    Same partitions and elements per partition; data1 and data2 not both in
    PSUM. ``nl.power`` runs on GpSimd (SBUF only); all-int32/uint32 operands
    default to GpSimd unless an operand is in PSUM.
    """
    inst = "tensor_tensor"
    if name is not None:
        C.check_name(inst, name)
    if engine is not _engine.unknown:
        engine = check_enum(inst, "engine", engine, _engine)
    opn, kind = _binary(inst, "op", op)
    C.tile(inst, "dst", dst)
    C.tile(inst, "data1", data1)
    C.tile(inst, "data2", data2)
    C.same_shape(inst, "data1", data1, "data2", data2)
    C.same_shape(inst, "data1", data1, "dst", dst)
    C.not_both_psum(inst, "data1", data1, "data2", data2)
    any_psum = "psum" in (dst.storage.buffer, data1.storage.buffer, data2.storage.buffer)
    if engine is _engine.unknown:
        all_i32 = data1.dtype.is_int and all(t.dtype.name in ("int32", "uint32") for t in (dst, data1, data2))
        engine = (_engine.gpsimd if (opn == "power" or (all_i32 and not any_psum and kind == "arith"))
                  else _engine.vector)
    if engine not in (_engine.vector, _engine.gpsimd):
        C.fail(inst, f"engine must be vector, gpsimd or unknown, got {engine}")
    if opn == "power" and engine is not _engine.gpsimd:
        C.fail(inst, "op=nl.power runs on the GpSimd engine only")
    if kind == "bitvec" and engine is not _engine.vector:
        C.fail(inst, f"bitvec operators (op=nl.{opn}) run on the Vector engine only, got engine={engine}")
    if engine is _engine.gpsimd and any_psum:
        C.fail(inst, "the GpSimd engine cannot access PSUM "
                     f"({'op=nl.power' if opn == 'power' else 'engine=gpsimd'}); move operands to SBUF")
    if kind == "bitvec":
        _require_int(inst, (("dst", dst), ("data1", data1), ("data2", data2)))
        a, b = C.read_raw(data1), C.read_raw(data2)
        res = A.BITVEC_BINARY[opn](a, b.astype(a.dtype))
        from ..dtypes import cast
        dst.write(cast(res, dst.dtype).reshape(dst.shape))
    elif engine is _engine.gpsimd and opn != "power" and all(
            t.dtype.name in ("int32", "uint32") for t in (dst, data1, data2)):
        # GpSimd integer path: exact 32-bit integer arithmetic
        a = C.read_raw(data1).astype(np.int64)
        b = C.read_raw(data2).astype(np.int64)
        res = A.ARITH_BINARY[opn](a, b)
        from ..dtypes import cast
        dst.write(cast(res, dst.dtype).reshape(dst.shape))
    else:
        # hot path: live read views, result into a reused float32 scratch, one
        # rounding in dst.write (reads never alias the scratch)
        a = data1.read(copy=False)
        b = data2.read(copy=False)
        if a.dtype != _F32:
            a = a.astype(_F32)
        if b.dtype != _F32:
            b = b.astype(_F32)
        shape = dst.shape
        if a.shape != shape:
            a = a.reshape(shape)
        if b.shape != shape:
            b = b.reshape(shape)
        fn = A.ARITH_BINARY[opn]
        if opn in A.UFUNCS:
            out = C.scratch(shape)
            fn(a, b, out=out)
        else:
            out = fn(a, b)
        dst.write(out)
    P, F = dst.shape[0], dst.elements_per_partition
    return C.emit(inst, _engine_name(engine), name, reads=[data1, data2], writes=[dst],
                  num_partitions=P, free=F, num_inputs=2, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, data1, data2),
                  operands={"dst": dst, "data1": data1, "data2": data2})


def _scalar_operand(inst, arg, v, P, kind, unary):
    """Resolve a tensor_scalar operand: float32 scalar/(P,1) (arith) or int (bitvec)."""
    if unary:
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0):
            C.fail(inst, f"{arg} must be None or 0 for a unary operator, got {v!r}")
        return None
    if kind == "bitvec":
        if C.is_tensor(v):
            C.column(inst, arg, v, P)
            if not v.dtype.is_int:
                C.fail(inst, f"{arg} must be an integer tile for a bitvec operator, got {v.dtype}")
            return C.read_raw(v)
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            return v
        C.fail(inst, f"{arg} must be an int constant or integer ({P}, 1) tile for a bitvec operator, got {v!r}")
    # arithmetic operands must be float32 (tiles) / compile-time scalars
    return C.scalar_or_column(inst, arg, v, P, fp32=True)


def _apply(fn, x, operand, reverse):
    return fn(operand, x) if reverse else fn(x, operand)


_SCALAR_ENGINE_COMBOS = (("multiply", "add"), ("multiply", None), ("add", None))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None,
                  reverse1=False, engine=_engine.unknown, name=None):
    """``dst = (data op0 operand0) op1 operand1`` with scalar / (P, 1) operands.

    Operands: compile-time scalars or float32 ``(P, 1)`` tiles (arithmetic),
    ints or integer tiles (bitvec). ``op1``/``operand1`` both None or both set;
    op0 and op1 both arithmetic or both bitvec. Unary op0 (abs, rsqrt,
    reciprocal; square/relu on v4) takes operand0 None or 0. ScalarE on
    gen2/gen3 supports (multiply, add), (multiply, -), (add, -) only; GpSimd
    only rsqrt.
    """
    inst = "tensor_scalar"
    C.check_name(inst, name)
    engine = check_enum(inst, "engine", engine, _engine)
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    C.same_shape(inst, "data", data, "dst", dst)
    P = data.shape[0]
    n0 = A.op_name(op0)
    unary0 = n0 in A.ARITH_UNARY or n0 in A.BITVEC_UNARY
    if unary0:
        _gate(inst, "op0", n0)
        kind0 = "bitvec" if n0 in A.BITVEC_UNARY else "arith"
    else:
        n0, kind0 = _binary(inst, "op0", op0)
    if (op1 is None) != (operand1 is None):
        C.fail(inst, f"op1 and operand1 must both be None or both be set, got op1={op1!r}, "
                     f"operand1={'a tile' if C.is_tensor(operand1) else repr(operand1)}")
    n1 = None
    if op1 is not None:
        n1, kind1 = _binary(inst, "op1", op1)
        if kind1 != kind0:
            C.fail(inst, f"op0 and op1 must both be arithmetic or both bitvec, got nl.{n0} and nl.{n1}")
    if engine is _engine.unknown:
        engine = _engine.vector
    if engine not in (_engine.vector, _engine.scalar, _engine.gpsimd):
        C.fail(inst, f"engine must be vector, scalar, gpsimd or unknown, got {engine}")
    if kind0 == "bitvec" and engine is not _engine.vector:
        C.fail(inst, f"bitvec operators run on the Vector engine only, got engine={engine}")
    if engine is _engine.scalar and C.target().nc_version <= 3 and (n0, n1) not in _SCALAR_ENGINE_COMBOS:
        C.fail(inst, f"the Scalar engine on {C.target().name} supports only (op0, op1) in "
                     f"(multiply, add), (multiply, None), (add, None); got (nl.{n0}, "
                     f"{'None' if n1 is None else 'nl.' + n1})")
    if engine is _engine.gpsimd:
        if n0 != "rsqrt" or n1 is not None:
            C.fail(inst, f"engine=gpsimd supports only op0=nl.rsqrt, got op0=nl.{n0}")
        C.tile(inst, "data", data, ("sbuf",))
        C.tile(inst, "dst", dst, ("sbuf",))
    v0 = _scalar_operand(inst, "operand0", operand0, P, kind0, unary0)
    v1 = _scalar_operand(inst, "operand1", operand1, P, kind0, False) if n1 is not None else None
    if kind0 == "bitvec":
        _require_int(inst, (("dst", dst), ("data", data)))
        x = C.read_raw(data)
        if unary0:
            x = A.BITVEC_UNARY[n0](x)
        else:
            x = _apply(A.BITVEC_BINARY[n0], x, np.asarray(v0).astype(x.dtype), reverse0)
        if n1 is not None:
            x = _apply(A.BITVEC_BINARY[n1], x, np.asarray(v1).astype(x.dtype), reverse1)
        from ..dtypes import cast
        dst.write(cast(x, dst.dtype).reshape(dst.shape))
    else:
        x = C.read_f32(data)
        with np.errstate(all="ignore"):
            x = A.ARITH_UNARY[n0](x) if unary0 else _apply(A.ARITH_BINARY[n0], x, v0, reverse0)
            if n1 is not None:
                x = _apply(A.ARITH_BINARY[n1], x, v1, reverse1)
        C.write(dst, np.asarray(x, dtype=_F32))
    reads = [data] + [v for v in (operand0, operand1) if C.is_tensor(v)]
    F = dst.elements_per_partition
    return C.emit(inst, _engine_name(engine), name, reads=reads, writes=[dst], num_partitions=P,
                  free=data.elements_per_partition, num_inputs=1, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, data), operands={"dst": dst, "data": data})


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         name=None):
    """``dst = (data op0 operand0) op1 operand1`` on VectorE (arithmetic only).

    ``operand0``: scalar or float32 ``(P, 1)`` tile; ``operand1``: a tile with
    data's partitions and elements; data and operand1 not both in PSUM.
    """
    inst = "scalar_tensor_tensor"
    C.check_name(inst, name)
    n0 = A.require_op(inst, "op0", op0, tuple(A.ARITH_BINARY), "a binary arithmetic operator")
    n1 = A.require_op(inst, "op1", op1, tuple(A.ARITH_BINARY), "a binary arithmetic operator")
    _gate(inst, "op0", n0)
    _gate(inst, "op1", n1)
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    if not C.is_tensor(operand1):
        raise TypeError(f"{inst}: operand1 must be a tile (NkiTensor), got {type(operand1).__name__}")
    C.tile(inst, "operand1", operand1)
    C.same_shape(inst, "data", data, "operand1", operand1)
    C.same_shape(inst, "data", data, "dst", dst)
    C.not_both_psum(inst, "data", data, "operand1", operand1)
    P = data.shape[0]
    # "All input tiles can be any supported NKI data type" (scalar_tensor_tensor doc)
    v0 = C.scalar_or_column(inst, "operand0", operand0, P, fp32=False)
    x = C.read_f32(data)
    y = C.read_f32(operand1)
    with np.errstate(all="ignore"):
        t = _apply(A.ARITH_BINARY[n0], x, v0, reverse0)
        r = A.ARITH_BINARY[n1](y, t) if reverse1 else A.ARITH_BINARY[n1](t, y)
    C.write(dst, np.asarray(r, dtype=_F32))
    reads = [data, operand1] + ([operand0] if C.is_tensor(operand0) else [])
    F = dst.elements_per_partition
    return C.emit(inst, "vector", name, reads=reads, writes=[dst], num_partitions=P, free=F,
                  num_inputs=2, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, data, operand1),
                  operands={"dst": dst, "data": data, "operand1": operand1})


def reciprocal(dst, data, name=None):
    """``dst = 1 / data`` on VectorE in float32."""
    inst = "reciprocal"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    C.same_shape(inst, "data", data, "dst", dst)
    C.write(dst, A.ARITH_UNARY["reciprocal"](C.read_f32(data)))
    P, F = dst.shape[0], dst.elements_per_partition
    return C.emit(inst, "vector", name, reads=[data], writes=[dst], num_partitions=P, free=F,
                  num_inputs=1, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, data), operands={"dst": dst, "data": data})


# ---- reductions ---------------------------------------------------------------

def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce ``data`` over trailing free axes ``axis`` (never 0) with ``op``.

    ``axis``: int or tuple/list, contiguous and ending at the last dim.
    ``dst`` elements per partition must equal the product of the kept dims.
    ``negate`` multiplies arithmetic results by -1.
    """
    inst = "tensor_reduce"
    C.check_name(inst, name)
    opn = A.op_name(op)
    if opn in A.ARITH_REDUCE:
        kind = "arith"
    elif opn in A.BITVEC_REDUCE:
        kind = "bitvec"
    else:
        C.fail(inst, f"op must be a reduction operator (nl.add, nl.multiply, nl.maximum, nl.minimum, "
                     f"nl.subtract, logical/bitwise and/or/xor), got {op!r}")
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    nd = len(data.shape)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis) if isinstance(axis, (tuple, list)) else None
    if not axes or not all(isinstance(a, (int, np.integer)) for a in axes):
        raise TypeError(f"{inst}: axis must be an int or a tuple/list of ints, got {axis!r}")
    axes = tuple(sorted(int(a) + nd if a < 0 else int(a) for a in axes))
    if 0 in axes:
        C.fail(inst, f"axis 0 (the partition dimension) cannot be reduced, got axis={axis!r}")
    if axes != tuple(range(axes[0], nd)) or axes[-1] != nd - 1:
        C.fail(inst, f"axis must be the trailing contiguous free dimensions ending at {nd - 1} "
                     f"for a {nd}-D data tile, got axis={axis!r}")
    if dst.shape[0] != data.shape[0]:
        C.fail(inst, f"dst has {dst.shape[0]} partitions but data has {data.shape[0]} (must match)")
    kept = 1
    for s in data.shape[1:axes[0]]:
        kept *= s
    if dst.elements_per_partition != kept:
        C.fail(inst, f"dst must have {kept} elements per partition after reducing axis={axis!r} of "
                     f"{tuple(data.shape)}, got {dst.elements_per_partition}")
    if negate and kind == "bitvec":
        C.fail(inst, "negate applies to arithmetic operators only")
    P = data.shape[0]
    if kind == "bitvec":
        _require_int(inst, (("dst", dst), ("data", data)))
        x = C.read_raw(data).reshape(P, kept, -1)
        r = A.BITVEC_REDUCE[opn].reduce(x, axis=2)
        from ..dtypes import cast
        dst.write(cast(r, dst.dtype).reshape(dst.shape))
    else:
        x = C.read_f32(data).reshape(P, kept, -1)
        if opn.startswith("logical"):
            r = A.ARITH_REDUCE[opn].reduce(x != 0, axis=2).astype(_F32)
        else:
            r = A.ARITH_REDUCE[opn].reduce(x, axis=2, dtype=_F32)
        if negate:
            r = -r
        C.write(dst, r)
    return C.emit(inst, "vector", name, reads=[data], writes=[dst], num_partitions=P,
                  free=data.elements_per_partition, num_inputs=1,
                  nbytes=P * kept * dst.dtype.itemsize,
                  compute=(dst, data), reduce=True, operands={"dst": dst, "data": data})


def _acc_start(inst, cmd, op, acc_lanes, init, P, allowed):
    """Accumulator lanes at the start of an accumulating VectorE instruction."""
    if cmd not in allowed:
        C.fail(inst, f"reduce_cmd must be one of {', '.join('reduce_cmd.' + c.name for c in allowed)}, got {cmd}")
    if cmd is _rc.reset_reduce or cmd is _rc.reset:
        return np.full(P, A.IDENTITY[op], dtype=_F32)
    if cmd is _rc.load_reduce:
        if init is None:
            C.fail(inst, "reduce_cmd=load_reduce needs an initial value (reduce_init / imm1)")
        v = C.scalar_or_column(inst, "reduce_init", init, P, fp32=True)
        return np.broadcast_to(np.asarray(v, dtype=_F32).reshape(-1), (P,)).copy()
    return acc_lanes.copy()  # reduce: continue from the previous instruction


def _lanes(t):
    s = t.partition_start
    return slice(s, s + t.shape[0])


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=_rc.reset_reduce, reduce_init=None, reduce_res_negate=False,
                         name=None):
    """``dst = data op0 operand0`` and reduce it over all free elements into the accumulator.

    ``reduce_op`` in add, multiply, maximum, minimum; ``reduce_res`` (P, 1)
    receives the accumulator (negated if ``reduce_res_negate``); None keeps it
    in the VectorE accumulator only.
    """
    inst = "tensor_scalar_reduce"
    C.check_name(inst, name)
    reduce_cmd = check_enum(inst, "reduce_cmd", reduce_cmd, _rc)
    n0 = A.op_name(op0)
    unary = n0 in A.ARITH_UNARY
    if unary:
        _gate(inst, "op0", n0)
    else:
        n0 = A.require_op(inst, "op0", op0, tuple(A.ARITH_BINARY), "an arithmetic operator")
        _gate(inst, "op0", n0)
    rn = A.require_op(inst, "reduce_op", reduce_op, ("add", "multiply", "maximum", "minimum"),
                      "a reduction operator")
    if reverse0:
        C.fail(inst, "reverse0=True is not supported yet by tensor_scalar_reduce (documented)")
    if reduce_init is not None and reduce_cmd is not _rc.load_reduce:
        C.fail(inst, f"reduce_init should only be set with reduce_cmd=load_reduce, got {reduce_cmd}")
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    C.same_shape(inst, "data", data, "dst", dst)
    P = data.shape[0]
    if reduce_res is not None:
        C.column(inst, "reduce_res", reduce_res, P)
    v0 = _scalar_operand(inst, "operand0", operand0, P, "arith", unary)
    x = C.read_f32(data)
    with np.errstate(all="ignore"):
        y = A.ARITH_UNARY[n0](x) if unary else A.ARITH_BINARY[n0](x, v0)
    y = np.asarray(y, dtype=_F32)
    C.write(dst, y)
    acc = S.vector_acc()
    lanes = _lanes(data)
    start = _acc_start(inst, reduce_cmd, rn, acc[lanes], reduce_init, P,
                       (_rc.reset_reduce, _rc.reduce, _rc.load_reduce))
    fn = A.ARITH_REDUCE[rn]
    acc[lanes] = fn(start, fn.reduce(y, axis=1, dtype=_F32))
    if reduce_res is not None:
        out = acc[lanes].reshape(P, 1)
        C.write(reduce_res, -out if reduce_res_negate else out)
    F = dst.elements_per_partition
    return C.emit(inst, "vector", name, reads=[data] + ([operand0] if C.is_tensor(operand0) else []),
                  writes=[dst] + ([reduce_res] if reduce_res is not None else []), num_partitions=P,
                  free=F, num_inputs=1, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, data), reduce=True,
                  operands={"dst": dst, "data": data, "reduce_res": reduce_res})


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
    n0 = A.require_op(inst, "op0", op0, tuple(A.ARITH_BINARY), "a binary arithmetic operator")
    n1 = A.require_op(inst, "op1", op1, tuple(A.ARITH_BINARY), "a binary arithmetic operator")
    _gate(inst, "op0", n0)
    _gate(inst, "op1", n1)
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
        if n1 == "add" and np.all(np.isfinite(reg)):
            # sequential float32 running sum (np.add.accumulate is strictly in order)
            tt = t.copy()
            tt[:, 0] = tt[:, 0] + reg
            out = np.add.accumulate(tt, axis=1, dtype=_F32)
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
