"""NkiTensor: a strided view over a Storage (docs/contracts.md, nki_spec.md §3.6).

A ``Storage`` is one allocation: a flat NumPy array plus the buffer it lives
in. On-chip storage (SBUF, PSUM) of shape ``[P, f1, f2, ...]`` keeps partition
``p`` at flat elements ``[p*F, (p+1)*F)`` with ``F = f1*f2*...``. An
``NkiTensor`` addresses element ``(i0, .., i_{n-1})`` at flat element
``offset + sum(strides[k] * i_k)`` of the storage reinterpreted as the view's
dtype. Views (indexing, view methods, ``reshape``, ``view(dtype)``, ``.ap``)
never copy.

Rules enforced here (others belong to the instructions in sim.isa):

- on-chip tensors are at least 2-D, partition dim first, <= 128 partitions,
  contiguous partitions (no partition step), free access patterns that stay
  inside each partition row;
- indexing: an integer on the partition dim of an on-chip tensor keeps a
  size-1 dim; an integer on a free dim drops it unless the result would be
  < 2-D (then the last integer-indexed dim is kept with size 1); on HBM an
  integer drops the dim (result at least 1-D);
- slices must lie inside the dim (no silent clamping) and have step >= 1.

Indirect views (``.ap(scalar_offset=/vector_offset=)``, ``select(dim,
tensor)``, ``vector_select``) carry an :class:`Indirection`; their index
values are read when an instruction accesses them. They cannot be sliced
further in this simulator.
"""
from __future__ import annotations

import math
from enum import Enum

import numpy as np

from . import dtypes as _dt
from . import memory as _memory
from .control import SUPPRESS_FLOOR as _SUPPRESS
from .errors import NkiValidationError
from .trace import Region

PMAX = 128

_new = object.__new__


def _make_region(buffer, storage_id, p0, nparts, b0, b1) -> Region:
    """Region(...) without the frozen-dataclass __init__ (faster; same object)."""
    r = _new(Region)
    _slot_buffer(r, buffer)
    _slot_storage_id(r, storage_id)
    _slot_partition_start(r, p0)
    _slot_num_partitions(r, nparts)
    _slot_byte_start(r, b0)
    _slot_byte_stop(r, b1)
    return r


# Region has __slots__ (one small record per operand of every traced instruction): its
# frozen fields are set through the slot descriptors
_slot_buffer = Region.buffer.__set__
_slot_storage_id = Region.storage_id.__set__
_slot_partition_start = Region.partition_start.__set__
_slot_num_partitions = Region.num_partitions.__set__
_slot_byte_start = Region.byte_start.__set__
_slot_byte_stop = Region.byte_stop.__set__


# --------------------------------------------------------------------------- buffers

class MemoryRegion(Enum):
    """nl.sbuf, nl.psum, nl.private_hbm (= nl.hbm), nl.shared_hbm."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __eq__(self, other):
        if isinstance(other, MemoryRegion):
            return self is other
        if isinstance(other, BufferName):
            return other.region is self
        if isinstance(other, str):
            return other == self.value or (other == "hbm" and self is MemoryRegion.private_hbm)
        return NotImplemented

    def __hash__(self):
        return hash(self.value)

    def __repr__(self):
        return f"nl.{self.value}"

    @property
    def kind(self) -> str:
        """Storage buffer name: "sbuf", "psum" or "hbm"."""
        return self._kind


for _m in MemoryRegion:
    # plain attribute: `kind` is read on every allocation and Enum __eq__ is slow
    object.__setattr__(_m, "_kind", "hbm" if _m.value.endswith("hbm") else _m.value)
del _m


class BufferName(str):
    """The ``buffer`` of a tensor: "sbuf", "psum" or "hbm" (a str, as the
    contract says), which also compares equal to its ``MemoryRegion`` so
    kernel code like ``t.buffer == nl.shared_hbm`` works."""

    region: MemoryRegion

    def __new__(cls, region: MemoryRegion) -> "BufferName":
        self = super().__new__(cls, region.kind)
        self.region = region
        return self

    def __eq__(self, other):
        if isinstance(other, MemoryRegion):
            return other is self.region
        return str.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


_BUFFER_NAMES = {r: BufferName(r) for r in MemoryRegion}


def as_region(buffer, what: str = "buffer") -> MemoryRegion:
    """The MemoryRegion for nl.sbuf / nl.psum / nl.hbm / ... or their names."""
    if isinstance(buffer, MemoryRegion):
        return buffer
    if isinstance(buffer, BufferName):
        return buffer.region
    if isinstance(buffer, str):
        name = "private_hbm" if buffer == "hbm" else buffer
        try:
            return MemoryRegion(name)
        except ValueError:
            pass
    raise TypeError(f"{what}: expected nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or "
                    f"nl.shared_hbm, got {buffer!r}")


# --------------------------------------------------------------------------- storage

_next_id = [1]


def next_storage_id() -> int:
    """The id the next Storage will get (ids only grow: a storage with a smaller id is older)."""
    return _next_id[0]


class Storage:
    """One allocation: ``data`` is flat, in ``dtype`` (NumPy / ml_dtypes), or in float32 for
    a low-precision float ``dtype`` under ``NKI_PRECISE_FP=0`` (``widened``: no rounding,
    byte sizes and addresses still those of ``dtype``; no bitcast views)."""

    __slots__ = ("id", "buffer", "kind", "dtype", "shape", "data", "name",
                 "bytes_per_partition", "widened", "_flats", "_tracker", "__weakref__")

    def __init__(self, region: MemoryRegion, shape: tuple[int, ...], dtype, data: np.ndarray,
                 name: str = ""):
        self.id = _next_id[0]
        _next_id[0] += 1
        self.buffer = region.kind                  # "sbuf" | "psum" | "hbm"
        self.kind = region                         # MemoryRegion (shared/private for HBM)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.data = data
        self.name = name
        free = math.prod(self.shape[1:])
        self.bytes_per_partition = free * self.dtype.itemsize
        self.widened = data.dtype != self.dtype
        self._flats: dict[np.dtype, np.ndarray] = {self.dtype: data}
        self._tracker = None  # sim.memory tracker recording this storage's accesses, if any

    @property
    def on_chip(self) -> bool:
        return self.buffer != "hbm"

    @property
    def nbytes(self) -> int:
        """Bytes on the device (``dtype``'s size, also for a widened storage)."""
        return self.data.size * self.dtype.itemsize

    def flat(self, np_dtype: np.dtype) -> np.ndarray:
        """The storage reinterpreted as a flat array of ``np_dtype`` (a widened storage: only
        as its own ``dtype``, which gives the float32 data)."""
        arr = self._flats.get(np_dtype)
        if arr is None:
            if self.widened:
                raise NotImplementedError(
                    f"a bitcast view ({np.dtype(np_dtype)}) of a {self.dtype} tensor stored as "
                    f"float32 under {_dt.PRECISE_FP_ENV}=0; run with {_dt.PRECISE_FP_ENV}=1")
            arr = self.data.view(np.uint8).view(np_dtype)
            self._flats[np_dtype] = arr
        return arr

    def row_elements(self, itemsize: int) -> int:
        """Elements of ``itemsize`` bytes per partition row (on-chip)."""
        return self.bytes_per_partition // itemsize

    def __repr__(self):
        return f"Storage(id={self.id}, {self.kind.value}, {self.shape}, {self.dtype}, name={self.name!r})"


def _sentinel(dtype: _dt.DType):
    # the SDK simulator fills new memory with NaN (4 for integers) so reads of
    # unwritten memory show up
    return np.nan if dtype.is_float else 4


def _check_shape(shape, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{what}: shape must be a tuple of positive ints, got {shape!r}")
    out = []
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"{what}: shape must be a tuple of positive ints, got {tuple(shape)!r}")
        if n <= 0:
            raise NkiValidationError(f"{what}: every dim must be positive, got shape {tuple(shape)}")
        out.append(int(n))
    if not out:
        raise NkiValidationError(f"{what}: shape must have at least one dim, got ()")
    return tuple(out)


def allocate(shape, dtype, buffer=MemoryRegion.sbuf, name: str = "", fill=None,
             what: str = "nl.ndarray") -> "NkiTensor":
    """A new tensor on ``buffer`` filled with ``fill`` (default: the NaN / 4 sentinel).

    On-chip: at least 2-D, ``shape[0] <= 128``; counted by sim.memory.
    """
    shape = _check_shape(shape, what)
    d = _dt.as_dtype(dtype, f"{what} dtype")
    region = as_region(buffer, f"{what} buffer")
    if region.kind != "hbm":
        if len(shape) < 2:
            raise NkiValidationError(
                f"{what}: on-chip ({region.value}) tensors need at least 2 dims "
                f"(partition, free), got shape {shape}")
        if shape[0] > PMAX:
            raise NkiValidationError(
                f"{what}: partition dim (shape[0]) must be <= {PMAX}, got {shape[0]} in shape {shape}")
    size = math.prod(shape)
    held = _dt.storage_np(d)
    if fill is None:
        data = np.full(size, _sentinel(d), dtype=held)
    else:
        data = np.full(size, _dt.cast(np.asarray(fill), d) if held == d.np else fill, dtype=held)
    storage = Storage(region, shape, d.np, data, name)
    if region.kind != "hbm":
        _memory.track(storage, f"{name or 'tensor'} {shape} {d} on {region.value}")
    return NkiTensor._full(storage, d, name)


def from_array(array: np.ndarray, buffer=MemoryRegion.shared_hbm, name: str = "") -> "NkiTensor":
    """An HBM tensor holding a copy of ``array`` (kernel arguments)."""
    a = np.asarray(array)
    d = _dt.from_numpy(a.dtype)
    region = as_region(buffer)
    shape = _check_shape(a.shape if a.ndim else (1,), f"argument {name or 'array'}")
    data = np.array(a, dtype=_dt.storage_np(d), copy=True).reshape(-1)
    storage = Storage(region, shape, d.np, data, name)
    if region.kind != "hbm":
        _memory.track(storage, f"{name or 'tensor'} {shape} {d} on {region.value}")
    return NkiTensor._full(storage, d, name)


# --------------------------------------------------------------------------- nl.ds

class DynSlice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""

    __slots__ = ("start", "size")

    def __init__(self, start, size):
        for arg, v in (("start", start), ("size", size)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"nl.ds: {arg} must be an int, got {v!r}")
        if size <= 0:
            raise NkiValidationError(f"nl.ds: size must be positive, got {size}")
        self.start = int(start)
        self.size = int(size)

    def as_slice(self) -> slice:
        return slice(self.start, self.start + self.size)

    def __repr__(self):
        return f"nl.ds({self.start}, {self.size})"


# --------------------------------------------------------------------------- indirection

class Indirection:
    """Run-time indexing of a view: an SBUF index tensor (or, for ``scalar_offset``, a
    VirtualRegister or an NkiScalar) read at access time.

    ``kind`` "scalar": one index (a 1x1 tensor) moves the whole view by
    ``index * stride`` elements. ``kind`` "vector": row ``r`` (dim 0) of the
    view starts at ``index[r] * stride`` (gather / scatter of rows).
    ``bound`` is the size of the indexed dim; ``limit`` (<= bound, set when
    the view is made) is the exclusive upper bound of index values whose
    access stays inside the storage. Valid values are ``0 <= v < limit``.

    ``rows`` (vector only) is the view's leading size. An index tensor of
    shape ``(rows, 1)`` gives one index per row (the ``dma_copy`` form); any
    other 2-D index ``(Pi, N)`` with ``Pi * N >= rows`` is read column-major,
    ``indices.T.flatten()[:rows]`` -- the form only the indirect
    ``dma_transpose`` accepts (``flattened``; NKI API nki.isa.dma_transpose,
    "DMA Indirect Transpose Constraints", SDK 2.28-2.32).
    """

    __slots__ = ("kind", "index", "stride", "bound", "limit", "rows")

    def __init__(self, kind: str, index: "NkiTensor", stride: int, bound: int, rows=None):
        self.kind = kind
        self.index = index
        self.stride = int(stride)
        self.bound = int(bound)
        self.limit = int(bound)
        self.rows = rows

    @property
    def flattened(self) -> bool:
        """A vector index that is not one ``(rows, 1)`` column (gather-transpose form)."""
        return (self.kind == "vector" and self.rows is not None
                and tuple(self.index.shape) != (self.rows, 1))

    def values(self) -> np.ndarray:
        """The index values now, int64: shape (1,) for scalar, (rows,) for vector."""
        if _SUPPRESS:
            # a body whose loop runs zero times: its offsets are garbage; address index 0
            n = 1 if self.kind == "scalar" else (self.rows if self.rows is not None
                                                 else self.index.size)
            return np.zeros(n, dtype=np.int64)
        if not isinstance(self.index, NkiTensor):   # a VirtualRegister / NkiScalar
            return np.array([self.index.runtime_value("scalar_offset")], dtype=np.int64)
        v = self.index.read()
        if self.kind == "vector" and self.rows is not None:
            # column-major: flat position j * Pi + p holds index[p, j]
            return v.reshape(v.shape[0], -1).T.reshape(-1)[:self.rows].astype(np.int64)
        return v.reshape(-1).astype(np.int64)

    def valid(self) -> np.ndarray:
        """Boolean mask of index values inside ``[0, limit)``."""
        v = self.values()
        return (v >= 0) & (v < self.limit)

    def offsets(self, clamp: bool = False, what: str = "indirect access") -> np.ndarray:
        """Element offsets the index values add (out-of-bounds -> error, or 0 with clamp)."""
        v = self.values()
        bad = (v < 0) | (v >= self.limit)
        if bad.any():
            if not clamp:
                i = int(np.flatnonzero(bad)[0])
                raise NkiValidationError(
                    f"{what}: index value {int(v[i])} at position {i} of {self.kind}_offset is "
                    f"out of bounds [0, {self.limit}) (indexed dim size {self.bound})")
            v = np.where(bad, 0, v)
        return v * self.stride


def _check_index_tensor(t, what: str, kind: str, columns: bool = False) -> None:
    if not isinstance(t, NkiTensor):
        raise TypeError(f"{what}: {kind}_offset must be an SBUF NkiTensor, got {type(t).__name__}")
    if t.storage.buffer != "sbuf":
        raise NkiValidationError(f"{what}: {kind}_offset must be in SBUF, got {t.buffer}")
    if not t.dtype.is_int:
        raise NkiValidationError(f"{what}: {kind}_offset must have an integer dtype "
                                 f"(int32/uint32), got {t.dtype}")
    if kind == "scalar" and t.size != 1:
        raise NkiValidationError(f"{what}: scalar_offset must be a 1x1 tensor, got shape {t.shape}")
    if kind == "vector" and (t.ndim != 2 or (t.shape[1] != 1 and not columns)):
        raise NkiValidationError(f"{what}: vector_offset must have shape (P, 1), got {t.shape}")


def _check_scalar_offset(v, what: str, on_chip: bool) -> None:
    """A ``scalar_offset``: a 1x1 integer SBUF tile, a VirtualRegister or (NKI 0.7.0+) an
    NkiScalar: int32 on SBUF / PSUM, int32 or int64 on HBM, signed (nki.isa.scalar_load API
    page, SDK 2.34: "A signed scalar can be used as a scalar_offset ... on an SBUF or PSUM
    operand the offset must be nl.int32")."""
    from .isa.nki_scalar import NkiScalar
    from .isa.registers import VirtualRegister
    if isinstance(v, VirtualRegister):
        return
    if isinstance(v, NkiScalar):
        if v.unusable is not None:
            raise NkiValidationError(f"{what}: scalar_offset: {v.unusable}")
        if v.dtype.name == "uint32" or (on_chip and v.dtype.name != "int32"):
            raise NkiValidationError(
                f"{what}: a {v.dtype} NkiScalar as scalar_offset of an "
                f"{'on-chip' if on_chip else 'HBM'} tensor; the offset must be a signed scalar, "
                "nl.int32 on SBUF / PSUM (nki.isa.scalar_load API page)")
        return
    _check_index_tensor(v, what, "scalar")


# --------------------------------------------------------------------------- helpers

def _norm_dim(dim, ndim: int, what: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{what}: dim must be an int, got {dim!r}")
    d = int(dim) + ndim if dim < 0 else int(dim)
    if not 0 <= d < ndim:
        raise NkiValidationError(f"{what}: dim {dim} out of range for a {ndim}-D tensor")
    return d


def _row_major_strides(shape) -> list[int]:
    """Element strides of a dense row-major array of ``shape``."""
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return strides


def _nocopy_strides(old_shape, old_strides, new_shape) -> list[int] | None:
    """Strides giving ``new_shape`` over the same elements without a copy, or None.

    Same algorithm as NumPy's no-copy reshape: each group of old dims that
    merges into a group of new dims must be contiguous.
    """
    old = [(n, s) for n, s in zip(old_shape, old_strides) if n != 1]
    new_strides = [1] * len(new_shape)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new_shape) and oi < len(old):
        np_, op = new_shape[ni], old[oi][0]
        while np_ != op:
            if np_ < op:
                np_ *= new_shape[nj]
                nj += 1
            else:
                op *= old[oj][0]
                oj += 1
        for ok in range(oi, oj - 1):
            if old[ok][1] != old[ok + 1][0] * old[ok + 1][1]:
                return None
        new_strides[nj - 1] = old[oj - 1][1]
        for nk in range(nj - 1, ni, -1):
            new_strides[nk - 1] = new_strides[nk] * new_shape[nk]
        ni, nj = nj, nj + 1
        oi, oj = oj, oj + 1
    return new_strides


def _resolve_minus_one(shape, total: int, what: str) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{what}: shape must be a tuple of ints, got {shape!r}")
    shape = [int(n) if isinstance(n, (int, np.integer)) and not isinstance(n, bool) else n
             for n in shape]
    if any(not isinstance(n, int) for n in shape):
        raise TypeError(f"{what}: shape must be a tuple of ints, got {tuple(shape)!r}")
    if shape.count(-1) > 1:
        raise NkiValidationError(f"{what}: at most one -1 allowed, got {tuple(shape)}")
    if -1 in shape:
        known = int(np.prod([n for n in shape if n != -1], dtype=np.int64))
        if known <= 0 or total % known:
            raise NkiValidationError(f"{what}: cannot infer -1 in {tuple(shape)} for {total} elements")
        shape[shape.index(-1)] = total // known
    if any(n <= 0 for n in shape):
        raise NkiValidationError(f"{what}: dims must be positive, got {tuple(shape)}")
    if int(np.prod(shape, dtype=np.int64)) != total:
        raise NkiValidationError(
            f"{what}: element count must stay {total}, got shape {tuple(shape)} "
            f"({int(np.prod(shape, dtype=np.int64))} elements)")
    return tuple(shape)


# --------------------------------------------------------------------------- NkiTensor

class NkiTensor:
    """A view of a Storage: ``shape``, ``strides`` (elements), ``offset``, ``dtype``.

    ``buffer`` is "sbuf" / "psum" / "hbm" (also equal to its nl.* region),
    ``dtype`` an NKI dtype (a str such as "bfloat16" carrying ``.np``).
    """

    __slots__ = ("storage", "shape", "strides", "offset", "dtype", "name", "indirection",
                 "_np", "_elems", "_region", "__weakref__")

    def __init__(self, shape, dtype, storage: Storage | None = None, buffer=MemoryRegion.sbuf,
                 name: str = ""):
        """Bind a full view to ``storage``, or allocate a new one when it is None."""
        if storage is None:
            t = allocate(shape, dtype, buffer, name)
            storage, shape, dtype = t.storage, t.shape, t.dtype
        if not isinstance(storage, Storage):
            raise TypeError(f"NkiTensor: storage must be a Storage, got {type(storage).__name__}")
        d = _dt.as_dtype(dtype, "NkiTensor dtype")
        shape = _check_shape(shape, "NkiTensor")
        if int(np.prod(shape)) * d.itemsize != storage.nbytes:
            raise NkiValidationError(f"NkiTensor: shape {shape} of {d} does not cover storage "
                                     f"{storage.shape} of {storage.dtype}")
        strides = _row_major_strides(shape)
        self._init(storage, shape, tuple(strides), 0, d, name, None)

    # -- construction ---------------------------------------------------------
    def _init(self, storage, shape, strides, offset, dtype, name, indirection):
        self.storage = storage
        self.shape = shape
        self.strides = strides
        self.offset = offset
        self.dtype = dtype
        self.name = name
        self.indirection = indirection
        self._np = None
        self._elems = None
        self._region = None

    @classmethod
    def _full(cls, storage: Storage, dtype: _dt.DType, name: str) -> "NkiTensor":
        shape = storage.shape
        strides = _row_major_strides(shape)
        t = object.__new__(cls)
        t._init(storage, shape, tuple(strides), 0, dtype, name, None)
        return t

    def _derive(self, shape, strides, offset, dtype=None, indirection=None,
                what: str = "view") -> "NkiTensor":
        t = object.__new__(NkiTensor)
        t._init(self.storage, tuple(shape), tuple(strides), offset, dtype or self.dtype,
                self.name, indirection)
        t._check_bounds(what)
        return t

    def _span(self, first: int, indirect: bool = True) -> tuple[int, int]:
        """Lowest and highest element offset (relative to ``offset``) over dims
        ``first..``; with ``indirect``, including every value the indirection
        may add (index values in ``[0, limit)``)."""
        ind = self.indirection
        lo = hi = 0
        for k in range(first, len(self.shape)):
            if k == 0 and ind is not None and ind.kind == "vector":
                continue
            n, s = self.shape[k], self.strides[k]
            if s > 0:
                hi += s * (n - 1)
            else:
                lo += s * (n - 1)
        if indirect and ind is not None:
            hi += ind.stride * (ind.limit - 1)
        return lo, hi

    def _set_limit(self, start: int, hi: int, last: int, what: str) -> None:
        """Largest index value range keeping elements ``start + hi + v*stride <= last``."""
        ind = self.indirection
        room = (last - start - hi) // ind.stride + 1 if ind.stride > 0 else ind.bound
        ind.limit = min(ind.bound, room)
        if ind.limit < 1:
            raise NkiValidationError(
                f"{what}: access pattern {self.get_pattern()} at offset {self.offset} leaves the "
                f"storage even with {ind.kind}_offset 0")

    def _check_bounds(self, what: str) -> None:
        """The view addresses only its storage, and on-chip only whole rows."""
        ind = self.indirection
        if not self.storage.on_chip:
            flat_len = self.storage.nbytes // self.dtype.itemsize
            lo, hi = self._span(0, indirect=False)
            if ind is not None:
                self._set_limit(self.offset, hi, flat_len - 1, what)
            if self.offset + lo < 0 or self.offset + hi >= flat_len:
                raise NkiValidationError(
                    f"{what}: access pattern {self.get_pattern()} at offset {self.offset} reaches "
                    f"elements [{self.offset + lo}, {self.offset + hi}] outside the storage of "
                    f"{flat_len} elements (shape {self.storage.shape})")
            return
        F = self.storage.row_elements(self.dtype.itemsize)
        if self.shape[0] > 1 and self.strides[0] != F:
            raise NkiValidationError(
                f"{what}: on-chip partitions must be contiguous (partition step "
                f"{self.strides[0]} elements, expected the row size {F}); shape {self.shape}")
        if self.shape[0] > PMAX:
            raise NkiValidationError(f"{what}: partition dim must be <= {PMAX}, got {self.shape[0]}")
        p0, r0 = divmod(self.offset, F)
        lo, hi = self._span(1, indirect=False)
        if ind is not None:
            self._set_limit(r0, hi, F - 1, what)
        if r0 + lo < 0 or r0 + hi >= F:
            raise NkiValidationError(
                f"{what}: free access pattern {self.get_pattern()[1:]} at row offset {r0} reaches "
                f"elements [{r0 + lo}, {r0 + hi}] outside the partition row of {F} elements")
        if p0 < 0 or p0 + self.shape[0] > self.storage.shape[0]:
            raise NkiValidationError(
                f"{what}: partitions [{p0}, {p0 + self.shape[0]}) outside the storage's "
                f"{self.storage.shape[0]} partitions")

    # -- attributes -----------------------------------------------------------
    @property
    def buffer(self) -> BufferName:
        return _BUFFER_NAMES[self.storage.kind]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def on_chip(self) -> bool:
        return self.storage.buffer != "hbm"

    @property
    def partition_start(self) -> int:
        """First partition (on-chip); 0 for HBM."""
        if self.storage.buffer == "hbm":
            return 0
        return self.offset // self.storage.row_elements(self.dtype.itemsize)

    @property
    def num_partitions(self) -> int:
        """``shape[0]``: partitions on-chip; for HBM the leading dim a DMA maps to partitions."""
        return self.shape[0]

    @property
    def elements_per_partition(self) -> int:
        """``prod(shape[1:])`` (1 for a 1-D tensor)."""
        n = 1
        for s in self.shape[1:]:
            n *= s
        return n

    @property
    def inner_stride(self) -> int:
        """Stride of the innermost dim of size > 1 (1 when there is none)."""
        start = 1 if self.storage.buffer != "hbm" else 0
        for n, s in zip(reversed(self.shape[start:]), reversed(self.strides[start:])):
            if n > 1:
                return s
        return 1

    def is_contiguous_free(self) -> bool:
        """Free dims (all dims on HBM) are dense row-major, ignoring size-1 dims."""
        start = 1 if self.storage.buffer != "hbm" else 0
        expect = 1
        for n, s in zip(reversed(self.shape[start:]), reversed(self.strides[start:])):
            if n == 1:
                continue
            if s != expect:
                return False
            expect *= n
        return True

    def is_contiguous(self) -> bool:
        """NKI's is_contiguous: row-major over the free dims on-chip, over all dims on HBM."""
        return self.indirection is None and self.is_contiguous_free()

    def is_indirect(self) -> bool:
        return self.indirection is not None

    def get_pattern(self) -> list[list[int]]:
        return [[s, n] for s, n in zip(self.strides, self.shape)]

    def __repr__(self):
        ind = f", indirect={self.indirection.kind}" if self.indirection else ""
        return (f"NkiTensor(shape={self.shape}, dtype={self.dtype}, buffer={self.storage.kind.value}, "
                f"strides={self.strides}, offset={self.offset}, name={self.name!r}{ind})")

    def __iter__(self):
        raise TypeError("NkiTensor is not iterable; loop over range(t.shape[d]) and index")

    def __bool__(self):
        raise TypeError("NkiTensor has no truth value at trace time; compare values with nisa ops")

    def __setitem__(self, key, value):
        raise TypeError("NkiTensor item assignment is the legacy NKI style; write into a view "
                        "with an nisa instruction, e.g. nisa.tensor_copy(dst=t[...], src=x)")

    # -- data access (used by sim.isa) ----------------------------------------
    def _flat(self) -> np.ndarray:
        return self.storage.flat(self.dtype.np)

    def _array(self) -> np.ndarray:
        """Live NumPy view of a direct (non-indirect) tensor."""
        v = self._np
        if v is None:
            flat = self._flat()
            isz = flat.itemsize       # the dtype's size, or 4 for a widened storage
            v = np.ndarray(self.shape, flat.dtype, buffer=flat,
                           offset=self.offset * isz, strides=tuple(s * isz for s in self.strides))
            self._np = v
        return v

    def elements(self, clamp_oob: bool = False) -> np.ndarray:
        """Flat storage element indices (in units of ``dtype``), int64, shaped ``shape``.

        For indirect views the index tensor is read now; out-of-bounds index
        values raise NkiValidationError, or with ``clamp_oob`` address index 0
        (callers skip those rows with ``indirection.valid()``).
        """
        tr = self.storage._tracker
        if tr is not None:
            tr.touch(self.storage.id)
        e = self._elems
        if e is None:
            e = np.full(self.shape, self.offset, dtype=np.int64)
            for k, (n, s) in enumerate(zip(self.shape, self.strides)):
                if n > 1 and s != 0:
                    shp = [1] * len(self.shape)
                    shp[k] = n
                    e = e + (np.arange(n, dtype=np.int64) * s).reshape(shp)
            e = np.broadcast_to(e, self.shape)
            self._elems = e
        ind = self.indirection
        if ind is None:
            return e
        off = ind.offsets(clamp=clamp_oob)
        if ind.kind == "scalar":
            return e + off[0]
        if off.shape[0] != self.shape[0]:
            raise NkiValidationError(f"indirect access: vector_offset has {off.shape[0]} rows, "
                                     f"the view has {self.shape[0]}")
        return e + off.reshape((-1,) + (1,) * (len(self.shape) - 1))

    def read(self, copy: bool = True) -> np.ndarray:
        """The values, shaped ``shape``, in the storage dtype of ``dtype``.

        ``copy=False`` returns a live view for a direct tensor (read-only use:
        callers must not write into it); indirect views always copy.
        """
        tr = self.storage._tracker
        if tr is not None:      # capacity by access liveness (sim.memory)
            tr.touch(self.storage.id)
        if self.indirection is None:
            v = self._array()
            return v.copy() if copy else v
        return self._flat()[self.elements()]

    def write(self, values) -> None:
        """Store ``values`` (broadcast to ``shape``) with NKI rounding (dtypes.cast)."""
        tr = self.storage._tracker
        if tr is not None:
            tr.touch(self.storage.id)
        if _SUPPRESS and self.storage.id < _SUPPRESS[0]:
            return      # a body whose loop runs zero times: traced, no effect (sim.control)
        vals = (np.asarray(values, dtype=np.float32) if self.storage.widened
                else _dt.cast(values, self.dtype))
        if self.indirection is None:
            self._array()[...] = vals
        else:
            self._flat()[self.elements()] = np.broadcast_to(vals, self.shape)

    def region(self) -> Region:
        """The memory span this view touches (trace.Region; strided -> covering span)."""
        r = self._region
        if r is not None:
            return r
        isz = self.dtype.itemsize
        storage = self.storage
        on_chip = storage.buffer != "hbm"
        if self.indirection is None:
            lo = hi = 0
            for n, s in zip(self.shape[1:] if on_chip else self.shape,
                            self.strides[1:] if on_chip else self.strides):
                if s > 0:
                    hi += s * (n - 1)
                elif s < 0:
                    lo += s * (n - 1)
        else:
            lo, hi = self._span(1 if on_chip else 0)
        if not on_chip:
            r = _make_region("hbm", storage.id, 0, 1, (self.offset + lo) * isz,
                             (self.offset + hi + 1) * isz)
        else:
            p0, r0 = divmod(self.offset, storage.bytes_per_partition // isz)
            r = _make_region(storage.buffer, storage.id, p0, self.shape[0], (r0 + lo) * isz,
                             (r0 + hi + 1) * isz)
        self._region = r
        return r

    # -- indexing ---------------------------------------------------------------
    def _no_indirect(self, what: str) -> None:
        if self.indirection is not None:
            raise NkiValidationError(f"{what}: views of an indirect tensor "
                                     "(scalar/vector offset) are not supported; index the base "
                                     "tensor first, then apply the offset")

    def __getitem__(self, key) -> "NkiTensor":
        # Hot path (kernels index tiles in every instruction): one pass over the
        # dims, no re-validation of the result (in-range indexing of a valid view
        # stays valid), and the NumPy view derived by slicing the parent's.
        if self.indirection is not None:
            self._no_indirect("NkiTensor indexing")
        if type(key) is not tuple:
            key = (key,)
        shape_in = self.shape
        ndim = len(shape_in)
        if len(key) != ndim or Ellipsis in key:
            key = self._expand_key(key, ndim)
        on_chip = self.storage.buffer != "hbm"
        shape: list[int] = []
        strides: list[int] = []
        np_key: list = []
        dropped: list[tuple[int, int, int, int]] = []
        offset = self.offset
        d = 0
        for k, n, s in zip(key, shape_in, self.strides):
            tk = type(k)
            if tk is slice:
                if k.start is None and k.stop is None and k.step is None:
                    shape.append(n)
                    strides.append(s)
                    np_key.append(k)
                    d += 1
                    continue
                start, stop, step = self._slice_bounds(k, n, d)
                if on_chip and d == 0 and step != 1:
                    raise NkiValidationError(
                        "NkiTensor indexing: partition dim cannot be strided (step "
                        f"{step}); partitions of an instruction operand are contiguous")
                shape.append((stop - start + step - 1) // step)
                strides.append(s * step)
                offset += start * s
                np_key.append(slice(start, stop, step))
            elif tk is DynSlice:
                start, size = k.start, k.size
                if start < 0 or start + size > n:
                    raise NkiValidationError(
                        f"NkiTensor indexing: {k!r} on dim {d} of shape {shape_in} is out of range")
                shape.append(size)
                strides.append(s)
                offset += start * s
                np_key.append(slice(start, start + size))
            elif (tk is int or isinstance(k, np.integer)) and tk is not bool:
                i = int(k)
                if i < 0:
                    i += n
                if not 0 <= i < n:
                    raise NkiValidationError(
                        f"NkiTensor indexing: index {int(k)} out of range for dim {d} of size "
                        f"{n} (shape {shape_in})")
                offset += i * s
                if on_chip and d == 0:
                    shape.append(1)
                    strides.append(s)
                    np_key.append(slice(i, i + 1))
                else:
                    dropped.append((len(shape), s, len(np_key), i))
                    np_key.append(i)
            elif isinstance(k, NkiTensor):
                raise NkiValidationError(
                    f"NkiTensor indexing: tensor index on dim {d}; use t.select({d}, index_tensor) "
                    "or .ap(scalar_offset=...) for dynamic indexing")
            else:
                raise TypeError(f"NkiTensor indexing: index on dim {d} must be an int, slice, "
                                f"nl.ds or '...', got {tk.__name__}")
            d += 1
        min_nd = 2 if on_chip else 1
        while len(shape) < min_nd and dropped:
            pos, s, kpos, i = dropped.pop()
            shape.insert(pos, 1)
            strides.insert(pos, s)
            np_key[kpos] = slice(i, i + 1)
        t = object.__new__(NkiTensor)
        t.storage = self.storage
        t.shape = tuple(shape)
        t.strides = tuple(strides)
        t.offset = offset
        t.dtype = self.dtype
        t.name = self.name
        t.indirection = None
        t._elems = None
        t._region = None
        parent = self._np
        t._np = None if parent is None else parent[tuple(np_key)]
        return t

    def _expand_key(self, key: tuple, ndim: int) -> tuple:
        n_ell = sum(1 for k in key if k is Ellipsis)
        if n_ell > 1:
            raise NkiValidationError(f"NkiTensor indexing: at most one '...' allowed, got {key!r}")
        if n_ell:
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            fill = ndim - (len(key) - 1)
            if fill < 0:
                raise NkiValidationError(f"NkiTensor indexing: too many indices ({len(key) - 1}) "
                                         f"for shape {self.shape}")
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
        if len(key) > ndim:
            raise NkiValidationError(f"NkiTensor indexing: too many indices ({len(key)}) for "
                                     f"shape {self.shape}")
        return key + (slice(None),) * (ndim - len(key))

    def _slice_bounds(self, k: slice, n: int, d: int) -> tuple[int, int, int]:
        """Resolved (start, stop, step) of slice ``k`` on a dim of size ``n``; no clamping."""
        start, stop, step = k.start, k.stop, k.step
        if type(start) is int and type(stop) is int and step is None and 0 <= start < stop <= n:
            return start, stop, 1  # the common `a:b` case
        for nm, v in (("start", start), ("stop", stop), ("step", step)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise TypeError(f"NkiTensor indexing: slice {nm} on dim {d} must be an int, got {v!r}")
        step = 1 if step is None else int(step)
        if step < 1:
            raise NkiValidationError(f"NkiTensor indexing: slice step on dim {d} must be >= 1, got {step}")
        start = 0 if start is None else int(start)
        stop = n if stop is None else int(stop)
        if start < 0:
            start += n
        if stop < 0:
            stop += n
        if not (0 <= start < stop <= n):
            raise NkiValidationError(
                f"NkiTensor indexing: slice {k.start}:{k.stop} on dim {d} of shape {self.shape} "
                f"is out of range or empty (resolved {start}:{stop})")
        return start, stop, step

    # -- 0.5.0 view methods -----------------------------------------------------
    def slice(self, dim: int, start: int, end: int, step: int = 1) -> "NkiTensor":
        what = "NkiTensor.slice"
        d = _norm_dim(dim, self.ndim, what)
        if not (0 <= start < end <= self.shape[d]):
            raise NkiValidationError(f"{what}: need 0 <= start < end <= {self.shape[d]} on dim {d}, "
                                     f"got start={start}, end={end}")
        if step < 1:
            raise NkiValidationError(f"{what}: step must be >= 1, got {step}")
        key = [slice(None)] * self.ndim
        key[d] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index) -> "NkiTensor":
        """Static (int) or dynamic (1x1 SBUF tensor) selection of one index, removing ``dim``."""
        what = "NkiTensor.select"
        self._no_indirect(what)
        d = _norm_dim(dim, self.ndim, what)
        on_chip = self.storage.buffer != "hbm"
        if isinstance(index, NkiTensor):
            if on_chip and d == 0:
                raise NkiValidationError(f"{what}: dynamic select on the partition dim of an "
                                         "on-chip tensor is not allowed")
            _check_index_tensor(index, what, "scalar")
            shape = self.shape[:d] + self.shape[d + 1:]
            strides = self.strides[:d] + self.strides[d + 1:]
            if on_chip and len(shape) < 2:
                raise NkiValidationError(f"{what}: result would be {len(shape)}-D; on-chip tensors "
                                         "need 2 dims")
            if not shape:
                shape, strides = (1,), (1,)
            ind = Indirection("scalar", index, self.strides[d], self.shape[d])
            return self._derive(shape, strides, self.offset, indirection=ind, what=what)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"{what}: index must be an int or an NkiTensor, got {index!r}")
        if not 0 <= index < self.shape[d]:
            raise NkiValidationError(f"{what}: index {index} out of range [0, {self.shape[d]}) on dim {d}")
        key = [slice(None)] * self.ndim
        key[d] = int(index)
        return self[tuple(key)]

    def vector_select(self, dim: int, vector_offset: "NkiTensor") -> "NkiTensor":
        """Row ``r`` of the result is row ``vector_offset[r]`` of dim 0 (HBM only)."""
        what = "NkiTensor.vector_select"
        self._no_indirect(what)
        if dim != 0:
            raise NkiValidationError(f"{what}: dim must be 0, got {dim}")
        if self.storage.buffer != "hbm":
            raise NkiValidationError(f"{what}: only HBM tensors, got {self.buffer}")
        _check_index_tensor(vector_offset, what, "vector")
        ind = Indirection("vector", vector_offset, self.strides[0], self.shape[0])
        shape = (vector_offset.shape[0],) + self.shape[1:]
        return self._derive(shape, (0,) + self.strides[1:], self.offset, indirection=ind, what=what)

    def permute(self, dims) -> "NkiTensor":
        what = "NkiTensor.permute"
        self._no_indirect(what)
        dims = tuple(int(x) for x in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise NkiValidationError(f"{what}: dims must be a permutation of range({self.ndim}), got {dims}")
        if self.on_chip and dims[0] != 0:
            raise NkiValidationError(f"{what}: on-chip tensors keep the partition dim first "
                                     f"(dims[0] must be 0), got {dims}")
        return self._derive([self.shape[i] for i in dims], [self.strides[i] for i in dims],
                            self.offset, what=what)

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        what = "NkiTensor.broadcast"
        self._no_indirect(what)
        d = _norm_dim(dim, self.ndim, what)
        if self.on_chip and d == 0:
            raise NkiValidationError(f"{what}: cannot broadcast the partition dim of an on-chip tensor")
        if self.shape[d] != 1:
            raise NkiValidationError(f"{what}: dim {d} must have size 1, got {self.shape[d]}")
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise NkiValidationError(f"{what}: size must be a positive int, got {size!r}")
        shape, strides = list(self.shape), list(self.strides)
        shape[d], strides[d] = int(size), 0
        return self._derive(shape, strides, self.offset, what=what)

    def expand_dim(self, dim: int) -> "NkiTensor":
        what = "NkiTensor.expand_dim"
        self._no_indirect(what)
        d = _norm_dim(dim, self.ndim + 1, what)
        if self.on_chip and d == 0:
            raise NkiValidationError(f"{what}: cannot insert a dim before the partition dim")
        return self._derive(self.shape[:d] + (1,) + self.shape[d:],
                            self.strides[:d] + (0,) + self.strides[d:], self.offset, what=what)

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        what = "NkiTensor.squeeze_dim"
        self._no_indirect(what)
        d = _norm_dim(dim, self.ndim, what)
        if self.shape[d] != 1:
            raise NkiValidationError(f"{what}: dim {d} must have size 1, got {self.shape[d]}")
        if self.on_chip and (d == 0 or self.ndim <= 2):
            raise NkiValidationError(f"{what}: on-chip tensors keep the partition dim and at "
                                     f"least 2 dims (shape {self.shape}, dim {d})")
        if self.ndim == 1:
            raise NkiValidationError(f"{what}: cannot squeeze a 1-D tensor")
        return self._derive(self.shape[:d] + self.shape[d + 1:],
                            self.strides[:d] + self.strides[d + 1:], self.offset, what=what)

    def reshape_dim(self, dim: int, shape) -> "NkiTensor":
        what = "NkiTensor.reshape_dim"
        self._no_indirect(what)
        d = _norm_dim(dim, self.ndim, what)
        parts = _resolve_minus_one(shape, self.shape[d], what)
        if self.on_chip and d == 0 and sum(1 for p in parts if p != 1) > 0 and len(parts) > 1:
            raise NkiValidationError(f"{what}: cannot split the partition dim of an on-chip tensor")
        s = self.strides[d]
        new_strides = [0] * len(parts)
        acc = s
        for i in range(len(parts) - 1, -1, -1):
            new_strides[i] = acc
            acc *= parts[i]
        return self._derive(self.shape[:d] + parts + self.shape[d + 1:],
                            self.strides[:d] + tuple(new_strides) + self.strides[d + 1:],
                            self.offset, what=what)

    def flatten_dims(self, start_dim: int, end_dim: int) -> "NkiTensor":
        what = "NkiTensor.flatten_dims"
        self._no_indirect(what)
        a = _norm_dim(start_dim, self.ndim, what)
        b = _norm_dim(end_dim, self.ndim, what)
        if a > b:
            raise NkiValidationError(f"{what}: start_dim {start_dim} > end_dim {end_dim}")
        if self.on_chip and a == 0:
            raise NkiValidationError(f"{what}: on-chip tensors cannot merge the partition dim "
                                     "(start_dim must be > 0)")
        st = _nocopy_strides(self.shape[a:b + 1], self.strides[a:b + 1],
                             (int(np.prod(self.shape[a:b + 1])),))
        if st is None:
            raise NkiValidationError(f"{what}: dims {a}..{b} of shape {self.shape} with strides "
                                     f"{self.strides} are not contiguous")
        return self._derive(self.shape[:a] + (int(np.prod(self.shape[a:b + 1])),) + self.shape[b + 1:],
                            self.strides[:a] + (st[0],) + self.strides[b + 1:], self.offset, what=what)

    def reshape(self, shape) -> "NkiTensor":
        what = "NkiTensor.reshape"
        self._no_indirect(what)
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        new = _resolve_minus_one(shape, self.size, what)
        # NkiTensor.reshape "fails if the current memory layout is incompatible
        # with the requested shape (e.g. after a non-contiguous slice or
        # permute)"; the compiler front end rejects any non-simple access
        # pattern, so require a dense row-major view even where NumPy could
        # re-stride without a copy.
        if not self.is_contiguous_free():
            raise NkiValidationError(
                f"{what}: the view of shape {self.shape} with strides {self.strides} is not "
                f"contiguous (a non-contiguous slice or permute); reshape needs a dense "
                f"row-major view: index or slice the reshaped base tensor instead")
        if self.on_chip:
            if len(new) < 2 or new[0] != self.shape[0]:
                raise NkiValidationError(f"{what}: on-chip reshape must keep the partition dim "
                                         f"{self.shape[0]} first and 2+ dims, got {new}")
            # a contiguous view keeps its partition stride; the free dims re-stride densely
            strides = [self.strides[0]] + _row_major_strides(new[1:])
        else:
            strides = _row_major_strides(new)
        return self._derive(new, strides, self.offset, what=what)

    def view(self, dtype) -> "NkiTensor":
        """Reinterpret the bytes as ``dtype``; the last dim scales by the size ratio."""
        what = "NkiTensor.view"
        self._no_indirect(what)
        d = _dt.as_dtype(dtype, f"{what} dtype")
        old, new = self.dtype.itemsize, d.itemsize
        if old == new:
            return self._derive(self.shape, self.strides, self.offset, dtype=d, what=what)
        if self.shape[-1] > 1 and self.strides[-1] != 1:
            raise NkiValidationError(f"{what}: the last dim must be contiguous (stride 1), "
                                     f"got stride {self.strides[-1]}")
        shape = list(self.shape)
        if new < old:
            r = old // new
            shape[-1] *= r
            strides = [s * r for s in self.strides[:-1]] + [1]
            offset = self.offset * r
        else:
            r = new // old
            if shape[-1] % r or self.offset % r or any(s % r for s in self.strides[:-1]):
                raise NkiValidationError(
                    f"{what}: {self.dtype} -> {d} needs the last dim ({shape[-1]}), offset and "
                    f"outer strides divisible by {r}")
            shape[-1] //= r
            strides = [s // r for s in self.strides[:-1]] + [1]
            offset = self.offset // r
        if self.on_chip and self.storage.bytes_per_partition % new:
            raise NkiValidationError(f"{what}: partition row of {self.storage.bytes_per_partition} "
                                     f"bytes is not a whole number of {d}")
        return self._derive(shape, strides, offset, dtype=d, what=what)

    reinterpret_cast = view

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0,
           dtype=None) -> "NkiTensor":
        """An explicit access pattern ``[[step, num], ...]`` (outermost first) over the storage.

        The pattern replaces this view's shape and strides; its start is this view's
        storage offset plus ``offset`` elements (of ``dtype``; None adds nothing). The
        NkiTensor.ap API docstring says so ("element offset added to the view's base storage
        offset ... offset=N shifts by N additional elements"; aws-neuron-sdk 81ce03ae
        nki/api/nki/language/__init__.py l.504-507) and released kernels rely on it
        (nki-library e9ef98fc experimental/gdn/gdn_cte.py: ``k[batch_id].ap(pattern=...,
        offset=group_base * D)`` loads batch ``batch_id``'s tokens, "device-verified"); the
        language guide's "ignoring the ... offset of the view it is called on" (its
        "Tensor Values" warning) contradicts them, and released kernels win.
        On-chip, the first pair is the partition pair and its step must equal
        the storage row size.
        """
        what = "NkiTensor.ap"
        self._no_indirect(what)
        d = self.dtype if dtype is None else _dt.as_dtype(dtype, f"{what} dtype")
        if not isinstance(pattern, (list, tuple)) or not pattern:
            raise TypeError(f"{what}: pattern must be a non-empty list of [step, num] pairs, got {pattern!r}")
        steps, nums = [], []
        for pair in pattern:
            if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                    or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in pair)):
                raise TypeError(f"{what}: each pattern entry must be [step, num] ints, got {pair!r}")
            if pair[1] < 1:
                raise NkiValidationError(f"{what}: num must be >= 1, got {pair!r}")
            steps.append(int(pair[0]))
            nums.append(int(pair[1]))
        base_bytes = self.offset * self.dtype.itemsize
        if base_bytes % d.itemsize:
            raise NkiValidationError(f"{what}: view offset of {base_bytes} bytes is not a "
                                     f"whole number of {d} elements")
        start = base_bytes // d.itemsize
        if offset is not None:
            if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
                raise TypeError(f"{what}: offset must be an int, got {offset!r}")
            start += int(offset)
        if self.on_chip:
            F = self.storage.row_elements(d.itemsize)
            if len(nums) < 2:
                raise NkiValidationError(f"{what}: on-chip patterns need a partition pair and at "
                                         f"least one free pair, got {pattern}")
            if len(nums) > 5:
                raise NkiValidationError(
                    f"{what}: on-chip access patterns have a partition pair and at most 4 free "
                    f"dims, got {len(nums)} pairs")
            if steps[0] != F:
                raise NkiValidationError(
                    f"{what}: on-chip partition step must equal the storage's free size {F} "
                    f"(elements of {d} per partition), got {steps[0]}")
        if scalar_offset is not None and vector_offset is not None:
            raise NkiValidationError(f"{what}: give scalar_offset or vector_offset, not both")
        ind = None
        if scalar_offset is not None or vector_offset is not None:
            sshape = self.storage.shape
            if isinstance(indirect_dim, bool) or not isinstance(indirect_dim, (int, np.integer)) \
                    or not 0 <= indirect_dim < len(sshape):
                raise NkiValidationError(f"{what}: indirect_dim must be in [0, {len(sshape)}) for "
                                         f"storage shape {sshape}, got {indirect_dim!r}")
            row = int(np.prod(sshape[indirect_dim + 1:], dtype=np.int64)) * self.storage.dtype.itemsize
            if row % d.itemsize:
                raise NkiValidationError(f"{what}: indirect stride of {row} bytes is not a whole "
                                         f"number of {d}")
            stride = row // d.itemsize
            if scalar_offset is not None:
                if self.on_chip and indirect_dim == 0:
                    raise NkiValidationError(f"{what}: scalar_offset on the partition dim of an "
                                             "on-chip tensor is not allowed (indirect_dim must be > 0)")
                _check_scalar_offset(scalar_offset, what, self.on_chip)
                ind = Indirection("scalar", scalar_offset, stride, sshape[indirect_dim])
            else:
                if self.on_chip:
                    raise NkiValidationError(f"{what}: vector_offset indexes HBM tensors only, "
                                             f"got {self.buffer}")
                if indirect_dim != 0:
                    raise NkiValidationError(f"{what}: vector_offset needs indirect_dim=0, got {indirect_dim}")
                # 2-D (Pi, N) indices cover Pi * N leading rows column-major: the
                # gather-transpose form (see Indirection; dma_copy takes (P, 1) only)
                _check_index_tensor(vector_offset, what, "vector", columns=True)
                pi, nc = vector_offset.shape
                if pi * nc < nums[0]:
                    raise NkiValidationError(
                        f"{what}: vector_offset of shape {tuple(vector_offset.shape)} covers "
                        f"{pi * nc} rows, the pattern's leading num is {nums[0]} (one index per "
                        f"row: ({nums[0]}, 1); column-major 2-D indices: Pi * N >= {nums[0]})")
                ind = Indirection("vector", vector_offset, stride, sshape[0], rows=nums[0])
                steps[0] = 0  # the leading step comes from the base tensor's row size
        return self._derive(nums, steps, start, dtype=d, indirection=ind, what=what)

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None) -> "NkiTensor":
        """einops-style view: split grouped src dims, reorder, merge grouped dst dims.

        ``t.rearrange(('b', ('h', 'w')), ('b', 'w', 'h'), {'h': 4})`` on a
        (128, 24) tile gives (128, 6, 4). Built from reshape_dim, permute and
        flatten_dims, so their rules (partition dim, contiguity) apply.
        """
        what = "NkiTensor.rearrange"
        self._no_indirect(what)
        sizes = dict(fixed_sizes or {})
        if not isinstance(sizes, dict) or any(not isinstance(k, str) for k in sizes):
            raise TypeError(f"{what}: fixed_sizes must be a dict of str -> int, got {fixed_sizes!r}")
        src = tuple(src_pattern)
        dst = tuple(dst_pattern)
        if len(src) != self.ndim:
            raise NkiValidationError(f"{what}: src_pattern has {len(src)} entries for a "
                                     f"{self.ndim}-D tensor")

        def names(group, where):
            items = group if isinstance(group, tuple) else (group,)
            if not items or any(not isinstance(x, str) for x in items):
                raise TypeError(f"{what}: {where} entries must be names or tuples of names, got {group!r}")
            return items

        t = self
        atoms: list[str] = []
        dim = 0
        for group, n in zip(src, self.shape):
            items = names(group, "src_pattern")
            if len(items) == 1:
                if items[0] in sizes and sizes[items[0]] != n:
                    raise NkiValidationError(f"{what}: {items[0]} is {n}, fixed_sizes says {sizes[items[0]]}")
                sizes[items[0]] = n
            else:
                parts = tuple(sizes.get(x, -1) for x in items)
                t = t.reshape_dim(dim, parts)
                for x, m in zip(items, t.shape[dim:dim + len(items)]):
                    sizes[x] = m
            atoms.extend(items)
            dim += len(items)
        if len(set(atoms)) != len(atoms):
            raise NkiValidationError(f"{what}: repeated name in src_pattern {src_pattern}")
        dst_atoms = [x for g in dst for x in names(g, "dst_pattern")]
        if sorted(dst_atoms) != sorted(atoms):
            raise NkiValidationError(f"{what}: dst_pattern {dst_pattern} must use exactly the "
                                     f"names of src_pattern {src_pattern}")
        t = t.permute(tuple(atoms.index(x) for x in dst_atoms))
        dim = 0
        for g in dst:
            k = len(names(g, "dst_pattern"))
            if k > 1:
                t = t.flatten_dims(dim, dim + k - 1)
            dim += 1
        return t

    def indirect(self, index, num_elem=None):
        raise NotImplementedError("NkiTensor.indirect (NeuronCore-v4 tensor indirection) is not "
                                  "implemented in the nki_ssm simulator")


def elements(tensor: NkiTensor) -> np.ndarray:
    """Flat storage element indices of ``tensor`` (shape = tensor.shape)."""
    return tensor.elements()


__all__ = ["MemoryRegion", "BufferName", "Storage", "NkiTensor", "DynSlice", "Indirection",
           "allocate", "from_array", "as_region", "elements", "PMAX"]
