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

T exactly on 32-row blocks (DESIGN.md Numerics): the diagonal blocks A_bd by nilpotent
doubling, Tb = (I - N)^{-1} = (I + N)(I + N^2)(I + N^4)(I + N^8)(I + N^16) with N = -A_bd
(all blocks in one C x C product per step: block-diagonal stays block-diagonal), then
block forward substitution written as products: I + A = (I + A_bd)(I + M), M = Tb A_off
strictly block-lower (M^{C/32} = 0), so T = (I - M)(I + M^2) Tb (C = 128; C = 64:
(I - M) Tb; C = 32: Tb).

Arguments (prepared by ``backward_call``; Tb = token bucket, Nb = sequence bucket, HVp =
value heads padded to a multiple of the program count n, nh = HVp / n, E = chunk rows of
the tables)
----------------------------------------------------------------------------------
q2, k2 ``[Tb + 1, HVp*K]`` float32 (q/k expanded to the value heads, normalised, q scaled),
v2, do2 ``[Tb + 1, HVp*V]`` float32, g2, beta2 ``[Tb + 1, HVp]`` float32 (the log decays
and betas, raw gates already applied); row Tb and rows past num_tokens are zero.
h0, d_final ``[Nb*K, HVp*V]`` float32: block s (rows s*K..) the initial state / the final
state's gradient of sequence s as ``[K, (hv, V)]`` (zeros when not given).
init_tab ``[Nb, 2]`` (h0 block row, hstore block row of the sequence's first chunk);
seq_rows ``[Nb, 1]`` (block row s*K of every sequence); fwd_rows / bwd_rows ``[E + 1, C]``
token rows (past a sequence end: Tb) of every chunk in order / in reverse order per
sequence; fwd_state ``[E + 1, 3]`` (hstore row of the chunk, hstore row of the next chunk or
the trash block, tstore row of the chunk); bwd_state ``[E + 1, 3]`` (hstore row of the
chunk, dS row of its sequence, tstore row of the chunk); counts ``[1, 4]`` (sequences with
chunks, chunks, chunks, sequences). Compile-time: chunk (a multiple of 32 up to 128) and fast
(16-bit callers: the TensorE operands of the non-0/1 products as tfloat32 views, 10
mantissa bits at the bf16 rate, within the 5e-3 gradient budget; float32 callers: exact
float32, 1e-5; the segment sums, the transposes and the dg straddle sums stay float32).
Returns, program-major (program p's part is rows p*rows..), dq, dk ``[n*(Tb + 1), nh*K]``,
dv ``[n*(Tb + 1), nh*V]``, dg, dbeta ``[n*(Tb + 1), nh]`` float32 per value head (row Tb of
each part is trash; the launcher puts the parts side by side and sums dq / dk over the value
heads of a q/k head) and d_initial ``[n*Nb*K, nh*V]`` (the blocks of d_initial_states).

Loops: five top-level runtime loops over the tables, no nesting
--------------------------------------------------------------
Each loop is ``scaffold.for_each_row``: its trip count is a device scalar of ``counts``
(``scaffold.trip_counts``, read once before the loops) and each iteration reads its
table row's cells as device scalars, the ``scalar_offset`` s of its state, T and table
DMAs. Every iteration loads what it reads (token rows, state blocks, T): no SBUF value is
prefetched across iterations; what crosses them is in HBM (hstore, tstore, dS). The PSUM
tiles an iteration writes are allocated in its body.

1. each sequence with chunks: its h0 block -> its first chunk's hstore block;
2. each sequence: its d_final block -> its dS block;
3. forward recompute, chunks in order: h from hstore[e], per head kk, D, A, T
   (-> tstore[e]), vn, h' -> hstore[e + 1] (the sequence's last chunk: the trash block);
4. backward, chunks in reverse per sequence: h from hstore[e], dh' from the sequence's
   dS block, per head kk, D, r, T from tstore[e] (not solved again) and the gradients
   above, dh -> the same dS block;
5. each sequence: its dS block (an empty sequence's d_final) -> d_initial.
Scratch (``nl.private_hbm``, one per program): hstore ``[E*K, nh*V]`` (every chunk's entry
state), tstore ``[E*C, nh*C]`` (every chunk's T per head) and dS ``[Nb*K, nh*V]``.

Head groups and the software pipeline (``_run_groups``, ``_steps``). In loops 3 and 4 the
program's heads go in groups of _GROUP = 4 (one PSUM bank holds 4 heads' [C, 128] fp32
products). A head's work is a list of steps (loop 3: operands, decays, the solve setup,
two steps per doubling round, block products and three substitution steps, T^T, r, the
state update; loop 4: operands, decays, then 15 gradient steps); within a step each head
of the group issues its matmuls / transposes into its slice of the group's bank and the
group's last head evicts the bank once (``_gmm``, ``_gacc``, ``_gT``: one [C, 512]
ScalarE instruction instead of four [C, 128] ones, the 199-cycle fixed cost paid once),
or one VectorE / GpSimd instruction takes the whole group (``_bank`` + ``_gnew``: the
masked products Dl, KKD, Di, DTi, QKD, dPD, G, dPDT, W1, Hm read the bank with the mask
repeated by a zero-stride ``.ap``; the per-row scalings by beta, e^c, e^{c_L - c}
broadcast each head's column the same way; the row dots are one product over the group's
[C, 512] columns and one reduce over its [C, 4, 128] view). Results a step evicts are read
from the next step on. The groups are software-pipelined: group g starts g * off steps
after group 0 (off = ceil(steps / _PIPE), _PIPE = 4, so at most 4 groups are in flight;
5 gain nothing and SBUF bounds it), and at each tick the groups in flight issue one step
each, the oldest first, so each in-order engine queue holds independent work of several
groups between one group's dependent steps. Updates that would be a VectorE add of a
product to SBUF are accumulated in PSUM instead (an exact float32 identity product: T's
doubling and substitution updates (I + P) T, dq's and dk's state terms). The wide inputs
are gathered in pieces of _GROUP * _PIPE heads (the first groups start on their columns
while the rest arrive) and dq, dk, dv are scattered per group (their SBUF freed early).

LNC: program p of n owns value heads [p*nh, (p+1)*nh) statically (``scaffold.lnc_grid``).
The launcher pads HV with zero heads to a multiple of n, so every program has nh heads
(a padding head computes zero gradients the launcher drops) and the heads always split:
both programs read the one counts row and run the same tables, so they take the same trip
counts (one control flow) and trace the same instructions. Each has its own scratch
(private HBM) and writes only its own part of every output, so no HBM byte is written by
two programs and neither reads what the other writes.

Engines per chunk of 128 tokens (both loops, 32 value heads, LNC=1; before the head
groups: TensorE 1,926, VectorE 1,572, ScalarE 1,126, GpSimd 385): TensorE 2,110 (per
head ~66: the transposes of k, q, do, h, dh', E, G, N, Tb, T and the products, tfloat32
for bf16 callers), VectorE ~504 and ScalarE 510 (per group of 4 heads ~63 / ~64: the
group evictions, the masked products, the per-head STT combinations that read PSUM: r,
N, dvn, E, dk, dh, h'), GpSimd ~121 (group masks, the x-scalings of the inputs), DMA ~118
(gathers in pieces, T per head out and in, state blocks, per-group scatters).

What binds (modeled trn2, ``nki_ssm.perf``, Qwen3-Next TP1 shape: 32 value heads, K = V =
128, bf16 I/O, C = 128, one sequence; ``python -m simulate --op backward --model
qwen3-next --range-samples 2 --no-calibration --lnc 1``): 512 tokens 1.84 ms (4.17 ms
before the head groups); 16K tokens (``--set judged --case 1x16384``) 57.5 ms, 10-90 %
55.8-60.8 (~132 ms before), 0.45 ms per chunk: loop 3 (the forward recompute and solve)
~188 us and loop 4 ~276 us. No engine is saturated (16K: ScalarE 53 % busy, VectorE 52 %,
GpSimd 47 %, TensorE 43 %, DMA 24 %): the critical path is each group's chain of
cross-engine steps (TensorE product -> ScalarE / VectorE eviction -> the next product),
about 20 per group per loop, with 4 groups in flight; the row dots and evictions on the
path are VectorE / ScalarE queue time. Faster needs fewer steps per head (the forward
kernel's packed 32-row block solve instead of the [C, C] doubling in loop 3; merging the
doubling rounds' steps made the schedule worse, 2.06 against 1.84 ms at 512 tokens), or
more groups in flight (SBUF: the chunk-wide q, k, v, do, h, dh' tiles take ~96 KiB per
partition). Program size 3,381 instructions at LNC=1. LNC=2: 0.99 ms at 512 tokens (0.54x),
1,719 instructions per program.

Memory per token (HBM scratch, float32, for the kernel's duration): hstore holds every
chunk's entry state, 4*HVp*K*V/C bytes per token, and tstore every chunk's T, 4*HVp*C
bytes per token (16 + 16 KiB at Qwen3-Next TP1 with C = 128: 512 MiB for 16K tokens).
Nothing is saved by the forward: the backward reads only the forward's inputs and
recomputes, per chunk, the entry state h (loop 3, kept in hstore), T (loop 3, kept in
tstore and read by loop 4, not solved again), and in loop 4 again D, KKD, k^T, r = beta
(v - e^c k h) and T^T (cheaper to recompute than to store: ~5 instructions per group).
Limits: K, V <= 128; C a multiple of 32 up to 128 (the launcher's ``backward_chunk``;
default 128).

Constructs: those of ``scaffold.py`` (trip counts and table cells as ``NkiScalar`` s from
``nisa.scalar_load``, ``nl.fori_loop`` bodies through ``for_each_row``, the LNC grid as
Python ints) and of the forward kernel ``chunk.py``: ``.ap`` with ``scalar_offset`` an
``NkiScalar`` (a table cell or the loop's iteration value) and ``indirect_dim=0`` (static
element ``offset`` for the program's part); one-row-per-partition ``vector_offset``
gathers / scatters with a static ``offset``; kernel-allocated ``nl.private_hbm`` scratch
and ``shared_hbm`` outputs; whole-array matmuls with explicit ``accumulate``;
``nc_transpose`` on TensorE; ``memset`` on 32-partition blocks; matmuls / transposes into
column slices of one PSUM bank (``dst=ps[:, a:b]``) and instructions reading the bank or a
``[P, n, F]`` tile whole (``.reshape``); zero-stride ``.ap`` operands repeating a constant
or a per-head column (as ``mamba2_ssd/chunk.py``); ``.view(nl.tfloat32)`` operands (as
``chunk_block_solve.py``); ``tensor_reduce`` over the last axis of a 3-D view.
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels._common import tf32_view
from nki_ssm.kernels.gated_delta._common import consecutive_groups
from nki_ssm.kernels.gated_delta.chunk_utils import BLOCK, state_block, table_rows
from nki_ssm.kernels.scaffold import at_row, for_each_row, lnc_grid, trip_counts

_GROUP = 4           # heads whose phases interleave (SBUF: their tiles live at once)
_PIPE = 4            # head groups in flight at once (SBUF: 5 gain nothing)
_ROUNDS = 4          # doubling rounds after I + N: N^2, N^4, N^8, N^16 cover 32 rows


@nki.jit
def gdn_chunk_backward(q2, k2, v2, do2, g2, beta2, h0, d_final, init_tab, seq_rows, fwd_rows,
                       fwd_state, bwd_rows, bwd_state, counts, chunk, fast=False):
    """Gradients of the chunked gated delta rule (layouts in the module docstring)."""
    T1 = q2.shape[0]
    HVp = g2.shape[1]
    K = q2.shape[1] // HVp
    V = v2.shape[1] // HVp
    C = chunk
    E1 = fwd_rows.shape[0]
    nprog, pid = lnc_grid()
    nh = HVp // nprog                        # the launcher pads HV to a multiple of nprog
    heads = (pid * nh, (pid + 1) * nh)      # this program's value heads

    # outputs program-major: program p's part is one contiguous span (rows p*T1.., p*Nb*K..)
    dq = nl.ndarray((nprog * T1, nh * K), dtype=nl.float32, buffer=nl.shared_hbm)
    dk = nl.ndarray((nprog * T1, nh * K), dtype=nl.float32, buffer=nl.shared_hbm)
    dv = nl.ndarray((nprog * T1, nh * V), dtype=nl.float32, buffer=nl.shared_hbm)
    dg = nl.ndarray((nprog * T1, nh), dtype=nl.float32, buffer=nl.shared_hbm)
    dbeta = nl.ndarray((nprog * T1, nh), dtype=nl.float32, buffer=nl.shared_hbm)
    Nb = seq_rows.shape[0]
    w = nh * V
    d_init = nl.ndarray((nprog * Nb * K, w), dtype=nl.float32, buffer=nl.shared_hbm)
    # this program's scratch (private HBM): every chunk's entry state, one [K, nh*V] block
    # per table row (the last the trash), and each sequence's running state gradient
    hstore = nl.ndarray((E1 * K, w), dtype=nl.float32, buffer=nl.private_hbm)
    dss = nl.ndarray((Nb * K, w), dtype=nl.float32, buffer=nl.private_hbm)
    # and every chunk's T per head (the forward recompute solves it, the backward reads it)
    tstore = nl.ndarray((E1 * C, nh * C), dtype=nl.float32, buffer=nl.private_hbm)
    cst = _constants(C)
    # trip counts: the one counts row both programs read
    n_init, n_fwd, n_bwd, n_seq = trip_counts(counts)
    sv0 = heads[0] * V
    sv1 = heads[1] * V

    def init_body(s, cells):
        S = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=S, src=state_block(h0, cells[0], 0, K, sv0, sv1))
        nisa.dma_copy(dst=_block(hstore, cells[1], 0, K, w), src=S)

    for_each_row(n_init, init_tab, init_body)

    def dfinal_body(s, cells):
        G = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=G, src=state_block(d_final, cells[0], 0, K, sv0, sv1))
        nisa.dma_copy(dst=_block(dss, cells[0], 0, K, w), src=G)

    for_each_row(n_seq, seq_rows, dfinal_body)

    def fwd_body(e, cells):
        rows = table_rows(fwd_rows, e, C, 0)
        x = _gather(rows, (("k", k2, K), ("v", v2, V), ("g", g2, 1), ("beta", beta2, 1)),
                    heads, C)
        S = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=S, src=_block(hstore, cells[0], 0, K, w))
        c = _context(x, _decays(x, cst, nh, C, K), cst, S, None, None, C, K, V, tstore,
                     cells[2], fast)
        _run_groups(c, consecutive_groups(nh, _GROUP), False)
        nisa.dma_copy(dst=_block(hstore, cells[1], 0, K, w), src=S)

    for_each_row(n_fwd, fwd_state, fwd_body)

    def bwd_body(e, cells):
        rows = table_rows(bwd_rows, e, C, 0)
        x = _gather(rows, (("q", q2, K), ("k", k2, K), ("v", v2, V), ("do", do2, V),
                           ("g", g2, 1), ("beta", beta2, 1)), heads, C)
        S = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=S, src=_block(hstore, cells[0], 0, K, w))
        dS = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=dS, src=_block(dss, cells[1], 0, K, w))
        out = {}
        out["rows"] = rows
        out["base"] = pid * T1
        out["hbm"] = {"dq": dq, "dk": dk, "dv": dv}
        out["dg"] = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.sbuf)
        out["dbeta"] = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.sbuf)
        c = _context(x, _decays(x, cst, nh, C, K), cst, S, dS, out, C, K, V, tstore,
                     cells[2], fast)
        _run_groups(c, consecutive_groups(nh, _GROUP), True)
        nisa.dma_copy(dst=_block(dss, cells[1], 0, K, w), src=dS)
        for spec in (("dg", dg), ("dbeta", dbeta)):
            dst = spec[1]
            ow = dst.shape[1]
            nisa.dma_copy(dst=dst.ap(pattern=[[ow, C], [1, ow]], offset=pid * T1 * ow,
                                     vector_offset=rows, indirect_dim=0), src=out[spec[0]])

    for_each_row(n_bwd, bwd_state, bwd_body)

    def dinit_body(s, cells):
        G = nl.ndarray((K, nh * V), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=G, src=_block(dss, cells[0], 0, K, w))
        nisa.dma_copy(dst=_block(d_init, cells[0], pid * Nb * K * w, K, w), src=G)

    for_each_row(n_seq, seq_rows, dinit_body)
    return dq, dk, dv, dg, dbeta, d_init


def _block(t, cell, base, K, w):
    """The ``[K, w]`` block of HBM ``t [rows, w]`` at row ``cell`` (an NkiScalar, a table
    cell) of the program's part starting at element ``base``."""
    return at_row(t, cell, [[w, K], [1, w]], base)


def _context(x, ch, cst, S, dS, out, C, K, V, tstore, trow, fast):
    """What every phase of a chunk reads: its input tiles x, decays ch, constants, entry
    state S, state gradient dS and output tiles (None in the forward recompute), the T
    scratch and the chunk's row in it (an NkiScalar, a table cell)."""
    c = {}
    c["tstore"] = tstore
    c["fast"] = fast
    c["trow"] = trow
    c["x"] = x
    c["ch"] = ch
    c["cst"] = cst
    c["S"] = S
    c["dS"] = dS
    c["out"] = out
    c["C"] = C
    c["K"] = K
    c["V"] = V
    return c


def _head_dicts(grp):
    """One dict per head of the group, holding its index j."""
    ds = []
    for j in grp:
        d = {}
        d["j"] = j
        d["i"] = len(ds)
        ds.append(d)
    return ds


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
    for r0 in range(0, C, BLOCK):
        nisa.memset(dst=cst["bd"][r0:r0 + BLOCK, r0:r0 + BLOCK], value=1.0)
    cst["off"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cst["off"], data1=cst["tri_lo"], data2=cst["bd"], op=nl.multiply)
    nisa.tensor_tensor(dst=cst["off"], data1=cst["tri_lo"], data2=cst["off"], op=nl.subtract)
    cst["noff"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=cst["noff"], data=cst["off"], op0=nl.multiply, operand0=-1.0)
    return cst


def _gather(rows, specs, heads, C):
    """The chunk's token rows of each (name, tensor, width per head) for this program's
    heads: ``[C, nh*width]`` float32 tiles. The per-head gates (width 1) first, one DMA
    each, then the wide inputs in pieces of _GROUP * _PIPE heads, piece by piece (the first
    head groups start on their columns while the rest arrive)."""
    x = {}
    nh = heads[1] - heads[0]
    for spec in specs:
        x[spec[0]] = nl.ndarray((C, nh * spec[2]), dtype=nl.float32, buffer=nl.sbuf)
    for spec in specs:
        if spec[2] == 1:
            _gather_cols(x[spec[0]], spec[1], rows, heads[0], 0, nh, 1, C)
    for h0 in range(0, nh, _GROUP * _PIPE):
        h1 = min(h0 + _GROUP * _PIPE, nh)
        for spec in specs:
            if spec[2] > 1:
                _gather_cols(x[spec[0]], spec[1], rows, heads[0], h0, h1, spec[2], C)
    return x


def _gather_cols(t, src, rows, p0, h0, h1, w, C):
    """Heads h0 .. h1 - 1 (of the program's, which start at head p0) of the token rows of
    src into their columns of t (one DMA)."""
    HVp = src.shape[1] // w
    nisa.dma_copy(dst=t[:, h0 * w:h1 * w], src=src.ap(pattern=[[HVp * w, C], [1, (h1 - h0) * w]],
                                                        offset=(p0 + h0) * w,
                                                        vector_offset=rows, indirect_dim=0))


def _gtile(c, d, key, P, F):
    """Head d's ``[P, F]`` slice of the group's SBUF tile ``key`` ``[P, heads, F]`` (the
    group's first head allocates it; c["gt"] keeps the whole tile)."""
    if d["i"] == 0:
        c["gt"][key] = nl.ndarray((P, len(c["group"]), F), dtype=nl.float32, buffer=nl.sbuf)
    return c["gt"][key][:, d["i"], :]


def _row_dot(c, key, engine):
    """A row dot of the group into c["rd"][key] ``[rows, heads]``: one product over the
    group's ``[rows, heads*w]`` columns (on ``engine``) and one VectorE reduce over its
    ``[rows, heads, w]`` view. hs = <dh', h> ([K, heads]), vz = <v, z>, ky = <k, y>, qdq =
    <q, e^c do h^T>, kS = <k, dkS> ([C, heads]); issued where the group's operands are
    complete (_steps)."""
    x, gt = c["x"], c["gt"]
    n = len(c["group"])
    j0 = c["group"][0]["j"]
    if key == "hs":
        P, w = c["K"], c["V"]
        ops = [c["dS"][:, j0 * w:(j0 + n) * w], c["S"][:, j0 * w:(j0 + n) * w]]
    else:
        specs = {"vz": ("v", "z"), "ky": ("k", "y"), "qdq": ("q", "dq_int"), "kS": ("k", "dkS")}
        spec = specs[key]
        P, w = c["C"], gt[spec[1]].shape[2]
        ops = [x[spec[0]][:, j0 * w:(j0 + n) * w], _flat(gt[spec[1]])]
    prod = nl.ndarray((P, n * w), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod, data1=ops[0], data2=ops[1], op=nl.multiply, engine=engine)
    r = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.add, data=prod.reshape((P, n, w)), axis=(2,))
    c["rd"][key] = r


def _rowsum(a, b, C, w):
    """[C, 1] = sum over the free axis of a * b."""
    prod = nl.ndarray((C, w), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod, data1=a, data2=b, op=nl.multiply, engine=nisa.engine.gpsimd)
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
    ch["nec"] = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ch["nec"], data=ch["ec"], op0=nl.multiply, operand0=-1.0)
    ch["nbeta"] = nl.ndarray((C, nh), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ch["nbeta"], data=x["beta"], op0=nl.multiply, operand0=-1.0)
    return ch


def _run_groups(c, groups, grads):
    """Every step (_steps) of the head groups, software-pipelined: group g starts its steps
    g * off steps after the first (off = ceil(steps / _PIPE), so at most _PIPE groups are
    in flight: their SBUF tiles live at once); at each pipeline tick the groups in flight
    issue one step each, the oldest group first (its step waits on the longest chain), so
    each in-order engine queue holds independent work of several groups between one
    group's dependent steps. Within a step every head of the group is issued
    before the next step; a step's matmuls / transposes of the group share one PSUM bank
    and one eviction (_gmm, _gT), read from the next step on. ``grads``: the backward,
    else the forward recompute with its state update."""
    steps = _steps(c["C"], grads)
    ns = len(steps)
    off = -(-ns // _PIPE)
    cgs = []
    for grp in groups:
        cg = dict(c)
        cg["group"] = _head_dicts(grp)
        cg["bank"] = {}
        cg["gt"] = {}
        cg["rd"] = {}
        cgs.append(cg)
    for t in range((len(groups) - 1) * off + ns):
        for g in range(len(groups)):
            k = t - g * off
            if k >= 0 and k < ns:
                for d in cgs[g]["group"]:
                    steps[k][0](cgs[g], d, steps[k][1])


def _steps(C, grads):
    """The steps of a head, in order, as (function, argument): operands, decays; the
    forward recompute then solves for T (setup, _ROUNDS doubling rounds, the block
    substitution when C > 32), keeps it in tstore and goes on with T^T, r and the state
    update; the backward reads T back (issued with the operands) and goes on with T^T, r,
    the gradient operands and the gradient steps."""
    st = [(_r_operands, grads), (_r_decay_a, 0), (_r_decay_b, 0)]
    if not grads:
        st.append((_r_solve_setup, 0))
        for r in range(_ROUNDS):
            st = st + [(_r_doubling_a, r), (_r_doubling_b, r)]
        if C > BLOCK:
            st = st + [(_r_blocks_a, 0), (_r_blocks_b, 0), (_r_substitute_a, 0),
                       (_r_substitute_b, 0), (_r_substitute_c, 0)]
    st = st + [(_r_transpose, grads), (_r_rhs, 0)]
    if grads:
        st = st + [(_r_grad_operands_a, 0), (_r_grad_operands_b, 0), (_g_dvn_a, 0),
                   (_g_dvn_b, 0), (_g_z, 0), (_g_transposes, 0), (_g_dp, 0), (_g_da_a, 0),
                   (_g_da_b, 0), (_g_state_products, 0), (_g_dq_dk, 0), (_g_dbeta, 0),
                   (_g_dg_a, 0), (_g_dg_b, 0), (_g_dh, 0)]
    else:
        st = st + [(_state_update_a, 0), (_state_update_b, 0)]
    return st


def _gmm(c, d, key, st, mv, M, N, tf=True, op=None):
    """Head d's st^T mv ([M, N]) into its slice of the group's PSUM bank ``key``; the
    group's last head evicts the bank once (ScalarE; ``op``: an activation instead of a
    copy) to an ``[M, heads, N]`` tile and gives each head its view d[key]. ``tf``: the
    operands as tfloat32 for 16-bit callers (_tf)."""
    mode = "fp32"
    if tf:
        mode = "tf"
    _gacc(c, d, key, [(st, mv, mode)], M, N, op)


def _gplus(c, d, key, st, X, C):
    """Head d's X + st^T X ([C, C]) as _gacc: the identity product (float32, exact) and
    st^T X accumulated in the group's bank, one eviction for the group."""
    _gacc(c, d, key, [(c["cst"]["ident"][0:C, 0:C], X, "01"), (st, X, "tf")], C, C, None)


def _gacc(c, d, key, prods, M, N, op):
    """Head d's sum of st^T mv over prods ((st, mv, mode) each, accumulated in PSUM; mode
    "tf": tfloat32 operands for 16-bit callers, "fp32", or "01": st holds only 0 / 1) into
    its slice of the group's PSUM bank ``key``, evicted as in _gmm."""
    if not _bank(c, d, key, prods, M, N):
        return
    ds = c["group"]
    n = len(ds)
    ps = c["bank"][key]
    out = nl.ndarray((M, n, N), dtype=nl.float32, buffer=nl.sbuf)
    if op is None:
        nisa.tensor_copy(dst=out.reshape((M, n * N)), src=ps, engine=nisa.engine.scalar)
    else:
        nisa.activation(dst=out.reshape((M, n * N)), op=op, data=ps)
    c["gt"][key] = out
    for e in range(n):
        ds[e][key] = out[:, e, :]


def _bank(c, d, key, prods, M, N):
    """Head d's sum of products (as _gacc) into its slice of the group's PSUM bank ``key``
    (c["bank"][key], ``[M, heads*N]``), left in PSUM: True at the group's last head (the
    bank complete, for one instruction over the group)."""
    ds = c["group"]
    i = d["i"]
    if i == 0:
        c["bank"][key] = nl.ndarray((M, len(ds) * N), dtype=nl.float32, buffer=nl.psum)
    ps = c["bank"][key]
    for t in range(len(prods)):
        st = prods[t][0]
        mv = prods[t][1]
        if prods[t][2] == "tf":
            nisa.nc_matmul(dst=ps[:, i * N:(i + 1) * N], stationary=_tf(c, st),
                           moving=_tf(c, mv), accumulate=t > 0)
        elif prods[t][2] == "01":
            nisa.nc_matmul(dst=ps[:, i * N:(i + 1) * N], stationary=st, moving=mv,
                           is_stationary_onezero=True, accumulate=t > 0)
        else:
            nisa.nc_matmul(dst=ps[:, i * N:(i + 1) * N], stationary=st, moving=mv,
                           accumulate=t > 0)
    return i == len(ds) - 1


def _gnew(c, key, P, F):
    """A new ``[P, heads, F]`` SBUF tile of the group (c["gt"][key]; each head's view in
    its d[key])."""
    ds = c["group"]
    t = nl.ndarray((P, len(ds), F), dtype=nl.float32, buffer=nl.sbuf)
    c["gt"][key] = t
    for e in range(len(ds)):
        ds[e][key] = t[:, e, :]
    return t


def _flat(t):
    """A ``[P, heads, F]`` tile as ``[P, heads*F]``."""
    return t.reshape((t.shape[0], t.shape[1] * t.shape[2]))


def _rep(t, n):
    """A ``[P, F]`` constant as the ``[P, n, F]`` operand repeating it for n heads (a zero
    stride, as in mamba2_ssd/chunk.py)."""
    return t.ap(pattern=[[t.shape[1], t.shape[0]], [0, n], [1, t.shape[1]]], offset=0)


def _cols(t, c):
    """The group's columns of a per-head ``[P, nh]`` tile: ``[P, heads]``."""
    j0 = c["group"][0]["j"]
    return t[:, j0:j0 + len(c["group"])]


def _colb(t, c, F):
    """The group's columns of a per-head ``[P, nh]`` tile, each repeated F times along the
    free axis: the ``[P, heads, F]`` operand scaling each head's rows (a zero stride, as in
    mamba2_ssd/chunk.py)."""
    return t.ap(pattern=[[t.shape[1], t.shape[0]], [1, len(c["group"])], [0, F]],
                offset=c["group"][0]["j"])


def _gT(c, d, key, src, P, F):
    """Head d's src [P, F]^T into its slice of the group's PSUM bank ``key`` (TensorE,
    float32 bit-exact); the group's last head evicts the bank once (ScalarE) to an
    ``[F, heads, P]`` tile and gives each head its view d[key]."""
    ds = c["group"]
    n = len(ds)
    i = d["i"]
    if i == 0:
        c["bank"][key] = nl.ndarray((F, n * P), dtype=nl.float32, buffer=nl.psum)
    ps = c["bank"][key]
    nisa.nc_transpose(dst=ps[:, i * P:(i + 1) * P], data=src, engine=nisa.engine.tensor)
    if i == n - 1:
        out = nl.ndarray((F, n, P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out.reshape((F, n * P)), src=ps, engine=nisa.engine.scalar)
        for e in range(n):
            ds[e][key] = out[:, e, :]


def _r_transpose(c, d, grads):
    """T^T (and in the forward recompute T to tstore)."""
    if d["i"] == 0:
        _gscaled(c, "bv", c["x"]["v"], c["x"]["beta"], c["V"])
        if not grads:
            _gscaled(c, "kd", c["x"]["k"], c["ch"]["el"], c["K"])
    _gT(c, d, "TT", d["T"], c["C"], c["C"])
    if not grads:
        _t_store(c, d)


def _t_view(c, d):
    """Head d's ``[C, C]`` block of tstore at the chunk's row (c["trow"])."""
    C, w = c["C"], c["tstore"].shape[1]
    return at_row(c["tstore"], c["trow"], [[w, C], [1, C]], d["j"] * C)


def _t_store(c, d):
    """T of head d (float32, exact) to the chunk's tstore block, for the backward."""
    nisa.dma_copy(dst=_t_view(c, d), src=d["T"])


def _t_load(c, d):
    """T of head d from the chunk's tstore block (written by the forward recompute)."""
    d["T"] = nl.ndarray((c["C"], c["C"]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=d["T"], src=_t_view(c, d))


def _r_operands(c, d, grads):
    """k, k^T and gU[m, i] = g_m (m <= i) of head d["j"]; T from tstore (the backward)."""
    C, K, j = c["C"], c["K"], d["j"]
    d["k"] = c["x"]["k"][:, j * K:(j + 1) * K]
    d["beta"] = c["x"]["beta"][:, j:j + 1]
    _gT(c, d, "kT", d["k"], C, K)
    d["gU"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=d["gU"], op=nl.copy, data=c["cst"]["tri_up"],
                    scale=c["x"]["g"][:, j:j + 1])
    if grads:
        _t_load(c, d)


def _r_decay_a(c, d, arg):
    """D[i, j] = exp(seg(j, i]) from direct segment sums (fp32 matmul with a 0/1 operator;
    the exp evicts the group's bank)."""
    C = c["C"]
    _gmm(c, d, "D", d["gU"], c["cst"]["tri_lo"], C, C, tf=False, op=nl.exp)


def _r_decay_b(c, d, arg):
    """Dl, the strictly lower part of D ([i, j], i > j), and KKD = (k k^T) Dl: one GpSimd
    and one VectorE instruction for the group."""
    C, cst = c["C"], c["cst"]
    n = len(c["group"])
    if d["i"] == 0:
        Dl = _gnew(c, "Dl", C, C)
        nisa.tensor_tensor(dst=Dl, data1=c["gt"]["D"], data2=_rep(cst["tri_lo"], n),
                           op=nl.multiply, engine=nisa.engine.gpsimd)
    if _bank(c, d, "kk", [(d["kT"], d["kT"], "tf")], C, C):
        KKD = _gnew(c, "KKD", C, C)
        nisa.tensor_tensor(dst=_flat(KKD), data1=c["bank"]["kk"], data2=_flat(c["gt"]["Dl"]),
                           op=nl.multiply)


def _r_solve_setup(c, d, arg):
    """A = beta_i KKD; N = -A_bd (the 32-row diagonal blocks), N^T, T = I + N."""
    C, cst = c["C"], c["cst"]
    d["A"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=d["A"], op=nl.copy, data=d["KKD"], scale=d["beta"])
    N = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=N, data=d["A"], op0=nl.multiply, operand0=-1.0,
                              op1=nl.multiply, operand1=cst["bd"])
    d["N"] = N
    d["T"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d["T"], data1=N, data2=cst["ident"], op=nl.add)
    _gT(c, d, "NT", N, C, C)


def _r_doubling_a(c, d, rnd):
    """Round rnd of the doubling, its products: (N^2)^T = N^T N^T and N^2 (while needed)."""
    C = c["C"]
    _gmm(c, d, "N2T", d["N"], d["NT"], C, C)
    if 4 << rnd < BLOCK:
        _gmm(c, d, "N", d["NT"], d["N"], C, C)


def _r_doubling_b(c, d, rnd):
    """T <- (I + N^{2^(rnd+1)}) T."""
    d["NT"] = d["N2T"]
    _gplus(c, d, "T", d["N2T"], d["T"], c["C"])


def _r_blocks_a(c, d, arg):
    """-A_off (A outside the diagonal blocks, negated) and Tb^T."""
    C = c["C"]
    d["nAoff"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d["nAoff"], data1=d["A"], data2=c["cst"]["noff"],
                       op=nl.multiply, engine=nisa.engine.gpsimd)
    _gT(c, d, "TbT", d["T"], C, C)


def _r_blocks_b(c, d, arg):
    """-M = -Tb A_off and -M^T."""
    C = c["C"]
    _gmm(c, d, "nM", d["TbT"], d["nAoff"], C, C)
    _gmm(c, d, "nMT", d["nAoff"], d["TbT"], C, C)


def _r_substitute_a(c, d, arg):
    """M^2 = (-M)(-M) (C > 64; M^2 = 0 with 2 blocks)."""
    C = c["C"]
    if C > 2 * BLOCK:
        _gmm(c, d, "M2", d["nM"], d["nMT"], C, C)


def _r_substitute_b(c, d, arg):
    """T <- (I + M^2) Tb."""
    C = c["C"]
    if C > 2 * BLOCK:
        _gplus(c, d, "T", d["M2"], d["T"], C)


def _r_substitute_c(c, d, arg):
    """T <- (I - M) T."""
    _gplus(c, d, "T", d["nMT"], d["T"], c["C"])


def _r_rhs(c, d, arg):
    """r = beta (v - e^c (k h))."""
    C, V, j = c["C"], c["V"], d["j"]
    ps = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=_tf(c, d["kT"]), moving=_tf(c, c["S"][:, j * V:(j + 1) * V]),
                   accumulate=False)
    d["r"] = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=d["r"], data=ps, op0=nl.multiply,
                              operand0=c["ch"]["nbec"][:, j:j + 1], op1=nl.add,
                              operand1=d["bv"])


def _r_grad_operands_a(c, d, arg):
    """q, q^T, Di (D, i >= j), DT = exp of the [j, i] segment sums."""
    C, K, j, cst = c["C"], c["K"], d["j"], c["cst"]
    if d["i"] == 0:
        _row_dot(c, "hs", nisa.engine.vector)
    d["q"] = c["x"]["q"][:, j * K:(j + 1) * K]
    _gT(c, d, "qT", d["q"], C, K)
    if d["i"] == 0:
        Di = _gnew(c, "Di", C, C)
        nisa.tensor_tensor(dst=Di, data1=c["gt"]["D"], data2=_rep(cst["tri_li"], len(c["group"])),
                           op=nl.multiply, engine=nisa.engine.gpsimd)
    _gmm(c, d, "DT", cst["tri_lo"], d["gU"], C, C, tf=False, op=nl.exp)


def _r_grad_operands_b(c, d, arg):
    """DTi ([j, i] layout, i >= j), QKD = (q k^T) Di."""
    C, cst = c["C"], c["cst"]
    if d["i"] == 0:
        DTi = _gnew(c, "DTi", C, C)
        nisa.tensor_tensor(dst=DTi, data1=c["gt"]["DT"], data2=_rep(cst["tri_up"], len(c["group"])),
                           op=nl.multiply, engine=nisa.engine.gpsimd)
    if _bank(c, d, "qk", [(d["qT"], d["kT"], "tf")], C, C):
        QKD = _gnew(c, "QKD", C, C)
        nisa.tensor_tensor(dst=_flat(QKD), data1=c["bank"]["qk"], data2=_flat(c["gt"]["Di"]),
                           op=nl.multiply)


def _state_update_a(c, d, arg):
    """vn = T r."""
    _gmm(c, d, "vn", d["TT"], d["r"], c["C"], c["V"])


def _state_update_b(c, d, arg):
    """h' = e^{c_L} h + (e^{c_L - c} k)^T vn, into S (head d["j"]'s columns)."""
    C, K, V, j, ch = c["C"], c["K"], c["V"], d["j"], c["ch"]
    vn = d["vn"]
    kd = d["kd"]
    ps = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=_tf(c, kd), moving=_tf(c, vn), accumulate=False)
    Sh = c["S"][:, j * V:(j + 1) * V]
    nisa.scalar_tensor_tensor(dst=Sh, data=Sh, op0=nl.multiply, operand0=ch["ecL"][:, j:j + 1],
                              op1=nl.add, operand1=ps)


def _tf(c, t):
    """t as a TensorE operand: its tfloat32 view for bf16 callers (c["fast"]), else itself
    (_common.tf32_view)."""
    return tf32_view(t, c["fast"])


def _gscaled(c, key, a, col, w):
    """The group's columns of a ``[C, nh*w]`` times each head's per-row column of col
    ``[C, nh]``: a new group tile ``key`` ``[C, heads, w]``, one GpSimd instruction (it
    reads only the chunk's inputs, so it runs ahead of the group's chains)."""
    n = len(c["group"])
    j0 = c["group"][0]["j"]
    t = _gnew(c, key, c["C"], w)
    nisa.tensor_tensor(dst=t, data1=a[:, j0 * w:(j0 + n) * w].reshape((c["C"], n, w)),
                       data2=_colb(col, c, w), op=nl.multiply, engine=nisa.engine.gpsimd)


def _scaled(a, col, C, w):
    """a [C, w] times the per-row column col [C, 1]."""
    t = nl.ndarray((C, w), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=t, op=nl.copy, data=a, scale=col)
    return t


def _g_dvn_a(c, d, arg):
    """vn^T = (T r)^T and QKD^T do."""
    C, V, j = c["C"], c["V"], d["j"]
    d["do"] = c["x"]["do"][:, j * V:(j + 1) * V]
    d["dSh"] = c["dS"][:, j * V:(j + 1) * V]
    d["h"] = c["S"][:, j * V:(j + 1) * V]
    _gmm(c, d, "vnT", d["r"], d["TT"], V, C)
    _gmm(c, d, "pa", d["QKD"], d["do"], C, V)


def _g_dvn_b(c, d, arg):
    """dvn = QKD^T do + e^{c_L - c} (k dh')."""
    C, V, j = c["C"], c["V"], d["j"]
    pk = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pk, stationary=_tf(c, d["kT"]), moving=_tf(c, d["dSh"]), accumulate=False)
    d["dvn"] = nl.ndarray((C, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=d["dvn"], data=pk, op0=nl.multiply,
                              operand0=c["ch"]["el"][:, j:j + 1], op1=nl.add, operand1=d["pa"])


def _g_z(c, d, arg):
    """z = T^T dvn, z^T."""
    C, V = c["C"], c["V"]
    _gmm(c, d, "z", d["T"], d["dvn"], C, V)
    _gmm(c, d, "zT", d["dvn"], d["T"], V, C)


def _g_transposes(c, d, arg):
    """dv = beta z; do^T, h^T, dh'^T."""
    C, K, V, j = c["C"], c["K"], c["V"], d["j"]
    if d["i"] == 0:
        _row_dot(c, "vz", nisa.engine.vector)
    nisa.activation(dst=_gtile(c, d, "dv", C, V), op=nl.copy, data=d["z"],
                    scale=d["beta"])
    _gT(c, d, "doT", d["do"], C, V)
    _gT(c, d, "hT", d["h"], K, V)
    _gT(c, d, "dST", d["dSh"], K, V)


def _g_dp(c, d, arg):
    """dP = do vn^T masked by D: dPD [i, j], dPDT [j, i]; G = dP QKD (the attention part of
    the decays' gradient)."""
    C = c["C"]
    if _bank(c, d, "pp", [(d["doT"], d["vnT"], "tf")], C, C):
        pp, gt = c["bank"]["pp"], c["gt"]
        nisa.tensor_tensor(dst=_flat(_gnew(c, "dPD", C, C)), data1=pp, data2=_flat(gt["Di"]),
                           op=nl.multiply)
        nisa.tensor_tensor(dst=_flat(_gnew(c, "G", C, C)), data1=pp, data2=_flat(gt["QKD"]),
                           op=nl.multiply)
    if _bank(c, d, "ppt", [(d["vnT"], d["doT"], "tf")], C, C):
        nisa.tensor_tensor(dst=_flat(_gnew(c, "dPDT", C, C)), data1=c["bank"]["ppt"],
                           data2=_flat(c["gt"]["DTi"]), op=nl.multiply)


def _g_da_a(c, d, arg):
    """z vn^T."""
    _gmm(c, d, "zv", d["zT"], d["vnT"], c["C"], c["C"])


def _g_da_b(c, d, arg):
    """dA = -z vn^T (strictly lower): W1 = (z vn^T) KKD, E = dA beta D and E^T, G -= beta W1
    (dA A)."""
    C, j = c["C"], d["j"]
    zv = d["zv"]
    if d["i"] == 0:
        gt = c["gt"]
        W1 = _gnew(c, "W1", C, C)
        nisa.tensor_tensor(dst=_flat(W1), data1=_flat(gt["zv"]), data2=_flat(gt["KKD"]),
                           op=nl.multiply, engine=nisa.engine.gpsimd)
        bW1 = nl.ndarray((C, len(c["group"]), C), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=bW1, data1=W1, data2=_colb(c["x"]["beta"], c, C),
                           op=nl.multiply)
        nisa.tensor_tensor(dst=_flat(gt["G"]), data1=_flat(gt["G"]), data2=_flat(bW1),
                           op=nl.subtract, engine=nisa.engine.gpsimd)
    d["Em"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=d["Em"], data=zv, op0=nl.multiply,
                              operand0=c["ch"]["nbeta"][:, j:j + 1], op1=nl.multiply,
                              operand1=d["Dl"])
    _gT(c, d, "ET", d["Em"], C, C)


def _g_state_products(c, d, arg):
    """e^c do h^T (dq's inter-chunk part), y = z h^T, dkS = e^{c_L - c} vn dh'^T."""
    C, K, j, ch = c["C"], c["K"], d["j"], c["ch"]
    doh = nl.ndarray((C, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=doh, stationary=_tf(c, d["doT"]), moving=_tf(c, d["hT"]), accumulate=False)
    d["dq_int"] = _gtile(c, d, "dq_int", C, K)
    nisa.activation(dst=d["dq_int"], op=nl.copy, data=doh, scale=ch["ec"][:, j:j + 1])
    _gmm(c, d, "y", d["zT"], d["hT"], C, K)
    pvs = nl.ndarray((C, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pvs, stationary=_tf(c, d["vnT"]), moving=_tf(c, d["dST"]), accumulate=False)
    d["dkS"] = _gtile(c, d, "dkS", C, K)
    nisa.activation(dst=d["dkS"], op=nl.copy, data=pvs, scale=ch["el"][:, j:j + 1])


def _g_dq_dk(c, d, arg):
    """dq = e^c do h^T + dPD k; dk = dPD^T q + E k + E^T k + dkS - beta e^c y."""
    C, K, j, out = c["C"], c["K"], d["j"], c["out"]
    k = d["k"]
    ident = c["cst"]["ident"][0:C, 0:C]
    if _bank(c, d, "pq", [(d["dPDT"], k, "tf"), (ident, d["dq_int"], "01")], C, K):
        j0 = c["group"][0]["j"]
        n = len(c["group"])
        nisa.tensor_copy(dst=_flat(_gnew(c, "dq", C, K)), src=c["bank"]["pq"],
                         engine=nisa.engine.scalar)
    pkk = nl.ndarray((C, K), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pkk, stationary=_tf(c, d["dPD"]), moving=_tf(c, d["q"]), accumulate=False)
    nisa.nc_matmul(dst=pkk, stationary=_tf(c, d["ET"]), moving=_tf(c, k), accumulate=True)
    nisa.nc_matmul(dst=pkk, stationary=_tf(c, d["Em"]), moving=_tf(c, k), accumulate=True)
    nisa.nc_matmul(dst=pkk, stationary=ident, moving=d["dkS"], is_stationary_onezero=True,
                   accumulate=True)
    nisa.scalar_tensor_tensor(dst=_gtile(c, d, "dk", C, K), data=d["y"], op0=nl.multiply,
                              operand0=c["ch"]["nbec"][:, j:j + 1], op1=nl.add, operand1=pkk)
    if d["i"] == len(c["group"]) - 1:
        for name in ("dq", "dk", "dv"):
            _scatter(c, name)


def _scatter(c, name):
    """The group's ``[C, heads*w]`` tile of output ``name`` to its token rows and columns of
    the program's part (one row per partition)."""
    out = c["out"]
    dst = out["hbm"][name]
    ow = dst.shape[1]
    t = _flat(c["gt"][name])
    w = t.shape[1]
    nisa.dma_copy(dst=dst.ap(pattern=[[ow, c["C"]], [1, w]],
                             offset=out["base"] * ow + c["group"][0]["j"] * (w // len(c["group"])),
                             vector_offset=out["rows"], indirect_dim=0), src=t)


def _g_dbeta(c, d, arg):
    """dbeta = <v, z> - e^c <k, y> - rowsum(W1); the group's row dots first (_row_dots)."""
    C = c["C"]
    n = len(c["group"])
    if d["i"] > 0:
        return
    _gscaled(c, "eq", c["x"]["q"], c["ch"]["ec"], c["K"])
    _gscaled(c, "bek", c["x"]["k"], c["ch"]["nbec"], c["K"])
    _row_dot(c, "ky", nisa.engine.vector)
    _row_dot(c, "qdq", nisa.engine.vector)
    _row_dot(c, "kS", nisa.engine.vector)
    rd = c["rd"]
    w1 = nl.ndarray((C, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=w1, op=nl.add, data=c["gt"]["W1"], axis=(2,))
    db = nl.ndarray((C, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=db, data1=rd["ky"], data2=_cols(c["ch"]["nec"], c), op=nl.multiply)
    nisa.tensor_tensor(dst=db, data1=db, data2=rd["vz"], op=nl.add)
    nisa.tensor_tensor(dst=_cols(c["out"]["dbeta"], c), data1=db, data2=w1, op=nl.subtract)


def _g_dg_a(c, d, arg):
    """dg_m = sum_{i >= m} X_i + sum_{j < m} Q_j + e^{c_L} <dh', h> + sum_{i >= m > j} G[i, j]
    (module docstring): the straddling pairs of G summed directly, never rowsum G - colsum G
    reverse-summed (that cancels the pairs inside [m, C) and loses the small straddling
    ones under strong decays); X = <q, e^c do h^T> - beta e^c <k, y>, Q = <k, dkS> (the
    group's [C, heads] columns, from _row_dots); then G^T."""
    C, ch = c["C"], c["ch"]
    if d["i"] == 0:
        rd = c["rd"]
        n = len(c["group"])
        X = nl.ndarray((C, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=X, data1=rd["ky"], data2=_cols(ch["nbec"], c), op=nl.multiply)
        nisa.tensor_tensor(dst=X, data1=X, data2=rd["qdq"], op=nl.add)
        hs = nl.ndarray((c["K"], n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=hs, data1=rd["hs"], data2=_cols(ch["ecL"], c), op=nl.multiply)
        rd["X"] = X
        rd["hsL"] = hs
    _gT(c, d, "GT", d["G"], C, C)


def _g_dg_b(c, d, arg):
    """dg of the group: per head the straddling sums Hm[i, m] = sum_{j < m} G[i, j] (i >= m;
    G^T against tri_su, float32) summed over i, then the group's X, Q and state terms
    (one matmul each over the group's columns), one eviction."""
    C, K, cst = c["C"], c["K"], c["cst"]
    if not _bank(c, d, "Hps", [(d["GT"], cst["tri_su"], "fp32")], C, C):
        return
    n = len(c["group"])
    ds = c["group"]
    rd = c["rd"]
    Hm = _gnew(c, "Hm", C, C)                       # [i, m]: sum_{j < m} G, i >= m
    nisa.tensor_tensor(dst=Hm, data1=c["bank"]["Hps"].reshape((C, n, C)),
                       data2=_rep(cst["tri_li"], n), op=nl.multiply)
    pg = nl.ndarray((C, n), dtype=nl.float32, buffer=nl.psum)
    for e in range(n):
        nisa.nc_matmul(dst=pg[:, e:e + 1], stationary=ds[e]["Hm"], moving=cst["ones"][0:C, 0:1],
                       accumulate=False)
    nisa.nc_matmul(dst=pg, stationary=cst["tri_li"], moving=rd["X"], accumulate=True)
    nisa.nc_matmul(dst=pg, stationary=cst["tri_su"], moving=rd["kS"], accumulate=True)
    nisa.nc_matmul(dst=pg, stationary=cst["ones"][0:K, 0:C], moving=rd["hsL"], accumulate=True)
    nisa.tensor_copy(dst=_cols(c["out"]["dg"], c), src=pg, engine=nisa.engine.vector)


def _g_dh(c, d, arg):
    """dh = e^{c_L} dh' + (e^c q)^T do - (beta e^c k)^T z, into dS (after every reader of
    this head's dh')."""
    C, K, V, j, ch = c["C"], c["K"], c["V"], d["j"], c["ch"]
    eq = d["eq"]
    bek = d["bek"]
    ph = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ph, stationary=_tf(c, eq), moving=_tf(c, d["do"]), accumulate=False)
    nisa.nc_matmul(dst=ph, stationary=_tf(c, bek), moving=_tf(c, d["z"]), accumulate=True)
    nisa.scalar_tensor_tensor(dst=d["dSh"], data=d["dSh"], op0=nl.multiply,
                              operand0=ch["ecL"][:, j:j + 1], op1=nl.add, operand1=ph)
