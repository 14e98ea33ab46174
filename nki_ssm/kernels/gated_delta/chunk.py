"""Gated DeltaNet chunked prefill (WY / UT form) over a ragged batch, state pool in place.

Kernel: ``gdn_chunk_prefill`` (``@nki.jit``); launcher ``nki_ssm.ops.launch.gated_delta.prefill``.

Files: this one holds the kernel (its loops, the LNC split, the state round trips between
the pool and the scratch blocks); ``chunk_pipeline.py`` the loop body (the software
pipeline over head groups and chunks, one job per dependent step);
``chunk_block_solve.py`` the packed 32-row block solve; ``chunk_state_rhs.py`` the steps
of the form with the state in the right-hand side (>= 8 head groups);
``chunk_wy.py`` those of the WY form (fewer); ``chunk_utils.py`` what they share (also
with ``chunk_backward.py``).

Math, per chunk of C tokens of one sequence (chunks start at the sequence's first
token; rows past its end are masked, below), per value head ``hv`` (q/k head
``hv // (HV // H)``), state ``S [K, V]`` entering the chunk::

    seg(j, i] = sum_{j < m <= i} g_m          direct segment sums, never c_i - c_j
    D[i, j]   = exp(seg(j, i])  (i >= j)      of two running sums (that cancels)
    A         = strictly-lower((k_i . k_j) D[i, j] beta_j)          (beta on columns)
    Y         = (I + A)^{-1} (v - e^{c} (k S))                      c_i = seg(start, i]
    o         = scale e^{c} (q S) + scale (tril(q k^T) D diag(beta)) Y
    S        <- e^{c_last} S + (beta e^{c_last - c} k)^T Y

This is the WY / UT form with beta folded into the unknown: the textbook
``(I + diag(beta) K K^T*D) v_new = diag(beta) (v - e^c k S)`` has the solution
``v_new = beta Y`` with Y as above, so beta becomes a per-partition scale of the
[j, i]-layout operands (A^T, the masked q k^T, the decayed keys) and no operand
needs a per-column one. ``W S`` is folded into the right-hand side: one system
of width V per head, no W. The system is solved exactly on 32-row blocks
(DESIGN.md), packed over up to 4 heads (head h on partitions 32h..32h+31, the matrices
block-diagonal over the heads, so one whole-array matmul serves 4 heads): each diagonal
block inverted by nilpotent doubling ``(I - N)^{-1} = (I + N)(I + N^2)(I + N^4)...``
(N = -A_bb, 4 rounds; the inverse kept compact, a quarter of the columns), then
forward substitution over the blocks, ``X_b = A_bb^{-1} (R_b - sum_{k<b} A_bk X_k)``:
one PSUM accumulation of the off-diagonal products, one subtraction and one
application per block for the 4 heads; never a series over the whole chunk.

With fewer than 8 head groups (few_groups: TP2 and up) the state chains bind, so the
solve leaves them: the system is solved for the state-free right-hand sides
``B = [v | -e^c k]`` (width V + K), giving ``[u | nw] = (I + A)^{-1} B`` and
``Y = u + nw S``; then, with ``kd = beta e^{c_last - c} k`` and ``qd = scale e^c q``::

    S <- e^{c_last} S + kd^T u + (nw^T kd)^T S
    o  = M u + (qd + M nw) S                  M = scale tril(q k^T) D diag(beta)

so a chunk's state chain is one PSUM accumulation (kd^T u, issued early, plus
(nw^T kd)^T S) and one VectorE update, and the outputs read S through one matmul; Y is
never formed. The right-hand sides are not packed: each head's block inverses are moved
to the block's own rows (G, chunk_block_solve.place_g), and block b's application ``X_b = inv_bb B_b +
inv_bb Z_b`` reads B_b where it is, through one matmul per head on the PE array's 32-row
row tile at (32 b, 0); the off-diagonal blocks are placed by SBUF-to-SBUF DMAs.

Arguments (prepared by the launcher; Tb = the token bucket, Nb = the sequence bucket)
-------------------------------------------------------------------------------------
q2, k2 ``[Tb + 1, H*K]`` (q's dtype; float32 with use_qk_l2norm), v2 ``[Tb + 1, HV*V]``
(q's dtype; row Tb and rows past num_tokens are zero in all three); gate1, gate2 ``[Tb + 1, HV]`` float32: g and beta, or raw a and b;
head_params ``[128, 2*HV]`` float32 (A_log, dt_bias on every row) or None; pool
``[slots*HV*K, V]`` float32 or bfloat16 (the ``[slots, HV, K, V]`` pool, updated in
place: a slot is the contiguous block from row ``slot*HV*K``); the int32 work lists of
``prefill_tables`` (their layouts are documented there): body_rows / body_state (bodies
of n = ``chunks_per_iteration`` (of a program's heads) consecutive chunks of one sequence: token rows,
source and destination state block), tail_rows / tail_state (each sequence's last
``chunks mod n`` chunks, one per row), init_tab, final_tab (state copies pool -> block,
block -> pool), pad_rows (chunks of padding sequences), counts ``[programs, 5]`` (each
program's trip counts). Compile-time arguments: H, raw_gates, use_qk_l2norm, scale, chunk,
bf16 (= the activations are bfloat16) and the shapes. Returns o ``[Tb + 1, HV*V]`` in q's
dtype (rows of padding sequences zero; the launcher slices ``[:num_tokens]``).

LNC: the value heads split across the programs
----------------------------------------------
Launched as a grid of ``programs`` (1, or 2 on a trn2 / trn3 logical core of two physical
cores; ``scaffold.lnc_grid``), program ``pid`` computes the value heads
``hv0 .. hv0 + HV/programs - 1`` (``scaffold.program_share``, ``_program_window``; Python
ints at trace time) for every chunk of the batch: the heads are independent (own gates, own
state), so the split reorders no reduction and the results equal LNC=1 bit for bit. Both
programs run the same work lists (shared tables, the one counts row included: one control
flow) and the same instructions over their own heads: q/k columns of the q/k heads their
value heads read (HV = 2 at H = 1: both read head 0), v / g / beta / A_log / dt_bias
columns, o columns (padding rows and the trash row included), pool rows
``slot*HV*K + hv0*K ..`` of each slot, and a scratch of their own (blocks
``pid * nblocks ..``). So no HBM byte is written by two programs, nor written by one and
read by the other, and no synchronisation is needed. When HV does not split evenly (odd
HV, e.g. 1) every program computes every head with the same trip counts, program 1 into
private dumps of o and the pool (``scaffold.destination``: it reads its initial states
from the uninitialised dump and computes on garbage nothing reads) and its own scratch
blocks. Within a program
everything below holds with HV its own heads: at Qwen3-Next TP1 (32 value heads) 16 per
program, 4 head groups, 2 chunks per body; at TP4 (8) 4 per program, one group, 8 chunks.

Loops: one runtime level, five ``nl.fori_loop`` in sequence
-----------------------------------------------------------
Trip counts are ``NkiScalar`` s loaded once, before the first loop
(``scaffold.trip_counts``); the loop's iteration value (an ``NkiScalar``) selects the work
row; a row's block and pool rows are ``NkiScalar`` s too (``scaffold.row_cells``), the
``scalar_offset`` of the state DMAs. Batch composition is data: a sequence with or
without initial state, a first or a later row, a final or an intermediate state differ
only in the block rows of their work rows. Between rows the state lives in ``scratch``,
a float32 HBM tensor the kernel allocates: per program, one ``[K, HV*V]`` block per live
sequence and a zero block.

1. padding chunks: zeros scattered to the output rows of padding sequences;
2. init_tab: each live sequence with an initial state: its pool slot -> its block (the
   DMAs keep the pool's dtype; a bfloat16 slot is widened by VectorE in SBUF);
3. body rows: the row's n chunks gathered (chunk 0 first), S [K, HV*V] <- the row's
   source block (one DMA per head group), n chunks in a software pipeline (below), S ->
   the destination block (per head group, as soon as the row's last chunk updated it);
   nothing crosses an iteration boundary in SBUF but the constants and the solve tiles'
   zeros;
4. tail rows (n > 1 only): the same with one chunk per row;
5. final_tab: each live sequence's block -> its pool slot (bf16 pools: rounded by
   VectorE, then DMA'd in the pool's dtype).

A runtime loop drains every engine at each iteration boundary (nki-dynamic-loops.rst,
"Iterations Do Not Overlap"), so with few heads per core a body holds several chunks
(``chunks_per_iteration``: about 8 head groups in flight: 1 at Qwen3-Next TP1, 2 at TP2, 4 at
TP4, 8 with one group: TP8, TP4 at LNC=2; half as many from 2 groups on, for SBUF, without
``compact_inputs``: float32 callers, or one q/k head per value head). Rows past a sequence's
end read the zero row (q = k = v = 0, g = 0, beta = 0; raw gates: g is multiplied by a
row-valid column, as softplus(dt_bias) != 0): such a row adds nothing to A, to v_new of the
real rows (strictly lower products never reach them) or to S, and g = 0 leaves every decay
exact; its output row is scattered to the trash row Tb. Padding tokens are never read as data
of a live sequence, so non-finite padding cannot leak. What is unrolled in a body is bounded by
the layer (heads, 32-row blocks, n), so the program size does not depend on the batch.

A body: software pipeline over head groups and chunks
-----------------------------------------------------
Each group of 4 value heads has a list of jobs, one per dependent step (``chunk_pipeline._group_jobs``:
q/k transposes; their masked products; gU; the decays; A^T (>= 8 groups: with M^T); the
packed solve's layout moves (>= 8 groups: with kd); the right-hand sides (k S, or < 8 groups [v | -e^c k]); q S (>= 8 groups); the
solve setup; per doubling round the squaring and the inverse update; per 32-row block its
substitution and its application; < 8 groups the product operands, nw^T kd and
qd^T + (M nw)^T, >= 8 groups one step of slack (the last block's unpacking DMAs); the
outputs; the state update), and step t issues job s of group t - s
for every s, the later stages first, so every in-order engine queue holds work of
several groups between one group's dependent steps. With n chunks per body
(``chunk_pipeline._body_plan``), chunk k > 0 starts its state-independent jobs 6 steps after chunk
k - 1 (``chunk_pipeline.chunk_stride``; 2 with one head group; plus chunk_pipeline._FIRST_LEAD in a body of 4 or more)
and its state jobs one step after chunk k - 1's state update of the same group: program
order is the state's data order (< 8 groups only the outputs and the state update read
the state). With one group a body's 8 chunks are then in flight at once: their
state-free jobs (< 8 groups: everything up to the outputs) overlap one another, and the
state chain runs a chunk every two steps.

Engines, per (chunk, value head) at C = 128 (tokens on partitions)
------------------------------------------------------------------
- DMA: the row gathers of k, q, g, beta, v (indirect, one token row per partition, at the
  start of the body, in the order the first jobs read them) and the output scatter (per head group); the state in and out of the scratch block (per head group,
  once per row); the packed solve's layout moves as SBUF-to-SBUF DMAs: the diagonal
  blocks into P^T, the right-hand sides into the packed R (< 8 head groups: instead the
  block inverses into G and the off-diagonal blocks into their slots) and the solutions
  back to per-head tiles (< 8 head groups: all but the last block's).
- TensorE: k^T, q^T (transposes, one PSUM bank per q/k head); k k^T | k q^T (one matmul
  per q/k head, shared by HV / H value heads); the segment sums (fp32, 0/1 stationaries;
  one matmul for a group's 4 heads, side by side in one PSUM bank);
  k S, q S; the doubling on the whole array, one matmul per 32-row block of the pack: P
  from P^T (transposes), P P and P^T P^T up to N^8, then compact products with N^8, and
  the compact inverse updates; >= 8 head groups the off-diagonal blocks' placements (per
  head and block pair one 32-row row-tile matmul with a block-row selection, 2 PSUM banks
  and 2 ScalarE evictions per group; tfloat32 for bf16 callers, which read the blocks as
  tfloat32 anyway); per block the off-diagonal products and the application
  (< 8 head groups: plus one 32-row row-tile product with G per head); M Y and kd^T Y; bf16 callers: q S into the output's accumulation (an identity matmul).
  < 8 head groups instead of k S, q S, M Y, kd^T Y: nw^T [kd | M^T] and qd^T (identity
  matmul; two heads per PSUM bank), M u + (qd + M nw) S (a group's 4 heads in one bank),
  kd^T u + (nw^T kd)^T S.
- VectorE: the masked eviction of k k^T | k q^T (>= 8 head groups: the output scale on the
  k q^T half), A^T and M (< 8 head groups per head; >= 8 one multiply per q/k head for its
  two value heads' A^T | M^T, beta already in the decays), R, the state update (and o for
  float32 callers); per group the P eviction, the compact inverse updates and their
  expansion, the substitution's subtractions (< 8 head groups: ScalarE negates instead,
  and the last block's solutions leave PSUM half on VectorE, half on ScalarE); the zeroing of the packed tiles once per
  launch (the placements write the same elements every chunk, so the zeros persist).
- ScalarE: transpose evictions, the exps (the decays: one per group), the doubling's
  evictions and its chained product, q S, the packed solutions, the decayed keys (< 8 head
  groups), the off-diagonal placements' evictions (>= 8), o (bf16
  callers; < 8 head groups: one per group); < 8 head groups the operands [nw^T kd | qd^T +
  (M nw)^T] of a group's first two heads (VectorE the other two).
- GpSimd (whole-tile multiplies on 128 partitions, zero-stride operands for the per-head
  scalars; SBUF only, off the busier engines): >= 8 head groups beta into the decays (one
  per group) and the decayed keys kd (one per q/k head); < 8 head groups the right-hand
  sides [v | -e^c k] and qd; the software descriptors of the indirect gathers and
  scatters.

Operand precision: float32 callers get fp32 operands everywhere (the exact mode, tests
1e-5). bfloat16 callers (``bf16``): q, k, v enter bf16 (exact: they are the inputs); q^T,
k^T, the state, the substitution's operands, M, kd and Y are tfloat32 operands (10
mantissa bits, streamed at the BF16 rate: nki_spec §8.1), so k S and q S read the
float32 state without a bf16 copy; P^T's blocks are placed in float32 (a DMA never
converts) and the doubling's first round reads P^T and P as tfloat32, its later powers
and partial inverses are bf16 (the inverse's unit diagonal is exact; its last round
writes fp32); all decays, segment sums and the state stay fp32.

What binds (modeled trn2 by nki_ssm.perf, bf16 I/O, fp32 pool, chunk 128; ``python -m
simulate --set judged --op gated_delta_prefill``). Qwen3-Next TP1 (32 value heads, 8
groups, one chunk per body; 16K tokens 12.8 ms, 10-90 %: 12.3-14.9, 1.28 M tokens/s):
VectorE (80 % busy), with ScalarE (76 %) close behind, DMA 45 %, TensorE 43 %, GpSimd
39 %; per chunk 180 VectorE, 196 ScalarE, 24 GpSimd, 875 TensorE instructions. A body's
one chunk sweeps its 8 groups through the job list, so the early jobs (products, A^T,
R, the solve set-up) bind VectorE, the doubling and the applications ScalarE, the state
update VectorE again: a per-head scalar folded away (beta into the decays, kd on GpSimd)
or a per-head pass batched over a group counts only where its engine binds. A chunk moves its inputs (~2 MB), its outputs (1 MB), the packing moves of its solves
and the state in and out of its scratch block (2 x 2 MB, the price of one loop level: the
state cannot stay in SBUF from one row to the next when a row may start another sequence);
each body gathers its own chunks, so its first steps wait for those DMAs (about 6 % of the
16K time against gathering the next body's chunks during this one, a form no released
runtime-loop kernel uses). TP4 (8 value heads, 2 groups, 4 chunks per body; the WY
variant; 16K tokens 3.81 ms, 4.30 M tokens/s): ScalarE (75 % busy) and VectorE (71 %),
GpSimd 61 %, TensorE 49 %, DMA 41 %: the state chain is short, the engines are
throughput-bound; the solve of width V + K costs more engine time than a width-V solve
would, which is the price of taking it off the chain. Figures: the README's "Modeled
performance" table and ``python -m simulate``.

At LNC=2 (``python -m simulate --lnc both``: the two programs on their own physical
cores, sharing HBM; 16K tokens): TP1 7.31 ms per program against 12.8 ms at LNC=1
(0.57x): each program has half the work in 4 head groups but runs the layer's form (8
groups: the state in the right-hand side, with the folds above), so a body's one chunk
sweeps only 4 groups through the job list and fewer groups' jobs hide each group's
dependent steps; its critical path (2K tokens) is ScalarE's (38 %: the doubling's
chained products, the segment sums' gU, q S, the applications and the placements'
evictions), VectorE's (29 %) and the DMAs' (23 %). The same folds in the WY form (A^T |
M^T per head or per q/k head with beta in the decays, kd per q/k head on GpSimd, gU per
group) move work between ScalarE, VectorE and GpSimd, which are all ~70 % busy there and
element-bound, not instruction-bound: TP4 2K within -5 % .. +7 % at LNC=1 and up to
+38 % at LNC=2, so that form keeps its per-head passes. TP4 1.79 ms against
3.81 ms (0.47x): a program's 4 value heads are one head group, one solve, 8 chunks per
body, started 2 steps apart (``chunk_pipeline.chunk_stride``), so the body's 8 chunks are
in flight at once and each chunk's own dependent steps (doubling, substitution, outputs:
~30 cross-engine hand-offs) hide behind the 7 others. That takes ~200 KB per partition of
SBUF (each chunk keeps 7 KB of solve tiles, its inputs and its solutions in flight): more
chunks per body, or float32 inputs, or one q/k head per value head, do not fit it
(``compact_inputs``). The solve variant (packed right-hand sides with 8 or more groups, WY
with fewer: ``few_groups``) follows the layer's head count, not the program's, so LNC=2
computes every head exactly as LNC=1 does.

Constructs and their evidence: the scaffolding's (``scaffold.py``, NKI 0.8.0: the LNC grid
as Python ints, runtime loops as ``nl.fori_loop`` with an inner ``def`` body, trip counts
and table cells as ``NkiScalar`` s from ``nisa.scalar_load`` of an SBUF copy, HBM views
with an ``NkiScalar`` ``scalar_offset`` and ``indirect_dim=0``, private HBM dumps, PSUM
allocated in the loop bodies); one-row-per-partition ``vector_offset`` gathers / scatters
(attention_tkg.py); a kernel-allocated ``shared_hbm`` scratch
(moe_cte/bwmm_shard_on_I.py); matmuls on the whole PE array, and (< 8 head groups)
32-row row tiles ``tile_position=(32 b, 0)`` whose operands sit on the tile's partitions
(nc_matmul "Tiling mode"; no tile with a non-zero column, no tiling in transpose mode);
SBUF-to-SBUF DMAs and cross-quadrant compute-engine copies of <= 32 partitions for the
packing; DMAs without dtype conversion.

Limits: K, V <= 128; chunk a multiple of 16 up to 128. Non-finite values: g must be
finite (host validation); beta must be finite on the tokens of real sequences (host
validation), because the packed solve multiplies each head's values by the other heads'
zeros (0 * NaN = NaN on TensorE): a non-finite k or v value of a real token likewise
reaches every head of its group of 4 in that sequence (the reference keeps it in its
head).
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels.gated_delta.chunk_pipeline import run_body
from nki_ssm.kernels.gated_delta.chunk_block_solve import selections, solve_tiles, zero_solve
from nki_ssm.kernels.gated_delta.chunk_utils import (constants, few_groups, head_groups,
                                                     rows_view, state_block, table_rows)
from nki_ssm.kernels.scaffold import (at_row, destination, for_each_row, lnc_grid,
                                      program_share, trip_counts, work_loop)


@nki.jit
def gdn_chunk_prefill(q2, k2, v2, gate1, gate2, head_params, pool, body_rows, body_state,
                      tail_rows, tail_state, init_tab, final_tab, pad_rows, counts, H, raw_gates,
                      use_qk_l2norm, scale, chunk, bf16):
    """Chunked gated delta rule over a ragged batch (layouts and loops in the module
    docstring)."""
    T1 = q2.shape[0]
    V = pool.shape[1]
    K = q2.shape[1] // H
    C = chunk
    odt = v2.dtype
    # this program's value heads (Python ints at trace time): HV of them from head hv0; a
    # program without real work (heads that do not split) runs program 0's heads into
    # private dumps of o and the pool
    nprog, pid = lnc_grid()
    win = _program_window(H, v2.shape[1] // V, nprog, pid)
    HV = win["nhv"]
    o = nl.ndarray((T1, win["HV"] * V), dtype=odt, buffer=nl.shared_hbm)
    o_out = destination(o, win["real"])
    pool = destination(pool, win["real"])
    # float32 states of the live sequences, one [K, HV*V] block each, and a zero block last,
    # for each program (blocks pid*nblocks ..: no block is written by two programs)
    nblocks = init_tab.shape[0] + 1
    scratch = nl.ndarray((nprog * nblocks * K, HV * V), dtype=nl.float32,
                         buffer=nl.shared_hbm)
    blk0 = pid * nblocks
    hbm = {}
    hbm["q"] = q2
    hbm["k"] = k2
    hbm["v"] = v2
    hbm["g"] = gate1
    hbm["beta"] = gate2

    mdt = nl.float32
    if bf16:
        mdt = nl.bfloat16
    cst = constants(C, K, mdt)
    if not win["few"]:
        # [tri_su | scale tri_up]: M^T takes the output scale from the kq eviction; the
        # selections that place the solve's off-diagonal blocks by TensorE
        nisa.tensor_scalar(dst=cst["kkq_mask"][:, 1, :], data=cst["kkq_mask"][:, 1, :],
                           op0=nl.multiply, operand0=scale)
        selections(cst)
    compact = compact_inputs(H, win["HV"], bf16)
    win["compact"] = compact
    nsub = chunks_per_iteration(HV, compact)
    # the packed solve's tiles, one set per chunk of a body and head group, zeroed once: the
    # placements write the same elements every chunk, so the zeros persist
    solve = []
    for j in range(nsub):
        sj = []
        for hvs in head_groups(HV):
            t = solve_tiles(len(hvs), C, win["few"])
            zero_solve(t)
            sj.append(t)
        solve.append(sj)
    if raw_gates:
        hp = nl.ndarray((128, 2 * win["HV"]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=hp, src=head_params)
        a0 = win["hv0"]
        d0 = win["HV"] + win["hv0"]
        negA = nl.ndarray((128, HV), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=negA, op=nl.exp, data=hp[:, a0:a0 + HV])
        nisa.tensor_scalar(dst=negA, data=negA, op0=nl.multiply, operand0=-1.0)
        cst["negA"] = negA
        cst["dtb"] = hp[:, d0:d0 + HV]

    # trip counts (the one counts row every program reads): padding chunks, initial states,
    # bodies of nsub chunks, single chunks, live sequences
    n_pad, n_init, n_body, n_tail, n_live = trip_counts(counts)

    # the state S [K, HV*V] float32 (partition k: row k of every head's state)
    S = nl.ndarray((K, HV * V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=S, value=0.0)
    nisa.dma_copy(dst=state_block(scratch, None, blk0 + nblocks - 1, K, 0, HV * V), src=S)

    # loop 1: rows of padding sequences get zeros, C rows per table entry
    def pad_body(z):
        zt = nl.ndarray((C, HV * V), dtype=odt, buffer=nl.sbuf)
        nisa.memset(dst=zt, value=0.0)
        zr = table_rows(pad_rows, z, C, 0)
        nisa.dma_copy(dst=rows_view(o_out, zr, C, win["hv0"] * V, HV * V), src=zt)

    work_loop(n_pad, pad_body)

    # loop 2: initial states from the pool into the sequences' scratch blocks
    def init_body(s, cells):
        _pool_to_scratch(pool, scratch, S, cells, win, blk0, K, V)

    for_each_row(n_init, init_tab, init_body)

    # chunk input tiles, one set per chunk of a body: each body gathers its own chunks
    bufs = []
    for j in range(nsub):
        bufs.append(_chunk_buffers(win["nh"], HV, K, V, C, bf16, use_qk_l2norm))
    io = {}
    io["o"] = o_out
    io["hbm"] = hbm
    io["cols"] = _input_columns(win, K, V)
    io["blk0"] = blk0
    io["scratch"] = scratch
    io["T1"] = T1
    io["compact"] = compact

    # loop 3: bodies of nsub consecutive chunks of one sequence, state in from and out to
    # its scratch block (the zero block for a sequence's first body without initial state)
    io["rows"] = body_rows
    io["state"] = body_state

    def body(i):
        run_body(bufs, nsub, io, cst, solve, S, i, K, V, win, raw_gates, use_qk_l2norm, scale, C)

    work_loop(n_body, body)

    # loop 4: a sequence's last (chunks mod nsub) chunks, one per iteration
    if nsub > 1:
        io["rows"] = tail_rows
        io["state"] = tail_state

        def tail_body(i):
            run_body(bufs, 1, io, cst, solve, S, i, K, V, win, raw_gates, use_qk_l2norm, scale,
                    C)

        work_loop(n_tail, tail_body)

    # loop 5: final states from the scratch blocks into the pool slots
    def final_body(s, cells):
        _scratch_to_pool(pool, scratch, S, cells, win, blk0, K, V)

    for_each_row(n_live, final_tab, final_body)
    return o


def _pool_slot(pool, row, win, K, V):
    """This program's heads (``win``) of the pool slot from pool row ``row`` (an
    ``NkiScalar``) as ``[K, HV, V]``: a slot is one contiguous ``[HV*K, V]`` block, partition
    k holding rows (hv, k) of the program's heads."""
    return at_row(pool, row, [[V, K], [K * V, win["nhv"]], [1, V]], win["hv0"] * K * V)


def _pool_to_scratch(pool, scratch, S, cells, win, blk0, K, V):
    """Scratch block at row cells[1] (from the program's block blk0) <- the pool slot at row
    cells[0], through S: the DMAs keep the pool's dtype and a bf16 slot is widened by
    VectorE."""
    HV = win["nhv"]
    src = _pool_slot(pool, cells[0], win, K, V)
    dst = S.reshape((K, HV, V))
    if pool.dtype != nl.float32:
        dst = nl.ndarray((K, HV, V), dtype=pool.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=dst, src=src)
    if pool.dtype != nl.float32:
        nisa.tensor_copy(dst=S.reshape((K, HV, V)), src=dst, engine=nisa.engine.vector)
    nisa.dma_copy(dst=state_block(scratch, cells[1], blk0, K, 0, HV * V), src=S)


def _scratch_to_pool(pool, scratch, S, cells, win, blk0, K, V):
    """The pool slot at row cells[1] <- the scratch block at row cells[0] (from the program's
    block blk0), through S (a bf16 pool's copy rounded by VectorE, so no DMA converts)."""
    HV = win["nhv"]
    nisa.dma_copy(dst=S, src=state_block(scratch, cells[0], blk0, K, 0, HV * V))
    src = S.reshape((K, HV, V))
    if pool.dtype != nl.float32:
        src = nl.ndarray((K, HV, V), dtype=pool.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=src, src=S.reshape((K, HV, V)), engine=nisa.engine.vector)
    nisa.dma_copy(dst=_pool_slot(pool, cells[1], win, K, V), src=src)


def heads_per_program(HV, programs):
    """Value heads each of ``programs`` SPMD programs (the LNC) computes: HV / programs when
    they split evenly, else all HV (every program runs program 0's heads, the others into
    dumps: ``scaffold.program_share``)."""
    return program_share(HV, programs, 0)[1]


def _program_window(H, HV, programs, pid):
    """The heads program ``pid`` of ``programs`` computes: ``nhv`` value heads from ``hv0``,
    reading q/k heads ``h0 .. h0 + nh - 1`` (``qk[j]``: the tile column block of value head
    hv0 + j's q/k head), ``HV`` all value heads, ``few`` the solve variant of the layer
    (few_groups), ``real`` False for a program without real work (the split does not
    divide: it runs program 0's window, same instructions and trip counts, into dumps)."""
    hv0, nhv, real = program_share(HV, programs, pid)
    rep = HV // H
    h0 = hv0 // rep
    qk = []
    for j in range(nhv):
        qk.append((hv0 + j) // rep - h0)
    w = {}
    w["HV"] = HV
    w["hv0"] = hv0
    w["nhv"] = nhv
    w["h0"] = h0
    w["nh"] = qk[nhv - 1] + 1
    w["qk"] = qk
    w["few"] = few_groups(HV)
    w["real"] = real
    return w


def _input_columns(win, K, V):
    """The first HBM column of the program's heads in each token input (INPUTS)."""
    cols = {}
    cols["q"] = win["h0"] * K
    cols["k"] = win["h0"] * K
    cols["v"] = win["hv0"] * V
    cols["g"] = win["hv0"]
    cols["beta"] = win["hv0"]
    return cols


def compact_inputs(H, HV, bf16):
    """Whether a layer of H q/k heads and HV value heads (the whole layer's: both programs of
    an LNC grid and the launcher decide alike) has the compact chunk tiles: bf16 inputs
    (float32 ones double the input tiles and the WY operands a chunk keeps) and q/k heads each
    shared by two or more value heads (every Qwen3-Next shard). Other layers run fewer chunks
    per body from 2 head groups on (chunks_per_iteration) and start them further apart
    (chunk_stride): their tiles take more SBUF."""
    return bf16 and H < HV


def chunks_per_iteration(HV, compact):
    """Chunks per body row of a program's HV value heads (the launcher's work lists follow
    it): about 8 head groups in flight, so 1 at Qwen3-Next TP1 (8 groups; SBUF holds one
    chunk's tiles), 2 at TP2, 4 at TP4, 8 with one group (TP4 at LNC=2, TP8); half as many
    from 2 groups on for a layer without ``compact`` tiles (compact_inputs: float32 TP4 at
    LNC=1 with 4 does not fit SBUF, nor a bf16 layer with one q/k head per value head). A
    runtime loop drains every engine at each iteration boundary (nki-dynamic-loops.rst,
    "Iterations Do Not Overlap"): with several chunks per body the drain and the state's
    trip through its scratch block are paid once per body, and the chunks' dependent steps
    (~30 cross-engine hand-offs each) overlap one another."""
    groups = len(head_groups(HV))
    n = 8 // groups
    if not compact and groups > 1:
        n = n // 2
    return max(1, n)


def _chunk_buffers(H, HV, K, V, C, bf16, use_qk_l2norm):
    """The chunk input tiles: q, k ``[C, H*K]``, v ``[C, HV*V]`` (bf16 for bf16 callers; q / k
    float32 when they are normalised in the kernel), g, beta ``[C, HV]`` float32."""
    xdt = nl.float32
    if bf16:
        xdt = nl.bfloat16
    qkdt = xdt
    if use_qk_l2norm:
        qkdt = nl.float32
    buf = {}
    buf["q"] = nl.ndarray((C, H * K), dtype=qkdt, buffer=nl.sbuf)
    buf["k"] = nl.ndarray((C, H * K), dtype=qkdt, buffer=nl.sbuf)
    buf["v"] = nl.ndarray((C, HV * V), dtype=xdt, buffer=nl.sbuf)
    buf["g"] = nl.ndarray((C, HV), dtype=nl.float32, buffer=nl.sbuf)
    buf["beta"] = nl.ndarray((C, HV), dtype=nl.float32, buffer=nl.sbuf)
    return buf
