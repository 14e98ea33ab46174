"""Backward of the short causal depthwise conv1d over a ragged batch (training form: each
sequence starts from its own initial state and returns its final state; no pool).

Math (per sequence of L tokens, H = W - 1, the window stream ``xx = (initial state ++
x)`` of L + H positions; ``nki_ssm.reference.short_conv_backward``)::

    z[i]   = bias + sum_k w[:, k] * xx[i + k]          dz[i] = dy[i] * act'(z[i])
    dxx[p] = sum_k w[:, k] * dz[p - k]  (0 <= p-k < L)  + d_final[p - L]  (p >= L)
    dx = dxx[H:], d_initial = dxx[:H], dweight[:, k] = sum_i dz[i] xx[i + k], dbias = sum dz

Shapes (DP = dim padded to a multiple of 128 * programs, NB the token bucket, SB the
sequence bucket, T = 128 positions per work row):

- ``xsrc [NB + SB*H + 1, DP]`` (x's dtype, float32 or bfloat16): the x rows, then each
  sequence's initial state token-major (sequence n, column h at row NB + n*H + h), then
  zero rows (the last row is zero: every window position outside a sequence reads it);
- ``dysrc [NB + 1, DP]`` (x's dtype): dy rows, then a zero row (row NB);
- ``weight [DP, W]`` float32, ``bias [DP]`` float32 or None;
- ``dfsrc [SB*H + 1, DP]`` float32 or None: d_final_states token-major (row n*H + h);
- ``rows [R, 128, 5]`` int32, the work list: one row per block of T window positions of a
  sequence (``ceil((L + H) / T)`` rows per sequence, so empty sequences have one), per
  partition q: col 0 / 1 the xsrc row of window position ``p0 - H + q`` / ``p0 - H + 128 +
  q`` (q < 2H), col 2 / 3 the dysrc row of token ``p0 - H + q`` / ``p0 - H + 128 + q``
  (q < H), col 4 the dxo row of position ``p0 + q`` (token row, initial-state row NB + n*H
  + p, or scratch row NB + SB*H + q past the sequence);
- ``fs_rows [SB, H, 2]`` int32: per sequence, the dxo row of position L + h and the dfsrc
  row of d_final[h]; ``counts [1, 2]`` int32: work rows, sequences with d_final_states;
- outputs: ``dxo [NB + SB*H + 128, DP]`` (x's dtype; dx rows, then d_initial rows, then
  scratch), ``dweight [DP, W]`` and ``dbias [DP]`` float32.

Design note
-----------
Loops: per channel group of up to 8 tiles of 128 channels, one top-level
``nl.fori_loop`` over the work rows (the same list for every group: a group's channels
are compile-time offsets); then, with d_final_states, one top-level loop over sequences.
No loop inside another; bounds are registers loaded from ``counts`` through a (1, 1) SBUF
tile before the loops; everything unrolled in a body is bounded by the group (8 tiles)
and W. Program size depends on DP, W, dtypes and flags only.

Per work row and group: one DMA loads the row's index columns (the loop register as
``scalar_offset``); four ``vector_offset`` gathers (one xsrc / dysrc row per partition)
bring the x window (T + 2H positions) and the dy window (T + H tokens) token-major;
positions outside the sequence read the zero row, so no masks and no conditionals. Per
128-channel tile, TensorE: transposes (matmuls against an identity) of both windows into
PSUM, channel-major; with SiLU the W taps of z as accumulating matmuls with
``diag(w_k)`` stationary and the shifted x window moving (z channel-major); the W taps
of dx with the shifted dz window stationary and ``diag(w_k)`` moving, which makes dx
token-major for a contiguous-row scatter. ScalarE: the x window's PSUM eviction,
``sigmoid(z + b)`` and ``silu(z + b)``; VectorE: ``dz = dy * (s + silu * (1 - s))``
(float32, read from PSUM), dx's PSUM eviction, and dweight / dbias: products of dz with
each shifted x window, reduced over tokens into float32 accumulators (a token's products
are counted by the one row whose T positions hold it). The row's dx block goes out by
one ``vector_offset`` scatter. After a group's loop its float32 accumulators are stored.
The d_final loop then reads back the H rows of positions L .. L+H-1 of each sequence,
adds d_final (VectorE) and writes them again.

Saved vs recomputed: the forward saves nothing beyond its inputs (x, weight, bias and
the initial states the caller already holds); z and sigmoid(z) are recomputed here (W
TensorE taps per tile), so the training forward costs 0 extra bytes per token.

What binds (modeled, trn2): TensorE (per 128 x 128 block: two window transposes of T +
2H and T + H columns, 2W taps of ~T columns) with VectorE close behind; see the report
in the launcher (nki_ssm.ops.launch.short_conv_backward) for figures.

LNC: the channel tiles split evenly between the programs (DP is padded to 128 * programs
channels): program ``nl.program_id(0)`` takes tiles ``pid * NTP .. (pid + 1) * NTP``, runs
the same loops over the same work list on its own channels, writes only its own columns
of dxo / rows of dweight and dbias (the scratch rows too), and reduces dweight / dbias over
tokens itself: no cross-program reduction, results bit-identical to LNC=1.

Limits: 2 <= W <= 65 (2H <= 128 window rows in the second gather); any dim; any lengths
(empty sequences, T = 1, T < W); float32 x: float32 matmuls (quarter rate); bfloat16 x:
bfloat16 matmul operands (weights rounded to bfloat16 in the diagonals, dz rounded to
bfloat16 for the dx taps), float32 accumulation and float32 dweight / dbias.
"""
from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels._common import count_register

TILE = 128          # channels per tile, positions per work row
ROW = 128           # T: window positions whose dx a work row writes
GROUP_TILES = 8     # channel tiles per group (one loop each)
BANK = 512          # float32 columns of one PSUM bank
TABLE_COLUMNS = 5   # index columns of a work row
FS_COLUMNS = 2048   # channels per d_final read-modify-write block


def _identity(dtype):
    """[128, 128] identity in ``dtype`` (ones where partition == column)."""
    ones = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    ident = nl.ndarray((TILE, TILE), dtype=dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, pattern=[[-1, TILE]], channel_multiplier=1,
                       on_true_tile=ones, on_false_value=0.0, cmp_op=nl.equal)
    return ident


def _group_weights(weight, bias, wcol, bcol, diag, ident, c0, n, W):
    """Float32 weight / bias columns of the group's n tiles (channel c0 + j*128 + p on
    partition p) and the diagonals ``diag[:, j, k, :] = diag(w[:, k])`` in the matmul dtype."""
    nisa.dma_copy(dst=wcol[:, 0:n, :],
                  src=weight.ap(pattern=[[W, TILE], [TILE * W, n], [1, W]], offset=c0 * W))
    if bias != None:  # noqa: E711
        nisa.dma_copy(dst=bcol[:, 0:n], src=bias.ap(pattern=[[1, TILE], [TILE, n]], offset=c0))
    for j in range(n):
        for k in range(W):
            nisa.tensor_scalar(dst=diag[:, j, k, :], data=ident, op0=nl.multiply,
                               operand0=wcol[:, j, k:k + 1])


def _transpose_in(ps, g0, g1, cols, ident, n0, n1):
    """``ps[:, 0:n0 + n1]`` = rows ``g0[0:n0] ++ g1[0:n1]`` of channel block ``cols``,
    channel-major (TensorE: the gathered rows as stationary against an identity)."""
    nisa.nc_matmul(dst=ps[:, 0:n0], stationary=g0[0:n0, cols], moving=ident[0:n0, 0:n0],
                   accumulate=False)
    nisa.nc_matmul(dst=ps[:, n0:n0 + n1], stationary=g1[0:n1, cols],
                   moving=ident[0:n1, 0:n1], accumulate=False)


def _tile_grads(bufs, j, W, silu, bf16):
    """Channel tile j of a work row: x and dy windows channel-major, z (SiLU), dz, and the
    W dx taps into its 128 columns of a token-major PSUM bank."""
    (ident, xg0, xg1, dg0, dg1, xw, dz32, dzm, sg, ac, om, banks, diag, bcol) = bufs
    H = W - 1
    T = ROW
    F = T + 2 * H
    D = T + H
    cols = slice(j * TILE, (j + 1) * TILE)
    psx = banks[j % 2]
    _transpose_in(psx, xg0, xg1, cols, ident, T, 2 * H)
    nisa.tensor_copy(dst=xw[:, j, :], src=psx[:, 0:F], engine=nisa.engine.scalar)
    psd = banks[2 + j % 2]
    _transpose_in(psd, dg0, dg1, cols, ident, T, H)
    if silu:
        psz = banks[4 + j % 2]
        for k in range(W):
            nisa.nc_matmul(dst=psz[:, 0:D], stationary=diag[:, j, k, :],
                           moving=xw[:, j, k:k + D], accumulate=k > 0)
        # silu'(z) = s + silu(z) * (1 - s), s = sigmoid(z), z = taps + bias
        nisa.activation(dst=sg, op=nl.sigmoid, data=psz[:, 0:D], bias=bcol[:, j:j + 1])
        nisa.activation(dst=ac, op=nl.silu, data=psz[:, 0:D], bias=bcol[:, j:j + 1])
        nisa.tensor_scalar(dst=om, data=sg, op0=nl.multiply, operand0=-1.0, op1=nl.add,
                           operand1=1.0)
        nisa.tensor_tensor(dst=om, data1=ac, data2=om, op=nl.multiply)
        nisa.tensor_tensor(dst=om, data1=om, data2=sg, op=nl.add)
        nisa.tensor_tensor(dst=dz32[:, j, :], data1=om, data2=psd[:, 0:D], op=nl.multiply)
    else:
        nisa.tensor_copy(dst=dz32[:, j, :], src=psd[:, 0:D])
    dzs = dz32
    if bf16:
        nisa.tensor_copy(dst=dzm[:, j, :], src=dz32[:, j, :])
        dzs = dzm
    pso = banks[6 + (j // (BANK // TILE)) % 2]
    col = (j % (BANK // TILE)) * TILE
    for k in range(W):
        # dx[p0 + q] += w_k * dz[p0 + q - k]: dz window column q + H - k
        nisa.nc_matmul(dst=pso[:, col:col + TILE], stationary=dzs[:, j, H - k:H - k + T],
                       moving=diag[:, j, k, :], accumulate=k > 0)
    return pso


def _row(i, rows, xsrc, dysrc, dxo, bufs, red, acc, out, idx, c0, n, W, silu, bf16):
    """Work row i for the group's n tiles at channel c0."""
    (ident, xg0, xg1, dg0, dg1, xw, dz32, dzm, sg, ac, om, banks, diag, bcol) = bufs
    prod, redw, redb = red
    acc_w, acc_b = acc
    H = W - 1
    T = ROW
    DP = xsrc.shape[1]
    gw = n * TILE
    nisa.dma_copy(dst=idx, src=rows.ap(pattern=[[TABLE_COLUMNS, TILE], [1, TABLE_COLUMNS]],
                                       offset=0, scalar_offset=i, indirect_dim=0))
    nisa.dma_copy(dst=xg0[:, 0:gw], src=xsrc.ap(pattern=[[DP, TILE], [1, gw]], offset=c0,
                                                vector_offset=idx[:, 0:1], indirect_dim=0))
    nisa.dma_copy(dst=xg1[:, 0:gw], src=xsrc.ap(pattern=[[DP, 2 * H], [1, gw]], offset=c0,
                                                vector_offset=idx[0:2 * H, 1:2], indirect_dim=0))
    nisa.dma_copy(dst=dg0[:, 0:gw], src=dysrc.ap(pattern=[[DP, TILE], [1, gw]], offset=c0,
                                                 vector_offset=idx[:, 2:3], indirect_dim=0))
    nisa.dma_copy(dst=dg1[:, 0:gw], src=dysrc.ap(pattern=[[DP, H], [1, gw]], offset=c0,
                                                 vector_offset=idx[0:H, 3:4], indirect_dim=0))
    per_bank = BANK // TILE
    for j in range(n):
        pso = _tile_grads(bufs, j, W, silu, bf16)
        if j % per_bank == per_bank - 1 or j == n - 1:
            b0 = (j // per_bank) * per_bank
            nisa.tensor_copy(dst=out[:, b0 * TILE:(j + 1) * TILE],
                             src=pso[:, 0:(j + 1 - b0) * TILE])
    nisa.dma_copy(dst=dxo.ap(pattern=[[DP, TILE], [1, gw]], offset=c0,
                             vector_offset=idx[:, 4:5], indirect_dim=0),
                  src=out[:, 0:gw])
    # dweight[:, k] += sum over the row's own tokens (window columns H .. H+T) of dz * xx
    for k in range(W):
        nisa.tensor_tensor(dst=prod[:, 0:n, :], data1=dz32[:, 0:n, H:H + T],
                           data2=xw[:, 0:n, H + k:H + k + T], op=nl.multiply)
        nisa.tensor_reduce(dst=redw[:, 0:n, k], op=nl.add, data=prod[:, 0:n, :], axis=(2,))
    nisa.tensor_tensor(dst=acc_w[:, 0:n, :], data1=acc_w[:, 0:n, :], data2=redw[:, 0:n, :],
                       op=nl.add)
    nisa.tensor_reduce(dst=redb[:, 0:n], op=nl.add, data=dz32[:, 0:n, H:H + T], axis=(2,))
    nisa.tensor_tensor(dst=acc_b[:, 0:n], data1=acc_b[:, 0:n], data2=redb[:, 0:n], op=nl.add)


def _final_state_grads(f, fs_rows, dfsrc, dxo, fbufs, cp0, PW, H):
    """Sequence f: dxo rows of positions L .. L+H-1 += d_final (read, add, write back),
    over the program's channels [cp0, cp0 + PW)."""
    fi, cur, dfv, new = fbufs
    DP = dxo.shape[1]
    nisa.dma_copy(dst=fi, src=fs_rows.ap(pattern=[[2, H], [1, 2]], offset=0, scalar_offset=f,
                                         indirect_dim=0))
    for b0 in range(0, PW, FS_COLUMNS):
        bw = min(FS_COLUMNS, PW - b0)
        nisa.dma_copy(dst=cur[:, 0:bw], src=dxo.ap(pattern=[[DP, H], [1, bw]], offset=cp0 + b0,
                                                   vector_offset=fi[:, 0:1], indirect_dim=0))
        nisa.dma_copy(dst=dfv[:, 0:bw], src=dfsrc.ap(pattern=[[DP, H], [1, bw]],
                                                     offset=cp0 + b0, vector_offset=fi[:, 1:2],
                                                     indirect_dim=0))
        nisa.tensor_tensor(dst=new[:, 0:bw], data1=cur[:, 0:bw], data2=dfv[:, 0:bw], op=nl.add)
        nisa.dma_copy(dst=dxo.ap(pattern=[[DP, H], [1, bw]], offset=cp0 + b0,
                                 vector_offset=fi[:, 0:1], indirect_dim=0),
                      src=new[:, 0:bw])


@nki.jit
def short_conv_backward_kernel(xsrc, dysrc, weight, bias, dfsrc, rows, fs_rows, counts,
                               activation):
    """dx / d_initial_states (as dxo rows), dweight, dbias of the short conv over a ragged
    batch; tensors and tables as in the module docstring; activation "silu" or "none".
    Returns (dxo ``[NB + SB*H + 128, DP]`` in x's dtype, dweight ``[DP, W]`` float32, dbias
    ``[DP]`` float32)."""
    NX, DP = xsrc.shape
    W = weight.shape[1]
    H = W - 1
    T = ROW
    NB = dysrc.shape[0] - 1
    SB = fs_rows.shape[0]
    xdt = xsrc.dtype
    bf16 = xdt != nl.float32
    silu = activation == "silu"
    programs = nl.num_programs(0)
    pid = nl.program_id(0)
    NTP = DP // TILE // programs           # channel tiles of each program
    cp0 = pid * NTP * TILE
    G = min(GROUP_TILES, NTP)

    dxo = nl.ndarray((NB + SB * H + T, DP), dtype=xdt, buffer=nl.shared_hbm)
    dwo = nl.ndarray((DP, W), dtype=nl.float32, buffer=nl.shared_hbm)
    dbo = nl.ndarray((DP,), dtype=nl.float32, buffer=nl.shared_hbm)

    ident = _identity(xdt)
    banks = []
    for b in range(8):
        banks.append(nl.ndarray((TILE, BANK), dtype=nl.float32, buffer=nl.psum))
    GW = G * TILE
    xg0 = nl.ndarray((TILE, GW), dtype=xdt, buffer=nl.sbuf)
    xg1 = nl.ndarray((2 * H, GW), dtype=xdt, buffer=nl.sbuf)
    dg0 = nl.ndarray((TILE, GW), dtype=xdt, buffer=nl.sbuf)
    dg1 = nl.ndarray((H, GW), dtype=xdt, buffer=nl.sbuf)
    xw = nl.ndarray((TILE, G, T + 2 * H), dtype=xdt, buffer=nl.sbuf)
    dz32 = nl.ndarray((TILE, G, T + H), dtype=nl.float32, buffer=nl.sbuf)
    dzm = None
    if bf16:
        dzm = nl.ndarray((TILE, G, T + H), dtype=xdt, buffer=nl.sbuf)
    sg = nl.ndarray((TILE, T + H), dtype=nl.float32, buffer=nl.sbuf)
    ac = nl.ndarray((TILE, T + H), dtype=nl.float32, buffer=nl.sbuf)
    om = nl.ndarray((TILE, T + H), dtype=nl.float32, buffer=nl.sbuf)
    out = nl.ndarray((TILE, GW), dtype=xdt, buffer=nl.sbuf)
    idx = nl.ndarray((TILE, TABLE_COLUMNS), dtype=nl.int32, buffer=nl.sbuf)
    wcol = nl.ndarray((TILE, G, W), dtype=nl.float32, buffer=nl.sbuf)
    bcol = nl.ndarray((TILE, G), dtype=nl.float32, buffer=nl.sbuf)
    diag = nl.ndarray((TILE, G, W, TILE), dtype=xdt, buffer=nl.sbuf)
    red = (nl.ndarray((TILE, G, T), dtype=nl.float32, buffer=nl.sbuf),
           nl.ndarray((TILE, G, W), dtype=nl.float32, buffer=nl.sbuf),
           nl.ndarray((TILE, G), dtype=nl.float32, buffer=nl.sbuf))
    acc = (nl.ndarray((TILE, G, W), dtype=nl.float32, buffer=nl.sbuf),
           nl.ndarray((TILE, G), dtype=nl.float32, buffer=nl.sbuf))
    bufs = (ident, xg0, xg1, dg0, dg1, xw, dz32, dzm, sg, ac, om, banks, diag, bcol)
    if bias == None:  # noqa: E711
        nisa.memset(dst=bcol, value=0.0)
    n_rows = count_register(counts, 0)
    n_fs = count_register(counts, 1)

    for g0 in range(0, NTP, G):
        n = min(G, NTP - g0)
        c0 = cp0 + g0 * TILE
        _group_weights(weight, bias, wcol, bcol, diag, ident, c0, n, W)
        nisa.memset(dst=acc[0], value=0.0)
        nisa.memset(dst=acc[1], value=0.0)

        def row_body(i):
            _row(i, rows, xsrc, dysrc, dxo, bufs, red, acc, out, idx, c0, n, W, silu, bf16)

        nl.fori_loop(0, n_rows, row_body)
        nisa.dma_copy(dst=dwo.ap(pattern=[[W, TILE], [TILE * W, n], [1, W]], offset=c0 * W),
                      src=acc[0][:, 0:n, :])
        nisa.dma_copy(dst=dbo.ap(pattern=[[1, TILE], [TILE, n]], offset=c0),
                      src=acc[1][:, 0:n])

    if dfsrc != None:  # noqa: E711
        PW = NTP * TILE
        fw = min(FS_COLUMNS, PW)
        fbufs = (nl.ndarray((H, 2), dtype=nl.int32, buffer=nl.sbuf),
                 nl.ndarray((H, fw), dtype=xdt, buffer=nl.sbuf),
                 nl.ndarray((H, fw), dtype=nl.float32, buffer=nl.sbuf),
                 nl.ndarray((H, fw), dtype=xdt, buffer=nl.sbuf))

        def fs_body(f):
            _final_state_grads(f, fs_rows, dfsrc, dxo, fbufs, cp0, PW, H)

        nl.fori_loop(0, n_fs, fs_body)
    return dxo, dwo, dbo
