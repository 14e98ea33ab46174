"""Launcher of the Gated DeltaNet kernels (``nki_ssm.kernels.gated_delta``).

``decode`` launches ``decode.gdn_decode_step`` (recurrent, T tokens per
sequence); ``prefill`` launches ``chunk.gdn_chunk_prefill`` (chunked WY / UT
form; sequence lengths, padding and has_initial_state are compile-time
tuples; q/k/v flattened to ``[num_tokens, heads*dim]``, gates widened to
float32, A_log / dt_bias repeated on 128 rows).

Host side only arranges layouts and index tables; all math and every pool
gather / scatter happens in the kernel:

- decode: the pool ``[slots, HV, K, V]`` is passed as its ``[slots, HV*K*V]``
  view (one contiguous block per slot, moved with a run-time start); the batch
  is padded to its sequence bucket and compacted (``decode_order``) and the
  per-iteration tables are built with vectorised ops (see ``decode``);
- prefill: the pool is passed as its ``[slots*HV*K, V]`` row view (no copy for a
  C-contiguous pool); partition k of a sequence's state tile reads rows
  ``slot*HV*K + hv*K + k`` (int32 ``[num_seqs*K, 1]`` table);
- q and k become one ``[K, num_seqs*T*H*2]`` column table (k on partitions,
  k / q columns interleaved per head) plus k as one row ``[1, num_seqs*T*H*K]``;
  v becomes ``[V, num_seqs*T*HV]`` (v on partitions); gates are widened to
  float32 rows ``[2, num_seqs*T*HV]``; A_log / dt_bias one float32 row;
- prefill: which sequences are padding is a compile-time tuple (zero output, no
  instructions on the pool); decode: run-time tables only;
- the kernel's v-major output ``[V, num_seqs*T*HV]`` is transposed back and
  rounded once (RNE) to q's dtype.
"""
from __future__ import annotations

import numpy as np

_INT32_MAX = np.iinfo(np.int32).max
_PMAX = 128


def _run(kernel, *args, backend):
    from nki_ssm import backend as _backend

    return _backend.run(kernel, *args, backend=backend)


_GROUP = 16    # (sequence, token) pairs per decode loop iteration (inputs in one DMA each)
_STREAMS = 2   # sequences per batch (gdn_decode_step's interleaved instruction streams)


def _positions_per_iteration(num_seqs: int, T: int) -> int:
    """Sequence positions per loop iteration: _GROUP // T rounded down to a multiple of
    2 * _STREAMS (an even number of batches; at least 2), or the whole bucket if smaller."""
    spi = max(2 * _STREAMS, (_GROUP // T) // (2 * _STREAMS) * (2 * _STREAMS))
    return min(spi, num_seqs)


def decode_order(state_indices, num_seqs: int, T: int = 1):
    """(order, pos, num_iters) of the compacted decode batch for a batch padded to
    ``num_seqs`` (the bucket) sequences.

    ``order [n_it * SPI]``: the sequence computed at each position: live sequences
    first (``argsort(idx < 0, stable)``, torch.argsort(stable=True)); positions past
    the live count mirror the first position of their batch of _STREAMS (torch.where +
    index_select), so they read and write exactly what that sequence does (batches
    without a live position do not run: ``batch_live``). ``pos``:
    where each sequence is computed (``argsort(perm)``, the inverse permutation).
    ``num_iters [1, 1]`` int32 = ``ceil(live / SPI)`` (torch: sum, then integer ops).
    """
    idx = np.asarray(state_indices, dtype=np.int64)
    spi = _positions_per_iteration(num_seqs, T)
    n_it = -(-num_seqs // spi)
    live = idx >= 0
    perm = np.argsort(~live, kind="stable")
    num_live = int(live.sum())
    q = np.arange(n_it * spi)
    order = perm[np.minimum(np.where(q < num_live, q, (q // _STREAMS) * _STREAMS),
                            num_seqs - 1)]
    pos = np.argsort(perm, kind="stable")
    return order, pos, np.array([[-(-num_live // spi)]], dtype=np.int32)


def decode_tables(q, k, v, state_indices, slots):
    """(kq_cols, k_rows, v_cols, pool_idx) of ``gdn_decode_step`` for the sequences in
    the order given, as 2-D tables (the launcher splits their columns / rows into
    loop iterations; layouts in the kernel's docstring)."""
    S, T, H, K = q.shape
    HV, V = v.shape[2:]
    _check_limits(K, V, HV)
    kq = np.stack([np.asarray(k), np.asarray(q)], axis=-1)            # [S, T, H, K, 2]
    kq_cols = np.ascontiguousarray(kq.transpose(3, 0, 1, 2, 4)).reshape(K, S * T * H * 2)
    k_rows = np.ascontiguousarray(np.asarray(k).reshape(1, S * T * H * K))
    v_cols = np.ascontiguousarray(np.asarray(v).transpose(3, 0, 1, 2)).reshape(V, S * T * HV)
    return kq_cols, k_rows, v_cols, _pool_rows(state_indices, slots, HV, K)


def _check_limits(K, V, HV):
    """The kernels keep K, V (and, in decode, HV) on partitions: each must be <= 128."""
    for name, val in (("K (q.shape[-1])", K), ("V (v.shape[-1])", V), ("HV (v.shape[-2])", HV)):
        if val > _PMAX:
            raise ValueError(f"{name} must be <= {_PMAX} for the gated delta kernels "
                             f"(partition dim), got {val}; use backend='reference'")


def _pool_rows(state_indices, slots, HV, K):
    """int32 ``[num_seqs*K, 1]``: ``slot*HV*K + k`` (0 for padding, never used)."""
    if slots * HV * K > _INT32_MAX:
        raise ValueError(f"ssm_states must have slots*HV*K <= {_INT32_MAX} (int32 row indices), "
                         f"got {slots}*{HV}*{K} = {slots * HV * K}")
    idx = np.asarray(state_indices, dtype=np.int64)
    rows = np.where(idx[:, None] >= 0, idx[:, None] * HV * K + np.arange(K)[None, :], 0)
    return rows.astype(np.int32).reshape(-1, 1)


def decode(*, q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, ssm_states,
           state_indices, return_intermediate_states, backend):
    """Launch ``gdn_decode_step``; returns o ``[num_seqs, T, HV, V]`` in q's dtype, or
    ``(o, intermediate [num_seqs, T, HV, K, V])`` (pool dtype) with
    return_intermediate_states. ``ssm_states`` is updated in place (named slots only).

    The batch is padded to ``seq_bucket(num_seqs)`` and compacted (``decode_order``):
    the per-sequence inputs are gathered in that order (``x[order]``, index_select)
    while being laid out; outputs come back by the inverse permutation, padding
    sequences zeroed (torch.where).
    """
    from nki_ssm.kernels.gated_delta.decode import gdn_decode_step
    from nki_ssm.ops._dispatch import cast_rne
    from nki_ssm.ops.launch.buckets import seq_bucket

    S, T, H, K = q.shape
    HV, V = v.shape[2:]
    _check_limits(K, V, HV)
    slots = ssm_states.shape[0]
    raw = g is None
    nb = seq_bucket(S)
    idx = np.full(nb, -1, dtype=np.int64)
    idx[:S] = np.asarray(state_indices, dtype=np.int64)
    order, pos, num_iters = decode_order(idx, nb, T)
    src = np.minimum(order, S - 1)        # positions past the batch mirror live sequences
    spi = _positions_per_iteration(nb, T)
    kq_cols, k_rows, v_cols, _ = decode_tables(
        np.asarray(q)[src], np.asarray(k)[src], np.asarray(v)[src], idx[order], slots)
    n_pos = order.shape[0]
    n_it = n_pos // spi
    # one block of columns (rows) per loop iteration: the kernel offsets by the iteration
    kq_cols = kq_cols.reshape(K, n_it, -1)
    k_rows = k_rows.reshape(n_it, -1)
    v_cols = v_cols.reshape(V, n_it, -1)
    # slot of each position, one row per iteration plus one (the pipelined kernel reads
    # the next iteration's first slots one iteration ahead); padding never named: 0
    pool_slots = np.zeros((n_it + 1, spi), dtype=np.int32)
    pool_slots[:n_it] = np.maximum(idx[order], 0).reshape(n_it, spi)
    # 1 where a batch of _STREAMS positions holds a live sequence (compare, reshape)
    n_batch = -(-spi // _STREAMS)
    first = np.arange(n_it * n_batch) * min(_STREAMS, spi)
    batch_live = (first < int((idx >= 0).sum())).astype(np.int32).reshape(n_it, n_batch)
    first, second = (a, b) if raw else (g, beta)
    gate_rows = np.stack([np.asarray(first, np.float32).reshape(S, T * HV)[src],
                          np.asarray(second, np.float32).reshape(S, T * HV)[src]])
    gate_rows = np.ascontiguousarray(gate_rows.reshape(2, n_it, spi * T * HV))
    head_params = None
    if raw:
        head_params = np.concatenate([np.asarray(A_log, np.float32),
                                      np.asarray(dt_bias, np.float32)]).reshape(1, 2 * HV)
    pool = ssm_states.reshape(slots, HV * K * V)
    out = _run(gdn_decode_step, kq_cols, k_rows, v_cols, gate_rows, head_params, pool,
               pool_slots, num_iters, batch_live, int(T), int(H), bool(raw), bool(use_qk_l2norm),
               float(scale), bool(return_intermediate_states), backend=backend)
    if not np.shares_memory(pool, ssm_states):
        ssm_states[...] = pool.reshape(ssm_states.shape)
    live = idx[:S] >= 0
    at = pos[:S]
    o_cols = out[0] if return_intermediate_states else out
    o = np.asarray(o_cols, dtype=np.float32).reshape(V, n_pos, T, HV).transpose(1, 2, 3, 0)[at]
    o = cast_rne(np.where(live[:, None, None, None], o, np.float32(0)), q.dtype)
    if return_intermediate_states:
        inter = np.asarray(out[1]).reshape(n_pos, T, HV, K, V)[at]
        inter = np.where(live[:, None, None, None, None], inter, np.zeros((), inter.dtype))
        return o, inter.astype(ssm_states.dtype, copy=False)
    return o


def prefill(*, q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, cu_seqlens,
            ssm_states, state_indices, has_initial_state, chunk_size, backend):
    """Launch ``gdn_chunk_prefill``; returns o ``[num_tokens, HV, V]`` in q's dtype.

    ``ssm_states`` is updated in place (named slots only). Sequence lengths,
    padding and has_initial_state become compile-time tuples.
    """
    from nki_ssm.kernels.gated_delta.chunk import gdn_chunk_prefill
    from nki_ssm.ops._dispatch import cast_rne
    T, H, K = q.shape
    HV, V = v.shape[1:]
    _check_limits(K, V, HV)
    slots = ssm_states.shape[0]
    raw = g is None
    first, second = (a, b) if raw else (g, beta)
    def tok2d(x, width, dtype=None):
        x = np.asarray(x).reshape(T, width)
        if dtype is not None:
            x = x.astype(dtype)
        if T == 0:
            x = np.zeros((1, width), dtype=x.dtype)
        return np.ascontiguousarray(x)
    hp = None
    if raw:
        hp = np.ascontiguousarray(np.broadcast_to(np.concatenate(
            [np.asarray(A_log, np.float32), np.asarray(dt_bias, np.float32)]), (128, 2 * HV)))
    idx = np.asarray(state_indices, dtype=np.int64)
    pool_idx = _pool_rows(idx, slots, HV, K)
    cu = [int(x) for x in np.asarray(cu_seqlens)]
    seq_lens = tuple(cu[i + 1] - cu[i] for i in range(len(cu) - 1))
    live = tuple(bool(i >= 0) for i in idx)
    init = tuple(bool(x) for x in np.asarray(has_initial_state))
    pool = ssm_states.reshape(slots * HV * K, V)
    o = _run(gdn_chunk_prefill, tok2d(q, H * K), tok2d(k, H * K), tok2d(v, HV * V),
             tok2d(first, HV, np.float32), tok2d(second, HV, np.float32), hp, pool, pool_idx,
             seq_lens, live, init, int(H), bool(raw), bool(use_qk_l2norm), float(scale),
             int(chunk_size), backend=backend)
    if not np.shares_memory(pool, ssm_states):
        ssm_states[...] = pool.reshape(ssm_states.shape)
    o = np.asarray(o, dtype=np.float32)[:T].reshape(T, HV, V)
    return cast_rne(o, q.dtype)
