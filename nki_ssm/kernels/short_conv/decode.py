"""Decode / multi-token update of the short causal conv1d (one launch per batch).

Memory layout: "rows" on partitions. Each sequence's channels are split into R
blocks of D = dim / R channels and each (sequence, block) row gets one
partition, so a small batch still fills the 128 lanes (the launcher picks R
from the sequence bucket: the largest power of two with bucket * R <= 128
dividing dim). A group holds Pn = min(128 // R, bucket) sequence positions,
block-major: partition r * Pn + i is block r of the group's position i.
Channels of a block run along the free axis, so every HBM stream is a
contiguous run per partition: the pool is viewed as ``[slots * R, D * (W-1)]``
and one ``vector_offset`` DMA per group and chunk gathers (later scatters)
``chunk * (W-1)`` contiguous state elements per row -- one pool row per
partition; x ``[num_seqs, T, dim]`` and y are gathered / scattered one
sequence row per partition (one DMA per channel block r, the base row being
the sequence's ``[T, dim]``).

Design note (issue 10): batch composition is run-time data
---------------------------------------------------------
Compile-time arguments are the shapes (the sequence bucket, T, dim, W, slot
count), dtypes, R, the activation and the bias / TensorE-taps flags. The
batch arrives as three int32 tables the launcher builds from
``state_indices`` with a few vectorised array ops (``nki_ssm.ops.launch.
short_conv``):

- ``seq_rows [G, 128]``: for group g, partition ``r*Pn + i``, the sequence
  whose x row it reads and whose y row it writes;
- ``pool_rows [G, 128]``: the pool row ``slot * R + r`` of that sequence;
- ``num_groups [1, 1]``: ``ceil(live / Pn)``, the trip count.

The launcher *compacts* the live sequences to the front (a stable argsort of
``state_indices < 0``), so padding sequences never reach the kernel: the
group loop is a runtime loop (``nl.dynamic_range`` over a register loaded
from ``num_groups``) that runs only over groups holding live sequences.
The unused positions of the last group *mirror* the group's first live
sequence (same x row, same slot): they compute bit-identical values and
write the same bytes to the same y row and pool row as that sequence, so
they need neither ``oob_mode.skip`` nor a scratch row, and a padding
sequence's x (NaN / Inf included) is never read. The launcher zeroes the
y rows of padding sequences (``where(live, y, 0)``). Everything unrolled in
the loop body is bounded by the layer shape: channel chunks of D, 128-channel
sub-tiles, taps W and the T tokens (in PSUM-sized token slices).

Engine plan, per group, per 128-channel sub-tile of a chunk (general path):
- TensorE transposes every window column (W-1 state columns and the new
  tokens of the step's token slice) to channel-major ``[128 ch, rows]`` in
  PSUM, so each channel's weight becomes a per-partition scalar;
- ScalarE applies the first tap and the bias (``activation(copy, scale=w[:, 0],
  bias=b)`` from PSUM), VectorE fuses the other taps as multiply-adds
  (``scalar_tensor_tensor`` with the weight column, reading PSUM), all in
  float32;
- TensorE transposes the float32 result back to rows, and one ScalarE
  instruction per step applies SiLU (or copy) while evicting.
TensorE-taps path (one channel block, R == 1, and bfloat16 x / pool /
weight values): the transposed window columns are evicted to SBUF by VectorE
and the W taps (+ a K=1 bias matmul) accumulate in PSUM as
``psum[rows, ch] += window_k[ch, rows].T @ diag(weight[:, k])``, already
row-major, so no transpose back; ScalarE applies SiLU on eviction.
The new state (window columns T .. T+W-2) is assembled row-major by ScalarE
copies and scattered back with one DMA per group and chunk. Gathers run PD
chunks ahead of the scatters inside a group (software pipeline); a scatter
into the pool orders every later pool read, as the slots are run-time data,
so the next group's gathers follow this group's scatters.

PSUM: a step holds ``batch`` sub-tiles x ``tn`` tokens; two steps' window
tiles and one output tile must fit the 8 banks, so for long speculative
steps (T >= 15 at W = 4) the tokens are processed in slices (``_psum_plan``).

Limits: any T >= 1, any dim, W >= 2, any number of sequences (groups of up
to 128 rows). What binds (modeled, trn2, dim 8192, bf16, one token;
``tests/kernels/short_conv_perf.py d32 d512``): DMA for 512 sequences
(200.8 us, 1.10x the bytes-moved bound; 4 groups, TensorE taps), the VectorE
taps and the pipeline latency for 32 (21.9 us, one group, R = 4). Program
size: 897 static instructions for every bucket >= 128 sequences (R = 1),
374 at 32 (R = 4): R is a layout choice per bucket; forcing one R for both
costs 316 us at 512 (R = 4) or 55.6 us at 32 (R = 1). Re-measured under the
cost model with runtime-loop synchronisation (``main`` after the issue-11
merge; bucket default 55.3 us at 32, 274.9 us at 512): R = 1 for both gives
100.8 us at 32 (+82 %), R = 2 66.5 / 378.7 us (+20 % / +38 %, 462
instructions at either bucket), R = 4 468.8 us at 512 (+71 %): no single R
keeps both within 10 %. At R = 1 and 32 sequences what binds is the DMA
(every load / store spans 32 partitions, so 4 of the 16 DMA engines) and
ScalarE's new-state assembly (free size 4x that of R = 4); a fixed R = 1
layout would need each group's DMAs split into >= 4 concurrent channel slices
and the state copies spread over ScalarE / VectorE / GpSimd -- not tried.
"""
from nki_ssm.backend import nki, nl, nisa

PMAX = 128
SUB = 128                   # channels per transposed sub-tile
BATCH = 2                   # sub-tiles per pipeline step (2 steps of windows + outputs fit PSUM)
LOAD_BUDGET = 96 * 1024     # bytes per partition for in-flight chunk loads (state + x)
PSUM_BANKS = 8
BANK_BYTES = 2048


def _nbytes(dtype):
    return 4 if dtype == nl.float32 else 2


def _chunk_channels(T, H, x_bytes, pool_bytes, D):
    """Channels per chunk: a power of two in [128, 2048] (or D), two chunks of loads
    (and the output / new-state tiles) within LOAD_BUDGET; D splits into ~4+ chunks when
    it allows, so loads, arithmetic and stores overlap."""
    load = 2 * (H * pool_bytes + T * x_bytes) + 3 * T * x_bytes + H * pool_bytes
    cd = 2048
    while cd > 128 and cd * load > LOAD_BUDGET:
        cd = cd // 2
    while cd > 256 and cd * 4 > D:
        cd = cd // 2
    return min(cd, D)


def _load_group(x, pool_flat, g, prow, c0, cd, R, D, H, CD):
    """Gather the state rows (one pool row per partition) and load the x rows of group
    g (register), channels [c0, c0 + cd) of each block."""
    G, Pn, T, dim = x.shape
    P = R * Pn
    st = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st[0:P, 0:cd, :],
                  src=pool_flat.ap(pattern=[[D * H, P], [H, cd], [1, H]], offset=c0 * H,
                                   vector_offset=prow[0:P, :], indirect_dim=0))
    xs = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
    # partition r*Pn + i reads x[g, i, :, r*D + c0 : r*D + c0 + cd]
    nisa.dma_copy(dst=xs[0:P, :, 0:cd],
                  src=x.ap(pattern=[[D, R], [T * dim, Pn], [dim, T], [1, cd]], offset=c0,
                           scalar_offset=g, indirect_dim=0))
    return (st, xs)


def _channel_columns(src, R, D, width, dst):
    """dst[p, r, s, :] = src[r*D + s*128 + p, ...] (channel-major per-partition columns)."""
    nsub = (D + SUB - 1) // SUB
    nfull = D // SUB
    inner = width
    if nfull > 0:
        nisa.dma_copy(dst=dst[:, :, 0:nfull, :],
                      src=src.ap(pattern=[[inner, SUB], [D * inner, R], [SUB * inner, nfull],
                                          [1, inner]], offset=0))
    if nsub > nfull:
        wl = D - nfull * SUB
        nisa.dma_copy(dst=dst[0:wl, :, nfull, :],
                      src=src.ap(pattern=[[inner, wl], [D * inner, R], [1, inner]],
                                 offset=nfull * SUB * inner))


def _window_tiles(st, xs, P, j0, w, H, t0, tn):
    """TensorE transposes of the window columns (state ++ x) t0 .. t0+tn+H-1 of channels
    [j0, j0 + w): a list of (psum tile, column) per window column (relative to t0), each
    [w, P]. Columns of one dtype share PSUM tiles of one bank (2 KiB) each."""
    cols = []
    tiles = []                     # [tile, used columns, dtype bytes, is state dtype]
    for i in range(t0, t0 + tn + H):
        src = st if i < H else xs
        nb = _nbytes(src.dtype)
        same = st.dtype == xs.dtype
        key = True if same else (i < H)
        per_bank = BANK_BYTES // (PMAX * nb)
        if len(tiles) == 0 or tiles[-1][1] == per_bank or tiles[-1][3] != key:
            ps = nl.ndarray((PMAX, per_bank, PMAX), dtype=src.dtype, buffer=nl.psum)
            tiles.append([ps, 0, nb, key])
        ps = tiles[-1][0]
        slot = tiles[-1][1]
        if i < H:
            data = st[0:P, j0:j0 + w, i]
        else:
            data = xs[0:P, i - H, j0:j0 + w]
        nisa.nc_transpose(dst=ps[0:w, slot, 0:P], data=data)
        cols.append((ps, slot))
        tiles[-1][1] = slot + 1
    return cols


def _window_banks(st_bytes, x_bytes, same, H, tn):
    """PSUM banks of one sub-tile's window tiles for a slice of tn tokens (at worst)."""
    pb_s = BANK_BYTES // (PMAX * st_bytes)
    pb_x = BANK_BYTES // (PMAX * x_bytes)
    if same:
        return (H + tn + pb_s - 1) // pb_s
    return (H + pb_s - 1) // pb_s + (H + tn + pb_x - 1) // pb_x


def _psum_plan(st_bytes, x_bytes, same, H, T):
    """(sub-tiles per pipeline step, tokens per step) so that two steps' window tiles
    and one float32 output tile fit the 8 PSUM banks: the batch shrinks first, then the
    token slice (long speculative steps)."""
    tn = T
    while True:
        batch = BATCH
        while batch >= 1:
            ybanks = (tn * batch * SUB * 4 + BANK_BYTES - 1) // BANK_BYTES
            if 2 * batch * _window_banks(st_bytes, x_bytes, same, H, tn) + ybanks <= PSUM_BANKS:
                return (batch, tn)
            batch = batch - 1
        if tn == 1:
            return (1, 1)
        tn = (tn + 1) // 2


def _front(unit, j_list, w_all, b_all, has_bias, R, Pn, s0, H, t0, tn):
    """Pipeline stage 1 of a step: TensorE transposes of the window columns of each
    sub-tile, ScalarE first tap plus bias (scaled copy out of PSUM) into float32
    accumulators."""
    st, xs = unit
    P = R * Pn
    subs = []
    for entry in j_list:
        j0, w = entry
        s = s0 + j0 // SUB
        win = _window_tiles(st, xs, P, j0, w, H, t0, tn)
        accs = []
        for t in range(tn):
            acc = nl.ndarray((SUB, PMAX), dtype=nl.float32, buffer=nl.sbuf)
            ps, slot = win[t]
            for r in range(R):
                a, b = r * Pn, (r + 1) * Pn         # block r's rows
                # acc = x_0 * w_0 (+ bias): the bias rides on the first tap for free
                if has_bias:
                    nisa.activation(dst=acc[0:w, a:b], op=nl.copy, data=ps[0:w, slot, a:b],
                                    scale=w_all[0:w, r, s, 0:1], bias=b_all[0:w, r, s, 0:1])
                else:
                    nisa.activation(dst=acc[0:w, a:b], op=nl.copy, data=ps[0:w, slot, a:b],
                                    scale=w_all[0:w, r, s, 0:1])
            accs.append(acc)
        subs.append((j0, w, s, win, accs))
    return subs


def _middle(subs, w_all, R, Pn, tn, W):
    """Stage 2: VectorE multiply-adds of the other taps; independent accumulators are
    interleaved so no instruction waits on the one just before it."""
    for k in range(1, W):
        for t in range(tn):
            for entry in subs:
                j0, w, s, win, accs = entry
                ps, slot = win[t + k]
                for r in range(R):
                    a, b = r * Pn, (r + 1) * Pn
                    nisa.scalar_tensor_tensor(dst=accs[t][0:w, a:b], data=ps[0:w, slot, a:b],
                                              op0=nl.multiply,
                                              operand0=w_all[0:w, r, s, k:k + 1],
                                              op1=nl.add, operand1=accs[t][0:w, a:b])


def _back(subs, yt, P, t0, tn, act_op):
    """Stage 3: TensorE transposes the float32 accumulators back to rows; one ScalarE
    instruction applies the activation while evicting into the rows' output tile."""
    j_first = subs[0][0]
    span = 0
    ps_y = nl.ndarray((PMAX, tn, len(subs) * SUB), dtype=nl.float32, buffer=nl.psum)
    for entry in subs:
        j0, w, s, win, accs = entry
        for t in range(tn):
            nisa.nc_transpose(dst=ps_y[0:P, t, j0 - j_first:j0 - j_first + w],
                              data=accs[t][0:w, 0:P])
        span = j0 - j_first + w
    nisa.activation(dst=yt[0:P, t0:t0 + tn, j_first:j_first + span], op=act_op,
                    data=ps_y[0:P, :, 0:span])


def _identity(dtype):
    """[128, 128] identity built on GpSimd (ones where partition == column)."""
    ones = nl.ndarray((SUB, SUB), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    ident = nl.ndarray((SUB, SUB), dtype=dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, pattern=[[-1, SUB]], channel_multiplier=1,
                       on_true_tile=ones, on_false_value=0.0, cmp_op=nl.equal)
    return ident


def _chunk_diagonals(ident, w_all, s0, nsc, D, W, dtype):
    """[128, nsc, W, 128]: diag(weight[(s0 + j)*128 + p, k]) for the sub-tiles of a chunk
    (VectorE; the write rounds to the matmul dtype -- exact for bfloat16 weights)."""
    d = nl.ndarray((SUB, nsc, W, SUB), dtype=dtype, buffer=nl.sbuf)
    for j in range(nsc):
        w = min(SUB, D - (s0 + j) * SUB)
        for k in range(W):
            nisa.tensor_scalar(dst=d[0:w, j, k, 0:w], data=ident[0:w, 0:w], op0=nl.multiply,
                               operand0=w_all[0:w, 0, s0 + j, k:k + 1])
    return d


def _front_mm(unit, j_list, P, s0, H, t0, tn):
    """TensorE-taps stage 1: transposes of the window columns to channel-major, evicted by
    VectorE to SBUF (matmul operands live in SBUF) as [128 ch, tn+H, rows]."""
    st, xs = unit
    subs = []
    nw = tn + H
    for entry in j_list:
        j0, w = entry
        win = _window_tiles(st, xs, P, j0, w, H, t0, tn)
        wsb = nl.ndarray((SUB, nw, PMAX), dtype=st.dtype, buffer=nl.sbuf)
        i0 = 0
        while i0 < nw:
            ps, slot = win[i0]
            n = 1
            while i0 + n < nw and win[i0 + n][0] == ps:
                n = n + 1
            nisa.tensor_copy(dst=wsb[0:w, i0:i0 + n, 0:P], src=ps[0:w, slot:slot + n, 0:P],
                             engine=nisa.engine.vector)
            i0 = i0 + n
        subs.append((j0, w, s0 + j0 // SUB, wsb))
    return subs


def _middle_mm(subs, diag, c_s0, b_row, ones, P, tn, W, has_bias):
    """TensorE-taps stage 2: psum[rows, ch] (+)= window_k[ch, rows].T @ diag(w_k), plus a
    K=1 bias matmul; the result comes out row-major, no transpose back."""
    j_first = subs[0][0]
    ps_o = nl.ndarray((PMAX, tn, len(subs) * SUB), dtype=nl.float32, buffer=nl.psum)
    for entry in subs:
        j0, w, s, wsb = entry
        col = j0 - j_first
        for t in range(tn):
            if has_bias:
                nisa.nc_matmul(dst=ps_o[0:P, t, col:col + w], stationary=ones[0:1, 0:P],
                               moving=b_row[0:1, s * SUB:s * SUB + w], accumulate=False)
            for k in range(W):
                nisa.nc_matmul(dst=ps_o[0:P, t, col:col + w], stationary=wsb[0:w, t + k, 0:P],
                               moving=diag[0:w, s - c_s0, k, 0:w],
                               accumulate=has_bias or k > 0)
    return ps_o


def _plan_steps(chunks, batch, tn, T):
    """[(chunk, sub-tiles [(j0, width)], first token, tokens, last step of the chunk)]."""
    steps = []
    for ci in range(len(chunks)):
        cd = chunks[ci][1]
        subs = []
        for j0 in range(0, cd, SUB):
            subs.append((j0, min(SUB, cd - j0)))
        for t0 in range(0, T, tn):
            n = min(tn, T - t0)
            for b0 in range(0, len(subs), batch):
                b1 = min(b0 + batch, len(subs))      # NKI: no slice past the end
                last = t0 + n >= T and b1 == len(subs)
                steps.append((ci, subs[b0:b1], t0, n, last))
    return steps


def _store_chunk(y, pool_flat, yt, st, xs, g, prow, c0, cd, R, D, H, CD):
    """y rows of group g (register) for the chunk and the new state (window columns
    T .. T+W-2, assembled contiguous) back to the pool rows (one row per partition)."""
    G, Pn, T, dim = y.shape
    P = R * Pn
    nisa.dma_copy(dst=y.ap(pattern=[[D, R], [T * dim, Pn], [dim, T], [1, cd]], offset=c0,
                           scalar_offset=g, indirect_dim=0),
                  src=yt[0:P, :, 0:cd])
    ns = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
    for jj in range(H):
        col = T + jj
        if col < H:
            src = st[0:P, 0:cd, col]
        else:
            src = xs[0:P, col - H, 0:cd]
        nisa.tensor_copy(dst=ns[0:P, 0:cd, jj], src=src, engine=nisa.engine.scalar)
    nisa.dma_copy(dst=pool_flat.ap(pattern=[[D * H, P], [H, cd], [1, H]], offset=c0 * H,
                                   vector_offset=prow[0:P, :], indirect_dim=0),
                  src=ns[0:P, 0:cd, :])


@nki.jit
def short_conv_decode_kernel(x, weight, bias, pool_flat, pool_rows, num_groups,
                             activation, has_bias, R, tensor_taps):
    """x ``[G, Pn, T, dim]`` (the compacted batch in groups, see the module docstring);
    weight ``[dim, W]``; bias ``[dim]`` or None; pool_flat ``[slots * R, (dim / R) *
    (W-1)]`` (the pool, updated in place by the kernel's scatters); pool_rows int32
    ``[G, R * Pn]`` (per group and partition ``r * Pn + i``: pool row ``slot * R + r``);
    num_groups int32 ``[1, 1]`` (groups to run);
    activation "silu" or "none"; R channel blocks per sequence; tensor_taps: do the taps
    as TensorE matmuls with diagonal weights (launcher: R == 1, bfloat16 x and pool,
    weights / bias holding bfloat16 values) instead of ScalarE + VectorE multiply-adds.
    Returns y ``[G, Pn, T, dim]`` in x's dtype (groups past num_groups are not
    written).

    Inside a group, steps of ``batch`` sub-tiles run as a three-stage software
    pipeline: the transposes and first tap of step i+1 are issued before the
    multiply-adds and outputs of step i, so TensorE, VectorE and ScalarE overlap.
    """
    G, Pn, T, dim = x.shape
    W = weight.shape[1]
    H = W - 1
    D = dim // R
    P = R * Pn
    nsub = (D + SUB - 1) // SUB
    act_op = nl.silu if activation == "silu" else nl.copy
    y = nl.ndarray((G, Pn, T, dim), dtype=x.dtype, buffer=nl.shared_hbm)

    x_bytes = _nbytes(x.dtype)
    pool_bytes = _nbytes(pool_flat.dtype)
    CD = _chunk_channels(T, H, x_bytes, pool_bytes, D)
    chunks = []
    for c0 in range(0, D, CD):
        chunks.append((c0, min(CD, D - c0)))

    # channel-major weights / bias of every block: w_all[p, r, s, k] = weight[r*D + s*128 + p, k]
    w_all = nl.ndarray((SUB, R, nsub, W), dtype=nl.float32, buffer=nl.sbuf)
    _channel_columns(weight, R, D, W, w_all)
    b_all = None
    if has_bias:
        b_all = nl.ndarray((SUB, R, nsub, 1), dtype=nl.float32, buffer=nl.sbuf)
        _channel_columns(bias, R, D, 1, b_all)

    ident = None
    ones = None
    b_row = None
    diags = []
    for ci in range(len(chunks)):
        diags.append(None)
    if tensor_taps:
        ident = _identity(nl.bfloat16)
        ones = nl.ndarray((1, PMAX), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        if has_bias:
            b_row = nl.ndarray((1, D), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.dma_copy(dst=b_row, src=bias.ap(pattern=[[D, 1], [1, D]], offset=0))
        # the diagonals of every chunk are built once, outside the group loop
        for ci in range(len(chunks)):
            diags[ci] = _chunk_diagonals(ident, w_all, chunks[ci][0] // SUB,
                                         (chunks[ci][1] + SUB - 1) // SUB, D, W, nl.bfloat16)

    chunk_bytes = CD * (H * pool_bytes + T * x_bytes)
    PD = max(1, min(len(chunks) - 1, LOAD_BUDGET // chunk_bytes - 1))
    batch, tn = _psum_plan(pool_bytes, x_bytes, pool_flat.dtype == x.dtype, H, T)
    steps = _plan_steps(chunks, batch, tn, T)

    groups = nisa.register_alloc()
    nisa.register_load(dst=groups, src=num_groups)
    for g in nl.dynamic_range(groups):
        # this group's pool rows: row g of [G, P] (one entry per partition)
        prow = nl.ndarray((PMAX, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=prow[0:P, :], src=pool_rows.ap(pattern=[[1, P], [1, 1]], offset=0,
                                                          scalar_offset=g, indirect_dim=0))
        loads = []
        units = []                 # per chunk: (state, x, output tile), while live
        for ci in range(len(chunks)):
            loads.append(None)
            units.append(None)
        for ci in range(min(PD, len(chunks))):
            loads[ci] = _load_group(x, pool_flat, g, prow, chunks[ci][0], chunks[ci][1],
                                    R, D, H, CD)
        prev = None
        for i in range(len(steps) + 1):
            nxt = None
            if i < len(steps):
                ci, j_list, t0, n, last = steps[i]
                if units[ci] == None:  # noqa: E711  first step of chunk ci
                    if ci + PD < len(chunks):
                        loads[ci + PD] = _load_group(x, pool_flat, g, prow,
                                                     chunks[ci + PD][0], chunks[ci + PD][1],
                                                     R, D, H, CD)
                    yt = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
                    units[ci] = (loads[ci][0], loads[ci][1], yt)
                    loads[ci] = None
                st, xs, yt = units[ci]
                if tensor_taps:
                    front = _front_mm((st, xs), j_list, P, chunks[ci][0] // SUB, H, t0, n)
                else:
                    front = _front((st, xs), j_list, w_all, b_all, has_bias, R, Pn,
                                   chunks[ci][0] // SUB, H, t0, n)
                nxt = (ci, t0, n, last, front)
            if prev != None:  # noqa: E711
                pci, pt0, pn, plast, subs = prev
                c0, cd = chunks[pci]
                st, xs, yt = units[pci]
                if tensor_taps:
                    ps_o = _middle_mm(subs, diags[pci], c0 // SUB, b_row, ones, P, pn, W,
                                      has_bias)
                    span = subs[-1][0] + subs[-1][1] - subs[0][0]
                    nisa.activation(dst=yt[0:P, pt0:pt0 + pn, subs[0][0]:subs[0][0] + span],
                                    op=act_op, data=ps_o[0:P, :, 0:span])
                    ps_o = None
                else:
                    _middle(subs, w_all, R, Pn, pn, W)
                    _back(subs, yt, P, pt0, pn, act_op)
                if plast:
                    _store_chunk(y, pool_flat, yt, st, xs, g, prow, c0, cd, R, D, H, CD)
                    units[pci] = None     # the chunk's buffers die here
                subs = None               # step i-1's PSUM windows die before step i+1's
            prev = nxt
    return y
