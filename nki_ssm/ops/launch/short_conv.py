"""Launcher of the short causal conv1d kernels (``nki_ssm.kernels.short_conv``).

Host side only arranges layouts: for prefill the pool is passed as a
``[slots * dim, W-1]`` view (one channel per row, so the kernel gathers and
scatters a sequence's state with one ``vector_offset`` row per partition),
the slot numbers become int32 row tables ``[num_seqs, 128]``, the batch
layout becomes compile-time tuples, and the matmul precision flags are
chosen from the dtypes; for decode the pool is a ``[slots * R, (dim / R) *
(W-1)]`` view with one row per (sequence, channel block). All gathers and
scatters happen inside the kernels; the pool is updated in place.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

_F32 = np.dtype(np.float32)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_INT32_MAX = np.iinfo(np.int32).max


def _run(kernel, *args, backend):
    from nki_ssm import backend as _backend

    return _backend.run(kernel, *args, backend=backend)


def _pool_rows(conv_states: np.ndarray) -> np.ndarray:
    """``[slots * dim, W-1]`` view of the pool (a copy only if the pool is not C-contiguous)."""
    slots, dim, h = conv_states.shape
    if slots * dim > _INT32_MAX:
        raise ValueError(f"conv_states must have slots * dim <= {_INT32_MAX} (int32 row "
                         f"indices), got {slots} * {dim} = {slots * dim}")
    return conv_states.reshape(slots * dim, h)


def _row_table(slot: np.ndarray, use: np.ndarray, dim: int, oob: int) -> np.ndarray:
    """int32 ``[num_seqs, 128]``: pool row ``slot * dim + p`` of partition p where ``use``,
    else ``oob`` (the kernel adds each channel group's first channel as a constant)."""
    rows = slot.astype(np.int64)[:, None] * dim + np.arange(128, dtype=np.int64)[None, :]
    return np.where(use[:, None], rows, oob).astype(np.int32)


def _needs_split(a) -> bool:
    """float32 values that bfloat16 does not hold exactly need a hi + lo split."""
    if a is None or a.dtype != _F32:
        return False
    return not np.array_equal(a.astype(_BF16).astype(_F32), a)


def _precision_flags(x, weight, bias, conv_states):
    """(mm_fp32, x_stage, w_split, b_split) for the prefill kernel (see its docstring).

    Matmuls are float32 when x or the pool is float32 (pool values must pass
    through exactly); otherwise bfloat16, with float32 weights / bias split in
    hi + lo bfloat16 parts unless they are bfloat16 values already (a host
    check of dim * W numbers; part of the kernel's compile-time flags).
    """
    mm_fp32 = x.dtype == _F32 or conv_states.dtype == _F32
    x_stage = mm_fp32 and x.dtype != _F32
    w_split = (not mm_fp32) and _needs_split(weight)
    b_split = (not mm_fp32) and _needs_split(bias)
    return mm_fp32, x_stage, w_split, b_split


def _prefill_launch(x, weight, bias, activation, cu_seqlens, conv_states, state_indices,
                    has_initial_state, backend):
    from nki_ssm.kernels.short_conv.prefill import short_conv_prefill_kernel

    num_tokens, dim = x.shape
    slots = conv_states.shape[0]
    idx = np.asarray(state_indices, dtype=np.int64)
    live = idx >= 0
    oob = slots * dim                      # first row past the pool: gather skips it
    gather_rows = _row_table(idx, live & np.asarray(has_initial_state, dtype=bool), dim, oob)
    scatter_rows = _row_table(idx, live, dim, oob)
    cu = [int(v) for v in np.asarray(cu_seqlens)]
    segments = tuple((cu[s], cu[s + 1]) for s in range(len(cu) - 1))
    live_t = tuple(bool(v) for v in live)
    rows = _pool_rows(conv_states)
    xk = x
    if num_tokens == 0:
        # the kernel needs a non-empty y; empty sequences still write their states
        xk = np.zeros((1, dim), dtype=x.dtype)
    flags = _precision_flags(x, weight, bias, conv_states)
    y = _run(short_conv_prefill_kernel, np.ascontiguousarray(xk), np.ascontiguousarray(weight),
             None if bias is None else np.ascontiguousarray(bias), rows, gather_rows,
             scatter_rows, segments, live_t, "silu" if activation == "silu" else "none",
             bias is not None, *flags, backend=backend)
    if not np.shares_memory(rows, conv_states):
        conv_states[...] = rows.reshape(conv_states.shape)
    y = np.asarray(y)
    return y[:num_tokens] if num_tokens == 0 else y


def prefill(*, x, weight, bias, activation, cu_seqlens, conv_states, state_indices,
            has_initial_state, backend):
    """Run the prefill kernel: y ``[num_tokens, dim]`` in x's dtype; ``conv_states`` updated in place."""
    return _prefill_launch(x, weight, bias, activation, cu_seqlens, conv_states,
                           state_indices, has_initial_state, backend)


def _row_split(num_seqs: int, dim: int) -> int:
    """R: channel blocks per sequence so that num_seqs * R rows fill up to 128 partitions."""
    r = 1
    while num_seqs * r * 2 <= 128 and dim % (r * 2) == 0:
        r *= 2
    return r


def decode(*, x, weight, bias, activation, conv_states, state_indices, backend):
    """Decode / multi-token update: y shaped like x (``[num_seqs, T, dim]`` or ``[num_seqs, dim]``).

    Rows (sequence, channel block) go on partitions (decode kernel); the pool
    is passed as its ``[slots * R, (dim / R) * (W-1)]`` row view, padding rows
    point one past the pool.
    """
    from nki_ssm.kernels.short_conv.decode import short_conv_decode_kernel

    squeeze = x.ndim == 2
    x3 = x[:, None, :] if squeeze else x
    num_seqs = x3.shape[0]
    slots, dim, h = conv_states.shape
    if slots * dim > _INT32_MAX:
        raise ValueError(f"conv_states must have slots * dim <= {_INT32_MAX}, got {slots * dim}")
    R = _row_split(num_seqs, dim)
    idx = np.asarray(state_indices, dtype=np.int64)
    live = idx >= 0
    # kernel row order: groups of 128 // R sequences, block-major inside a group
    # (partition r * Pn + i = block r of the group's sequence i)
    pieces = []
    per_group = 128 // R
    for n0 in range(0, num_seqs, per_group):
        seqs = np.arange(n0, min(num_seqs, n0 + per_group))
        for r in range(R):
            pieces.append(np.stack([seqs, np.full_like(seqs, r)], axis=1))
    pairs = np.concatenate(pieces)
    n_of, r_of = pairs[:, 0], pairs[:, 1]
    rows = np.where(live[n_of], idx[n_of] * R + r_of, slots * R)
    valid = live[n_of].astype(np.float32)
    flat = conv_states.reshape(slots * R, (dim // R) * h)
    # TensorE taps need one channel block (rows = sequences) and bfloat16-exact operands
    tensor_taps = (R == 1 and x.dtype == _BF16 and conv_states.dtype == _BF16
                   and not _needs_split(weight) and not _needs_split(bias))
    y = _run(short_conv_decode_kernel, np.ascontiguousarray(x3), np.ascontiguousarray(weight),
             None if bias is None else np.ascontiguousarray(bias), flat,
             rows.reshape(-1).astype(np.int32), valid,
             "silu" if activation == "silu" else "none", bias is not None, R, bool(tensor_taps),
             backend=backend)
    if not np.shares_memory(flat, conv_states):
        conv_states[...] = flat.reshape(conv_states.shape)
    y = np.asarray(y)
    return y[:, 0, :] if squeeze else y
