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
from .. import version as _version

_F32 = np.float32


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


def _two_arith_ops(inst, op0, op1):
    """op0 and op1 of a fused two-op instruction: binary arithmetic ALU ops
    available on the target -> their names."""
    n0 = A.require_op(inst, "op0", op0, tuple(A.ARITH_BINARY), "a binary arithmetic operator")
    n1 = A.require_op(inst, "op1", op1, tuple(A.ARITH_BINARY), "a binary arithmetic operator")
    _gate(inst, "op0", n0)
    _gate(inst, "op1", n1)
    return n0, n1


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

    A float ``value`` into an integer dtype is rejected (NKI 0.3.0 release notes,
    ``nisa.memset``: "Kernels that pass float values to integer-typed tensors ... will now
    raise an error"). An int into a float dtype is accepted and converted: the notes forbid
    only the float-into-int direction, KLR's ``builtin.isa.memset`` takes any ``Immediate``
    (KLR/Trace/ISA.lean 679-693 at 7ccd18c), and released nki-library kernels write
    ``value=0`` into float tiles (e.g. output_projection_cte_tensor_io.py 414).
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
                     f"(a float value into an integer tile is rejected since NKI 0.3.0)")
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
    n0, n1 = _two_arith_ops(inst, op0, op1)
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
    elif not _version.at_least("0.6.0"):
        C.fail(inst, f"reduce_res=None needs NKI 0.6.0 (release-notes/components/nki.rst, "
                     f"0.6.0: tensor_scalar_reduce 'now accepts reduce_res=None'); "
                     f"NKI {_version.nki_version()} requires a (P, 1) reduce_res")
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
