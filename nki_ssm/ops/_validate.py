"""Validation shared by every op family and every backend.

Each checker raises ``TypeError`` (wrong Python/NumPy type or dtype) or
``ValueError`` (wrong shape, range or consistency) with a message that names
the argument, the expected and the actual value, using the words of
docs/contracts.md. Checkers never modify their inputs; index arrays come back
as int32 / bool copies so later mutation by the caller cannot race a launch.

Limits chosen here (documented in docs/contracts.md, Host API):

- activations and pools: float32 or bfloat16 (``ml_dtypes.bfloat16``);
- conv width ``W``: ``MIN_CONV_WIDTH..MAX_CONV_WIDTH`` (2..8);
- ``chunk_size`` (SSD and Gated DeltaNet prefill): a multiple of 16 in
  16..128, so a chunk fits the 128 partitions and the 16-row exact blocks
  of the triangular solves;
- ``num_seqs >= 1``.
"""
from __future__ import annotations

import math
import numbers

import ml_dtypes
import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16))
MIN_CONV_WIDTH = 2
MAX_CONV_WIDTH = 8
CHUNK_MULTIPLE = 16
MIN_CHUNK_SIZE = 16
MAX_CHUNK_SIZE = 128
_INT32 = np.iinfo(np.int32)
# Pools whose strides do not nest are checked for overlap element by element up to this size.
EXACT_OVERLAP_CHECK_ELEMENTS = 1 << 22
# Log decays (GDN g, SSD dt' * A) at or above this bound: a chunk of up to
# MAX_CHUNK_SIZE of them sums to a finite float32 in the kernels.
LOG_DECAY_FLOOR = -float(np.finfo(np.float32).max) / MAX_CHUNK_SIZE


def _dtype_names(dtypes) -> str:
    return " or ".join(str(d) for d in dtypes)


def require_array(name: str, value) -> np.ndarray:
    """``value`` itself if it is a numpy ndarray, else TypeError."""
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(value).__name__}")
    return value


def require_float(name: str, value) -> np.ndarray:
    """An ndarray of dtype float32 or bfloat16 (TypeError otherwise)."""
    arr = require_array(name, value)
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype {_dtype_names(FLOAT_DTYPES)}, got {arr.dtype}")
    return arr


def require_same_dtype(name: str, arr: np.ndarray, ref_name: str, ref: np.ndarray) -> None:
    """Activations that a kernel streams together must share one dtype."""
    if arr.dtype != ref.dtype:
        raise TypeError(
            f"{name} must have the same dtype as {ref_name} ({ref.dtype}), got {arr.dtype}"
        )


def require_one_dtype(arrays: dict) -> None:
    """The given arrays (None: absent) share the first one's dtype (``require_same_dtype``)."""
    given = [(name, a) for name, a in arrays.items() if a is not None]
    for name, arr in given[1:]:
        require_same_dtype(name, arr, *given[0])


def require_shape(name: str, arr: np.ndarray, labels: tuple, expected: tuple) -> None:
    """Check ``arr.shape`` against ``expected`` (None = any size).

    ``labels`` are the contract words for each dim, used in the message, e.g.
    ``x must have shape [num_tokens, H, P] = [37, 4, *], got (37, 4)``.
    """
    shown = ", ".join("*" if e is None else str(e) for e in expected)
    if arr.ndim != len(expected) or any(
        e is not None and s != e for s, e in zip(arr.shape, expected)
    ):
        raise ValueError(
            f"{name} must have shape [{', '.join(labels)}] = [{shown}], got {tuple(arr.shape)}"
        )


def require_ndim(name: str, arr: np.ndarray, labels: tuple) -> None:
    """Check the rank only (sizes are fixed by this array)."""
    if arr.ndim != len(labels):
        raise ValueError(
            f"{name} must have shape [{', '.join(labels)}] ({len(labels)} dims), "
            f"got {arr.ndim} dims {tuple(arr.shape)}"
        )


def require_positive_dims(name: str, arr: np.ndarray, labels: tuple, start: int = 0) -> None:
    """Feature dims (dim, H, P, N, K, V, ...) must be >= 1."""
    for axis in range(start, arr.ndim):
        if arr.shape[axis] < 1:
            raise ValueError(
                f"{name}.shape[{axis}] ({labels[axis]}) must be >= 1, got {arr.shape[axis]}"
            )


def require_divides(small_label: str, small: int, big_label: str, big: int, source: str) -> None:
    """``small`` must divide ``big`` (G | H for SSD groups, H | HV for GDN)."""
    if small < 1 or big % small != 0:
        raise ValueError(
            f"{big_label} must be a multiple of {small_label} ({source}), "
            f"got {big_label} = {big}, {small_label} = {small}"
        )


def require_at_most(label: str, value: int, limit: int, reason: str) -> None:
    """A kernel limit on a size (``label`` names the size and the argument it comes from)."""
    if value > limit:
        raise ValueError(f"{label} must be <= {limit} ({reason}), got {value}")


def optional_float(name: str, value, labels: tuple, expected: tuple):
    """None, or a float array of the expected shape."""
    if value is None:
        return None
    arr = require_float(name, value)
    require_shape(name, arr, labels, expected)
    return arr


def require_bool(name: str, value) -> bool:
    """A Python or NumPy bool (not an int: 0/1 flags are a common mix-up)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def require_choice(name: str, value, choices: tuple):
    """One of a fixed set of values (e.g. activation None or "silu")."""
    if not any(value is c or (isinstance(value, str) and value == c) for c in choices):
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _real(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def check_scale(value, default: float) -> float:
    """``scale``: None (-> ``default``) or a finite number > 0."""
    if value is None:
        return float(default)
    s = _real("scale", value)
    if not math.isfinite(s) or s <= 0.0:
        raise ValueError(f"scale must be finite and > 0, got {s!r}")
    return s


def check_dt_limit(value) -> tuple:
    """``dt_limit``: a (lo, hi) pair of numbers, neither NaN, lo <= hi."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"dt_limit must be a (lo, hi) pair, got {value!r}")
    lo = _real("dt_limit[0]", value[0])
    hi = _real("dt_limit[1]", value[1])
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"dt_limit must satisfy lo <= hi (no NaN), got ({lo!r}, {hi!r})")
    return (lo, hi)


def check_chunk_size(value) -> int:
    """``chunk_size``: a multiple of 16 in 16..128 (see module docstring)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"chunk_size must be an int, got {type(value).__name__} {value!r}")
    c = int(value)
    if not (MIN_CHUNK_SIZE <= c <= MAX_CHUNK_SIZE) or c % CHUNK_MULTIPLE:
        raise ValueError(
            f"chunk_size must be a multiple of {CHUNK_MULTIPLE} in "
            f"{MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}, got {c}"
        )
    return c


def check_conv_width(width: int) -> None:
    """``W`` (weight.shape[1]) in MIN_CONV_WIDTH..MAX_CONV_WIDTH."""
    if not (MIN_CONV_WIDTH <= width <= MAX_CONV_WIDTH):
        raise ValueError(
            f"W (weight.shape[1]) must be in {MIN_CONV_WIDTH}..{MAX_CONV_WIDTH}, got {width}"
        )


def index_array(name: str, value, length: int | None = None, length_label: str = "") -> np.ndarray:
    """A 1-D integer array -> an int32 copy (TypeError for non-integer dtype)."""
    arr = require_array(name, value)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must have an integer dtype (int32), got {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name} must have length {length_label} = {length}, got {arr.shape[0]}")
    if arr.size and (arr.min() < _INT32.min or arr.max() > _INT32.max):
        raise ValueError(f"{name} values must fit int32, got range [{arr.min()}, {arr.max()}]")
    return arr.astype(np.int32, copy=True)


def check_cu_seqlens(value, num_tokens: int, tokens_source: str) -> tuple:
    """``cu_seqlens`` int32 ``[num_seqs + 1]`` -> (int32 copy, num_seqs).

    Starts at 0, non-decreasing, ends at num_tokens; num_seqs >= 1.
    """
    cu = index_array("cu_seqlens", value)
    if cu.shape[0] < 2:
        raise ValueError(
            f"cu_seqlens must have num_seqs + 1 >= 2 entries, got {cu.shape[0]}"
        )
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens[0] must be 0, got {cu[0]}")
    steps = np.diff(cu.astype(np.int64))   # int32 differences wrap (2**31 - 1 -> -2**31)
    if (steps < 0).any():
        i = int(np.argmax(steps < 0))
        raise ValueError(
            f"cu_seqlens must be non-decreasing, got cu_seqlens[{i}] = {cu[i]} > "
            f"cu_seqlens[{i + 1}] = {cu[i + 1]}"
        )
    if cu[-1] != num_tokens:
        raise ValueError(
            f"cu_seqlens[-1] must equal num_tokens ({tokens_source}) = {num_tokens}, got {cu[-1]}"
        )
    return cu, cu.shape[0] - 1


def check_pool(name: str, value, labels: tuple, expected_tail: tuple) -> np.ndarray:
    """A state pool: float32/bfloat16, shape ``[slots, *expected_tail]``, writeable.

    Returned as the caller's array itself (it is updated in place).
    """
    pool = require_float(name, value)
    require_shape(name, pool, labels, (None, *expected_tail))
    if not pool.flags.writeable:
        raise ValueError(
            f"{name} must be writeable (it is updated in place), got a read-only array"
        )
    require_distinct_memory(name, pool)
    return pool


def _strides_nest(arr: np.ndarray) -> bool:
    """Sufficient for distinct element addresses: with the dims sorted by
    stride, each stride reaches past everything the smaller dims span."""
    reach = arr.itemsize
    for stride, n in sorted((abs(st), n) for st, n in zip(arr.strides, arr.shape) if n > 1):
        if stride < reach:
            return False
        reach += stride * (n - 1)
    return True


def require_distinct_memory(name: str, arr: np.ndarray) -> None:
    """No two elements of ``arr`` share memory (e.g. a zero-stride or
    overlapping ``as_strided`` view): a pool is updated in place slot by
    slot, and a write to one slot must not change another.

    Strides that nest (every C/F-ordered array and slice) pass at once;
    other layouts are checked element by element up to
    ``EXACT_OVERLAP_CHECK_ELEMENTS`` elements and rejected above.
    """
    if arr.size <= 1 or _strides_nest(arr):
        return
    shown = f"shape {tuple(arr.shape)}, strides {tuple(arr.strides)} bytes"
    if arr.size <= EXACT_OVERLAP_CHECK_ELEMENTS:
        offsets = np.zeros((), np.int64)
        for n, stride in zip(arr.shape, arr.strides):
            offsets = np.add.outer(offsets, np.arange(n, dtype=np.int64) * stride)
        if np.unique(offsets).size == arr.size:
            return
        raise ValueError(f"{name} must not overlap itself in memory (every slot is updated "
                         f"in place and must own its bytes), got a view whose elements "
                         f"share memory ({shown})")
    raise ValueError(f"{name} must be a pool whose strides nest (e.g. C-contiguous) when it "
                     f"has more than {EXACT_OVERLAP_CHECK_ELEMENTS} elements, so that its "
                     f"slots are known not to overlap; got {shown}")


def check_state_indices(value, num_seqs: int, slots: int, pool_name: str) -> np.ndarray:
    """``state_indices`` int32 ``[num_seqs]``: each -1 or in [0, slots), no repeats."""
    idx = index_array("state_indices", value, num_seqs, "num_seqs")
    bad = (idx < -1) | (idx >= slots)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"state_indices[{i}] must be -1 or in [0, slots) = [0, {slots}) "
            f"(slots = {pool_name}.shape[0]), got {idx[i]}"
        )
    named = idx[idx >= 0]
    uniq, counts = np.unique(named, return_counts=True)
    if (counts > 1).any():
        slot = int(uniq[np.argmax(counts > 1)])
        where = np.flatnonzero(idx == slot).tolist()
        raise ValueError(
            f"state_indices must not repeat a slot within a call, got slot {slot} "
            f"at positions {where}"
        )
    return idx


def check_has_initial_state(value, num_seqs: int) -> np.ndarray:
    """``has_initial_state`` bool ``[num_seqs]`` -> bool copy."""
    arr = require_array("has_initial_state", value)
    if arr.dtype != np.bool_:
        raise TypeError(f"has_initial_state must have dtype bool, got {arr.dtype}")
    if arr.shape != (num_seqs,):
        raise ValueError(
            f"has_initial_state must have shape [num_seqs] = [{num_seqs}], got {tuple(arr.shape)}"
        )
    return arr.copy()


def check_ragged_batch(cu_seqlens, state_indices, has_initial_state, *, num_tokens: int,
                       tokens_source: str, pool: np.ndarray, pool_name: str) -> dict:
    """The batch arguments every prefill takes, checked in this order ->
    ``dict(cu_seqlens=, state_indices=, has_initial_state=)`` (int32 / bool copies)."""
    cu, num_seqs = check_cu_seqlens(cu_seqlens, num_tokens, tokens_source)
    return dict(
        cu_seqlens=cu,
        state_indices=check_state_indices(state_indices, num_seqs, pool.shape[0], pool_name),
        has_initial_state=check_has_initial_state(has_initial_state, num_seqs),
    )


def check_num_seqs(name: str, arr: np.ndarray) -> int:
    """Decode batches: ``num_seqs = arr.shape[0] >= 1``."""
    if arr.ndim == 0 or arr.shape[0] < 1:
        raise ValueError(f"{name}.shape[0] (num_seqs) must be >= 1, got shape {tuple(arr.shape)}")
    return arr.shape[0]


def live_tokens(cu_seqlens: np.ndarray, state_indices: np.ndarray) -> np.ndarray:
    """bool ``[num_tokens]``: tokens of non-padding sequences (checked cu_seqlens / state_indices)."""
    return np.repeat(state_indices >= 0, np.diff(cu_seqlens.astype(np.int64)))


def require_on_live_tokens(name: str, ok: np.ndarray, live: np.ndarray, values: np.ndarray,
                           what: str, element: str | None = None) -> None:
    """``ok[i]`` must hold wherever ``live`` (broadcast over ``ok``'s trailing dims) does.

    Padding tokens are exempt: the kernels never read their values, and
    serving engines leave garbage there. The message names the first
    offending element (of ``element``, default ``name``) and its value.
    """
    live = np.reshape(live, live.shape + (1,) * (ok.ndim - live.ndim))
    bad = ~ok & live
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        shown = ", ".join(map(str, where))
        raise ValueError(f"{name} must be {what} on every token of a non-padding sequence, "
                         f"got {element or name}[{shown}] = {float(values[where])!r}")
