"""DMA instructions: ``dma_copy`` (with casting and indirect gather/scatter), ``dma_transpose``."""
from __future__ import annotations

import warnings

import numpy as np

from . import _core as C
from .. import version as _version
from ..dtypes import cast
from ..errors import NkiReleasedUseWarning
from ._enums import check_enum, dge_mode as _dge, engine as _engine, oob_mode as _oob

_DMA_BUFFERS = ("hbm", "sbuf")
_GDN_TRANSPOSE = ("the released NKI-Lib 2.33 experimental/gdn kernels transpose with "
                  "dge_mode=nisa.dge_mode.none")


def _dma_operand(inst, arg, t):
    # DMA queues reach HBM and SBUF only; PSUM must be evicted with tensor_copy first.
    # The start-partition rule is an engine-lane rule and does not apply to DMA.
    return C.tile(inst, arg, t, _DMA_BUFFERS, quadrant=False)


def _indirect(t):
    """The Indirection of an ``.ap(scalar_offset=/vector_offset=)`` view, or None."""
    return getattr(t, "indirection", None)


def _check_index(inst, arg, ind, P):
    """Validate the index tensor of an indirect view (SBUF, int32/uint32, (P,1) for vector)."""
    idx = ind.index
    if not C.is_tensor(idx):   # scalar_offset from a register / NkiScalar: nothing in memory
        return
    C.tile(inst, f"{arg} {ind.kind}_offset", idx, ("sbuf",), quadrant=False)
    if idx.dtype.name not in ("int32", "uint32"):
        C.fail(inst, f"{arg} {ind.kind}_offset must be int32 or uint32, got {idx.dtype}")
    if ind.kind == "vector" and tuple(idx.shape) != (P, 1):
        C.fail(inst, f"{arg} vector_offset must have shape ({P}, 1) (one index per partition of "
                     f"the access), got shape {tuple(idx.shape)}")


def _valid_rows(inst, arg, t, oob):
    """Row mask [rows] of in-bounds index values; raises for oob_mode.error."""
    ind = t.indirection
    valid = ind.valid()
    if not valid.all() and oob is _oob.error:
        bad = int(ind.values()[~valid][0])
        C.fail(inst, f"{arg} {ind.kind}_offset value {bad} is out of bounds [0, {ind.bound}) "
                     f"(oob_mode=error; oob_mode.skip skips such rows)")
    return valid


def _nbytes(t):
    n = 1
    for s in t.shape:
        n *= s
    return n * t.dtype.itemsize


def _run_bytes(t, first_dim: int = 0) -> int:
    """Contiguous bytes of one run of view ``t`` (dims from ``first_dim`` on, innermost
    first, merged while each steps by the size of the ones inside it). For the cost
    model: a DMA descriptor moves one run (perf.costs.dma_plan)."""
    run = 1
    for d in range(len(t.shape) - 1, first_dim - 1, -1):
        if t.shape[d] == 1:
            continue
        if t.strides[d] != run:
            break
        run *= t.shape[d]
    return run * t.dtype.itemsize


def _convert(values: np.ndarray, src_dtype, dst_dtype) -> np.ndarray:
    """DMA cast: bit copy for equal dtypes, otherwise src -> fp32 -> dst (the dst write rounds)."""
    if src_dtype.np == dst_dtype.np:
        return values
    return values.astype(np.float32)


def dma_copy(dst, src, priority=None, oob_mode=_oob.error, dge_mode=_dge.unknown,
             engine=_engine.unknown, name=None):
    """``dst = src`` through the DMA queues (HBM/SBUF; never PSUM).

    Element counts must match (shapes may differ); dtypes may differ and are
    converted through float32, except with ``dge_mode.hwdge`` which needs equal
    dtypes. ``.ap(vector_offset=idx)`` on the HBM side gathers (src) or scatters
    (dst) one row per partition; out-of-range indices raise or, with
    ``oob_mode.skip``, leave the destination rows untouched.
    """
    inst = "dma_copy"
    C.check_name(inst, name)
    oob_mode = check_enum(inst, "oob_mode", oob_mode, _oob)
    dge_mode = check_enum(inst, "dge_mode", dge_mode, _dge)
    engine = check_enum(inst, "engine", engine, _engine)
    _dma_operand(inst, "dst", dst)
    _dma_operand(inst, "src", src)
    tgt = C.target()
    if priority is not None:
        if tgt.nc_version < 4:
            C.fail(inst, f"priority is NeuronCore-v4 (trn3) only, target is {tgt.name}")
        if not isinstance(priority, int) or not 0 <= priority <= 3:
            C.fail(inst, f"priority must be an int in 0..3, got {priority!r}")
    if engine not in (_engine.unknown, _engine.sync, _engine.scalar):
        C.fail(inst, f"engine must be engine.sync or engine.scalar (HWDGE issue engine) or unknown, got {engine}")
    if engine is not _engine.unknown and dge_mode is not _dge.hwdge:
        C.fail(inst, f"engine={engine} is only valid with dge_mode=hwdge, got dge_mode={dge_mode}")
    src_ind, dst_ind = _indirect(src), _indirect(dst)
    if src_ind is not None and dst_ind is not None:
        C.fail(inst, "indirect offsets on both src and dst are not supported (gather or scatter, not both)")
    indirect = src_ind is not None or dst_ind is not None
    vector_ind = any(i is not None and i.kind == "vector" for i in (src_ind, dst_ind))
    if dge_mode is _dge.hwdge:
        if tgt.nc_version < 3:
            C.fail(inst, f"dge_mode=hwdge needs NeuronCore-v3 or newer, target is {tgt.name}")
        if src.dtype.np != dst.dtype.np:
            C.fail(inst, f"dge_mode=hwdge requires equal dtypes (use .view() to reinterpret), "
                         f"got src {src.dtype} and dst {dst.dtype}")
        if vector_ind:
            C.fail(inst, "vector_offset gather/scatter needs dge_mode=swdge (or unknown), got hwdge")
    if indirect and dge_mode is _dge.none:
        C.fail(inst, "dynamic (scalar/vector offset) addresses need DGE (swdge, hwdge or unknown), got none")
    for arg, t, ind in (("src", src, src_ind), ("dst", dst, dst_ind)):
        if ind is not None and ind.kind == "vector" and t.storage.buffer != "hbm":
            C.fail(inst, f"{arg}: vector_offset indexes the HBM side; {arg} is in {t.storage.buffer.upper()}")
    n_src = int(np.prod(src.shape, dtype=np.int64))
    n_dst = int(np.prod(dst.shape, dtype=np.int64))
    if n_src != n_dst:
        C.fail(inst, f"src has {n_src} elements but dst has {n_dst} (total element counts must match)")

    if src_ind is not None:
        _check_index(inst, "src", src_ind, src.shape[0])
        valid = _valid_rows(inst, "src", src, oob_mode)
        vals = _convert(src.storage.flat(src.dtype.np)[src.elements(clamp_oob=True)],
                        src.dtype, dst.dtype)
        if src_ind.kind == "scalar":
            if valid.all():
                dst.write(vals.reshape(dst.shape))
        elif valid.all():
            dst.write(vals.reshape(dst.shape))
        else:
            # skipped rows leave dst untouched: merge with dst's current values
            if dst.shape[0] != src.shape[0]:
                C.fail(inst, "oob_mode=skip gather needs dst with the same leading size as src")
            cur = dst.read().reshape(dst.shape[0], -1)
            new = cast(vals.reshape(cur.shape[0], -1), dst.dtype)
            cur[valid] = new[valid]
            dst.write(cur.reshape(dst.shape))
    elif dst_ind is not None:
        _check_index(inst, "dst", dst_ind, dst.shape[0])
        valid = _valid_rows(inst, "dst", dst, oob_mode)
        pos = dst.elements(clamp_oob=True)
        vals = cast(_convert(src.read(), src.dtype, dst.dtype).reshape(pos.shape), dst.dtype)
        flat = dst.storage.flat(dst.dtype.np)
        if not C.writable(dst):
            pass                   # a body whose loop runs zero times (sim.control)
        elif dst_ind.kind == "scalar":
            if valid.all():
                flat[pos] = vals
        else:
            flat[pos[valid]] = vals[valid]
    else:
        vals = _convert(src.read(copy=False), src.dtype, dst.dtype)
        dst.write(vals.reshape(dst.shape))

    # trace: the SBUF side sets the partition count the DMA engines split over
    sb = dst if dst.storage.buffer == "sbuf" else (src if src.storage.buffer == "sbuf" else None)
    parts = sb.shape[0] if sb is not None else 0
    nbytes = max(_nbytes(src), _nbytes(dst))
    bpp = (_nbytes(sb) // max(parts, 1)) if sb is not None else nbytes
    # the HBM side's contiguous run (rows may merge), else the SBUF row's
    hb = src if src.storage.buffer == "hbm" else (dst if dst.storage.buffer == "hbm" else None)
    # (an indirect view gathers rows: its run is one row)
    run = _run_bytes(hb, 1 if indirect else 0) if hb is not None else (
        _run_bytes(sb, 1) if sb is not None else nbytes)
    free = (n_dst // dst.shape[0]) if dst.shape else n_dst
    reads = [src] + [i.index for i in (src_ind, dst_ind) if i is not None and C.is_tensor(i.index)]
    return C.emit(inst, "dma", name, reads=reads, writes=[dst], num_partitions=max(parts, 1),
                  free=free, num_inputs=1, nbytes=nbytes,
                  attrs={"partitions": parts, "bytes_per_partition": bpp, "run_bytes": run,
                         # vector gather/scatter forces software DGE
                         "dge_mode": "swdge" if vector_ind and dge_mode is _dge.unknown else dge_mode.name,
                         "indirect": indirect, "transpose": False},
                  operands={"dst": dst, "src": src})


_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}

# SBUF destinations of a DMA transpose start on 32-byte boundaries. Not in the API docs;
# nki-library states it where it allocates transpose destinations ("DMA transpose
# requires 32-byte alignment", experimental/moe/bwd/bwmm_bwd_dropless.py; "xbar
# transpose requires 32B alignment", core/mlp/mlp_cte/mlp_cte_allocation.py; align_to=32
# "align for dma transpose", core/attention/attention_cte.py). We require it of the
# view's start within its partition and of every contiguous run the view writes.
DMA_TRANSPOSE_ALIGN = 32


def _check_transpose_alignment(inst, dst):
    isz = dst.dtype.itemsize
    row = dst.storage.row_elements(isz)
    start = (dst.offset % row) * isz
    if start % DMA_TRANSPOSE_ALIGN:
        C.fail(inst, f"dst starts {start} bytes into its partition; DMA transpose destinations "
                     f"must start on a {DMA_TRANSPOSE_ALIGN}-byte boundary")
    for d in range(1, len(dst.shape) - 1):
        if dst.shape[d] > 1 and (dst.strides[d] * isz) % DMA_TRANSPOSE_ALIGN:
            C.fail(inst, f"dst dim {d} steps {dst.strides[d] * isz} bytes; every row a DMA "
                         f"transpose writes must start on a {DMA_TRANSPOSE_ALIGN}-byte boundary")


def _check_gather_transpose(inst, src, dst, dge_mode, tgt):
    """The documented constraints of the indirect (gather) transpose.

    Source: NKI API page nki.isa.dma_transpose, "DMA Indirect Transpose
    Constraints" (aws-neuron-sdk nki/api/nki/isa/__init__.py, SDK 2.28 through
    2.32), restated in the DGE deep dive (nki/deep-dives/nki-dge.rst, swdge):
    dge_mode unknown or swdge (lowered to a software-DGE dma_gather_transpose);
    4-D src needs src.shape[1] or src.shape[2] == 1; src.shape[-1] <= 128;
    2-byte dtype; src on HBM; indices 2-D, uint32, in SBUF;
    indices.shape[0] * indices.shape[1] >= src.shape[0]; src.shape[0] % 16 == 0;
    indices.shape[0] in [16, 128] and a multiple of 16; indices.shape[0] == 128
    when indices.shape[1] > 1; NeuronCore-v3 (trn2) or newer. The index is
    ``vector_offset`` of ``src.ap(..., indirect_dim=0)`` (the page's examples;
    nki-library attention_tkg.py passes a uint32 [128, 1] block table the same
    way, with dge_mode.swdge).
    """
    ind = src.indirection
    if ind.kind != "vector":
        # The API page's direct form is static and its indirect form is the vector_offset
        # gather. nki-library works around "dynamic access not supported by dma_transpose"
        # (issue NKI-415, core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py: dma_copy + PE
        # transpose for scalar_offset views) although nki-dge.rst's table lists
        # scalar_offset transposes as "Any mode": we follow the library's hardware report.
        C.fail(inst, "scalar_offset (dynamic start) transposes are not supported (nki-library "
                     "NKI-415 workaround: dma_copy + TensorE transpose); a dynamic transpose is "
                     "the vector_offset gather form")
    if _indirect(dst) is not None:
        C.fail(inst, "dst must be a static SBUF view; only src may be indirect (gather transpose)")
    if dge_mode not in (_dge.unknown, _dge.swdge):
        C.fail(inst, f"dge_mode must be unknown or swdge for an indirect (gather) transpose, "
                     f"got {dge_mode}")
    if tgt.nc_version < 3:
        C.fail(inst, f"indirect (gather) transpose needs NeuronCore-v3 (trn2) or newer, target "
                     f"is {tgt.name}")
    if src.storage.buffer != "hbm":
        C.fail(inst, "indirect transpose src must be on HBM")
    if src.dtype.itemsize != 2:
        C.fail(inst, f"indirect transpose src.dtype must be 2 bytes, got {src.dtype}")
    if src.shape[-1] > 128:
        C.fail(inst, f"indirect transpose needs src.shape[-1] <= 128, got {tuple(src.shape)}")
    if src.shape[0] % 16:
        C.fail(inst, f"indirect transpose needs src.shape[0] divisible by 16, got "
                     f"{tuple(src.shape)}")
    if len(src.shape) == 4 and src.shape[1] != 1 and src.shape[2] != 1:
        C.fail(inst, f"indirect transpose of a 4-D src needs src.shape[1] or src.shape[2] == 1, "
                     f"got {tuple(src.shape)}")
    idx = ind.index
    if len(idx.shape) != 2:
        C.fail(inst, f"indirect transpose indices must be 2-D, got shape {tuple(idx.shape)}")
    if idx.dtype.name != "uint32":
        C.fail(inst, f"indirect transpose indices must be uint32, got {idx.dtype}")
    if idx.storage.buffer != "sbuf":
        C.fail(inst, "indirect transpose indices must be in SBUF")
    pi, nc = idx.shape
    if not (16 <= pi <= 128 and pi % 16 == 0):
        C.fail(inst, f"indirect transpose indices.shape[0] must be in [16, 128] and divisible by "
                     f"16, got {tuple(idx.shape)}")
    if nc > 1 and pi != 128:
        C.fail(inst, f"indirect transpose indices.shape[0] must be 128 when indices.shape[1] > 1, "
                     f"got {tuple(idx.shape)}")
    if pi * nc < src.shape[0]:
        C.fail(inst, f"indirect transpose needs indices.shape[0] * indices.shape[1] >= "
                     f"src.shape[0] = {src.shape[0]}, got {tuple(idx.shape)}")


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=_dge.unknown,
                  oob_mode=_oob.error, name=None):
    """``dst = src.transpose(axes)`` by DMA: 2-D (1,0), 3-D (2,1,0), 4-D (3,1,2,0).

    ``dst`` in SBUF, ``src`` in HBM or SBUF, equal dtypes, ``dst.shape`` equal
    to the transposed ``src.shape`` (NKI 0.4.0+), ``dst`` 32-byte aligned (see
    DMA_TRANSPOSE_ALIGN). ``hwdge`` adds (NKI 0.5.0): 2-byte dtype,
    ``src.shape[0] == 16``, ``src.shape[-1] == 128``.

    Indirect (gather) transpose: ``src = hbm.ap(pattern, vector_offset=indices,
    indirect_dim=0)`` with uint32 ``indices [Pi, N]`` in SBUF gathers src row
    ``r`` from base row ``indices.T.flatten()[r]`` and transposes the gathered
    rows (constraints in ``_check_gather_transpose``). Out-of-bounds indices
    raise, or with ``oob_mode.skip`` leave the destination elements of that row
    untouched. A ``scalar_offset`` (dynamic start) transpose is rejected.
    """
    inst = "dma_transpose"
    C.check_name(inst, name)
    dge_mode = check_enum(inst, "dge_mode", dge_mode, _dge)
    oob_mode = check_enum(inst, "oob_mode", oob_mode, _oob)
    C.tile(inst, "dst", dst, ("sbuf",), quadrant=False)
    _dma_operand(inst, "src", src)
    tgt = C.target()
    if priority is not None and tgt.nc_version < 4:
        C.fail(inst, f"priority is NeuronCore-v4 (trn3) only, target is {tgt.name}")
    indirect = _indirect(src) is not None or _indirect(dst) is not None
    if indirect:
        if _indirect(src) is None:
            C.fail(inst, "dst must be a static SBUF view; only src may be indirect (gather transpose)")
        _check_gather_transpose(inst, src, dst, dge_mode, tgt)
    elif dge_mode is _dge.none and _version.at_least("0.7.0"):
        # the API page (SDK 2.32 - 2.34): "The only valid dge_mode s are unknown and hwdge"
        # for a direct transpose, while its dge_mode parameter lists none ("turn off DGE");
        # NKI-Lib 2.33's experimental/gdn kernels transpose with dge_mode=none: released
        # kernels win from NKI 0.7.0 on (a DMA without descriptor generation)
        warnings.warn(f"{inst}: dge_mode=none on a direct transpose; the API page allows "
                      f"unknown or hwdge, {_GDN_TRANSPOSE}, so it is accepted",
                      NkiReleasedUseWarning, stacklevel=2)
    elif dge_mode not in (_dge.unknown, _dge.hwdge):
        C.fail(inst, f"dge_mode must be unknown or hwdge for a direct transpose, got {dge_mode}")
    elif oob_mode is not _oob.error:
        # API page: oob_mode.skip "Only valid when src uses indirect indexing"
        C.fail(inst, "oob_mode.skip is only valid when src uses indirect indexing")
    if src.dtype.np != dst.dtype.np or src.dtype.name != dst.dtype.name:
        C.fail(inst, f"src.dtype must equal dst.dtype, got src {src.dtype} and dst {dst.dtype}")
    nd = len(src.shape)
    if nd not in _AXES:
        C.fail(inst, f"src must be 2-D, 3-D or 4-D, got shape {tuple(src.shape)}")
    perm = _AXES[nd]
    if axes is not None and tuple(axes) != perm:
        C.fail(inst, f"axes for a {nd}-D src must be {perm}, got {tuple(axes)}")
    want = tuple(src.shape[a] for a in perm)
    if tuple(dst.shape) != want:
        C.fail(inst, f"dst shape must equal the transposed src shape {want} (rank and sizes), "
                     f"got {tuple(dst.shape)}")
    if dge_mode is _dge.hwdge:
        if tgt.nc_version < 3:
            C.fail(inst, f"dge_mode=hwdge needs NeuronCore-v3 or newer, target is {tgt.name}")
        if src.dtype.itemsize != 2:
            C.fail(inst, f"dge_mode=hwdge transposes 2-byte dtypes only, got {src.dtype}")
        # NKI 0.5.0 (our target) rules: src.shape[0] == 16 and src.shape[-1] == 128; NKI
        # 0.6.0 relaxed them to {1,2,4,8,16} and <= 128 (release notes 0.6.0, "DmaTranspose
        # relaxations"), which a 0.5.0 compiler rejects
        s0 = src.shape[0]
        if s0 != 16:
            C.fail(inst, f"dge_mode=hwdge transpose needs src.shape[0] == 16 on NKI 0.5.0, got "
                         f"{tuple(src.shape)}")
        if src.shape[-1] != 128:
            C.fail(inst, f"dge_mode=hwdge transpose needs src.shape[-1] == 128 on NKI 0.5.0, got "
                         f"{tuple(src.shape)}")
    _check_transpose_alignment(inst, dst)
    if indirect:
        valid = _valid_rows(inst, "src", src, oob_mode)
        vals = src.storage.flat(src.dtype.np)[src.elements(clamp_oob=True)]
        if not valid.all():
            # skipped rows keep dst's values: row r of src is dst[..., r]
            cur = dst.read().transpose(np.argsort(perm))
            vals = np.where(valid.reshape((-1,) + (1,) * (nd - 1)), vals, cur)
        dst.write(np.ascontiguousarray(vals.transpose(perm)))
    else:
        vals = src.read().transpose(perm)
        dst.write(np.ascontiguousarray(vals))
    parts = dst.shape[0]
    nb = _nbytes(dst)
    reads = [src] + ([src.indirection.index] if indirect else [])
    return C.emit(inst, "dma", name, reads=reads, writes=[dst], num_partitions=parts,
                  free=dst.elements_per_partition, num_inputs=1, nbytes=nb,
                  attrs={"partitions": parts, "bytes_per_partition": nb // max(parts, 1),
                         # the gather form is lowered to software DGE (dma_gather_transpose)
                         "dge_mode": "swdge" if indirect else dge_mode.name,
                         "indirect": indirect, "transpose": True},
                  operands={"dst": dst, "src": src})
