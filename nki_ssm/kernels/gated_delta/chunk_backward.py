"""Gated DeltaNet chunked backward (WY / UT form) over a ragged batch.

Kernel: ``gdn_chunk_backward`` (``@nki.jit``); launcher
``nki_ssm.ops.launch.gated_delta_backward.backward_call``.

Math, per chunk of C tokens of one sequence and value head (rows past the sequence end
are zero rows: q = k = v = do = g = beta = 0, so they add nothing), entry state h [K, V],
q already scaled (and L2-normalised) by the launcher::

    c_i = sum_{m <= i} g_m,  D[i, j] = exp(seg(j, i]) (i >= j; direct segment sums)
    A[i, j] = beta_i (k_i . k_j) D[i, j] (j < i),   T = (I + A)^{-1}
    r = beta (v - e^c (k h)),  vn = T r                (the delta rule's v_new)
    o = e^c (q h) + (tril(q k^T) D) vn,   h' = e^{c_L} h + (e^{c_L - c} k)^T vn

Backward given do and dh' (the gradient of h')::

    dvn = (tril(q k^T) D)^T do + e^{c_L - c} (k dh'),   z = T^T dvn
    dv = beta z;  dA = -z vn^T (strictly lower);  y = z h^T
    dq = e^c (do h^T) + (dP D) k,         dP[i, j] = do_i . vn_j
    dk = (dP D)^T q + e^{c_L - c} (vn dh'^T) - beta e^c y + E k + E^T k,
         E = beta dA D (strictly lower)
    dbeta = <v, z> - e^c <k, y> + rowsum(dA kk D)
    G = dP tril(q k^T) D + dA A,   X = <q, e^c do h^T> - beta e^c <k, y>,
    Q = <k, e^{c_L - c} vn dh'^T>
    dg_m = sum_{i >= m} X_i + sum_{j < m} Q_j + e^{c_L} <dh', h> + sum_{i >= m > j} G[i, j]
         (the pairs of G straddling m summed directly: reverse-summing rowsum G - colsum G
         would cancel the pairs inside the chunk's tail and lose the small straddling ones
         under strong decays)
    dh = e^{c_L} dh' + (e^c q)^T do - (beta e^c k)^T z

C = 32: T is computed exactly on the one 32-row block by nilpotent doubling
(I - N)^{-1} = (I + N)(I + N^2)(I + N^4)(I + N^8)(I + N^16), N = -A (DESIGN.md Numerics).

Arguments (prepared by ``backward_call``; Tb = token bucket, Nb = sequence bucket, HVp =
value heads padded to a multiple of the program count, E = chunk rows of the tables)
----------------------------------------------------------------------------------
q2, k2 ``[Tb + 1, HVp*K]`` float32 (q/k expanded to the value heads, normalised, q scaled),
v2, do2 ``[Tb + 1, HVp*V]`` float32, g2, beta2 ``[Tb + 1, HVp]`` float32 (the log decays
and betas, raw gates already applied); row Tb and rows past num_tokens are zero.
h0 ``[Nb*K, HVp*V]`` float32: block s (rows s*K..) the initial state of sequence s as
``[K, (hv, V)]`` (zeros without initial states). dstate ``[Nb*K, HVp*V]`` float32, in place: block s
holds d_final_states of sequence s on entry and d_initial_states on exit.
init_tab ``[Nb, 2]`` (h0 block row, hstore block row of the sequence's first chunk),
fwd_rows / bwd_rows ``[E + 1, C]`` token rows (past a sequence end: Tb) of every chunk in
order / of every chunk in reverse order per sequence; fwd_state ``[E + 1, 2]`` (hstore row
of the chunk, hstore row of the next chunk or the trash block); bwd_state ``[E + 1, 2]``
(hstore row of the chunk, dstate row of its sequence); counts ``[1, 3]`` (sequences with
chunks, chunks, chunks). Compile-time: chunk (32). Returns dq, dk ``[Tb + 1, HVp*K]``,
dv ``[Tb + 1, HVp*V]``, dg, dbeta ``[Tb + 1, HVp]`` float32, per value head (the launcher
sums dq / dk over the value heads of a q/k head); row Tb is trash.

Loops: three top-level ``nl.fori_loop`` over the tables, no nesting
-----------------------------------------------------------------
1. init: each sequence's entry state h0 block -> its first chunk's hstore block;
2. forward recompute, chunks in order: h from hstore[e], per head kk, D, A, T, vn, h' ->
   hstore[e + 1] (the sequence's last chunk: the trash block);
3. backward, chunks in reverse per sequence: h from hstore[e], dh' from the sequence's
   dstate block, per head the recompute of 2 and the gradients above, dh -> the same
   dstate block (after the sequence's first chunk: its d_initial_states).

LNC: program p of n owns value heads [p*HVp/n, (p+1)*HVp/n) statically (nl.program_id):
every program runs the same tables on its own columns of every tensor it writes (hstore,
dstate, outputs), so no HBM byte is written by two programs; both trace the same
instructions. The launcher pads HV with zero heads to a multiple of n.

Engines per (chunk, value head) of loop 3: TensorE 8 transposes (k, q, do, h, dh', E,
G, N, T), ~20 matmuls (kk, q k^T, segment sums, 7 for T, k h, vn^T, k dh', dvn, z, z^T, do vn^T
both layouts, z vn^T, do h^T, z h^T, vn dh'^T, dq, dk (3 accumulated), G^T and dg (1 + 4), dh (2));
VectorE / ScalarE the masked evictions and per-row scalings, GpSimd none; DMA: the chunk's
gathers (q, k, v, do, g, beta: one per tensor per chunk), h and dh' blocks in, dh' out,
the five gradient scatters. Loop 2 is the recompute subset (T, vn, h'). What binds: the
serial chain kk -> A -> T (4 doubling rounds) -> vn -> dvn -> z -> dA / dh per head;
heads are independent and interleave in the engine queues.

Memory per token (HBM scratch, float32): hstore holds every chunk's entry state,
4*HVp*K*V/C bytes per token (64 KiB at Qwen3-Next TP1, C = 32); nothing is saved by the
forward (it is recomputed). Limits: K, V <= 128; C = 32.

Constructs (the forward kernel ``chunk.py``'s, with its evidence): ``nl.fori_loop`` with
an inner def body; registers loaded from a (1, 1) SBUF tile on partition 0
(``count_register``); ``.ap`` with ``scalar_offset`` a (1, 1) SBUF tile and
``indirect_dim=0``; one-row-per-partition ``vector_offset`` gathers / scatters with a
column ``offset``; kernel-allocated ``shared_hbm`` scratch; whole-array matmuls with
explicit ``accumulate``; ``nc_transpose`` on TensorE; ``nl.program_id`` / ``num_programs``.
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels._common import count_register
from nki_ssm.kernels.gated_delta.chunk import _row_cells, _rows_view, _state_block, _table_rows

_BLOCK = 32          # rows per exactly-inverted diagonal block (DESIGN.md Numerics)
_ROUNDS = 4          # doubling rounds after I + N: N^2, N^4, N^8, N^16 cover 32 rows


@nki.jit
def gdn_chunk_backward(q2, k2, v2, do2, g2, beta2, h0, dstate, init_tab, fwd_rows, fwd_state,
                       bwd_rows, bwd_state, counts, chunk):
    """Gradients of the chunked gated delta rule (layouts in the module docstring)."""
    T1 = q2.shape[0]
    HVp = g2.shape[1]
    K = q2.shape[1] // HVp
    V = v2.shape[1] // HVp
    C = chunk
    E1 = fwd_rows.shape[0]
    nprog = nl.num_programs(0)
    pid = nl.program_id(0)
    nh = HVp // nprog
    heads = (pid * nh, (pid + 1) * nh)      # this program's value heads

    dq = nl.ndarray((T1, HVp * K), dtype=nl.float32, buffer=nl.shared_hbm)
    dk = nl.ndarray((T1, HVp * K), dtype=nl.float32, buffer=nl.shared_hbm)
    dv = nl.ndarray((T1, HVp * V), dtype=nl.float32, buffer=nl.shared_hbm)
    dg = nl.ndarray((T1, HVp), dtype=nl.float32, buffer=nl.shared_hbm)
    dbeta = nl.ndarray((T1, HVp), dtype=nl.float32, buffer=nl.shared_hbm)
    # every chunk's entry state, one [K, HVp*V] block per table row, the last the trash
    hstore = nl.ndarray((E1 * K, HVp * V), dtype=nl.float32, buffer=nl.shared_hbm)
    cst = _constants(C)
    n_init = count_register(counts, 0)
    n_fwd = count_register(counts, 1)
    n_bwd = count_register(counts, 2)
    sv0 = heads[0] * V
    sv1 = heads[1] * V

    def init_body(s):
        cells = _row_cells(init_tab, s)
        S = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=S, src=_state_block(h0, cells[0], 0, K, HVp * V, sv0, sv1))
        nisa.dma_copy(dst=_state_block(hstore, cells[1], 0, K, HVp * V, sv0, sv1), src=S)

    nl.fori_loop(0, n_init, init_body)

    def fwd_body(e):
        rows = _table_rows(fwd_rows, e, C, 0)
        cells = _row_cells(fwd_state, e)
        x = _gather(rows, (("k", k2, K), ("v", v2, V), ("g", g2, 1), ("beta", beta2, 1)),
                    heads, C)
        S = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=S, src=_state_block(hstore, cells[0], 0, K, HVp * V, sv0, sv1))
        ch = _decays(x, cst, nh, C, K)
        for j in range(nh):
            d = _recompute(x, ch, cst, S, j, C, K, V, False)
            vn = _mm(d["TT"], d["r"], C, V)
            kd = nl.ndarray((C, K), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=kd, op=nl.copy, data=d["k"], scale=ch["el"][:, j:j + 1])
            ps = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=ps, stationary=kd, moving=vn, accumulate=False)
            Sh = S[:, j * V:(j + 1) * V]
            nisa.scalar_tensor_tensor(dst=Sh, data=Sh, op0=nl.multiply,
                                      operand0=ch["ecL"][:, j:j + 1], op1=nl.add, operand1=ps)
        nisa.dma_copy(dst=_state_block(hstore, cells[1], 0, K, HVp * V, sv0, sv1), src=S)

    nl.fori_loop(0, n_fwd, fwd_body)

    def bwd_body(e):
        rows = _table_rows(bwd_rows, e, C, 0)
        cells = _row_cells(bwd_state, e)
        x = _gather(rows, (("q", q2, K), ("k", k2, K), ("v", v2, V), ("do", do2, V),
                           ("g", g2, 1), ("beta", beta2, 1)), heads, C)
        S = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=S, src=_state_block(hstore, cells[0], 0, K, HVp * V, sv0, sv1))
        dS = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=dS, src=_state_block(dstate, cells[1], 0, K, HVp * V, sv0, sv1))
        ch = _decays(x, cst, nh, C, K)
        out = {}
        out["dq"] = nl.ndarray((C, nh * K), dtype=nl.float32, buffer=nl.sbuf)
        out["dk"] = nl.ndarray((C, nh * K), dtype=nl.float32, buffer=nl.sbuf)
        out["dv"] = nl.ndarray((C, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        out["dg"] = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.sbuf)
        out["dbeta"] = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(nh):
            d = _recompute(x, ch, cst, S, j, C, K, V, True)
            _head_grads(x, ch, cst, d, S, dS, out, j, C, K, V)
        nisa.dma_copy(dst=_state_block(dstate, cells[1], 0, K, HVp * V, sv0, sv1), src=dS)
        for spec in (("dq", dq, K), ("dk", dk, K), ("dv", dv, V), ("dg", dg, 1),
                     ("dbeta", dbeta, 1)):
            name = spec[0]
            dst = spec[1]
            w = spec[2]
            c0 = heads[0] * w
            c1 = heads[1] * w
            nisa.dma_copy(dst=dst.ap(pattern=[[HVp * w, C], [1, c1 - c0]], offset=c0,
                                     vector_offset=rows, indirect_dim=0), src=out[name])

    nl.fori_loop(0, n_bwd, bwd_body)
    return dq, dk, dv, dg, dbeta


def _constants(C):
    """0/1 operators and masks [C, C] (float32): tri_up [p <= f] (cumsum), tri_lo [p > f]
    (segment sums over m > j; the strictly lower mask), tri_li [p >= f] (reverse cumsum;
    the inclusive lower mask), tri_su [p < f] (exclusive cumsum), ident, bd / off (the
    32-row diagonal blocks / the strictly lower rest), ones [128, 128]."""
    cst = {}
    ones = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    cst["ones"] = ones
    for spec in (("tri_up", 1, -1, 0, nl.greater_equal), ("tri_lo", -1, 1, -1, nl.greater_equal),
                 ("tri_li", -1, 1, 0, nl.greater_equal), ("tri_su", 1, -1, -1, nl.greater_equal),
                 ("ident", -1, 1, 0, nl.equal)):
        t = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=t, pattern=[[spec[1], C]], channel_multiplier=spec[2],
                           offset=spec[3], on_true_tile=ones[0:C, 0:C], on_false_value=0.0,
                           cmp_op=spec[4])
        cst[spec[0]] = t
    # bd: the 32-row diagonal blocks; off: strictly lower outside them
    cst["bd"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=cst["bd"], value=0.0)
    for r0 in range(0, C, _BLOCK):
        nisa.memset(dst=cst["bd"][r0:r0 + _BLOCK, r0:r0 + _BLOCK], value=1.0)
    cst["off"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cst["off"], data1=cst["tri_lo"], data2=cst["bd"], op=nl.multiply)
    nisa.tensor_tensor(dst=cst["off"], data1=cst["tri_lo"], data2=cst["off"], op=nl.subtract)
    return cst


def _gather(rows, specs, heads, C):
    """The chunk's token rows of each (name, tensor, width per head) for this program's
    heads, one DMA each: ``[C, nh*width]`` float32 tiles."""
    x = {}
    for spec in specs:
        src = spec[1]
        w = spec[2]
        HVp = src.shape[1] // w
        c0 = heads[0] * w
        c1 = heads[1] * w
        t = nl.ndarray((C, c1 - c0), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src.ap(pattern=[[HVp * w, C], [1, c1 - c0]], offset=c0,
                                        vector_offset=rows, indirect_dim=0))
        x[spec[0]] = t
    return x


def _mm(st, mv, M, N):
    """SBUF [M, N] = st^T @ mv (float32, through PSUM, evicted by ScalarE)."""
    ps = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv, accumulate=False)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=ps, engine=nisa.engine.scalar)
    return out


def _transpose(src, P, F):
    """SBUF [F, P] = src [P, F]^T (TensorE, float32 bit-exact)."""
    ps = nl.ndarray((F, P), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=ps, data=src, engine=nisa.engine.tensor)
    out = nl.ndarray((F, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=ps, engine=nisa.engine.vector)
    return out


def _rowsum(a, b, C, w):
    """[C, 1] = sum over the free axis of a * b."""
    prod = nl.ndarray((C, w), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod, data1=a, data2=b, op=nl.multiply)
    s = nl.ndarray((C, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=s, op=nl.add, data=prod, axis=(1,))
    return s


def _decays(x, cst, nh, C, K):
    """Per-token decays of every head of the chunk at once (0/1 stationaries, fp32):
    ec = e^{c_i}, el = e^{c_L - c_i} (direct sums over m > i), ecL = e^{c_L} on K
    partitions, and nbec = -beta e^{c}."""
    g = x["g"]
    ch = {}
    ps = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=cst["tri_up"], moving=g, accumulate=False)
    ch["ec"] = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=ch["ec"], op=nl.exp, data=ps)
    ps2 = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps2, stationary=cst["tri_lo"], moving=g, accumulate=False)
    ch["el"] = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=ch["el"], op=nl.exp, data=ps2)
    ps3 = nl.ndarray((K, nh), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps3, stationary=cst["ones"][0:C, 0:K], moving=g, accumulate=False)
    ch["ecL"] = nl.ndarray((K, nh), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=ch["ecL"], op=nl.exp, data=ps3)
    ch["nbec"] = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=ch["nbec"], data=ch["ec"], op0=nl.multiply, operand0=-1.0,
                              op1=nl.multiply, operand1=x["beta"])
    return ch


def _recompute(x, ch, cst, S, j, C, K, V, grads):
    """The forward's chunk quantities of head j: kT, D (both layouts, masked), KKD = kk D
    (strictly lower), T and T^T, kh = k h and r = beta (v - e^c k h); with ``grads`` also
    qT and QKD = tril(q k^T) D."""
    d = {}
    d["k"] = x["k"][:, j * K:(j + 1) * K]
    d["kT"] = _transpose(d["k"], C, K)
    beta = x["beta"][:, j:j + 1]
    # segment sums seg(j, i] = sum_{j < m <= i} g_m, both layouts, exp, masked (i >= j)
    gU = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=gU, op=nl.copy, data=cst["tri_up"], scale=x["g"][:, j:j + 1])
    D = _mm(gU, cst["tri_lo"], C, C)
    nisa.activation(dst=D, op=nl.exp, data=D)
    Dl = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)       # [i, j], i > j
    nisa.tensor_tensor(dst=Dl, data1=D, data2=cst["tri_lo"], op=nl.multiply)
    d["Dl"] = Dl
    kk = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=kk, stationary=d["kT"], moving=d["kT"], accumulate=False)
    d["KKD"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d["KKD"], data1=kk, data2=Dl, op=nl.multiply)
    # T = (I + A)^{-1}, A = beta_i KKD = A_bd + A_off (its 32-row diagonal blocks and the
    # rest): the diagonal blocks exactly by doubling, Tb = (I + A_bd)^{-1}, then block
    # forward substitution as products: T = (I + M)^{-1} Tb, M = Tb A_off strictly
    # block-lower (M^nb = 0), (I + M)^{-1} = (I - M)(I + M^2) for up to 4 blocks
    nb = C // _BLOCK
    A = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=A, op=nl.copy, data=d["KKD"], scale=beta)
    N = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=N, data=A, op0=nl.multiply, operand0=-1.0, op1=nl.multiply,
                              operand1=cst["bd"])
    NT = _transpose(N, C, C)
    T = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=T, data1=N, data2=cst["ident"], op=nl.add)
    covered = 2
    for _ in range(_ROUNDS):
        N2T = _mm(N, NT, C, C)                     # (N^2)^T = N^T N^T
        if covered * 2 < _BLOCK:
            N = _mm(NT, N, C, C)                   # N^2
        NT = N2T
        T = _plus_product(N2T, T, C, nl.add)       # (I + N^{2m}) T
        covered = covered * 2
    if nb > 1:
        Aoff = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=Aoff, data1=A, data2=cst["off"], op=nl.multiply)
        TbT = _transpose(T, C, C)
        M = _mm(TbT, Aoff, C, C)                   # Tb A_off
        MT = _mm(Aoff, TbT, C, C)                  # (Tb A_off)^T
        if nb > 2:
            T = _plus_product(_mm(M, MT, C, C), T, C, nl.add)     # (I + M^2) Tb
        T = _plus_product(MT, T, C, nl.subtract)                  # (I - M) ...
    d["T"] = T
    d["TT"] = _transpose(T, C, C)
    # r = beta (v - e^c (k h))
    ps = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=d["kT"], moving=S[:, j * V:(j + 1) * V], accumulate=False)
    r = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=r, data=ps, op0=nl.multiply, operand0=ch["nbec"][:, j:j + 1],
                              op1=nl.add, operand1=_scaled(x["v"][:, j * V:(j + 1) * V], beta,
                                                           C, V))
    d["r"] = r
    if grads:
        d["q"] = x["q"][:, j * K:(j + 1) * K]
        d["qT"] = _transpose(d["q"], C, K)
        Di = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)   # [i, j], i >= j
        nisa.tensor_tensor(dst=Di, data1=D, data2=cst["tri_li"], op=nl.multiply)
        d["Di"] = Di
        DT = _mm(cst["tri_lo"], gU, C, C)                            # [j, i]
        nisa.activation(dst=DT, op=nl.exp, data=DT)
        nisa.tensor_tensor(dst=DT, data1=DT, data2=cst["tri_up"], op=nl.multiply)
        d["DTi"] = DT
        qk = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=qk, stationary=d["qT"], moving=d["kT"], accumulate=False)
        d["QKD"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d["QKD"], data1=qk, data2=Di, op=nl.multiply)
    return d


def _plus_product(st, X, C, op):
    """X op st^T X ([C, C]; op add or subtract), the product through PSUM."""
    ps = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=X, accumulate=False)
    out = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=out, data1=X, data2=ps, op=op)
    return out


def _neg(col, C):
    """-col ([C, 1])."""
    t = nl.ndarray((C, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=t, data=col, op0=nl.multiply, operand0=-1.0)
    return t


def _scaled(a, col, C, w):
    """a [C, w] times the per-row column col [C, 1]."""
    t = nl.ndarray((C, w), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=t, op=nl.copy, data=a, scale=col)
    return t


def _head_grads(x, ch, cst, d, S, dS, out, j, C, K, V):
    """The gradients of head j (module docstring) into ``out``'s column blocks; dS (head j's
    columns) becomes the gradient of the chunk's entry state."""
    k, q, kT = d["k"], d["q"], d["kT"]
    h = S[:, j * V:(j + 1) * V]
    dSh = dS[:, j * V:(j + 1) * V]
    do = x["do"][:, j * V:(j + 1) * V]
    v = x["v"][:, j * V:(j + 1) * V]
    beta = x["beta"][:, j:j + 1]
    ec = ch["ec"][:, j:j + 1]
    el = ch["el"][:, j:j + 1]
    vnT = _mm(d["r"], d["TT"], V, C)                  # vn^T [V, C]
    # dvn = QKD^T do + e^{c_L - c} (k dh')
    pk = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pk, stationary=kT, moving=dSh, accumulate=False)
    pa = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pa, stationary=d["QKD"], moving=do, accumulate=False)
    pa_s = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=pa_s, src=pa, engine=nisa.engine.scalar)
    dvn = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=dvn, data=pk, op0=nl.multiply, operand0=el, op1=nl.add,
                              operand1=pa_s)
    z = _mm(d["T"], dvn, C, V)                        # T^T dvn
    zT = _mm(dvn, d["T"], V, C)
    nisa.activation(dst=out["dv"][:, j * V:(j + 1) * V], op=nl.copy, data=z, scale=beta)
    doT = _transpose(do, C, V)
    hT = _transpose(h, K, V)
    dST = _transpose(dSh, K, V)
    # dP = do vn^T ([i, j] and [j, i]), masked by D
    pp = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pp, stationary=doT, moving=vnT, accumulate=False)
    dPD = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dPD, data1=pp, data2=d["Di"], op=nl.multiply)
    ppt = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ppt, stationary=vnT, moving=doT, accumulate=False)
    dPDT = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dPDT, data1=ppt, data2=d["DTi"], op=nl.multiply)
    # z vn^T: W1 = (z vn^T) KKD (dA = -z vn^T), E = dA beta D (strictly lower)
    pz = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pz, stationary=zT, moving=vnT, accumulate=False)
    zv = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=zv, src=pz, engine=nisa.engine.vector)
    W1 = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=W1, data1=zv, data2=d["KKD"], op=nl.multiply)
    Em = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=Em, data=zv, op0=nl.multiply, operand0=_neg(beta, C),
                              op1=nl.multiply, operand1=d["Dl"])
    ET = _transpose(Em, C, C)
    # G = dP QKD + dA A = dPD * QK - beta W1
    G = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=G, data1=pp, data2=d["QKD"], op=nl.multiply)
    bW1 = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=bW1, op=nl.copy, data=W1, scale=beta)
    nisa.tensor_tensor(dst=G, data1=G, data2=bW1, op=nl.subtract)
    # products with h^T and dh'^T
    doh = nl.ndarray((C, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=doh, stationary=doT, moving=hT, accumulate=False)
    dq_int = _scaled(doh, ec, C, K)                  # e^c do h^T
    y = _mm(zT, hT, C, K)                             # z h^T
    pvs = nl.ndarray((C, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pvs, stationary=vnT, moving=dST, accumulate=False)
    dkS = _scaled(pvs, el, C, K)                     # e^{c_L - c} vn dh'^T
    # dq = e^c do h^T + dPD k
    pq = nl.ndarray((C, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pq, stationary=dPDT, moving=k, accumulate=False)
    nisa.tensor_tensor(dst=out["dq"][:, j * K:(j + 1) * K], data1=pq, data2=dq_int, op=nl.add)
    # dk = dPD^T q + E k + E^T k + dkS - beta e^c y
    pkk = nl.ndarray((C, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pkk, stationary=dPD, moving=q, accumulate=False)
    nisa.nc_matmul(dst=pkk, stationary=ET, moving=k, accumulate=True)
    nisa.nc_matmul(dst=pkk, stationary=Em, moving=k, accumulate=True)
    dk1 = nl.ndarray((C, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dk1, data1=pkk, data2=dkS, op=nl.add)
    nisa.scalar_tensor_tensor(dst=out["dk"][:, j * K:(j + 1) * K], data=y, op0=nl.multiply,
                              operand0=ch["nbec"][:, j:j + 1], op1=nl.add, operand1=dk1)
    # dbeta = <v, z> - e^c <k, y> - rowsum(W1)
    ky = _rowsum(k, y, C, K)
    vz = _rowsum(v, z, C, V)
    w1 = nl.ndarray((C, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=w1, op=nl.add, data=W1, axis=(1,))
    db = nl.ndarray((C, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=db, data=ky, op0=nl.multiply, operand0=_neg(ec, C),
                              op1=nl.add, operand1=vz)
    nisa.tensor_tensor(dst=out["dbeta"][:, j:j + 1], data1=db, data2=w1, op=nl.subtract)
    # dg_m = sum_{i >= m} X_i + sum_{j < m} (-<k, dkS>_j ... as Q) + e^{c_L} <dh', h>
    #        + sum_{i >= m > j} G[i, j]: the pairs of G straddling m directly (rowsum G -
    #        colsum G reverse-summed would cancel the pairs inside [m, C) and lose the small
    #        straddling ones under strong decays), X_i = <q, dq_int> - beta e^c <k, y>
    X = _rowsum(q, dq_int, C, K)
    nisa.scalar_tensor_tensor(dst=X, data=ky, op0=nl.multiply, operand0=ch["nbec"][:, j:j + 1],
                              op1=nl.add, operand1=X)
    kS = _rowsum(k, dkS, C, K)
    hs = nl.ndarray((K, 1), dtype=nl.float32, buffer=nl.sbuf)
    hd = _rowsum(dSh, h, K, V)
    nisa.tensor_tensor(dst=hs, data1=hd, data2=ch["ecL"][:, j:j + 1], op=nl.multiply)
    GT = _transpose(G, C, C)
    ps = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=GT, moving=cst["tri_su"], accumulate=False)
    Hm = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)      # [i, m]: sum_{j < m} G
    nisa.tensor_tensor(dst=Hm, data1=ps, data2=cst["tri_li"], op=nl.multiply)
    pg = nl.ndarray((C, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pg, stationary=cst["tri_li"], moving=X, accumulate=False)
    nisa.nc_matmul(dst=pg, stationary=cst["tri_su"], moving=kS, accumulate=True)
    nisa.nc_matmul(dst=pg, stationary=cst["ones"][0:K, 0:C], moving=hs, accumulate=True)
    nisa.nc_matmul(dst=pg, stationary=Hm, moving=cst["ones"][0:C, 0:1], accumulate=True)
    nisa.tensor_copy(dst=out["dg"][:, j:j + 1], src=pg, engine=nisa.engine.vector)
    # dh = e^{c_L} dh' + (e^c q)^T do - (beta e^c k)^T z
    eq = _scaled(q, ec, C, K)
    bek = _scaled(k, ch["nbec"][:, j:j + 1], C, K)
    ph = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ph, stationary=eq, moving=do, accumulate=False)
    nisa.nc_matmul(dst=ph, stationary=bek, moving=z, accumulate=True)
    nisa.scalar_tensor_tensor(dst=dSh, data=dSh, op0=nl.multiply,
                              operand0=ch["ecL"][:, j:j + 1], op1=nl.add, operand1=ph)
