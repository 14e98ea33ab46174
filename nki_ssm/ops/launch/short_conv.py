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


def decode_tables(state_indices, num_seqs: int, R: int):
    """(order, pos, pool_rows, num_groups) of ``short_conv_decode_kernel`` for a batch
    padded to ``num_seqs`` (the bucket) sequences; layouts in the kernel's docstring.

    ``order [G * Pn]``: the sequence at each position of the compacted batch (the host
    gathers x rows by it); ``pos [num_seqs]``: the position where each live sequence is
    computed (its y row; ``argsort(perm)``, the inverse permutation). Vectorised, each step one torch op
    on device (no per-sequence host loop): ``live = idx >= 0``; ``perm = argsort(~live,
    stable)`` (torch.argsort(stable=True): live sequences first, in order);
    ``num_live = live.sum()``; position q takes ``perm[q]`` if ``q < num_live`` else
    ``perm`` at its group's first position (torch.where + index_select: a padding
    position mirrors a live sequence of its own group); pool rows ``slot * R + r``
    (broadcast add); ``num_groups = ceil(num_live / Pn)``.
    """
    idx = np.asarray(state_indices, dtype=np.int64)
    Pn = min(128 // R, num_seqs)
    G = -(-num_seqs // Pn)
    live = idx >= 0
    perm = np.argsort(~live, kind="stable")
    num_live = int(live.sum())
    q = np.arange(G * Pn)
    order = perm[np.minimum(np.where(q < num_live, q, (q // Pn) * Pn), num_seqs - 1)]
    slot = np.maximum(idx[order], 0)
    r = np.arange(R)[None, :, None]
    pool_rows = (slot.reshape(G, 1, Pn) * R + r).reshape(G, R * Pn)
    num_groups = np.array([[-(-num_live // Pn)]], dtype=np.int32)
    pos = np.argsort(perm, kind="stable")
    return order, pos, np.ascontiguousarray(pool_rows, dtype=np.int32), num_groups


def decode(*, x, weight, bias, activation, conv_states, state_indices, backend):
    """Decode / multi-token update: y shaped like x (``[num_seqs, T, dim]`` or ``[num_seqs, dim]``).

    The batch is padded to ``seq_bucket(num_seqs)`` sequences, so the kernel is
    compiled once per (bucket, layer shape); x is gathered into the compacted
    order of ``decode_tables`` (live sequences first, padding positions mirroring a
    live one: ``x[order]``, torch.index_select), so a padding sequence's x is never
    read. Rows (sequence, channel block) go on partitions; the pool is passed as
    its ``[slots * R, (dim / R) * (W-1)]`` row view and updated by the kernel's own
    scatters. y comes back in the compacted order: ``y[pos]`` with ``pos`` the
    inverse permutation (torch.argsort), zeros for padding (torch.where).
    """
    from nki_ssm.kernels.short_conv.decode import short_conv_decode_kernel
    from nki_ssm.ops.launch.buckets import seq_bucket

    squeeze = x.ndim == 2
    x3 = x[:, None, :] if squeeze else x
    num_seqs, T, dim = x3.shape
    slots, dim, h = conv_states.shape
    if slots * dim > _INT32_MAX:
        raise ValueError(f"conv_states must have slots * dim <= {_INT32_MAX}, got {slots * dim}")
    nb = seq_bucket(num_seqs)
    R = _row_split(nb, dim)
    idx = np.full(nb, -1, dtype=np.int64)
    idx[:num_seqs] = np.asarray(state_indices, dtype=np.int64)
    order, pos, pool_rows, num_groups = decode_tables(idx, nb, R)
    G = pool_rows.shape[0]
    Pn = order.shape[0] // G
    # positions past the caller's batch mirror live sequences, so clamping is never used
    xk = np.ascontiguousarray(x3[np.minimum(order, num_seqs - 1)]).reshape(G, Pn, T, dim)
    flat = conv_states.reshape(slots * R, (dim // R) * h)
    # TensorE taps need one channel block (rows = sequences) and bfloat16-exact operands
    tensor_taps = (R == 1 and x.dtype == _BF16 and conv_states.dtype == _BF16
                   and not _needs_split(weight) and not _needs_split(bias))
    yk = _run(short_conv_decode_kernel, xk, np.ascontiguousarray(weight),
              None if bias is None else np.ascontiguousarray(bias), flat, pool_rows,
              num_groups, "silu" if activation == "silu" else "none", bias is not None, R,
              bool(tensor_taps), backend=backend)
    if not np.shares_memory(flat, conv_states):
        conv_states[...] = flat.reshape(conv_states.shape)
    live = idx[:num_seqs] >= 0
    y = np.asarray(yk).reshape(G * Pn, T, dim)[pos[:num_seqs]]
    y = np.where(live[:, None, None], y, np.zeros((), dtype=x.dtype))
    return y[:, 0, :] if squeeze else y
