"""Ragged prefill of the short causal conv1d with a state pool (one launch per batch).

Engine plan (per channel group of up to 16 x 128 channels -- fewer when the
float32 / split working set needs it -- per sequence, per chunk of up to 512
tokens):

1. DMA: one ``dma_transpose`` (4-D access patterns, destination 32-byte
   aligned) brings ``x[t0-16 : t0+tc, group]`` in as ``xw [128 ch, n_tiles,
   16+tc]`` (channels on partitions, tokens on the free axis; the window's
   W-1 halo columns end at column 16). The first chunk of a sequence
   instead gets its W-1 halo columns by one indirect gather from the pool (``vector_offset`` row =
   ``slot*dim + partition``, plus the group's first channel as a constant)
   into a zeroed tile; rows of sequences without an initial state are out of
   bounds and skipped (``oob_mode.skip``), so the halo stays zero.
2. TensorE: per 128-token block and 128-channel tile, W accumulating
   matmuls ``psum[tok, ch] += xw[:, k:k+M].T @ diag(weight[:, k])``: the
   shifted x window is the stationary, a diagonal weight matrix the moving
   operand, so the conv taps and the token-major transpose of the output
   happen in one pass; a bias is one more K=1 matmul (ones x bias row).
   bfloat16 x with float32 weights that bfloat16 does not hold uses a hi+lo
   bfloat16 split (two matmuls per tap) so no weight precision is lost.
   VectorE takes every 7th tile (every 2nd for float32, 4th for split): W
   float32 multiply-adds with per-partition weights, then one TensorE
   transpose into the same PSUM bank -- it balances TensorE and VectorE.
3. ScalarE: one ``activation`` (SiLU or copy) per PSUM bank evicts
   ``psum [128 tok, 512 ch]`` into the token-major output tile.
4. DMA: contiguous store of ``[128 tok, group channels]`` rows of y; the
   sequence's new state (last W-1 window columns) is scattered back to its
   slot rows with ``vector_offset`` after its last chunk.
A one-item-ahead software pipeline issues item i+1's window (and, at a
group change, its diagonal weights) before item i's matmuls.

Compile time vs run time: shapes, W, dtypes, the activation, and the batch
layout (token ranges of the sequences and which sequences are padding) are
compile-time, so the kernel is specialised per batch layout (they are part of
the NKI cache key). Slot numbers and has_initial_state are run-time data (the
gather/scatter row tables). A run-time-boundary version would read
``cu_seqlens`` into registers and loop with ``nl.fori_loop`` over sequences
and chunks with ``scalar_offset`` DMAs and masked partial blocks.

Limits: dim any size (tiles of 128 channels, the last may be partial), W >=
2 (W - 1 <= 512), any number of tokens per sequence (chunked), pool and x
float32 or bfloat16. Matmul operands are float32 when x or the pool is
float32 (quarter TensorE rate; pool values must pass through exactly), else
bfloat16.
"""
from nki_ssm.backend import nki, nl, nisa

TILE = 128          # channels per partition tile / tokens per output block
GROUP_TILES = 16    # most channel tiles per group: 2048 channels -> 4 KiB bf16 store rows
SBUF_BUDGET = 150 * 1024   # bytes per partition for the per-group working set
CHUNK = 512         # tokens per transposed load (n_tiles * 512 * 2 B = 16 KiB per partition)
BANK = 512          # fp32 columns of one PSUM bank
ONE_ROW_PER_DMA = False   # pool halo gather / state scatter: one DMA per tile (see _pool_rows_dma)
ALIGN = 16          # window offsets in elements: 32 B (bf16) / 64 B (fp32), the DMA
                    # transpose destination alignment (nki_ssm/sim/isa/dma.py)


def _margin(H):
    """Columns before token t0 in a window tile: the W-1 halo ends where the transposed
    tokens start, on an ALIGN boundary; window column c sits at index c + _margin(H) - H."""
    return (H + ALIGN - 1) // ALIGN * ALIGN


def _group_tiles(W, mm_bytes, n_parts, x_bytes, stage):
    """Channel tiles per group (16, 8, ... 1) so that the live working set fits
    SBUF_BUDGET: two groups' diagonal weights, three x windows (current, prefetched,
    staging) and three output tiles, per 128-channel tile."""
    per_tile = (2 * n_parts * W * TILE * mm_bytes
                + 3 * (_margin(W - 1) + CHUNK) * mm_bytes
                + (2 * (_margin(W - 1) + CHUNK) * x_bytes if stage else 0)
                + 3 * TILE * x_bytes)
    g = GROUP_TILES
    while g > 1 and g * per_tile > SBUF_BUDGET:
        g = g // 2
    return g


def _channel_groups(dim, gt):
    """[(c0, n_tiles, P)]: full 128-channel tiles in groups of gt, then the partial tile."""
    groups = []
    n_full = dim // TILE
    g0 = 0
    while g0 < n_full:
        n = min(gt, n_full - g0)
        groups.append((g0 * TILE, n, TILE))
        g0 += n
    if dim % TILE:
        groups.append((n_full * TILE, 1, dim % TILE))
    return groups


def _identity(dtype):
    """[128, 128] identity built on GpSimd (ones where partition == column)."""
    ones = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    ident = nl.ndarray((TILE, TILE), dtype=dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, pattern=[[-1, TILE]], channel_multiplier=1,
                       on_true_tile=ones, on_false_value=0.0, cmp_op=nl.equal)
    return ident


def _split_parts(src_f32, shape, mm_dtype, split):
    """Matmul-dtype copies of float32 values: (v,) or (hi, lo) with v = hi + lo to ~2^-17."""
    hi = nl.ndarray(shape, dtype=mm_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=hi, src=src_f32)
    if not split:
        return (hi,)
    rest = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=rest, data1=src_f32, data2=hi, op=nl.subtract)
    lo = nl.ndarray(shape, dtype=mm_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=lo, src=rest)
    return (hi, lo)


def _diag_weights(weight, ident, c0, n, P, W, mm_dtype, split):
    """Per part: [128, n, W, 128] tiles with diag(weight[c0 + j*128 + p, k]) at [:, j, k, :].

    One part: the weights rounded to the matmul dtype. Two parts (split):
    hi = bf16(w) and lo = bf16(w - hi), so hi + lo carries w to ~2^-17.
    """
    w32 = nl.ndarray((TILE, n, W), dtype=nl.float32, buffer=nl.sbuf)
    # channel c0 + j*128 + p -> partition p, free (j, k)
    nisa.dma_copy(dst=w32[0:P, :, :],
                  src=weight.ap(pattern=[[W, P], [TILE * W, n], [1, W]], offset=c0 * W))
    wparts = (w32,)
    if split:
        hi = nl.ndarray((TILE, n, W), dtype=mm_dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=hi[0:P, :, :], src=w32[0:P, :, :])
        lo32 = nl.ndarray((TILE, n, W), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=lo32[0:P, :, :], data1=w32[0:P, :, :], data2=hi[0:P, :, :],
                           op=nl.subtract)
        wparts = (w32, lo32)
    parts = []
    for q in range(len(wparts)):
        d = nl.ndarray((TILE, n, W, TILE), dtype=mm_dtype, buffer=nl.sbuf)
        src = wparts[q]
        for j in range(n):
            for k in range(W):
                # diag(w) = identity scaled per partition; the write rounds to mm_dtype
                nisa.tensor_scalar(dst=d[0:P, j, k, 0:P], data=ident[0:P, 0:P],
                                   op0=nl.multiply, operand0=src[0:P, j, k:k + 1])
        parts.append(d)
    return (parts, w32)


def _bias_parts(bias, c0, width, mm_dtype, split):
    """Per part: a [1, width] bias row in the matmul dtype."""
    b32 = nl.ndarray((1, width), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=b32, src=bias.ap(pattern=[[width, 1], [1, width]], offset=c0))
    return _split_parts(b32, (1, width), mm_dtype, split)


def _work_items(groups, segments, live):
    """[(group, seq, chunk)] in execution order: groups outer, live sequences, chunks."""
    items = []
    for g in range(len(groups)):
        for s in range(len(segments)):
            if live[s]:
                L = segments[s][1] - segments[s][0]
                for ci in range(max(1, (L + CHUNK - 1) // CHUNK)):
                    items.append((g, s, ci))
    return items


def _load_window(x, pool_rows, gather_rows, scatter_rows, groups, segments, item, H,
                 mm_dtype, stage):
    """Stage 1 of an item: its x window ``[128 ch, n, W-1 + tc]`` (+ halo / slot rows).

    Returns (xw, tc, s_idx): s_idx (scatter rows) only on a sequence's last chunk.
    """
    num_tokens, dim = x.shape
    g, s, ci = item
    c0, n, P = groups[g]
    start, end = segments[s]
    n_chunks = max(1, (end - start + CHUNK - 1) // CHUNK)
    t0 = start + ci * CHUNK
    tc = min(CHUNK, end - t0)
    M = _margin(H)
    RB = M + CHUNK      # a multiple of ALIGN: every tile's row starts aligned
    xw = nl.ndarray((TILE, n, RB), dtype=mm_dtype, buffer=nl.sbuf)
    xs = xw
    if stage:
        xs = nl.ndarray((TILE, n, RB), dtype=x.dtype, buffer=nl.sbuf)
    if ci == 0:
        # halo from the pool: zeros, overwritten where the run-time gather row is valid
        g_idx = nl.ndarray((TILE, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=g_idx[0:P, :],
                      src=gather_rows.ap(pattern=[[1, P], [1, 1]], offset=s * TILE))
        nisa.memset(dst=xw[0:P, :, M - H:M], value=0.0)
        _pool_rows_dma(pool_rows, xw, g_idx, c0, n, P, H, M - H, gather=True)
        lo, first = M, t0
    else:
        # later chunks re-read the M >= W-1 tokens before t0 (same sequence, as M <= CHUNK)
        # so the transposed block starts at column 0, aligned
        lo, first = 0, t0 - M
    width = M + tc - lo
    if tc > 0:
        # 4-D form [width, n, 1, P] -> [P, n, 1, width] (permutation (3, 1, 2, 0)): the NKI
        # front end asserts 4-D dma_transpose operands (see nki_ssm/sim/isa/dma.py)
        nisa.dma_transpose(dst=xs.ap(pattern=[[n * RB, P], [RB, n], [1, 1], [1, width]],
                                     offset=lo),
                           src=x.ap(pattern=[[dim, width], [TILE, n], [1, 1], [1, P]],
                                    offset=first * dim + c0))
        if stage:
            nisa.tensor_copy(dst=xw[0:P, :, lo:lo + width], src=xs[0:P, :, lo:lo + width])
    s_idx = None
    if ci == n_chunks - 1:
        s_idx = nl.ndarray((TILE, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s_idx[0:P, :],
                      src=scatter_rows.ap(pattern=[[1, P], [1, 1]], offset=s * TILE))
    return (xw, tc, s_idx)


def _pool_rows_dma(pool_rows, xw, idx, c0, n, P, H, col, gather):
    """Halo gather (pool -> xw[:, j, col:col+H]) or state scatter (back) of one group.

    Partition p of tile j is pool row ``idx[p] + c0 + j*128`` (idx = slot*dim + p, run
    time). Default: ONE indirect DMA for the n tiles, its per-partition pattern stepping
    128 rows of the [slots*dim, W-1] base tensor per tile. The APS guide defines
    vector_offset by a general formula (static pattern + index * base row size), which
    covers this, but every documented example keeps a partition inside one base row.
    ONE_ROW_PER_DMA = True uses that documented form instead (one DMA per tile), at a
    modeled cost of 1653 -> 1743 us (16K tokens) and 1696 -> 2428 us (8 x 2K) on trn2:
    flip it if the compiler or the DMA rejects the multi-row pattern on hardware.
    Gather rows past the pool (no initial state) are skipped: the halo stays zero.
    """
    if not ONE_ROW_PER_DMA:
        view = pool_rows.ap(pattern=[[H, P], [TILE * H, n], [1, H]], offset=c0 * H,
                            vector_offset=idx[0:P, 0:1], indirect_dim=0)
        if gather:
            nisa.dma_copy(dst=xw[0:P, :, col:col + H], src=view, oob_mode=nisa.oob_mode.skip)
        else:
            nisa.dma_copy(dst=view, src=xw[0:P, :, col:col + H])
        return
    for j in range(n):
        view = pool_rows.ap(pattern=[[H, P], [1, H]], offset=(c0 + j * TILE) * H,
                            vector_offset=idx[0:P, 0:1], indirect_dim=0)
        if gather:
            nisa.dma_copy(dst=xw[0:P, j, col:col + H], src=view, oob_mode=nisa.oob_mode.skip)
        else:
            nisa.dma_copy(dst=view, src=xw[0:P, j, col:col + H])


def _vector_tile(ps, col, xw, w32, bcols, jj, pj, b, m, W):
    """One 128-channel tile of a token block on VectorE (channel-major, float32), then a
    TensorE transpose into its token-major PSUM columns: takes work off TensorE."""
    acc = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.sbuf)
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


def _conv_blocks(y, xw, weights, ones, t0, tc, c0, n, P, W, act_op, vec_every):
    """Stage 2 of an item: per 128-token block, TensorE taps (every vec_every-th channel
    tile on VectorE instead), ScalarE eviction, row stores."""
    dparts, bparts, w32, bcols = weights
    gw = (n - 1) * TILE + P
    base = _margin(W - 1) - (W - 1)     # window column 0 (token t0 - (W-1)) in xw
    for b in range(0, tc, TILE):
        m = min(TILE, tc - b)
        ot = nl.ndarray((TILE, n * TILE), dtype=y.dtype, buffer=nl.sbuf)
        for bank0 in range(0, gw, BANK):
            bw = min(BANK, gw - bank0)
            ps = nl.ndarray((TILE, BANK), dtype=nl.float32, buffer=nl.psum)
            for jj in range(bank0 // TILE, (bank0 + bw + TILE - 1) // TILE):
                pj = min(TILE, gw - jj * TILE)
                col = jj * TILE - bank0
                if vec_every > 0 and jj % vec_every == vec_every - 1:
                    _vector_tile(ps, col, xw, w32, bcols, jj, pj, base + b, m, W)
                    continue
                for q in range(len(bparts)):
                    # bias row of this tile: ones[tok] x bias[ch] (K = 1)
                    nisa.nc_matmul(dst=ps[0:m, col:col + pj], stationary=ones[0:1, 0:m],
                                   moving=bparts[q][0:1, jj * TILE:jj * TILE + pj],
                                   accumulate=(q > 0))
                for q in range(len(dparts)):
                    for k in range(W):
                        first_mm = len(bparts) == 0 and q == 0 and k == 0
                        # psum[tok, ch] (+)= x[tok + k - (W-1), ch] * weight[ch, k]
                        nisa.nc_matmul(dst=ps[0:m, col:col + pj],
                                       stationary=xw[0:pj, jj, base + b + k:base + b + k + m],
                                       moving=dparts[q][0:pj, jj, k, 0:pj],
                                       accumulate=not first_mm)
            nisa.activation(dst=ot[0:m, bank0:bank0 + bw], op=act_op, data=ps[0:m, 0:bw])
        nisa.dma_copy(dst=y[t0 + b:t0 + b + m, c0:c0 + gw], src=ot[0:m, 0:gw])


@nki.jit
def short_conv_prefill_kernel(x, weight, bias, pool_rows, gather_rows, scatter_rows,
                              segments, live, activation, has_bias, mm_fp32, x_stage,
                              w_split, b_split):
    """Causal depthwise conv1d over a ragged batch; the pool is updated in place.

    x ``[num_tokens, dim]``; weight ``[dim, W]``; bias ``[dim]`` or None;
    pool_rows ``[slots * dim, W-1]`` (the conv state pool viewed one channel
    per row); gather_rows / scatter_rows int32 ``[num_seqs, 128]`` = ``slot *
    dim + p`` for partition p (gather: ``slots * dim``, out of bounds, when
    the sequence starts from zeros); segments: tuple of (start, end) token ranges; live:
    tuple of bools (False = padding: zero output, pool untouched);
    activation "silu" or "none"; has_bias: bias given; mm_fp32 / x_stage /
    w_split / b_split: matmul precision flags chosen by the launcher (fp32
    operands; bf16 x cast up on chip; hi+lo split of fp32 weights / bias).
    Returns y ``[num_tokens, dim]`` in x's dtype.

    Software pipeline: the window of work item i+1 (and, at a group change,
    that group's diagonal weights) is issued before item i's matmuls, so its
    DMA overlaps item i's TensorE work.
    """
    num_tokens, dim = x.shape
    W = weight.shape[1]
    H = W - 1
    mm_dtype = nl.float32 if mm_fp32 else nl.bfloat16
    act_op = nl.silu if activation == "silu" else nl.copy
    y = nl.ndarray((num_tokens, dim), dtype=x.dtype, buffer=nl.shared_hbm)
    x_bytes = 4 if x.dtype == nl.float32 else 2
    gt = _group_tiles(W, 4 if mm_fp32 else 2, 2 if w_split else 1, x_bytes, x_stage)
    groups = _channel_groups(dim, gt)
    # every vec_every-th channel tile of a group runs on VectorE (+ a TensorE transpose)
    # so TensorE and VectorE finish together: per 128 x 128 block TensorE needs W (x parts)
    # matmuls of 128 cycles (x4 for float32), VectorE ~1000-1200 cycles at 0.4 of its clock
    vec_every = 7
    if mm_fp32:
        vec_every = 2
    elif w_split:
        vec_every = 4

    ident = _identity(mm_dtype)
    ones = nl.ndarray((1, TILE), dtype=mm_dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)

    # padding sequences: zero rows, pool untouched
    zeros = nl.ndarray((TILE, gt * TILE), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0)
    for s in range(len(segments)):
        if not live[s]:
            for entry in groups:
                c0, n, P = entry
                gw = (n - 1) * TILE + P
                for b0 in range(segments[s][0], segments[s][1], TILE):
                    m = min(TILE, segments[s][1] - b0)
                    nisa.dma_copy(dst=y[b0:b0 + m, c0:c0 + gw], src=zeros[0:m, 0:gw])

    items = _work_items(groups, segments, live)
    weights = []        # per group: (diag parts, bias parts), built one item ahead
    for g in range(len(groups)):
        weights.append(None)

    nxt = None
    if len(items) > 0:
        # first window before the first weights: the DMA starts while VectorE builds diagonals
        nxt = _load_window(x, pool_rows, gather_rows, scatter_rows, groups, segments,
                           items[0], H, mm_dtype, x_stage)
        g0 = items[0][0]
        weights[g0] = _group_weights(weight, bias, ident, groups[g0], W, mm_dtype, has_bias,
                                     w_split, b_split)
    for i in range(len(items)):
        cur = nxt
        if i + 1 < len(items):
            g1 = items[i + 1][0]
            if weights[g1] == None:  # noqa: E711  (NKI has no `is`)
                weights[g1] = _group_weights(weight, bias, ident, groups[g1], W, mm_dtype,
                                             has_bias, w_split, b_split)
            nxt = _load_window(x, pool_rows, gather_rows, scatter_rows, groups, segments,
                               items[i + 1], H, mm_dtype, x_stage)
        g, s, ci = items[i]
        c0, n, P = groups[g]
        xw, tc, s_idx = cur
        _conv_blocks(y, xw, weights[g], ones, segments[s][0] + ci * CHUNK, tc, c0, n, P,
                     W, act_op, vec_every)
        if i + 1 == len(items) or items[i + 1][0] != g:
            weights[g] = None     # last item of the group: its diagonals die here
        if s_idx != None:  # noqa: E711
            # new state = last W-1 window columns (the old state's tail when L < W-1)
            _pool_rows_dma(pool_rows, xw, s_idx, c0, n, P, H, _margin(H) - H + tc,
                           gather=False)
    return y


def _group_weights(weight, bias, ident, group, W, mm_dtype, has_bias, w_split, b_split):
    """(diag weight parts, bias row parts, float32 weight columns [128, n, W], float32
    bias columns [128, n] or None) of one channel group."""
    c0, n, P = group
    gw = (n - 1) * TILE + P
    dparts, w32 = _diag_weights(weight, ident, c0, n, P, W, mm_dtype, w_split)
    bparts = ()
    bcols = None
    if has_bias:
        bparts = _bias_parts(bias, c0, gw, mm_dtype, b_split)
        bcols = nl.ndarray((TILE, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bcols[0:P, :], src=bias.ap(pattern=[[1, P], [TILE, n]], offset=c0))
    return (dparts, bparts, w32, bcols)
