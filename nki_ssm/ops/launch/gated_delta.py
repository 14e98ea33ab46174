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
  is padded to its sequence bucket and laid out as a work list
  (``decode_plan`` / ``decode_order``: the live sequences in one half per LNC
  program, each half in full groups for the kernel's main loop, then batches of
  two for its tail loop) with vectorised ops (see ``decode_call``);
- prefill: the pool is passed as its ``[slots*HV*K, V]`` row view (no copy for a
  C-contiguous pool); a slot is the contiguous block from row ``slot*HV*K``
  (``init_tab`` / ``final_tab``), moved with a run-time start; the chunks go in as
  flat work lists (``prefill_tables``), which the ``call.lnc`` programs share with their
  one row of trip counts: they split the value heads (the kernel's design note);
- decode, per loop iteration (``decode_tables``, all float32): q and k become
  one ``[K, width*T*H*2]`` column block (k on partitions, k / q columns
  interleaved per head) plus k / q in the kernel's state layout ``[P,
  width*T*HV/NG*R*2]`` (``decode.state_layout``: partition (g, kb), each q/k head
  repeated for its value heads); v becomes ``[V, width*T*HV]`` (v on partitions);
  gates ``[2, width*T*HV]``; A_log / dt_bias one float32 row; the layout's two 0/1
  tables (``layout_tables``) once per call;
- prefill and decode: run-time tables only (padding sequences: zero output, no
  instructions on the pool);
- decode: the kernel's v-major outputs ``[rows, V, width*T*HV]`` are transposed
  back and rounded once (RNE) to q's dtype.

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


_GROUP = 16    # (sequence, token) pairs per decode main-loop iteration (inputs in one DMA each)
_STREAMS = 2   # sequences per batch (gdn_decode_step's interleaved instruction streams)


def decode_plan(num_seqs: int, T: int = 1):
    """(spi, w, main_rows, tail_rows) of ``gdn_decode_step`` for a bucket of ``num_seqs`` (one
    program's: ``ceil(seq_bucket / lnc)`` under an LNC grid).

    ``spi``: positions per main-loop iteration, _GROUP // T rounded down to a multiple
    of 2 * _STREAMS (an even number of batches; at least 2 batches), or the whole
    bucket if smaller; ``w = min(_STREAMS, num_seqs)``: positions per tail-loop
    iteration. There is a main loop only when ``spi > w`` (``main_rows = num_seqs //
    spi`` iterations at most, else 0); the tail covers the live positions after the
    last full group: ``tail_rows = spi // w`` iterations at most. Shapes only."""
    spi = min(max(2 * _STREAMS, (_GROUP // T) // (2 * _STREAMS) * (2 * _STREAMS)), num_seqs)
    w = min(_STREAMS, num_seqs)
    main_rows = num_seqs // spi if spi > w else 0
    return spi, w, main_rows, spi // w


def decode_order(state_indices, num_seqs: int, T: int = 1, programs: int = 1):
    """(order, pos, slot_of, counts): the decode work list for a batch padded to
    ``num_seqs`` (the bucket) sequences, run by ``programs`` programs (the LNC grid), each
    laid out as ``decode_plan(ceil(num_seqs / programs), T)`` says, with one spare tail row.

    Live sequences are compacted first (``argsort(idx < 0, stable)``, torch.argsort
    (stable=True)) and split into ``programs`` consecutive runs of E = n_live // programs
    (``scaffold.padded_split``), so every program runs the same trip counts: its main loop
    ``n_main = E // spi`` iterations (0 without a main loop) over its first ``n_main*spi``
    positions and its tail loop ``n_tail = ceil((E - n_main*spi) / w)`` iterations of w
    positions over the rest. With LNC=2 and an odd n_live the last live sequence is program
    0's spare batch (the last row of its tail block, run under ``nl.if_else``); program 1's
    spare row is a dump batch (slot 0 of its private one-slot dump of the pool).

    ``order``: the sequence computed at each kernel position: the main positions of every
    program (program 0's ``main_rows*spi``, then program 1's), then the tail positions
    (``(tail_rows + 1)*w`` each, the spare row last); a tail position past a run's end
    mirrors the first of its batch (same inputs, same slot); positions the loops never
    reach hold any sequence (valid indices). ``pos``: each sequence's kernel position
    (valid for live sequences). ``slot_of``: the pool slot of each position (0 on dump
    rows). ``counts [1, 3]`` int32, the one row both programs read: n_main, n_tail, spare.
    """
    from nki_ssm.kernels.scaffold import padded_split

    idx = np.asarray(state_indices, dtype=np.int64)
    spi, w, main_rows, tail_rows = decode_plan(-(-num_seqs // programs), T)
    P = programs
    live = idx >= 0
    perm = np.argsort(~live, kind="stable")
    num_live = int(live.sum())
    E = num_live // P
    spare = num_live - E * P
    _, spans = padded_split(E * P, P)
    start = np.array([first for first, _ in spans], dtype=np.int64)
    n_main = E // spi if main_rows else 0
    first_tail = n_main * spi
    n_tail = -(-(E - first_tail) // w)
    # rank (in the compacted order) of every position: [P, main_rows*spi], then per program
    # [tail_rows*w] tail positions (mirrors past the run's end) and the spare row's w
    main_l = np.arange(main_rows * spi)[None, :] + start[:, None]
    tl = first_tail + np.arange(tail_rows * w)
    tl = np.where(tl < E, tl, first_tail + (tl - first_tail) // w * w)
    tail_l = tl[None, :] + start[:, None]
    spare_l = np.full((P, w), P * E)
    ranks = np.concatenate([main_l.reshape(-1),
                            np.concatenate([tail_l, spare_l], axis=1).reshape(-1)])
    order = perm[np.minimum(ranks, num_seqs - 1)]
    slot_of = np.maximum(idx[order], 0)
    n_main_pos = P * main_rows * spi
    tail_block = (tail_rows + 1) * w
    dump = n_main_pos + np.arange(1, P)[:, None] * tail_block + tail_rows * w + np.arange(w)
    slot_of[dump.reshape(-1)] = 0                 # program p > 0's spare row: the dump slot
    # each live sequence's position: its program's main block, tail block or spare row
    rank = np.argsort(perm, kind="stable")
    p_of = np.minimum(rank // max(E, 1), P - 1)
    l_of = rank - start[p_of]
    pos = np.where(l_of < first_tail, p_of * main_rows * spi + l_of,
                   n_main_pos + p_of * tail_block + l_of - first_tail)
    pos = np.where(rank >= P * E, n_main_pos + tail_rows * w, pos)
    pos = np.minimum(pos, order.shape[0] - 1)
    counts = np.array([[n_main, n_tail, spare]], dtype=np.int32)
    return order, pos, slot_of.astype(np.int32), counts


def decode_tables(xp, q, k, v, first, second, rows, width):
    """(kq, kx, v, gates) of ``gdn_decode_step`` for ``rows * width`` positions (q, k, v,
    gates already in kernel-position order), one row per loop iteration, all float32
    (widened here: the kernel's DMAs do not convert): ``kq [rows, K, width*T*H*2]``
    (k on partitions, k / q columns interleaved per head; columns run over position,
    token, head), ``kx [rows, P, width*T*HV/NG*R*2]`` (k / q in the state layout,
    ``decode.state_layout``: partition (g, kb), column (position, token, G, i, k|q) holds
    row ``kb*R + i`` of value head ``G*NG + g``'s q/k head), ``v [rows, V, width*T*HV]``
    (v on partitions), ``gates [rows, 2, width*T*HV]`` (g and beta, or a and b)."""
    from nki_ssm.kernels.gated_delta.decode import state_layout

    S, T, H, K = q.shape
    HV, V = v.shape[2:]
    R, NG = state_layout(K, V, HV)
    QP = K // R
    kq2 = xp.stack([xp.f32(k), xp.f32(q)], axis=-1)          # [S, T, H, K, 2]
    kq = xp.permute(kq2.reshape(rows, width, T, H, K, 2),
                    (0, 4, 1, 2, 3, 5)).reshape(rows, K, width * T * H * 2)
    kx = xp.repeat(kq2, HV // H, axis=2).reshape(rows, width, T, HV // NG, NG, QP, R, 2)
    kx = xp.permute(kx, (0, 4, 5, 1, 2, 3, 6, 7)).reshape(rows, NG * QP,
                                                          width * T * (HV // NG) * R * 2)
    v_tab = xp.permute(xp.f32(v).reshape(rows, width, T, HV, V),
                       (0, 4, 1, 2, 3)).reshape(rows, V, width * T * HV)
    gates = xp.stack([xp.f32(first).reshape(S, T * HV), xp.f32(second).reshape(S, T * HV)],
                     axis=1).reshape(rows, width, 2, T * HV)
    gates = xp.permute(gates, (0, 2, 1, 3)).reshape(rows, 2, width * T * HV)
    return kq, kx, v_tab, gates


def layout_tables(K, V, HV):
    """The 0/1 tables of the state layout (host NumPy, float32): ``blk [P, NG]`` (partition
    p serves head ``p // (K/R)`` of its group) and ``sel [HV, HV/NG * P]`` (value head hv
    lands on partition p of group G: ``hv == G*NG + p // (K/R)``)."""
    from nki_ssm.kernels.gated_delta.decode import state_layout

    R, NG = state_layout(K, V, HV)
    QP = K // R
    P = NG * QP
    g_of = np.arange(P) // QP
    blk = (g_of[:, None] == np.arange(NG)[None, :]).astype(np.float32)
    hv = np.arange(HV)[:, None, None]
    G = np.arange(HV // NG)[None, :, None]
    sel = (hv == G * NG + g_of[None, None, :]).astype(np.float32).reshape(HV, (HV // NG) * P)
    return blk, sel


def _kernel_positions(xp, out, rows, width, T, HV, V):
    """o ``[rows, V, width*T*HV]`` (a kernel output) as ``[rows*width, T, HV, V]``."""
    return xp.permute(xp.f32(out).reshape(rows, V, width, T, HV),
                      (0, 2, 3, 4, 1)).reshape(rows * width, T, HV, V)


def _check_limits(K, V, HV):
    """The kernels keep K, V (and, in decode, HV) on partitions: each must be <= 128."""
    for name, val in (("K (q.shape[-1])", K), ("V (v.shape[-1])", V), ("HV (v.shape[-2])", HV)):
        if val > _PMAX:
            raise ValueError(f"{name} must be <= {_PMAX} for the gated delta kernels "
                             f"(partition dim), got {val}; use backend='reference'")


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
    ``seq_bucket(num_seqs)`` and laid out as a work list (``decode_order``) for the
    ``call.lnc`` programs of the launch (each a bucket of ``seq_bucket / lnc``, its
    rows stacked after the previous program's): the per-sequence inputs are gathered
    in kernel-position order (``x[order]``,
    index_select) and split into the main loop's rows of ``spi`` positions and the
    tail loop's rows of ``w`` plus one spare row per program (``decode_tables``); the
    pool slot of each position is an int32 table per loop. Outputs come back by ``pos``,
    padding sequences zeroed (torch.where).
    """
    S, T, H, K = q.shape
    HV, V = v.shape[2:]
    _check_limits(K, V, HV)
    slots = ssm_states.shape[0]
    raw = g is None
    nb = seq_bucket(S)
    idx = np.full(nb, -1, dtype=np.int64)
    idx[:S] = np.asarray(state_indices, dtype=np.int64)
    n_prog = call.lnc
    spi, w, main_rows, tail_rows = decode_plan(-(-nb // n_prog), T)
    order, pos, slot_of, counts = decode_order(idx, nb, T, n_prog)
    src = np.minimum(order, S - 1)        # positions past the batch hold any real sequence
    n_main_pos = n_prog * main_rows * spi
    first, second = (a, b) if raw else (g, beta)
    per_pos = [xp.take(x, src) for x in (q, k, v, first, second)]
    main = [None] * 5
    if main_rows:
        main = list(decode_tables(xp, *[x[:n_main_pos] for x in per_pos], n_prog * main_rows,
                                  spi))
        main.append(xp.table(slot_of[:n_main_pos].reshape(n_prog * main_rows, spi)))
    # each program's tail rows and its spare row
    tail = list(decode_tables(xp, *[x[n_main_pos:] for x in per_pos],
                              n_prog * (tail_rows + 1), w))
    tail.append(xp.table(slot_of[n_main_pos:].reshape(n_prog * (tail_rows + 1), w)))
    head_params = None
    if raw:
        head_params = xp.cat([xp.f32(A_log), xp.f32(dt_bias)]).reshape(1, 2 * HV)
    blk, sel = layout_tables(K, V, HV)
    pool = xp.pool_view(ssm_states, (slots, HV * K * V))
    out = call(decode_kernel(), *main, *tail, head_params, xp.table(blk), xp.table(sel), pool,
               xp.table(counts), int(T),
               int(H), bool(raw), bool(use_qk_l2norm), float(scale),
               bool(return_intermediate_states))
    xp.commit(pool, ssm_states)
    if not isinstance(out, (tuple, list)):
        out = (out,)
    n_o = 2 if main_rows else 1
    o_parts = []
    if main_rows:
        o_parts.append(_kernel_positions(xp, out[0], n_prog * main_rows, spi, T, HV, V))
    o_parts.append(_kernel_positions(xp, out[n_o - 1], n_prog * (tail_rows + 1), w, T, HV, V))
    live = idx[:S] >= 0
    at = pos[:S]
    o = xp.take(xp.cat(o_parts), at)
    o = xp.cast_like(xp.where_rows(live, o), q)
    if return_intermediate_states:
        i_parts = [x.reshape(-1, T, HV, K, V) for x in out[n_o:]]
        inter = xp.take(xp.cat(i_parts), at)
        return o, xp.cast_like(xp.where_rows(live, inter), ssm_states)
    return o


def prefill_tables(cu_seqlens, state_indices, has_initial_state, *, slots, HV, K, chunk_size,
                   num_tokens_bucket, num_seqs_bucket, H, bf16, programs=1):
    """Batch composition of ``gdn_chunk_prefill`` as its int32 work lists (layouts in its
    docstring): ``(body_rows, body_state, tail_rows, tail_state, init_tab, final_tab,
    pad_rows, counts)`` for a launch of ``programs`` SPMD programs (the LNC, 1 or 2).

    The programs split the value heads (``heads_per_program``: halves of HV at LNC=2 when HV
    is even; otherwise every program runs all of them, all but program 0 into dumps), so
    every program runs every chunk, for its own heads: the work lists, ``counts``
    included, are shared, and both programs take one control flow.

    Every step is one vectorised array op with a direct torch equivalent on
    device (named in the comments), so a serving loop builds them without a
    host round trip: ``diff``, ``where``, ``cumsum``, ``nonzero`` (stable
    compaction), ``repeat_interleave``, ``arange``, broadcasting arithmetic.
    With ``n = chunks_per_iteration(heads_per_program(HV, programs), compact_inputs(H, HV,
    bf16))`` (``H`` the layer's q/k heads; ``bf16``: the kernel's, bfloat16 activations) and
    the live sequences compacted (position p, scratch block p, the zero block
    ``num_seqs_bucket``; a block row is ``block*K``):

    - ``body_rows [max(E // n, 1), n*C]``: the token rows of every body of n consecutive
      chunks (a sequence's first ``n * (chunks // n)`` chunks), in order; rows past a
      sequence end hold ``num_tokens_bucket`` (the zero / trash row); ``tail_rows
      [max(min(E, Nb*(n-1)), 1), C]``: each sequence's remaining chunks, one per row;
      ``E = num_tokens_bucket // C + num_seqs_bucket`` bounds the chunks of a batch;
    - ``body_state``, ``tail_state`` (one row per work row): (source block row, destination
      block row): the sequence's own block, or the zero block as the source of its first
      row when it has no initial state;
    - ``init_tab [Nb, 2]``: (first pool row ``slot*HV*K``, block row) of each live sequence
      with an initial state; ``final_tab [Nb, 2]``: (block row, pool row) of every live
      sequence (an empty one without initial state: the zero block);
    - ``pad_rows [E + 1, C]``: the chunks of padding sequences (their output rows get zeros);
    - ``counts [1, 5]``: padding chunks, initial states, body rows, tail rows, live
      sequences (the one row every program reads).
    """
    from nki_ssm.kernels.gated_delta.chunk import (chunks_per_iteration, compact_inputs,
                                                   heads_per_program)

    C = int(chunk_size)
    Tb, Nb = int(num_tokens_bucket), int(num_seqs_bucket)
    if slots * HV * K > _INT32_MAX:
        raise ValueError(f"ssm_states must have slots*HV*K <= {_INT32_MAX} (int32 row indices), "
                         f"got {slots}*{HV}*{K} = {slots * HV * K}")
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    idx = np.asarray(state_indices, dtype=np.int64)
    init = np.asarray(has_initial_state).astype(bool)
    heads = heads_per_program(HV, programs)
    n = chunks_per_iteration(heads, compact_inputs(H, HV, bf16))
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
    # room for the most bodies the bucket holds (at least one row: a table is never empty)
    n_body = max(entries // n, 1)
    body_rows = table(body, n_body, n * C)
    body_state = table(state(p, m == 0), n_body, 2)
    n_tail = max(min(entries, Nb * (n - 1)), 1)
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
    bf16 = not xp.is_f32(q)
    first, second = (a, b) if raw else (g, beta)
    hp = None
    if raw:
        hp = xp.broadcast_rows(xp.cat([xp.f32(A_log), xp.f32(dt_bias)]), _PMAX)
    tables = prefill_tables(cu_seqlens, state_indices, has_initial_state, slots=slots, HV=HV,
                            K=K, chunk_size=chunk_size, num_tokens_bucket=Tb,
                            num_seqs_bucket=Nb, H=H, bf16=bf16, programs=call.lnc)
    pool = xp.pool_view(ssm_states, (slots * HV * K, V))
    # q, k in float32 when the kernel normalises them in float32 (its DMAs never convert)
    l2 = bool(use_qk_l2norm)
    o = call(prefill_kernel(), xp.pad_rows(q, Tb + 1, H * K, f32=l2),
             xp.pad_rows(k, Tb + 1, H * K, f32=l2),
             xp.pad_rows(v, Tb + 1, HV * V), xp.pad_rows(first, Tb + 1, HV, f32=True),
             xp.pad_rows(second, Tb + 1, HV, f32=True), hp, pool,
             *(xp.table(t) for t in tables), int(H), bool(raw), bool(use_qk_l2norm),
             float(scale), int(chunk_size), bf16)
    xp.commit(pool, ssm_states)
    return o[:T].reshape(T, HV, V)
