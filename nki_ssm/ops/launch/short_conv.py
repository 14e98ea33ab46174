"""Launcher of the short causal conv1d kernels (``nki_ssm.kernels.short_conv``).

Host side only arranges layouts and run-time tables, each a few vectorised
array ops a torch path runs on device (named in ``prefill_tables`` /
``decode_tables``): for prefill x is padded to the token bucket and the batch
(cu_seqlens, state_indices, has_initial_state) becomes the int32 / uint32
tables of the kernel's design note, padded to the sequence bucket, so the
kernel compiles once per (bucket, layer shape); the matmul precision flags are
chosen from the dtypes. For decode the pool is a ``[slots * R, (dim / R) *
(W-1)]`` view with one row per (sequence, channel block). All gathers and
scatters happen inside the kernels; the pool is updated in place.

The layout work lives in ``prefill_call`` / ``decode_call``, shared with the
torch device path (package docstring).
"""
from __future__ import annotations

import numpy as np

from nki_ssm.kernels.short_conv.split import program_channels
from nki_ssm.ops.launch._arrays import NUMPY, host_call

_INT32_MAX = np.iinfo(np.int32).max
# the decode program's wide row layout: up to this many channel blocks per sequence
WIDE_BLOCKS = 4


def prefill_kernel():
    """The ``@nki.jit`` kernel ``prefill_call`` launches."""
    from nki_ssm.kernels.short_conv.prefill import short_conv_prefill_kernel

    return short_conv_prefill_kernel


def decode_kernel():
    """The ``@nki.jit`` kernel ``decode_call`` launches."""
    from nki_ssm.kernels.short_conv.decode import short_conv_decode_kernel

    return short_conv_decode_kernel


def _needs_split(a, xp=NUMPY) -> bool:
    """float32 values that bfloat16 does not hold exactly need a hi + lo split."""
    if a is None or not xp.is_f32(a):
        return False
    return not xp.exact_in_bf16(a)


def _precision_flags(x, weight, bias, conv_states, xp=NUMPY):
    """(mm_fp32, x_stage, w_split, b_split) for the prefill kernel (see its docstring).

    Matmuls are float32 when x or the pool is float32 (pool values must pass
    through exactly); otherwise bfloat16, with float32 weights / bias split in
    hi + lo bfloat16 parts unless they are bfloat16 values already (a check of
    dim * W numbers; part of the kernel's compile-time flags, so on device it
    reads one bool back).
    """
    mm_fp32 = xp.is_f32(x) or xp.is_f32(conv_states)
    x_stage = mm_fp32 and not xp.is_f32(x)
    w_split = (not mm_fp32) and _needs_split(weight, xp)
    b_split = (not mm_fp32) and _needs_split(bias, xp)
    return mm_fp32, x_stage, w_split, b_split


def prefill_tables(cu_seqlens, state_indices, has_initial_state, num_tokens_bucket: int,
                   num_seqs_bucket: int, W: int, dim: int, programs: int = 1):
    """The run-time batch tables of ``short_conv_prefill_kernel`` (layouts in its module
    docstring) for a batch padded to the buckets, launched as ``programs`` (the LNC)
    programs: each takes ``Dp`` channels (``program_channels``) and writes y as its own
    block of ``ceil(Dp / 128)`` rows of 128 channels per token.

    Returns (win_base, seq_rows, seq_yrows, seq_info, zero_slots, counts). Every step is a
    vectorised array op with a torch equivalent that runs on device (no per-sequence
    host loop):

    - ``win_base [128, NI]`` (a function of the bucket only): ``arange`` broadcast adds,
      the window row offsets ``j * 128 + p - M`` (float32: the kernel adds each chunk's
      start on VectorE and clamps into the bucket);
    - ``live = idx >= 0``; ``perm = argsort(~live, stable)`` (torch.argsort(stable=True):
      live sequences first, in order); ``num_live = live.sum()``;
    - ``start, end = cu[:-1][perm], cu[1:][perm]`` (index_select); ``length = end - start``;
    - head / tail rows: broadcast adds of ``arange(NH)`` to start and end - NH, ``clip``;
    - y rows (y as 128-channel rows, ``nt = programs * ceil(Dp / 128)`` per token) of the
      first H tokens per channel tile j of a program's block: ``where(arange(H) < length,
      start + arange(H), NB + arange(H)) * nt + j`` (scratch rows past the bucket;
      broadcast ops and one scatter into the [SB, columns, 128] layout the kernel reads;
      each program adds its block's offset);
    - seq_info: slot (``where(live, idx, 0)``) and the new-state case ``minimum(length,
      H)``, stacked (index_select by perm);
    - zero_slots: the slots of live sequences without initial state first
      (``argsort(~(live & ~has_initial_state), stable)``, index_select); their count;
    - counts ``[1, 4]``, the one row every program reads: with ``pairs =
      ceil(ceil(num_tokens / CHUNK) / 2)`` chunk pairs and ``loop = max(pairs - 1, 0)``
      of them in the stream loops (the last pair follows them), ``loop // PAIRS`` and
      ``loop % PAIRS`` (iterations of PAIRS_PER_ITERATION pairs, then of one), num_live
      and the number of slots to zero (integer ops on scalars of ``cu[-1]`` and sums); a
      program without channels of its own (they do not split) runs the same loops into
      its own y block and a dump of the pool.
    """
    from nki_ssm.kernels.short_conv.prefill import (PAIRS_PER_ITERATION, TILE, _chunk_tokens,
                                                    _index_columns, _margin)

    NB, SB, H = int(num_tokens_bucket), int(num_seqs_bucket), W - 1
    M = _margin(H)
    NH = M
    CH = _chunk_tokens(NB)
    NI = _index_columns(M + CH)
    # window column j * 128 + p of a chunk starting at t0 holds token t0 - M + j * 128 + p
    win_base = (np.arange(NI)[None, :] * TILE + np.arange(TILE)[:, None] - M)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    idx = np.asarray(state_indices, dtype=np.int64)
    init = np.asarray(has_initial_state, dtype=bool)
    S = idx.shape[0]
    live = np.zeros(SB, dtype=bool)
    live[:S] = idx >= 0
    seq_start = np.full(SB, cu[-1], dtype=np.int64)
    seq_end = np.full(SB, cu[-1], dtype=np.int64)
    seq_start[:S], seq_end[:S] = cu[:-1], cu[1:]
    slot = np.zeros(SB, dtype=np.int64)
    slot[:S] = np.where(idx >= 0, idx, 0)
    has_init = np.zeros(SB, dtype=bool)
    has_init[:S] = init & (idx >= 0)
    perm = np.argsort(~live, kind="stable")
    num_live = int(live.sum())
    s0, s1 = seq_start[perm], seq_end[perm]
    length = s1 - s0
    k = np.arange(NH)[None, :]
    head = np.clip(s0[:, None] + k, 0, NB - 1)
    tail = np.clip(s1[:, None] - NH + k, 0, NB - 1)
    seq_rows = np.concatenate([head, tail], axis=1)[:, :, None]
    kh = np.arange(H)[None, :]
    y_row = np.where(kh < length[:, None], s0[:, None] + kh, NB + kh)          # [SB, H]
    # y rows (y as 128-channel rows, nt per token) of token k, tile j of a program's
    # block: row_k * nt + j, in columns of 128 // H tiles (row (j % tb) * H + k of column
    # j // tb), the partial tile (if any) in its own last column
    Dp, parts = program_channels(dim, programs)
    nt = programs * -(-Dp // TILE)
    nfull = Dp // TILE
    tb = TILE // H
    nb_full = -(-nfull // tb)
    ncol = nb_full + (1 if Dp % TILE else 0)
    seq_yrows = np.zeros((SB, ncol, TILE), dtype=np.int64)
    j = np.arange(nfull)
    pos = (j % tb)[:, None] * H + np.arange(H)[None, :]              # [nfull, H]
    seq_yrows[:, j[:, None] // tb, pos] = y_row[:, None, :] * nt + j[None, :, None]
    if Dp % TILE:
        seq_yrows[:, nb_full, :H] = y_row * nt + nfull
    # per live sequence: slot, case min(length, H) (which candidate new state is stored)
    seq_info = np.stack([slot[perm], np.minimum(length, H)], axis=1)
    # slots that start from zeros: live sequences without initial state, compacted
    zperm = np.argsort(~(live & ~has_init), kind="stable")
    num_zero = int((live & ~has_init).sum())
    zero_slots = slot[zperm][:, None]
    n_real = -(-int(cu[-1]) // CH)
    pairs = (n_real + 1) // 2
    loop = max(pairs - 1, 0)
    counts = np.array([[loop // PAIRS_PER_ITERATION, loop % PAIRS_PER_ITERATION, num_live,
                        num_zero]], dtype=np.int64)
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    u32 = lambda a: np.ascontiguousarray(a, dtype=np.uint32)  # noqa: E731
    i32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)  # noqa: E731
    return (f32(win_base), u32(seq_rows), i32(seq_yrows), i32(seq_info), i32(zero_slots),
            i32(counts))


def prefill(*, x, weight, bias, activation, cu_seqlens, conv_states, state_indices,
            has_initial_state, backend):
    """Run the prefill kernel on the host path (``prefill_call`` with NumPy)."""
    return prefill_call(NUMPY, host_call(backend), x=x, weight=weight, bias=bias,
                        activation=activation, cu_seqlens=cu_seqlens, conv_states=conv_states,
                        state_indices=state_indices, has_initial_state=has_initial_state)


def prefill_call(xp, call, *, x, weight, bias, activation, cu_seqlens, conv_states,
                 state_indices, has_initial_state):
    """Lay out, launch ``call(prefill_kernel(), *args)``: y ``[num_tokens, dim]`` in x's dtype;
    ``conv_states`` updated in place (by the kernel's own writes when it is C-contiguous).

    ``xp``: the array namespace of x, weight, bias, conv_states (``_arrays``; NumPy
    here, torch on device); the index arrays are host arrays.
    """
    from nki_ssm.kernels.short_conv.prefill import MAX_HALO
    from nki_ssm.ops.launch.buckets import seq_bucket, token_bucket

    num_tokens, dim = x.shape
    slots, _, h = conv_states.shape
    if h > MAX_HALO:
        raise ValueError(f"weight must have W - 1 <= {MAX_HALO} taps of history for the prefill "
                         f"kernel, got W = {h + 1}")
    if slots * dim * h > _INT32_MAX:
        raise ValueError(f"conv_states must have slots * dim * (W-1) <= {_INT32_MAX} (int32 "
                         f"element offsets), got {slots} * {dim} * {h}")
    NB = token_bucket(num_tokens)
    num_seqs = len(state_indices)
    SB = seq_bucket(num_seqs)
    tables = prefill_tables(cu_seqlens, state_indices, has_initial_state, NB, SB, h + 1, dim,
                            call.lnc)
    # the pool as its [slots, dim * (W-1)] row view (one slot's state per row)
    pool = xp.pool_view(conv_states, (slots, dim * h))
    flags = _precision_flags(x, weight, bias, conv_states, xp)
    # padding tokens (zeros) up to the bucket: they belong to no sequence
    y = call(prefill_kernel(), xp.pad_rows(x, NB, dim), xp.contiguous(weight),
             xp.contiguous(bias), pool, *(xp.table(t) for t in tables),
             "silu" if activation == "silu" else "none", bias is not None, *flags)
    xp.commit(pool, conv_states)
    # tokens of padding sequences are zero (torch.repeat_interleave + where on device)
    lengths = np.diff(np.asarray(cu_seqlens, dtype=np.int64))
    token_live = np.repeat(np.asarray(state_indices) >= 0, lengths)
    # each program's block of y rows holds its Dp channels (program 1's block is scratch
    # when it gets no work)
    Dp, parts = program_channels(dim, call.lnc)
    y = y.reshape(-1, call.lnc, -(-Dp // 128) * 128)[:num_tokens, :parts, :Dp]
    return xp.where_rows(token_live, y.reshape(num_tokens, parts * Dp))


def wide_blocks(dim: int) -> int:
    """R of the wide layout compiled beside the one-block layout, and the pool rows per
    slot: the largest power of two <= WIDE_BLOCKS with dim / R a multiple of 128 (so the
    one-block layout's 128-channel sub-tiles never cross a pool row); 1 (the program holds
    the one-block layout only) when there is none."""
    r = 1
    while r * 2 <= WIDE_BLOCKS and dim % (r * 2 * 128) == 0:
        r *= 2
    return r


def decode_tables(state_indices, num_seqs: int, R: int, RB: int, stride: int | None = None):
    """(order, pos, pool_rows, num_live) of one row layout (R channel blocks per
    sequence, a program's channels held in RB pool rows per slot, RB a multiple of R,
    ``stride`` (default RB) pool rows per slot: ``parts * RB`` when the programs of an
    LNC launch split the channels, each program adding its own first row) of
    ``short_conv_decode_kernel`` for a batch padded to ``num_seqs`` (the bucket)
    sequences; layouts in the kernel's docstring.

    ``order [num_seqs]``: the sequence at each position of the compacted batch (the host
    gathers x rows by it); ``pos [num_seqs]``: the position where each live sequence is
    computed (its y row; ``argsort(perm)``, the inverse permutation); ``pool_rows
    [num_seqs, RB]``: the layout's ``[groups, R * Pn, RB / R]`` table of pool rows
    (partition ``r * Pn + i`` holds block r of position i: pool rows ``slot * stride + r *
    RB / R + c``) viewed with RB entries per position, so group g starts at row
    ``g * Pn``. Vectorised, each step one torch op on device (no per-sequence host loop):
    ``live = idx >= 0``; ``perm = argsort(~live, stable)`` (torch.argsort(stable=True):
    live sequences first, in order); ``num_live = live.sum()``; position q takes
    ``perm[q]`` if ``q < num_live`` else ``perm`` at its group's first position
    (torch.where + index_select: a padding position mirrors a live sequence of its own
    group); pool rows by broadcast adds and a reshape.
    """
    idx = np.asarray(state_indices, dtype=np.int64)
    stride = RB if stride is None else stride
    Pn = min(128 // R, num_seqs)
    G = num_seqs // Pn
    K = RB // R
    live = idx >= 0
    perm = np.argsort(~live, kind="stable")
    num_live = int(live.sum())
    q = np.arange(num_seqs)
    order = perm[np.where(q < num_live, q, (q // Pn) * Pn)]
    slot = np.maximum(idx[order], 0)
    r = np.arange(R)[None, :, None, None]
    c = np.arange(K)[None, None, None, :]
    pool_rows = (slot.reshape(G, 1, Pn, 1) * stride + r * K + c).reshape(num_seqs, RB)
    pos = np.argsort(perm, kind="stable")
    return order, pos, np.ascontiguousarray(pool_rows, dtype=np.int32), num_live


def use_wide_layout(num_live: int, R: int) -> bool:
    """The launcher's per-call layout choice: the wide layout when its live rows fit two
    groups of 128 partitions (``num_live * R <= 256``), else one block per sequence.
    Measured crossover (modeled, trn2, dim 8192, bf16, R = 4, one token): wide / one
    block 55.5 / 101.0 us at 32 live sequences, 83.1 / 101.1 at 64, 110.7 / 110.1 at 96,
    138.2 / 110.1 at 128."""
    return R > 1 and num_live * R <= 256


def decode_plan(state_indices, num_seqs: int, dim: int, programs: int = 1):
    """(R, parts, order, pos, rows_wide, rows_one, counts): the run-time arguments of
    ``short_conv_decode_kernel`` for a batch padded to ``num_seqs`` (the bucket)
    sequences, launched as ``programs`` (the LNC) programs that split the channels in
    ``parts`` halves of Dp (``program_channels``; R = ``wide_blocks(Dp)``, the pool
    viewed as ``parts * R`` rows per slot): both layouts' tables (``decode_tables``; one
    table for both programs, each adding its first row), the x order and y positions of
    the layout used, and counts ``[1, 3]`` int32, the one row every program reads (wide
    stop, one-block stop, one-block diagonal-build flag), the layout not used getting 0
    (``use_wide_layout`` picks); a program without channels of its own runs the same
    loops into dumps. On device: the two table builds, one scalar compare and
    torch.where selections.
    """
    Dp, parts = program_channels(dim, programs)
    R = wide_blocks(Dp)
    order_w, pos, rows_wide, num_live = decode_tables(state_indices, num_seqs, R, R,
                                                      parts * R)
    order_1, _, rows_one, _ = decode_tables(state_indices, num_seqs, 1, R, parts * R)
    wide = R > 1 and bool(use_wide_layout(num_live, R))
    order = order_w if wide else order_1
    counts = np.array([[num_live if wide else 0, 0 if wide else num_live,
                        int(not wide and num_live > 0)]], dtype=np.int32)
    return R, parts, order, pos, rows_wide, rows_one, counts


def decode(*, x, weight, bias, activation, conv_states, state_indices, backend):
    """Run the decode kernel on the host path (``decode_call`` with NumPy)."""
    return decode_call(NUMPY, host_call(backend), x=x, weight=weight, bias=bias,
                       activation=activation, conv_states=conv_states,
                       state_indices=state_indices)


def decode_call(xp, call, *, x, weight, bias, activation, conv_states, state_indices):
    """Decode / multi-token update: y shaped like x (``[num_seqs, T, dim]`` or ``[num_seqs, dim]``).

    ``xp``: the array namespace of x, weight, bias, conv_states (``_arrays``);
    state_indices is a host array. The batch is padded to ``seq_bucket(num_seqs)``
    sequences, so the kernel is compiled once per (bucket, layer shape). The program
    holds two row layouts (R = ``wide_blocks(dim)`` channel blocks per sequence, and one
    block); the launcher picks one per call: the wide one when its live rows fit two
    groups of 128 partitions (``num_live * R <= 256``, ``use_wide_layout``), else one
    block (a scalar compare and torch.where on device), and passes the other layout a
    zero trip count (``decode_plan``). x is gathered into the compacted order of the
    chosen layout's ``decode_tables`` (live sequences first, padding positions
    mirroring a live one: ``x[order]``, torch.index_select), so a padding sequence's x
    is never read. The pool is passed as its ``[slots * R, (dim / R) * (W-1)]`` row
    view and updated by the kernel's own scatters. y comes back in the compacted order:
    ``y[pos]`` with ``pos`` the inverse permutation (torch.argsort), zeros for
    padding (torch.where).
    """
    from nki_ssm.ops.launch.buckets import seq_bucket

    squeeze = x.ndim == 2
    x3 = x[:, None, :] if squeeze else x
    num_seqs, T, dim = x3.shape
    slots, dim, h = conv_states.shape
    if slots * dim > _INT32_MAX:
        raise ValueError(f"conv_states must have slots * dim <= {_INT32_MAX}, got {slots * dim}")
    nb = seq_bucket(num_seqs)
    idx = np.full(nb, -1, dtype=np.int64)
    idx[:num_seqs] = np.asarray(state_indices, dtype=np.int64)
    R, parts, order, pos, rows_wide, rows_one, counts = decode_plan(idx, nb, dim, call.lnc)
    # positions past the caller's batch mirror live sequences, so clamping is never used
    xk = xp.take(x3, np.minimum(order, num_seqs - 1))
    flat = xp.pool_view(conv_states, (slots * parts * R, (dim // (parts * R)) * h))
    # TensorE taps need bfloat16-exact operands (the one-block layout only)
    tensor_taps = (xp.is_bf16(x) and xp.is_bf16(conv_states)
                   and not _needs_split(weight, xp) and not _needs_split(bias, xp))
    yk = call(decode_kernel(), xk, xp.contiguous(weight), xp.contiguous(bias), flat,
              xp.table(rows_wide), xp.table(rows_one), xp.table(counts),
              "silu" if activation == "silu" else "none", bias is not None, R, bool(tensor_taps))
    xp.commit(flat, conv_states)
    y = xp.take(yk.reshape(nb, T, dim), pos[:num_seqs])
    y = xp.where_rows(idx[:num_seqs] >= 0, y)
    return y[:, 0, :] if squeeze else y
