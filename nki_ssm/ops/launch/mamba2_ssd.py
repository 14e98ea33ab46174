"""Launcher of the Mamba-2 SSD kernels (``nki_ssm.kernels.mamba2_ssd``).

Host side only pads to buckets, arranges layouts and builds int32 tables;
all math and every pool gather / scatter happens in the kernels, one
compiled program per (bucket, layer shape, dtypes):

- ``num_tokens`` (prefill) is padded to ``token_bucket`` and ``num_seqs``
  (prefill and decode) to ``seq_bucket`` (``buckets.py``); token inputs get
  Q more zero rows (prefill: the rows a chunk past the last token reads),
  and the tokens of padding sequences are zeroed in that copy (a masked
  fill: the kernel may read them as rows past a live sequence's end, and
  they may hold NaN); outputs are sliced back to the caller's sizes;
- the batch composition (which sequences are live, their lengths, slots,
  has_initial_state) becomes run-time int32 tables (``prefill_tables``,
  ``decode_tables``: each a few vectorised array ops that the torch path
  can run on device, listed in their docstrings), never compile-time
  arguments;
- the pool ``[slots, H, P, N]`` is passed as its ``[slots*pr, nt*N]`` row
  view (``pr*nt = H*P``, no copy for a C-contiguous pool), so the kernels
  gather / scatter a sequence's state with one int32 row index per
  partition (``.ap(vector_offset=...)``) and update it in place;
- LNC=2 (``call.lnc``): prefill splits the heads over the two programs
  (two parts: an odd H first becomes 2H heads of P/2 channels; the pool
  view then has ``2*pr`` rows per slot, part 1's ``pr`` after part 0's;
  decode moves a slot by one ``scalar_offset`` DMA, row ``slot*pr``),
  decode splits the live sequences in order into equal runs (one counts row
  for both programs, a spare entry under ``nl.if_else``: ``decode_tables``;
  decode's tables get a block of rows per program). Prefill's tables, counts
  included, are shared: both programs run the whole work list, so heads that
  do not split (an odd H of odd P, e.g. one head) run on both, program 1
  writing into private dumps;
- per-head parameters are repeated on 128 rows (prefill; D [H] goes to the
  TensorE identity path, D [H, P] to the per-channel path) or arranged as
  per-row ``[pr, nt]`` tiles in the decode kernel's segment layout
  (``decode_segments``; slices, reshapes, a concatenation); decode's token
  inputs are put in table order and its y read back from it
  (``decode_y_index``: a row gather and a permute); dt is widened to
  float32; tensors are flattened to 2-D (contiguous reshapes).

The layout work lives in ``prefill_call`` / ``decode_call``, shared with the
torch device path (package docstring).
"""
from __future__ import annotations

import math

import numpy as np

from nki_ssm.ops.launch._arrays import NUMPY, host_call
from nki_ssm.ops.launch.buckets import seq_bucket, token_bucket

_PMAX = 128
_INT32_MAX = np.iinfo(np.int32).max


def _pool_rows(ssm_states: np.ndarray) -> np.ndarray:
    """``[slots*H*P, N]`` view of the pool (the launcher contract makes it C-contiguous)."""
    slots, H, P, N = ssm_states.shape
    if slots * H * P > _INT32_MAX:
        raise ValueError(f"ssm_states must have slots*H*P <= {_INT32_MAX} (int32 row indices), "
                         f"got {slots}*{H}*{P} = {slots * H * P}")
    return ssm_states.reshape(slots * H * P, N)


def prefill_kernel():
    """The ``@nki.jit`` kernel ``prefill_call`` launches."""
    from nki_ssm.kernels.mamba2_ssd.chunk import ssd_chunk_prefill

    return ssd_chunk_prefill


def decode_kernel():
    """The ``@nki.jit`` kernel ``decode_call`` launches."""
    from nki_ssm.kernels.mamba2_ssd.decode import ssd_decode_step

    return ssd_decode_step


def _dt_limit(dt_limit):
    lo, hi = (float(v) for v in dt_limit)
    return lo, (hi if math.isfinite(hi) else math.inf)


def _D_per_row(xp, D, H, P):
    """D as float32 ``[H*P]`` (``[H]`` repeated over P) or None."""
    if D is None:
        return None
    d = xp.f32(D)
    return xp.repeat(d, P, 0) if tuple(d.shape) == (H,) else d.reshape(H * P)


def prefill_tables(cu_seqlens, state_indices, has_initial_state, num_tokens: int,
                   num_seqs: int, chunk_size: int, pr: int, slot_rows: int | None = None,
                   per: int = 2):
    """Run-time batch tables of ``ssd_chunk_prefill`` (its module docstring):
    ``(pair_rows [pair_count, Q, 2*per], pair_vals [pair_count, per + 2], init_table
    [num_seqs, 128, 2], final_table [num_seqs, 128, 2], zero_table [ceil(num_tokens / Q),
    Q, 1], counts [1, 4])`` int32, ``pair_count = ceil(num_tokens / (per*Q)) + num_seqs``.

    ``per`` (2 or 4): chunks per work-list row (per loop-B iteration; ``prefill_per``).
    Pool rows of slot s are ``s * slot_rows + q`` (q < pr; slot_rows defaults to pr).
    Every program of the launch reads all of them (the one control flow of LNC=2):
    the programs split the heads, each running the whole work list on its heads
    (its pool rows a part further per slot, a static offset in the kernel).

    ``num_tokens`` / ``num_seqs`` are the buckets; row ``num_tokens`` is the
    zero (inputs) / dump (y) row that masked chunk rows name; scratch block
    ``num_seqs`` is the kernel's zero state. The work list is every group of ``per``
    chunks of every live sequence, in order (unused rows: all masked). Shapes
    depend only on the buckets, Q and per. Built with vectorised array ops only, each a
    torch op on device: ``diff`` / integer ceil-division (lengths, groups),
    ``nonzero`` of ``state_indices >= 0`` and of has_initial_state (live and
    init order), an exclusive ``cumsum`` (group bases), ``repeat_interleave``
    (group -> sequence, token -> sequence), ``arange`` broadcast adds,
    comparisons and ``where`` (token rows, valid flags, state blocks),
    indexed writes into constant tables.
    """
    Q = chunk_size
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    idx = np.asarray(state_indices, dtype=np.int64)
    lens = cu[1:] - cu[:-1]
    live = np.flatnonzero(idx >= 0)
    n_live = live.size
    lens_l = lens[live]
    init = np.asarray(has_initial_state, dtype=bool)[live]
    zero_block = num_seqs                            # the scratch block of zeros
    pairs = (lens_l + per * Q - 1) // (per * Q)
    total = int(pairs.sum())
    pair_count = -(-num_tokens // (per * Q)) + num_seqs
    pair_rows = np.zeros((pair_count, Q, 2 * per), dtype=np.int32)
    pair_rows[:, :, 0::2] = num_tokens
    pair_vals = np.full((pair_count, per + 2), num_tokens, dtype=np.int32)
    pair_vals[:, per:] = zero_block
    if total:
        seq_of_pair = np.repeat(np.arange(n_live), pairs)
        base = np.concatenate([[0], np.cumsum(pairs)[:-1]])
        local = np.arange(total) - base[seq_of_pair]               # group index in its sequence
        offs = local[:, None] * (per * Q) + np.arange(per * Q)[None, :]  # offset in the sequence
        valid = offs < lens_l[seq_of_pair][:, None]
        tok = np.where(valid, cu[live][seq_of_pair][:, None] + offs, num_tokens)
        for c in range(per):
            pair_rows[:total, :, 2 * c] = tok[:, c * Q:(c + 1) * Q]
            pair_rows[:total, :, 2 * c + 1] = valid[:, c * Q:(c + 1) * Q]
            pair_vals[:total, c] = tok[:, c * Q]
        # state source of each group: its sequence's block (the previous group's
        # result, or the initial state loop A put there) or the zero block
        src = np.where((local > 0) | init[seq_of_pair], seq_of_pair, zero_block)
        pair_vals[:total, per] = seq_of_pair
        pair_vals[:total, per + 1] = src
    pool_rows = idx[live][:, None] * (slot_rows or pr) + np.arange(pr)[None, :]
    init_table = np.zeros((num_seqs, _PMAX, 2), dtype=np.int32)
    n_init = int(init.sum())
    init_table[:n_init, :pr, 0] = pool_rows[init]
    init_table[:n_init, 0, 1] = np.flatnonzero(init)
    final_table = np.zeros((num_seqs, _PMAX, 2), dtype=np.int32)
    final_table[:n_live, :pr, 0] = pool_rows
    # an empty sequence without an initial state ends in the zero state
    final_table[:n_live, 0, 1] = np.where((pairs > 0) | init, np.arange(n_live), zero_block)
    # tokens of padding sequences -> zero rows of y, Q per DMA
    seq_of_tok = np.repeat(np.arange(lens.size), lens)
    pad_tok = np.flatnonzero(idx[seq_of_tok] < 0)
    zero_rows = -(-num_tokens // Q)
    zero_table = np.full((zero_rows * Q, 1), num_tokens, dtype=np.int32)
    zero_table[:pad_tok.size, 0] = pad_tok
    counts = np.array([[n_init, total, n_live, -(-pad_tok.size // Q)]], dtype=np.int32)
    return (pair_rows, pair_vals, init_table, final_table, zero_table.reshape(zero_rows, Q, 1),
            counts)


def prefill_per(num_tokens: int, num_seqs: int, chunk_size: int) -> int:
    """Chunks per loop-B iteration of ``ssd_chunk_prefill`` for the buckets: the largest
    of 2, 4, 8 whose groups the token bucket holds for every sequence of the sequence
    bucket (``num_tokens >= per * Q * num_seqs``). Long sequences pay the iteration
    boundary (the previous group's last stores, chunk 0's prologue chain) once per
    ``per`` chunks; short ones would pad more all-masked chunks. Capped at 8: the
    program grows by one chunk's items per chunk (~600 instructions at Mamba-2 2.7B)."""
    per = 2
    while per < 8 and num_tokens >= 2 * per * chunk_size * num_seqs:
        per = 2 * per
    return per


_MAX_KERNEL_P = 256   # the prefill kernel packs y_intra | y_off ([Q, 2P] fp32) in one PSUM bank


def _head_split(P: int) -> int:
    """Smallest k with P % k == 0 and P / k <= _MAX_KERNEL_P."""
    k = 2
    while P % k or P // k > _MAX_KERNEL_P:
        k += 1
    return k


def prefill(*, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens, ssm_states,
            state_indices, has_initial_state, chunk_size, precision, backend):
    """Launch ``ssd_chunk_prefill`` on the host path (``prefill_call`` with NumPy)."""
    return prefill_call(NUMPY, host_call(backend), x=x, dt=dt, A=A, B=B, C=C, D=D, z=z,
                        dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
                        cu_seqlens=cu_seqlens, ssm_states=ssm_states,
                        state_indices=state_indices, has_initial_state=has_initial_state,
                        chunk_size=chunk_size, precision=precision)


def prefill_call(xp, call, *, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens,
                 ssm_states, state_indices, has_initial_state, chunk_size, precision):
    """Lay out, launch ``call(prefill_kernel(), *args)``; returns y ``[num_tokens, H, P]`` in
    x's dtype.

    ``xp``: the array namespace of x ... ssm_states (``_arrays``; NumPy here, torch
    on device); the index arrays are host arrays. ``ssm_states`` is updated in place
    (named slots only). Token inputs are padded to the token bucket plus Q zero rows
    (the rows masked chunk rows read), the batch to the sequence bucket.
    """
    T, H, P = x.shape
    if P > _MAX_KERNEL_P or (call.lnc == 2 and H % 2 and P % 2 == 0):
        # the recurrence is independent along P: a head of P channels is k heads
        # of P / k channels sharing its dt, A, D (per head), dt_bias (contiguous
        # reshapes of x, z, D [H, P] and the pool; repeats of the per-head arrays).
        # Also an odd number of heads at LNC=2: 2H heads of P/2 split evenly
        k = _head_split(P) if P > _MAX_KERNEL_P else 2
        Hk, Pk = H * k, P // k
        pool = xp.pool_view(ssm_states, (ssm_states.shape[0], Hk, Pk, ssm_states.shape[-1]))

        def per_head(a):
            return None if a is None else xp.repeat(a, k, -1)

        Dk = None if D is None else (per_head(D) if tuple(D.shape) == (H,)
                                     else D.reshape(Hk, Pk))
        y = prefill_call(xp, call, x=x.reshape(T, Hk, Pk), dt=per_head(dt), A=per_head(A), B=B,
                         C=C, D=Dk, z=None if z is None else z.reshape(T, Hk, Pk),
                         dt_bias=per_head(dt_bias), dt_softplus=dt_softplus,
                         dt_limit=dt_limit, cu_seqlens=cu_seqlens, ssm_states=pool,
                         state_indices=state_indices, has_initial_state=has_initial_state,
                         chunk_size=chunk_size, precision=precision)
        xp.commit(pool, ssm_states)
        return y.reshape(T, H, P)
    G, N = B.shape[1:]
    S = len(state_indices)
    slots = ssm_states.shape[0]
    Tb, Sb = token_bucket(T), seq_bucket(S)
    # LNC=2: each program takes half of the heads (an odd H was split along P
    # above; an odd H of odd P stays whole: both programs run it, program 1 into
    # private dumps; the kernel's program_share agrees)
    parts = 2 if call.lnc == 2 and H % 2 == 0 else 1
    pr, nt = decode_layout(H // parts, P, 1)   # pr partitions x nt state rows, per part
    tables = prefill_tables(cu_seqlens, state_indices, has_initial_state, Tb, Sb,
                            int(chunk_size), pr, parts * pr, prefill_per(Tb, Sb, int(chunk_size)))

    # tokens of padding sequences are zeroed (a masked fill): a chunk reads the Q
    # rows from its first token on, so rows past a sequence's end must be finite
    # (they are masked by dt' = 0, and 0 * NaN would not be 0)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    real_tok = np.repeat(np.asarray(state_indices) >= 0, cu[1:] - cu[:-1])

    def tok2d(a, width, f32=False):       # [T, ...] -> [Tb + Q, width], zero rows appended
        if a is None:
            return None
        return xp.pad_rows(xp.where_rows(real_tok, a.reshape(T, width)),
                           Tb + int(chunk_size), width, f32)

    # D [H] is folded into TensorE (D_h * I); D [H, P] is applied per channel
    D_heads = D_row = None
    if D is not None and tuple(D.shape) == (H,):
        D_heads = xp.broadcast_rows(xp.f32(D), _PMAX)
    elif D is not None:
        D_row = xp.broadcast_rows(_D_per_row(xp, D, H, P), _PMAX)
    lo, hi = _dt_limit(dt_limit)
    _pool_rows(ssm_states)                # int32 range check
    rows = xp.pool_view(ssm_states, (slots * parts * pr, nt * N))
    y = call(prefill_kernel(),
             tok2d(x, H * P), tok2d(dt, H, f32=True), xp.broadcast_rows(xp.f32(A), _PMAX),
             tok2d(B, G * N), tok2d(C, G * N), D_heads, D_row, tok2d(z, H * P),
             None if dt_bias is None else xp.broadcast_rows(xp.f32(dt_bias), _PMAX),
             rows, *(xp.table(t) for t in tables),
             int(H), int(N), bool(dt_softplus), lo, hi, int(chunk_size),
             precision == "fp32")
    xp.commit(rows, ssm_states)
    return y[:T].reshape(T, H, P)


def decode_layout(H: int, P: int, G: int) -> tuple[int, int]:
    """(pr, nt) of the decode kernel: a sequence's H*P state rows on pr
    partitions x nt columns (``pr*nt = H*P``; which row sits where:
    ``decode_segments``). pr is the largest divisor of H*P that is <= 128 and
    keeps ``nt`` consecutive rows inside one group (the prefill's head parts
    use the same rule)."""
    HP, group_rows = H * P, (H // G) * P
    for pr in range(min(_PMAX, HP), 0, -1):
        if HP % pr == 0 and group_rows % (HP // pr) == 0:
            return pr, HP // pr
    raise AssertionError("unreachable: pr = G always qualifies")


def decode_tables(state_indices, num_seqs: int, pr: int, per: int, programs: int = 1):
    """Run-time batch tables of ``ssd_decode_step`` (its module docstring): ``(seq_table
    [programs * rows, 128, 2*per], counts [1, 3])`` int32, one block of ``rows = 1 +
    ceil(ceil(num_seqs / programs) / per) + per`` table rows per program and one counts
    row for all of them.

    ``num_seqs`` is the bucket (>= len(state_indices)); ``per`` the kernel's entries per
    full iteration. The live sequences, in order, are split into ``programs`` runs of E =
    n_live // programs (``scaffold.padded_split`` of the E * programs first), so every
    program runs ``E // per`` full iterations (row 1 + r: entries r*per .. of its run)
    and ``E % per`` single-entry iterations (the rows after them, entry at columns 0, 1);
    with LNC=2 and an odd n_live the last live sequence is program 0's spare entry (row
    0 of its block, run under ``nl.if_else``) and program 1's row 0 is a dump entry
    (pool rows 0 .. pr-1 of its private dump, sequence 0). An entry is two columns: pool
    rows ``slot*pr + q`` at partitions q < pr, its batch sequence at partition 0.
    counts: (full iterations, single-entry iterations, spare 0/1), the same for every
    program. Padding sequences get no entry (the launcher zeroes their y rows). Built
    with vectorised array ops (``nonzero`` of ``state_indices >= 0``, slices, an
    ``arange`` broadcast add, reshapes, indexed writes into zero tables) and integer
    counts.
    """
    from nki_ssm.kernels.scaffold import padded_split

    idx = np.asarray(state_indices, dtype=np.int64)
    live_all = np.flatnonzero(idx >= 0)
    E = live_all.size // programs
    spare = live_all.size - E * programs
    n_main, n_tail = E // per, E % per
    rows = 1 + -(-(-(-num_seqs // programs)) // per) + per
    q = np.arange(_PMAX)[None, :]

    def entries(seqs):  # [n] batch sequences -> [n, 128, 2] entries
        ent = np.zeros((seqs.size, _PMAX, 2), dtype=np.int64)
        ent[:, :pr, 0] = idx[seqs][:, None] * pr + q[:, :pr]
        ent[:, 0, 1] = seqs
        return ent

    table = np.zeros((programs, rows, _PMAX, 2 * per), dtype=np.int64)
    _, spans = padded_split(E * programs, programs)
    for prog in range(programs):
        first, count = spans[prog]
        run = live_all[first:first + count]
        main = entries(run[:n_main * per])
        # [n_main*per, 128, 2] -> [n_main, 128, per*2]: entry e of a row at columns 2e, 2e+1
        table[prog, 1:1 + n_main] = main.reshape(n_main, per, _PMAX, 2).transpose(
            0, 2, 1, 3).reshape(n_main, _PMAX, 2 * per)
        table[prog, 1 + n_main:1 + n_main + n_tail, :, 0:2] = entries(run[n_main * per:])
    if spare:
        table[0, 0, :, 0:2] = entries(live_all[-1:])[0]
    table[1:, 0, :pr, 0] = np.arange(pr)                  # dump entries: pool rows 0 .. pr-1
    counts = np.array([[n_main, n_tail, spare]], dtype=np.int32)
    return (np.ascontiguousarray(table.reshape(programs * rows, _PMAX, 2 * per),
                                 dtype=np.int32), counts)


def decode_y_index(state_indices, num_seqs: int, per: int, programs: int = 1):
    """Where ``ssd_decode_step`` leaves each sequence's y: ``[len(state_indices)]`` int64
    rows of its y viewed as ``[programs * rows * per, T*pr*nt]`` (table row r of program p,
    entry e: ``(p*rows + r)*per + e``), the placement ``decode_tables`` gives the live
    sequences; padding sequences get 0 (their y is zeroed)."""
    from nki_ssm.kernels.scaffold import padded_split

    idx = np.asarray(state_indices, dtype=np.int64)
    live_all = np.flatnonzero(idx >= 0)
    E = live_all.size // programs
    n_main = E // per
    rows = 1 + -(-(-(-num_seqs // programs)) // per) + per
    out = np.zeros(idx.size, dtype=np.int64)
    _, spans = padded_split(E * programs, programs)
    for prog in range(programs):
        first, count = spans[prog]
        run = live_all[first:first + count]
        i = np.arange(run.size)
        main = i < n_main * per
        r = np.where(main, 1 + i // per, 1 + n_main + (i - n_main * per))
        e = np.where(main, i % per, 0)
        out[run] = (prog * rows + r) * per + e
    if live_all.size - E * programs:
        out[live_all[-1]] = 0
    return out


def decode(*, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states, state_indices,
           backend):
    """Launch ``ssd_decode_step`` on the host path (``decode_call`` with NumPy)."""
    return decode_call(NUMPY, host_call(backend), x=x, dt=dt, A=A, B=B, C=C, D=D, z=z,
                       dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
                       ssm_states=ssm_states, state_indices=state_indices)


def decode_call(xp, call, *, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states,
                state_indices):
    """Lay out, launch ``call(decode_kernel(), *args)``; returns y shaped like x, in x's dtype.

    ``xp``: the array namespace of x ... ssm_states (``_arrays``); state_indices is
    a host array. The batch is padded to its sequence bucket (zero sequences).
    """
    from nki_ssm.kernels.mamba2_ssd.decode import decode_segments, entries_per_iteration

    single = x.ndim == 3
    S = x.shape[0]
    T = 1 if single else x.shape[1]
    H, P = x.shape[-2:]
    G, N = B.shape[-2:]
    slots = ssm_states.shape[0]
    pr, nt = decode_layout(H, P, G)
    if slots * pr > _INT32_MAX:
        raise ValueError(f"ssm_states must have slots*{pr} <= {_INT32_MAX} (int32 row indices), "
                         f"got {slots * pr}")
    Sb = seq_bucket(S)                    # sequences the kernel is compiled for
    segs = decode_segments(nt, P, pr)
    # partition q of segment (o, e) holds rows pr*o + q*(e-o) .. (one head): its group
    sel = np.concatenate([(((pr * o + np.arange(pr) * (e - o)) // P) // (H // G))[None, :]
                          == np.arange(G)[:, None] for o, e in segs], axis=1).astype(np.float32)

    def rows(a, lead):  # [..., H*P] -> [lead*pr, nt]: segment (o, e) rows at [q, o:e]
        a = xp.f32(a).reshape(lead, H * P)
        return xp.cat([a[:, pr * o:pr * e].reshape(lead, pr, e - o) for o, e in segs],
                      axis=2).reshape(lead * pr, nt)

    def per_head(a, lead):  # [lead, H] -> per-row values [lead*pr, nt]
        return rows(xp.repeat(xp.f32(a).reshape(lead, H), P, 1), lead)

    # one DMA per token for x | dt | z, one for the per-row parameters, one
    # for B | C (the kernel's small DMAs cost ~1 us each, see its docstring)
    n = Sb * T

    def pad_seqs(a):   # [S, ...] -> [Sb, ...] (zero sequences appended)
        return xp.pad_rows(a, Sb, math.prod(a.shape[1:])).reshape((Sb,) + tuple(a.shape[1:]))

    xdt = [rows(pad_seqs(x), n), per_head(pad_seqs(dt), n)] + (
        [] if z is None else [rows(pad_seqs(z), n)])
    params = [per_head(A, 1)]
    if dt_bias is not None:
        params.append(per_head(dt_bias, 1))
    if D is not None:
        params.append(rows(_D_per_row(xp, D, H, P), 1))
    BC = xp.cat([pad_seqs(B).reshape(n * G, N), pad_seqs(C).reshape(n * G, N)], axis=1)
    lo, hi = _dt_limit(dt_limit)
    pool = xp.pool_view(ssm_states, (slots * pr, nt * N))
    per = entries_per_iteration(T, nt * N * 4)
    tables = decode_tables(state_indices, Sb, pr, per, call.lnc)
    # token inputs in table order (row r, entry e: the sequence decode_y_index places
    # there; a zero sequence in the empty places): one DMA per iteration and token
    yx = decode_y_index(state_indices, Sb, per, call.lnc)
    R = tables[0].shape[0]
    order = np.full(R * per, Sb, dtype=np.int64)
    live = np.flatnonzero(np.asarray(state_indices) >= 0)
    order[yx[live]] = live

    def by_table(a, inner):  # [Sb, T, inner...] -> [R, T*rows, per*width]
        a = xp.take(xp.pad_rows(a, Sb + 1, math.prod(a.shape[1:])), order)
        a = xp.permute(a.reshape((R, per, T) + inner), (0, 2, 3, 1, 4))
        return a.reshape(R, T * inner[0], per * inner[1])

    y = call(decode_kernel(),
             by_table(xp.cat(xdt, axis=1).reshape(Sb, T, pr, -1), (pr, len(xdt) * nt)),
             xp.cat(params, axis=1),
             by_table(BC.reshape(Sb, T, G, 2 * N), (G, 2 * N)), xp.cast_like(xp.table(sel), BC),
             pool,
             *(xp.table(t) for t in tables), z is not None, dt_bias is not None, D is not None,
             bool(dt_softplus), lo, hi, P)
    xp.commit(pool, ssm_states)
    # the kernel's row layout back to [S, T*H*P] (segment (o, e): rows pr*o .. pr*e)
    yk = xp.f32(y)
    R = yk.shape[0]
    yk = xp.permute(yk.reshape(R, T, pr, per, nt), (0, 3, 1, 2, 4)).reshape(R * per, T * pr * nt)
    yk = xp.take(yk, decode_y_index(state_indices, Sb, per, call.lnc)).reshape(S * T, pr, nt)
    y = xp.cat([yk[:, :, o:e].reshape(S * T, pr * (e - o)) for o, e in segs],
               axis=1).reshape(S, T * H * P)
    # y rows of padding sequences are zeros (the kernel gives them no entry: torch.where)
    y = xp.where_rows(np.asarray(state_indices) >= 0, y)
    return xp.cast_like(y.reshape(x.shape), x)
