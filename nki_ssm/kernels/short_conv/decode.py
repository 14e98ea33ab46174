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


def _chunk_channels(T):
    """Channels per chunk: ~(40 + 4T) bytes per channel per partition of SBUF, double-buffered."""
    return 2048 if T <= 4 else 1024


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


def _load_weights(weight, bias, PB, c0, cd, R, D, W, CD, has_bias):
    """Weights (and bias) of chunk c0 broadcast to rows: row v gets block v % R."""
    wb = nl.ndarray((PMAX, CD, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=wb[0:PB, 0:cd, :],
                  src=weight.ap(pattern=[[0, PB // R], [D * W, R], [1, cd * W]], offset=c0 * W))
    bb = None
    if has_bias:
        bb = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
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
    CD = min(_chunk_channels(T), D)
    PB = min(G, V)                 # rows that need the broadcast weights

    groups = []
    for v0 in range(0, V, G):
        groups.append((v0, min(G, V - v0)))
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

    items = []
    for c0 in range(0, D, CD):
        for gi in range(len(groups)):
            items.append((c0, gi))

    wts = _load_weights(weight, bias, PB, 0, min(CD, D), R, D, W, CD, has_bias)
    nxt = _load_group(x, pool_flat, g_rows[0], groups[0][0], groups[0][1], 0, min(CD, D),
                      R, D, H, CD)
    for i in range(len(items)):
        c0, gi = items[i]
        cd = min(CD, D - c0)
        v0, P = groups[gi]
        st, xs = nxt
        wb, bb = wts
        if i + 1 < len(items):
            c1, g1 = items[i + 1]
            nxt = _load_group(x, pool_flat, g_rows[g1], groups[g1][0], groups[g1][1], c1,
                              min(CD, D - c1), R, D, H, CD)
            if c1 != c0:
                wts = _load_weights(weight, bias, PB, c1, min(CD, D - c1), R, D, W, CD, has_bias)

        yt = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
        for t in range(T):
            acc = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=acc[0:P, 0:cd], data1=_window(st, xs, P, cd, H, t),
                               data2=wb[0:P, 0:cd, 0], op=nl.multiply, engine=nisa.engine.gpsimd)
            for k in range(1, W):
                prod = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=prod[0:P, 0:cd], data1=_window(st, xs, P, cd, H, t + k),
                                   data2=wb[0:P, 0:cd, k], op=nl.multiply,
                                   engine=nisa.engine.gpsimd)
                nisa.tensor_tensor(dst=acc[0:P, 0:cd], data1=acc[0:P, 0:cd],
                                   data2=prod[0:P, 0:cd], op=nl.add, engine=nisa.engine.vector)
            if has_bias:
                nisa.tensor_tensor(dst=acc[0:P, 0:cd], data1=acc[0:P, 0:cd], data2=bb[0:P, 0:cd],
                                   op=nl.add, engine=nisa.engine.vector)
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
