"""TensorE instructions: ``nc_matmul`` and ``nc_transpose``."""
from __future__ import annotations

import weakref

import numpy as np

from . import _core as C
from .. import control as _control
from ._blas import matmul_f64
from ._enums import check_enum, engine as _engine, matmul_perf_mode as _pm

_MM_IN = ("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32")
_FP32ISH = ("float32", "tfloat32")
_FP8 = ("float8_e4m3", "float8_e5m2", "float8_e4m3fn")

# Per-PSUM-storage bitmap "this element was last written by a matmul" (the
# accumulate=None rule: first matmul write overwrites, later ones add). Keyed
# by storage id and dropped with the storage.
_written: dict[tuple[int, int], np.ndarray] = {}


def _bitmap(t) -> np.ndarray:
    """The written-by-matmul bitmap of t's storage, in units of t's element size."""
    storage, isz = t.storage, t.dtype.itemsize
    key = (storage.id, isz)
    bm = _written.get(key)
    if bm is None:
        bm = np.zeros(storage.nbytes // isz, dtype=bool)
        _written[key] = bm
        weakref.finalize(storage, _written.pop, key, None)
    return bm


def _positions(t) -> np.ndarray:
    """Flat storage indices (units of t.dtype) of view ``t`` shaped [P, F]."""
    return t.elements().reshape(t.shape[0], -1)


def _bitmap_view(t) -> np.ndarray:
    """The bitmap entries of view ``t`` as a live strided view (bool: 1 byte per element)."""
    bm = _bitmap(t)
    return np.lib.stride_tricks.as_strided(bm[t.offset:], shape=t.shape, strides=t.strides)


def _tf32(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to tfloat32 (10 mantissa bits, nearest-even); inf/NaN kept.

    Applied to operands whose dtype is tfloat32 (stored as float32 in the
    simulator). The hardware's exact tf32 rounding is not documented; RNE is
    our assumption.
    """
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    finite = (b & 0x7F800000) != 0x7F800000
    r = ((b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000))
    return np.where(finite, r, b).view(np.float32)


def _tile_mode(inst, tile_position, tile_size, tgt, K, M, perf_mode):
    """Validate tiling mode; return (row_size, col_size)."""
    if not isinstance(tile_position, (tuple, list)) or not isinstance(tile_size, (tuple, list)):
        raise TypeError(f"{inst}: tile_position and tile_size must be tuples, "
                        f"got {type(tile_position).__name__} and {type(tile_size).__name__}")
    if len(tile_position) == 0 and len(tile_size) == 0:
        return 128, 128
    if len(tile_position) != 2 or len(tile_size) != 2:
        C.fail(inst, f"tile_position and tile_size must both be set as 2-tuples to enable tiling, "
                     f"got tile_position={tuple(tile_position)} tile_size={tuple(tile_size)}")
    rows, cols = (int(v) for v in tile_size)
    r0, c0 = (int(v) for v in tile_position)
    allowed = (128, 64) if tgt.nc_version == 2 else (128, 64, 32)
    if rows not in allowed or cols not in allowed:
        C.fail(inst, f"tile_size entries must be in {allowed} on {tgt.name}, got {tuple(tile_size)}")
    if r0 % rows or c0 % cols or not 0 <= r0 < 128 or not 0 <= c0 < 128:
        C.fail(inst, f"tile_position must be multiples of tile_size inside the 128x128 array, "
                     f"got tile_position={tuple(tile_position)} tile_size={tuple(tile_size)}")
    if perf_mode is _pm.double_row and cols != 128:
        C.fail(inst, "perf_mode=double_row cannot be combined with column tiling (tile_size[1] must be 128)")
    return rows, cols


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=_pm.none, name=None):
    """``dst[M, N] (=|+=) stationary[K, M].T @ moving[K, N]`` on TensorE.

    Operands in SBUF, ``dst`` in PSUM. Products are summed in float64 and
    rounded once to float32 (TensorE accumulates in fp32; float64 removes the
    dependence on summation order), then added to or written over PSUM:
    ``accumulate=False`` overwrites, ``True`` adds (error on an element no
    matmul has written: undefined behaviour on hardware), ``None`` decides per
    element — first matmul write overwrites, later ones add. Limits: K <= 128
    (or the row tile), M <= 128 (or the column tile), N <= 512 on trn1/trn2
    (4096 fp32 / 8192 bf16 dst on trn3); on trn1/trn2 ``dst`` is float32 and
    its bytes in each partition lie inside one 2 KiB PSUM bank.
    ``perf_mode=double_row`` (fp8 only, v3+): operands ``[K, 2, M]`` and
    ``[K, 2, N]`` contract over (partition, axis 1).
    ``is_transpose=True`` (v3+ transpose mode): ``moving`` must be an identity
    and ``dst = stationary.T`` bit-exactly in ``stationary``'s dtype.
    """
    inst = "nc_matmul"
    C.check_name(inst, name)
    perf_mode = check_enum(inst, "perf_mode", perf_mode, _pm)
    if accumulate not in (None, True, False):
        raise TypeError(f"{inst}: accumulate must be True, False or None, got {accumulate!r}")
    C.tile(inst, "dst", dst, ("psum",))
    C.tile(inst, "stationary", stationary, ("sbuf",))
    C.tile(inst, "moving", moving, ("sbuf",))
    if _control._state and _control._state[-1].frames:
        _control.psum_from_outside(inst, dst)
    tgt = C.target()
    sd, md, dd = stationary.dtype.name, moving.dtype.name, dst.dtype.name
    allowed_in = _MM_IN + (("float8_e4m3fn",) if tgt.nc_version >= 4 else ())
    for arg, d in (("stationary", sd), ("moving", md)):
        if d not in allowed_in:
            C.fail(inst, f"{arg} dtype must be one of {', '.join(allowed_in)} on {tgt.name}, got {d}")
    if (sd in _FP32ISH) != (md in _FP32ISH):
        C.fail(inst, f"a float32/tfloat32 operand must pair with float32/tfloat32, "
                     f"got stationary {sd} and moving {md}")
    if {sd, md} == {"float8_e4m3", "float8_e4m3fn"}:
        C.fail(inst, "legacy float8_e4m3 and OCP float8_e4m3fn cannot be mixed in one matmul")
    if is_transpose and tgt.nc_version >= 3:
        if dd != sd:
            C.fail(inst, f"is_transpose=True writes stationary's dtype: dst must be {sd}, got {dd}")
    elif tgt.nc_version >= 4:
        if dd not in ("float32", "bfloat16"):
            C.fail(inst, f"dst must be float32 or bfloat16 on {tgt.name}, got {dd}")
    elif dd != "float32":
        C.fail(inst, f"dst must be float32 on {tgt.name} (gen{tgt.nc_version}), got {dd}")

    K = stationary.shape[0]
    if moving.shape[0] != K:
        C.fail(inst, f"stationary and moving must have the same partition (contraction) size K, "
                     f"got {K} and {moving.shape[0]}")
    if perf_mode is _pm.double_row:
        if tgt.nc_version < 3:
            C.fail(inst, f"perf_mode=double_row needs NeuronCore-v3 or newer, target is {tgt.name}")
        fp8 = _FP8 if tgt.nc_version >= 4 else _FP8[:2]
        if sd not in fp8 or md not in fp8:
            C.fail(inst, f"perf_mode=double_row needs fp8 operands ({', '.join(fp8)}), got stationary {sd} "
                         f"and moving {md}")
        if is_transpose:
            C.fail(inst, "perf_mode=double_row cannot be combined with is_transpose")
        for arg, t in (("stationary", stationary), ("moving", moving)):
            if len(t.shape) < 3 or t.shape[1] != 2:
                C.fail(inst, f"perf_mode=double_row needs {arg} shaped [K, 2, ...], got {tuple(t.shape)}")
        M = stationary.elements_per_partition // 2
        N = moving.elements_per_partition // 2
    else:
        M = stationary.elements_per_partition
        N = moving.elements_per_partition
    rows, cols = _tile_mode(inst, tile_position, tile_size, tgt, K, M, perf_mode)
    if K > rows:
        C.fail(inst, f"contraction size K={K} (stationary/moving partitions) exceeds {rows}"
                     f"{' (row tile size)' if rows < 128 else ''}")
    if M > cols:
        C.fail(inst, f"stationary free size M={M} exceeds {cols}{' (column tile size)' if cols < 128 else ''}")
    nmax = tgt.matmul_n_max(dst.dtype.itemsize)
    if N > nmax:
        C.fail(inst, f"moving free size N={N} exceeds {nmax} on {tgt.name} "
                     f"(dst {dd}; one PSUM bank of fp32 on gen2/gen3)")
    if dst.shape[0] != M or dst.elements_per_partition != N:
        C.fail(inst, f"dst must have {M} partitions (stationary free size) and {N} elements per "
                     f"partition (moving free size), got shape {tuple(dst.shape)}")
    if tgt.nc_version <= 3:
        reg = dst.region()
        bank = tgt.psum_bank_bytes
        if reg.byte_start // bank != (reg.byte_stop - 1) // bank:
            C.fail(inst, f"dst bytes [{reg.byte_start}, {reg.byte_stop}) of each partition cross a "
                         f"{bank}-byte PSUM bank boundary (one bank per matmul on {tgt.name})")

    # ---- compute ----
    accumulated = False   # PSUM read-modify-write: dst is also read (traced)
    if is_transpose and tgt.nc_version >= 3:
        mv = C.read_f32(moving)
        if mv.shape != (K, N) or N != K or (
                not C.unrun() and not np.array_equal(mv, np.eye(K, N, dtype=np.float32))):
            C.fail(inst, f"is_transpose=True needs moving to be a {K}x{K} identity matrix")
        res = C.read_raw(stationary).T  # bit-exact, stationary's dtype
        pos = _positions(dst)
        if C.writable(dst):
            dst.storage.flat(dst.dtype.np)[pos] = res.reshape(pos.shape)
            _bitmap(dst)[pos] = True
    else:
        s = C.read_f32(stationary)
        m = C.read_f32(moving)
        if sd == "tfloat32":
            s = _tf32(s)
        if md == "tfloat32":
            m = _tf32(m)
        s = s.astype(np.float64)
        m = m.astype(np.float64)
        if perf_mode is _pm.double_row:
            s = s.reshape(K, 2, M).reshape(2 * K, M)
            m = m.reshape(K, 2, N).reshape(2 * K, N)
        prod = matmul_f64(s.T, m).astype(np.float32)
        bmv = _bitmap_view(dst)                      # live [dst.shape] view
        prev = bmv.reshape(M, N) if bmv.flags.c_contiguous else bmv.copy().reshape(M, N)
        if accumulate is True:
            # (a body whose loop runs zero times cannot know what earlier iterations wrote)
            if not prev.all() and tgt.nc_version <= 3 and C.writable(dst):
                C.fail(inst, "accumulate=True on PSUM elements no matmul has written (undefined behaviour "
                             "on hardware; use accumulate=False or None for the first matmul)")
            add = np.ones_like(prev)
        elif accumulate is False:
            add = np.zeros_like(prev)
        else:
            add = prev
        accumulated = bool(add.any())
        if accumulated:
            old = C.read_f32(dst)
            prod = np.where(add, old + prod, prod)
        C.write(dst, prod)
        if C.writable(dst):
            bmv[...] = True

    # quarter rate when an operand is full float32; tfloat32 with tfloat32 streams at the
    # BF16 rate (nki_spec §8.1: dense BF16/FP16/TF32 79 TFLOPS vs FP32 20 on trn2 [A2/NC3];
    # §8.2: MM II ~ max(N, 64) cycles for BF16/FP16/TF32/cFP8)
    fp32 = "float32" in (sd, md)
    onezero = bool(is_stationary_onezero or is_moving_onezero)
    return C.emit(inst, "tensor", name, reads=[stationary, moving] + ([dst] if accumulated else []),
                  writes=[dst],
                  num_partitions=K, free=N, num_inputs=2,
                  nbytes=M * N * dst.dtype.itemsize,
                  attrs={"K": K * (2 if perf_mode is _pm.double_row else 1), "M": M, "N": N,
                         "fp32": fp32, "onezero": onezero, "is_transpose": bool(is_transpose),
                         "perf_mode": perf_mode.value, "accumulate": accumulate},
                  operands={"dst": dst, "stationary": stationary, "moving": moving})


def nc_transpose(dst, data, engine=_engine.unknown, name=None):
    """``dst[F, P] = data[P, F]`` (free dims flattened), bit-exact, same dtype.

    TensorE: ``data`` SBUF up to [128, 128], ``dst`` PSUM. VectorE: up to
    [32, 32], SBUF or PSUM both sides. ``engine.unknown`` picks TensorE when
    ``data`` is in SBUF and ``dst`` in PSUM, else VectorE.
    """
    inst = "nc_transpose"
    C.check_name(inst, name)
    engine = check_enum(inst, "engine", engine, _engine)
    if engine not in (_engine.unknown, _engine.tensor, _engine.vector):
        C.fail(inst, f"engine must be engine.tensor, engine.vector or unknown, got {engine}")
    if not (C.is_tensor(dst) and C.is_tensor(data)):
        bad = "dst" if not C.is_tensor(dst) else "data"
        raise TypeError(f"{inst}: {bad} must be an NkiTensor")
    if engine is _engine.unknown:
        engine = (_engine.tensor if data.storage.buffer == "sbuf" and dst.storage.buffer == "psum"
                  else _engine.vector)
    if engine is _engine.tensor:
        C.tile(inst, "data", data, ("sbuf",))
        C.tile(inst, "dst", dst, ("psum",))
        if _control._state and _control._state[-1].frames:
            _control.psum_from_outside(inst, dst)
        lim = 128
    else:
        C.tile(inst, "data", data)
        C.tile(inst, "dst", dst)
        lim = 32
    P, F = data.shape[0], data.elements_per_partition
    if P > lim or F > lim:
        C.fail(inst, f"data shape [{P}, {F}] exceeds the {lim}x{lim} limit of "
                     f"{'TensorE' if lim == 128 else 'VectorE'}")
    if dst.dtype.name != data.dtype.name:
        C.fail(inst, f"dst dtype must equal data dtype {data.dtype}, got {dst.dtype}")
    if dst.shape[0] != F or dst.elements_per_partition != P:
        C.fail(inst, f"dst must be [{F}, {P}] (data transposed), got shape {tuple(dst.shape)}")
    if engine is _engine.tensor and C.target().nc_version <= 3:
        reg = dst.region()
        bank = C.target().psum_bank_bytes
        if reg.byte_start // bank != (reg.byte_stop - 1) // bank:
            C.fail(inst, f"dst bytes [{reg.byte_start}, {reg.byte_stop}) cross a {bank}-byte PSUM bank boundary")
    vals = C.read_raw(data).T
    dst.write(np.ascontiguousarray(vals).reshape(dst.shape))
    if engine is _engine.tensor:
        _bitmap(dst)[_positions(dst)] = True
        eng = "tensor"
        # TensorE transposes by a matmul: stationary = data [K=P, M=F], moving = identity [P, N=P]
        attrs = {"K": P, "M": F, "N": P, "fp32": data.dtype.itemsize == 4 and data.dtype.is_float,
                 "onezero": True, "is_transpose": True, "perf_mode": "none"}
        free = P
    else:
        eng = "vector"
        attrs = C.compute_attrs((dst, data))
        free = F
    return C.emit(inst, eng, name, reads=[data], writes=[dst], num_partitions=P, free=free,
                  num_inputs=1, nbytes=P * F * dst.dtype.itemsize, attrs=attrs,
                  operands={"dst": dst, "data": data})
