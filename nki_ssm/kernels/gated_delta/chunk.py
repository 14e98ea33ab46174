"""Gated DeltaNet chunked prefill (WY / UT form) over a ragged batch, state pool in place.

Kernel: ``gdn_chunk_prefill`` (``@nki.jit``); launcher ``nki_ssm.ops.launch.gated_delta.prefill``.

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

With fewer than 8 head groups (_few_groups: TP2 and up) the state chains bind, so the
solve leaves them: the system is solved for the state-free right-hand sides
``B = [v | -e^c k]`` (width V + K), giving ``[u | nw] = (I + A)^{-1} B`` and
``Y = u + nw S``; then, with ``kd = beta e^{c_last - c} k`` and ``qd = scale e^c q``::

    S <- e^{c_last} S + kd^T u + (nw^T kd)^T S
    o  = M u + (qd + M nw) S                  M = scale tril(q k^T) D diag(beta)

so a chunk's state chain is one PSUM accumulation (kd^T u, issued early, plus
(nw^T kd)^T S) and one VectorE update, and the outputs read S through one matmul; Y is
never formed. The right-hand sides are not packed: each head's block inverses are moved
to the block's own rows (G, _place_g), and block b's application ``X_b = inv_bb B_b +
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
Each group of 4 value heads has a list of jobs, one per dependent step (``_group_jobs``:
q/k transposes; their masked products; gU; the decays; A^T; the packed solve's layout
moves; the right-hand sides (k S, or < 8 groups [v | -e^c k]); q S (>= 8 groups); the
solve setup; per doubling round the squaring and the inverse update; per 32-row block its
substitution and its application; the product operands (< 8 groups: and nw^T kd,
qd^T + (M nw)^T); the outputs; the state update), and step t issues job s of group t - s
for every s, the later stages first, so every in-order engine queue holds work of
several groups between one group's dependent steps. With n chunks per body
(``_body_plan``), chunk k > 0 starts its state-independent jobs 6 steps after chunk
k - 1 (``_chunk_stride``; 2 with one head group; plus _FIRST_LEAD in a body of 4 or more)
and its state jobs one step after chunk k - 1's state update of the same group: program
order is the state's data order (< 8 groups only the outputs and the state update read
the state). With one group a body's 8 chunks are then in flight at once: their
state-free jobs (< 8 groups: everything up to the outputs) overlap one another, and the
state chain runs a chunk every two steps.

Engines, per (chunk, value head) at C = 128 (tokens on partitions)
------------------------------------------------------------------
- DMA: the row gathers of q, k, v, g, beta (indirect, one token row per partition, at the
  start of the body) and the output scatter (per head group); the state in and out of the scratch block (per head group,
  once per row); the packed solve's layout moves as SBUF-to-SBUF DMAs: the diagonal
  blocks into P^T, the right-hand sides into the packed R (< 8 head groups: instead the
  block inverses into G and the off-diagonal blocks into their slots) and the solutions
  back to per-head tiles (< 8 head groups: all but the last block's).
- TensorE: k^T, q^T (transposes, one PSUM bank per q/k head); k k^T | k q^T (one matmul
  per q/k head, shared by HV / H value heads); the segment sums (fp32, 0/1 stationaries;
  one matmul for a group's 4 heads, side by side in one PSUM bank);
  k S, q S; the doubling on the whole array, one matmul per 32-row block of the pack: P
  from P^T (transposes), P P and P^T P^T up to N^8, then compact products with N^8, and
  the compact inverse updates; per block the off-diagonal products and the application
  (< 8 head groups: plus one 32-row row-tile product with G per head); M Y and kd^T Y; bf16 callers: q S into the output's accumulation (an identity matmul).
  < 8 head groups instead of k S, q S, M Y, kd^T Y: nw^T [kd | M^T] and qd^T (identity
  matmul; two heads per PSUM bank), M u + (qd + M nw) S (a group's 4 heads in one bank),
  kd^T u + (nw^T kd)^T S.
- VectorE: the masked eviction of k k^T | k q^T, A^T, R, M, the state update (and o for
  float32 callers); per group the P eviction, the compact inverse updates and their
  expansion, the substitution's subtractions (< 8 head groups: ScalarE negates instead,
  and the last block's solutions leave PSUM half on VectorE, half on ScalarE); the zeroing of the packed tiles once per
  launch (the placements write the same elements every chunk, so the zeros persist).
- ScalarE: transpose evictions, the exps (the decays: one per group), the doubling's
  evictions and its chained product, q S, the packed solutions, the decayed keys, o (bf16
  callers; < 8 head groups: one per group); < 8 head groups the operands [nw^T kd | qd^T +
  (M nw)^T] of a group's first two heads (VectorE the other two).
- GpSimd: the off-diagonal blocks' placements (>= 8 head groups: a row strip per head
  and block row), < 8 head groups the right-hand sides [v | -e^c k] and qd (SBUF only,
  off the busier engines), and the software descriptors of the indirect gathers and
  scatters.

Operand precision: float32 callers get fp32 operands everywhere (the exact mode, tests
1e-5). bfloat16 callers (``bf16``): q, k, v enter bf16 (exact: they are the inputs); q^T,
k^T, the state, the substitution's operands, M, kd and Y are tfloat32 operands (10
mantissa bits, streamed at the BF16 rate: nki_spec §8.1), so k S and q S read the
float32 state without a bf16 copy; P^T's blocks are placed in float32 (a DMA never
converts) and the doubling's first round reads P^T and P as tfloat32, its later powers
and partial inverses are bf16 (the inverse's unit diagonal is exact; its last round
writes fp32); all decays, segment sums and the state stay fp32.

What binds (modeled trn2 by nki_ssm.perf as of this commit, bf16 I/O, fp32 pool, chunk
128; ``python -m simulate --op gated_delta_prefill``). Qwen3-Next TP1 (32 value heads, 8
groups, one chunk per body; 16K tokens 13.15 ms, 10-90 %: 12.5-14.8, 1.25 M tokens/s):
VectorE (87 % busy), with ScalarE (79 %) close behind, DMA 45 %, GpSimd 43 %, TensorE
36 %: a chunk moves its inputs (~2 MB), its outputs (1 MB), the packing moves of its solves
and the state in and out of its scratch block (2 x 2 MB, the price of one loop level: the
state cannot stay in SBUF from one row to the next when a row may start another sequence).
TP4 (8 value heads, 2 groups, 4 chunks per body; the WY variant; 16K tokens 3.63 ms,
4.51 M tokens/s): ScalarE (80 % busy) and VectorE (75 %), GpSimd 65 %, TensorE 52 %,
DMA 45 %: the state chain is short, the engines are throughput-bound; the solve of width
V + K costs more engine time than a width-V solve would, which is the price of taking it
off the chain. Figures: the README's "Modeled performance" table and ``python -m
simulate``.

At LNC=2 (``python -m simulate --lnc both``: the two programs on their own physical
cores, sharing HBM; 16K tokens): TP1 6.73 ms per program against 13.15 ms at LNC=1
(0.51x): each program has half the work, still throughput-bound. TP4 1.74 ms against
3.63 ms (0.48x): a program's 4 value heads are one head group, one solve, 8 chunks per
body, started 2 steps apart (``_chunk_stride``), so the body's 8 chunks are in flight at
once and each chunk's own dependent steps (doubling, substitution, outputs: ~30
cross-engine hand-offs) hide behind the 7 others: ScalarE 86 % busy, VectorE 82 %,
GpSimd 80 %, TensorE 55 %. That takes ~200 KB per partition of SBUF (each chunk keeps
7 KB of solve tiles, its inputs and its solutions in flight): more chunks per body, or
float32 inputs, or one q/k head per value head, do not fit it (``compact_inputs``). The
solve variant (packed right-hand sides with 8 or more groups, WY with fewer:
``_few_groups``) follows the layer's head count, not the program's, so LNC=2 computes
every head exactly as LNC=1 does.

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
from nki_ssm.kernels.gated_delta._common import consecutive_groups
from nki_ssm.kernels.scaffold import (at_row, destination, for_each_row, lnc_grid,
                                      program_share, row_cells, trip_counts, work_loop)

_BLOCK = 32           # rows per exactly-inverted diagonal block
_PACK = 4             # most heads whose blocks share one 128-partition packed solve
_CHUNK_STEP = 6       # steps between the starts of a body's chunks (_chunk_stride)
_ONE_GROUP_STEP = 2   # ... with one head group and compact tiles: the whole body in flight
_FIRST_LEAD = 2       # extra steps chunk 0 runs alone in a body of 4 or more chunks (_body_plan)
_SQUARED = 8          # the doubling squares up to N^8, then chains compact products with it
_L2NORM_EPS = 1e-6


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
    cst = _constants(C, K, mdt)
    compact = compact_inputs(H, win["HV"], bf16)
    nsub = chunks_per_iteration(HV, compact)
    # the packed solve's tiles, one set per chunk of a body and head group, zeroed once: the
    # placements write the same elements every chunk, so the zeros persist
    solve = []
    for j in range(nsub):
        sj = []
        for hvs in _head_groups(HV):
            t = _solve_tiles(len(hvs), C, win["few"])
            _zero_solve(t)
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
    nisa.dma_copy(dst=_state_block(scratch, None, blk0 + nblocks - 1, K, 0, HV * V), src=S)

    # loop 1: rows of padding sequences get zeros, C rows per table entry
    def pad_body(z):
        zt = nl.ndarray((C, HV * V), dtype=odt, buffer=nl.sbuf)
        nisa.memset(dst=zt, value=0.0)
        zr = _table_rows(pad_rows, z, C, 0)
        nisa.dma_copy(dst=_rows_view(o_out, zr, C, win["hv0"] * V, HV * V), src=zt)

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
        _chunks(bufs, nsub, io, cst, solve, S, i, K, V, win, raw_gates, use_qk_l2norm, scale, C)

    work_loop(n_body, body)

    # loop 4: a sequence's last (chunks mod nsub) chunks, one per iteration
    if nsub > 1:
        io["rows"] = tail_rows
        io["state"] = tail_state

        def tail_body(i):
            _chunks(bufs, 1, io, cst, solve, S, i, K, V, win, raw_gates, use_qk_l2norm, scale,
                    C)

        work_loop(n_tail, tail_body)

    # loop 5: final states from the scratch blocks into the pool slots
    def final_body(s, cells):
        _scratch_to_pool(pool, scratch, S, cells, win, blk0, K, V)

    for_each_row(n_live, final_tab, final_body)
    return o


def _state_block(scratch, row, block, K, c0, c1):
    """Columns c0:c1 of the ``[K, width]`` scratch block ``block`` (static) plus the run-time
    block row ``row`` (an ``NkiScalar``, or None)."""
    width = scratch.shape[1]
    return at_row(scratch, row, [[width, K], [1, c1 - c0]], block * K * width + c0)


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
    nisa.dma_copy(dst=_state_block(scratch, cells[1], blk0, K, 0, HV * V), src=S)


def _scratch_to_pool(pool, scratch, S, cells, win, blk0, K, V):
    """The pool slot at row cells[1] <- the scratch block at row cells[0] (from the program's
    block blk0), through S (a bf16 pool's copy rounded by VectorE, so no DMA converts)."""
    HV = win["nhv"]
    nisa.dma_copy(dst=S, src=_state_block(scratch, cells[0], blk0, K, 0, HV * V))
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
    (_few_groups), ``real`` False for a program without real work (the split does not
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
    w["few"] = _few_groups(HV)
    w["real"] = real
    return w


def _input_columns(win, K, V):
    """The first HBM column of the program's heads in each token input (_INPUTS)."""
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
    (_chunk_stride): their tiles take more SBUF."""
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
    groups = len(_head_groups(HV))
    n = 8 // groups
    if not compact and groups > 1:
        n = n // 2
    return max(1, n)


def _head_groups(HV):
    """The value heads of each software-pipeline group (and packed solve): _PACK per group,
    128 partitions, so the packed solve's ops serve 4 heads each."""
    return consecutive_groups(HV, _PACK)


def _few_groups(HV):
    """Whether a chunk has fewer than 8 head groups (TP2, TP4, TP8 of Qwen3-Next): its state
    chains would then bind (the body's chunks follow one another's state), so the solve
    takes the state-free WY form (module docstring) and leaves the chain; with 8 or more
    (TP1) ScalarE and VectorE bind and the width-V solve on the chain costs less."""
    return len(_head_groups(HV)) < 8


def _table_rows(table, r, C, plus):
    """Token rows of chunk ``plus`` (a static int) of row ``r`` (an ``NkiScalar``; None: row
    0) of an int32 ``[entries, n*C]`` table as a ``[C, 1]`` SBUF column."""
    t = nl.ndarray((C, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=at_row(table, r, [[1, C], [1, 1]], plus * C))
    return t


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


_INPUTS = ("q", "k", "v", "g", "beta")


def _gather_chunk(buf, io, table, r, plus, C):
    """Gather the token rows of chunk ``plus`` of row ``r`` of ``table`` into the chunk tiles
    (the program's columns of io["hbm"]'s inputs, from io["cols"]); returns the rows."""
    rows = _table_rows(table, r, C, plus)
    for name in _INPUTS:
        nisa.dma_copy(dst=buf[name], src=_rows_view(io["hbm"][name], rows, C, io["cols"][name],
                                                    buf[name].shape[1]))
    return rows


def _rows_view(x, rows, C, c0, width):
    """Columns c0 .. c0 + width of rows ``rows[p]`` of HBM ``x [n, w]``, one row per partition
    (indirect gather / scatter)."""
    return x.ap(pattern=[[x.shape[1], C], [1, width]], offset=c0, vector_offset=rows,
                indirect_dim=0)


def _constants(C, K, mdt):
    """Cumsum operator tri_up [C, C], identity [128, 128] and ones [128, 128] (float32)."""
    cst = {}
    ones = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    cst["ones"] = ones
    # tri_up[p, f] = 1 if f >= p (cumsum operator: c_j = sum_{m <= j} g_m)
    cst["tri_up"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=cst["tri_up"], pattern=[[1, C]], channel_multiplier=-1,
                       on_true_tile=ones[0:C, 0:C], on_false_value=0.0, cmp_op=nl.greater_equal)
    # tri_lo[p, f] = 1 if p > f (segment sums over m > j)
    cst["tri_lo"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=cst["tri_lo"], pattern=[[-1, C]], channel_multiplier=1, offset=-1,
                       on_true_tile=ones[0:C, 0:C], on_false_value=0.0, cmp_op=nl.greater_equal)
    # tri_su[p, f] = 1 if f > p (strictly upper: the pairs j < i in [j, i] layout)
    cst["tri_su"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=cst["tri_su"], pattern=[[1, C]], channel_multiplier=-1, offset=-1,
                       on_true_tile=ones[0:C, 0:C], on_false_value=0.0, cmp_op=nl.greater_equal)
    # [tri_su | tri_up]: the masks of k k^T and k q^T side by side
    cst["kkq_mask"] = nl.ndarray((C, 2, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=cst["kkq_mask"][:, 0, :], src=cst["tri_su"])
    nisa.tensor_copy(dst=cst["kkq_mask"][:, 1, :], src=cst["tri_up"])
    cst["ident"] = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=cst["ident"], pattern=[[-1, 128]], channel_multiplier=1,
                       on_true_tile=ones, on_false_value=0.0, cmp_op=nl.equal)
    # the packed solve's compact identity, once per block: cIb [(h, m), b, c] = [m == c],
    # and the head-quadrant mask bd [(h, m), h', c] = [h == h'] (float32)
    nq = 128 // _BLOCK
    cst["cIb"] = nl.ndarray((128, nq, _BLOCK), dtype=nl.float32, buffer=nl.sbuf)
    cst["bd"] = nl.ndarray((128, nq, _BLOCK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=cst["bd"], value=0.0)
    for h in range(nq):
        q0 = h * _BLOCK
        for b in range(nq):
            nisa.tensor_copy(dst=cst["cIb"][q0:q0 + _BLOCK, b, :],
                             src=cst["ident"][0:_BLOCK, 0:_BLOCK])
        nisa.memset(dst=cst["bd"][q0:q0 + _BLOCK, h, :], value=1.0)
    return cst


def _mm(st, mv, M, N, onezero=False):
    """SBUF [M, N] = st^T @ mv through PSUM (``onezero``: st holds only 0 / 1)."""
    ps = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv, is_stationary_onezero=onezero,
                   accumulate=False)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=ps, engine=nisa.engine.scalar)
    return out


def _l2norm_rows(x, L, H, K):
    """x [L, H*K] (SBUF, in place): each head's K values divided by sqrt(sum x^2 + eps)."""
    sq = nl.ndarray((L, H * K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=sq, data1=x, data2=x, op=nl.multiply)
    ss = nl.ndarray((L, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=ss, op=nl.add, data=sq.reshape((L, H, K)), axis=(2,))
    nisa.tensor_scalar(dst=ss, data=ss, op0=nl.add, operand0=_L2NORM_EPS)
    nisa.activation(dst=ss, op=nl.rsqrt, data=ss)
    nisa.tensor_tensor(dst=x.reshape((L, H, K)), data1=x.reshape((L, H, K)),
                       data2=ss.reshape((L, H, 1)).broadcast(2, K), op=nl.multiply)


def _solve_place(ATs, L, tiles, diag, off, off_dma=False):
    """The layout moves of a pack's solve: from the transposes ATs[i] ([j, i] layout) of the
    strictly-lower A_i [L, L] of up to _PACK heads, the diagonal _BLOCK-row blocks A_bb^T into
    slot b of tiles["PT"] and the off-diagonal blocks A_kb^T (k < b) into slot pair(k, b) of
    tiles["OT"], head i at partitions 32 i of each (block-diagonal over the heads: one
    matmul then serves the pack): ``diag`` / ``off`` say which. The diagonal blocks by
    SBUF-to-SBUF DMAs, partition moves no compute engine spends time on (float32, as A^T:
    a DMA never converts); the off-diagonal
    ones as one GpSimd copy per head and block row (cross-quadrant moves of <= 32
    partitions; by DMA they would put the queues on the critical path; a short last block
    falls back to DMAs, one per block), or (``off_dma``: the WY form, whose solve is off the
    state chain and whose GpSimd builds the right-hand sides) by DMAs, one per block. The
    tiles are zeroed once per launch (_zero_solve)
    and these moves write the same elements every chunk, so the zeros that keep the packed
    products block-diagonal persist."""
    nbs = _block_rows(L)
    nblk = len(nbs)
    for j in range(len(ATs)):
        q0 = j * _BLOCK
        for b in range(nblk):
            r0 = b * _BLOCK
            nb = nbs[b]
            if diag:
                nisa.dma_copy(dst=tiles["PT"][q0:q0 + nb, b, q0:q0 + nb],
                              src=ATs[j][r0:r0 + nb, r0:r0 + nb])
            if off and not off_dma and b + 1 < nblk and nbs[nblk - 1] == _BLOCK:
                # the row strip of blocks (b, c > b): one GpSimd copy
                p0 = _pair(b, b + 1, nblk)
                n = nblk - 1 - b
                nisa.tensor_copy(dst=tiles["OT"][q0:q0 + nb, p0:p0 + n, q0:q0 + _BLOCK],
                                 src=ATs[j][r0:r0 + nb, r0 + _BLOCK:L].reshape((nb, n, _BLOCK)),
                                 engine=nisa.engine.gpsimd)
            elif off:
                for c in range(b + 1, nblk):
                    c0 = c * _BLOCK
                    nc = nbs[c]
                    nisa.dma_copy(dst=tiles["OT"][q0:q0 + nb, _pair(b, c, nblk), q0:q0 + nc],
                                  src=ATs[j][r0:r0 + nb, c0:c0 + nc])


def _block_rows(L):
    """Rows of each _BLOCK-row block of L rows (the last may be short)."""
    nbs = []
    for r0 in range(0, L, _BLOCK):
        nbs.append(min(r0 + _BLOCK, L) - r0)
    return nbs


def _solve_setup(npk, L, cst, mdt, tiles):
    """Setup of the packed solve X_i = (I + A_i)^{-1} B_i of up to _PACK heads (blocks placed
    by _solve_place): P = A_bb from P^T by TensorE transposes (one PSUM bank in the operand
    dtype, one eviction); with N = -P the diagonal blocks' inverse
    (I - N)^{-1} = (I + N)(I + N^2)(I + N^4)... starts as inv^T = I - P^T (the even powers
    need no sign). The substitution over the blocks uses the off-diagonal blocks in
    tiles["OT"].

    ``mdt`` is the doubling's TensorE operand dtype: bfloat16 for bf16 callers (the powers
    and the partial inverses are rounded; the inverse's unit diagonal stays exact and the
    off-diagonal part carries the rounding, relative to its own size), float32 otherwise.
    The substitution and the final application stay float32."""
    W = npk * _BLOCK
    nbs = _block_rows(L)
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
    ps = nl.ndarray((W, nblk * _BLOCK), dtype=nl.float32, buffer=nl.psum)
    _block_mm(ps, _tf(P, tf), _tf(cIb, tf), nblk, W)
    cinv = nl.ndarray((W, nblk, _BLOCK), dtype=mdt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cinv, data1=cIb, data2=ps.reshape((W, nblk, _BLOCK)),
                       op=nl.subtract)
    pk["npk"] = npk
    pk["nbs"] = nbs
    pk["P"] = _tf(P, tf)
    pk["PT"] = _tf(PT, tf)
    pk["OT"] = tiles["OT"]
    pk["cinv"] = cinv
    pk["cfin"] = nl.ndarray((W, nblk, _BLOCK), dtype=nl.float32, buffer=nl.sbuf)
    pk["inv"] = nl.ndarray((W, nblk, W), dtype=nl.float32, buffer=nl.sbuf)  # final, fp32
    pk["bd"] = cst["bd"]
    pk["G"] = tiles["G"]
    pk["Xp"] = []
    pk["Z"] = []
    pk["tf"] = mdt != nl.float32     # the substitution's operands as tfloat32 (_tf)
    return pk


def _solve_tiles(npk, L, few):
    """The packed tiles of one head group's solve (see _solve_setup): P^T ``[W, blocks, W]``
    float32 (A^T's blocks as placed), the off-diagonal blocks ``[W, pairs, W]`` float32 (None
    for one block) and,
    ``few`` (the right-hand sides read where they are, _place_g), the moved inverses G
    ``[L, npk, W]`` float32; zeroed by _zero_solve before their first use."""
    W = npk * _BLOCK
    nblk = len(_block_rows(L))
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


def _zero_solve(t):
    """Zero the packed solve tiles ``t`` (_solve_tiles): the placements fill only the
    head-diagonal blocks (G: one block per head and block row)."""
    nisa.memset(dst=t["PT"], value=0.0, engine=nisa.engine.vector)
    if t["OT"] != None:  # noqa: E711
        nisa.memset(dst=t["OT"], value=0.0, engine=nisa.engine.vector)
    if t["G"] != None:  # noqa: E711
        nisa.memset(dst=t["G"], value=0.0, engine=nisa.engine.vector)


def _tf(t, fast):
    """A float32 tile as a TensorE operand: its tfloat32 view when ``fast`` (bf16 callers:
    10 mantissa bits, streamed at the BF16 rate instead of float32's quarter rate, nki_spec
    §8.1), else itself (float32 callers: the exact mode)."""
    if fast:
        return t.view(nl.tfloat32)
    return t


def _pair(k, b, nblk):
    """Slot of the off-diagonal block (k, b), k < b, in the packed ``[W, pairs, W]`` tile
    (ordered by k, then b)."""
    i = 0
    for kk in range(k):
        i = i + nblk - 1 - kk
    return i + b - k - 1


def _pack_rhs(Bs, L, N):
    """The right-hand sides of up to _PACK heads packed like the solve: block b of head j at
    partitions 32 j of slot b, ``[W, blocks, N]`` float32 (rows past a short last block zero)."""
    npk = len(Bs)
    W = npk * _BLOCK
    nbs = _block_rows(L)
    nblk = len(nbs)
    Rp = nl.ndarray((W, nblk, N), dtype=nl.float32, buffer=nl.sbuf)
    if L % _BLOCK != 0:
        nisa.memset(dst=Rp, value=0.0, engine=nisa.engine.gpsimd)
    for j in range(npk):
        q0 = j * _BLOCK
        for b in range(nblk):
            r0 = b * _BLOCK
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


def _solve_round(pk, covered, mdt):
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
        # eviction); all but the last here, the last in _solve_update
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


def _solve_update(pk, covered, mdt):
    """The second half of a doubling round: inv <- inv (I + P) (P = N^{2 covered} from
    _solve_round) on the compact inverse, one PSUM bank and one eviction for the blocks
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
        mv = pk["chain"]       # chained products with the last explicit power (_solve_round)
    ps = nl.ndarray((W, na * _BLOCK), dtype=nl.float32, buffer=nl.psum)
    _block_mm(ps, pk["P"], mv, na, W)                                    # (inv @ P)^T
    psv = ps.reshape((W, na, _BLOCK))
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
            dst=pk["inv"][:, b0:nblk, :].reshape((W, nblk - b0, npk, _BLOCK)),
            data1=pk["cfin"][:, b0:nblk, :].reshape((W, nblk - b0, 1, _BLOCK)).broadcast(2, npk),
            data2=pk["bd"][0:W, 0:npk, :].reshape((W, 1, npk, _BLOCK)).broadcast(1, nblk - b0),
            op=nl.multiply)
        if pk["G"] != None:  # noqa: E711
            _place_g(pk)


def _place_g(pk):
    """G [(b, m), j, (h, i)] = [h == j] inv_jb^T[m, i]: head j's inverse of block b moved from
    its quadrant of the packed tiles (partitions 32 j) to the block's own rows (32 b), so the
    application of block b reads each head's right-hand side where the k S eviction put it
    (_solve_apply_block: one 32-row row-tile matmul per head) and no right-hand side is
    packed on the state chain. One SBUF-to-SBUF DMA per head and block, off the chain; the
    other elements stay zero (_zero_solve)."""
    npk = pk["npk"]
    nbs = pk["nbs"]
    for b in range(len(nbs)):
        nb = nbs[b]
        r0 = b * _BLOCK
        for j in range(npk):
            q0 = j * _BLOCK
            nisa.dma_copy(dst=pk["G"][r0:r0 + nb, j, q0:q0 + nb],
                          src=pk["cfin"][q0:q0 + nb, b, 0:nb])


def _solve_rhs_block(pk, Rp, b, N):
    """Block b of the forward substitution, first half: Z_b = B_b - sum_{k<b} A_bk X_k for
    every head of the pack at once (packed right-hand sides ``Rp``, packed solutions
    pk["Xp"]; the off-diagonal stationaries are block-diagonal over the heads, so one PSUM
    accumulation serves the pack and one subtraction evicts it). Right-hand sides unpacked
    (pk["G"], _place_g; ``Rp`` None): Z_b = -sum_{k<b} A_bk X_k, evicted by ScalarE; the
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
        nisa.nc_matmul(dst=ps, stationary=_tf(pk["OT"][:, _pair(k, b, nblk), :], pk["tf"]),
                       moving=_tf(pk["Xp"][k], pk["tf"]), accumulate=k > 0)
    Z = nl.ndarray((W, N), dtype=nl.float32, buffer=nl.sbuf)
    if unpacked:
        nisa.activation(dst=Z, op=nl.copy, data=ps, scale=-1.0)
    else:
        nisa.tensor_tensor(dst=Z, data1=Rp[:, b, :], data2=ps, op=nl.subtract)
    pk["Z"].append(Z)


def _solve_apply_block(pk, Xs, b, N, Rs):
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
    r0 = b * _BLOCK
    nb = nbs[b]
    unpacked = pk["G"] != None  # noqa: E711
    ps = nl.ndarray((W, N), dtype=nl.float32, buffer=nl.psum)
    if not unpacked:
        nisa.nc_matmul(dst=ps, stationary=_tf(pk["inv"][:, b, :], pk["tf"]),
                       moving=_tf(pk["Z"][b], pk["tf"]), accumulate=False)
    else:
        for j in range(npk):
            nisa.nc_matmul(dst=ps, stationary=_tf(pk["G"][r0:r0 + nb, j, :], pk["tf"]),
                           moving=_tf(Rs[j][r0:r0 + nb, :], pk["tf"]), accumulate=j > 0,
                           tile_position=(r0, 0), tile_size=(_BLOCK, 128))
        if b > 0:
            nisa.nc_matmul(dst=ps, stationary=_tf(pk["inv"][:, b, :], pk["tf"]),
                           moving=_tf(pk["Z"][b], pk["tf"]), accumulate=True)
    if unpacked and b == len(nbs) - 1:
        for j in range(npk):
            q0 = j * _BLOCK
            eng = nisa.engine.scalar
            if j % 2 == 1:
                eng = nisa.engine.vector
            nisa.tensor_copy(dst=Xs[j][r0:r0 + nb, :], src=ps[q0:q0 + nb, :], engine=eng)
        return
    Xp = nl.ndarray((W, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=Xp, src=ps, engine=nisa.engine.scalar)
    pk["Xp"].append(Xp)
    for j in range(npk):
        q0 = j * _BLOCK
        nisa.dma_copy(dst=Xs[j][r0:r0 + nb, :], src=Xp[q0:q0 + nb, :])


def _chunk_prologue(buf, o, cst, rows, T1, H, HV, K, V, raw_gates, use_qk_l2norm, scale, C):
    """The per-token decays of one chunk (every head at once) from its tiles ``buf``."""
    L = C
    g = buf["g"]
    beta = buf["beta"]
    if raw_gates:
        # g = -exp(A_log) softplus(a + dt_bias); beta = sigmoid(b). The zero row's a = 0
        # would give g != 0: rows past the sequence end get g = 0 (no decay of S).
        nisa.tensor_tensor(dst=g, data1=g, data2=cst["dtb"][0:L, :], op=nl.add)
        nisa.activation(dst=g, op=nl.softplus, data=g)
        live = nl.ndarray((L, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=live, data=rows, op0=nl.less, operand0=T1 - 1)
        nisa.scalar_tensor_tensor(dst=g, data=g, op0=nl.multiply, operand0=live,
                                  op1=nl.multiply, operand1=cst["negA"][0:L, :])
        nisa.activation(dst=beta, op=nl.sigmoid, data=beta)
    if use_qk_l2norm:
        _l2norm_rows(buf["q"], L, H, K)
        _l2norm_rows(buf["k"], L, H, K)
    # per-token decays of every head at once (fp32, 0/1 stationaries):
    #   c_i = sum_{m <= i} g_m,  to_end_i = sum_{m > i} g_m (direct segment sums),
    #   c_last on K partitions (decay of S over the chunk)
    ch = {}
    ch["rows"] = rows
    c_col = _mm(cst["tri_up"][0:L, 0:L], g, L, HV, True)
    ec = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=ec, op=nl.exp, data=c_col)
    ch["qs"] = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)    # scale e^{c_i}
    nisa.tensor_scalar(dst=ch["qs"], data=ec, op0=nl.multiply, operand0=scale)
    ch["nec"] = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)   # -e^{c_i}
    nisa.tensor_scalar(dst=ch["nec"], data=ec, op0=nl.multiply, operand0=-1.0)
    ch["bs"] = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)    # scale beta_j
    nisa.tensor_scalar(dst=ch["bs"], data=beta, op0=nl.multiply, operand0=scale)
    dl = _exp_of_mm(cst["tri_lo"][0:L, 0:L], g, L, HV)                  # e^{c_last - c_i}
    ch["dlb"] = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)   # beta_i e^{c_last - c_i}
    nisa.tensor_tensor(dst=ch["dlb"], data1=dl, data2=beta, op=nl.multiply)
    ch["el"] = _exp_of_mm(cst["ones"][0:L, 0:K], g, K, HV)             # e^{c_last}
    ch["oc"] = nl.ndarray((L, HV * V), dtype=o.dtype, buffer=nl.sbuf)
    ch["qk"] = {}
    return ch


def _chunks(bufs, n, io, cst, solve, S, c, K, V, win, raw_gates, use_qk_l2norm, scale, C):
    """Row ``c`` (an ``NkiScalar``) of the work list io["rows"] / io["state"]: n consecutive
    chunks of one sequence, gathered into the tiles bufs[0 .. n - 1] at the start of the
    body (rows past the sequence end read the zero row). S is loaded from the row's source
    scratch block, carried through the n chunks and stored to its destination block; o rows
    scattered (rows past the end to the trash row).

    A software pipeline over groups of value heads (_head_groups) and the n chunks
    (_body_plan): a group's work is a list of jobs, one per dependent step (_group_jobs),
    so every in-order engine queue holds work of several groups between one group's
    dependent steps."""
    L = C
    o = io["o"]
    HV = win["nhv"]
    groups = _head_groups(HV)
    G = len(groups)
    jobs, jarg = _group_jobs(win["few"], L)
    stride = _chunk_stride(G, io["compact"])
    order, off, nslot = _body_plan(jobs, G, n, stride, win["few"])
    table = io["rows"]
    # chunk 0's inputs first (its first job reads them), then the state entering the row,
    # per head group (group 0's first: its k S comes first), then the other chunks' inputs
    rows = [_gather_chunk(bufs[0], io, table, c, 0, C)]
    cells = row_cells(io["state"], c)
    for hvs in groups:
        c0 = hvs[0] * V
        c1 = (hvs[len(hvs) - 1] + 1) * V
        nisa.dma_copy(dst=S[:, c0:c1], src=_state_block(io["scratch"], cells[0], io["blk0"], K,
                                                        c0, c1))
    for k in range(1, n):
        rows.append(_gather_chunk(bufs[k], io, table, c, k, C))
    chs = []
    pres = []
    gdat = []
    items = []
    for k in range(n):
        chs.append(None)
        pres.append({})
        gdat.append({})
        items.append({})
    for t in range(nslot):
        for k in range(n):
            for r in range(len(order[k])):
                i = len(order[k]) - 1 - r        # later stages first
                u = t - off[k][i]
                if u < 0 or u >= G:
                    continue
                if chs[k] == None:  # noqa: E711  (NKI has no `is`)
                    chs[k] = _chunk_prologue(bufs[k], o, cst, rows[k], io["T1"], win["nh"], HV,
                                             K, V, raw_gates, use_qk_l2norm, scale, C)
                s = order[k][i]
                _group_job(jobs[s], jarg[s], u, groups[u], chs[k], bufs[k], pres[k], gdat[k],
                           items[k], o, cst, solve[k], S, K, V, win, L, C)
                if k == n - 1 and jobs[s] == "state":
                    # the group's state leaves as soon as the row's last chunk updated it
                    c0 = groups[u][0] * V
                    c1 = (groups[u][len(groups[u]) - 1] + 1) * V
                    nisa.dma_copy(dst=_state_block(io["scratch"], cells[1], io["blk0"], K, c0,
                                                   c1), src=S[:, c0:c1])


_STATE_JOBS = ("rhs", "oq", "sub", "apply", "post_ops", "out", "state")
_WY_STATE_JOBS = ("out", "state")     # _few_groups: the solve does not read the state


def _chunk_stride(G, compact):
    """Steps between the starts of a body's chunks (_body_plan) for G head groups:
    _CHUNK_STEP, where the groups' jobs interleave between one group's dependent steps;
    with one group (TP4 at LNC=2, TP8) _ONE_GROUP_STEP, so all 8 chunks of a body are in
    flight at once and each chunk's dependent steps hide behind the other chunks' (modeled
    trn2, TP4 16K at LNC=2: 1.74 ms against 2.07 ms at _CHUNK_STEP; 10-90 % draws 1.71-2.48
    against 2.00-2.51 ms). Only ``compact`` tiles (compact_inputs) fit SBUF with the body
    in flight."""
    if G == 1 and compact:
        return _ONE_GROUP_STEP
    return _CHUNK_STEP


def _body_plan(jobs, G, n, stride, few):
    """The issue order of a loop body of n chunks: ``order[k]`` the job indices of chunk k in
    stage order and ``off[k][i]`` the step at which group 0 runs its stage i (group u at step
    off + u); ``nslot`` steps in all. Chunk 0 runs its jobs as listed; a later chunk runs its
    state-independent jobs first, from step stride * k (_chunk_stride; + _FIRST_LEAD in a body
    of 4 or more chunks: chunk 0's doubling, which the body's first chain waits for, then
    shares the queues with fewer of the later chunks' jobs), and its jobs from k S on
    (_STATE_JOBS) once the chunk before has updated that group's state (program order is the
    state's data order)."""
    order = []
    off = []
    nslot = 0
    lead = 0
    if n >= 4:
        lead = _FIRST_LEAD
    for k in range(n):
        ok = []
        if k == 0:
            for s in range(len(jobs)):
                ok.append(s)
        else:
            for s in range(len(jobs)):
                if not _is_state_job(jobs[s], few):
                    ok.append(s)
            for s in range(len(jobs)):
                if _is_state_job(jobs[s], few):
                    ok.append(s)
        fk = []
        shift = 0
        for i in range(len(ok)):
            step = k * stride + i + shift
            if k > 0:
                step = step + lead
            if k > 0 and shift == 0 and _is_state_job(jobs[ok[i]], few):
                # the first state job: one step after the chunk before updates the state
                prev = off[k - 1][len(off[k - 1]) - 1]
                shift = max(prev + 1 - step, 0)
                step = step + shift
            fk.append(step)
        order.append(ok)
        off.append(fk)
        nslot = max(nslot, fk[len(fk) - 1] + G)
    return order, off, nslot


def _is_state_job(name, few):
    """Whether job ``name`` reads the state entering the chunk (directly or through k S;
    ``few``: the WY variant, where only the outputs and the state update read it)."""
    names = _STATE_JOBS
    if few:
        names = _WY_STATE_JOBS
    for x in names:
        if x == name:
            return True
    return False


def _group_jobs(few, L):
    """The jobs of one head group, in order (one per software-pipeline stage), and their
    arguments: q/k transposes, their masked products, gU, the decays, A^T, the packed
    solve's layout moves, the right-hand sides (k S), q S, the solve setup, per doubling
    round its squaring and inverse update, per substitution block its packed right-hand
    side and its application, the product operands, the outputs, the state update. The
    state-dependent k S and R go in early: they do not wait for the solve. The order
    differs with the head groups a chunk has:

    - < 8 groups (TP2, TP4, TP8, the WY form): the right-hand sides are [v | -e^c k] (no
      k S, no q S); the off-diagonal blocks are placed by their own job (``place_off``,
      DMAs) just before the solve setup; after the product operands ``wy`` forms
      nw^T kd and qd^T + (M nw)^T, and only the outputs and the state update read S;
    - >= 8 groups (TP1): q S after the second substitution block instead of beside k S,
      out of ScalarE's busiest stretch.

    ``few``: the first (``_few_groups`` of the layer's value heads, so a program of an LNC
    grid computes its heads as LNC=1 does)."""
    nround = 0
    covered = 2
    while covered < _BLOCK and covered < L:
        nround = nround + 1
        covered = covered * 2
    nblk = len(_block_rows(L))
    jobs = ["qk_t", "qk_mm", "gu", "decay", "at", "place", "rhs", "place_off", "setup"]
    if not few:
        jobs = ["qk_t", "qk_mm", "gu", "decay", "at", "place", "rhs", "setup"]
    jarg = []
    for name in jobs:
        if name == "place":
            jarg.append(1 - few)        # the off-diagonal blocks too?
        else:
            jarg.append(0)
    for r in range(nround):
        jobs.append("square")
        jarg.append(2 ** (r + 1))
        jobs.append("update")
        jarg.append(2 ** (r + 1))
    for b in range(nblk):
        jobs.append("sub")
        jarg.append(b)
        jobs.append("apply")
        jarg.append(b)
        if not few and b == min(1, nblk - 1):
            jobs.append("oq")
            jarg.append(0)
    tail = ["post_ops", "out", "state"]
    if few:
        tail = ["post_ops", "wy", "out", "state"]
    for name in tail:
        jobs.append(name)
        jarg.append(0)
    return jobs, jarg


def _group_job(job, x, u, hvs, ch, buf, pres, gdat, items, o, cst, solve, S, K, V, win, L, C):
    """Job ``job`` (argument ``x``) of head group ``u`` (the program's value heads ``hvs``,
    numbered within its window ``win``; see _group_jobs) of the chunk in ``buf`` / ``ch``."""
    qk_of = win["qk"]
    key = str(u)
    qk = ch["qk"]
    xdt = buf["v"].dtype
    few = win["few"]
    N = V               # width of the solve's right-hand sides: v, or [v | -e^c k] (WY)
    if few:
        N = V + K
    if job == "qk_t":
        pre = []
        for hv in hvs:
            pre.append({})
        pres[key] = pre
        gd = {}
        gd["X"] = []
        gdat[key] = gd
        for hv in hvs:
            h = qk_of[hv]
            if qk.get(str(h)) == None:  # noqa: E711  (NKI has no `is`)
                qk[str(h)] = _qk_transposes(buf["k"], buf["q"], h, L, K, xdt != nl.float32)
                qk[str(h)]["group"] = u
        if few:
            # q's last reader (the next chunk's q lands after this job)
            for i in range(len(hvs)):
                _head_qd(pre[i], buf["q"], ch["qs"], qk_of[hvs[i]], hvs[i], K)
    elif job == "qk_mm":
        for hv in hvs:
            d = qk[str(qk_of[hv])]
            if d["group"] == u and d.get("kk") == None:  # noqa: E711 (once per q/k head)
                _qk_products(cst, d, L)
    elif job == "gu":
        gdat[key]["gU"] = nl.ndarray((L, len(hvs), L), dtype=nl.float32, buffer=nl.sbuf)
        for i in range(len(hvs)):
            _head_gu(gdat[key]["gU"][:, i, :], cst, buf["g"], hvs[i], L)
    elif job == "decay":
        _group_decay(cst, pres[key], gdat[key]["gU"], L)
    elif job == "at":
        for i in range(len(hvs)):
            _head_at(qk[str(qk_of[hvs[i]])], pres[key][i], buf["beta"], hvs[i], L)
    elif job == "place":
        ATs = []
        for d in pres[key]:
            ATs.append(d["AT"])
        _solve_place(ATs, L, solve[u], True, x == 1)
    elif job == "place_off":
        ATs = []
        for d in pres[key]:
            ATs.append(d["AT"])
        _solve_place(ATs, L, solve[u], False, True, True)
    elif job == "setup":
        items[key] = _solve_setup(len(hvs), L, cst, xdt, solve[u])
    elif job == "square":
        _solve_round(items[key], x, xdt)
    elif job == "update":
        _solve_update(items[key], x, xdt)
    elif job == "rhs":
        Rs = []
        for i in range(len(hvs)):
            if few:
                _head_rhs_wy(pres[key][i], qk[str(qk_of[hvs[i]])], buf["v"], ch["nec"], hvs[i],
                             V, K)
            else:
                _head_rhs(pres[key][i], qk[str(qk_of[hvs[i]])], buf["v"], ch["nec"], S, hvs[i],
                          V)
            Rs.append(pres[key][i]["R"])
        gdat[key]["Rs"] = Rs
        gdat[key]["Rp"] = None
        if solve[u]["G"] == None:  # noqa: E711  (packed unless _place_g moves the inverses)
            gdat[key]["Rp"] = _pack_rhs(Rs, L, V)
    elif job == "oq":
        for i in range(len(hvs)):
            _head_oq(pres[key][i], qk[str(qk_of[hvs[i]])], ch["qs"], S, hvs[i], V)
    elif job == "sub":
        _solve_rhs_block(items[key], gdat[key]["Rp"], x, N)
    elif job == "apply":
        if x == 0:
            for i in range(len(hvs)):
                gdat[key]["X"].append(nl.ndarray((L, N), dtype=nl.float32, buffer=nl.sbuf))
        _solve_apply_block(items[key], gdat[key]["X"], x, N, gdat[key]["Rs"])
    elif job == "post_ops":
        for i in range(len(hvs)):
            _head_post_ops(qk[str(qk_of[hvs[i]])], pres[key][i], ch["bs"], ch["dlb"], hvs[i],
                           L, K)
    elif job == "wy":
        _group_wy(pres[key], gdat[key]["X"], cst["ident"], L, K, V, xdt != nl.float32)
    elif job == "out":
        c0 = hvs[0] * V
        c1 = (hvs[len(hvs) - 1] + 1) * V
        if few:
            _group_out_wy(pres[key], gdat[key]["X"], S, ch["oc"][:, c0:c1], hvs, V,
                          xdt != nl.float32)
        else:
            for i in range(len(hvs)):
                _head_out(pres[key][i], gdat[key]["X"][i], ch["oc"], cst["ident"], hvs[i], V,
                          xdt != nl.float32)
        # each group's o columns leave as soon as they are done
        nisa.dma_copy(dst=_rows_view(o, ch["rows"], C, win["hv0"] * V + c0, c1 - c0),
                      src=ch["oc"][:, c0:c1])
    elif few:
        for i in range(len(hvs)):
            _head_state_wy(S, pres[key][i], gdat[key]["X"][i], ch["el"], hvs[i], K, V,
                           xdt != nl.float32)
    else:
        for i in range(len(hvs)):
            _head_state(S, pres[key][i]["kd"], gdat[key]["X"][i], ch["el"], hvs[i], K, V,
                        xdt != nl.float32)


def _exp_of_mm(st, mv, M, N):
    """SBUF [M, N] = exp(st^T @ mv), the exp reading PSUM (st holds only 0 / 1)."""
    ps = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv, is_stationary_onezero=True,
                   accumulate=False)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=out, op=nl.exp, data=ps)
    return out


def _qk_transposes(kc, qc, h, L, K, fast):
    """q/k head h of one chunk: its keys kh [L, K] and k^T, q^T [K, L] side by side in one
    ``[K, 2, L]`` tile (one PSUM bank and one eviction for both), float32 (``fast``: bf16
    callers, read as tfloat32 operands: exact for bf16 inputs, and the state they
    multiply keeps 10 mantissa bits instead of a bf16 copy's 7) or the input dtype."""
    d = {}
    d["kh"] = kc[:, h * K:(h + 1) * K]
    odt = kc.dtype
    if fast:
        odt = nl.float32
    ps = nl.ndarray((K, 2 * L), dtype=kc.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=ps[:, 0:L], data=d["kh"], engine=nisa.engine.tensor)
    nisa.nc_transpose(dst=ps[:, L:2 * L], data=qc[:, h * K:(h + 1) * K], engine=nisa.engine.tensor)
    d["kqT"] = nl.ndarray((K, 2, L), dtype=odt, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d["kqT"].reshape((K, 2 * L)), src=ps, engine=nisa.engine.scalar)
    d["kT"] = d["kqT"][:, 0, :]
    d["qT"] = d["kqT"][:, 1, :]
    d["fast"] = fast
    return d


def _qk_products(cst, d, L):
    """The masked products of a q/k head (into ``d``): kk[j, i] = k_j . k_i (j < i) and
    kq[j, i] = k_j . q_i (j <= i), float32, both in [j, i] layout, from one matmul and one
    masked eviction (k^T against [k^T | q^T]). The masks ride on the eviction, so no decay
    matrix needs one."""
    K = d["kqT"].shape[0]
    ps = nl.ndarray((L, 2 * L), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=_tf(d["kT"], d["fast"]),
                   moving=_tf(d["kqT"].reshape((K, 2 * L)), d["fast"]), accumulate=False)
    kkq = nl.ndarray((L, 2, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=kkq.reshape((L, 2 * L)), data1=ps,
                       data2=cst["kkq_mask"][0:L, :, 0:L].reshape((L, 2 * L)), op=nl.multiply)
    d["kk"] = kkq[:, 0, :]
    d["kq"] = kkq[:, 1, :]


def _head_gu(gU, cst, g, hv, L):
    """gU[m, i] = g_m (m <= i) of value head hv (into the ``[L, L]`` tile ``gU``): the
    moving operand of its segment sums."""
    nisa.activation(dst=gU, op=nl.copy, data=cst["tri_up"][0:L, 0:L], scale=g[:, hv:hv + 1])


def _group_decay(cst, ds, gU, L):
    """DT[j, i] = e^{seg(j, i]} ([j, i] layout; 1 where j >= i) of each head of a group (into
    ``ds``) from direct segment sums seg(j, i] = sum_{j < m <= i} g_m (an fp32 matmul with a
    0/1 operator), never c_i - c_j of two running sums (that cancels): the heads' gU side
    by side (``[L, heads, L]``, one PSUM bank for 4 heads at L = 128), so one matmul and
    one exp serve the group."""
    nh = gU.shape[1]
    DT = _exp_of_mm(cst["tri_lo"][0:L, 0:L], gU.reshape((L, nh * L)), L, nh * L)
    DT = DT.reshape((L, nh, L))
    for i in range(nh):
        ds[i]["DT"] = DT[:, i, :]


def _head_at(qk, d, beta, hv, L):
    """AT = beta_j kk DT = (K K^T * D diag(beta))^T of value head hv, with beta folded into
    the unknown (v_new = beta * Y): (I + K K^T * D diag(beta)) Y = R (module docstring;
    R in _head_rhs). kk carries the strictly-lower mask."""
    d["AT"] = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=d["AT"], data=qk["kk"], op0=nl.multiply,
                              operand0=beta[:, hv:hv + 1], op1=nl.multiply, operand1=d["DT"])


def _head_rhs(d, qk, vc, nec, S, hv, V):
    """R = v - e^c (k S) of value head hv (into ``d``): the delta of every token against the
    chunk's entry state."""
    L = vc.shape[0]
    ps = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=_tf(qk["kT"], qk["fast"]),
                   moving=_tf(S[:, hv * V:(hv + 1) * V], qk["fast"]), accumulate=False)
    d["R"] = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=d["R"], data=ps, op0=nl.multiply, operand0=nec[:, hv:hv + 1],
                              op1=nl.add, operand1=vc[:, hv * V:(hv + 1) * V])


def _head_oq(d, qk, qs, S, hv, V):
    """oq = scale e^c (q S) of value head hv (into ``d``), the inter-chunk part of o."""
    L = qk["kh"].shape[0]
    pq = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pq, stationary=_tf(qk["qT"], qk["fast"]),
                   moving=_tf(S[:, hv * V:(hv + 1) * V], qk["fast"]), accumulate=False)
    d["oq"] = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=d["oq"], op=nl.copy, data=pq, scale=qs[:, hv:hv + 1])


def _head_post_ops(qk, d, bs, dlb, hv, L, K):
    """The operands the products with Y need (into ``d``): MT = scale beta_j tril(q k^T) D
    ([j, i] layout) and the decayed keys kd = beta e^{c_last - c} k."""
    kdm = nl.ndarray((L, K + L), dtype=nl.float32, buffer=nl.sbuf)   # [kd | MT]: one operand
    MT = kdm[:, K:K + L]
    nisa.scalar_tensor_tensor(dst=MT, data=qk["kq"], op0=nl.multiply, operand0=bs[:, hv:hv + 1],
                              op1=nl.multiply, operand1=d["DT"])
    kd = kdm[:, 0:K]
    nisa.activation(dst=kd, op=nl.copy, data=qk["kh"], scale=dlb[:, hv:hv + 1])
    d["MT"] = MT
    d["kd"] = kd
    d["kdm"] = kdm


def _head_out(d, Y, oc, ident, hv, V, fast):
    """o columns of value head hv: oq + (scale tril(q k^T) D diag(beta)) Y. ``fast`` (bf16
    callers): oq joins the product's PSUM accumulation through an identity matmul
    (tfloat32: its rounding, 2^-11, is a quarter of the bf16 output's), so the eviction is
    a plain copy ScalarE can do (modeled: VectorE was the busiest engine)."""
    L = Y.shape[0]
    pm = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pm, stationary=_tf(d["MT"], fast), moving=_tf(Y, fast), accumulate=False)
    if fast:
        nisa.nc_matmul(dst=pm, stationary=_tf(ident[0:L, 0:L], fast), moving=_tf(d["oq"], fast),
                       accumulate=True)
        nisa.tensor_copy(dst=oc[:, hv * V:(hv + 1) * V], src=pm, engine=nisa.engine.scalar)
    else:
        nisa.tensor_tensor(dst=oc[:, hv * V:(hv + 1) * V], data1=pm, data2=d["oq"], op=nl.add)


def _head_qd(d, qc, qs, h, hv, K):
    """qd = scale e^c q of value head hv (q/k head h; into ``d``), float32 [L, K]: the q S
    part of the WY form's output operand (_group_wy). GpSimd: off the busier engines."""
    L = qc.shape[0]
    d["qd"] = nl.ndarray((L, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d["qd"], data1=qc[:, h * K:(h + 1) * K],
                       data2=qs[:, hv:hv + 1].broadcast(1, K), op=nl.multiply,
                       engine=nisa.engine.gpsimd)


def _head_rhs_wy(d, qk, vc, nec, hv, V, K):
    """B = [v | -e^c k] of value head hv (into d["R"]), float32 [L, V + K]: the WY form's
    right-hand sides, which do not read the state: the solve gives [u | nw] = (I + A)^{-1} B,
    and Y = u + nw S (_group_wy). GpSimd: off the busier engines."""
    L = vc.shape[0]
    B = nl.ndarray((L, V + K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=B[:, 0:V], src=vc[:, hv * V:(hv + 1) * V], engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=B[:, V:V + K], data1=qk["kh"], data2=nec[:, hv:hv + 1].broadcast(1, K),
                       op=nl.multiply, engine=nisa.engine.gpsimd)
    d["R"] = B


def _group_wy(ds, Xs, ident, L, K, V, fast):
    """The state-free operands of a group's heads' outputs and state updates, from the
    solves' X = [u | nw] (into ``ds``): with Y = u + nw S,
    ``S' = e^{c_last} S + kd^T u + (nw^T kd)^T S`` and ``o = M u + (qd + M nw) S``, so per
    head WT = [nw^T kd | qd^T + (M nw)^T] ``[K, K + L]``: one matmul of nw against
    [kd | MT], qd^T added by an identity matmul; two heads share a PSUM bank and one
    eviction (into the group's ``[K, heads, K + L]`` tile; ScalarE, then VectorE)."""
    nh = len(ds)
    WT = nl.ndarray((K, nh, K + L), dtype=nl.float32, buffer=nl.sbuf)
    for p0 in range(0, nh, 2):
        p1 = min(p0 + 2, nh)
        ps = nl.ndarray((K, p1 - p0, K + L), dtype=nl.float32, buffer=nl.psum)
        for i in range(p0, p1):
            nw = Xs[i][:, V:V + K]
            nisa.nc_matmul(dst=ps[:, i - p0, :], stationary=_tf(nw, fast),
                           moving=_tf(ds[i]["kdm"], fast), accumulate=False)
            nisa.nc_matmul(dst=ps[:, i - p0, K:K + L], stationary=_tf(ds[i]["qd"], fast),
                           moving=_tf(ident[0:L, 0:L], fast), accumulate=True)
        eng = nisa.engine.scalar
        if p0 > 0:
            eng = nisa.engine.vector
        nisa.tensor_copy(dst=WT[:, p0:p1, :], src=ps, engine=eng)
    for i in range(nh):
        ds[i]["WT"] = WT[:, i, :]


def _group_out_wy(ds, Xs, S, oc, hvs, V, fast):
    """o columns of a group's value heads ``hvs`` in the WY form (into ``oc``, their
    ``[L, heads*V]`` columns): per head M u + (qd + M nw) S (_group_wy), one PSUM
    accumulation in its columns of one bank, and one ScalarE eviction for the group."""
    L = Xs[0].shape[0]
    K = S.shape[0]
    nh = len(hvs)
    pm = nl.ndarray((L, nh * V), dtype=nl.float32, buffer=nl.psum)
    for i in range(nh):
        hv = hvs[i]
        nisa.nc_matmul(dst=pm[:, i * V:(i + 1) * V], stationary=_tf(ds[i]["MT"], fast),
                       moving=_tf(Xs[i][:, 0:V], fast), accumulate=False)
        nisa.nc_matmul(dst=pm[:, i * V:(i + 1) * V], stationary=_tf(ds[i]["WT"][:, K:K + L], fast),
                       moving=_tf(S[:, hv * V:(hv + 1) * V], fast), accumulate=True)
    nisa.tensor_copy(dst=oc, src=pm, engine=nisa.engine.scalar)


def _head_state_wy(S, d, X, el, hv, K, V, fast):
    """S <- e^{c_last} S + kd^T u + (nw^T kd)^T S for value head hv (_group_wy): kd^T u does
    not read the state, so the state's chain is one matmul and one VectorE update."""
    Sh = S[:, hv * V:(hv + 1) * V]
    su = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=su, stationary=_tf(d["kd"], fast), moving=_tf(X[:, 0:V], fast),
                   accumulate=False)
    nisa.nc_matmul(dst=su, stationary=_tf(d["WT"][:, 0:K], fast), moving=_tf(Sh, fast),
                   accumulate=True)
    nisa.scalar_tensor_tensor(dst=Sh, data=Sh, op0=nl.multiply, operand0=el[:, hv:hv + 1],
                              op1=nl.add, operand1=su)


def _head_state(S, kd, Y, el, hv, K, V, fast):
    """S <- e^{c_last} S + kd^T Y for value head hv."""
    Sh = S[:, hv * V:(hv + 1) * V]
    su = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=su, stationary=_tf(kd, fast), moving=_tf(Y, fast), accumulate=False)
    nisa.scalar_tensor_tensor(dst=Sh, data=Sh, op0=nl.multiply, operand0=el[:, hv:hv + 1],
                              op1=nl.add, operand1=su)
