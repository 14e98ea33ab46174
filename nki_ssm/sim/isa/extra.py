"""Instructions beyond the SSM core set: ``exponential`` and ``activate2`` (v4),
``tensor_copy_predicated``, ``max8``, ``nc_n_gather``."""
from __future__ import annotations

import numpy as np

from . import _alu as A
from . import _core as C
from . import _state as S
from ._enums import check_enum, reduce_cmd as _rc

_F32 = np.float32


def _v4(inst):
    tgt = C.target()
    if tgt.nc_version < 4:
        C.fail(inst, f"{inst} is NeuronCore-v4 (trn3) only, target is {tgt.name}")


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=_rc.idle, reduce_init=0.0,
                name=None):
    """``dst = exp(src - max_value)`` on VectorE (NeuronCore-v4), optional running sum.

    The sum goes to the VectorE accumulator (reset_reduce: from 0, reduce:
    continue, load_reduce: from ``reduce_init``) and, if given, ``reduce_res``.
    ``idle`` leaves the accumulator undefined (NaN here).
    """
    inst = "exponential"
    C.check_name(inst, name)
    _v4(inst)
    reduce_cmd = check_enum(inst, "reduce_cmd", reduce_cmd, _rc)
    if reduce_cmd is _rc.reset:
        C.fail(inst, "reduce_cmd must be idle, reset_reduce, reduce or load_reduce, got reduce_cmd.reset")
    C.tile(inst, "dst", dst)
    C.tile(inst, "src", src)
    C.same_shape(inst, "src", src, "dst", dst)
    P = src.shape[0]
    if reduce_cmd is not _rc.load_reduce and not (isinstance(reduce_init, (int, float)) and reduce_init == 0):
        C.fail(inst, f"reduce_init must be unset or 0.0 unless reduce_cmd is load_reduce, got {reduce_init!r}")
    if reduce_res is not None:
        C.column(inst, "reduce_res", reduce_res, P)
        if reduce_cmd is _rc.idle:
            C.fail(inst, "reduce_res needs an accumulating reduce_cmd (idle leaves the accumulator undefined)")
    mv = C.scalar_or_column(inst, "max_value", max_value, P, fp32=True)
    with np.errstate(all="ignore"):
        y = np.exp(C.read_f32(src) - mv).astype(_F32)
    C.write(dst, y)
    acc = S.vector_acc()
    lanes = slice(src.partition_start, src.partition_start + P)
    if reduce_cmd is _rc.idle:
        acc[lanes] = np.nan
    else:
        if reduce_cmd is _rc.reset_reduce:
            start = np.zeros(P, _F32)
        elif reduce_cmd is _rc.load_reduce:
            v = C.scalar_or_column(inst, "reduce_init", reduce_init, P, fp32=True)
            start = np.broadcast_to(np.asarray(v, _F32).reshape(-1), (P,)).copy()
        else:
            start = acc[lanes].copy()
        acc[lanes] = start + y.sum(axis=1, dtype=_F32)
        if reduce_res is not None:
            C.write(reduce_res, acc[lanes].reshape(P, 1))
    F = dst.elements_per_partition
    return C.emit(inst, "vector", name, reads=[src] + ([max_value] if C.is_tensor(max_value) else []),
                  writes=[dst] + ([reduce_res] if reduce_res is not None else []), num_partitions=P,
                  free=F, num_inputs=1, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, src), reduce=reduce_cmd is not _rc.idle,
                  operands={"dst": dst, "src": src})


_A2_COMBOS = (("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"),
              ("add", "bypass"), ("subtract", "bypass"), ("bypass", "bypass"))
_A2_REDUCE = ("add", "maximum", "minimum", "abs_max", "abs_min")
_A2_IDENTITY = {None: 0.0, "add": 0.0, "maximum": -np.inf, "minimum": np.inf, "abs_max": 0.0,
                "abs_min": np.inf}


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False,
              reduce_op=None, reduce_res=None, reduce_cmd=_rc.idle, name=None):
    """``dst = op((data op0 imm0) op1 imm1)`` on ScalarE (NeuronCore-v4) with optional reduction.

    (op0, op1) in (multiply, add), (multiply, subtract), (multiply, bypass),
    (add, bypass), (subtract, bypass), (bypass, bypass). ``nl.prelu`` uses
    ``relu_param`` as the negative slope. Reductions (add, maximum, minimum,
    abs_max, abs_min) go to the ScalarE registers shared with ``activation``.
    """
    inst = "activate2"
    C.check_name(inst, name)
    _v4(inst)
    reduce_cmd = check_enum(inst, "reduce_cmd", reduce_cmd, _rc)
    if reduce_cmd is _rc.load_reduce:
        C.fail(inst, "reduce_cmd.load_reduce is not supported by activate2")
    fn = A.op_name(op)
    if fn not in A.ACTIVATIONS and fn != "prelu":
        C.fail(inst, f"op must be an activation function, got {op!r}")
    n0, n1 = A.op_name(op0), A.op_name(op1)
    if (n0, n1) not in _A2_COMBOS:
        C.fail(inst, f"(op0, op1) must be one of {_A2_COMBOS}, got ({op0!r}, {op1!r})")
    if reverse0 and n0 == "bypass" or reverse1 and n1 == "bypass":
        C.fail(inst, "reverse0/reverse1 need op0/op1 to be set (not bypass)")
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    C.same_shape(inst, "data", data, "dst", dst)
    P = data.shape[0]
    if C.is_tensor(imm0) and C.is_tensor(imm1) and imm0.dtype.name != imm1.dtype.name:
        C.fail(inst, f"imm0 and imm1 tiles must share a dtype, got {imm0.dtype} and {imm1.dtype}")
    rn = None
    if reduce_op is not None:
        rn = A.require_op(inst, "reduce_op", reduce_op, _A2_REDUCE, "a reduction operator")
    if reduce_cmd in (_rc.reduce, _rc.reset_reduce) and rn is None:
        C.fail(inst, f"reduce_cmd={reduce_cmd} needs reduce_op")
    if reduce_res is not None:
        C.column(inst, "reduce_res", reduce_res, P)
    x = C.read_f32(data)
    with np.errstate(all="ignore"):
        if n0 != "bypass":
            v0 = C.scalar_or_column(inst, "imm0", imm0, P, fp32=False)
            x = A.ARITH_BINARY[n0](v0, x) if reverse0 else A.ARITH_BINARY[n0](x, v0)
        if n1 != "bypass":
            v1 = C.scalar_or_column(inst, "imm1", imm1, P, fp32=False)
            x = A.ARITH_BINARY[n1](v1, x) if reverse1 else A.ARITH_BINARY[n1](x, v1)
        x = np.asarray(x, dtype=_F32)
        if fn == "prelu":
            a = C.scalar_or_column(inst, "relu_param", relu_param, P, fp32=False)
            y = np.where(x > 0, x, x * a).astype(_F32)
        else:
            y = np.asarray(A.ACTIVATIONS[fn](x), dtype=_F32)
    C.write(dst, y)
    regs = S.scalar_regs()
    lanes = slice(data.partition_start, data.partition_start + P)
    if reduce_cmd in (_rc.reset, _rc.reset_reduce):
        regs[lanes] = _A2_IDENTITY[rn]
    if reduce_cmd in (_rc.reduce, _rc.reset_reduce):
        if rn == "add":
            part = y.sum(axis=1, dtype=_F32)
            regs[lanes] = regs[lanes] + part
        else:
            f = {"maximum": np.maximum, "minimum": np.minimum, "abs_max": A.ARITH_BINARY["abs_max"],
                 "abs_min": A.ARITH_BINARY["abs_min"]}[rn]
            red = np.abs(y) if rn.startswith("abs") else y
            part = (red.max(axis=1) if rn in ("maximum", "abs_max") else red.min(axis=1))
            regs[lanes] = f(regs[lanes], part)
    if reduce_res is not None:
        C.write(reduce_res, regs[lanes].reshape(P, 1))
    F = dst.elements_per_partition
    return C.emit(inst, "scalar", name, reads=[data] + [t for t in (imm0, imm1) if C.is_tensor(t)],
                  writes=[dst] + ([reduce_res] if reduce_res is not None else []), num_partitions=P,
                  free=F, num_inputs=1, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, data), reduce=reduce_cmd in (_rc.reduce, _rc.reset_reduce),
                  attrs={"reduce_res": reduce_res is not None, "function": fn},
                  operands={"dst": dst, "data": data})


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """``dst = src where predicate`` (else dst unchanged) on VectorE.

    ``src`` a tile or a scalar; predicate uint8/uint16/uint32; src and dst the
    same dtype; src and predicate not both in PSUM.
    """
    inst = "tensor_copy_predicated"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst)
    C.tile(inst, "predicate", predicate)
    C.same_shape(inst, "predicate", predicate, "dst", dst)
    if predicate.dtype.name not in ("uint8", "uint16", "uint32"):
        C.fail(inst, f"predicate must be uint8, uint16 or uint32, got {predicate.dtype}")
    pred = C.read_raw(predicate) != 0
    if reverse_pred:
        pred = ~pred
    cur = C.read_raw(dst)
    if C.is_tensor(src):
        C.tile(inst, "src", src)
        C.same_shape(inst, "src", src, "dst", dst)
        C.not_both_psum(inst, "src", src, "predicate", predicate)
        if src.dtype.name != dst.dtype.name:
            C.fail(inst, f"src and dst must share a dtype, got {src.dtype} and {dst.dtype}")
        new = C.read_raw(src)
    elif isinstance(src, (int, float, np.integer, np.floating)) and not isinstance(src, bool):
        from ..dtypes import cast
        new = np.broadcast_to(cast(np.asarray([np.float32(src)]), dst.dtype), cur.shape)
    else:
        raise TypeError(f"{inst}: src must be a tile or a number, got {type(src).__name__}")
    dst.write(np.where(pred, new, cur).reshape(dst.shape))
    P, F = dst.shape[0], dst.elements_per_partition
    reads = [predicate, dst] + ([src] if C.is_tensor(src) else [])
    return C.emit(inst, "vector", name, reads=reads, writes=[dst], num_partitions=P, free=F,
                  num_inputs=2 if C.is_tensor(src) else 1, nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, predicate), operands={"dst": dst, "predicate": predicate})


def max8(dst, src, name=None):
    """The 8 largest values of each partition of ``src``, descending, into ``dst`` [P, 8] (VectorE)."""
    inst = "max8"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst)
    C.tile(inst, "src", src)
    P, F = src.shape[0], src.elements_per_partition
    if not 8 <= F <= 16384:
        C.fail(inst, f"src must have 8 to 16384 elements per partition, got {F}")
    if len(dst.shape) != 2 or dst.shape[0] != P or dst.shape[1] != 8:
        C.fail(inst, f"dst must be [{P}, 8], got {tuple(dst.shape)}")
    x = C.read_f32(src)
    top = -np.sort(-x, axis=1)[:, :8]
    C.write(dst, top.astype(_F32))
    return C.emit(inst, "vector", name, reads=[src], writes=[dst], num_partitions=P, free=F,
                  num_inputs=1, nbytes=P * 8 * dst.dtype.itemsize, compute=(dst, src), reduce=True,
                  operands={"dst": dst, "src": src})


def nc_n_gather(dst, data, indices, name=None):
    """Per partition: ``dst[p, j] = flat(data[p])[indices[p, j]]`` on GpSimd (SBUF only, uint32 indices)."""
    inst = "nc_n_gather"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst, ("sbuf",))
    C.tile(inst, "data", data, ("sbuf",))
    C.tile(inst, "indices", indices, ("sbuf",))
    P, F = data.shape[0], data.elements_per_partition
    if indices.dtype.name != "uint32":
        C.fail(inst, f"indices must be uint32, got {indices.dtype}")
    if dst.dtype.name != data.dtype.name:
        C.fail(inst, f"dst dtype must equal data dtype {data.dtype}, got {dst.dtype}")
    for arg, t in (("indices", indices), ("dst", dst)):
        if t.shape[0] != P:
            C.fail(inst, f"{arg} has {t.shape[0]} partitions but data has {P} (must match)")
    if dst.elements_per_partition != indices.elements_per_partition:
        C.fail(inst, f"dst must have as many elements per partition as indices "
                     f"({indices.elements_per_partition}), got {dst.elements_per_partition}")
    idx = C.read_raw(indices).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= F):
        C.fail(inst, f"indices must lie in [0, {F}), got values up to {int(idx.max())}")
    vals = np.take_along_axis(C.read_raw(data), idx, axis=1)
    dst.write(vals.reshape(dst.shape))
    n = indices.elements_per_partition
    return C.emit(inst, "gpsimd", name, reads=[data, indices], writes=[dst], num_partitions=P,
                  free=n, num_inputs=2, nbytes=P * n * dst.dtype.itemsize,
                  compute=(dst, data, indices), operands={"dst": dst, "data": data, "indices": indices})


def _find8_checks(inst, dst, data, vals):
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    C.tile(inst, "vals", vals)
    P, F = data.shape[0], data.elements_per_partition
    if not 8 <= F <= 16384:
        C.fail(inst, f"data must have 8 to 16384 elements per partition, got {F}")
    if vals.shape[0] != P or vals.elements_per_partition != 8:
        C.fail(inst, f"vals must have {P} partitions and 8 elements per partition, got {tuple(vals.shape)}")
    return P, F


def nc_find_index8(dst, data, vals, name=None):
    """Index of the first occurrence of each of the 8 ``vals`` in each partition of ``data``.

    ``dst`` [P, 8] uint32 or uint16; a value that does not occur gives the
    all-ones sentinel. Duplicate vals pair with successive matches in
    ascending order (documented tie-break).
    """
    inst = "nc_find_index8"
    C.check_name(inst, name)
    P, F = _find8_checks(inst, dst, data, vals)
    if dst.dtype.name not in ("uint32", "uint16") or dst.shape[0] != P or dst.elements_per_partition != 8:
        C.fail(inst, f"dst must be [{P}, 8] uint32 or uint16, got {tuple(dst.shape)} {dst.dtype}")
    x, v = C.read_f32(data), C.read_f32(vals)
    sentinel = np.iinfo(dst.dtype.np).max
    out = np.full((P, 8), sentinel, dtype=np.int64)
    for p in range(P):
        used = set()
        for k in range(8):
            hits = [i for i in np.flatnonzero(x[p] == v[p, k]) if i not in used]
            if hits:
                out[p, k] = hits[0]
                used.add(hits[0])
    dst.write(out.astype(dst.dtype.np).reshape(dst.shape))
    return C.emit(inst, "vector", name, reads=[data, vals], writes=[dst], num_partitions=P, free=F,
                  num_inputs=1, nbytes=P * 8 * dst.dtype.itemsize, compute=(data,), reduce=True,
                  operands={"dst": dst, "data": data, "vals": vals})


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """``dst = data`` with the first occurrence of each of the 8 ``vals`` replaced by ``imm``.

    ``dst_idx`` (optional, [P, 8]) receives the matched positions; vals are
    processed in reverse order (i = 7..0), so duplicate vals fill their
    ``dst_idx`` columns in descending order (documented tie-break).
    """
    inst = "nc_match_replace8"
    C.check_name(inst, name)
    P, F = _find8_checks(inst, dst, data, vals)
    C.same_shape(inst, "data", data, "dst", dst)
    if not isinstance(imm, (int, float, np.integer, np.floating)) or isinstance(imm, bool):
        raise TypeError(f"{inst}: imm must be a float constant, got {type(imm).__name__}")
    if dst_idx is not None:
        C.tile(inst, "dst_idx", dst_idx)
        if dst_idx.shape[0] != P or dst_idx.elements_per_partition != 8:
            C.fail(inst, f"dst_idx must be [{P}, 8], got {tuple(dst_idx.shape)}")
    x, v = C.read_f32(data).copy(), C.read_f32(vals)
    idx = np.full((P, 8), -1, dtype=np.int64)
    matched = np.zeros_like(x, dtype=bool)
    for p in range(P):
        for k in range(7, -1, -1):
            hits = np.flatnonzero((x[p] == v[p, k]) & ~matched[p])
            if hits.size:
                matched[p, hits[0]] = True
                idx[p, k] = hits[0]
    x[matched] = np.float32(imm)
    C.write(dst, x)
    if dst_idx is not None:
        from ..dtypes import cast
        dst_idx.write(cast(idx, dst_idx.dtype).reshape(dst_idx.shape))
    return C.emit(inst, "vector", name, reads=[data, vals],
                  writes=[dst] + ([dst_idx] if dst_idx is not None else []), num_partitions=P, free=F,
                  num_inputs=1, nbytes=P * F * dst.dtype.itemsize, compute=(dst, data),
                  operands={"dst": dst, "data": data, "vals": vals})


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=None, name=None):
    """``dst = srcs[0] + srcs[1] + ...`` computed in float32 inside the DMA engines.

    ``reduce_op`` must be nl.add and ``scales`` None or all 1.0; 1 to 16
    sources with dst's element count; HBM or SBUF only. Read-modify-write
    scatter (``dst`` = an HBM ``.ap(vector_offset=...)`` view, one source
    the same view) and gather (one source an indirect HBM view) work because
    every operand is read through its (indirect) element positions.
    """
    from ._enums import oob_mode as _oob
    inst = "dma_compute"
    C.check_name(inst, name)
    oob_mode = _oob.error if oob_mode is None else check_enum(inst, "oob_mode", oob_mode, _oob)
    A.require_op(inst, "reduce_op", reduce_op, ("add",), "nl.add")
    if not isinstance(srcs, (list, tuple)) or not 1 <= len(srcs) <= 16:
        C.fail(inst, f"srcs must be a list of 1 to 16 tensors, got {srcs!r}")
    if scales is not None and (len(scales) != len(srcs) or any(float(s) != 1.0 for s in scales)):
        C.fail(inst, f"scales must be None or all 1.0 (one per source), got {scales!r}")
    if not unique_indices:
        C.fail(inst, "unique_indices=False is not supported (documented)")
    C.tile(inst, "dst", dst, ("hbm", "sbuf"), quadrant=False)
    n = dst.size
    for k, s in enumerate(srcs):
        C.tile(inst, f"srcs[{k}]", s, ("hbm", "sbuf"), quadrant=False)
        if s.size != n:
            C.fail(inst, f"srcs[{k}] has {s.size} elements but dst has {n} (must match)")
    ind = [t for t in [dst, *srcs] if t.indirection is not None]
    valid = None
    for t in ind:
        v = t.indirection.valid()
        if not v.all() and oob_mode is _oob.error:
            C.fail(inst, f"{t.indirection.kind}_offset value out of bounds [0, {t.indirection.bound})")
        valid = v if valid is None else valid & v
    acc = None
    for s in srcs:
        x = s.storage.flat(s.dtype.np)[s.elements(clamp_oob=True)].astype(np.float32).reshape(dst.shape)
        acc = x if acc is None else acc + x
    from ..dtypes import cast
    out = cast(acc, dst.dtype)
    pos = dst.elements(clamp_oob=True)
    flat = dst.storage.flat(dst.dtype.np)
    if not C.writable(dst):
        pass                       # a body whose loop runs zero times (sim.control)
    elif valid is None or valid.all():
        flat[pos] = out
    else:
        rows = valid.reshape((-1,) + (1,) * (len(dst.shape) - 1))
        keep = np.broadcast_to(rows, dst.shape)
        flat[pos[keep]] = out[keep]
    sb = dst if dst.storage.buffer == "sbuf" else next((s for s in srcs if s.storage.buffer == "sbuf"), None)
    parts = sb.shape[0] if sb is not None else 0
    nbytes = n * dst.dtype.itemsize
    return C.emit(inst, "dma", name, reads=list(srcs), writes=[dst], num_partitions=max(parts, 1),
                  free=n // max(dst.shape[0], 1), num_inputs=len(srcs), nbytes=nbytes * len(srcs),
                  attrs={"partitions": parts, "bytes_per_partition": nbytes // max(parts, 1),
                         "dge_mode": "swdge" if ind else "none", "indirect": bool(ind),
                         "transpose": False},
                  operands={"dst": dst})
