"""Backward of the short causal depthwise conv1d over a ragged batch (training form: each
sequence starts from its own initial state and returns its final state; no pool).

Math (per sequence of L tokens, H = W - 1, the window stream ``xx = (initial state ++
x)`` of L + H positions; ``nki_ssm.reference.short_conv_backward``)::

    z[i]   = bias + sum_k w[:, k] * xx[i + k]          dz[i] = dy[i] * act'(z[i])
    dxx[p] = sum_k w[:, k] * dz[p - k]  (0 <= p-k < L)  + d_final[p - L]  (p >= L)
    dx = dxx[H:], d_initial = dxx[:H], dweight[:, k] = sum_i dz[i] xx[i + k], dbias = sum dz

Shapes (DP = dim padded to a multiple of 128 * programs, NB the token bucket, SB the
sequence bucket, T = 384 window positions per work row in BLOCKS = 3 blocks of 128):

- ``xsrc [NB + SB*H + 1, DP]`` (x's dtype, float32 or bfloat16): the x rows, then each
  sequence's initial state token-major (sequence n, column h at row NB + n*H + h), then
  zero rows (the last row is zero: every window position outside a sequence reads it);
- ``dysrc [NB + 1, DP]`` (x's dtype): dy rows, then a zero row (row NB);
- ``weight [DP, W]`` float32, ``bias [DP]`` float32 or None;
- ``dfsrc [SB*H + 1, DP]`` float32 or None: d_final_states token-major (row n*H + h);
- ``rows [R + 1, 128, 3 * BLOCKS + 2]`` int32, the work list: a work row per T window
  positions ``p0 .. p0 + T`` of a sequence (``ceil((L + H) / T)`` per sequence, so an
  empty sequence has one). Per partition q: columns 0 .. BLOCKS the xsrc rows of window
  positions ``p0 - H + b*128 + q`` (then ``p0 - H + T + q``, q < 2H); columns BLOCKS+1 ..
  2*BLOCKS+1 the dysrc rows of tokens ``p0 - H + b*128 + q`` (then ``p0 - H + T + q``, q <
  H); columns 2*BLOCKS+2 .. the dxo rows of positions ``p0 + b*128 + q`` (a token row, an
  initial-state row NB + n*H + p, or a scratch row past the sequence). Table row r holds
  work row r's gather columns and dx rows;
- ``fs_rows [SB, H, 2]`` int32: per sequence, the dxo row of position L + h and the dfsrc
  row of d_final[h]; ``counts [1, 2]`` int32, the one row both programs read: work rows,
  sequences with d_final_states;
- outputs: per program ``dxo [NB + SB*H + T, DP / programs]`` (x's dtype; its channels:
  dx rows, then d_initial rows, then scratch), ``dweight [DP, W]`` and ``dbias [DP]`` float32.

Design note
-----------
Loops: per channel group (SUM_TILES = 4 tiles of 128 channels for 2-byte x with W <= 4,
16 for other 2-byte x, 8 for float32) two
top-level ``nl.fori_loop`` s over the work rows (the same list for every group: a group's
channels are compile-time offsets), the first ROWS_PER_ITERATION = 6 rows per iteration,
the second the rows left, one per iteration; then, with d_final_states, one top-level
loop over sequences. No loop inside another; bounds are ``NkiScalar`` s loaded
(``scaffold.trip_counts``) from an SBUF copy of ``counts`` before the loops; everything
unrolled in a body is bounded by the group and W. Program size depends on DP, W, dtypes
and flags only (15,894 static instructions at dim 8192, W 4, bfloat16, LNC=1: the first
row loop's body holds 6 rows).

Per work row and group: one DMA loads the table row (the row's ``NkiScalar`` index as
``scalar_offset``), then the row's windows, the x window (T + 2H positions) and the dy
window (T + H tokens): for 2-byte x one indirect ``dma_transpose`` (gather transpose,
software DGE; the table's gather columns copied to uint32 by GpSimd) each, straight to
channel-major ``[128 ch, tiles, rows]`` (rows rounded up to 16: zero rows); for float32
x (the gather transpose takes 2-byte dtypes only) ``vector_offset`` gathers (one xsrc /
dysrc row per partition), token-major. Positions outside the sequence read the zero row,
so no masks and no conditionals. The rows of an iteration alternate two buffer sets (table row, windows, dx
tile): row r + 2's loads are issued as soon as row r is done with its set, so they
arrive under row r + 1's stages. The iteration loads all it reads (no SBUF prefetch
across iterations: nki-library turns it off for dynamic loops, NKI-1582), so only its
first row waits for its windows, and it allocates its PSUM banks. Each 128-channel tile then
runs seven stages, issued as a wavefront (stage q of tile t - q at step t) so every
engine's in-order queue holds several tiles' work:

0. float32 x only: TensorE transposes the x window to channel-major (matmuls against
   an identity);
1. float32 x only: ScalarE evicts it (``xw``);
2. TensorE: (float32 x: the dy window transposed;) with SiLU the W taps of z (``diag(w_k)``
   stationary, the shifted x window moving); ScalarE ``s = silu'(z + b)`` by
   ``nl.silu_dx`` (float32; the only ScalarE function: no activation-table switches);
3. GpSimd (float32 x: VectorE, dy in PSUM): ``dz = dy * s`` (x's dtype);
4. TensorE: the W dx taps per 128-position block (the shifted dz window stationary,
   ``diag(w_k)`` moving: dx comes out token-major);
5. VectorE: dx's PSUM eviction; the dweight products ``dz * xx[. + k]`` over the row's
   own tokens, all W taps in one instruction (dz repeated by a zero stride, the x
   window at W shifts; GPSIMD_TAPS of them can go to GpSimd, at a quarter of VectorE's
   rate);
6. ScalarE: the products (and, with a bias, dz) summed over tokens (activation
   accumulate) into the tile's dweight (/ dbias) columns. Without a bias the launcher
   returns no dbias: it is not computed (the kernel's dbias output is zeros).

2-byte x with W <= 4 (the model convs) moves the dweight sums to TensorE instead
(``tsum``): the products are bfloat16 (VectorE perf mode) and stage 6 folds them onto
the partitions -- per 128-token block and tap a TensorE transpose (the products
stationary, the identity moving) accumulating in the tile's PSUM sum bank
``[128 q, W * 128]`` over the blocks and the iteration's rows (the first row opens it:
PSUM is allocated and written inside the loop body only); after the iteration VectorE
adds each bank into the group's float32 ``fsum``, and after the group's loops a float32
matmul per tile and tap against a ones column sums ``fsum`` over the 128 partitions
(dweight[c, k] = sum_q fsum[q, k*128 + c]; a fixed order, the same at LNC=1 and 2).
W sum banks per group leave 4 banks for z and dx, so a group is 4 tiles; the
iteration's (row, tile) units then run as one wavefront (SUM_STEPS: a free step after
silu_dx and after dz, so the TensorE -> ScalarE -> GpSimd -> TensorE chain has slack),
with one buffer set per row (SUM_SETS = 6: the next iteration's loads wait on nothing
of this one), dz rotating over 4 buffers, dx evicted by ScalarE and every DZ_VECTOR-th
unit's dz on VectorE (GpSimd also generates the four times more gather descriptors).

The row's dx blocks go out by ``vector_offset`` scatters; the
per-row sums are added into float32 accumulators, stored after the group's loop. A
token's products are counted by the one row whose window holds it at columns H .. H+T.
The d_final loop then reads back the H dxo rows of positions L .. L+H-1 of each
sequence, adds d_final (VectorE) and writes them again.

Saved vs recomputed: the forward saves nothing beyond its inputs (x, weight, bias and
the initial states the caller holds); z and silu'(z) are recomputed here (W TensorE
taps per tile), so training costs 0 extra bytes per token of activation memory.

What binds (modeled, trn2, the cost model of this commit; dim 8192, W 4, bfloat16, no
bias, 16K tokens, LNC=1, the TensorE sums): VectorE (per unit: the bf16 products over
W x T columns, a quarter of the dz products, the iteration's sum-bank adds; ~80 % busy),
TensorE (z taps, dx taps, the product transposes: ~70 %), GpSimd (dz, the gather
descriptors of 4-tile groups: ~65 %), DMA (~40 %), ScalarE (silu_dx, dx eviction:
~35 %); the rest is pipeline latency (each iteration's first loads, fill and drain).
16K: 7.5 ms (figures and command in ``nki_ssm.ops.launch.short_conv_backward``). Next:
fewer VectorE elements per unit (the products are the floor of this layout) and fewer
software-DGE DMAs per row (the dx scatters, 3 per row and group).

LNC: the channel tiles split evenly between the programs (DP is padded to 128 * programs
channels): program ``nl.program_id(0)`` takes tiles ``pid * NTP .. (pid + 1) * NTP``, runs
the same loops over the same work list on its own channels, writes only its own columns
of dweight and dbias and its own dxo tensor (the scratch rows too), and reduces dweight / dbias over
tokens itself: no cross-program reduction, results bit-identical to LNC=1.

Limits: 2 <= W <= 65 (2H <= 128 rows in the tail gather); any dim; any lengths (empty
sequences, T = 1, T < W); float32 x: float32 matmuls (quarter rate); bfloat16 x:
bfloat16 matmul operands (weights rounded to bfloat16 in the diagonals) and dz in
bfloat16, float32 accumulation, float32 dweight / dbias.
"""
from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels._common import identity
from nki_ssm.kernels.scaffold import lnc_grid, trip_counts, work_loop

TILE = 128          # channels per tile; rows per gather block
BLOCKS = 3          # 128-position blocks per work row
ROW = BLOCKS * TILE  # T: window positions whose dx a work row writes (T + 2H <= 512)
GROUP_TILES = 16    # channel tiles per group (one loop each; 8 for float32 x)
BANK = 512          # float32 columns of one PSUM bank
TABLE_COLUMNS = 3 * BLOCKS + 2   # index columns of a work row (x, dy, dx blocks)
FS_COLUMNS = 2048   # channels per d_final read-modify-write block
GPSIMD_TAPS = 0     # dweight product taps on GpSimd (the rest on VectorE)
SUM_TILES = 4       # 2-byte x, W <= 4: channel tiles per group (one PSUM sum bank each)
DZ_VECTOR = 4       # 2-byte x, W <= 4: every fourth unit's dz on VectorE (the rest GpSimd)
SUM_SETS = 6        # 2-byte x, W <= 4: work-row buffer sets (one per row of an iteration)
ROWS_PER_ITERATION = 6   # work rows per iteration of the first row loop (its first waits)


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


def _gather(src, dst, idx, col, rows, c0, gw):
    """dst[0:rows, 0:gw] = rows ``idx[0:rows, col]`` of HBM ``src`` from channel c0 (one
    row per partition)."""
    nisa.dma_copy(dst=dst[0:rows, 0:gw],
                  src=src.ap(pattern=[[src.shape[1], rows], [1, gw]], offset=c0,
                             vector_offset=idx[0:rows, col:col + 1], indirect_dim=0))


def _transpose_in(ps, g, cols, ident, tail):
    """``ps[:, 0:T + tail]`` = the gathered rows of ``g`` (BLOCKS blocks of 128, then
    ``tail`` rows) for channel block ``cols``, channel-major: TensorE, the rows as
    stationary against an identity."""
    for b in range(BLOCKS):
        nisa.nc_matmul(dst=ps[:, b * TILE:(b + 1) * TILE], stationary=g[:, b, cols],
                       moving=ident, accumulate=False)
    nisa.nc_matmul(dst=ps[:, ROW:ROW + tail], stationary=g[0:tail, BLOCKS, cols],
                   moving=ident[0:tail, 0:tail], accumulate=False)


def _dz_engine(tdma, sums, u):
    """The engine of unit u's dz product: float32 x VectorE; 2-byte x GpSimd, and with the
    folded dweight sums every DZ_VECTOR-th unit's on VectorE (GpSimd also generates the
    gather descriptors of the smaller groups)."""
    if not tdma:
        return nisa.engine.vector
    if sums != None and u % DZ_VECTOR == DZ_VECTOR - 1:  # noqa: E711
        return nisa.engine.vector
    return nisa.engine.gpsimd


def _stage(bufs, red, st, j, W, silu, u=None, n=0):
    """Stage ``st`` of channel tile j of a work row (module design note): 0 x window
    transposes, 1 its ScalarE eviction (both float32 x only); 2 dy transposes (float32 x),
    z taps, silu_dx; 3 dz; 4 dx taps;
    5 dx eviction and the dweight products; 6 the dweight / dbias sums. Each stage's PSUM
    and SBUF buffers alternate by tile (two of each), which the one-step skew between
    consecutive stages allows."""
    (ident, xg, dg, xw, dzm, sg, zb, uv, out, banks, diag, bcol, has_bias) = bufs
    prods, junk, redw, redb, sums = red
    H = W - 1
    T = ROW
    D = T + H
    cols = slice(j * TILE, (j + 1) * TILE)
    if u == None:  # noqa: E711
        u = j
    # buffers alternate by the unit's parity (u: its place in the iteration's wavefront)
    psx, psd, psz, pso = banks[u % 2], banks[2 + u % 2], banks[4 + u % 2], banks[6 + u % 2]
    s = sg[u % len(sg)]
    tdma = xg == None  # noqa: E711  (windows gather-transposed: channel-major already)
    if st == 0:
        if not tdma:
            _transpose_in(psx, xg, cols, ident, 2 * H)
    elif st == 1:
        if tdma:
            return
        nisa.tensor_copy(dst=xw[:, j, :], src=psx[:, 0:T + 2 * H], engine=nisa.engine.scalar)
    elif st == 2:
        if not tdma:
            _transpose_in(psd, dg, cols, ident, H)
        if silu:
            for k in range(W):
                nisa.nc_matmul(dst=psz[:, 0:D], stationary=diag[:, j, k, :],
                               moving=xw[:, j, k:k + D], accumulate=k > 0)
            # s = silu'(z + b) (nl.silu_dx: the one ScalarE function, no activation-table
            # switches)
            nisa.activation(dst=s, op=nl.silu_dx, data=psz[:, 0:D], bias=bcol[:, j:j + 1])
    elif st == 3:
        if tdma:
            dyv = dg[:, j, 0:D]
        else:
            dyv = psd[:, 0:D]
        if not silu:
            nisa.tensor_copy(dst=dzm[:, j, :], src=dyv, engine=nisa.engine.vector)
            return
        # dz = dy * silu'(z + b) (x's dtype)
        nisa.tensor_tensor(dst=dzm[:, j, :], data1=s, data2=dyv, op=nl.multiply,
                           engine=_dz_engine(tdma, sums, u))
    elif st == 4:
        for b in range(BLOCKS):
            for k in range(W):
                # dx[p0 + b*128 + q] += w_k * dz[p0 + b*128 + q - k]: dz window column
                # b*128 + q + H - k
                c = b * TILE + H - k
                nisa.nc_matmul(dst=pso[:, b * TILE:(b + 1) * TILE],
                               stationary=dzm[:, j, c:c + TILE], moving=diag[:, j, k, :],
                               accumulate=k > 0)
    elif st == 5:
        nisa.tensor_copy(dst=out[:, :, cols],
                         src=pso.ap(pattern=[[BANK, TILE], [TILE, BLOCKS], [1, TILE]], offset=0),
                         engine=nisa.engine.vector if sums == None  # noqa: E711
                         else nisa.engine.scalar)
        # dweight products over the row's own tokens (dz window columns H .. H+T): dz
        # repeated by a zero stride against the x window at several shifts, tap 0 on
        # GpSimd (a quarter of VectorE's rate), the others in one VectorE instruction
        F = xw.shape[2]
        for part in ((0, GPSIMD_TAPS, nisa.engine.gpsimd),
                     (GPSIMD_TAPS, W - GPSIMD_TAPS, nisa.engine.vector)):
            k0, nk, engine = part
            if nk > 0:
                nisa.tensor_tensor(
                    dst=prods[u % 2][:, k0:k0 + nk, :],
                    data1=dzm.ap(pattern=[[dzm.shape[1] * D, TILE], [0, nk], [1, T]],
                                 offset=j * D + H),
                    data2=xw.ap(pattern=[[xw.shape[1] * F, TILE], [1, nk], [1, T]],
                                offset=j * F + H + k0),
                    op=nl.multiply, engine=engine)
    elif sums != None:  # noqa: E711
        # the products (bfloat16) folded onto the partitions: TensorE transposes them a
        # 128-token block at a time, accumulating in the tile's PSUM sum bank over the
        # blocks and the iteration's work rows (sums[j][q, k*128 + c] = sum of the
        # products of tap k, channel c at tokens = q mod 128); the iteration's first
        # row opens the bank
        for b in range(BLOCKS):
            for k in range(W):
                nisa.nc_matmul(dst=sums[j][:, k * TILE:(k + 1) * TILE],
                               stationary=prods[u % 2][:, k, b * TILE:(b + 1) * TILE],
                               moving=ident, accumulate=u >= n or b > 0)
        if has_bias:
            nisa.activation(dst=junk, op=nl.copy, data=dzm[:, j, H:H + T], reduce_op=nl.add,
                            reduce_res=redb[:, j:j + 1],
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
    else:
        for k in range(W):
            nisa.activation(dst=junk, op=nl.copy, data=prods[u % 2][:, k, :],
                            reduce_op=nl.add,
                            reduce_res=redw[:, j, k:k + 1],
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
        if has_bias:
            # dbias (without a bias the launcher returns no dbias: not computed)
            nisa.activation(dst=junk, op=nl.copy, data=dzm[:, j, H:H + T], reduce_op=nl.add,
                            reduce_res=redb[:, j:j + 1],
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)


STAGES = 7
# stages issued together for one tile (one wavefront step each)
STEPS = ((0,), (1,), (2,), (3,), (4,), (5,), (6,))
# 2-byte x, W <= 4 (one wavefront over the rows): a free step after silu_dx and after dz,
# so the TensorE -> ScalarE -> GpSimd -> TensorE chain has a step of slack each
SUM_STEPS = ((0,), (1,), (2,), (), (3,), (), (4,), (5,), (6,))


def _gather_windows(xsrc, dysrc, xg, dg, idx, c0, gw, H):
    """The x window (BLOCKS blocks of 128 positions, then 2H) and the dy window (BLOCKS
    blocks, then H tokens) of a work row, token-major, by the index columns in ``idx``."""
    for b in range(BLOCKS):
        _gather(xsrc, xg[:, b, :], idx, b, TILE, c0, gw)
        _gather(dysrc, dg[:, b, :], idx, BLOCKS + 1 + b, TILE, c0, gw)
    _gather(xsrc, xg[:, BLOCKS, :], idx, BLOCKS, 2 * H, c0, gw)
    _gather(dysrc, dg[:, BLOCKS, :], idx, 2 * BLOCKS + 1, H, c0, gw)


def _gather_transpose(src, dst, idx, rows, c0, n):
    """``dst[:, 0:n, 0:rows]`` (channel-major, x's 2-byte dtype) = the HBM rows of ``src``
    listed column-major in ``idx [128, 4]`` (uint32), channels c0 + j*128 + p: one
    indirect ``dma_transpose`` (gather transpose, software DGE)."""
    RB = dst.shape[2]
    row = dst.shape[1] * RB
    nisa.dma_transpose(dst=dst.ap(pattern=[[row, TILE], [RB, n], [1, 1], [1, rows]], offset=0),
                       src=src.ap(pattern=[[src.shape[1], rows], [TILE, n], [1, 1], [1, TILE]],
                                  offset=c0, vector_offset=idx, indirect_dim=0),
                       axes=(3, 1, 2, 0))


def _load_row(i, rows, rset, xsrc, dysrc, c0, gw, H):
    """Work row i's table row (gather indices and dx rows) and windows into the buffer set
    ``rset = (idx, xg, dg, out, xt, idxu)``: 2-byte x by two gather transposes (x window
    into ``xt``, dy window into ``dg``, both channel-major; their indices as uint32 in
    ``idxu``), float32 x by token-major row gathers into ``xg`` / ``dg``."""
    idx, xg, dg, out, xt, idxu = rset
    nisa.dma_copy(dst=idx, src=rows.ap(pattern=[[TABLE_COLUMNS, TILE], [1, TABLE_COLUMNS]],
                                       offset=0, scalar_offset=i, indirect_dim=0))
    if xg != None:  # noqa: E711
        _gather_windows(xsrc, dysrc, xg, dg, idx, c0, gw, H)
        return
    n = gw // TILE
    nisa.tensor_copy(dst=idxu, src=idx[:, 0:2 * BLOCKS + 2], engine=nisa.engine.gpsimd)
    _gather_transpose(xsrc, xt, idxu[:, 0:BLOCKS + 1], xt.shape[2], c0, n)
    _gather_transpose(dysrc, dg, idxu[:, BLOCKS + 1:2 * BLOCKS + 2], dg.shape[2], c0, n)


def _rows(first, count, rows, sets, xsrc, dysrc, dxo, dx_off, bufs, red, acc, c0, n, W, silu):
    """``count`` consecutive work rows from row ``first`` (an NkiScalar) for the group's n
    tiles at channel c0, in one loop iteration: rows alternate the two buffer sets, row r +
    2's table row and windows load as soon as row r is done with its set, so they arrive
    under row r + 1's stages. Everything the iteration reads is loaded by it (no SBUF
    prefetch across the runtime loop's iterations: nki-library turns it off for dynamic
    loops, NKI-1582): only its first row waits for its windows. Its PSUM banks are
    allocated here, in the loop body."""
    (ident, xg, dg, xw, dzm, sg, zb, uv, out, banks, diag, bcol, has_bias) = bufs
    acc_w, acc_b = acc
    prods, junk, redw, redb, facc = red
    H = W - 1
    gw = n * TILE
    banks = []
    sums = None
    if facc != None:  # noqa: E711  (no transposes in: their banks hold the folded sums)
        sums = []
        for j in range(n):
            sums.append(nl.ndarray((TILE, BANK), dtype=nl.float32, buffer=nl.psum))
    for b in range(8):
        if sums != None and b < 4:  # noqa: E711
            banks.append(None)
        else:
            banks.append(nl.ndarray((TILE, BANK), dtype=nl.float32, buffer=nl.psum))
    red = (prods, junk, redw, redb, sums)
    S = len(sets)
    for j in range(min(S, count)):
        _load_row(first + j, rows, sets[j], xsrc, dysrc, c0, gw, H)
    rbufs = []
    for r in range(count):
        idx, xg, dg, out, xt, idxu = sets[r % S]
        xwr = xw
        if xt != None:  # noqa: E711
            xwr = xt
        dzr = dzm[0]
        if sums != None:  # noqa: E711
            # one wavefront over the rows: dz rotates over 4 buffers (row r + 4's dz is
            # written after row r's last reader, the dbias sum, even with 1 tile)
            dzr = dzm[r % len(dzm)]
        rbufs.append((ident, xg, dg, xwr, dzr, sg, zb, uv, out, banks, diag, bcol, has_bias))

    def finish(r):
        idx, xg, dg, out, xt, idxu = sets[r % S]
        for b in range(BLOCKS):
            # dxo: this program's own tensor, its channels from the program's first
            nisa.dma_copy(dst=dxo.ap(pattern=[[dxo.shape[1], TILE], [1, gw]], offset=dx_off,
                                     vector_offset=idx[:, 2 * BLOCKS + 2 + b:2 * BLOCKS + 3 + b],
                                     indirect_dim=0),
                          src=out[:, b, 0:gw])
        if sums == None:  # noqa: E711
            nisa.tensor_tensor(dst=acc_w[:, 0:n, :], data1=acc_w[:, 0:n, :],
                               data2=redw[:, 0:n, :], op=nl.add)
        if has_bias:
            nisa.tensor_tensor(dst=acc_b[:, 0:n], data1=acc_b[:, 0:n], data2=redb[:, 0:n],
                               op=nl.add)
        if r + S < count:
            _load_row(first + r + S, rows, sets[r % S], xsrc, dysrc, c0, gw, H)

    if sums == None:  # noqa: E711
        for r in range(count):
            # the tiles' stages as a wavefront: at step t, stage q of tile t - q (oldest
            # first), so each engine's in-order queue holds work of several tiles at once
            for t in range(n + len(STEPS) - 1):
                for q in range(len(STEPS) - 1, -1, -1):
                    if 0 <= t - q < n:
                        for st in STEPS[q]:
                            _stage(rbufs[r], red, st, t - q, W, silu)
            finish(r)
        return
    # one wavefront over all the iteration's (row, tile) units, u = r*n + j: at step t,
    # stage q of unit t - q; a row finishes (dx out, its buffer set reloaded S rows
    # ahead) once its last unit is through
    U = count * n
    for t in range(U + len(SUM_STEPS) - 1):
        for q in range(len(SUM_STEPS) - 1, -1, -1):
            u = t - q
            if 0 <= u < U:
                for st in SUM_STEPS[q]:
                    _stage(rbufs[u // n], red, st, u % n, W, silu, u, n)
        u = t - (len(SUM_STEPS) - 1)
        if 0 <= u < U and u % n == n - 1:
            finish(u // n)
    # the iteration's folded sums into the group's float32 accumulator (VectorE)
    for j in range(n):
        nisa.tensor_tensor(dst=facc[:, j, :], data1=facc[:, j, :],
                           data2=sums[j][:, 0:W * TILE], op=nl.add)


def _final_state_grads(f, fs_rows, dfsrc, dxo, dx_off, fbufs, cp0, H):
    """Sequence f: dxo rows of positions L .. L+H-1 += d_final (read, add, write back),
    over the program's channels [cp0, cp0 + PW) (its dxo block at element ``dx_off``)."""
    fi, cur, dfv, new = fbufs
    PW = dxo.shape[1]
    DP = dfsrc.shape[1]
    nisa.dma_copy(dst=fi, src=fs_rows.ap(pattern=[[2, H], [1, 2]], offset=0, scalar_offset=f,
                                         indirect_dim=0))
    for b0 in range(0, PW, FS_COLUMNS):
        bw = min(FS_COLUMNS, PW - b0)
        nisa.dma_copy(dst=cur[:, 0:bw], src=dxo.ap(pattern=[[PW, H], [1, bw]], offset=dx_off + b0,
                                                   vector_offset=fi[:, 0:1], indirect_dim=0))
        nisa.dma_copy(dst=dfv[:, 0:bw], src=dfsrc.ap(pattern=[[DP, H], [1, bw]],
                                                     offset=cp0 + b0, vector_offset=fi[:, 1:2],
                                                     indirect_dim=0))
        nisa.tensor_tensor(dst=new[:, 0:bw], data1=cur[:, 0:bw], data2=dfv[:, 0:bw], op=nl.add)
        nisa.dma_copy(dst=dxo.ap(pattern=[[PW, H], [1, bw]], offset=dx_off + b0,
                                 vector_offset=fi[:, 0:1], indirect_dim=0),
                      src=new[:, 0:bw])


@nki.jit
def short_conv_backward_kernel(xsrc, dysrc, weight, bias, dfsrc, rows, fs_rows, counts,
                               activation):
    """dx / d_initial_states (as dxo rows), dweight, dbias of the short conv over a ragged
    batch; tensors and tables as in the module docstring; activation "silu" or "none".
    Returns (dxo ``[NB + SB*H + T, DP / programs]`` of each program in x's dtype, dweight ``[DP, W]`` float32, dbias
    ``[DP]`` float32)."""
    NX, DP = xsrc.shape
    W = weight.shape[1]
    H = W - 1
    T = ROW
    NB = dysrc.shape[0] - 1
    SB = fs_rows.shape[0]
    xdt = xsrc.dtype
    silu = activation == "silu"
    programs, pid = lnc_grid()
    NTP = DP // TILE // programs           # channel tiles of each program
    cp0 = pid * NTP * TILE
    tsum = xdt != nl.float32 and W * TILE <= BANK
    G = min(GROUP_TILES if xdt != nl.float32 else GROUP_TILES // 2, NTP)
    if tsum:
        G = min(SUM_TILES, NTP)

    # one dx tensor per program (its channels only): the programs' run-time-addressed
    # writes go to different tensors
    NR = NB + SB * H + T
    PW = NTP * TILE
    dxos = []
    for p in range(programs):
        dxos.append(nl.ndarray((NR, PW), dtype=xdt, buffer=nl.shared_hbm))
    dxo = dxos[pid]
    dx_base = 0
    dwo = nl.ndarray((DP, W), dtype=nl.float32, buffer=nl.shared_hbm)
    dbo = nl.ndarray((DP,), dtype=nl.float32, buffer=nl.shared_hbm)

    ident = identity(xdt)
    GW = G * TILE
    # two buffer sets of a work row (rows alternate them inside an iteration): its table
    # row, its gathered windows (token-major: BLOCKS blocks of 128 rows, then the tail
    # rows) and its dx tile
    # rows) and its dx tile; 2-byte x: the x / dy windows gather-transposed to
    # channel-major ``[128 ch, G, rows]`` (rows rounded up to 16: the gather transpose
    # takes a multiple of 16 rows, 32-byte aligned tile rows; the extra rows are zero rows)
    sets = []
    tdma = xdt != nl.float32
    XR = (T + 2 * H + 15) // 16 * 16
    DR = (T + H + 15) // 16 * 16
    for i in range(SUM_SETS if tsum else 2):
        idx = nl.ndarray((TILE, TABLE_COLUMNS), dtype=nl.int32, buffer=nl.sbuf)
        out = nl.ndarray((TILE, BLOCKS, GW), dtype=xdt, buffer=nl.sbuf)
        if tdma:
            sets.append((idx, None, nl.ndarray((TILE, G, DR), dtype=xdt, buffer=nl.sbuf), out,
                         nl.ndarray((TILE, G, XR), dtype=xdt, buffer=nl.sbuf),
                         nl.ndarray((TILE, 2 * BLOCKS + 2), dtype=nl.uint32, buffer=nl.sbuf)))
        else:
            sets.append((idx, nl.ndarray((TILE, BLOCKS + 1, GW), dtype=xdt, buffer=nl.sbuf),
                         nl.ndarray((TILE, BLOCKS + 1, GW), dtype=xdt, buffer=nl.sbuf), out,
                         None, None))
    xw = None
    if not tdma:
        xw = nl.ndarray((TILE, G, T + 2 * H), dtype=xdt, buffer=nl.sbuf)
    dzm = [nl.ndarray((TILE, G, T + H), dtype=xdt, buffer=nl.sbuf)]
    if tsum:
        for i in range(3):
            dzm.append(nl.ndarray((TILE, G, T + H), dtype=xdt, buffer=nl.sbuf))
    sg = []
    for i in range(4 if tsum else 2):
        sg.append(nl.ndarray((TILE, T + H), dtype=nl.float32, buffer=nl.sbuf))
    zb, uv = None, None
    wcol = nl.ndarray((TILE, G, W), dtype=nl.float32, buffer=nl.sbuf)
    bcol = nl.ndarray((TILE, G), dtype=nl.float32, buffer=nl.sbuf)
    diag = nl.ndarray((TILE, G, W, TILE), dtype=xdt, buffer=nl.sbuf)
    prods = []
    for i in range(2):
        prods.append(nl.ndarray((TILE, W, T), dtype=xdt if tsum else nl.float32,
                                buffer=nl.sbuf))
    fsum = None
    if tsum:
        # per tile of the group the folded dweight sums (fsum[q, j, k*128 + c]: the
        # products of tap k, channel c at tokens = q mod 128), float32, added from the
        # iterations' PSUM sum banks; reduced over the partitions after the group's loops
        # by matmuls against a ones column
        fsum = nl.ndarray((TILE, G, W * TILE), dtype=nl.float32, buffer=nl.sbuf)
        ones = nl.ndarray((TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
    red = (prods,
           nl.ndarray((TILE, T), dtype=nl.float32, buffer=nl.sbuf),
           nl.ndarray((TILE, G, W), dtype=nl.float32, buffer=nl.sbuf),
           nl.ndarray((TILE, G), dtype=nl.float32, buffer=nl.sbuf),
           fsum)
    acc = (nl.ndarray((TILE, G, W), dtype=nl.float32, buffer=nl.sbuf),
           nl.ndarray((TILE, G), dtype=nl.float32, buffer=nl.sbuf))
    bufs = (ident, None, None, xw, dzm, sg, zb, uv, None, None, diag, bcol,
            bias != None)  # noqa: E711
    if bias == None:  # noqa: E711
        nisa.memset(dst=bcol, value=0.0)
    # iterations of ROWS_PER_ITERATION work rows, then of one (the rows left), and sequences
    # with d_final_states: device scalars of the one counts row both programs read (the
    # programs split the channels: the same work list)
    n_main, n_tail, n_fs = trip_counts(counts)

    for g0 in range(0, NTP, G):
        n = min(G, NTP - g0)
        c0 = cp0 + g0 * TILE
        _group_weights(weight, bias, wcol, bcol, diag, ident, c0, n, W)
        nisa.memset(dst=acc[0], value=0.0)
        nisa.memset(dst=acc[1], value=0.0)
        if tsum:
            nisa.memset(dst=fsum, value=0.0)

        def main_body(i):
            _rows(i * ROWS_PER_ITERATION, ROWS_PER_ITERATION, rows, sets, xsrc, dysrc, dxo,
                  dx_base + g0 * TILE, bufs, red, acc, c0, n, W, silu)

        work_loop(n_main, main_body)

        def tail_body(i):
            _rows(n_main * ROWS_PER_ITERATION + i, 1, rows, sets, xsrc, dysrc, dxo,
                  dx_base + g0 * TILE, bufs, red, acc, c0, n, W, silu)

        work_loop(n_tail, tail_body)
        if tsum:
            # dweight[c, k] = sum over q of fsum[q, j, k*128 + c]: per tile and tap a
            # float32 matmul (the folded sums stationary, a ones column moving) into
            # column j*W + k of a PSUM bank
            dws = nl.ndarray((TILE, BANK), dtype=nl.float32, buffer=nl.psum)
            for j in range(n):
                for k in range(W):
                    nisa.nc_matmul(dst=dws[:, j * W + k:j * W + k + 1],
                                   stationary=fsum[:, j, k * TILE:(k + 1) * TILE],
                                   moving=ones, accumulate=False)
            nisa.tensor_copy(dst=acc[0][:, 0:n, :],
                             src=dws.ap(pattern=[[BANK, TILE], [W, n], [1, W]], offset=0),
                             engine=nisa.engine.vector)
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
            _final_state_grads(f, fs_rows, dfsrc, dxo, dx_base, fbufs, cp0, H)

        work_loop(n_fs, fs_body)
    outs = []
    for p in range(programs):
        outs.append(dxos[p])
    outs.append(dwo)
    outs.append(dbo)
    return tuple(outs)
