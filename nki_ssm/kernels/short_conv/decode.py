"""Decode / multi-token update of the short causal conv1d (one launch per batch).

Layout: "rows" on partitions. Each sequence's channels are split into R
blocks of D = dim / R channels and row v = n * R + r (sequence n, block r)
gets one partition, so a small batch still fills the 128 lanes (the launcher
picks R: the largest power of two with num_seqs * R <= 128 dividing dim). A
group is up to 128 rows (128 // R whole sequences). Channels of a block run
along the free axis, so every HBM stream is a contiguous run per partition:
the pool is viewed as ``[slots * R, D * (W-1)]`` and one ``vector_offset``
DMA per group gathers (later scatters) ``chunk * (W-1)`` contiguous state
elements per row; x ``[num_seqs, T, dim]`` and y load/store through 4-D
access patterns ``[seqs, R, T, chunk]``.

Engine plan per channel chunk (up to 2048 channels of a block) and group:
the window (state ++ x) is read per tap through views, never copied; GpSimd
multiplies each tap by the weight row, VectorE accumulates the taps (and the
bias) in float32, ScalarE applies SiLU/copy scaled by the run-time ``valid``
column (padding rows give act(0) = 0) and assembles the shifted new state,
and DMA scatters it back (padding rows are out of bounds and skipped). The
weights of a chunk are loaded once (block r on partition r) and spread over
the rows by a TensorE matmul with a 0/1 block selector (row v gets block
v % R), evicted by ScalarE: no 128x broadcast DMA. Gathers run PD chunks
ahead of the scatters (software pipeline; all of them up front for small
batches). Decode needs no TensorE arithmetic: the work per byte is W
multiply-adds.

Run-time: slots and the valid mask (row tables); compile-time: shapes,
dtypes, W, T, R, activation, bias presence. Padding sequences must carry
finite x (their outputs are act(0 * acc)).
"""
from nki_ssm.backend import nki, nl, nisa

PMAX = 128
LOAD_BUDGET = 96 * 1024     # bytes per partition for in-flight chunk loads (state + x)
OTHER_BUDGET = 64 * 1024    # weights (2 chunks), bias, accumulators, output and new state


def _nbytes(dtype):
    return 4 if dtype == nl.float32 else 2


def _chunk_channels(n_groups, T, H, W, x_bytes, pool_bytes, w_bytes, D):
    """Channels per chunk: a power of two in [128, 2048], <= D, such that two chunks of
    loads fit LOAD_BUDGET and the per-chunk working set fits OTHER_BUDGET; D splits into
    ~4+ chunks when it allows, so loads, arithmetic and stores overlap."""
    load = 2 * n_groups * (H * pool_bytes + T * x_bytes)
    other = 2 * W * w_bytes + 2 * 4 + 4 + 4 + T * x_bytes + H * pool_bytes
    cd = 2048
    while cd > 128 and (cd * load > LOAD_BUDGET or cd * other > OTHER_BUDGET):
        cd = cd // 2
    while cd > 256 and cd * 4 > D:
        cd = cd // 2
    return min(cd, D)


def _window(st, xs, P, cd, H, i):
    """Window column i of (state ++ x) as a [P, cd] view (no copy)."""
    if i < H:
        return st[0:P, 0:cd, i]
    return xs[0:P, i - H, 0:cd]


def _load_group(x, pool_flat, rows_sb, group, c0, cd, R, D, H, CD):
    """Gather the state rows and load x of one group, channels [c0, c0 + cd) of each block."""
    N, T, dim = x.shape
    n0, Pn = group
    P = R * Pn
    st = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
    nisa.memset(dst=st[0:P, 0:cd, :], value=0.0)
    nisa.dma_copy(dst=st[0:P, 0:cd, :],
                  src=pool_flat.ap(pattern=[[D * H, P], [H, cd], [1, H]], offset=c0 * H,
                                   vector_offset=rows_sb[0:P, :], indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    xs = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
    # row n*R + r reads x[n, :, r*D + c0 : r*D + c0 + cd]
    nisa.dma_copy(dst=xs[0:P, :, 0:cd],
                  src=x.ap(pattern=[[T * dim, Pn], [D, R], [dim, T], [1, cd]],
                           offset=n0 * T * dim + c0))
    return (st, xs)


def _load_chunk(x, pool_flat, g_rows, groups, chunk, R, D, H, CD):
    """[(state, x)] of every group for one chunk."""
    c0, cd = chunk
    out = []
    for gi in range(len(groups)):
        out.append(_load_group(x, pool_flat, g_rows[gi], groups[gi], c0, cd, R, D, H, CD))
    return out


def _selector(R, PB, dtype):
    """0/1 [R, PB]: sel[r, v] = 1 where v % R == r (row v holds channel block v % R)."""
    ones = nl.ndarray((R, PMAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones[:, 0:PB], value=1.0)
    sel = nl.ndarray((R, PMAX), dtype=dtype, buffer=nl.sbuf)
    # free index v = i*R + j as a [PB/R, R] pattern: keep where j - r == 0
    nisa.affine_select(dst=sel[:, 0:PB], pattern=[[0, PB // R], [1, R]], channel_multiplier=-1,
                       on_true_tile=ones[:, 0:PB], on_false_value=0.0, cmp_op=nl.equal,
                       offset=0)
    return sel


def _spread(dst, src_blk, sel, PB, ncols):
    """dst[v, :] = src_blk[v % R, :] for ncols columns: 0/1 matmuls, 512 columns per
    PSUM bank, evicted by ScalarE (exact: one nonzero product per element)."""
    R = src_blk.shape[0]
    for f0 in range(0, ncols, 512):
        fw = min(512, ncols - f0)
        ps = nl.ndarray((PMAX, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps[0:PB, 0:fw], stationary=sel[0:R, 0:PB],
                       moving=src_blk[0:R, f0:f0 + fw], accumulate=False)
        nisa.tensor_copy(dst=dst[0:PB, f0:f0 + fw], src=ps[0:PB, 0:fw], engine=nisa.engine.scalar)


def _load_weights(weight, bias, sel_w, sel_b, PB, chunk, R, D, W, CD, has_bias):
    """(weights [rows, cd * W], bias [rows, cd] or None) of one chunk, on PB rows."""
    c0, cd = chunk
    wdt = nl.float32 if weight.dtype == nl.float32 else nl.bfloat16
    wblk = nl.ndarray((R, CD * W), dtype=wdt, buffer=nl.sbuf)
    # block r's weights on partition r (contiguous rows of weight)
    nisa.dma_copy(dst=wblk[:, 0:cd * W],
                  src=weight.ap(pattern=[[D * W, R], [1, cd * W]], offset=c0 * W))
    wb = nl.ndarray((PMAX, CD * W), dtype=wdt, buffer=nl.sbuf)
    _spread(wb, wblk, sel_w, PB, cd * W)
    bb = None
    if has_bias:
        bdt = nl.float32 if bias.dtype == nl.float32 else nl.bfloat16
        bblk = nl.ndarray((R, CD), dtype=bdt, buffer=nl.sbuf)
        nisa.dma_copy(dst=bblk[:, 0:cd], src=bias.ap(pattern=[[D, R], [1, cd]], offset=c0))
        bb = nl.ndarray((PMAX, CD), dtype=bdt, buffer=nl.sbuf)
        _spread(bb, bblk, sel_b, PB, cd)
    return (wb, bb)


@nki.jit
def short_conv_decode_kernel(x, weight, bias, pool_flat, rows, valid, activation, has_bias, R):
    """x ``[num_seqs, T, dim]``; weight ``[dim, W]``; bias ``[dim]`` or None;
    pool_flat ``[slots * R, (dim / R) * (W-1)]`` (the pool, updated in place);
    rows int32 ``[num_seqs * R]`` (``slot * R + r``, or ``slots * R`` = out of
    bounds for padding); valid float32 ``[num_seqs * R]`` (1 live, 0
    padding); activation "silu" or "none"; R channel blocks per sequence.
    Returns y ``[num_seqs, T, dim]`` in x's dtype.
    """
    N, T, dim = x.shape
    W = weight.shape[1]
    H = W - 1
    D = dim // R
    Ng = PMAX // R                 # sequences per group
    PB = min(Ng, N) * R            # rows of the largest group
    act_op = nl.silu if activation == "silu" else nl.copy
    y = nl.ndarray((N, T, dim), dtype=x.dtype, buffer=nl.shared_hbm)

    groups = []                    # (first sequence, sequences); its rows start at R * n0
    for n0 in range(0, N, Ng):
        groups.append((n0, min(Ng, N - n0)))
    x_bytes = _nbytes(x.dtype)
    pool_bytes = _nbytes(pool_flat.dtype)
    CD = _chunk_channels(len(groups), T, H, W, x_bytes, pool_bytes, _nbytes(weight.dtype), D)
    chunks = []
    for c0 in range(0, D, CD):
        chunks.append((c0, min(CD, D - c0)))

    # run-time row indices and masks of every group, one column each
    g_rows = []
    g_valid = []
    for (n0, Pn) in groups:
        P = R * Pn
        r = nl.ndarray((PMAX, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=r[0:P, :], src=rows.ap(pattern=[[1, P], [1, 1]], offset=R * n0))
        v = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=v[0:P, :], src=valid.ap(pattern=[[1, P], [1, 1]], offset=R * n0))
        g_rows.append(r)
        g_valid.append(v)

    # Software pipeline, PD chunks ahead: every group's gather of chunk c+PD is issued before
    # the first scatter of chunk c (a scatter into the pool orders every later pool read, as
    # the slots are run-time data). PD: as many chunks as fit LOAD_BUDGET (all of them for
    # small batches, so every gather precedes every scatter).
    chunk_bytes = len(groups) * CD * (H * pool_bytes + T * x_bytes)
    PD = max(1, min(len(chunks) - 1, LOAD_BUDGET // chunk_bytes - 1))
    # weights: all chunks up front when they fit 32 KiB per partition (small batches: the
    # ScalarE evictions then never queue between two chunks' arithmetic), else one ahead
    WD = 1
    if D * W * _nbytes(weight.dtype) <= 32 * 1024:
        WD = len(chunks)
    wdt = nl.float32 if weight.dtype == nl.float32 else nl.bfloat16
    sel_w = _selector(R, PB, wdt)
    sel_b = sel_w
    if has_bias:
        sel_b = _selector(R, PB, nl.float32 if bias.dtype == nl.float32 else nl.bfloat16)
    loads = []
    wts = []
    for ci in range(len(chunks)):
        loads.append(None)
        wts.append(None)
    wts[0] = _load_weights(weight, bias, sel_w, sel_b, PB, chunks[0], R, D, W, CD, has_bias)
    for ci in range(min(PD, len(chunks))):
        loads[ci] = _load_chunk(x, pool_flat, g_rows, groups, chunks[ci], R, D, H, CD)
    for ci in range(1, min(WD, len(chunks))):
        wts[ci] = _load_weights(weight, bias, sel_w, sel_b, PB, chunks[ci], R, D, W, CD,
                                has_bias)
    for ci in range(len(chunks)):
        c0, cd = chunks[ci]
        if ci + PD < len(chunks):
            loads[ci + PD] = _load_chunk(x, pool_flat, g_rows, groups, chunks[ci + PD],
                                         R, D, H, CD)
        if ci + WD < len(chunks):
            wts[ci + WD] = _load_weights(weight, bias, sel_w, sel_b, PB, chunks[ci + WD], R, D,
                                         W, CD, has_bias)
        cur = loads[ci]
        wb, bb = wts[ci]
        loads[ci] = None          # the chunk's buffers die with this iteration
        wts[ci] = None
        for gi in range(len(groups)):
            n0, Pn = groups[gi]
            P = R * Pn
            st, xs = cur[gi]
            yt = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
            for t in range(T):
                acc = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=acc[0:P, 0:cd], data1=_window(st, xs, P, cd, H, t),
                                   data2=wb[0:P, 0:cd * W:W], op=nl.multiply,
                                   engine=nisa.engine.gpsimd)
                for k in range(1, W):
                    prod = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.tensor_tensor(dst=prod[0:P, 0:cd],
                                       data1=_window(st, xs, P, cd, H, t + k),
                                       data2=wb[0:P, k:cd * W:W], op=nl.multiply,
                                       engine=nisa.engine.gpsimd)
                    nisa.tensor_tensor(dst=acc[0:P, 0:cd], data1=acc[0:P, 0:cd],
                                       data2=prod[0:P, 0:cd], op=nl.add,
                                       engine=nisa.engine.vector)
                if has_bias:
                    nisa.tensor_tensor(dst=acc[0:P, 0:cd], data1=acc[0:P, 0:cd],
                                       data2=bb[0:P, 0:cd], op=nl.add, engine=nisa.engine.vector)
                # padding rows: act(0 * acc) = 0
                nisa.activation(dst=yt[0:P, t, 0:cd], op=act_op, data=acc[0:P, 0:cd],
                                scale=g_valid[gi][0:P, :])
            nisa.dma_copy(dst=y.ap(pattern=[[T * dim, Pn], [D, R], [dim, T], [1, cd]],
                                   offset=n0 * T * dim + c0),
                          src=yt[0:P, :, 0:cd])

            # new state = window columns T .. T+W-2, assembled contiguous for one scatter
            ns = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
            for j in range(H):
                nisa.tensor_copy(dst=ns[0:P, 0:cd, j], src=_window(st, xs, P, cd, H, T + j),
                                 engine=nisa.engine.scalar)
            nisa.dma_copy(dst=pool_flat.ap(pattern=[[D * H, P], [H, cd], [1, H]], offset=c0 * H,
                                           vector_offset=g_rows[gi][0:P, :], indirect_dim=0),
                          src=ns[0:P, 0:cd, :], oob_mode=nisa.oob_mode.skip)
    return y
