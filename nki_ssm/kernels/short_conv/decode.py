"""Decode / multi-token update of the short causal conv1d (one launch per batch).

Layout: "virtual rows" on partitions. Each sequence's channels are split into
R blocks of D = dim / R channels and row v = n * R + r (sequence n, block r)
gets one partition, so a small batch still fills the 128 lanes (the launcher
picks R: the largest power of two with num_seqs * R <= 128 dividing dim).
Channels of the block run along the free axis, so every HBM stream is a
contiguous run per partition: the pool is viewed as ``[slots * R, D * (W-1)]``
and one ``vector_offset`` DMA per group gathers (later scatters) ``chunk *
(W-1)`` contiguous state elements per row; x ``[num_seqs, T, dim]`` and y
load/store through 4-D access patterns ``[seqs, R, T, chunk]``.

Engine plan per channel chunk (up to 2048 channels of a block) and group of
up to 128 rows: the window (state ++ x) is read per tap through views, never
copied; GpSimd multiplies each tap by the weight row (broadcast over
partitions once per chunk by a stride-0 DMA), VectorE accumulates the taps
(and the bias) in float32, ScalarE applies SiLU/copy scaled by the run-time
``valid`` column (padding rows give act(0) = 0) and assembles the shifted new
state, and DMA scatters it back (padding rows are out of bounds and
skipped). The next group's gather and x load are issued before the current
group's arithmetic (software pipeline). Decode needs no TensorE: the work
per byte is W multiply-adds.

Run-time: slots and the valid mask (row tables); compile-time: shapes,
dtypes, W, T, R, activation, bias presence. Padding sequences must carry
finite x (their outputs are act(0 * acc)).
"""
from nki_ssm.backend import nki, nl, nisa

PMAX = 128


def _chunk_channels(n_groups, T, H, x_bytes, pool_bytes, D):
    """Channels per chunk: two chunks of loads (every group's state and x) take at most
    ~96 KiB per partition, and D splits into ~4+ chunks for overlap; a power of two in
    [128, 2048], <= D."""
    per_channel = 2 * n_groups * (H * pool_bytes + T * x_bytes)
    cd = 2048
    while cd > 128 and cd * per_channel > 96 * 1024:
        cd = cd // 2
    # at least ~4 chunks when D allows, so loads, arithmetic and stores overlap
    while cd > 256 and cd * 4 > D:
        cd = cd // 2
    return min(cd, D)


def _window(st, xs, P, cd, H, i):
    """Window column i of (state ++ x) as a [P, cd] view (no copy)."""
    if i < H:
        return st[0:P, 0:cd, i]
    return xs[0:P, i - H, 0:cd]


def _load_group(x, pool_flat, rows_sb, v0, P, c0, cd, R, D, H, CD):
    """Gather the state rows and load x of rows [v0, v0 + P), channels [c0, c0 + cd) of each block."""
    N, T, dim = x.shape
    st = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
    nisa.memset(dst=st[0:P, 0:cd, :], value=0.0)
    nisa.dma_copy(dst=st[0:P, 0:cd, :],
                  src=pool_flat.ap(pattern=[[D * H, P], [H, cd], [1, H]], offset=c0 * H,
                                   vector_offset=rows_sb[0:P, :], indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    xs = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
    # row v = n*R + r reads x[n, :, r*D + c0 : r*D + c0 + cd]
    nisa.dma_copy(dst=xs[0:P, :, 0:cd],
                  src=x.ap(pattern=[[T * dim, P // R], [D, R], [dim, T], [1, cd]],
                           offset=(v0 // R) * T * dim + c0))
    return (st, xs)


def _load_chunk(x, pool_flat, rows_groups, chunk, R, D, H, CD):
    """[(state, x)] of every group for one chunk (channels [c0, c0 + cd) of each block)."""
    g_rows, groups = rows_groups
    c0, cd = chunk
    out = []
    for gi in range(len(groups)):
        out.append(_load_group(x, pool_flat, g_rows[gi], groups[gi][0], groups[gi][1], c0, cd,
                               R, D, H, CD))
    return out


def _load_weights(weight, bias, PB, c0, cd, R, D, W, CD, has_bias):
    """Weights (and bias) of chunk c0 broadcast to rows: row v gets block v % R."""
    # float32 weights stay float32; bfloat16 ones are broadcast as they are (exact, half the bytes)
    wb = nl.ndarray((PMAX, CD, W), dtype=weight.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wb[0:PB, 0:cd, :],
                  src=weight.ap(pattern=[[0, PB // R], [D * W, R], [1, cd * W]], offset=c0 * W))
    bb = None
    if has_bias:
        bb = nl.ndarray((PMAX, CD), dtype=bias.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=bb[0:PB, 0:cd],
                      src=bias.ap(pattern=[[0, PB // R], [D, R], [1, cd]], offset=c0))
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
    V = N * R
    G = (PMAX // R) * R            # rows per group (whole sequences)
    act_op = nl.silu if activation == "silu" else nl.copy
    y = nl.ndarray((N, T, dim), dtype=x.dtype, buffer=nl.shared_hbm)
    PB = min(G, V)                 # rows that need the broadcast weights

    groups = []
    for v0 in range(0, V, G):
        groups.append((v0, min(G, V - v0)))
    CD = _chunk_channels(len(groups), T, H, x.dtype.itemsize, pool_flat.dtype.itemsize, D)
    chunks = []
    for c0 in range(0, D, CD):
        chunks.append((c0, min(CD, D - c0)))
    # run-time row indices and masks of every group, one column each
    g_rows = []
    g_valid = []
    for (v0, P) in groups:
        r = nl.ndarray((PMAX, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=r[0:P, :], src=rows.ap(pattern=[[1, P], [1, 1]], offset=v0))
        v = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=v[0:P, :], src=valid.ap(pattern=[[1, P], [1, 1]], offset=v0))
        g_rows.append(r)
        g_valid.append(v)

    # Software pipeline, PD chunks ahead: every group's gather of chunk c+PD is issued before
    # the first scatter of chunk c (a scatter into the pool orders every later pool read, as
    # the slots are run-time data). PD: as many chunks as fit ~96 KiB per partition (all of
    # them for small batches, so every gather precedes every scatter).
    chunk_bytes = len(groups) * CD * (H * pool_flat.dtype.itemsize + T * x.dtype.itemsize)
    PD = max(1, min(len(chunks) - 1, (96 * 1024) // chunk_bytes - 1))
    loads = []
    for ci in range(len(chunks)):
        loads.append(None)

    def_rows = (g_rows, groups)
    for ci in range(min(PD, len(chunks))):
        loads[ci] = _load_chunk(x, pool_flat, def_rows, chunks[ci], R, D, H, CD)
    nwts = _load_weights(weight, bias, PB, chunks[0][0], chunks[0][1], R, D, W, CD, has_bias)
    for ci in range(len(chunks)):
        c0, cd = chunks[ci]
        if ci + PD < len(chunks):
            loads[ci + PD] = _load_chunk(x, pool_flat, def_rows, chunks[ci + PD], R, D, H, CD)
        cur = loads[ci]
        loads[ci] = None          # the chunk's buffers die with this iteration
        wb, bb = nwts
        if ci + 1 < len(chunks):
            c1, cd1 = chunks[ci + 1]
            nwts = _load_weights(weight, bias, PB, c1, cd1, R, D, W, CD, has_bias)
        for gi in range(len(groups)):
            v0, P = groups[gi]
            st, xs = cur[gi]
            yt = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
            for t in range(T):
                acc = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=acc[0:P, 0:cd], data1=_window(st, xs, P, cd, H, t),
                                   data2=wb[0:P, 0:cd, 0], op=nl.multiply,
                                   engine=nisa.engine.gpsimd)
                for k in range(1, W):
                    prod = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.tensor_tensor(dst=prod[0:P, 0:cd],
                                       data1=_window(st, xs, P, cd, H, t + k),
                                       data2=wb[0:P, 0:cd, k], op=nl.multiply,
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
            nisa.dma_copy(dst=y.ap(pattern=[[T * dim, P // R], [D, R], [dim, T], [1, cd]],
                                   offset=(v0 // R) * T * dim + c0),
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
