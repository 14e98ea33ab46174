"""Launcher of the Gated DeltaNet kernels (``nki_ssm.kernels.gated_delta``).

``decode`` launches ``decode.gdn_decode_step`` (recurrent, T tokens per
sequence); ``prefill`` launches ``chunk.gdn_chunk_prefill`` (chunked WY / UT
form; batch composition as run-time int32 tables, ``prefill_tables``; q/k/v
flattened to ``[num_tokens, heads*dim]`` and padded to the token bucket plus
one zero row, gates (and q/k with use_qk_l2norm) widened to float32, A_log /
dt_bias repeated on 128 rows).

Host side only arranges layouts and index tables; all math and every pool
gather / scatter happens in the kernel:

- decode: the pool ``[slots, HV, K, V]`` is passed as its ``[slots, HV*K*V]``
  view (one contiguous block per slot, moved with a run-time start); the batch
  is padded to its sequence bucket and compacted (``decode_order``) and the
  per-iteration tables are built with vectorised ops (see ``decode``);
- prefill: the pool is passed as its ``[slots*HV*K, V]`` row view (no copy for a
  C-contiguous pool); a slot is the contiguous block from row ``slot*HV*K``
  (``init_tab`` / ``final_tab``), moved with a run-time start; the chunks go in as
  flat work lists (``prefill_tables``);
- q and k become one ``[K, num_seqs*T*H*2]`` column table (k on partitions,
  k / q columns interleaved per head) plus k as one row ``[1, num_seqs*T*H*K]``;
  v becomes ``[V, num_seqs*T*HV]`` (v on partitions); gates are widened to
  float32 rows ``[2, num_seqs*T*HV]``; A_log / dt_bias one float32 row;
- prefill and decode: run-time tables only (padding sequences: zero output, no
  instructions on the pool);
- the kernel's v-major output ``[V, num_seqs*T*HV]`` is transposed back and
  rounded once (RNE) to q's dtype.

The layout work lives in ``prefill_call`` / ``decode_call``, shared with the
torch device path (package docstring).
"""
from __future__ import annotations

import numpy as np

from nki_ssm.ops.launch._arrays import NUMPY, host_call
from nki_ssm.ops.launch.buckets import seq_bucket, token_bucket

_INT32_MAX = np.iinfo(np.int32).max
_PMAX = 128


def decode_kernel():
    """The ``@nki.jit`` kernel ``decode_call`` launches."""
    from nki_ssm.kernels.gated_delta.decode import gdn_decode_step

    return gdn_decode_step


def prefill_kernel():
    """The ``@nki.jit`` kernel ``prefill_call`` launches."""
    from nki_ssm.kernels.gated_delta.chunk import gdn_chunk_prefill

    return gdn_chunk_prefill


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


def decode_tables(q, k, v, state_indices, slots, xp=NUMPY):
    """(kq_cols, k_rows, v_cols, pool_idx) of ``gdn_decode_step`` for the sequences in
    the order given, as 2-D tables (the launcher splits their columns / rows into
    loop iterations; layouts in the kernel's docstring); ``xp``: the array namespace
    (``_arrays``) q, k, v belong to (pool_idx is a host table)."""
    S, T, H, K = q.shape
    HV, V = v.shape[2:]
    _check_limits(K, V, HV)
    kq_cols = xp.permute(xp.stack([k, q], axis=-1), (3, 0, 1, 2, 4)).reshape(K, S * T * H * 2)
    k_rows = xp.contiguous(k).reshape(1, S * T * H * K)
    v_cols = xp.permute(v, (3, 0, 1, 2)).reshape(V, S * T * HV)
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
    """Launch ``gdn_decode_step`` on the host path (``decode_call`` with NumPy)."""
    return decode_call(NUMPY, host_call(backend), q=q, k=k, v=v, g=g, beta=beta, a=a, b=b,
                       A_log=A_log, dt_bias=dt_bias, scale=scale, use_qk_l2norm=use_qk_l2norm,
                       ssm_states=ssm_states, state_indices=state_indices,
                       return_intermediate_states=return_intermediate_states)


def decode_call(xp, call, *, q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm,
                ssm_states, state_indices, return_intermediate_states):
    """Lay out, launch ``call(decode_kernel(), *args)`` and lay back: o ``[num_seqs, T, HV, V]``
    in q's dtype, or ``(o, intermediate [num_seqs, T, HV, K, V])`` (pool dtype) with
    return_intermediate_states. ``ssm_states`` is updated in place (named slots only).

    ``xp``: the array namespace of q ... ssm_states (``_arrays``; NumPy here, torch
    on device); ``state_indices`` is a host array. The batch is padded to
    ``seq_bucket(num_seqs)`` and compacted (``decode_order``): the per-sequence
    inputs are gathered in that order (``x[order]``, index_select) while being laid
    out; outputs come back by the inverse permutation, padding sequences zeroed
    (torch.where).
    """
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
    kq_cols, k_rows, v_cols, _ = decode_tables(xp.take(q, src), xp.take(k, src),
                                               xp.take(v, src), idx[order], slots, xp)
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
    first_pos = np.arange(n_it * n_batch) * min(_STREAMS, spi)
    batch_live = (first_pos < int((idx >= 0).sum())).astype(np.int32).reshape(n_it, n_batch)
    first, second = (a, b) if raw else (g, beta)
    gate_rows = xp.stack([xp.take(xp.f32(x).reshape(S, T * HV), src) for x in (first, second)])
    gate_rows = gate_rows.reshape(2, n_it, spi * T * HV)
    head_params = None
    if raw:
        head_params = xp.cat([xp.f32(A_log), xp.f32(dt_bias)]).reshape(1, 2 * HV)
    pool = xp.pool_view(ssm_states, (slots, HV * K * V))
    out = call(decode_kernel(), kq_cols, k_rows, v_cols, gate_rows, head_params, pool,
               xp.table(pool_slots), xp.table(num_iters), xp.table(batch_live), int(T), int(H),
               bool(raw), bool(use_qk_l2norm), float(scale), bool(return_intermediate_states))
    xp.commit(pool, ssm_states)
    live = idx[:S] >= 0
    at = pos[:S]
    o_cols = out[0] if return_intermediate_states else out
    o = xp.take(xp.permute(xp.f32(o_cols).reshape(V, n_pos, T, HV), (1, 2, 3, 0)), at)
    o = xp.cast_like(xp.where_rows(live, o), q)
    if return_intermediate_states:
        inter = xp.take(out[1].reshape(n_pos, T, HV, K, V), at)
        return o, xp.cast_like(xp.where_rows(live, inter), ssm_states)
    return o


def prefill_tables(cu_seqlens, state_indices, has_initial_state, *, slots, HV, K, chunk_size,
                   num_tokens_bucket, num_seqs_bucket):
    """Batch composition of ``gdn_chunk_prefill`` as its int32 work lists (layouts in its
    docstring): ``(body_rows, body_state, tail_rows, tail_state, init_tab, final_tab,
    pad_rows, counts)``.

    Every step is one vectorised array op with a direct torch equivalent on
    device (named in the comments), so a serving loop builds them without a
    host round trip: ``diff``, ``where``, ``cumsum``, ``nonzero`` (stable
    compaction), ``repeat_interleave``, ``arange``, broadcasting arithmetic.
    With ``n = chunks_per_iteration(HV)`` and the live sequences compacted (position p,
    scratch block p, the zero block ``num_seqs_bucket``; a block row is ``block*K``):

    - ``body_rows [E // n + 1, n*C]``: the token rows of every body of n consecutive chunks
      (a sequence's first ``n * (chunks // n)`` chunks), in order; rows past a sequence
      end hold ``num_tokens_bucket`` (the zero / trash row); ``tail_rows
      [min(E, Nb*(n-1)) + 1, C]`` (n > 1, else ``[1, C]``): each sequence's remaining
      chunks, one per row; one spare row each (the kernel gathers the next row ahead);
      ``E = num_tokens_bucket // C + num_seqs_bucket`` bounds the chunks of a batch;
    - ``body_state``, ``tail_state`` (one row per work row): (source block row, destination
      block row): the sequence's own block, or the zero block as the source of its first
      row when it has no initial state;
    - ``init_tab [Nb, 2]``: (first pool row ``slot*HV*K``, block row) of each live sequence
      with an initial state; ``final_tab [Nb, 2]``: (block row, pool row) of every live
      sequence (an empty one without initial state: the zero block);
    - ``pad_rows [E + 1, C]``: the chunks of padding sequences (their output rows get zeros);
    - ``counts [1, 5]``: padding chunks, initial states, body rows, tail rows, live sequences.
    """
    from nki_ssm.kernels.gated_delta.chunk import chunks_per_iteration

    C = int(chunk_size)
    Tb, Nb = int(num_tokens_bucket), int(num_seqs_bucket)
    if slots * HV * K > _INT32_MAX:
        raise ValueError(f"ssm_states must have slots*HV*K <= {_INT32_MAX} (int32 row indices), "
                         f"got {slots}*{HV}*{K} = {slots * HV * K}")
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    idx = np.asarray(state_indices, dtype=np.int64)
    init = np.asarray(has_initial_state).astype(bool)
    n = chunks_per_iteration(HV)
    live = idx >= 0
    ids = np.flatnonzero(live)                                    # torch.nonzero (stable)
    nchunks = (np.diff(cu) + C - 1) // C                          # torch.diff, elementwise
    entries = Tb // C + Nb
    zero_row = Nb * K

    def chunks(seq, j):
        """Token rows [len(seq), C] of chunk j of sequence seq (past its end: Tb)."""
        rows = (cu[seq] + j * C)[:, None] + np.arange(C)[None, :]  # broadcasting
        return np.where(rows < cu[seq + 1][:, None], rows, Tb)    # torch.where

    def flat(counts):
        """(owner, index within owner) of every item, owners given item counts."""
        hi = np.cumsum(counts)                                    # torch.cumsum
        owner = np.repeat(np.arange(counts.size), counts)         # torch.repeat_interleave
        return owner, np.arange(owner.size) - (hi - counts)[owner]

    def table(rows, length, width):
        out = np.full((length, width), Tb, dtype=np.int32)
        out[:rows.shape[0]] = rows
        return out

    def state(p, first):
        """(source, destination) block rows of work rows of live positions p."""
        src = np.where(first & ~init[ids[p]], zero_row, p * K)
        return np.stack([src, p * K], axis=1)

    nch = nchunks[ids]
    bodies = nch // n
    p, m = flat(bodies)                                           # body m of position p
    body = np.stack([chunks(ids[p], m * n + j) for j in range(n)], axis=1).reshape(-1, n * C)
    body_rows = table(body, entries // n + 1, n * C)
    body_state = table(state(p, m == 0), entries // n + 1, 2)
    n_tail = min(entries, Nb * (n - 1)) + 1 if n > 1 else 1
    p, j = flat(nch - bodies * n)                                 # remaining chunk j
    tail_rows = table(chunks(ids[p], bodies[p] * n + j), n_tail, C)
    tail_state = table(state(p, (j == 0) & (bodies[p] == 0)), n_tail, 2)
    with_init = np.flatnonzero(init[ids])                         # torch.nonzero
    init_tab = table(np.stack([idx[ids[with_init]] * HV * K, with_init * K], axis=1), Nb, 2)
    final_src = np.where(init[ids] | (nch > 0), np.arange(ids.size) * K, zero_row)
    final_tab = table(np.stack([final_src, idx[ids] * HV * K], axis=1), Nb, 2)
    pad = np.flatnonzero(~live)
    q, j = flat(nchunks[pad])
    pad_rows = table(chunks(pad[q], j), entries + 1, C)
    counts = np.array([[q.size, with_init.size, body.shape[0], p.size, ids.size]],
                      dtype=np.int32)
    return body_rows, body_state, tail_rows, tail_state, init_tab, final_tab, pad_rows, counts


def default_chunk_size(K, V, HV):
    """The chunk the cost model runs the model shapes fastest at: 128 (Qwen3-Next TP1 2K
    bf16, modeled trn2: 1.13 M tokens/s at 128 vs 0.92 M at 64; TP4 3.7 M vs 2.8 M)."""
    return 128


def prefill(*, q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, cu_seqlens,
            ssm_states, state_indices, has_initial_state, chunk_size, backend):
    """Launch ``gdn_chunk_prefill`` on the host path (``prefill_call`` with NumPy)."""
    return prefill_call(NUMPY, host_call(backend), q=q, k=k, v=v, g=g, beta=beta, a=a, b=b,
                        A_log=A_log, dt_bias=dt_bias, scale=scale, use_qk_l2norm=use_qk_l2norm,
                        cu_seqlens=cu_seqlens, ssm_states=ssm_states,
                        state_indices=state_indices, has_initial_state=has_initial_state,
                        chunk_size=chunk_size)


def prefill_call(xp, call, *, q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm,
                 cu_seqlens, ssm_states, state_indices, has_initial_state, chunk_size):
    """Lay out, launch ``call(prefill_kernel(), *args)``; returns o ``[num_tokens, HV, V]``
    in q's dtype.

    ``xp``: the array namespace of q ... ssm_states (``_arrays``); the index
    arrays are host arrays. ``ssm_states`` is updated in place (named slots
    only). num_tokens and num_seqs are padded to their buckets (``buckets.py``);
    token arrays get one more zero row (read for chunk rows past a sequence end);
    the batch composition goes in as the int32 tables of ``prefill_tables``.
    Precision follows the input dtype: bfloat16 q gives bf16 TensorE operands for
    the doubling and tfloat32 ones for the products with the state and the solution
    (the kernel's design note), float32 gives float32 everywhere.
    """
    T, H, K = q.shape
    HV, V = v.shape[1:]
    _check_limits(K, V, HV)
    slots = ssm_states.shape[0]
    num_seqs = len(state_indices)
    if chunk_size is None:
        chunk_size = default_chunk_size(K, V, HV)
    Tb, Nb = token_bucket(T), seq_bucket(num_seqs)
    raw = g is None
    first, second = (a, b) if raw else (g, beta)
    hp = None
    if raw:
        hp = xp.broadcast_rows(xp.cat([xp.f32(A_log), xp.f32(dt_bias)]), _PMAX)
    tables = prefill_tables(cu_seqlens, state_indices, has_initial_state, slots=slots, HV=HV,
                            K=K, chunk_size=chunk_size, num_tokens_bucket=Tb,
                            num_seqs_bucket=Nb)
    pool = xp.pool_view(ssm_states, (slots * HV * K, V))
    # q, k in float32 when the kernel normalises them in float32 (its DMAs never convert)
    l2 = bool(use_qk_l2norm)
    o = call(prefill_kernel(), xp.pad_rows(q, Tb + 1, H * K, f32=l2),
             xp.pad_rows(k, Tb + 1, H * K, f32=l2),
             xp.pad_rows(v, Tb + 1, HV * V), xp.pad_rows(first, Tb + 1, HV, f32=True),
             xp.pad_rows(second, Tb + 1, HV, f32=True), hp, pool,
             *(xp.table(t) for t in tables), int(H), bool(raw), bool(use_qk_l2norm),
             float(scale), int(chunk_size), not xp.is_f32(q))
    xp.commit(pool, ssm_states)
    return o[:T].reshape(T, HV, V)
