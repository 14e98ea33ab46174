"""The packed block solve of the Gated DeltaNet chunked prefill: X = (I + A)^{-1} R for
up to 4 heads at once (head h on partitions 32h..32h+31, the matrices block-diagonal over
the heads), each 32-row diagonal block inverted by nilpotent doubling, then forward
substitution over the blocks (the design note in ``chunk.py``). Plain functions: NKI
inlines the calls."""
from __future__ import annotations

from nki_ssm.backend import nl, nisa
from nki_ssm.kernels._common import tf32_view
from nki_ssm.kernels.gated_delta.chunk_utils import BLOCK


_SQUARED = 8          # the doubling squares up to N^8, then chains compact products with it


def solve_place(ATs, L, tiles, diag, off, off_dma=False, sel=None, tf=False):
    """The layout moves of a pack's solve: from the transposes ATs[i] ([j, i] layout) of the
    strictly-lower A_i [L, L] of up to PACK heads, the diagonal BLOCK-row blocks A_bb^T into
    slot b of tiles["PT"] and the off-diagonal blocks A_kb^T (k < b) into slot pair(k, b) of
    tiles["OT"], head i at partitions 32 i of each (block-diagonal over the heads: one
    matmul then serves the pack): ``diag`` / ``off`` say which. The diagonal blocks by
    SBUF-to-SBUF DMAs, partition moves no compute engine spends time on (float32, as A^T:
    a DMA never converts); the off-diagonal
    ones as one GpSimd copy per head and block row (cross-quadrant moves of <= 32
    partitions; by DMA they would put the queues on the critical path; a short last block
    falls back to DMAs, one per block), or (``off_dma``: the WY form, whose solve is off the
    state chain and whose GpSimd builds the right-hand sides) by DMAs, one per block. The
    tiles are zeroed once per launch (zero_solve)
    and these moves write the same elements every chunk, so the zeros that keep the packed
    products block-diagonal persist."""
    nbs = block_rows(L)
    nblk = len(nbs)
    W = len(ATs) * BLOCK
    pso = []
    if off and not off_dma and sel != None and nbs[nblk - 1] == BLOCK and nblk > 1:  # noqa: E711
        # the off-diagonal slots in PSUM, up to 4 per bank (W = 128 floats per slot)
        npair = nblk * (nblk - 1) // 2
        for p0 in range(0, npair, 4):
            pso.append(nl.ndarray((W, min(4, npair - p0) * W), dtype=nl.float32,
                                  buffer=nl.psum))
    for j in range(len(ATs)):
        q0 = j * BLOCK
        for b in range(nblk):
            r0 = b * BLOCK
            nb = nbs[b]
            if diag:
                nisa.dma_copy(dst=tiles["PT"][q0:q0 + nb, b, q0:q0 + nb],
                              src=ATs[j][r0:r0 + nb, r0:r0 + nb])
            if off and not off_dma and sel != None and nbs[nblk - 1] == BLOCK:  # noqa: E711
                if b + 1 < nblk:
                    _place_off_tensor(ATs[j], j, b, nblk, sel, pso, tf)
            elif off and not off_dma and b + 1 < nblk and nbs[nblk - 1] == BLOCK:
                # the row strip of blocks (b, c > b): one GpSimd copy
                p0 = _pair(b, b + 1, nblk)
                n = nblk - 1 - b
                nisa.tensor_copy(dst=tiles["OT"][q0:q0 + nb, p0:p0 + n, q0:q0 + BLOCK],
                                 src=ATs[j][r0:r0 + nb, r0 + BLOCK:L].reshape((nb, n, BLOCK)),
                                 engine=nisa.engine.gpsimd)
            elif off:
                for c in range(b + 1, nblk):
                    c0 = c * BLOCK
                    nc = nbs[c]
                    nisa.dma_copy(dst=tiles["OT"][q0:q0 + nb, _pair(b, c, nblk), q0:q0 + nc],
                                  src=ATs[j][r0:r0 + nb, c0:c0 + nc])

    for i in range(len(pso)):
        n = pso[i].shape[1] // W
        nisa.tensor_copy(dst=tiles["OT"][0:W, 4 * i:4 * i + n, :].reshape((W, n * W)),
                         src=pso[i], engine=nisa.engine.scalar)


def selections(cst):
    """The block-row selections cst["sel"] ``[128, 224]`` float32, sel[(b, m), x] =
    [x == 96 + m] (from the compact identity cst["cIb"]): the window of columns
    96 - 32 j .. 224 - 32 j is [p == 32 j + m], whose 32-row row tile at the partitions of
    block row b moves that block row to head j's quadrant (_place_off_tensor)."""
    cst["sel"] = nl.ndarray((128, 7 * BLOCK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=cst["sel"], value=0.0)
    nisa.tensor_copy(dst=cst["sel"][:, 3 * BLOCK:4 * BLOCK], src=cst["cIb"][:, 0, :])


def _place_off_tensor(AT, j, b, nblk, sel, pso, tf):
    """The off-diagonal blocks (b, c > b) of head j's A^T into the PSUM slots ``pso`` (4 per
    bank) by TensorE: one 32-row row-tile matmul per block with the selection
    [p == 32 j + m] (a window of sel, selections) as the stationary, which moves block row b (the
    partitions 32 b ..) to head j's quadrant (32 j ..) and writes zeros to the other heads'
    rows of the block's columns, so the slot comes out block-diagonal over the heads."""
    r0 = b * BLOCK
    W = pso[0].shape[0]         # the pack's partitions (its heads' quadrants)
    q0 = j * BLOCK
    s0 = 3 * BLOCK - q0
    for c in range(b + 1, nblk):
        pr = _pair(b, c, nblk)
        ps = pso[pr // 4]
        c0 = (pr % 4) * W + q0
        nisa.nc_matmul(dst=ps[:, c0:c0 + BLOCK],
                       stationary=tf32_view(sel[r0:r0 + BLOCK, s0:s0 + W], tf),
                       moving=tf32_view(AT[r0:r0 + BLOCK, c * BLOCK:(c + 1) * BLOCK], tf),
                       accumulate=False,
                       tile_position=(r0, 0), tile_size=(BLOCK, 128))


def block_rows(L):
    """Rows of each BLOCK-row block of L rows (the last may be short)."""
    nbs = []
    for r0 in range(0, L, BLOCK):
        nbs.append(min(r0 + BLOCK, L) - r0)
    return nbs


def solve_setup(npk, L, cst, mdt, tiles):
    """Setup of the packed solve X_i = (I + A_i)^{-1} B_i of up to PACK heads (blocks placed
    by solve_place): P = A_bb from P^T by TensorE transposes (one PSUM bank in the operand
    dtype, one eviction); with N = -P the diagonal blocks' inverse
    (I - N)^{-1} = (I + N)(I + N^2)(I + N^4)... starts as inv^T = I - P^T (the even powers
    need no sign). The substitution over the blocks uses the off-diagonal blocks in
    tiles["OT"].

    ``mdt`` is the doubling's TensorE operand dtype: bfloat16 for bf16 callers (the powers
    and the partial inverses are rounded; the inverse's unit diagonal stays exact and the
    off-diagonal part carries the rounding, relative to its own size), float32 otherwise.
    The substitution and the final application stay float32."""
    W = npk * BLOCK
    nbs = block_rows(L)
    nblk = len(nbs)
    PT = tiles["PT"]
    tf = mdt != nl.float32
    pk = {}
    pk["W"] = W
    # P = the transposes of P^T's blocks (float32, bit-exact), one eviction; the first
    # round's products read both as tfloat32 for bf16 callers (the rounds after it in mdt)
    pst = nl.ndarray((W, nblk * W), dtype=nl.float32, buffer=nl.psum)
    for b in range(nblk):
        nisa.nc_transpose(dst=pst[:, b * W:(b + 1) * W], data=PT[:, b, :],
                          engine=nisa.engine.tensor)
    P = nl.ndarray((W, nblk, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=P.reshape((W, nblk * W)), src=pst, engine=nisa.engine.vector)
    # inv = sum_{m < covered} N^m, kept compact: inv^T's diagonal sub-blocks
    # cinv [(h, i), b, c] = inv_hb^T[i, c] (the doubling's updates are products with it as
    # the moving operand, and a product with a compact moving operand is compact). Starts
    # as I - P^T: the compact P^T is P_b^T cI, cI [(h, m), c] = [m == c] (the compact
    # identity, a tile of its own for each block: no broadcast view as a matmul operand).
    cIb = cst["cIb"][0:W, 0:nblk, :]
    ps = nl.ndarray((W, nblk * BLOCK), dtype=nl.float32, buffer=nl.psum)
    _block_mm(ps, tf32_view(P, tf), tf32_view(cIb, tf), nblk, W)
    cinv = nl.ndarray((W, nblk, BLOCK), dtype=mdt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cinv, data1=cIb, data2=ps.reshape((W, nblk, BLOCK)),
                       op=nl.subtract)
    pk["npk"] = npk
    pk["nbs"] = nbs
    pk["P"] = tf32_view(P, tf)
    pk["PT"] = tf32_view(PT, tf)
    pk["OT"] = tiles["OT"]
    pk["cinv"] = cinv
    pk["cfin"] = nl.ndarray((W, nblk, BLOCK), dtype=nl.float32, buffer=nl.sbuf)
    pk["inv"] = nl.ndarray((W, nblk, W), dtype=nl.float32, buffer=nl.sbuf)  # final, fp32
    pk["bd"] = cst["bd"]
    pk["G"] = tiles["G"]
    pk["Xp"] = []
    pk["Z"] = []
    pk["tf"] = mdt != nl.float32     # the substitution's operands as tfloat32 (tf32_view)
    return pk


def solve_tiles(npk, L, few):
    """The packed tiles of one head group's solve (see solve_setup): P^T ``[W, blocks, W]``
    float32 (A^T's blocks as placed), the off-diagonal blocks ``[W, pairs, W]`` float32 (None
    for one block) and,
    ``few`` (the right-hand sides read where they are, place_g), the moved inverses G
    ``[L, npk, W]`` float32; zeroed by zero_solve before their first use."""
    W = npk * BLOCK
    nblk = len(block_rows(L))
    t = {}
    t["PT"] = nl.ndarray((W, nblk, W), dtype=nl.float32, buffer=nl.sbuf)
    npair = nblk * (nblk - 1) // 2
    t["OT"] = None
    if npair > 0:
        t["OT"] = nl.ndarray((W, npair, W), dtype=nl.float32, buffer=nl.sbuf)
    t["G"] = None
    if few:
        t["G"] = nl.ndarray((L, npk, W), dtype=nl.float32, buffer=nl.sbuf)
    return t


def _block_mm(ps, st, mv, na, W):
    """ps[:, b] = st[:, b]^T @ mv[:, b] for the blocks b < na of a pack: one whole-array
    matmul per block (partitions 0 .. W). ``st`` ``[W, blocks, W]`` holds each block
    block-diagonally over the pack's heads, so no head's product reads another's values
    (but 0 * a non-finite value of another head is NaN: module docstring, Limits);
    ``mv`` ``[W, blocks, n]`` gives ps ``[W, blocks * n]``."""
    n = mv.shape[2]
    for b in range(na):
        nisa.nc_matmul(dst=ps[:, b * n:(b + 1) * n], stationary=st[0:W, b, 0:W],
                       moving=mv[0:W, b, :], accumulate=False)


def _block_product(pk, st, mv, na, mdt):
    """SBUF ``[W, na, n]`` (``mdt``) = the block products st^T mv of blocks < na (_block_mm),
    one PSUM bank, evicted by ScalarE."""
    W = pk["W"]
    n = mv.shape[2]
    ps = nl.ndarray((W, na * n), dtype=nl.float32, buffer=nl.psum)
    _block_mm(ps, st, mv, na, W)
    out = nl.ndarray((W, na, n), dtype=mdt, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out.reshape((W, na * n)), src=ps, engine=nisa.engine.scalar)
    return out


def zero_solve(t):
    """Zero the packed solve tiles ``t`` (solve_tiles): the placements fill only the
    head-diagonal blocks (G: one block per head and block row)."""
    nisa.memset(dst=t["PT"], value=0.0, engine=nisa.engine.vector)
    if t["OT"] != None:  # noqa: E711
        nisa.memset(dst=t["OT"], value=0.0, engine=nisa.engine.vector)
    if t["G"] != None:  # noqa: E711
        nisa.memset(dst=t["G"], value=0.0, engine=nisa.engine.vector)


def _pair(k, b, nblk):
    """Slot of the off-diagonal block (k, b), k < b, in the packed ``[W, pairs, W]`` tile
    (ordered by k, then b)."""
    i = 0
    for kk in range(k):
        i = i + nblk - 1 - kk
    return i + b - k - 1


def pack_rhs(Bs, L, N):
    """The right-hand sides of up to PACK heads packed like the solve: block b of head j at
    partitions 32 j of slot b, ``[W, blocks, N]`` float32 (rows past a short last block zero)."""
    npk = len(Bs)
    W = npk * BLOCK
    nbs = block_rows(L)
    nblk = len(nbs)
    Rp = nl.ndarray((W, nblk, N), dtype=nl.float32, buffer=nl.sbuf)
    if L % BLOCK != 0:
        nisa.memset(dst=Rp, value=0.0, engine=nisa.engine.gpsimd)
    for j in range(npk):
        q0 = j * BLOCK
        for b in range(nblk):
            r0 = b * BLOCK
            nb = nbs[b]
            nisa.dma_copy(dst=Rp[q0:q0 + nb, b, :], src=Bs[j][r0:r0 + nb, :])
    return Rp


def _count_over(nbs, n):
    """How many of the (non-increasing) block sizes ``nbs`` exceed ``n``."""
    k = 0
    for nb in nbs:
        if nb > n:
            k = k + 1
    return k


def solve_round(pk, covered, mdt):
    """One nilpotent-doubling round of every block still running (exact: N^m = 0 for
    m >= its rows): P <- P P, P^T <- P^T P^T (from the same operands, no transpose),
    inv <- inv (I + P), so inv covers the powers below 2 * covered. The blocks' products
    share one PSUM bank and one eviction; a block whose last round this is writes the
    float32 inverse the substitution applies."""
    na = _count_over(pk["nbs"], covered)           # blocks in this pass
    nc = _count_over(pk["nbs"], covered * 2)       # ... that need another round
    if na == 0:
        return
    if covered > _SQUARED:
        # past the explicit powers: (N^c)^T inv^T = ((N^s)^T)^(c/s) inv^T, c/s compact
        # products with the last explicit power N^s instead of squaring it (no expanded
        # eviction); all but the last here, the last in solve_update
        X = pk["cinv"]
        for r in range(covered // _SQUARED - 1):
            X = _block_product(pk, pk["P"], X, na, mdt)
        pk["chain"] = X
        return
    P2 = _block_product(pk, pk["PT"], pk["P"], na, mdt)                   # P @ P
    # the transposed square only if the next round squares again
    if nc > 0 and covered * 2 <= _SQUARED:
        pk["PT"] = _block_product(pk, pk["P"], pk["PT"], nc, mdt)         # (P @ P)^T
    pk["P"] = P2


def solve_update(pk, covered, mdt):
    """The second half of a doubling round: inv <- inv (I + P) (P = N^{2 covered} from
    solve_round) on the compact inverse, one PSUM bank and one eviction for the blocks
    still running. Blocks whose last round this is go to the float32 compact inverse; after
    the last round it is expanded block-diagonally (one multiply by the head-quadrant
    mask), the stationary of the substitution's block applications."""
    W = pk["W"]
    npk = pk["npk"]
    nblk = len(pk["nbs"])
    na = _count_over(pk["nbs"], covered)
    nc = _count_over(pk["nbs"], covered * 2)
    if na == 0:
        return
    cinv = pk["cinv"]
    mv = cinv
    if covered > _SQUARED:
        mv = pk["chain"]       # chained products with the last explicit power (solve_round)
    ps = nl.ndarray((W, na * BLOCK), dtype=nl.float32, buffer=nl.psum)
    _block_mm(ps, pk["P"], mv, na, W)                                    # (inv @ P)^T
    psv = ps.reshape((W, na, BLOCK))
    if nc > 0:
        nisa.tensor_tensor(dst=cinv[:, 0:nc, :], data1=cinv[:, 0:nc, :], data2=psv[:, 0:nc, :],
                           op=nl.add)
    if nc < na:
        nisa.tensor_tensor(dst=pk["cfin"][:, nc:na, :], data1=cinv[:, nc:na, :],
                           data2=psv[:, nc:na, :], op=nl.add)
    if nc == 0:
        b0 = 0
        if pk["G"] != None and nblk > 1:  # noqa: E711  (block 0 is applied through G only)
            b0 = 1
        nisa.tensor_tensor(
            dst=pk["inv"][:, b0:nblk, :].reshape((W, nblk - b0, npk, BLOCK)),
            data1=pk["cfin"][:, b0:nblk, :].reshape((W, nblk - b0, 1, BLOCK)).broadcast(2, npk),
            data2=pk["bd"][0:W, 0:npk, :].reshape((W, 1, npk, BLOCK)).broadcast(1, nblk - b0),
            op=nl.multiply)
        if pk["G"] != None:  # noqa: E711
            place_g(pk)


def place_g(pk):
    """G [(b, m), j, (h, i)] = [h == j] inv_jb^T[m, i]: head j's inverse of block b moved from
    its quadrant of the packed tiles (partitions 32 j) to the block's own rows (32 b), so the
    application of block b reads each head's right-hand side where the k S eviction put it
    (solve_apply_block: one 32-row row-tile matmul per head) and no right-hand side is
    packed on the state chain. One SBUF-to-SBUF DMA per head and block, off the chain; the
    other elements stay zero (zero_solve)."""
    npk = pk["npk"]
    nbs = pk["nbs"]
    for b in range(len(nbs)):
        nb = nbs[b]
        r0 = b * BLOCK
        for j in range(npk):
            q0 = j * BLOCK
            nisa.dma_copy(dst=pk["G"][r0:r0 + nb, j, q0:q0 + nb],
                          src=pk["cfin"][q0:q0 + nb, b, 0:nb])


def solve_rhs_block(pk, Rp, b, N):
    """Block b of the forward substitution, first half: Z_b = B_b - sum_{k<b} A_bk X_k for
    every head of the pack at once (packed right-hand sides ``Rp``, packed solutions
    pk["Xp"]; the off-diagonal stationaries are block-diagonal over the heads, so one PSUM
    accumulation serves the pack and one subtraction evicts it). Right-hand sides unpacked
    (pk["G"], place_g; ``Rp`` None): Z_b = -sum_{k<b} A_bk X_k, evicted by ScalarE; the
    application adds inv_bb B_b."""
    W = pk["W"]
    nblk = len(pk["nbs"])
    unpacked = pk["G"] != None  # noqa: E711
    if b == 0:
        if unpacked:
            pk["Z"].append(None)
        else:
            pk["Z"].append(Rp[:, 0, :])
        return
    ps = nl.ndarray((W, N), dtype=nl.float32, buffer=nl.psum)
    for k in range(b):
        nisa.nc_matmul(dst=ps, stationary=tf32_view(pk["OT"][:, _pair(k, b, nblk), :], pk["tf"]),
                       moving=tf32_view(pk["Xp"][k], pk["tf"]), accumulate=k > 0)
    Z = nl.ndarray((W, N), dtype=nl.float32, buffer=nl.sbuf)
    if unpacked:
        nisa.activation(dst=Z, op=nl.copy, data=ps, scale=-1.0)
    else:
        nisa.tensor_tensor(dst=Z, data1=Rp[:, b, :], data2=ps, op=nl.subtract)
    pk["Z"].append(Z)


def solve_apply_block(pk, Xs, b, N, Rs):
    """Block b of the forward substitution, second half: X_b = inv_bb Z_b for the pack's heads
    in one matmul (kept packed for the next blocks), unpacked into the heads' Xs by
    SBUF-to-SBUF DMAs (partition moves no compute engine spends time on). Right-hand sides
    unpacked (pk["G"]; ``Rs`` the heads'): X_b = inv_bb B_b + inv_bb Z_b, inv_bb B_b as one
    matmul per head on the PE array's row tile (32 b, 0) of 32 rows (the partitions of
    block b's rows, where G and the head's right-hand side are) in the same PSUM
    accumulation; the last block, which no later block reads, leaves PSUM straight into
    the heads' rows (cross-quadrant moves of <= 32 partitions, ScalarE and VectorE in turn)
    instead of through the packed tile and the unpacking DMAs."""
    npk, W, nbs = pk["npk"], pk["W"], pk["nbs"]
    r0 = b * BLOCK
    nb = nbs[b]
    unpacked = pk["G"] != None  # noqa: E711
    ps = nl.ndarray((W, N), dtype=nl.float32, buffer=nl.psum)
    if not unpacked:
        nisa.nc_matmul(dst=ps, stationary=tf32_view(pk["inv"][:, b, :], pk["tf"]),
                       moving=tf32_view(pk["Z"][b], pk["tf"]), accumulate=False)
    else:
        for j in range(npk):
            nisa.nc_matmul(dst=ps, stationary=tf32_view(pk["G"][r0:r0 + nb, j, :], pk["tf"]),
                           moving=tf32_view(Rs[j][r0:r0 + nb, :], pk["tf"]), accumulate=j > 0,
                           tile_position=(r0, 0), tile_size=(BLOCK, 128))
        if b > 0:
            nisa.nc_matmul(dst=ps, stationary=tf32_view(pk["inv"][:, b, :], pk["tf"]),
                           moving=tf32_view(pk["Z"][b], pk["tf"]), accumulate=True)
    if unpacked and b == len(nbs) - 1:
        for j in range(npk):
            q0 = j * BLOCK
            eng = nisa.engine.scalar
            if j % 2 == 1:
                eng = nisa.engine.vector
            nisa.tensor_copy(dst=Xs[j][r0:r0 + nb, :], src=ps[q0:q0 + nb, :], engine=eng)
        return
    Xp = nl.ndarray((W, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=Xp, src=ps, engine=nisa.engine.scalar)
    pk["Xp"].append(Xp)
    for j in range(npk):
        q0 = j * BLOCK
        nisa.dma_copy(dst=Xs[j][r0:r0 + nb, :], src=Xp[q0:q0 + nb, :])
