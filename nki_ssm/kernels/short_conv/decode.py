"""Decode / multi-token update of the short causal conv1d (one launch per batch).

Memory layout: "rows" on partitions. The program holds two row layouts and the
launcher runs one of them per call (below). In the *wide* layout each
sequence's channels are split into R blocks of D = dim / R channels (R = 4 when
dim is a multiple of 512: the largest power of two <= 4 with dim / R a multiple
of 128) and each (sequence, block) row gets one partition, so a small batch
still fills the 128 lanes; in the *one-block* layout a partition holds all dim
channels of one sequence. A group holds Pn = min(128 // R, N) sequence
positions (R = 1 for one block; N the sequence bucket), block-major: partition
r * Pn + i is block r of the group's position i. Channels run along the free
axis, so every HBM stream is a contiguous run per partition: the pool is
viewed as ``[slots * R, (dim / R) * (W-1)]`` (one row per slot and wide block)
and one ``vector_offset`` DMA per group and chunk gathers (later scatters)
``chunk * (W-1)`` contiguous state elements per partition -- one pool row per
partition: a one-block partition spans R pool rows, its chunks never cross
one, and its table row holds the R row numbers. x ``[N, T, dim]`` and y are
gathered / scattered one sequence row per partition (one DMA per channel
block r, the base row being the group's first position). Under LNC=2 each program
does this on its half of the channels (section LNC below: dim there reads Dp).

Design note: batch composition is run-time data
-----------------------------------------------
Compile-time arguments are the shapes (the sequence bucket, T, dim, W, slot
count), dtypes, R (a function of dim and the LNC only), the activation and the bias /
TensorE-taps flags. The batch arrives as three int32 tables the launcher
builds from ``state_indices`` with a few vectorised array ops
(``nki_ssm.ops.launch.short_conv.decode_plan``):

- ``rows_wide [N, R]``: the wide layout's ``[groups, R * Pn]`` table of pool
  rows ``slot * R + r`` (partition ``r * Pn + i``), one group per Pn rows;
- ``rows_one [N, R]``: per position of the one-block layout its R pool rows
  ``slot * R + c``;
- ``counts [1, 3]``, the one row every program reads: the stop of the wide
  layout's group loop and of the one-block layout's (the number of live sequences
  for the layout the launcher picked, 0 for the other), and the one-block layout's
  diagonal-build flag (1 when that layout runs, else 0).

LNC: the programs split the channels
------------------------------------
Launched as ``kernel[2]`` (LNC=2), the two programs take the two halves of every
sequence's channels (``split.program_channels``: Dp = dim / 2 each when dim is even
and above one 128-channel tile), so both keep every sequence on their partitions
and halve the free size of every instruction (splitting by sequences would leave
each program's group of 32 sequences x R = 4 blocks half empty at 32 sequences).
Everything above then holds with dim replaced by Dp: R = ``wide_blocks(Dp)``, the
pool viewed as ``[slots * 2R, (Dp / R) * (W-1)]`` (2R rows per slot, program p's
being rows p * R .. p * R + R - 1: the tables hold program 0's rows and program p
adds ``p * R`` rows as a static element offset of its pool gathers / scatters), x /
y / weight / bias read and written from channel p * Dp on. Both programs read the
one counts row (``scaffold.trip_counts``), so they run the same trip counts and
branches, and trace the same instructions (the same program size); they write
disjoint y columns and disjoint pool rows, read nothing the other writes, and need
no synchronisation; results equal LNC=1 bit for bit. When the channels do not split
(one tile, an odd dim) program 0 takes them all and program 1 runs program 0's
channels, the same loops, into private dumps of y and of the pool
(``scaffold.destination``): it writes nothing real.

Loops: the kernel runs the two layouts one after the other, each as its weight
setup (straight-line code) and ONE top-level runtime loop over its groups,
``nl.fori_loop(0, stop, body, step=Pn)`` with an inner ``def body(g)``
(``scaffold.work_loop``): the iteration value g (an ``NkiScalar``) is the group's
first position, the scalar offset of its x / y rows and of its table rows. The
stops are ``NkiScalar`` s loaded (``nisa.scalar_load``) from an SBUF copy of
``counts``. No runtime loop runs inside another: the layout not picked
runs zero iterations (the one-block layout's setup -- weight columns and, for its
TensorE taps, identity and diagonal weights built once by VectorE -- sits under an
``nl.if_else`` on the flag, taken when that layout runs, so a launch of the wide
layout does not pay for it; the wide layout loads its weight columns in its group
iterations). The launcher picks
the wide layout when the live rows fit two groups (``num_live * R <= 256``, i.e.
at most 64 live sequences at R = 4: the measured crossover,
``use_wide_layout``), else the one-block layout: one program (the same size at
every bucket) serves a batch of one sequence and one of 512 at the speed of the
layout fitted to each.

The launcher *compacts* the live sequences to the front (a stable argsort of
``state_indices < 0``), so padding sequences never reach the kernel: the
group loop is a runtime loop (stop = num_live) that runs only over groups
holding live sequences.
The unused positions of the last group *mirror* the group's first live
sequence (same x row, same slot): they compute bit-identical values and
write the same bytes to the same y row and pool row as that sequence, so
they need neither ``oob_mode.skip`` nor a scratch row, and a padding
sequence's x (NaN / Inf included) is never read. The launcher zeroes the
y rows of padding sequences (``where(live, y, 0)``). Everything unrolled in
the loop body is bounded by the layer shape: channel chunks of D, 128-channel
sub-tiles, taps W and the T tokens (in PSUM-sized token slices).

Weights: the per-partition weight (and bias) columns ``w_all[p, r, s, k] =
weight[r*D + s*128 + p, k]`` come from ONE DMA of 128 * W contiguous elements per
128-channel tile (tile on partition: 1 KiB runs at W = 4 bfloat16; read
channel-on-partition the weight is one 8-byte run per channel, 64x slower), a
VectorE conversion to float32, one TensorE transpose per tap and one VectorE copy
out of PSUM (``_channel_columns_rows``). The wide layout does this at the start of
each group iteration, beside its table-row load (before the loop it would delay the
loop's start, which waits for every engine); the one-block layout once, under the
``nl.if_else`` on ``setup``, with its diagonals.

Engine plan, per group, per step of the wide layout (the *fused* taps: window columns
of one dtype, full 128-channel sub-tiles; a step is a chunk of up to FUSED_BATCH = 4
sub-tiles x the token slice):
- TensorE transposes every window column (W-1 state columns and the step's tokens;
  the x columns first, as x lands before the state gathers) of every sub-tile to
  channel-major into ONE PSUM tile ``[128 ch, nb, H + tn, rows]``;
- VectorE, per token: one multiply of the W window columns of all nb sub-tiles by the
  weights (``w_all`` read with a zero stride over a block's Pn rows, so block r's rows
  get block r's channels' weights) into float32 products ``[128, nb, W, rows]``, then
  the tap sums: ``_pe_subs`` sub-tiles on TensorE (per tap an accumulating matmul
  with the float32 identity as stationary, ``is_stationary_onezero``; ScalarE evicts),
  issued after the next step's transposes, the rest by one VectorE ``tensor_reduce``
  over the taps (3/4 and 1/2 of the sub-tiles on TensorE on alternate steps, 1/4 on
  the last one: TensorE and VectorE about equally busy, a short tail); a bias is one
  more VectorE add;
- TensorE transposes the float32 sums back to rows, and one ScalarE instruction per
  step applies SiLU (or copy) while evicting (its activation table is loaded by a tiny
  activation at the start of each group iteration, under the first loads).
General path (mixed state / x dtypes, partial sub-tiles): per 128-channel sub-tile
the window transposes, ScalarE's first tap and bias (``activation(copy,
scale=w[:, 0], bias=b)`` from PSUM) and VectorE's multiply-adds of the other taps
(``scalar_tensor_tensor`` per tap and block: Pn columns each), then as above.
TensorE-taps path (the one-block layout, and bfloat16 x / pool /
weight values): the transposed window columns are evicted to SBUF by VectorE
and the W taps (+ a K=1 bias matmul) accumulate in PSUM as
``psum[rows, ch] += window_k[ch, rows].T @ diag(weight[:, k])``, already
row-major, so no transpose back; ScalarE applies SiLU on eviction. The
diagonals (``diag(weight[:, k])`` per 128-channel sub-tile, bfloat16) are
built once per launch by VectorE, before the group loop.
The new state (window columns T .. T+W-2) is assembled row-major by ScalarE
copies (two per chunk: the old-state columns, then the x columns) when the chunk's
loads are taken, and scattered back with one DMA per group and chunk. Gathers run PD
chunks ahead of the scatters inside a group (software pipeline); a scatter
into the pool orders every later pool read, as the slots are run-time data,
so the next group's gathers follow this group's scatters.

PSUM: a step holds ``batch`` sub-tiles x ``tn`` tokens; two steps' window
tiles and one output tile must fit the 8 banks, so for long speculative
steps (T >= 15 at W = 4) the tokens are processed in slices (``_psum_plan``).

Limits: any T >= 1, any dim, W >= 2, any number of sequences (groups of up
to 128 rows); x, pool float32 or bfloat16, weight / bias any float dtype (DMA'd
in their dtype, VectorE converts). What binds (modeled, trn2, dim 8192, bf16,
one token; ``python -m simulate --op short_conv_decode``): DMA (75 % busy) with
VectorE behind (64 %: the PSUM evictions of the transposed windows and the
diagonals) for 512 sequences (one-block layout, 4 groups, TensorE taps); for 32
(wide layout R = 4, one group, 4 fused steps of 4 sub-tiles) VectorE (the
multiplies and tap reductions, ~15 us) with the latency chains around it: ~4 us
before the first step (table row -> state gather -> transposes) and ~3 us after the
last (transposes back, activation, store); figures in
``nki_ssm/kernels/short_conv/__init__.py``. At R = 1 and 32 sequences what
binds is the DMA (every load / store spans 32 partitions, so 4 of the 16 DMA
engines) and ScalarE's new-state assembly; a single layout would need each
group's DMAs split into >= 4 concurrent channel slices -- not tried.
"""
from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels.scaffold import destination, lnc_grid, run_if, trip_counts, work_loop
from nki_ssm.kernels.short_conv.split import program_channels

PMAX = 128
SUB = 128                   # channels per transposed sub-tile
FUSED_BATCH = 4             # sub-tiles per step of the fused taps (a 512-channel chunk)
PE_TAP_SUMS = True          # part of the fused sub-tiles sum their taps on TensorE (_pe_subs)
PROD_BYTES = 32 * 1024      # bytes per partition of the fused taps' float32 products
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


def _pool_column(pool_flat, c0, H):
    """(column of the group's pool-row table, first channel inside that pool row) of a
    chunk starting at channel c0 of a partition's channels: a partition spans one or
    more pool rows of pool_flat.shape[1] // H channels, and a chunk never crosses one."""
    DP = pool_flat.shape[1] // H
    return (c0 // DP, c0 - (c0 // DP) * DP)


def _load_group(x, pool_flat, g, prow, c0, cd, R, Pn, D, H, CD, base):
    """Gather the state rows (one pool row per partition) and load the x rows of the group
    starting at position g (an NkiScalar), channels [c0, c0 + cd) of each block of this
    program's channels (``base``: its first channel cb and the element offset pbase of
    its pool rows)."""
    N, T, dim = x.shape
    P = R * Pn
    cb, pbase = base
    col, pc0 = _pool_column(pool_flat, c0, H)
    st = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st[0:P, 0:cd, :],
                  src=pool_flat.ap(pattern=[[pool_flat.shape[1], P], [H, cd], [1, H]],
                                   offset=pbase + pc0 * H, vector_offset=prow[0:P, col:col + 1],
                                   indirect_dim=0))
    xs = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
    # partition r*Pn + i reads x[g + i, :, cb + r*D + c0 : cb + r*D + c0 + cd]
    nisa.dma_copy(dst=xs[0:P, :, 0:cd],
                  src=x.ap(pattern=[[D, R], [T * dim, Pn], [dim, T], [1, cd]], offset=cb + c0,
                           scalar_offset=g, indirect_dim=0))
    return (st, xs)


def _channel_columns(src, cb, R, D, width, dst):
    """dst[p, r, s, :] = src[cb + r*D + s*128 + p, ...] (channel-major per-partition columns
    of the channels from cb on, float32): DMA in the source dtype, VectorE converts when it
    is not float32."""
    nsub = (D + SUB - 1) // SUB
    nfull = D // SUB
    inner = width
    if nfull == nsub and R * nsub <= PMAX and R * nsub * width <= BANK_BYTES // 4:
        _channel_columns_rows(src, cb, R * nsub, width, dst)
        return
    stage = dst
    if src.dtype != dst.dtype:
        stage = nl.ndarray(dst.shape, dtype=src.dtype, buffer=nl.sbuf)
    if nfull > 0:
        nisa.dma_copy(dst=stage[:, :, 0:nfull, :],
                      src=src.ap(pattern=[[inner, SUB], [D * inner, R], [SUB * inner, nfull],
                                          [1, inner]], offset=cb * inner))
        if src.dtype != dst.dtype:
            nisa.tensor_copy(dst=dst[:, :, 0:nfull, :], src=stage[:, :, 0:nfull, :])
    if nsub > nfull:
        wl = D - nfull * SUB
        nisa.dma_copy(dst=stage[0:wl, :, nfull, :],
                      src=src.ap(pattern=[[inner, wl], [D * inner, R], [1, inner]],
                                 offset=(cb + nfull * SUB) * inner))
        if src.dtype != dst.dtype:
            nisa.tensor_copy(dst=dst[0:wl, :, nfull, :], src=stage[0:wl, :, nfull, :])


def _channel_columns_rows(src, cb, NQ, width, dst):
    """dst[p, q, :] = src[cb + q*128 + p, :] for NQ full 128-channel tiles (dst
    ``[128, R, nsub, width]`` float32 viewed as ``[128, (q, width)]``, q = r * nsub + s):
    read channel-on-partition the source is one ``width``-element run per channel (8-byte
    descriptors at W = 4 bfloat16), so instead one DMA brings tile q's ``128 * width``
    contiguous elements to partition q, VectorE converts them to float32, one TensorE
    transpose per column k turns ``[NQ, 128 ch]`` into ``[128 ch, NQ]`` (exact for
    float32) and one VectorE copy interleaves the PSUM columns into dst."""
    rows_raw = nl.ndarray((NQ, SUB * width), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=rows_raw, src=src.ap(pattern=[[SUB * width, NQ], [1, SUB * width]],
                                           offset=cb * width))
    rows32 = rows_raw
    if src.dtype != nl.float32:
        rows32 = nl.ndarray((NQ, SUB * width), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=rows32, src=rows_raw)
    ps = nl.ndarray((PMAX, width * NQ), dtype=nl.float32, buffer=nl.psum)
    for k in range(width):
        nisa.nc_transpose(dst=ps[0:SUB, k * NQ:(k + 1) * NQ],
                          data=rows32.ap(pattern=[[SUB * width, NQ], [width, SUB]], offset=k))
    # dst element (p, q, k) <- psum [p, k * NQ + q]
    nisa.tensor_copy(dst=dst.ap(pattern=[[NQ * width, SUB], [width, NQ], [1, width]], offset=0),
                     src=ps.ap(pattern=[[ps.shape[1], SUB], [1, NQ], [NQ, width]], offset=0))


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


def _psum_plan_fused(nbytes, H, T):
    """(sub-tiles per step, tokens per step) of the fused taps (``_front_fused``: one
    window tile of ``nb * (H + tn)`` columns per step), or None when no step of at least
    one token fits: two steps' window tiles and one float32 output tile within the 8
    PSUM banks, the float32 products within PROD_BYTES per partition."""
    for tn in (T, 1):
        batch = FUSED_BATCH
        while batch >= 1:
            wb = (batch * (H + tn) * PMAX * nbytes + BANK_BYTES - 1) // BANK_BYTES
            ybanks = (tn * batch * SUB * 4 + BANK_BYTES - 1) // BANK_BYTES
            prod_bytes = 2 * tn * batch * (H + 1) * PMAX * 4
            if 2 * wb + ybanks <= PSUM_BANKS and prod_bytes <= PROD_BYTES:
                return (batch, tn)
            batch = batch - 1
    return None


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
    accumulators (``(tile [128, 1, rows], 0)`` per token)."""
    st, xs = unit
    P = R * Pn
    subs = []
    for entry in j_list:
        j0, w = entry
        s = s0 + j0 // SUB
        win = _window_tiles(st, xs, P, j0, w, H, t0, tn)
        accs = []
        for t in range(tn):
            acc = nl.ndarray((SUB, 1, PMAX), dtype=nl.float32, buffer=nl.sbuf)
            ps, slot = win[t]
            for r in range(R):
                a, b = r * Pn, (r + 1) * Pn         # block r's rows
                # acc = x_0 * w_0 (+ bias): the bias rides on the first tap for free
                if has_bias:
                    nisa.activation(dst=acc[0:w, 0, a:b], op=nl.copy, data=ps[0:w, slot, a:b],
                                    scale=w_all[0:w, r, s, 0:1], bias=b_all[0:w, r, s, 0:1])
                else:
                    nisa.activation(dst=acc[0:w, 0, a:b], op=nl.copy, data=ps[0:w, slot, a:b],
                                    scale=w_all[0:w, r, s, 0:1])
            accs.append((acc, 0))
        subs.append((j0, w, s, win, accs, False, None))
    return subs


def _front_fused(unit, j_list, w_all, b_all, has_bias, R, Pn, s0, H, t0, tn, prods,
                 pe_ident, pe_subs):
    """Pipeline stage 1 of a step when its window columns share one dtype and its nb
    sub-tiles are full: TensorE transposes every window column of every sub-tile into ONE
    PSUM tile ``[128 ch, nb, H + tn, rows]``; then per token VectorE takes all W taps of
    all R blocks of all nb sub-tiles at once: one multiply by the weights (``w_all`` read
    with a zero stride over the Pn rows of a block, so block r's rows get block r's
    channels' weights) into ``prods [128, nb, W, rows]`` and one reduction over the taps
    into the accumulator ``[128, nb, rows]`` (plus one add of the bias, if any)."""
    st, xs = unit
    P = R * Pn
    W = H + 1
    nb = len(j_list)
    NC = H + tn
    nsub = w_all.shape[2]
    wrow = R * nsub * W
    ps = nl.ndarray((PMAX, nb, NC, PMAX), dtype=st.dtype, buffer=nl.psum)
    # the x columns first: x arrives before the state, whose gather waits for the table row
    for part in range(2):
        for e in range(nb):
            j0, w = j_list[e]
            for i in range(t0, t0 + NC):
                if i < H and part == 1:
                    nisa.nc_transpose(dst=ps[0:w, e, i - t0, 0:P], data=st[0:P, j0:j0 + w, i])
                elif i >= H and part == 0:
                    nisa.nc_transpose(dst=ps[0:w, e, i - t0, 0:P],
                                      data=xs[0:P, i - H, j0:j0 + w])
    s = s0 + j_list[0][0] // SUB
    pst = nb * NC * PMAX
    nbm = prods[0][0].shape[1]
    prow = nbm * W * PMAX
    npe = 0
    if pe_ident != None:  # noqa: E711
        npe = pe_subs
    pend = []
    accs = []
    for t in range(tn):
        acc = nl.ndarray((SUB, nb, PMAX), dtype=nl.float32, buffer=nl.sbuf)
        # the products rotate over the steps (a step's TensorE tap sums read them after
        # the next step's multiply)
        tiles, used = prods
        prod = tiles[used[0] % len(tiles)]
        used[0] = used[0] + 1
        # prod[c, e, k, (r, i)] = window column t + k of row (r, i) x weight[r*D + c, k]
        # (sub-tile s + e)
        nisa.tensor_tensor(
            dst=prod.ap(pattern=[[prow, SUB], [W * PMAX, nb], [PMAX, W], [Pn, R], [1, Pn]],
                        offset=0),
            data1=ps.ap(pattern=[[pst, SUB], [NC * PMAX, nb], [PMAX, W], [Pn, R], [1, Pn]],
                        offset=t * PMAX),
            data2=w_all.ap(pattern=[[wrow, SUB], [W, nb], [1, W], [nsub * W, R], [0, Pn]],
                           offset=s * W),
            op=nl.multiply)
        # the tap sums: sub-tiles npe .. nb by one VectorE reduction, the first npe on
        # TensorE (``_middle``)
        if npe < nb:
            nisa.tensor_reduce(dst=acc[0:SUB, npe:nb, 0:P], op=nl.add,
                               data=prod.ap(pattern=[[prow, SUB], [W * PMAX, nb - npe],
                                                     [1, P], [PMAX, W]], offset=npe * W * PMAX),
                               axis=3)
        if npe > 0:
            pend.append((prod, acc, t))
        accs.append(acc)
    subs = []
    for e in range(nb):
        j0, w = j_list[e]
        eaccs = []
        for t in range(tn):
            eaccs.append((accs[t], e))
        pe = None
        if e == 0 and npe > 0:
            pe = (pend, pe_ident, npe, P, W, b_all, has_bias, R, Pn, nsub, s, nb)
        subs.append((j0, w, s + e, None, eaccs, True, pe))
    if npe == 0 and has_bias:
        for t in range(tn):
            _add_bias(accs[t], b_all, R, Pn, nsub, s, nb, P)
    return subs


def _pe_subs(nb, i, nsteps):
    """Sub-tiles of fused step i (of nsteps, nb sub-tiles) whose tap sums go to TensorE:
    3/4 and 1/2 of them on alternate steps (TensorE and VectorE about equally busy), 1/4
    on the last step (its TensorE sums, eviction and transposes back make the launch's
    tail)."""
    if i + 1 == nsteps:
        return nb // 4
    if i % 2 == 0:
        return 3 * nb // 4
    return nb // 2


def _add_bias(acc, b_all, R, Pn, nsub, s, nb, P):
    """acc[c, e, (r, i)] += bias[r*D + (s + e)*128 + c] (zero stride over the Pn rows)."""
    nisa.tensor_tensor(dst=acc[0:SUB, 0:nb, 0:P], data1=acc[0:SUB, 0:nb, 0:P],
                       data2=b_all.ap(pattern=[[R * nsub, SUB], [1, nb], [nsub, R], [0, Pn]],
                                      offset=s),
                       op=nl.add)


def _tap_sums_pe(pe):
    """The fused step's TensorE tap sums (issued after the next step's window
    transposes): per token, sub-tiles 0 .. npe: out = sum_k I.T @ prod_k accumulated in
    one PSUM bank (the identity as stationary), evicted by ScalarE into the accumulator;
    then the bias, if any."""
    pend, ident32, npe, P, W, b_all, has_bias, R, Pn, nsub, s, nb = pe
    for item in pend:
        prod, acc, t = item
        pacc = nl.ndarray((PMAX, npe, PMAX), dtype=nl.float32, buffer=nl.psum)
        for e in range(npe):
            for k in range(W):
                nisa.nc_matmul(dst=pacc[0:SUB, e, 0:P], stationary=ident32[0:SUB, 0:SUB],
                               moving=prod[0:SUB, e, k, 0:P], is_stationary_onezero=True,
                               accumulate=k > 0)
        nisa.tensor_copy(dst=acc[0:SUB, 0:npe, 0:P], src=pacc[0:SUB, 0:npe, 0:P],
                         engine=nisa.engine.scalar)
        if has_bias:
            _add_bias(acc, b_all, R, Pn, nsub, s, nb, P)


def _middle(subs, w_all, R, Pn, tn, W):
    """Stage 2: VectorE multiply-adds of the other taps (not for fused steps);
    independent accumulators are interleaved so no instruction waits on the one just
    before it."""
    for entry in subs:
        if entry[6] != None:  # noqa: E711
            _tap_sums_pe(entry[6])
    for k in range(1, W):
        for t in range(tn):
            for entry in subs:
                j0, w, s, win, accs, fused, pe = entry
                if fused:
                    continue
                ps, slot = win[t + k]
                acc, e = accs[t]
                for r in range(R):
                    a, b = r * Pn, (r + 1) * Pn
                    nisa.scalar_tensor_tensor(dst=acc[0:w, e, a:b], data=ps[0:w, slot, a:b],
                                              op0=nl.multiply,
                                              operand0=w_all[0:w, r, s, k:k + 1],
                                              op1=nl.add, operand1=acc[0:w, e, a:b])


def _back(subs, yt, P, t0, tn, act_op):
    """Stage 3: TensorE transposes the float32 accumulators back to rows; one ScalarE
    instruction applies the activation while evicting into the rows' output tile."""
    j_first = subs[0][0]
    span = 0
    ps_y = nl.ndarray((PMAX, tn, len(subs) * SUB), dtype=nl.float32, buffer=nl.psum)
    for entry in subs:
        j0, w, s, win, accs, fused, pe = entry
        for t in range(tn):
            acc, e = accs[t]
            nisa.nc_transpose(dst=ps_y[0:P, t, j0 - j_first:j0 - j_first + w],
                              data=acc[0:w, e, 0:P])
        span = j0 - j_first + w
    nisa.activation(dst=yt[0:P, t0:t0 + tn, j_first:j_first + span], op=act_op,
                    data=ps_y[0:P, :, 0:span])


def _identity(dtype):
    """[128, 128] identity built on GpSimd (ones where partition == column)."""
    ident = nl.ndarray((SUB, SUB), dtype=dtype, buffer=nl.sbuf)
    _identity_into(ident)
    return ident


def _identity_into(ident):
    """ident [128, 128] <- the identity (GpSimd: ones where partition == column)."""
    ones = nl.ndarray((SUB, SUB), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    nisa.affine_select(dst=ident, pattern=[[-1, SUB]], channel_multiplier=1,
                       on_true_tile=ones, on_false_value=0.0, cmp_op=nl.equal)


def _chunk_diagonals(d, ident, w_all, s0, nsc, D, W):
    """d [128, nsc, W, 128] <- diag(weight[(s0 + j)*128 + p, k]) for the sub-tiles of a
    chunk (VectorE; the write rounds to the matmul dtype -- exact for bfloat16 weights)."""
    for j in range(nsc):
        w = min(SUB, D - (s0 + j) * SUB)
        for k in range(W):
            nisa.tensor_scalar(dst=d[0:w, j, k, 0:w], data=ident[0:w, 0:w], op0=nl.multiply,
                               operand0=w_all[0:w, 0, s0 + j, k:k + 1])


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


def _new_state(pool_flat, st, xs, P, cd, T, H, CD):
    """The chunk's new state (window columns T .. T+W-2) assembled contiguous per
    channel by ScalarE copies, ``[P, cd, H]`` in the pool dtype: issued when the chunk's
    loads are taken, so it runs under the chunk's arithmetic, not after it."""
    ns = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
    ko = max(0, H - T)              # new-state columns taken from the old state
    if ko > 0:
        # ns[:, c, 0:ko] <- st[:, c, T:H] (one copy of all ko columns)
        nisa.tensor_copy(dst=ns[0:P, 0:cd, 0:ko], src=st[0:P, 0:cd, T:H],
                         engine=nisa.engine.scalar)
    for jj in range(ko, H):
        nisa.tensor_copy(dst=ns[0:P, 0:cd, jj], src=xs[0:P, T + jj - H, 0:cd],
                         engine=nisa.engine.scalar)
    return ns


def _store_chunk(y, pool_flat, yt, ns, g, prow, c0, cd, R, Pn, D, H, base):
    """y rows of the group starting at position g (an NkiScalar) for the chunk and the new
    state ``ns`` (``_new_state``) back to the pool rows (one row per partition); ``base``
    as in ``_load_group``."""
    N, T, dim = y.shape
    P = R * Pn
    cb, pbase = base
    nisa.dma_copy(dst=y.ap(pattern=[[D, R], [T * dim, Pn], [dim, T], [1, cd]], offset=cb + c0,
                           scalar_offset=g, indirect_dim=0),
                  src=yt[0:P, :, 0:cd])
    col, pc0 = _pool_column(pool_flat, c0, H)
    nisa.dma_copy(dst=pool_flat.ap(pattern=[[pool_flat.shape[1], P], [H, cd], [1, H]],
                                   offset=pbase + pc0 * H, vector_offset=prow[0:P, col:col + 1],
                                   indirect_dim=0),
                  src=ns[0:P, 0:cd, :])


def _layout(x, weight, bias, y, pool_flat, pool_rows, stop, setup, act_op, has_bias, R,
            tensor_taps, part):
    """One row layout of R channel blocks per sequence over this program's ``part = (cb,
    Dp, pbase)`` (its Dp channels from cb on, its pool rows from element pbase of a slot's
    rows on): its weight columns, with TensorE taps the diagonal weights, built under an
    ``nl.if_else`` on ``setup`` (an NkiScalar flag, 1 when this layout runs, else 0),
    then the top-level runtime group loop over positions 0, Pn, 2 Pn, .. < stop (the
    NkiScalar; 0 when the launcher picked the other layout)."""
    N, T, dim = x.shape
    cb, Dp, pbase = part
    base = (cb, pbase)
    W = weight.shape[1]
    H = W - 1
    D = Dp // R
    Pn = min(PMAX // R, N)
    P = R * Pn
    nsub = (D + SUB - 1) // SUB

    x_bytes = _nbytes(x.dtype)
    pool_bytes = _nbytes(pool_flat.dtype)
    CD = _chunk_channels(T, H, x_bytes, pool_bytes, D)
    DP = pool_flat.shape[1] // H           # channels per pool row
    K = D // DP                            # pool rows per partition
    chunks = []                            # (first channel, channels): within one pool row
    for c in range(K):
        for c0 in range(0, DP, CD):
            chunks.append((c * DP + c0, min(CD, DP - c0)))

    # channel-major weights / bias of every block: w_all[p, r, s, k] = weight[r*D + s*128 + p, k]
    # (the wide layout loads them in each group iteration, ahead of the iteration's first
    # loads, whose state gathers wait for the table row anyway: before the loop they would
    # delay its start, which waits for every engine; it runs one or two groups)
    w_all = nl.ndarray((SUB, R, nsub, W), dtype=nl.float32, buffer=nl.sbuf)
    b_all = None
    if has_bias:
        b_all = nl.ndarray((SUB, R, nsub, 1), dtype=nl.float32, buffer=nl.sbuf)
    weights_in_body = R > 1

    def load_weights():
        _channel_columns(weight, cb, R, D, W, w_all)
        if has_bias:
            _channel_columns(bias, cb, R, D, 1, b_all)

    ident = None
    ones = None
    b_row = None
    b_raw = None
    diags = []
    for ci in range(len(chunks)):
        diags.append(None)
    if tensor_taps:
        ident = nl.ndarray((SUB, SUB), dtype=nl.bfloat16, buffer=nl.sbuf)
        ones = nl.ndarray((1, PMAX), dtype=nl.bfloat16, buffer=nl.sbuf)
        if has_bias:
            b_row = nl.ndarray((1, D), dtype=nl.bfloat16, buffer=nl.sbuf)
            if bias.dtype != nl.bfloat16:
                b_raw = nl.ndarray((1, D), dtype=bias.dtype, buffer=nl.sbuf)
        for ci in range(len(chunks)):
            diags[ci] = nl.ndarray((SUB, (chunks[ci][1] + SUB - 1) // SUB, W, SUB),
                                   dtype=nl.bfloat16, buffer=nl.sbuf)

    def layout_setup():
        """The one-block layout's weight columns and, with TensorE taps, its identity,
        ones row, bias row and diagonals (VectorE): run when this layout runs (``setup``
        1) and not when the other one does (they would cost the launches of the other
        layout their time; built per group, every group)."""
        load_weights()
        if tensor_taps:
            _identity_into(ident)
            nisa.memset(dst=ones, value=1.0)
            if has_bias:
                if b_raw == None:  # noqa: E711
                    nisa.dma_copy(dst=b_row, src=bias.ap(pattern=[[D, 1], [1, D]], offset=cb))
                else:
                    # DMA in the bias dtype; VectorE rounds (exact: the launcher checked
                    # the values are bfloat16 values)
                    nisa.dma_copy(dst=b_raw, src=bias.ap(pattern=[[D, 1], [1, D]], offset=cb))
                    nisa.tensor_copy(dst=b_row, src=b_raw)
            for ci in range(len(chunks)):
                _chunk_diagonals(diags[ci], ident, w_all, chunks[ci][0] // SUB,
                                 (chunks[ci][1] + SUB - 1) // SUB, D, W)

    if not weights_in_body:
        run_if(setup, layout_setup)

    chunk_bytes = CD * (H * pool_bytes + T * x_bytes)
    PD = max(1, min(len(chunks) - 1, LOAD_BUDGET // chunk_bytes - 1))
    fused = None
    if not tensor_taps and pool_flat.dtype == x.dtype:
        fused = _psum_plan_fused(x_bytes, H, T)
    warm = None
    if weights_in_body and act_op != nl.copy:
        warm = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.sbuf)
    prods = None
    pe_ident = None
    if fused != None:  # noqa: E711
        batch, tn = fused
        # the fused taps' float32 products [128 ch, nb, W, rows], one per token of two
        # consecutive steps, rotating (a use counter, restarted by each group iteration)
        tiles = []
        for i in range(2 * tn):
            tiles.append(nl.ndarray((SUB, batch, W, PMAX), dtype=nl.float32, buffer=nl.sbuf))
        prods = (tiles, [0])
        if PE_TAP_SUMS and batch > 1:
            pe_ident = nl.ndarray((SUB, SUB), dtype=nl.float32, buffer=nl.sbuf)
    else:
        batch, tn = _psum_plan(pool_bytes, x_bytes, pool_flat.dtype == x.dtype, H, T)
    steps = _plan_steps(chunks, batch, tn, T)

    def group_body(g):
        # this group's pool rows: P * K entries from position g of pool_rows [N, RB] (the
        # launcher's [groups, R * Pn, K] table, block-major inside a group)
        prow = nl.ndarray((PMAX, K), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=prow[0:P, :], src=pool_rows.ap(pattern=[[K, P], [1, K]], offset=0,
                                                          scalar_offset=g, indirect_dim=0))
        if warm != None:  # noqa: E711
            # one tiny activation while the first loads are in flight: ScalarE loads the
            # activation's table here instead of before the first step's outputs
            nisa.memset(dst=warm[0:1, 0:1], value=0.0)
            nisa.activation(dst=warm[0:1, 1:2], op=act_op, data=warm[0:1, 0:1])
        if pe_ident != None:  # noqa: E711
            # the identity of the TensorE tap sums, built while the table row loads (GpSimd
            # is free until it generates the state gathers' descriptors)
            _identity_into(pe_ident)
        if weights_in_body:
            load_weights()
        if prods != None:  # noqa: E711
            prods[1][0] = 0
        loads = []
        units = []                 # per chunk: (state, x, output tile), while live
        for ci in range(len(chunks)):
            loads.append(None)
            units.append(None)
        for ci in range(min(PD, len(chunks))):
            loads[ci] = _load_group(x, pool_flat, g, prow, chunks[ci][0], chunks[ci][1],
                                    R, Pn, D, H, CD, base)
        prev = None
        for i in range(len(steps) + 1):
            nxt = None
            if i < len(steps):
                ci, j_list, t0, n, last = steps[i]
                first_step = units[ci] == None  # noqa: E711
                if first_step:
                    if ci + PD < len(chunks):
                        loads[ci + PD] = _load_group(x, pool_flat, g, prow,
                                                     chunks[ci + PD][0], chunks[ci + PD][1],
                                                     R, Pn, D, H, CD, base)
                    yt = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
                    ns = _new_state(pool_flat, loads[ci][0], loads[ci][1], P, chunks[ci][1],
                                    T, H, CD)
                    units[ci] = (loads[ci][0], loads[ci][1], yt, ns)
                    loads[ci] = None
                st, xs, yt, ns = units[ci]
                if tensor_taps:
                    front = _front_mm((st, xs), j_list, P, chunks[ci][0] // SUB, H, t0, n)
                elif fused != None and j_list[-1][1] == SUB:  # noqa: E711
                    front = _front_fused((st, xs), j_list, w_all, b_all, has_bias, R, Pn,
                                         chunks[ci][0] // SUB, H, t0, n, prods, pe_ident,
                                         _pe_subs(len(j_list), i, len(steps)))
                else:
                    front = _front((st, xs), j_list, w_all, b_all, has_bias, R, Pn,
                                   chunks[ci][0] // SUB, H, t0, n)
                nxt = (ci, t0, n, last, front)
            if prev != None:  # noqa: E711
                pci, pt0, pn, plast, subs = prev
                c0, cd = chunks[pci]
                st, xs, yt, ns = units[pci]
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
                    _store_chunk(y, pool_flat, yt, ns, g, prow, c0, cd, R, Pn, D, H, base)
                    units[pci] = None     # the chunk's buffers die here
                subs = None               # step i-1's PSUM windows die before step i+1's
            prev = nxt

    work_loop(stop, group_body, step=Pn)


@nki.jit
def short_conv_decode_kernel(x, weight, bias, pool_flat, rows_wide, rows_one, counts,
                             activation, has_bias, R, tensor_taps):
    """x ``[N, T, dim]`` (the compacted batch, N = the sequence bucket, see the module
    docstring); weight ``[dim, W]``; bias ``[dim]`` or None; pool_flat ``[slots * RT, (dim
    / RT) * (W-1)]`` (the pool, one row per (slot, channel block), RT = R, or 2R when the
    two programs of an LNC=2 launch split the channels; updated in place by the
    kernel's scatters); rows_wide int32 ``[N, R]``: per group of the wide layout and
    partition ``r * Pn + i``, the pool row ``slot * RT + r``; rows_one int32 ``[N, R]``:
    per position of the one-block layout, its R pool rows ``slot * RT + c`` (program p
    adds p * R to both); counts int32 ``[1, 3]``, read by every program: (stop of the
    wide group loop, stop of the one-block group loop, the one-block diagonal-build
    flag: 1 when that layout runs) -- the launcher gives the layout it did not pick a
    stop of 0; activation "silu" or "none"; R channel blocks per sequence of the wide
    layout (1: the program holds the one-block layout only; Dp / R a multiple of 128,
    Dp the program's channels); tensor_taps: the one-block layout does the taps as
    TensorE matmuls with diagonal weights (launcher: bfloat16 x and pool, weights / bias
    holding bfloat16 values) instead of ScalarE + VectorE multiply-adds. Returns y ``[N,
    T, dim]`` in x's dtype (positions past the live ones not written).

    Inside a group, steps of ``batch`` sub-tiles run as a three-stage software
    pipeline: the transposes and first tap of step i+1 are issued before the
    multiply-adds and outputs of step i, so TensorE, VectorE and ScalarE overlap.
    """
    N, T, dim = x.shape
    act_op = nl.silu if activation == "silu" else nl.copy
    y = nl.ndarray((N, T, dim), dtype=x.dtype, buffer=nl.shared_hbm)

    # the stops of the two layouts' group loops (0 for the layout the launcher did not
    # pick) and the one-block layout's diagonal-build flag: device scalars of the one
    # counts row both programs read, so their trip counts and branches are equal
    stops = trip_counts(counts)
    # LNC: this program's channels [cb, cb + Dp) (a half each, or all of them when they do
    # not split: split.program_channels), pool rows p * R .. p * R + R - 1 of each slot's
    # rows. A second program without channels of its own runs program 0's channels into
    # private dumps of y and the pool (same loops, nothing real written)
    programs, pid = lnc_grid()
    Dp, parts = program_channels(dim, programs)
    part = (0, Dp, 0)
    if parts > 1:
        part = (pid * Dp, Dp, pid * R * pool_flat.shape[1])
    real = pid < parts
    y_out = destination(y, real)
    pool_io = destination(pool_flat, real)
    if R > 1:
        _layout(x, weight, bias, y_out, pool_io, rows_wide, stops[0], None, act_op, has_bias,
                R, False, part)
    _layout(x, weight, bias, y_out, pool_io, rows_one, stops[1], stops[2], act_op, has_bias,
            1, tensor_taps, part)
    return y
