"""Ragged prefill of the short causal conv1d with a state pool: one compiled program per
(token bucket, sequence bucket, layer shape).

Shapes: x ``[NB, dim]`` (the batch padded to the token bucket NB), weight
``[dim, W]``, bias ``[dim]`` or None, pool ``[slots, dim * (W-1)]`` (the
``[slots, dim, W-1]`` pool's row view, updated in place by the kernel's own DMA
writes), y ``[(NB + M) * NT, 128]`` in x's dtype: token t's channels as NT =
programs * ceil(Dp / 128) rows of 128, one block of ceil(Dp / 128) rows per program
(below; the host views y as ``[NB + M, programs, ceil(Dp / 128) * 128]`` and keeps
``[:num_tokens, :parts, :Dp]``; ``M = _margin(W-1)`` = 16 for W <= 17 scratch
token rows at the end). x / pool float32 or bfloat16; weight / bias any float
dtype (DMA'd in their dtype, converted on VectorE). H = W - 1, NH = M.

LNC: the programs split the channels
------------------------------------
Launched as ``kernel[2]`` (LNC=2), the two programs take the two halves of the
channels (``split.program_channels``: Dp = dim / 2 each when dim is even and above
one 128-channel tile): program p (``nl.program_id(0)``, a Python int at trace time)
runs everything below -- zero loop, stream loops, head loop -- on its channels
``[p * Dp, (p + 1) * Dp)`` only: x, weight and bias columns from channel p * Dp,
its part ``[p * Dp * H, (p + 1) * Dp * H)`` of every pool row (the pool is
channel-major), its own block of y rows, its own ``private_hbm`` candidate scratch,
and its three of the ``counts`` (``counts[0, 3p : 3p + 3]``). Both programs read
the same batch tables and trace the same instructions (the same Dp), so they have the
same program size; they share no HBM byte they write, and depthwise channels need
nothing from each other, so no synchronisation is needed and the results equal
LNC=1 bit for bit. At dim 8192 each program streams 2 groups of 16 tiles instead
of 4 and its heads cover 4096 channels. When the channels do not split (one
tile, an odd dim) program 0 takes them all and program 1 gets zero counts: its
loops run no iteration (it touches no pool slot); its straight-line last stream
pair writes only its own y block, which the host drops.

Design note: batch composition is run-time data
-----------------------------------------------
Compile-time arguments: shapes (NB, the sequence bucket SB, dim, W, slots),
dtypes, the activation, the bias flag and the matmul precision flags. The batch
arrives as int32 / uint32 / float32 tables the launcher builds with a few
vectorised array ops (``nki_ssm.ops.launch.short_conv.prefill_tables``, each
step named there with its torch equivalent):

- ``win_base [128, NI]`` float32: window row offsets ``j * 128 + p - M`` of the
  column-major gather-index tile (a function of the bucket only);
- the head work list, one row per live sequence (compacted: live sequences
  first, in order): ``seq_rows [SB, 2*NH, 1]`` uint32, the x rows of its first NH
  and last NH tokens (clamped into the bucket); ``seq_yrows [SB, columns, 128]``
  int32, the y row ``row_k * NT + j`` of its token k in channel tile j of a
  program's block (``row_k = NB + k``, a scratch row, for k >= length; each program
  adds its block's offset), at ``(j % tb) * H + k`` of column
  ``j // tb`` with ``tb = 128 // H`` (the partial tile, if any, in a last column of
  its own); ``seq_info [SB, 2]`` int32: its slot and its case ``min(length, H)``;
- ``zero_slots [SB, 1]`` int32: the slots of live sequences without initial
  state, compacted;
- ``counts [1, 4]`` int32, the one row every program reads: with ``pairs =
  ceil(ceil(num_tokens / CHUNK) / 2)`` and ``loop = max(pairs - 1, 0)``, ``loop //
  PAIRS_PER_ITERATION`` and ``loop % PAIRS_PER_ITERATION`` (stream-loop trips), the
  live sequences, the slots to zero.

Loops: every runtime loop is ``nl.fori_loop(0, n, body)`` at the top level of
the kernel (``scaffold.work_loop`` / ``for_each_row``), its body an inner ``def``,
its bound an ``NkiScalar`` (``scaffold.trip_counts``: ``nisa.scalar_load`` of an
SBUF copy of ``counts``), its table cells ``NkiScalar`` s too; no runtime loop runs
inside another, and no 0/1-trip loop stands for a conditional: each choice is a
DMA offset. Each loop body allocates the PSUM banks it writes. Everything unrolled
inside a body is bounded by the layer shape (channel tiles, taps, the CH / 128
token blocks of a chunk, H). The cost model synchronises every compute engine
at each iteration start, so work that must not wait sits in DMAs, which run on
across iteration boundaries.

0. **Zero loop** over ``zero_slots``: one DMA per 128 pool-row channels writes
   zeros (an SBUF tile in the pool dtype) over the slot, so every head below
   reads its old state from its slot. DMAs only; they run under the stream.
1. **Stream loops**, two per channel group (up to 16 tiles of 128 channels), over
   the whole token stream in fixed chunks of CH = 512 tokens (or the bucket if
   smaller), in pairs of chunks (slots A, B): the first loop runs
   PAIRS_PER_ITERATION = 5 pairs per iteration, the second the pairs left, one per
   iteration. An iteration loads what it reads: nothing is prefetched across
   iterations (nki-library turns that off for dynamic loops, NKI-1582). Its first two
   windows are issued when it starts (B's loads while A computes), each later
   window as soon as its slot's matmuls are done (it loads under the other slot's
   chunk), and its last chunk is stored block by block, so the next iteration's
   first windows wait behind little; only those first windows are exposed, once per
   iteration. The last pair of a group follows its loops as straight-line code, and
   VectorE builds the next group's diagonal weights there (their DMAs were issued
   before the group's loops); with no tokens at all it computes the padding rows,
   which the host drops. The window of a
   chunk is one *indirect* ``dma_transpose`` (gather transpose, software DGE):
   x rows ``t0 - M .. t0 + CH`` by a uint32 index tile computed on VectorE
   (``clamp(win_base + t0, 0, NB - 1)``, t0 a running chunk start kept in SBUF;
   no table DMA in the loop), transposed to ``[128 ch, tiles, M + CH tok]``.
   Sequence boundaries are ignored: the first H tokens of every sequence (and
   tokens whose window is clamped at row 0) get wrong values, rewritten by the
   heads; every other token's window lies inside its own sequence. TensorE does
   the W taps as accumulating matmuls on the whole PE array ``psum[tok, ch] +=
   xw[:, k:k+128].T @ diag(weight[:, k])`` (``accumulate`` given on every matmul
   into a bank) -- with float32 operands every 2nd channel tile, with split
   weights every 4th, on VectorE plus a TensorE transpose instead; ScalarE applies SiLU / copy evicting each bank; a chunk is
   stored by ONE ``scalar_offset`` DMA of its CH token rows, the offset a (1, 1)
   int32 SBUF tile VectorE computes (stores with run-time addresses are ordered
   after each other, so few large ones). Past the bucket the chunk start is
   clamped to ``NB - CH``: a *mirror* of the last chunk (same window,
   bit-identical bytes to the same rows); tokens of the padding region compute
   garbage that the host drops.
2. **Head loop** over live sequences (the head work list), after every stream
   loop; per sequence, for all full channel tiles at once (and the partial tile,
   if any), with the row's slot and case DMA'd into (1, 1) SBUF tiles:
   - window ``[old state | first NH tokens | last NH tokens]``: the old state by
     one ``scalar_offset`` DMA (the slot, an ``NkiScalar`` cell) as rows of 128 channels (contiguous
     128 * H runs; the pool is channel-major ``[dim, H]``, so channel-on-partition
     reads would be 6-byte runs), converted to float32 by VectorE and put into
     the window by TensorE transposes; the tokens by one gather transpose of
     ``seq_rows``;
   - the first H outputs on VectorE in float32 (weights as per-channel columns
     repeated over the H tokens by a zero-stride access pattern: no diagonals
     needed), TensorE transposes ``[128 ch, tiles x H]`` into (tile, token)
     rows, ScalarE applies the activation, and one ``vector_offset`` DMA per 128
     rows writes each (tile, token) row -- one contiguous 128-channel run per
     partition; k >= length goes to a scratch row, so no ``oob_mode.skip`` --
     over the stream loop's values;
   - the new state: for each case c in 0..H the candidate (window columns c ..
     c+H of ``old state ++ tokens`` for c < H, the last H tokens for c = H) is
     staged by VectorE, turned into 128-channel pool rows by TensorE transposes
     (the pool-dtype rounding in the PSUM eviction) and DMA'd to row c of the
     kernel's ``private_hbm`` scratch ``cand [H+1, dim * H]``; then candidate
     ``case`` (a DMA offset) goes through SBUF to the slot (two DMAs, each with
     one run-time offset). No conditional, and no value is ever multiplied by a
     mask (a NaN in an unused candidate cannot leak).
   Padding sequences (``state_indices < 0``) are compacted away: they never touch
   the pool, and the host zeroes their y rows.

What binds (modeled, trn2, dim 8192, W 4, bf16, bf16 pool, the cost model of
this commit with its loop synchronisation; ``python -m simulate --set judged
--op short_conv_prefill``): DMA (the windows and the stores) with TensorE
behind. See the table in ``nki_ssm/kernels/short_conv/__init__.py`` for the
figures; the head loop is a fixed cost per live sequence (14 DMAs at dim 8192
and 5 small TensorE / VectorE phases).

float32 x: the gather transpose takes 2-byte dtypes only (API page), so its
windows are gathered token-major by ``vector_offset`` DMAs (one x row per
partition) and transposed on TensorE (fp32 transposes, plus a ScalarE
PSUM-to-SBUF copy per 512 columns); the extra staging halves the channel
group to 4 tiles.

Limits: dim any size (tiles of 128 channels, the last may be partial),
2 <= W <= 65 (``W - 1 <= 64``: both NH-token head windows fit one 128-index
gather), any number of tokens per sequence, empty sequences, padding
sequences. Matmul operands are float32 when x or the pool is float32 (pool
values pass through exactly), else bfloat16 (hi + lo split of float32
weights / bias that bfloat16 does not hold).
"""
from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels._common import identity
from nki_ssm.kernels.scaffold import (destination, for_each_row, lnc_grid, row_cells,
                                      trip_counts, work_loop)
from nki_ssm.kernels.short_conv.split import program_channels

TILE = 128          # channels per partition tile / tokens per output block
GROUP_TILES = 16    # most channel tiles per group: 2048 channels -> 4 KiB bf16 store rows
SBUF_BUDGET = 150 * 1024   # bytes per partition for the per-group working set
CHUNK = 512         # tokens per stream window (n_tiles * 528 * 2 B = 16.5 KiB per partition)
BANK = 512          # fp32 columns of one PSUM bank
PSUM_TILES = 7      # rotating one-bank PSUM tiles (of 8 banks)
PAIRS_PER_ITERATION = 5   # chunk pairs per stream-loop iteration (its first windows wait)
ALIGN = 16          # window offsets in elements: 32 B (bf16) / 64 B (fp32), the DMA
                    # transpose destination alignment (nki_ssm/sim/isa/dma.py)
MAX_HALO = 64       # W - 1 limit: two head windows of _margin(W-1) rows in one gather


def _margin(H):
    """Columns before token t0 in a window tile: the W-1 halo ends where the chunk's
    tokens start, on an ALIGN boundary; window column c holds token t0 - M + c."""
    return (H + ALIGN - 1) // ALIGN * ALIGN


def _chunk_tokens(NB):
    """Tokens per stream chunk: CHUNK, or the whole bucket when it is smaller."""
    return min(CHUNK, NB)


def _index_columns(F):
    """Columns of a [128, NI] uint32 gather-index tile covering F window rows."""
    return (F + TILE - 1) // TILE


def _group_tiles(W, mm_bytes, n_parts, x_bytes, stage, tok_major, F, dim):
    """Channel tiles per group (16, 8, ... 1) so that the live working set fits
    SBUF_BUDGET: per 128-channel tile of a group two groups' diagonal weights, two
    stream windows (A, B), their staging copies (x-dtype windows when staged,
    token-major windows for float32 x) and two chunk output tiles; plus the head
    buffers, which exist for every channel tile at once, and one head output row set."""
    H = W - 1
    FH = 3 * _margin(H)
    head = FH * mm_bytes + 2 * H * 4 + (FH * x_bytes if stage else 0)
    tiles = (dim + TILE - 1) // TILE
    budget = SBUF_BUDGET - (tiles + GROUP_TILES) * head - GROUP_TILES * TILE * x_bytes
    per_tile = (2 * n_parts * W * TILE * mm_bytes
                + 2 * F * mm_bytes
                + (2 * F * x_bytes if stage else 0)
                + (2 * _index_columns(F) * TILE * x_bytes if tok_major else 0)
                + 2 * CHUNK * x_bytes)
    g = GROUP_TILES
    while g > 1 and g * per_tile > budget:
        g = g // 2
    return g


def _channel_groups(dim, gt, cb):
    """[(c0, n_tiles, P)] of the dim channels from channel cb on (c0 a channel of x):
    full 128-channel tiles in groups of gt, then the partial tile."""
    groups = []
    n_full = dim // TILE
    g0 = 0
    while g0 < n_full:
        n = min(gt, n_full - g0)
        groups.append((cb + g0 * TILE, n, TILE))
        g0 += n
    if dim % TILE:
        groups.append((cb + n_full * TILE, 1, dim % TILE))
    return groups


def _weight_tiles(group, W, mm_dtype, has_bias, w_split, b_split, w_dtype, b_dtype):
    """The SBUF tiles of one channel group's weights (allocated outside the runtime loops,
    filled by _weight_loads / _weight_build): float32 columns w32 [128, n, W] (and the
    lo part when split), diagonal parts [128, n, W, 128] in the matmul dtype, bias row
    [1, gw] (+ parts) and float32 bias columns [128, n]; plus staging tiles in the
    weight / bias dtype when it is not float32 (DMAs keep the dtype; VectorE converts)."""
    c0, n, P = group
    gw = (n - 1) * TILE + P
    w32 = nl.ndarray((TILE, n, W), dtype=nl.float32, buffer=nl.sbuf)
    nparts = 2 if w_split else 1
    diags = []
    for q in range(nparts):
        diags.append(nl.ndarray((TILE, n, W, TILE), dtype=mm_dtype, buffer=nl.sbuf))
    bias_t = None
    w_raw = None
    b_raw = None
    if w_dtype != nl.float32:
        w_raw = nl.ndarray((TILE, n, W), dtype=w_dtype, buffer=nl.sbuf)
    if has_bias:
        bparts = []
        for q in range(2 if b_split else 1):
            bparts.append(nl.ndarray((1, gw), dtype=mm_dtype, buffer=nl.sbuf))
        bias_t = (nl.ndarray((1, gw), dtype=nl.float32, buffer=nl.sbuf), bparts,
                  nl.ndarray((TILE, n), dtype=nl.float32, buffer=nl.sbuf))
        if b_dtype != nl.float32:
            b_raw = (nl.ndarray((1, gw), dtype=b_dtype, buffer=nl.sbuf),
                     nl.ndarray((TILE, n), dtype=b_dtype, buffer=nl.sbuf))
    return (w32, diags, bias_t, (w_raw, b_raw))


def _weight_loads(weight, bias, tiles, group, W):
    """DMAs of a group's weight (and bias) values into its tiles (the staging tiles when
    the weights are not float32)."""
    c0, n, P = group
    gw = (n - 1) * TILE + P
    w32, diags, bias_t, raws = tiles
    w_raw, b_raw = raws
    w_dst = w32
    if w_raw != None:  # noqa: E711
        w_dst = w_raw
    # channel c0 + j*128 + p -> partition p, free (j, k)
    nisa.dma_copy(dst=w_dst[0:P, 0:n, :],
                  src=weight.ap(pattern=[[W, P], [TILE * W, n], [1, W]], offset=c0 * W))
    if bias_t != None:  # noqa: E711
        b32, bparts, bcols = bias_t
        b_row = b32
        b_col = bcols
        if b_raw != None:  # noqa: E711
            b_row = b_raw[0]
            b_col = b_raw[1]
        nisa.dma_copy(dst=b_row[0:1, 0:gw], src=bias.ap(pattern=[[gw, 1], [1, gw]], offset=c0))
        nisa.dma_copy(dst=b_col[0:P, 0:n], src=bias.ap(pattern=[[1, P], [TILE, n]], offset=c0))


def _weight_build(tiles, ident, group, W, mm_dtype):
    """VectorE: diag(weight[c0 + j*128 + p, k]) at [:, j, k, :] per part -- one part: the
    weights rounded to the matmul dtype; two (split): hi = bf16(w) and lo = bf16(w - hi),
    so hi + lo carries w to ~2^-17 -- and the bias row parts. Returns the group's
    (diag parts, bias row parts, float32 weight columns, float32 bias columns or None)."""
    c0, n, P = group
    gw = (n - 1) * TILE + P
    w32, diags, bias_t, raws = tiles
    w_raw, b_raw = raws
    if w_raw != None:  # noqa: E711
        nisa.tensor_copy(dst=w32[0:P, 0:n, :], src=w_raw[0:P, 0:n, :])
    if b_raw != None:  # noqa: E711
        nisa.tensor_copy(dst=bias_t[0][0:1, 0:gw], src=b_raw[0][0:1, 0:gw])
        nisa.tensor_copy(dst=bias_t[2][0:P, 0:n], src=b_raw[1][0:P, 0:n])
    wparts = (w32,)
    if len(diags) > 1:
        hi = nl.ndarray((TILE, n, W), dtype=mm_dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=hi[0:P, :, :], src=w32[0:P, 0:n, :])
        lo32 = nl.ndarray((TILE, n, W), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=lo32[0:P, :, :], data1=w32[0:P, 0:n, :], data2=hi[0:P, :, :],
                           op=nl.subtract)
        wparts = (w32, lo32)
    for q in range(len(diags)):
        d = diags[q]
        src = wparts[q]
        for j in range(n):
            for k in range(W):
                # diag(w) = identity scaled per partition; the write rounds to mm_dtype
                nisa.tensor_scalar(dst=d[0:P, j, k, 0:P], data=ident[0:P, 0:P],
                                   op0=nl.multiply, operand0=src[0:P, j, k:k + 1])
    bparts = ()
    bcols = None
    if bias_t != None:  # noqa: E711
        b32, bparts, bcols = bias_t
        nisa.tensor_copy(dst=bparts[0][0:1, 0:gw], src=b32[0:1, 0:gw])
        if len(bparts) > 1:
            rest = nl.ndarray((1, gw), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=rest, data1=b32[0:1, 0:gw], data2=bparts[0][0:1, 0:gw],
                               op=nl.subtract)
            nisa.tensor_copy(dst=bparts[1][0:1, 0:gw], src=rest)
    return (diags, bparts, w32, bcols)


def _vector_tile(ps, col, xw, w32, bcols, jj, pj, b, m, W, acc):
    """One 128-channel tile of a token block on VectorE (channel-major, float32, into the
    accumulator ``acc``), then a TensorE transpose into its token-major PSUM columns:
    takes work off TensorE."""
    if bcols != None:  # noqa: E711
        nisa.tensor_scalar(dst=acc[0:pj, 0:m], data=xw[0:pj, jj, b:b + m], op0=nl.multiply,
                           operand0=w32[0:pj, jj, 0:1], op1=nl.add, operand1=bcols[0:pj, jj:jj + 1])
    else:
        nisa.tensor_scalar(dst=acc[0:pj, 0:m], data=xw[0:pj, jj, b:b + m], op0=nl.multiply,
                           operand0=w32[0:pj, jj, 0:1])
    for k in range(1, W):
        nisa.scalar_tensor_tensor(dst=acc[0:pj, 0:m], data=xw[0:pj, jj, b + k:b + k + m],
                                  op0=nl.multiply, operand0=w32[0:pj, jj, k:k + 1],
                                  op1=nl.add, operand1=acc[0:pj, 0:m])
    nisa.nc_transpose(dst=ps[0:m, col:col + pj], data=acc[0:pj, 0:m])


def _rotation(outs, accs):
    """Rotating buffers: [PSUM banks, output tiles, VectorE accumulators, use counters].
    The SBUF tiles are allocated once, outside the runtime loops; the PSUM banks afresh by
    ``_new_banks`` in each loop body (and straight-line section) that writes them, as the
    released runtime-loop kernels allocate PSUM. Each body restarts the counters so every
    iteration uses the same tiles (one static body)."""
    return [[], outs, accs, [0, 0, 0]]


def _new_banks(rot):
    """PSUM_TILES fresh one-bank PSUM tiles for the rotation, counters restarted."""
    banks = []
    for i in range(PSUM_TILES):
        banks.append(nl.ndarray((TILE, BANK), dtype=nl.float32, buffer=nl.psum))
    rot[0] = banks
    _restart(rot)


def _take(rot, kind):
    """The next tile of kind 0 (PSUM bank), 1 (output tile) or 2 (accumulator)."""
    tiles = rot[kind]
    i = rot[3][kind]
    rot[3][kind] = i + 1
    return tiles[i % len(tiles)]


def _restart(rot):
    rot[3][0] = 0
    rot[3][1] = 0
    rot[3][2] = 0


def _window_load(x, idx, rows, xw, xs, tm, col0, c0, n, P, rot):
    """Window columns ``col0 .. col0 + rows`` of ``xw[0:P, 0:n]`` <- x rows ``idx``
    (flat column-major over the index tile), channel-major.

    2-byte x: one indirect ``dma_transpose`` (gather transpose; into the x-dtype staging
    tile ``xs`` and a copy up when the matmuls are float32). float32 x (``tm`` given):
    the gather transpose takes 2-byte dtypes only, so one ``vector_offset`` gather per
    128 rows (one x row per partition) brings the rows token-major and TensorE
    transposes each [rows, 128 ch] block into PSUM, copied to the window.
    """
    num_rows, dim = x.shape
    gw = (n - 1) * TILE + P
    if tm == None:  # noqa: E711
        dst_t = xw
        if xs != None:  # noqa: E711
            dst_t = xs
        row = dst_t.shape[1] * dst_t.shape[2]
        RB = dst_t.shape[2]
        nisa.dma_transpose(dst=dst_t.ap(pattern=[[row, P], [RB, n], [1, 1], [1, rows]],
                                        offset=col0),
                           src=x.ap(pattern=[[dim, rows], [TILE, n], [1, 1], [1, P]], offset=c0,
                                    vector_offset=idx, indirect_dim=0),
                           axes=(3, 1, 2, 0))
        if xs != None:  # noqa: E711
            nisa.tensor_copy(dst=xw[0:P, 0:n, col0:col0 + rows], src=xs[0:P, 0:n, col0:col0 + rows])
        return
    nblk = (rows + TILE - 1) // TILE
    per_bank = BANK // TILE
    st_tiles = tm.shape[2] // TILE        # channel tiles the staging tile holds at once
    for s0 in range(0, n, st_tiles):
        sn = min(st_tiles, n - s0)
        sw = min(sn * TILE, gw - s0 * TILE)
        for j in range(nblk):
            nr = min(TILE, rows - j * TILE)
            nisa.dma_copy(dst=tm[0:nr, j, 0:sw],
                          src=x.ap(pattern=[[dim, nr], [1, sw]], offset=c0 + s0 * TILE,
                                   vector_offset=idx[0:nr, j:j + 1], indirect_dim=0))
        for jj in range(s0, s0 + sn):
            pj = min(TILE, gw - jj * TILE)
            lo = (jj - s0) * TILE
            for j0 in range(0, nblk, per_bank):
                ps = _take(rot, 0)
                ncols = 0
                for j in range(j0, min(nblk, j0 + per_bank)):
                    nr = min(TILE, rows - j * TILE)
                    nisa.nc_transpose(dst=ps[0:pj, ncols:ncols + nr],
                                      data=tm[0:nr, j, lo:lo + pj])
                    ncols = ncols + nr
                c = col0 + j0 * TILE
                # ScalarE evicts (VectorE carries every other channel tile's taps in fp32)
                nisa.tensor_copy(dst=xw[0:pj, jj, c:c + ncols], src=ps[0:pj, 0:ncols],
                                 engine=nisa.engine.scalar)


def _taps(ps, col, xw, weights, ones, jj, pj, first_col, m, W):
    """psum[0:m, col:col+pj] = bias + sum_k xw[:, jj, first_col + k + t] * w[:, k] for
    the m tokens t: TensorE with the shifted window as stationary and diag(w_k) moving
    (accumulate given explicitly on every matmul into the bank)."""
    dparts, bparts, w32, bcols = weights
    for q in range(len(bparts)):
        # bias row of this tile: ones[tok] x bias[ch] (K = 1)
        nisa.nc_matmul(dst=ps[0:m, col:col + pj], stationary=ones[0:1, 0:m],
                       moving=bparts[q][0:1, jj * TILE:jj * TILE + pj], accumulate=(q > 0))
    for q in range(len(dparts)):
        for k in range(W):
            first_mm = len(bparts) == 0 and q == 0 and k == 0
            nisa.nc_matmul(dst=ps[0:m, col:col + pj],
                           stationary=xw[0:pj, jj, first_col + k:first_col + k + m],
                           moving=dparts[q][0:pj, jj, k, 0:pj], accumulate=not first_mm)


def _conv_block(xw, ot, weights, ones, b, n, P, W, act_op, vec_every, base, rot):
    """One 128-token block of a stream chunk (window columns base + b ..): TensorE taps
    (every vec_every-th channel tile on VectorE instead), ScalarE eviction into the
    output tile ``ot [128 tok, gw ch]``."""
    dparts, bparts, w32, bcols = weights
    gw = (n - 1) * TILE + P
    for bank0 in range(0, gw, BANK):
        bw = min(BANK, gw - bank0)
        ps = _take(rot, 0)
        for jj in range(bank0 // TILE, (bank0 + bw + TILE - 1) // TILE):
            pj = min(TILE, gw - jj * TILE)
            col = jj * TILE - bank0
            if vec_every > 0 and jj % vec_every == vec_every - 1:
                _vector_tile(ps, col, xw, w32, bcols, jj, pj, base + b, TILE, W, _take(rot, 2))
            else:
                _taps(ps, col, xw, weights, ones, jj, pj, base + b, TILE, W)
        nisa.activation(dst=ot[0:TILE, bank0:bank0 + bw], op=act_op, data=ps[0:TILE, 0:bw])
    return ot


def _next_window(x, bufs, a, group, W, rot):
    """Issue the window of chunk ``a`` (A = 0, B = 1) of this pair: its first token
    ``st[:, a] = min(run + a * CH, NB - CH)`` (past the bucket: the last chunk again, a
    mirror) and gather indices ``clamp(base + st, 0, NB - 1)`` with ``base[p, j] = j * 128
    + p - M`` are computed on VectorE (no table DMA in the loop), then one gather
    transpose (or the float32 path) loads ``x[t0 - M : t0 + CH]`` channel-major."""
    NB, dim = x.shape
    c0, n, P = group
    run, st, sti, base, idx2, wins, outs, NT, yshift = bufs
    NI = base.shape[1]
    xw, xs, tm = wins[a]
    F = xw.shape[2]
    CH = F - _margin(W - 1)
    nisa.tensor_scalar(dst=st[:, a:a + 1], data=run, op0=nl.add, operand0=float(a * CH),
                       op1=nl.minimum, operand1=float(NB - CH))
    nisa.tensor_scalar(dst=idx2[:, a, 0:NI], data=base, op0=nl.add, operand0=st[:, a:a + 1],
                       op1=nl.maximum, operand1=0.0)
    nisa.tensor_scalar(dst=idx2[:, a, 0:NI], data=idx2[:, a, 0:NI], op0=nl.minimum,
                       operand0=float(NB - 1))
    _window_load(x, idx2[0:TILE, a, 0:NI], F, xw, xs, tm, 0, c0, n, P, rot)


def _stream_chunk(y, bufs, a, weights, ones, group, W, act_op, vec_every, rot, last=False):
    """Compute the chunk whose window is in slot ``a`` and store it: one DMA of its CH
    token rows at the run-time first token (``sti[a] = t0 * NT``, y being stored as
    ``[(NB + M) * NT, 128]``: NT rows of 128 channels per token)."""
    run, st, sti, base, idx2, wins, outs, NT, yshift = bufs
    DP = NT * TILE
    c0, n, P = group
    gw = (n - 1) * TILE + P
    xw = wins[a][0]
    CH = xw.shape[2] - _margin(W - 1)
    nblk = CH // TILE
    base_col = _margin(W - 1) - (W - 1)     # window column of token t0 - (W-1)
    nisa.tensor_scalar(dst=sti[a], data=st[0:1, a:a + 1], op0=nl.multiply,
                       operand0=float(NT))
    row = nisa.scalar_load(sti[a])
    for b in range(nblk):
        _conv_block(xw, outs[a][0:TILE, b, :], weights, ones, b * TILE, n, P, W, act_op,
                    vec_every, base_col, rot)
        if last:
            # the iteration's last chunk: each block's rows leave as soon as they are
            # done, so little of the store is left when the next iteration's windows load
            nisa.dma_copy(dst=y.ap(pattern=[[DP, TILE], [1, gw]],
                                   offset=c0 + yshift + b * TILE * DP, scalar_offset=row,
                                   indirect_dim=0),
                          src=outs[a][0:TILE, b, 0:gw])
    if not last:
        # Stores with run-time addresses are ordered after each other (their rows cannot
        # be told apart at compile time), so one large store per chunk keeps that chain
        # short.
        nisa.dma_copy(dst=y.ap(pattern=[[DP, TILE], [TILE * DP, nblk], [1, gw]],
                               offset=c0 + yshift, scalar_offset=row, indirect_dim=0),
                      src=outs[a][0:TILE, 0:nblk, 0:gw])


def _stream_pairs(x, y, bufs, weights, ones, group, W, act_op, vec_every, rot, npairs,
                  next_build):
    """``npairs`` consecutive pairs of chunks (slots A, B) from the running chunk start
    ``run``: the first two windows are issued when the call starts, so B's arrives while A
    computes; each later window goes into its slot as soon as that slot's matmuls are
    done, so it loads under the other slot's chunk. Every window is loaded by the loop
    iteration that uses it: no SBUF prefetch across the runtime loop's iterations
    (nki-library turns it off for dynamic loops, NKI-1582); more pairs per iteration
    leave fewer first windows waited for. ``run`` ends two chunks past the last pair.
    ``next_build`` (the last pair of a group, after its loops): the next group's
    diagonal weights, built on VectorE after the last chunk A while TensorE computes B."""
    run = bufs[0]
    CH = bufs[5][0][0].shape[2] - _margin(W - 1)
    _new_banks(rot)
    for a in range(2):
        _next_window(x, bufs, a, group, W, rot)
    for p in range(npairs):
        for a in range(2):
            _stream_chunk(y, bufs, a, weights, ones, group, W, act_op, vec_every, rot,
                          a == 1 and p + 1 == npairs)
            if p + 1 < npairs:
                if a == 0:
                    nisa.tensor_scalar(dst=run, data=run, op0=nl.add, operand0=float(2 * CH))
                _next_window(x, bufs, a, group, W, rot)
            elif a == 0 and next_build != None:  # noqa: E711
                _weight_build(next_build[0], next_build[1], next_build[2], next_build[3],
                              next_build[4])
    nisa.tensor_scalar(dst=run, data=run, op0=nl.add, operand0=float(2 * CH))


def _pool_blocks(dim, H):
    """A pool row (``dim * H`` elements, channel-major ``[dim, H]``) as DMA blocks
    ``(element offset, rows, row length)``: rows of 128 channels (128 * H contiguous
    elements per partition, up to 128 rows per block), then the partial tile's row."""
    nfull = dim // TILE
    blocks = []
    for j0 in range(0, nfull, TILE):
        blocks.append((j0 * TILE * H, min(TILE, nfull - j0), TILE * H))
    if dim % TILE:
        blocks.append((nfull * TILE * H, 1, (dim % TILE) * H))
    return blocks


def _row_at(t, off, rows, width, slot):
    """Rows ``[rows, width]`` at element ``off`` of row ``slot`` (an NkiScalar) of the 2-D
    HBM tensor t."""
    return t.ap(pattern=[[width, rows], [1, width]], offset=off, scalar_offset=slot,
                indirect_dim=0)


def _zero_slot(pool, blocks, pbase, zero, slot):
    """Write zeros over this program's part of the pool row of ``slot`` (the blocks from
    element ``pbase`` on; one DMA per block, from an SBUF zero tile in the pool dtype)."""
    for blk in blocks:
        off, rows, width = blk
        nisa.dma_copy(dst=_row_at(pool, pbase + off, rows, width, slot),
                      src=zero[0:rows, 0:width])


def _head_sequence(hctx, s):
    """Iteration s of the head loop (live sequence s): for the full 128-channel tiles at
    once (and the partial last tile, if any: ``groups`` here are these one or two head
    groups) the window [old state | first NH tokens | last NH tokens], its first H
    outputs, the H + 1 candidate new states (one per case ``min(length, H)``) to the
    scratch rows ``cand`` and the one of this sequence's case to its slot. No conditional:
    the slot of a sequence without initial state holds zeros (the zero loop), and the case
    is a DMA offset."""
    (x, y, pool, tabs, seq_tabs, hbs, w_all, b_all, groups, W, act_op, rot, srows,
     cand, blocks, cb, yb) = hctx
    H = W - 1
    M = _margin(H)
    sidx, yr = tabs
    seq_rows, seq_yrows, seq_info = seq_tabs
    NH2 = sidx.shape[0]
    YB = yr.shape[1]
    _new_banks(rot)
    nisa.dma_copy(dst=sidx, src=seq_rows.ap(pattern=[[1, NH2], [1, 1]], offset=0,
                                            scalar_offset=s, indirect_dim=0))
    nisa.dma_copy(dst=yr, src=seq_yrows.ap(pattern=[[1, TILE], [TILE, YB]], offset=0,
                                           scalar_offset=s, indirect_dim=0))
    slot, case = row_cells(seq_info, s)
    sr, s32, ns, pst = srows
    # old state at window columns M-H .. M
    for g in range(len(groups)):
        c0, n, P = groups[g]
        wt = hbs[g][0]
        if P == TILE:
            _state_in(pool, c0, slot, srows, wt, n, H, M, rot)
        else:
            nisa.dma_copy(dst=pst[0:P, 0:H],
                          src=pool.ap(pattern=[[H, P], [1, H]], offset=c0 * H,
                                      scalar_offset=slot, indirect_dim=0))
            nisa.tensor_copy(dst=wt[0:P, 0, M - H:M], src=pst[0:P, 0:H])
    for g in range(len(groups)):
        c0, n, P = groups[g]
        wt, ws, tmh, acc, tmp, ot = hbs[g]
        _window_load(x, sidx, NH2, wt, ws, tmh, M, c0, n, P, rot)
    for g in range(len(groups)):
        _head_outputs(hctx, g)
    # candidate c < H: window columns c .. c+H of (old state ++ tokens); c = H: the last
    # H tokens (end of the window); cand holds this program's channels (from cb on)
    dim = cand.shape[1] // H
    for c in range(H + 1):
        col = M - H + c
        if c == H:
            col = M + NH2 - H
        for g in range(len(groups)):
            c0, n, P = groups[g]
            wt = hbs[g][0]
            if P == TILE:
                nsc = ns[c % 2]
                nisa.tensor_copy(dst=nsc[0:TILE, 0:n, :], src=wt[0:TILE, 0:n, col:col + H])
                _state_rows(cand, c * dim * H, sr[c], nsc, n, H, rot)
            else:
                nisa.tensor_copy(dst=pst[0:P, H:2 * H], src=wt[0:P, 0, col:col + H])
                nisa.dma_copy(dst=cand.ap(pattern=[[H, P], [1, H]],
                                          offset=c * dim * H + (c0 - cb) * H),
                              src=pst[0:P, H:2 * H])
    # the new state: candidate `case` -> the slot (through SBUF: one run-time offset per DMA)
    fin = sr[H + 1]
    for blk in blocks:
        off, rows, width = blk
        nisa.dma_copy(dst=fin[0:rows, 0:width], src=_row_at(cand, off, rows, width, case))
        nisa.dma_copy(dst=_row_at(pool, cb * H + off, rows, width, slot),
                      src=fin[0:rows, 0:width])


def _state_in(pool, c0, slot, srows, wt, n, H, M, rot):
    """The slot's old state for n full channel tiles from channel c0 on into window
    columns M-H .. M.

    The pool row holds channel-major ``[dim, H]``: read channel-on-partition it is one
    H-element (6-byte) run per channel. Instead rows of 128 channels go on partitions
    (tile j' on partition j', a contiguous 128 * H run), and one TensorE transpose per
    state column h turns ``[tiles, 128 ch]`` into the window's ``[128 ch, tiles]``
    (values pass through float32 exactly)."""
    sr, s32, ns, pst = srows
    st = sr[H + 2]
    row = s32.shape[1]
    for j0 in range(0, n, TILE):
        nb = min(TILE, n - j0)
        nisa.dma_copy(dst=st[0:nb, 0:TILE * H],
                      src=_row_at(pool, (c0 + j0 * TILE) * H, nb, TILE * H, slot))
        nisa.tensor_copy(dst=s32[0:nb, 0:TILE * H], src=st[0:nb, 0:TILE * H])
        hpb = BANK // nb                      # state columns per PSUM bank
        for h0 in range(0, H, hpb):
            hn = min(hpb, H - h0)
            ps = _take(rot, 0)
            for h in range(h0, h0 + hn):
                nisa.nc_transpose(dst=ps[0:TILE, (h - h0) * nb:(h - h0 + 1) * nb],
                                  data=s32.ap(pattern=[[row, nb], [H, TILE]], offset=h))
            # window column M-H+h of tile j0 + j <- psum column (h - h0) * nb + j
            nisa.tensor_copy(dst=wt[0:TILE, j0:j0 + nb, M - H + h0:M - H + h0 + hn],
                             src=ps.ap(pattern=[[ps.shape[1], TILE], [1, nb], [nb, hn]],
                                       offset=0))


def _state_rows(dst, offset, sr, ns, n, H, rot):
    """A state of n full channel tiles (staged channel-on-partition in ``ns [128, tiles,
    H]``, float32) to the pool-row layout at element ``offset`` of HBM ``dst``: one
    TensorE transpose per column h to ``[tiles, 128 ch]``, interleaved by the PSUM
    eviction into ``sr [tiles, (ch, h)]`` (the pool dtype), one contiguous run per tile."""
    for j0 in range(0, n, TILE):
        nb = min(TILE, n - j0)
        hpb = BANK // TILE
        for h0 in range(0, H, hpb):
            hn = min(hpb, H - h0)
            ps = _take(rot, 0)
            for h in range(h0, h0 + hn):
                nisa.nc_transpose(dst=ps[0:nb, (h - h0) * TILE:(h - h0 + 1) * TILE],
                                  data=ns[0:TILE, j0:j0 + nb, h])
            # pool element (j, ch, h) <- psum [j, (h - h0) * 128 + ch]
            nisa.tensor_copy(dst=sr.ap(pattern=[[sr.shape[1], nb], [H, TILE], [1, hn]],
                                       offset=h0),
                             src=ps.ap(pattern=[[ps.shape[1], nb], [1, TILE], [TILE, hn]],
                                       offset=0))
        nisa.dma_copy(dst=dst.ap(pattern=[[TILE * H, nb], [1, TILE * H]],
                                 offset=offset + j0 * TILE * H),
                      src=sr[0:nb, 0:TILE * H])


def _head_outputs(hctx, g):
    """The first H outputs of the sequence for channel group g, from its head window.

    The taps run on VectorE in float32 (weights as per-channel columns broadcast over
    the H tokens: no group's diagonals need to stay resident), one TensorE transpose
    per 128 // H tiles turns ``[P ch, (tile j, token k)]`` into rows (j, k), ScalarE
    applies the activation, and one DMA writes row (j, k) -- channels j*128 .. + P of
    token k -- to y's 128-channel row ``row_k * NT + j`` (from column j // (128 // H)
    of the yr tile, the partial tile in the last column; one contiguous run per
    partition; k >= length -> a scratch row)."""
    (x, y, pool, tabs, seq_tabs, hbs, w_all, b_all, groups, W, act_op, rot, srows,
     cand, blocks, cb, yb) = hctx
    c0, n, P = groups[g]
    t0 = (c0 - cb) // TILE
    H = W - 1
    M = _margin(H)
    yr = tabs[1]
    tb = TILE // H
    col0 = 0
    if g > 0:
        col0 = (groups[0][1] + tb - 1) // tb      # the partial tile's column of yr
    wt, ws, tmh, acc, tmp, ot = hbs[g]
    nt = w_all.shape[1]
    for k in range(W):
        # weight[c, k] repeated over the H tokens by a zero stride in the access pattern
        # (no copy; a vector operand, never a matmul operand)
        wk = w_all.ap(pattern=[[nt * W, P], [W, n], [0, H]], offset=t0 * W + k)
        win = wt[0:P, 0:n, M - H + k:M + k]
        if k == 0:
            nisa.tensor_tensor(dst=acc[0:P, 0:n, :], data1=win, data2=wk, op=nl.multiply)
        else:
            nisa.tensor_tensor(dst=tmp[0:P, 0:n, :], data1=win, data2=wk, op=nl.multiply)
            nisa.tensor_tensor(dst=acc[0:P, 0:n, :], data1=acc[0:P, 0:n, :],
                               data2=tmp[0:P, 0:n, :], op=nl.add)
    if b_all != None:  # noqa: E711
        bk = b_all.ap(pattern=[[nt, P], [1, n], [0, H]], offset=t0)
        nisa.tensor_tensor(dst=acc[0:P, 0:n, :], data1=acc[0:P, 0:n, :], data2=bk, op=nl.add)
    row = acc.shape[1] * acc.shape[2]
    for j0 in range(0, n, tb):
        nb = min(tb, n - j0)
        b = col0 + j0 // tb
        ps = _take(rot, 0)
        nisa.nc_transpose(dst=ps[0:nb * H, 0:P],
                          data=acc.ap(pattern=[[row, P], [1, nb * H]], offset=j0 * H))
        ot = _take(rot, 1)
        nisa.activation(dst=ot[0:nb * H, 0:P], op=act_op, data=ps[0:nb * H, 0:P])
        nisa.dma_copy(dst=y.ap(pattern=[[TILE, nb * H], [1, P]], offset=yb,
                               vector_offset=yr[0:nb * H, b:b + 1], indirect_dim=0),
                      src=ot[0:nb * H, 0:P])


def _channel_columns(src, cb, dim, width, dst):
    """dst[p, t, :] = src[cb + t*128 + p, :] for the dim channels from cb on (per-channel
    columns of weight / bias, float32): DMA in the source dtype, VectorE converts when it
    is not float32."""
    nfull = dim // TILE
    stage = dst
    if src.dtype != dst.dtype:
        stage = nl.ndarray(dst.shape, dtype=src.dtype, buffer=nl.sbuf)
    if nfull > 0:
        nisa.dma_copy(dst=stage[:, 0:nfull, :],
                      src=src.ap(pattern=[[width, TILE], [TILE * width, nfull], [1, width]],
                                 offset=cb * width))
        if src.dtype != dst.dtype:
            nisa.tensor_copy(dst=dst[:, 0:nfull, :], src=stage[:, 0:nfull, :])
    if dim % TILE:
        nisa.dma_copy(dst=stage[0:dim % TILE, nfull, :],
                      src=src.ap(pattern=[[width, dim % TILE], [1, width]],
                                 offset=(cb + nfull * TILE) * width))
        if src.dtype != dst.dtype:
            nisa.tensor_copy(dst=dst[0:dim % TILE, nfull, :], src=stage[0:dim % TILE, nfull, :])


@nki.jit
def short_conv_prefill_kernel(x, weight, bias, pool, win_base, seq_rows, seq_yrows, seq_info,
                              zero_slots, counts, activation, has_bias, mm_fp32, x_stage, w_split,
                              b_split):
    """Causal depthwise conv1d over a ragged batch; the pool is updated in place.

    x ``[NB, dim]`` (token bucket NB); weight ``[dim, W]``; bias ``[dim]`` or None; pool
    ``[slots, dim * (W-1)]`` (row view of the ``[slots, dim, W-1]`` pool); win_base,
    seq_rows, seq_yrows, seq_info, zero_slots, counts: the batch tables of the module
    docstring (``nki_ssm.ops.launch.short_conv.prefill_tables``); activation "silu" or "none";
    has_bias: bias given; mm_fp32 / x_stage / w_split / b_split: matmul precision flags
    chosen by the launcher (fp32 operands; bf16 x cast up on chip; hi+lo split of fp32
    weights / bias). Returns y ``[(NB + M) * NT, 128]`` in x's dtype (NT = ceil(dim /
    128) rows per token; rows past the batch's tokens are scratch).
    """
    NB, dim = x.shape
    W = weight.shape[1]
    H = W - 1
    M = _margin(H)
    CH = _chunk_tokens(NB)
    F = M + CH
    NI = win_base.shape[1]
    NH2 = seq_rows.shape[1]
    FH = M + NH2
    mm_dtype = nl.float32 if mm_fp32 else nl.bfloat16
    act_op = nl.silu if activation == "silu" else nl.copy
    # LNC: this program's channels [cb, cb + Dp) (both halves, or all of them when they do
    # not split: split.program_channels); a second program without channels of its own runs
    # program 0's channels, the same loops, into its own y block and a private dump of the
    # pool (it writes nothing real)
    programs, pid = lnc_grid()
    Dp, parts = program_channels(dim, programs)
    cb = 0
    if parts > 1:
        cb = pid * Dp
    pool = destination(pool, pid < parts)
    ntp = (Dp + TILE - 1) // TILE
    nt = programs * ntp
    # y as rows of 128 channels ([token, program, channel tile] flattened: each program
    # writes its own block of ntp rows per token, starting at element yb of a token's y
    # row): the stream stores a chunk's token rows at a run-time row offset, the heads
    # scatter one (token, tile) row per partition
    yb = pid * ntp * TILE
    y = nl.ndarray(((NB + M) * nt, TILE), dtype=x.dtype, buffer=nl.shared_hbm)
    x_bytes = 4 if x.dtype == nl.float32 else 2
    tok_major = x.dtype == nl.float32
    gt = _group_tiles(W, 4 if mm_fp32 else 2, 2 if w_split else 1, x_bytes, x_stage,
                      tok_major, F, Dp)
    groups = _channel_groups(Dp, gt, cb)
    GW = gt * TILE
    # every vec_every-th channel tile of a chunk runs on VectorE (+ a TensorE transpose)
    # when TensorE would bind alone: per 128 x 128 block TensorE needs W (x parts) matmuls
    # of 128 cycles (x4 for float32), VectorE ~1000-1200 cycles at 0.4 of its clock.
    # bfloat16 unsplit: none (TensorE 80 % busy at 16K with the DMA queues at 86 %; a
    # VectorE tile every 7 made the 16K / 8 x 2K / 2K cases 4 / 4 / 12 % slower)
    vec_every = 0
    if mm_fp32:
        vec_every = 2
    elif w_split:
        vec_every = 4

    ident = identity(mm_dtype, TILE)
    ones = nl.ndarray((1, TILE), dtype=mm_dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)

    # every SBUF buffer the runtime loops use is allocated here, once (PSUM: _new_banks)
    accs = []
    for i in range(2):
        accs.append(nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.sbuf))
    rot = _rotation([], accs)
    wins = []
    outs = []
    for a in range(2):
        xw = nl.ndarray((TILE, gt, F), dtype=mm_dtype, buffer=nl.sbuf)
        xs = None
        tm = None
        if tok_major:
            tm = nl.ndarray((TILE, NI, GW), dtype=x.dtype, buffer=nl.sbuf)
        if x_stage:
            xs = nl.ndarray((TILE, gt, F), dtype=x.dtype, buffer=nl.sbuf)
        wins.append((xw, xs, tm))
        outs.append(nl.ndarray((TILE, CH // TILE, GW), dtype=x.dtype, buffer=nl.sbuf))
    base = nl.ndarray((TILE, NI), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=base, src=win_base)
    run = nl.ndarray((TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
    st = nl.ndarray((TILE, 2), dtype=nl.float32, buffer=nl.sbuf)
    # the first row of each slot's chunk store, y rows (t0 * NT): (1, 1) tiles on partition 0
    sti = (nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf),
           nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf))
    idx2 = nl.ndarray((TILE, 2, NI), dtype=nl.uint32, buffer=nl.sbuf)
    bufs = (run, st, sti, base, idx2, wins, outs, nt, yb - cb)
    # the loop counts (iterations of PAIRS_PER_ITERATION chunk pairs, then of one pair,
    # before a group's last pair; live sequences; live sequences without initial state):
    # device scalars of the one counts row both programs read
    n_main, n_tail, live, n_zero = trip_counts(counts)

    # 0. zero loop: the slots of live sequences without initial state get zeros (this
    # program's channels), so every head reads its old state from its slot (DMAs only:
    # they run under the stream loops)
    blocks = _pool_blocks(Dp, H)
    zero = nl.ndarray((TILE, TILE * H), dtype=pool.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)

    def zero_body(i, cells):
        _zero_slot(pool, blocks, cb * H, zero, cells[0])

    for_each_row(n_zero, zero_slots, zero_body)

    # 1. stream loops, one per channel group, each followed by its last pair (straight-line
    # code: it also loads the next group's first windows and builds its diagonals)
    # weight tiles of two groups (the current one and the next), alternating
    wtiles = []
    for i in range(2):
        wtiles.append(_weight_tiles(groups[0], W, mm_dtype, has_bias, w_split, b_split,
                                    weight.dtype, bias.dtype if has_bias else nl.float32))
    _weight_loads(weight, bias, wtiles[0], groups[0], W)
    builds = []
    for g in range(len(groups)):
        builds.append((wtiles[g % 2], ident, groups[g], W, mm_dtype))
    weights = _weight_build(wtiles[0], ident, groups[0], W, mm_dtype)
    for g in range(len(groups)):
        nisa.memset(dst=run, value=0.0)
        next_build = None
        if g + 1 < len(groups):
            next_build = builds[g + 1]
            # the next group's weight DMAs run on under this group's loop
            _weight_loads(weight, bias, wtiles[(g + 1) % 2], groups[g + 1], W)
        group = groups[g]
        group_weights = weights

        def stream_body(k):
            _stream_pairs(x, y, bufs, group_weights, ones, group, W, act_op, vec_every, rot,
                          PAIRS_PER_ITERATION, None)

        work_loop(n_main, stream_body)

        def tail_body(k):
            _stream_pairs(x, y, bufs, group_weights, ones, group, W, act_op, vec_every, rot, 1,
                          None)

        work_loop(n_tail, tail_body)
        _stream_pairs(x, y, bufs, weights, ones, group, W, act_op, vec_every, rot, 1,
                      next_build)
        if g + 1 < len(groups):
            w32, diags, bias_t, raws = wtiles[(g + 1) % 2]
            bparts = ()
            bcols = None
            if bias_t != None:  # noqa: E711
                bparts = bias_t[1]
                bcols = bias_t[2]
            weights = (diags, bparts, w32, bcols)

    # 2. head loop over live sequences (every group per iteration); a head rewrites rows
    # the stream loops wrote. Float32 weight / bias columns of every channel tile for the
    # head taps (loaded here: the DMA queues serve the stream's first windows first)
    w_all = nl.ndarray((TILE, ntp, W), dtype=nl.float32, buffer=nl.sbuf)
    _channel_columns(weight, cb, Dp, W, w_all)
    b_all = None
    if has_bias:
        b_all = nl.ndarray((TILE, ntp, 1), dtype=nl.float32, buffer=nl.sbuf)
        _channel_columns(bias, cb, Dp, 1, b_all)
    tabs = (nl.ndarray((NH2, 1), dtype=nl.uint32, buffer=nl.sbuf),
            nl.ndarray((TILE, seq_yrows.shape[1]), dtype=nl.int32, buffer=nl.sbuf))
    # head groups: every full 128-channel tile at once, then the partial tile
    hgroups = []
    if Dp // TILE > 0:
        hgroups.append((cb, Dp // TILE, TILE))
    if Dp % TILE:
        hgroups.append((cb + Dp // TILE * TILE, 1, Dp % TILE))
    seq_tabs = (seq_rows, seq_yrows, seq_info)
    tmh = None
    if tok_major:
        tmh = nl.ndarray((TILE, 1, GW), dtype=x.dtype, buffer=nl.sbuf)
    hbs = []
    for g in range(len(hgroups)):
        hn = hgroups[g][1]
        ws = None
        if x_stage:
            ws = nl.ndarray((TILE, hn, FH), dtype=x.dtype, buffer=nl.sbuf)
        hbs.append((nl.ndarray((TILE, hn, FH), dtype=mm_dtype, buffer=nl.sbuf), ws, tmh,
                    nl.ndarray((TILE, hn, H), dtype=nl.float32, buffer=nl.sbuf),
                    nl.ndarray((TILE, hn, H), dtype=nl.float32, buffer=nl.sbuf), None))
    hots = []
    for i in range(2):
        hots.append(nl.ndarray((TILE, TILE), dtype=x.dtype, buffer=nl.sbuf))
    hrot = _rotation(hots, accs)
    # pool-dtype rows of 128 channels: one per candidate new state, the chosen one, the old
    # state; float32 staging of the old state and of two candidates; the partial tile's
    # old state and candidate
    nfull_t = max(1, Dp // TILE)
    rows_t = min(TILE, nfull_t)
    sr = []
    for i in range(H + 3):
        sr.append(nl.ndarray((rows_t, TILE * H), dtype=pool.dtype, buffer=nl.sbuf))
    srows = (sr, nl.ndarray((rows_t, TILE * H), dtype=nl.float32, buffer=nl.sbuf),
             (nl.ndarray((TILE, nfull_t, H), dtype=nl.float32, buffer=nl.sbuf),
              nl.ndarray((TILE, nfull_t, H), dtype=nl.float32, buffer=nl.sbuf)),
             nl.ndarray((TILE, 2 * H), dtype=pool.dtype, buffer=nl.sbuf))
    # candidate new states of this program's channels, one pool-row part each (kernel
    # scratch, private to the program)
    cand = nl.ndarray((H + 1, Dp * H), dtype=pool.dtype, buffer=nl.private_hbm)
    hctx = (x, y, pool, tabs, seq_tabs, hbs, w_all, b_all, hgroups, W, act_op, hrot, srows,
            cand, blocks, cb, yb)

    def head_body(s):
        _head_sequence(hctx, s)

    work_loop(live, head_body)
    return y
