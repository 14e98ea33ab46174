"""Shared helpers for the references: float64 casts and the ragged/pool walk.

The references accept any float dtype (incl. ml_dtypes.bfloat16), widen to
float64 on a copy (so inputs are never modified) and walk a ragged batch one
sequence at a time. Only the light checks a reference needs to not silently
compute garbage live here (lengths, slot range, duplicate slots); the full
validation is the host API's job (nki_ssm/ops).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["f64", "f64_or_none", "Segment", "ragged_segments", "decode_slots", "silu",
           "ACTIVATIONS", "functional_cu_seqlens", "states_or_zeros"]


def f64(a, name: str = "array") -> np.ndarray:
    """A float64 copy of `a` (never a view: the caller may write to it)."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16" and \
            not arr.dtype.name.startswith("float8"):
        raise TypeError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    return np.array(arr, dtype=np.float64, copy=True)


def f64_or_none(a, name: str = "array"):
    return None if a is None else f64(a, name)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), float64, overflow-free."""
    return x * np.exp(-np.logaddexp(0.0, -x))


ACTIVATIONS = (None, "silu")


@dataclass(frozen=True)
class Segment:
    """One sequence of a ragged batch: tokens [start, end), pool `slot` (-1 = padding)."""
    seq: int
    start: int
    end: int
    slot: int
    has_initial_state: bool

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def is_padding(self) -> bool:
        return self.slot < 0


def _slots_check(state_indices, num_seqs: int, slots: int) -> np.ndarray:
    idx = np.asarray(state_indices)
    if idx.shape != (num_seqs,):
        raise ValueError(f"state_indices must have shape ({num_seqs},), got {idx.shape}")
    if idx.dtype.kind not in "iu":
        raise TypeError(f"state_indices must be an integer array, got dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    bad = idx[(idx < -1) | (idx >= slots)]
    if bad.size:
        raise ValueError(f"state_indices must be -1 or in [0, {slots}), got {int(bad[0])}")
    named = idx[idx >= 0]
    if np.unique(named).size != named.size:
        raise ValueError(f"state_indices must not repeat a slot, got {idx.tolist()}")
    return idx


def ragged_segments(num_tokens: int, cu_seqlens, state_indices, has_initial_state,
                    slots: int) -> Iterator[Segment]:
    """The sequences of a ragged batch in order (checks lengths and slots first)."""
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.size < 1:
        raise ValueError(f"cu_seqlens must be 1-D with num_seqs + 1 >= 1 entries, got shape {cu.shape}")
    cu = cu.astype(np.int64)
    if cu[0] != 0 or cu[-1] != num_tokens or np.any(np.diff(cu) < 0):
        raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at "
                         f"num_tokens = {num_tokens}, got {cu.tolist()}")
    num_seqs = cu.size - 1
    idx = _slots_check(state_indices, num_seqs, slots)
    init = np.asarray(has_initial_state, dtype=bool)
    if init.shape != (num_seqs,):
        raise ValueError(f"has_initial_state must have shape ({num_seqs},), got {init.shape}")
    return iter([Segment(s, int(cu[s]), int(cu[s + 1]), int(idx[s]), bool(init[s]))
                 for s in range(num_seqs)])


def decode_slots(num_seqs: int, state_indices, slots: int) -> np.ndarray:
    """int64 slots `[num_seqs]` of a decode batch (-1 = padding), checked."""
    return _slots_check(state_indices, num_seqs, slots)


def functional_cu_seqlens(cu_seqlens, num_tokens: int) -> np.ndarray:
    """int64 ``cu_seqlens`` of a functional (pool-free) call, checked: 0 first, non-decreasing,
    ``num_tokens`` last, at least one sequence."""
    cu = np.asarray(cu_seqlens).astype(np.int64)
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != num_tokens or np.any(np.diff(cu) < 0):
        raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at "
                         f"num_tokens = {num_tokens}, got {cu.tolist()}")
    return cu


def states_or_zeros(states, shape: tuple, name: str) -> np.ndarray:
    """A float64 copy of per-sequence ``states`` of ``shape``, or zeros when None."""
    if states is None:
        return np.zeros(shape)
    s = f64(states, name)
    if s.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(s.shape)}")
    return s
