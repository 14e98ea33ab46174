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
    from .nki_scalar import NkiScalar
    from .registers import VirtualRegister
    if isinstance(offset, (VirtualRegister, NkiScalar)):   # run-time offsets (NKI 0.4.0+)
        offset = offset.runtime_value(inst)
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


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Gather within each 16-partition GpSimd core group (SBUF only).

    Per group, the group's ``index`` slice [16, n] (uint16) is flattened
    partition-first and its first ``num_valid_indices`` entries are element
    offsets into each partition's flattened ``src_buffer`` row; every
    partition of the group reads ``num_elem_per_idx`` contiguous elements at
    each offset: ``dst[p, j*E:(j+1)*E] = src[p, idx[j]:idx[j]+E]`` (semantics
    of the SDK's test_nki_isa_local_gather numpy reference). No casting.
    """
    inst = "local_gather"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst, ("sbuf",))
    C.tile(inst, "src_buffer", src_buffer, ("sbuf",))
    C.tile(inst, "index", index, ("sbuf",))
    P, F = src_buffer.shape[0], src_buffer.elements_per_partition
    if index.shape[0] != P or P % 16:
        C.fail(inst, f"src_buffer and index must have the same partition count, a multiple of 16; "
                     f"got {P} and {index.shape[0]}")
    if index.dtype.name != "uint16":
        C.fail(inst, f"index must be uint16, got {index.dtype}")
    if num_elem_per_idx not in (1, 2, 4, 8, 16, 32):
        C.fail(inst, f"num_elem_per_idx must be one of 1, 2, 4, 8, 16, 32, got {num_elem_per_idx!r}")
    per_core = 16 * index.elements_per_partition
    nv = per_core if num_valid_indices is None else num_valid_indices
    if not isinstance(nv, (int, np.integer)) or not 1 <= nv <= per_core:
        C.fail(inst, f"num_valid_indices must be an int in [1, {per_core}], got {num_valid_indices!r}")
    if nv > 4096:
        C.fail(inst, f"at most 4096 indices per GpSimd core, got {nv}")
    if dst.dtype.name != src_buffer.dtype.name:
        C.fail(inst, f"dst dtype must equal src_buffer dtype {src_buffer.dtype} (no casting), got {dst.dtype}")
    E = int(num_elem_per_idx)
    if dst.shape[0] != P or dst.elements_per_partition != nv * E:
        C.fail(inst, f"dst must have {P} partitions and {nv * E} elements per partition "
                     f"(num_valid_indices * num_elem_per_idx), got {tuple(dst.shape)}")
    src = C.read_raw(src_buffer)
    idx = C.read_raw(index).astype(np.int64)
    out = np.empty((P, nv * E), dtype=src.dtype)
    cols = np.arange(E, dtype=np.int64)
    for g in range(P // 16):
        flat = idx[16 * g:16 * (g + 1)].reshape(-1, order="F")[:nv]
        pos = (flat[:, None] + cols[None, :]).reshape(-1)
        if pos.size and pos.max() >= F:
            C.fail(inst, f"index value {int(flat.max())} + {E} runs past the {F} elements of src_buffer "
                         f"(out-of-bounds gathers are undefined on hardware)")
        out[16 * g:16 * (g + 1)] = src[16 * g:16 * (g + 1)][:, pos]
    dst.write(out.reshape(dst.shape))
    return C.emit(inst, "gpsimd", name, reads=[src_buffer, index], writes=[dst], num_partitions=P,
                  free=nv * E, num_inputs=2, nbytes=P * nv * E * dst.dtype.itemsize,
                  compute=(dst, src_buffer, index),
                  operands={"dst": dst, "src_buffer": src_buffer, "index": index})


def sequence_bounds(dst, segment_ids, name=None):
    """Per element of a [1, n] segment-id row: [start, end) of its segment as dst [1, 2, n].

    Segment id 0 is padding: start n, end -1. float32 or int32 in and out
    (semantics of the SDK's test_nki_isa_sequence_bounds numpy reference).
    """
    inst = "sequence_bounds"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst, ("sbuf",))
    C.tile(inst, "segment_ids", segment_ids, ("sbuf",))
    for arg, t in (("dst", dst), ("segment_ids", segment_ids)):
        if t.dtype.name not in ("float32", "int32"):
            C.fail(inst, f"{arg} must be float32 or int32, got {t.dtype}")
    if segment_ids.shape[0] != 1:
        C.fail(inst, f"segment_ids must have partition dimension 1, got {segment_ids.shape[0]}")
    n = segment_ids.elements_per_partition
    if dst.shape[0] != 1 or dst.elements_per_partition != 2 * n:
        C.fail(inst, f"dst must be (1, 2, {n}), got {tuple(dst.shape)}")
    s = C.read_f32(segment_ids).reshape(-1)
    if (s < 0).any() and not C.unrun():
        C.fail(inst, "segment ids must be non-negative")
    start = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    for i in range(n):
        start[i] = n if s[i] == 0 else (start[i - 1] if i and s[i] == s[i - 1] else i)
    for i in range(n - 1, -1, -1):
        end[i] = -1 if s[i] == 0 else (end[i + 1] if i < n - 1 and s[i] == s[i + 1] else i + 1)
    from ..dtypes import cast
    dst.write(cast(np.stack([start, end]).astype(np.float32), dst.dtype).reshape(dst.shape))
    return C.emit(inst, "gpsimd", name, reads=[segment_ids], writes=[dst], num_partitions=1, free=n,
                  num_inputs=1, nbytes=2 * n * dst.dtype.itemsize, compute=(dst, segment_ids),
                  operands={"dst": dst, "segment_ids": segment_ids})


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """Indices (+ index_offset) of the nonzero elements of each GpSimd core's first partition,
    then padding_val, then the count, in dst [P, F + 1] (int32; NeuronCore-v3+).

    Only partitions 0, 16, ..., 112 are read and written (one per core); other
    dst partitions are left unchanged.
    """
    inst = "nonzero_with_count"
    C.check_name(inst, name)
    if C.target().nc_version < 3:
        C.fail(inst, f"nonzero_with_count needs NeuronCore-v3 or newer, target is {C.target().name}")
    C.tile(inst, "dst", dst, ("sbuf",))
    C.tile(inst, "src", src, ("sbuf",))
    if src.dtype.name not in ("float32", "int32"):
        C.fail(inst, f"src must be float32 or int32, got {src.dtype}")
    if dst.dtype.name != "int32":
        C.fail(inst, f"dst must be int32, got {dst.dtype}")
    P, F = src.shape[0], src.elements_per_partition
    if dst.shape[0] != P or dst.elements_per_partition != F + 1:
        C.fail(inst, f"dst must have {P} partitions and {F + 1} elements per partition (src + 1), "
                     f"got {tuple(dst.shape)}")
    for arg, v in (("index_offset", index_offset), ("padding_val", padding_val)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{inst}: {arg} must be an int32 constant, got {v!r}")
    x = C.read_raw(src)
    out = C.read_raw(dst)
    rows = [r for r in range(P) if (src.partition_start + r) % 16 == 0]
    for r in rows:
        nz = np.flatnonzero(x[r] != 0)
        out[r, :] = int(padding_val)
        out[r, :nz.size] = nz + int(index_offset)
        out[r, F] = nz.size
    dst.write(out.reshape(dst.shape))
    return C.emit(inst, "gpsimd", name, reads=[src, dst], writes=[dst], num_partitions=P, free=F,
                  num_inputs=1, nbytes=P * (F + 1) * 4, compute=(dst, src), operands={"dst": dst, "src": src})
