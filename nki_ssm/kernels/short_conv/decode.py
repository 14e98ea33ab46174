"""Decode / multi-token update of the short causal conv1d (one launch per batch).

Memory layout: "rows" on partitions. Each sequence's channels are split into R
blocks of D = dim / R channels and each (sequence, block) row gets one
partition, so a small batch still fills the 128 lanes (the launcher picks R:
the largest power of two with num_seqs * R <= 128 dividing dim). A group
holds up to 128 // R sequences, block-major: partition r * Pn + i is block r
of the group's sequence i. Channels of a block run along the free axis, so
every HBM stream is a contiguous run per partition: the pool is viewed as
``[slots * R, D * (W-1)]`` and one ``vector_offset`` DMA per group and chunk
gathers (later scatters) ``chunk * (W-1)`` contiguous state elements per
row; x ``[num_seqs, T, dim]`` and y move through 4-D access patterns
``[R, seqs, T, chunk]``.

Engine plan, per group, per 128-channel sub-tile of a chunk (general path):
- TensorE transposes every window column (W-1 state columns and the T new
  tokens) to channel-major ``[128 ch, rows]`` in PSUM, so each channel's
  weight becomes a per-partition scalar;
- ScalarE applies the first tap and the bias (``activation(copy, scale=w[:, 0],
  bias=b)`` from PSUM), VectorE fuses the other taps as multiply-adds
  (``scalar_tensor_tensor`` with the weight column, reading PSUM), all in
  float32;
- TensorE transposes the float32 result back to rows, and one ScalarE
  instruction per step applies SiLU (or copy) to ``valid * acc`` while
  evicting (padding rows give act(0) = 0).
TensorE-taps path (one channel block, R == 1, and bfloat16 x / pool /
weight values): the transposed window columns are evicted to SBUF by VectorE
and the W taps (+ a K=1 bias matmul) accumulate in PSUM as
``psum[rows, ch] += window_k[ch, rows].T @ diag(weight[:, k])``, already
row-major, so no transpose back; ScalarE applies SiLU on eviction.
The new state (window columns T .. T+W-2) is assembled row-major by ScalarE
copies and scattered back with one DMA per group and chunk (padding rows are
out of bounds and skipped). Gathers run PD chunks ahead of the scatters
(software pipeline; all of them up front for small batches): a scatter into
the pool orders every later pool read, as the slots are run-time data.

Run-time: slots and the valid mask (row tables); compile-time: shapes,
dtypes, W, T, R, activation, bias presence. Padding sequences must carry
finite x (their outputs are act(0 * acc)).
"""
from nki_ssm.backend import nki, nl, nisa

PMAX = 128
SUB = 128                   # channels per transposed sub-tile
BATCH = 2                   # sub-tiles per pipeline step (2 steps of windows + outputs fit PSUM)
LOAD_BUDGET = 96 * 1024     # bytes per partition for in-flight chunk loads (state + x)


def _nbytes(dtype):
    return 4 if dtype == nl.float32 else 2


def _chunk_channels(n_groups, T, H, x_bytes, pool_bytes, D):
    """Channels per chunk: a power of two in [128, 2048] (or D), two chunks of loads
    within LOAD_BUDGET; D splits into ~4+ chunks when it allows, so loads, arithmetic
    and stores overlap."""
    load = 2 * n_groups * (H * pool_bytes + T * x_bytes) + 3 * T * x_bytes + H * pool_bytes
    cd = 2048
    while cd > 128 and cd * load > LOAD_BUDGET:
        cd = cd // 2
    while cd > 256 and cd * 4 > D:
        cd = cd // 2
    return min(cd, D)


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
    # partition r*Pn + i reads x[n0 + i, :, r*D + c0 : r*D + c0 + cd]
    nisa.dma_copy(dst=xs[0:P, :, 0:cd],
                  src=x.ap(pattern=[[D, R], [T * dim, Pn], [dim, T], [1, cd]],
                           offset=n0 * T * dim + c0))
    return (st, xs)


def _load_chunk(x, pool_flat, g_rows, groups, chunk, R, D, H, CD):
    """[(state, x)] of every group for one chunk."""
    c0, cd = chunk
    out = []
    for gi in range(len(groups)):
        out.append(_load_group(x, pool_flat, g_rows[gi], groups[gi], c0, cd, R, D, H, CD))
    return out


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


def _window_tiles(st, xs, P, j0, w, H, T):
    """TensorE transposes of the window columns (state ++ x) of channels [j0, j0 + w):
    a list of (psum tile, column) per window column i = 0 .. H+T-1, each [w, P]. Columns
    of one dtype share PSUM tiles of one bank (2 KiB) each."""
    cols = []
    tiles = []                     # [tile, used columns, dtype bytes, is state dtype]
    for i in range(H + T):
        src = st if i < H else xs
        nb = _nbytes(src.dtype)
        same = st.dtype == xs.dtype
        key = True if same else (i < H)
        per_bank = 2048 // (PMAX * nb)
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


def _psum_plan(st_bytes, x_bytes, same, H, T):
    """(sub-tiles per pipeline step, PSUM banks) so that two steps' window tiles and one
    output tile fit the 8 PSUM banks."""
    if same:
        per_sub = (H + T + 2048 // (PMAX * st_bytes) - 1) // (2048 // (PMAX * st_bytes))
    else:
        pb_s = 2048 // (PMAX * st_bytes)
        pb_x = 2048 // (PMAX * x_bytes)
        per_sub = (H + pb_s - 1) // pb_s + (T + pb_x - 1) // pb_x
    batch = BATCH
    while batch > 1:
        ybanks = (T * batch * SUB * 4 + 2047) // 2048     # float32 accumulators
        if 2 * batch * per_sub + ybanks <= 8:
            break
        batch = batch - 1
    return batch


def _front(unit, j_list, w_all, b_all, has_bias, R, Pn, s0, H, T, W):
    """Pipeline stage 1 of a step: TensorE transposes of the window columns of each
    sub-tile, ScalarE first tap plus bias (scaled copy out of PSUM) into float32
    accumulators."""
    st, xs = unit
    P = R * Pn
    subs = []
    for entry in j_list:
        j0, w = entry
        s = s0 + j0 // SUB
        win = _window_tiles(st, xs, P, j0, w, H, T)
        accs = []
        for t in range(T):
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


def _middle(subs, w_all, R, Pn, T, W):
    """Stage 2: VectorE multiply-adds of the other taps; independent accumulators are
    interleaved so no instruction waits on the one just before it."""
    for k in range(1, W):
        for t in range(T):
            for entry in subs:
                j0, w, s, win, accs = entry
                ps, slot = win[t + k]
                for r in range(R):
                    a, b = r * Pn, (r + 1) * Pn
                    nisa.scalar_tensor_tensor(dst=accs[t][0:w, a:b], data=ps[0:w, slot, a:b],
                                              op0=nl.multiply,
                                              operand0=w_all[0:w, r, s, k:k + 1],
                                              op1=nl.add, operand1=accs[t][0:w, a:b])


def _back(subs, yt, valid_col, R, Pn, T, act_op):
    """Stage 3: TensorE transposes the float32 accumulators back to rows; one ScalarE
    instruction applies the activation to valid * acc (padding rows give act(0) = 0)
    while evicting into the rows' output tile."""
    P = R * Pn
    j_first = subs[0][0]
    span = 0
    ps_y = nl.ndarray((PMAX, T, len(subs) * SUB), dtype=nl.float32, buffer=nl.psum)
    for entry in subs:
        j0, w, s, win, accs = entry
        for t in range(T):
            nisa.nc_transpose(dst=ps_y[0:P, t, j0 - j_first:j0 - j_first + w],
                              data=accs[t][0:w, 0:P])
        span = j0 - j_first + w
    nisa.activation(dst=yt[0:P, :, j_first:j_first + span], op=act_op, data=ps_y[0:P, :, 0:span],
                    scale=valid_col)


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


def _front_mm(unit, j_list, P, s0, H, T):
    """TensorE-taps stage 1: transposes of the window columns to channel-major, evicted by
    VectorE to SBUF (matmul operands live in SBUF) as [128 ch, H+T, rows]."""
    st, xs = unit
    subs = []
    for entry in j_list:
        j0, w = entry
        win = _window_tiles(st, xs, P, j0, w, H, T)
        wsb = nl.ndarray((SUB, H + T, PMAX), dtype=st.dtype, buffer=nl.sbuf)
        i0 = 0
        while i0 < H + T:
            ps, slot = win[i0]
            n = 1
            while i0 + n < H + T and win[i0 + n][0] == ps:
                n = n + 1
            nisa.tensor_copy(dst=wsb[0:w, i0:i0 + n, 0:P], src=ps[0:w, slot:slot + n, 0:P],
                             engine=nisa.engine.vector)
            i0 = i0 + n
        subs.append((j0, w, s0 + j0 // SUB, wsb))
    return subs


def _middle_mm(subs, diag, c_s0, b_row, ones, P, T, W, has_bias):
    """TensorE-taps stage 2: psum[rows, ch] (+)= window_k[ch, rows].T @ diag(w_k), plus a
    K=1 bias matmul; the result comes out row-major, no transpose back."""
    j_first = subs[0][0]
    ps_o = nl.ndarray((PMAX, T, len(subs) * SUB), dtype=nl.float32, buffer=nl.psum)
    for entry in subs:
        j0, w, s, wsb = entry
        col = j0 - j_first
        for t in range(T):
            if has_bias:
                nisa.nc_matmul(dst=ps_o[0:P, t, col:col + w], stationary=ones[0:1, 0:P],
                               moving=b_row[0:1, s * SUB:s * SUB + w], accumulate=False)
            for k in range(W):
                nisa.nc_matmul(dst=ps_o[0:P, t, col:col + w], stationary=wsb[0:w, t + k, 0:P],
                               moving=diag[0:w, s - c_s0, k, 0:w],
                               accumulate=has_bias or k > 0)
    return ps_o


@nki.jit
def short_conv_decode_kernel(x, weight, bias, pool_flat, rows, valid, activation, has_bias, R,
                             tensor_taps):
    """x ``[num_seqs, T, dim]``; weight ``[dim, W]``; bias ``[dim]`` or None;
    pool_flat ``[slots * R, (dim / R) * (W-1)]`` (the pool, updated in place);
    rows int32 ``[num_seqs * R]`` in the kernel's row order (group-wise,
    block-major: ``slot * R + r``, or ``slots * R`` = out of bounds for
    padding); valid float32 ``[num_seqs * R]`` (1 live, 0 padding);
    activation "silu" or "none"; R channel blocks per sequence; tensor_taps:
    do the taps as TensorE matmuls with diagonal weights (launcher: R == 1,
    bfloat16 x and pool, weights / bias holding bfloat16 values) instead of
    ScalarE + VectorE multiply-adds. Returns y ``[num_seqs, T, dim]`` in x's
    dtype.

    Steps of BATCH sub-tiles run as a three-stage software pipeline: the
    transposes and first tap of step i+1 are issued before the multiply-adds
    and outputs of step i, so TensorE, VectorE and ScalarE overlap.
    """
    N, T, dim = x.shape
    W = weight.shape[1]
    H = W - 1
    D = dim // R
    Ng = PMAX // R                 # sequences per group
    nsub = (D + SUB - 1) // SUB
    act_op = nl.silu if activation == "silu" else nl.copy
    y = nl.ndarray((N, T, dim), dtype=x.dtype, buffer=nl.shared_hbm)

    groups = []                    # (first sequence, sequences); its rows start at R * n0
    for n0 in range(0, N, Ng):
        groups.append((n0, min(Ng, N - n0)))
    x_bytes = _nbytes(x.dtype)
    pool_bytes = _nbytes(pool_flat.dtype)
    CD = _chunk_channels(len(groups), T, H, x_bytes, pool_bytes, D)
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

    # run-time row indices and masks of every group, one column each
    g_rows = []
    g_valid = []
    for entry in groups:
        n0, Pn = entry
        P = R * Pn
        r = nl.ndarray((PMAX, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=r[0:P, :], src=rows.ap(pattern=[[1, P], [1, 1]], offset=R * n0))
        v = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=v[0:P, :], src=valid.ap(pattern=[[1, P], [1, 1]], offset=R * n0))
        g_rows.append(r)
        g_valid.append(v)

    # Gathers run PD chunks ahead of the scatters: a scatter into the pool orders every
    # later pool read (slots are run-time data); all up front for small batches.
    chunk_bytes = len(groups) * CD * (H * pool_bytes + T * x_bytes)
    PD = max(1, min(len(chunks) - 1, LOAD_BUDGET // chunk_bytes - 1))
    loads = []
    for ci in range(len(chunks)):
        loads.append(None)
    for ci in range(min(PD, len(chunks))):
        loads[ci] = _load_chunk(x, pool_flat, g_rows, groups, chunks[ci], R, D, H, CD)

    # pipeline steps: (chunk, group, sub-tiles [(j0, width)], last step of the unit)
    batch = _psum_plan(pool_bytes, x_bytes, pool_flat.dtype == x.dtype, H, T)
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
    steps = []
    for ci in range(len(chunks)):
        cd = chunks[ci][1]
        for gi in range(len(groups)):
            subs = []
            for j0 in range(0, cd, SUB):
                subs.append((j0, min(SUB, cd - j0)))
            for b0 in range(0, len(subs), batch):
                b1 = min(b0 + batch, len(subs))      # NKI: no slice past the end
                steps.append((ci, gi, subs[b0:b1], b1 == len(subs)))

    units = []                     # per (chunk, group): (state, x, output tile), while live
    for ci in range(len(chunks)):
        units.append(None)
    prev = None
    for i in range(len(steps) + 1):
        nxt = None
        if i < len(steps):
            ci, gi, j_list, last = steps[i]
            if units[ci] == None:  # noqa: E711  first step of chunk ci
                if ci + PD < len(chunks):
                    loads[ci + PD] = _load_chunk(x, pool_flat, g_rows, groups,
                                                 chunks[ci + PD], R, D, H, CD)
                if tensor_taps:
                    diags[ci] = _chunk_diagonals(ident, w_all, chunks[ci][0] // SUB,
                                                 (chunks[ci][1] + SUB - 1) // SUB, D, W,
                                                 nl.bfloat16)
                units[ci] = []
                for gj in range(len(groups)):
                    yt = nl.ndarray((PMAX, T, CD), dtype=x.dtype, buffer=nl.sbuf)
                    units[ci].append((loads[ci][gj][0], loads[ci][gj][1], yt))
                loads[ci] = None
            st, xs, yt = units[ci][gi]
            if tensor_taps:
                front = _front_mm((st, xs), j_list, R * groups[gi][1], chunks[ci][0] // SUB,
                                  H, T)
            else:
                front = _front((st, xs), j_list, w_all, b_all, has_bias, R, groups[gi][1],
                               chunks[ci][0] // SUB, H, T, W)
            nxt = (ci, gi, last, front)
        if prev != None:  # noqa: E711
            pci, pgi, plast, subs = prev
            n0, Pn = groups[pgi]
            P = R * Pn
            c0, cd = chunks[pci]
            st, xs, yt = units[pci][pgi]
            if tensor_taps:
                ps_o = _middle_mm(subs, diags[pci], c0 // SUB, b_row, ones, P, T, W, has_bias)
                span = subs[-1][0] + subs[-1][1] - subs[0][0]
                nisa.activation(dst=yt[0:P, :, subs[0][0]:subs[0][0] + span], op=act_op,
                                data=ps_o[0:P, :, 0:span], scale=g_valid[pgi][0:P, :])
            else:
                _middle(subs, w_all, R, Pn, T, W)
                _back(subs, yt, g_valid[pgi][0:P, :], R, Pn, T, act_op)
            if plast:
                nisa.dma_copy(dst=y.ap(pattern=[[D, R], [T * dim, Pn], [dim, T], [1, cd]],
                                       offset=n0 * T * dim + c0),
                              src=yt[0:P, :, 0:cd])
                # new state = window columns T .. T+W-2, contiguous rows for one scatter
                ns = nl.ndarray((PMAX, CD, H), dtype=pool_flat.dtype, buffer=nl.sbuf)
                for jj in range(H):
                    col = T + jj
                    if col < H:
                        src = st[0:P, 0:cd, col]
                    else:
                        src = xs[0:P, col - H, 0:cd]
                    nisa.tensor_copy(dst=ns[0:P, 0:cd, jj], src=src, engine=nisa.engine.scalar)
                nisa.dma_copy(dst=pool_flat.ap(pattern=[[D * H, P], [H, cd], [1, H]],
                                               offset=c0 * H, vector_offset=g_rows[pgi][0:P, :],
                                               indirect_dim=0),
                              src=ns[0:P, 0:cd, :], oob_mode=nisa.oob_mode.skip)
                if pgi == len(groups) - 1:
                    units[pci] = None     # the chunk's buffers die here
                    diags[pci] = None
            subs = None                   # step i-1's PSUM windows die before step i+1's
        prev = nxt
    return y
