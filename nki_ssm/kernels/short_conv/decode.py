"""Decode / multi-token update of the short causal conv1d (one launch per batch).

Layout: sequences on partitions (up to 128 per group), channels on the free
axis, so every HBM stream is a contiguous row per partition: the pool is
viewed as ``[slots, dim * (W-1)]`` and one ``vector_offset`` DMA gathers (and
later scatters) ``chunk * (W-1)`` contiguous state elements per sequence;
x ``[num_seqs, T, dim]`` and y load/store as ``[seqs, T, chunk]`` rows.

Engine plan per channel chunk (up to 2048 channels) and group of sequences:
the window is (state ++ x) viewed per tap, never copied;
GpSimd multiplies each tap by the weight row (broadcast over partitions once
per chunk by a stride-0 DMA), VectorE accumulates the taps (and the bias) in
float32, ScalarE applies SiLU/copy scaled by the run-time ``valid`` column
(padding sequences give act(0) = 0) and assembles the shifted new state,
and DMA scatters it back to the slot (padding rows are out of bounds and
skipped). Decode needs no TensorE: the work per byte is W multiply-adds.

Run-time: slots and the valid mask (index tables); compile-time: shapes,
dtypes, W, T, activation, bias presence. Padding sequences must carry
finite x (their outputs are act(0 * acc)).
"""
from nki_ssm.backend import nki, nl, nisa

PMAX = 128


def _chunk_channels(T):
    """Channels per chunk: ~(40 + 4T) bytes per channel per partition of SBUF."""
    return 2048 if T <= 4 else 1024


def _window(st, xs, P, cd, H, i):
    """Window column i of (state ++ x) as a [P, cd] view (no copy)."""
    if i < H:
        return st[0:P, 0:cd, i]
    return xs[0:P, i - H, 0:cd]


@nki.jit
def short_conv_decode_kernel(x, weight, bias, pool_flat, rows, valid, activation, has_bias):
    """x ``[num_seqs, T, dim]``; weight ``[dim, W]``; bias ``[dim]`` or None;
    pool_flat ``[slots, dim * (W-1)]`` (the pool, updated in place); rows int32
    ``[num_seqs]`` (slot, or ``slots`` = out of bounds for padding); valid
    float32 ``[num_seqs]`` (1 live, 0 padding); activation "silu" or "none".
    Returns y ``[num_seqs, T, dim]`` in x's dtype.
    """
    N, T, dim = x.shape
    W = weight.shape[1]
    H = W - 1
    act_op = nl.silu if activation == "silu" else nl.copy
    y = nl.ndarray((N, T, dim), dtype=x.dtype, buffer=nl.shared_hbm)
    CD = _chunk_channels(T)
    groups = []
    for n0 in range(0, N, PMAX):
        groups.append((n0, min(PMAX, N - n0)))
    PB = min(PMAX, N)              # partitions that need the broadcast weights

    # run-time indices and masks of every group, one column each
    g_rows = []
    g_valid = []
    for (n0, P) in groups:
        r = nl.ndarray((PMAX, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=r[0:P, :], src=rows.ap(pattern=[[1, P], [1, 1]], offset=n0))
        v = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=v[0:P, :], src=valid.ap(pattern=[[1, P], [1, 1]], offset=n0))
        g_rows.append(r)
        g_valid.append(v)

    for c0 in range(0, dim, CD):
        cd = min(CD, dim - c0)
        # weights (and bias) of this chunk on every partition: stride-0 partition pattern
        wb = nl.ndarray((PMAX, CD, W), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=wb[0:PB, 0:cd, :],
                      src=weight.ap(pattern=[[0, PB], [W, cd], [1, W]], offset=c0 * W))
        if has_bias:
            bb = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=bb[0:PB, 0:cd], src=bias.ap(pattern=[[0, PB], [1, cd]], offset=c0))
        for gi in range(len(groups)):
            n0, P = groups[gi]
            st = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
            nisa.memset(dst=st[0:P, 0:cd, :], value=0.0)
            nisa.dma_copy(dst=st[0:P, 0:cd, :],
                          src=pool_flat.ap(pattern=[[dim * H, P], [H, cd], [1, H]],
                                           offset=c0 * H, vector_offset=g_rows[gi][0:P, :],
                                           indirect_dim=0),
                          oob_mode=nisa.oob_mode.skip)
            xs = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xs[0:P, :, 0:cd], src=x[n0:n0 + P, :, c0:c0 + cd])

            yt = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
            for t in range(T):
                acc = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
                for k in range(W):
                    if k == 0:
                        nisa.tensor_tensor(dst=acc[0:P, 0:cd], data1=_window(st, xs, P, cd, H, t),
                                           data2=wb[0:P, 0:cd, 0], op=nl.multiply,
                                           engine=nisa.engine.gpsimd)
                    else:
                        prod = nl.ndarray((PMAX, CD), dtype=nl.float32, buffer=nl.sbuf)
                        nisa.tensor_tensor(dst=prod[0:P, 0:cd], data1=_window(st, xs, P, cd, H, t + k),
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
            nisa.dma_copy(dst=y[n0:n0 + P, :, c0:c0 + cd], src=yt[0:P, :, 0:cd])

            # new state = window columns T .. T+W-2, assembled contiguous for one scatter
            ns = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
            for j in range(H):
                nisa.tensor_copy(dst=ns[0:P, 0:cd, j], src=_window(st, xs, P, cd, H, T + j),
                                 engine=nisa.engine.scalar)
            nisa.dma_copy(dst=pool_flat.ap(pattern=[[dim * H, P], [H, cd], [1, H]],
                                           offset=c0 * H, vector_offset=g_rows[gi][0:P, :],
                                           indirect_dim=0),
                          src=ns[0:P, 0:cd, :], oob_mode=nisa.oob_mode.skip)
    return y
