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
(DESIGN.md), packed over 4 heads (head h on partitions 32h..32h+31, the matrices
block-diagonal over the heads, so one 128-row matmul serves 4 heads): each diagonal
block inverted by nilpotent doubling ``(I - N)^{-1} = (I + N)(I + N^2)(I + N^4)...``
(N = -A_bb, 4 rounds; the inverse kept compact, a quarter of the columns), then
forward substitution over the blocks, ``X_b = A_bb^{-1} (R_b - sum_{k<b} A_bk X_k)``:
one PSUM accumulation of the off-diagonal products, one subtraction and one
application per block for the 4 heads; never a series over the whole chunk. With fewer
than 8 head groups (_few_groups) the right-hand sides are not packed: each head's block
inverses are moved to the block's own rows (G, _place_g), so block b's application
``X_b = inv_bb B_b - inv_bb sum_{k<b} A_bk X_k`` reads B_b where the k S eviction put it.

HBM arguments (prepared by the launcher; Tb = the token bucket, Nb = the sequence bucket):
  q2, k2 ``[Tb + 1, H*K]``, v2 ``[Tb + 1, HV*V]`` (q's dtype; row Tb and rows past
  num_tokens are zero); gate1, gate2 ``[Tb + 1, HV]`` float32: g and beta, or raw
  a and b; head_params ``[128, 2*HV]`` float32 (A_log, dt_bias on every row) or
  None; pool ``[slots*HV*K, V]`` (the ``[slots, HV, K, V]`` pool, updated in
  place); the int32 tables below. Returns o ``[Tb + 1, HV*V]`` in q's dtype (rows
  of padding sequences zero; the launcher slices ``[:num_tokens]``).

Batch composition is runtime data (issue 10)
--------------------------------------------
Compile-time arguments: shapes, dtypes, H, raw_gates, use_qk_l2norm, scale,
chunk, bf16 (= the activations are bfloat16). Everything per batch is an int32
table built by the launcher from cu_seqlens / state_indices / has_initial_state
with a few vectorised array ops (``prefill_tables``; shapes depend only on the
token / sequence buckets):

- ``chunk_rows [Tb // C + Nb + n, C]`` (n = ``chunks_per_iteration(HV)``): the token
  row of every row of every chunk of the live sequences, in order; rows past a
  sequence end hold ``Tb``, the zero row the launcher appends to every token array
  (and the trash row of ``o``); n spare rows of ``Tb`` at the end (each iteration
  gathers the next n chunks, read at a static row offset from its first);
- ``seq_tab [Nb, 6]``: (has_initial_state, first chunk, where its iterations of n
  chunks end, end chunk, first pool row ``slot*HV*K``, refill) of each live sequence,
  compacted; refill = 1 when the sequence runs an iteration of n chunks and the last
  body before it was a one-chunk body (which refills only the first tile set) or none
  ran (the kernel gathers only chunk 0 before the loops);
- ``pad_rows``: the rows of padding sequences (chunked as above), which get
  zeros; ``counts [1, 2]``: live sequences, padding chunks.

Loops: ``for z in dynamic_range(n_pad)`` writes zeros; ``for s in
dynamic_range(n_live)``: state gathered (``dynamic_range(has_init)``: 0 or 1 trips; else
zeros), ``dynamic_range(refill)`` gathers its chunks 1 .. n - 1 into tile sets
1 .. n - 1 (and zeroes their packed solve tiles), ``for c in dynamic_range(first, mid,
n)`` runs a body of n chunks, ``for c in dynamic_range(mid, end)`` the remaining 0 .. n - 1 one at
a time (n = 1: only the second loop), state scattered. The kernel gathers chunk 0 and
zeroes tile set 0's packed tiles before the loops, the rest only for a sequence that
runs a body of n chunks; a body of n chunks gathers the next n, a one-chunk body the
next one (modeled TP4 1 x 128: 37.8 us with 1 chunk per iteration, 51.8 when one-chunk
bodies refilled every set, 44.5 when the launch gathered and zeroed all n sets, 36.0
then, 36.1 now; 4K 0.5 % slower: the first body of n chunks waits for its gathers). A runtime loop
drains every engine at each iteration boundary (nki-dynamic-loops.rst, "Iterations Do
Not Overlap"), so with few heads per core an iteration holds several chunks
(``chunks_per_iteration``: about 8 head groups in flight). What is unrolled inside a
body is bounded by the layer (heads, 32-row blocks, n). Program size (static
instructions, both chunk loops): Qwen3-Next TP1 1,736, TP2 3,368, TP4 2,876; the same at
2K and 16K tokens and for 8 x 2K (the simulator counts a loop only when it runs: at 2K,
16K and 8 x 2K the one-chunk loop does not, and the reported figure is TP4 2,315; the
doubling's 2-head PE tiles (below) add ~450 to it).
Every matmul passes ``accumulate=`` explicitly.

A loop body is a software pipeline over groups of 4 value heads and its chunks: each
group's work is a list of jobs, one per dependent step (``_group_jobs``: q/k
transposes; their masked products; gU; the decays; A^T; the packed solve's layout
moves; the right-hand sides; q S; the solve setup; per doubling round the squaring
and the inverse update; per 32-row block its substitution and its application; the
product operands; the outputs; the state update), and step t issues job s of group
t - s for every s, the later stages first. Every in-order engine queue then holds
work of up to 8 groups between one group's dependent steps: this is most of the
speed (modeled TP1: three stages per group — pre-solve, solve, post-solve — 0.61 M
tokens/s; one job per stage 1.1 M). With n chunks per body (``_body_plan``), chunk
k > 0 starts its state-independent jobs (up to the doubling) _CHUNK_STEP steps after
chunk k - 1 and its state jobs (from k S on) one step after chunk k - 1's state update
of the same group, so program order is the state's data order.

Short and padded chunks: every chunk is C rows. Its rows are gathered with
indirect DMAs (one row per partition) from ``chunk_rows``; rows past the
sequence end read the zero row, so q = k = v = 0, g = 0, beta = 0 there
(raw gates: g is multiplied by a row-valid column, as softplus(dt_bias) != 0).
With k = v = 0 such a row adds nothing to A, to v_new of the real rows (they
precede it: strictly lower products never reach them) or to S, and g = 0
leaves every decay exact; its output row is scattered to the trash row. Padding
tokens are never read as data of a live sequence, so non-finite padding
cannot leak. A slot is one contiguous ``[HV*K, V]`` block of the pool, moved by
one DMA with a run-time start (``scalar_offset``, no per-partition indices) each
way per sequence; the pool update is the kernel's own write.

Engines, per (chunk, value head) at C = 128 (tokens on partitions)
-------------------------------------------------------------------
- DMA: the row gathers of q, k, v, g, beta (with small inputs the next chunk's during
  the body: q, v, g, beta into the tiles once their last reader is issued, k into a
  second tile) and the output scatter (per head group: every iteration has >= 4 groups
  over its chunks); the packed solve's layout moves as SBUF-to-SBUF DMAs — the
  diagonal blocks (into P^T), the right-hand sides (into the packed R; < 8 head groups:
  instead the block inverses into G, off the state chain) and the solutions back to
  per-head tiles (< 8 head groups: all but the last block's) — partition moves no
  compute engine spends time on (ScalarE copies instead: modeled TP4 3.58 -> 3.0 M
  tokens/s).
- TensorE: k^T, q^T (transposes, one PSUM bank per q/k head); k k^T | k q^T (one
  matmul per q/k head, shared by HV / H value heads); the segment sums (fp32, 0/1
  stationary); k S, q S; the doubling: P from P^T (transpose mode), P P and P^T P^T
  up to N^8 (block-diagonal tiles, from the same operands: no transpose on the chain),
  then compact products with N^8, and the compact inverse updates, all on PE tiles of
  the pack's heads (_tile_mm: the whole array at TP1; < 8 head groups tiles of 2 heads,
  64 rows and columns, so the block-diagonal tiles hold 64 columns per block instead of
  128 and the expanded evictions halve); per block the
  off-diagonal products (1-3 per group) and the application (1 per group; < 8 head
  groups also one 32-row product with G per head); M Y and kd^T Y; bf16 callers: q S
  into the output's accumulation (an identity matmul).
- VectorE: the masked eviction of k k^T | k q^T, A^T, R, M, the state update (and o
  for float32 callers); per group the P eviction, the compact inverse updates (one
  [W, 4 blocks, 32] op per round) and its expansion, the substitution's subtractions
  (3 per group; < 8 head groups: ScalarE negates instead, and the last block's
  solutions leave PSUM half on VectorE, half on ScalarE).
- ScalarE: transpose evictions, the exps, the doubling's expanded evictions (5 per
  group) and its chained product, q S, the packed solutions, the decayed keys, o (bf16
  callers); < 8 head groups also the off-diagonal placements of block row 0.
- GpSimd: the off-diagonal blocks' placements (a row strip per head and block row:
  on DMA they put the queues on the critical path; < 8 head groups rows 1-2 only),
  software descriptor generation of the indirect gathers and scatters.
  VectorE zeroes the packed tiles once per launch (sets 1 .. n - 1 only if a body of n
  chunks runs): the placements write the same elements every chunk, so the zeros persist.
Operand precision: float32 callers get fp32 operands everywhere (the exact
mode: 6e-8 output, 4e-8 state at small shapes, tests 1e-5). bfloat16 callers
(``bf16``): q, k, v enter bf16 (exact: they are the inputs); q^T, k^T, the state,
the substitution's operands, M, kd and Y are tfloat32 operands (10 mantissa bits,
streamed at the BF16 rate: nki_spec §8.1, dense BF16/FP16/TF32 79 TFLOPS on trn2 vs
FP32 20), so k S and q S read the float32 state without a bf16 copy; the doubling's
powers and partial inverses are bf16 (the inverse's unit diagonal is exact; its
last round writes fp32); all decays and segment sums stay fp32. Rounding Y and M to
bf16 instead measured 2.5e-3 output error (most of the 3e-3 budget), the state
update in bf16 1.7e-3 state error. Measured at Qwen3-Next TP4 2K, realistic gates:
output 1.68e-3 (bf16 output rounding ~1.1e-3 of it), state 2.4e-4; strong-then-weak
gates 1.69e-3 / 3.6e-4.

What binds (modeled, trn2, bf16 I/O, fp32 pool, chunk 128, Qwen3-Next TP1): work
per chunk of 32 heads VectorE 56 us, ScalarE 56, TensorE 37, GpSimd 26, DMA queues
~62 % busy, in a 64 us chunk at 16K tokens (VectorE and ScalarE 86-87 % busy): 2.00 M
tokens/s, the issue-15 goal, by the central figure (range 0.69-2.43 M). Both bind in
turn: the chunk opens with ScalarE (transposes, exps) and the DMA queues (layout
moves), the doubling's evictions hold ScalarE in the middle and VectorE (products'
evictions, state updates) closes it; the runtime loop's barrier keeps the next
chunk's state-independent work from filling the ends. Most steps that moved work
between the two (an eviction from one to the other, to GpSimd, to a DMA transpose)
measured slower or within 1 %: more speed needs less work on both, not another
balance. Figures, tokens/s per NeuronCore: the README's "Modeled performance" table
and ``python -m simulate``. The kernel of issue 10, same model: TP1 0.42 M, TP4 1.69 M.

Qwen3-Next TP4 (8 value heads: 2 groups of 4): 7.13 M tokens/s at 16K (range 2.42-8.67 M),
3.56x TP1 (goal 3.5x, met by the central figure); 4.78 M with one chunk and 4 groups of 2
heads per iteration. An iteration of 4 chunks takes 71.5 us (modeled 4K); ScalarE has 57 us
of work in it, VectorE 52, TensorE 49, GpSimd 14 plus the gathers' software descriptors.
The last three steps (modeled 4K, 6.72 M before): (a) the doubling's products on PE tiles
of 2 heads (tiling mode, tile_size (64, 64) at tile_position (64 t, 64 t); _tile_mm), so
P^T, P and the squares hold 64 columns per block instead of 128 and the 5 expanded
evictions per group halve: ScalarE 62 -> 53 us of work per iteration, but alone 6.65 M
(the tiles double the doubling's matmuls in the in-order TensorE queue); with row 0's
off-diagonal placements moved from GpSimd to the freed ScalarE 6.77 M (every row on
ScalarE 6.65 M, every other head 6.77 M, VectorE 6.11 M), and P from P^T by transpose-mode
matmuls (their bf16 PSUM lets VectorE evict at the 16-bit rate; fp32 products 6.77 M)
6.84 M; (b) chunk 0 two steps ahead of the others in a body of 4 (_FIRST_LEAD) 6.92 M.
Tiles of one head (32 x 32: 4x the matmuls) make TensorE bind (6.14 M); at TP1 2-head
tiles cost 1.96 -> 1.94 M (TensorE and VectorE), so TP1 keeps the whole array.
[UNVERIFIED on hardware] that a row tile takes its operands from the partitions of its
rows (as the 32-row G products already assume); that a column tile writes the PSUM
partitions of its columns is nki-library practice (mlp_tkg, router_topk), and the
simulator follows both. The cost model runs the tiles' matmuls one after another, while
the hardware runs matmuls on disjoint tiles in parallel (nki.isa.nc_matmul, "Tiling
mode"): the modeled TensorE time of the doubling is an upper bound. What-ifs now (4K,
6.92 M): VectorE twice as fast +6.3 %, ScalarE +0.8 %, both +12.3 %, no cross-engine
semaphore latency +4.7 %, DMA fixed and completion latency 0 +1.5 %, twice the DMA
engines +1.7 %: VectorE binds the chain phase. Tried and dropped this round (4K, against
6.77-6.84 M): the next chunks' gathers issued no earlier than a given step (-2 % to +0.8 %
depending on the step, too sensitive to keep); the decayed keys, M and the state update
in other orders again (6.41-6.72 M) and a step issuing the chains' jobs before the other
jobs (5.28-5.61 M: the state-independent work then starves); the state update's eviction
on GpSimd (scalar_tensor_tensor has no engine choice); chunk starts other than (0, 8, 14,
20) (2K, 4K, 8K and TP8 all best there; (0, 8, 14, 19) is 0.8 % faster at 4K only).
Before this round (6.92 M at 16K, 74 us per iteration, ScalarE 62 us): chunk 0's
doubling ended at ~25 us (the off-diagonal placements run on GpSimd meanwhile: 6.22 ->
6.48 M at 4K against after the doubling), but its substitution then ran among chunks
1-3's state-independent work (transposes, products, decays, A^T, the doubling:
ScalarE's expanded evictions) and its chain ended at ~44 us; the chains of chunks 1-3
follow one another (k S, the right-hand-side evictions, the 4 substitution
blocks, the products with Y, the state update: ~8.5 us for both groups, 10 before the
right-hand sides stayed unpacked) with VectorE and ScalarE 70-80 % busy. The right-hand
sides unpacked (_place_g; modeled 4K: TP4 6.48 -> 6.59 M tokens/s with G placed by DMA,
6.31 M by GpSimd copies, which then bind; the negation on ScalarE 6.61 M against VectorE
6.50 M), the last block straight from PSUM (6.64 M), _CHUNK_STEP 6 (6.69 M; 8K: 6.78 ->
6.83 M) and the expansion of the inverse without block 0 (6.72 M): the chain loses the
packing DMAs (1.9 us: fixed latency, transfer, completion) and the last block's
unpacking (1.4 us) and gains 4 G products per block on TensorE. What-ifs on this shape
(modeled 4K, 6.69 M): VectorE twice as fast +7.8 %, ScalarE +4 %, both +18 %, no
cross-engine semaphore latency +5.3 %, DMA fixed and completion latency 0 +2 %, twice the
DMA engines +1.9 %. Tried and dropped with this design (4K, 6.69-6.72 M): post_ops or oq
at other places of the job list (6.43-6.66 M), the decayed keys and M as separate jobs
around the state update (6.37-6.63 M), M of the last chunk among its state-independent
jobs (6.59 M); q/k transpose evictions, gU, the decayed keys or q S's eviction on VectorE
(6.19-6.52 M; both VectorE and ScalarE are near their limit, as at TP1); the right-hand
side's eviction on ScalarE with v added by G products (5.74 M); _SQUARED 4 / 16 (6.29 /
6.40 M); the inverse expanded by DMAs (6.51 M: 128-byte runs); the G products of block b
issued early in the TensorE queue (6.67-6.70 M); the outputs of a group in one eviction
(no change); 5 or 6 chunks per iteration (16K: 6.74 / 6.92 M against 6.90 M; 6 leaves
4 KiB of SBUF). Dropped with the design before (TP4 4K, 6.48 M): the state update from
the packed solutions (per head and block a 32-row matmul, no unpack on the chain) with
the decayed keys packed by DMA (5.15 M: the 16 more DMAs per group hold the DMA queues
the chain's packing used); gU or the decayed keys on GpSimd (5.65 / 6.15 M: GpSimd's
0.25 element per cycle); the chain's sub / apply jobs sharing a step or spaced a step
apart (6.05-6.40 / 6.20-6.29 M); later or earlier chunk starts (6.00-6.50 M); squaring
only to N^4 or N^2 (5.92 / 5.01 M: the doubling's latency is on the chain); the state
update before the outputs (6.46 M). Before the placement change (6.26 M): T = (I +
A)^{-1} formed explicitly so the state chain is only k S, R, o, S (the products with T
add 1.3 us of VectorE and of ScalarE per chunk: 5.92 M); the products with Y read from
the packed solutions, M and kd packed off the chain, no unpack (TensorE then binds the
chain phase: 5.97 M); A^T | M^T in one op (6.11 M); off-diagonal placements by DMA (6.22
M); the TP1 job order (6.17 M); chunk offsets 0-16 steps and later chunks started later
(<= 6.26 M); 8 chunks per iteration (SBUF); chunk 64 (4.5 M); the decayed keys and M in
the state-independent part (5.76 M), M alone right after A^T (6.03-6.07 M), the decayed
keys and M first among the state jobs (5.52 M); the diagonal blocks placed by GpSimd
copies (5.63 M: GpSimd binds). A lookahead across the loop boundary (5.65 M, with 1 to 4
of the 4 chunks looked ahead and other start offsets and spacings 4.9-5.7 M): a body runs
the state jobs of its first 2 chunks from what the body before computed (their
transposes, M, the decayed keys, the packed inverse and decay columns kept in tiles
allocated before the loops, written only after the restored chunk of the same tile set
has read them) and the state-independent jobs of the next body's first 2 chunks, so no
chain waits for its own chunk's doubling. It loses because a state chain interleaved
with other chunks' state-independent work takes about 2.5x as long as alone (24 us
against ~9.4): its matmuls wait in the in-order TensorE queue behind transposes and
products that themselves wait on ScalarE, and its right-hand-side packing and unpacking
DMAs wait up to 5 us behind the gathers and the diagonal placements on the DMA queues
(the code: branch gdn-lookahead-experiment).

What is left, largest first: (1) at TP4, the chain phase: the state chains of an
iteration's chunks follow one another, and a chain step waits behind the other chunks'
queued work in the in-order engine queues; VectorE now binds it (the right-hand sides',
M's and the state update's evictions, 0.85 us per group each); fewer hops per
substitution block (TensorE -> ScalarE negation -> TensorE -> ScalarE eviction: folding
the negation into the application needs inv_bb A_bk, i.e. A_bk in the [i, j] layout, a
transpose per block pair); (2) at TP1, overlap across chunks (SBUF holds one chunk's
tiles: 172 of 208 KiB); (3) the doubling at TP1: 5 expanded evictions per group (19 us of
ScalarE per chunk), three quarters of whose columns are the packing's zeros (the 2-head
tiles of TP4 halve them but cost TP1 more TensorE than they save); the 16 diagonal-block
and 16 G placement DMAs per group (32-partition, 64-128-byte runs) sit on chunk 0's path
at TP4; (4) VectorE's five
[128, 128] float32 ops per head, PSUM-sourced or two-input, so no bf16 perf mode and no
other engine that can take them.

Limits: K, V <= 128; chunk a multiple of 16 up to 128.
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels.gated_delta._common import consecutive_groups

_BLOCK = 32           # rows per exactly-inverted diagonal block
_PACK = 4             # most heads whose blocks share one 128-partition packed solve
_FEW_TILE_HEADS = 2   # < 8 head groups: heads per PE tile of the doubling's products (_tile_mm)
_MAX_CHUNKS = 4       # most chunks per loop iteration (SBUF: TP2 with 4 does not fit)
_CHUNK_STEP = 6       # steps between the starts of a loop body's chunks (_body_plan)
_FIRST_LEAD = 2       # extra steps chunk 0 runs alone in a body of _MAX_CHUNKS chunks (_body_plan)
_SQUARED = 8          # the doubling squares up to N^8, then chains products with it (modeled:
                      # squaring to N^16 or chaining from N^4, TP1 -4 % / -2 %)
_L2NORM_EPS = 1e-6
_PREFETCH_BYTES = 25 * 1024   # inputs (per partition) up to which k gets a second tile:
                               # bf16 TP1 16.25 KiB, with the fused L2 norm 24.25 (float32
                               # TP1, 32.25, would not fit SBUF beside it with a bf16 pool)


@nki.jit
def gdn_chunk_prefill(q2, k2, v2, gate1, gate2, head_params, pool, chunk_rows, seq_tab,
                      pad_rows, counts, H, raw_gates, use_qk_l2norm, scale, chunk, bf16):
    """Chunked gated delta rule over a ragged batch (layouts in the module docstring)."""
    T1 = q2.shape[0]
    V = pool.shape[1]
    K = q2.shape[1] // H
    HV = v2.shape[1] // V
    rep = HV // H
    C = chunk
    odt = q2.dtype
    o = nl.ndarray((T1, HV * V), dtype=odt, buffer=nl.shared_hbm)
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
    nsub = chunks_per_iteration(HV)
    # the packed solve's tiles, one set per chunk of the loop body and head group
    solve = []
    for j in range(nsub):
        sj = []
        for hvs in _head_groups(HV):
            sj.append(_solve_tiles(len(hvs), C, mdt, _few_groups(HV)))
        solve.append(sj)
    for t in solve[0]:
        _zero_solve(t)
    if raw_gates:
        hp = nl.ndarray((128, 2 * HV), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=hp, src=head_params)
        negA = nl.ndarray((128, HV), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=negA, op=nl.exp, data=hp[:, 0:HV])
        nisa.tensor_scalar(dst=negA, data=negA, op0=nl.multiply, operand0=-1.0)
        cst["negA"] = negA
        cst["dtb"] = hp[:, HV:2 * HV]

    cnt = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cnt, src=counts)
    n_live = nisa.register_alloc()
    nisa.register_load(dst=n_live, src=cnt[0:1, 0:1])
    n_pad = nisa.register_alloc()
    nisa.register_load(dst=n_pad, src=cnt[0:1, 1:2])

    # rows of padding sequences: zeros, C rows per table entry (unused entries -> trash row)
    zt = nl.ndarray((C, HV * V), dtype=odt, buffer=nl.sbuf)
    nisa.memset(dst=zt, value=0.0)
    for z in nl.dynamic_range(n_pad):
        zr = _table_rows(pad_rows, z, C, 0)
        nisa.dma_copy(dst=_rows_view(o, zr, C, HV * V), src=zt)

    # chunk inputs, one tile set per chunk of the loop body: gathered ahead (chunk 0 here,
    # chunks 1 .. nsub - 1 by a sequence's refill, the next ones during each body), so the
    # gathers' fixed latencies overlap the previous body's tail and the loop boundary (DMAs
    # in flight continue)
    bufs = []
    for j in range(nsub):
        bufs.append(_chunk_buffers(H, HV, K, V, C, bf16, use_qk_l2norm))
    # the next chunks' k in second tiles only when the inputs are small (SBUF)
    prefetch = _tile_bytes(bufs[0]) <= _PREFETCH_BYTES
    nxt_k = []
    for j in range(nsub):
        t = bufs[j]["k"]
        if prefetch:
            t = nl.ndarray(bufs[j]["k"].shape, dtype=bufs[j]["k"].dtype, buffer=nl.sbuf)
        nxt_k.append(t)
    _gather_chunk(bufs[0], hbm, chunk_rows, None, 0, C)

    # live sequences (compacted): state in, chunks, state out
    # the state, float32 whatever the pool's dtype (a bf16 pool is cast by the DMAs)
    S = nl.ndarray((K, HV * V), dtype=nl.float32, buffer=nl.sbuf)
    io = {}
    io["o"] = o
    io["hbm"] = hbm
    io["chunk_rows"] = chunk_rows
    io["T1"] = T1
    io["prefetch"] = prefetch
    io["nxt_k"] = nxt_k
    for s in nl.dynamic_range(n_live):
        st = nl.ndarray((1, 6), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=seq_tab.ap(pattern=[[6, 1], [1, 6]], offset=0,
                                              scalar_offset=s, indirect_dim=0))
        has_init = nisa.register_alloc()
        nisa.register_load(dst=has_init, src=st[0:1, 0:1])
        c_lo = nisa.register_alloc()
        nisa.register_load(dst=c_lo, src=st[0:1, 1:2])
        c_mid = nisa.register_alloc()
        nisa.register_load(dst=c_mid, src=st[0:1, 2:3])
        c_hi = nisa.register_alloc()
        nisa.register_load(dst=c_hi, src=st[0:1, 3:4])
        slot_row = nisa.register_alloc()
        nisa.register_load(dst=slot_row, src=st[0:1, 4:5])
        refill = nisa.register_alloc()
        nisa.register_load(dst=refill, src=st[0:1, 5:6])
        # the slot is one contiguous [HV*K, V] block of the pool: one DMA with a run-time
        # start moves it (partition k holds rows (hv, k) of every head)
        slot = pool.ap(pattern=[[V, K], [K * V, HV], [1, V]], offset=0, scalar_offset=slot_row,
                       indirect_dim=0)
        nisa.memset(dst=S, value=0.0)
        for _ in nl.dynamic_range(has_init):     # 0 or 1 trips: gather the initial state
            nisa.dma_copy(dst=S, src=slot)
        if nsub > 1:
            # tile sets 1 .. nsub - 1 hold this sequence's chunks 1 .. nsub - 1 unless the
            # last body before was a one-chunk body (it refills set 0 only) or none ran (the
            # launch zeroed and gathered set 0 only: short prompts pay for one set): 0 or 1
            # trips
            for _ in nl.dynamic_range(refill):
                for j in range(1, nsub):
                    _gather_chunk(bufs[j], hbm, chunk_rows, c_lo, j, C)
                for j in range(1, nsub):
                    for t in solve[j]:
                        _zero_solve(t)
            # nsub chunks per iteration (c_mid - c_lo a multiple of nsub), then the rest one
            # per iteration: the loop drains every engine at each iteration boundary
            for c in nl.dynamic_range(c_lo, c_mid, nsub):
                _chunks(bufs, nsub, io, cst, solve, S, c, H, HV, K, V, rep, raw_gates,
                        use_qk_l2norm, scale, C)
            for c in nl.dynamic_range(c_mid, c_hi):
                _chunks(bufs, 1, io, cst, solve, S, c, H, HV, K, V, rep, raw_gates,
                        use_qk_l2norm, scale, C)
        else:
            for c in nl.dynamic_range(c_lo, c_hi):
                _chunks(bufs, 1, io, cst, solve, S, c, H, HV, K, V, rep, raw_gates,
                        use_qk_l2norm, scale, C)
        nisa.dma_copy(dst=slot, src=S)
    return o


def chunks_per_iteration(HV):
    """Chunks per iteration of the chunk loop (the launcher's tables follow it): about 8 head
    groups in flight, so 1 at Qwen3-Next TP1 (8 groups; SBUF holds one chunk's tiles), 2 at
    TP2, 4 at TP4 and below. The loop drains every engine at each iteration boundary
    (nki-dynamic-loops.rst, "Iterations Do Not Overlap"): with several chunks per
    iteration the drain is paid once per iteration and chunk c + 1's state-independent work
    overlaps chunk c's state chain (modeled trn2, TP4 16K: 4.78 M tokens/s at 1 chunk and
    2 heads per group, 6.4 M at 4 chunks and 4 heads per group; TP2 4K 3.37 -> 3.53 M at 2;
    TP8 4K 6.14 -> 8.06 M at 4)."""
    n = 8 // len(_head_groups(HV))
    return max(1, min(n, _MAX_CHUNKS))


def _tile_bytes(buf):
    """Bytes per partition of the chunk input tiles ``buf``."""
    n = 0
    for name in _INPUTS:
        t = buf[name]
        size = 2
        if t.dtype == nl.float32:
            size = 4
        n = n + t.shape[1] * size
    return n


def _head_groups(HV):
    """The value heads of each software-pipeline group (and packed solve): _PACK per group,
    128 partitions (2 per group at TP4 and a single-chunk body: TP4 4.19 -> 4.46 M
    tokens/s; with 4 chunks per iteration 4 per group is faster, the packed solve's ops
    then cost half as much per head)."""
    return consecutive_groups(HV, _PACK)


def _few_groups(HV):
    """Whether a chunk has fewer than 8 head groups (TP2, TP4, TP8 of Qwen3-Next): its state
    chains then bind (the iteration's chunks follow one another's state), and the job order
    (_group_jobs) and the substitution (right-hand sides unpacked, _place_g) shorten them;
    with 8 or more (TP1) ScalarE and VectorE bind, and both would cost more than they save
    (modeled TP1 2K: 1.96 -> 1.90 M tokens/s)."""
    return len(_head_groups(HV)) < 8


def _table_rows(table, r, C, plus):
    """Row ``r + plus`` (``r`` a register, None: 0; ``plus`` a static int) of an int32
    ``[entries, C]`` table as a ``[C, 1]`` SBUF column."""
    t = nl.ndarray((C, 1), dtype=nl.int32, buffer=nl.sbuf)
    if r == None:  # noqa: E711  (NKI has no `is`)
        nisa.dma_copy(dst=t, src=table.ap(pattern=[[1, C], [1, 1]], offset=plus * C))
    else:
        nisa.dma_copy(dst=t, src=table.ap(pattern=[[1, C], [1, 1]], offset=plus * C,
                                          scalar_offset=r, indirect_dim=0))
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


def _gather_chunk(buf, hbm, table, r, plus, C):
    """Gather the token rows listed in row ``r + plus`` of ``table`` into the chunk tiles."""
    rows = _table_rows(table, r, C, plus)
    for name in _INPUTS:
        nisa.dma_copy(dst=buf[name], src=_rows_view(hbm[name], rows, C, buf[name].shape[1]))


def _rows_view(x, rows, C, width):
    """Rows ``rows[p]`` of HBM ``x [n, width]``, one per partition (indirect gather/scatter)."""
    return x.ap(pattern=[[width, C], [1, width]], offset=0, vector_offset=rows, indirect_dim=0)


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
    # the packed solve's compact identity cI [(h, m), c] = [m == c] (operand dtype) and
    # head-quadrant mask bd [(h, m), h', c] = [h == h'] (float32)
    cst["cI"] = nl.ndarray((128, _BLOCK), dtype=mdt, buffer=nl.sbuf)
    cst["identm"] = nl.ndarray((128, 128), dtype=mdt, buffer=nl.sbuf)   # (transpose mode)
    nisa.tensor_copy(dst=cst["identm"], src=cst["ident"])
    cst["bd"] = nl.ndarray((128, 128 // _BLOCK, _BLOCK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=cst["bd"], value=0.0)
    for h in range(128 // _BLOCK):
        q0 = h * _BLOCK
        nisa.tensor_copy(dst=cst["cI"][q0:q0 + _BLOCK, :], src=cst["ident"][0:_BLOCK, 0:_BLOCK])
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


def _solve_place(ATs, L, tiles, diag, off, row0_scalar=False):
    """The layout moves of a pack's solve: from the transposes ATs[i] ([j, i] layout) of the
    strictly-lower A_i [L, L] of up to _PACK heads, the diagonal _BLOCK-row blocks A_bb^T into
    slot b of tiles["PT"] and the off-diagonal blocks A_kb^T (k < b) into slot pair(k, b) of
    tiles["OT"], head i at partitions 32 i of each (block-diagonal over the heads: one
    matmul then serves the pack): ``diag`` / ``off`` say which. The diagonal blocks by
    SBUF-to-SBUF DMAs, partition moves no compute engine spends time on (modeled: ScalarE
    copies instead, TP4 3.58 -> 3.0 M tokens/s); the off-diagonal ones as one GpSimd copy
    per head and block row (by DMA they put the queues on the critical path; a short last
    block falls back to DMAs, one per block). The tiles are zeroed once per launch
    (_zero_solve) and these moves write the same elements every chunk, so the zeros that
    keep the packed products block-diagonal persist (modeled: zeroing them per chunk put
    GpSimd on the critical path)."""
    nbs = _block_rows(L)
    nblk = len(nbs)
    for j in range(len(ATs)):
        q0 = j * _BLOCK
        for b in range(nblk):
            r0 = b * _BLOCK
            nb = nbs[b]
            if diag:
                c0 = (j % tiles["th"]) * _BLOCK
                nisa.dma_copy(dst=tiles["PT"][q0:q0 + nb, b, c0:c0 + nb],
                              src=ATs[j][r0:r0 + nb, r0:r0 + nb])
            if off and b + 1 < nblk and nbs[nblk - 1] == _BLOCK:
                # the row strip of blocks (b, c > b): one GpSimd copy (``row0_scalar``: row 0's,
                # the longest, on ScalarE)
                p0 = _pair(b, b + 1, nblk)
                n = nblk - 1 - b
                eng = nisa.engine.gpsimd
                if row0_scalar and b == 0:
                    eng = nisa.engine.scalar
                nisa.tensor_copy(dst=tiles["OT"][q0:q0 + nb, p0:p0 + n, q0:q0 + _BLOCK],
                                 src=ATs[j][r0:r0 + nb, r0 + _BLOCK:L].reshape((nb, n, _BLOCK)),
                                 engine=eng)
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
    by _solve_place): P = A_bb by transpose-mode matmuls of P^T's PE tiles (_tile_mm; one
    PSUM bank in the operand dtype, one eviction);
    with N = -P the diagonal blocks' inverse (I - N)^{-1} = (I + N)(I + N^2)(I + N^4)...
    starts as inv^T = I - P^T (the even powers need no sign). The substitution over the
    blocks uses the off-diagonal blocks in tiles["OT"].

    ``mdt`` is the doubling's TensorE operand dtype: bfloat16 for bf16 callers (the powers
    and the partial inverses are rounded; the inverse's unit diagonal stays exact and the
    off-diagonal part carries the rounding, relative to its own size), float32 otherwise.
    The substitution and the final application stay float32."""
    W = npk * _BLOCK
    nbs = _block_rows(L)
    nblk = len(nbs)
    PT = tiles["PT"]
    WT = tiles["th"] * _BLOCK
    pk = {}
    pk["npk"] = npk
    pk["th"] = tiles["th"]
    pk["ident"] = cst["identm"]
    # P = the transposes of P^T's tiles (transpose mode: bit-exact, PSUM in mdt), one eviction
    pst = nl.ndarray((W, nblk * WT), dtype=mdt, buffer=nl.psum)
    _tile_mm(pst, PT, None, nblk, pk, True)
    P = nl.ndarray((W, nblk, WT), dtype=mdt, buffer=nl.sbuf)
    nisa.tensor_copy(dst=P.reshape((W, nblk * WT)), src=pst, engine=nisa.engine.vector)
    # inv = sum_{m < covered} N^m, kept compact: inv^T's diagonal sub-blocks
    # cinv [(h, i), b, c] = inv_hb^T[i, c] (the doubling's updates are products with it as
    # the moving operand, and a product with a compact moving operand is compact). Starts
    # as I - P^T: the compact P^T is P_b^T cI, cI [(h, m), c] = [m == c] (the compact
    # identity).
    cI = cst["cI"][0:W, :]
    ps = nl.ndarray((W, nblk * _BLOCK), dtype=nl.float32, buffer=nl.psum)
    _tile_mm(ps, P, cI.reshape((W, 1, _BLOCK)).broadcast(1, nblk), nblk, pk)
    cinv = nl.ndarray((W, nblk, _BLOCK), dtype=mdt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cinv, data1=cI.reshape((W, 1, _BLOCK)).broadcast(1, nblk),
                       data2=ps.reshape((W, nblk, _BLOCK)), op=nl.subtract)
    pk["W"] = W
    pk["nbs"] = nbs
    pk["P"] = P
    pk["PT"] = PT
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


def _solve_tiles(npk, L, mdt, few):
    """The packed tiles of one head group's solve (see _solve_setup): P^T ``[W, blocks, WT]``
    (``mdt``; WT the columns of a PE tile's heads, _tile_heads), the off-diagonal blocks
    ``[W, pairs, W]`` float32 (None for one block) and, ``few`` (the right-hand sides read
    where they are, _place_g), the moved inverses G ``[L, npk, W]`` float32; zeroed by
    _zero_solve before their first use."""
    W = npk * _BLOCK
    nblk = len(_block_rows(L))
    t = {}
    t["th"] = _tile_heads(npk, few)
    t["PT"] = nl.ndarray((W, nblk, t["th"] * _BLOCK), dtype=mdt, buffer=nl.sbuf)
    npair = nblk * (nblk - 1) // 2
    t["OT"] = None
    if npair > 0:
        t["OT"] = nl.ndarray((W, npair, W), dtype=nl.float32, buffer=nl.sbuf)
    t["G"] = None
    if few:
        t["G"] = nl.ndarray((L, npk, W), dtype=nl.float32, buffer=nl.sbuf)
    return t


def _tile_heads(npk, few):
    """Heads of a pack whose blocks share one PE tile in the doubling's products (_tile_mm):
    _FEW_TILE_HEADS with few head groups, else all of them (the whole array)."""
    if few:
        return min(npk, _FEW_TILE_HEADS)
    return npk


def _tile_mm(ps, st, mv, na, pk, transpose=False):
    """ps[:, b] = st[:, b]^T @ mv[:, b] for the blocks b < na of a pack, one matmul per PE tile
    of pk["th"] heads (tiling mode: rows and columns 32 th t.. of the array for tile t, so a
    tile's products land on its own partitions). ``st`` ``[W, blocks, WT]`` holds each tile's
    blocks block-diagonally over its heads (WT = 32 th columns, head h at columns 32 (h %
    th)), so no head reads another's; ``mv`` ``[W, blocks, n]`` in that layout or compact
    (``[W, blocks, 32]``) gives ps ``[W, blocks * n]`` in the same layout. ``transpose``:
    ps[:, b] = st[:, b]^T per tile (TensorE transpose mode, moving a tile identity from
    pk["ident"]; ps in ``st``'s dtype)."""
    npk = pk["npk"]
    th = pk["th"]
    WT = th * _BLOCK
    n = WT
    if not transpose:
        n = mv.shape[2]
    for b in range(na):
        for h0 in range(0, npk, th):
            r0 = h0 * _BLOCK
            r = min(npk - h0, th) * _BLOCK
            tpos = ()
            tsize = ()
            if WT < 128:
                tpos = (r0, r0)
                tsize = (WT, WT)
            cols = n
            if transpose:
                moving = pk["ident"][r0:r0 + r, r0:r0 + r]
                cols = r
            else:
                moving = mv[r0:r0 + r, b, :]
            nisa.nc_matmul(dst=ps[r0:r0 + r, b * n:b * n + cols], stationary=st[r0:r0 + r, b, 0:r],
                           moving=moving, is_transpose=transpose, tile_position=tpos,
                           tile_size=tsize, accumulate=False)


def _tile_product(pk, st, mv, na, mdt):
    """SBUF ``[W, na, n]`` (``mdt``) = the tile products st^T mv of blocks < na (_tile_mm),
    one PSUM bank, evicted by ScalarE."""
    W = pk["W"]
    n = mv.shape[2]
    ps = nl.ndarray((W, na * n), dtype=nl.float32, buffer=nl.psum)
    _tile_mm(ps, st, mv, na, pk)
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
    na = _count_over(pk["nbs"], covered)           # blocks in this round
    nc = _count_over(pk["nbs"], covered * 2)       # ... that need another round
    if na == 0:
        return
    if covered > _SQUARED:
        # past the explicit powers: (N^c)^T inv^T = ((N^s)^T)^(c/s) inv^T, c/s compact
        # products with the last explicit power N^s instead of squaring it (no expanded
        # eviction); all but the last here, the last in _solve_update
        X = pk["cinv"]
        for r in range(covered // _SQUARED - 1):
            X = _tile_product(pk, pk["P"], X, na, mdt)
        pk["chain"] = X
        return
    P2 = _tile_product(pk, pk["PT"], pk["P"], na, mdt)                   # P @ P
    # the transposed square only if the next round squares again
    if nc > 0 and covered * 2 <= _SQUARED:
        pk["PT"] = _tile_product(pk, pk["P"], pk["PT"], nc, mdt)         # (P @ P)^T
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
    _tile_mm(ps, pk["P"], mv, na, pk)                                    # (inv @ P)^T
    psv = ps.reshape((W, na, _BLOCK))
    if nc > 0:
        nisa.tensor_tensor(dst=cinv[:, 0:nc, :], data1=cinv[:, 0:nc, :], data2=psv[:, 0:nc, :],
                           op=nl.add)
    if nc < na:
        nisa.tensor_tensor(dst=pk["cfin"][:, nc:na, :], data1=cinv[:, nc:na, :],
                           data2=psv[:, nc:na, :], op=nl.add)
    if nc == 0:
        b0 = 0
        if pk["G"] != None and nblk > 1:  # noqa: E711
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
    (_solve_apply_block: one 32-row matmul per head) and no right-hand side is packed. One
    SBUF-to-SBUF DMA per head and block, off the chain (GpSimd copies instead: GpSimd binds,
    modeled TP4 4K 6.31 against 6.59 M tokens/s); the other elements stay zero
    (_zero_solve)."""
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
    (pk["G"], _place_g; ``Rp`` None): Z_b = -sum_{k<b} A_bk X_k, evicted by ScalarE (VectorE:
    modeled TP4 4K 6.50 against 6.64 M tokens/s); the application adds inv_bb B_b."""
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
        pk["Z"].append(Z)
        return
    nisa.tensor_tensor(dst=Z, data1=Rp[:, b, :], data2=ps, op=nl.subtract)
    pk["Z"].append(Z)


def _solve_apply_block(pk, Xs, b, N, Rs):
    """Block b of the forward substitution, second half: X_b = inv_bb Z_b for the pack's heads
    in one matmul (kept packed for the next blocks), unpacked into the heads' Xs by DMA.
    Right-hand sides unpacked (pk["G"]; ``Rs`` the heads'): X_b = inv_bb B_b + inv_bb Z_b,
    inv_bb B_b as one 32-row matmul per head with the moved inverses G (_place_g) in the same
    PSUM accumulation; the last block, which no later block reads, leaves PSUM straight into
    the heads' rows (cross-quadrant moves of <= 32 partitions, ScalarE and VectorE in turn:
    modeled TP4 4K +0.5 %) instead of through the packed tile and the unpacking DMAs."""
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
                           moving=_tf(Rs[j][r0:r0 + nb, :], pk["tf"]), accumulate=j > 0)
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


def _chunks(bufs, n, io, cst, solve, S, c, H, HV, K, V, rep, raw_gates, use_qk_l2norm, scale,
            C):
    """Chunks c .. c + n - 1 of one sequence from the tiles bufs[0 .. n - 1] (gathered
    earlier: rows past the sequence end read the zero row); o rows scattered (those rows
    go to the trash row), S updated; afterwards bufs[j] holds chunk c + n + j for j < n.

    A software pipeline over groups of value heads (_head_groups) and the n chunks
    (_body_plan): a group's work is a list of jobs, one per dependent step (_group_jobs),
    so every in-order engine queue holds work of several groups between one group's
    dependent steps."""
    L = C
    nsub = len(bufs)
    o = io["o"]
    groups = _head_groups(HV)
    G = len(groups)
    jobs, jarg = _group_jobs(HV, L)
    order, off, nslot = _body_plan(jobs, G, n)
    chs = []
    pres = []
    gdat = []
    items = []
    for k in range(n):
        chs.append(None)
        pres.append({})
        gdat.append({})
        items.append({})
    # the next chunks' rows; with prefetch their inputs land in the tiles during the body:
    # q, v, g, beta once the last reader of each is issued, k (read until the end, by the
    # decayed keys) into a second tile, moved over at the end (modeled TP1 2K: 1.81 -> 1.88
    # M tokens/s against all five through a second set)
    src = []
    for j in range(nsub):
        src.append(None)
    if io["prefetch"]:
        for j in range(n):
            rows = _table_rows(io["chunk_rows"], c, C, n + j)
            views = {}
            for name in _INPUTS:
                views[name] = _rows_view(io["hbm"][name], rows, C, bufs[j][name].shape[1])
            nisa.dma_copy(dst=io["nxt_k"][j], src=views["k"])
            src[j] = views
    # last reader of each input (the next chunk lands after the last group's job)
    last = {}
    last["qk_t"] = "q"
    last["gu"] = "g"
    last["at"] = "beta"
    last["rhs"] = "v"
    for t in range(nslot):
        for k in range(n):
            for r in range(len(order[k])):
                i = len(order[k]) - 1 - r        # later stages first
                u = t - off[k][i]
                if u < 0 or u >= G:
                    continue
                if chs[k] == None:  # noqa: E711  (NKI has no `is`)
                    rows = _table_rows(io["chunk_rows"], c, C, k)
                    chs[k] = _chunk_prologue(bufs[k], o, cst, rows, io["T1"], H, HV, K, V,
                                             raw_gates, use_qk_l2norm, scale, C)
                s = order[k][i]
                _group_job(jobs[s], jarg[s], u, groups[u], chs[k], bufs[k], pres[k], gdat[k],
                           items[k], o, cst, solve[k], S, HV, K, V, rep, L, C)
        # the next chunks' inputs after the last group's last reader
        for k in range(n):
            if src[k] != None:  # noqa: E711
                for i in range(len(order[k])):
                    name = last.get(jobs[order[k][i]])
                    if name != None and t == off[k][i] + G - 1:  # noqa: E711
                        nisa.dma_copy(dst=bufs[k][name], src=src[k][name])
    for j in range(n):
        if io["prefetch"]:
            nisa.dma_copy(dst=bufs[j]["k"], src=io["nxt_k"][j])
        else:
            _gather_chunk(bufs[j], io["hbm"], io["chunk_rows"], c, n + j, C)


_STATE_JOBS = ("rhs", "oq", "sub", "apply", "post_ops", "out", "state")


def _body_plan(jobs, G, n):
    """The issue order of a loop body of n chunks: ``order[k]`` the job indices of chunk k in
    stage order and ``off[k][i]`` the step at which group 0 runs its stage i (group u at
    step off + u); ``nslot`` steps in all. Chunk 0 runs its jobs as listed; a later chunk
    runs its state-independent jobs first, from step _CHUNK_STEP * k (+ _FIRST_LEAD in a
    body of _MAX_CHUNKS chunks: chunk 0's doubling, which the iteration's first chain waits
    for, then shares the queues with fewer of the later chunks' jobs; modeled trn2 TP4 4K
    6.84 -> 6.92 M tokens/s, TP8 9.39 -> 9.50 M, lead 1 or 3 6.90 / 6.75 M; with 2 chunks,
    TP2 3.68 -> 3.66 M, so not there), and its jobs from k S on (_STATE_JOBS) once the chunk
    before has updated that group's state (program order is the state's data order)."""
    order = []
    off = []
    nslot = 0
    lead = 0
    if n >= _MAX_CHUNKS:
        lead = _FIRST_LEAD
    for k in range(n):
        ok = []
        if k == 0:
            for s in range(len(jobs)):
                ok.append(s)
        else:
            for s in range(len(jobs)):
                if not _is_state_job(jobs[s]):
                    ok.append(s)
            for s in range(len(jobs)):
                if _is_state_job(jobs[s]):
                    ok.append(s)
        fk = []
        shift = 0
        for i in range(len(ok)):
            step = k * _CHUNK_STEP + i + shift
            if k > 0:
                step = step + lead
            if k > 0 and shift == 0 and _is_state_job(jobs[ok[i]]):
                # the first state job: one step after the chunk before updates the state
                prev = off[k - 1][len(off[k - 1]) - 1]
                shift = max(prev + 1 - step, 0)
                step = step + shift
            fk.append(step)
        order.append(ok)
        off.append(fk)
        nslot = max(nslot, fk[len(fk) - 1] + G)
    return order, off, nslot


def _is_state_job(name):
    """Whether job ``name`` reads the state entering the chunk (directly or through k S)."""
    for x in _STATE_JOBS:
        if x == name:
            return True
    return False


def _group_jobs(HV, L):
    """The jobs of one head group, in order (one per software-pipeline stage), and their
    arguments: q/k transposes, their masked products, gU, the decays, A^T, the packed
    solve's layout moves, the right-hand sides (k S), q S, the solve setup, per doubling
    round its squaring and inverse update, per substitution block its packed right-hand
    side and its application, the product operands, the outputs, the state update. The
    state-dependent k S and R go in early: they do not wait for the solve (modeled: TP1
    1.17 -> 1.22 M tokens/s against after the doubling). The order differs with the head
    groups a chunk has, both measured (modeled trn2):

    - < 8 groups (TP2, TP4, TP8): the off-diagonal blocks are placed by their own job
      (``place_off``, GpSimd copies) after k S and q S, just before the solve setup, so
      GpSimd places them while the doubling runs (modeled 4K: TP4 6.22 -> 6.48 M tokens/s,
      TP2 3.52 -> 3.57 M, TP8 8.03 -> 8.51 M against after the doubling, which paid when
      the placements were DMAs that delayed the diagonal blocks');
    - >= 8 groups (TP1): q S after the second substitution block instead of beside k S,
      out of ScalarE's busiest stretch (TP1 16K 1.95 -> 2.0 M tokens/s; TP2 3.24 -> 3.08 M,
      TP4 4.56 -> 4.36 M)."""
    nround = 0
    covered = 2
    while covered < _BLOCK and covered < L:
        nround = nround + 1
        covered = covered * 2
    nblk = len(_block_rows(L))
    few = _few_groups(HV)               # the first order above, else the second
    jobs = ["qk_t", "qk_mm", "gu", "decay", "at", "place", "rhs", "oq", "place_off", "setup"]
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
    for name in ["post_ops", "out", "state"]:
        jobs.append(name)
        jarg.append(0)
    return jobs, jarg


def _group_job(job, x, u, hvs, ch, buf, pres, gdat, items, o, cst, solve, S, HV, K, V, rep, L,
               C):
    """Job ``job`` (argument ``x``) of head group ``u`` (value heads ``hvs``; see
    _group_jobs) of the chunk in ``buf`` / ``ch``."""
    key = str(u)
    qk = ch["qk"]
    xdt = buf["v"].dtype
    if job == "qk_t":
        pre = []
        for hv in hvs:
            pre.append({})
        pres[key] = pre
        gd = {}
        gd["X"] = []
        gdat[key] = gd
        for hv in hvs:
            h = hv // rep
            if qk.get(str(h)) == None:  # noqa: E711  (NKI has no `is`)
                qk[str(h)] = _qk_transposes(buf["k"], buf["q"], h, L, K, xdt != nl.float32)
                qk[str(h)]["group"] = u
    elif job == "qk_mm":
        for hv in hvs:
            d = qk[str(hv // rep)]
            if d["group"] == u and d.get("kk") == None:  # noqa: E711 (once per q/k head)
                _qk_products(cst, d, L)
    elif job == "gu":
        for i in range(len(hvs)):
            _head_gu(pres[key][i], cst, buf["g"], hvs[i], L)
    elif job == "decay":
        for d in pres[key]:
            _head_decay(cst, d, L)
    elif job == "at":
        for i in range(len(hvs)):
            _head_at(qk[str(hvs[i] // rep)], pres[key][i], buf["beta"], hvs[i], L)
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
            _head_rhs(pres[key][i], qk[str(hvs[i] // rep)], buf["v"], ch["nec"], S, hvs[i], V)
            Rs.append(pres[key][i]["R"])
        gdat[key]["Rs"] = Rs
        gdat[key]["Rp"] = None
        if solve[u]["G"] == None:  # noqa: E711  (packed unless _place_g moves the inverses)
            gdat[key]["Rp"] = _pack_rhs(Rs, L, V)
    elif job == "oq":
        for i in range(len(hvs)):
            _head_oq(pres[key][i], qk[str(hvs[i] // rep)], ch["qs"], S, hvs[i], V)
    elif job == "sub":
        _solve_rhs_block(items[key], gdat[key]["Rp"], x, V)
    elif job == "apply":
        if x == 0:
            for i in range(len(hvs)):
                gdat[key]["X"].append(nl.ndarray((L, V), dtype=nl.float32, buffer=nl.sbuf))
        _solve_apply_block(items[key], gdat[key]["X"], x, V, gdat[key]["Rs"])
    elif job == "post_ops":
        for i in range(len(hvs)):
            _head_post_ops(qk[str(hvs[i] // rep)], pres[key][i], ch["bs"], ch["dlb"], hvs[i],
                           L, K)
    elif job == "out":
        for i in range(len(hvs)):
            _head_out(pres[key][i], gdat[key]["X"][i], ch["oc"], cst["ident"], hvs[i], V,
                      xdt != nl.float32)
        # each group's o columns leave as soon as they are done
        c0 = hvs[0] * V
        c1 = (hvs[len(hvs) - 1] + 1) * V
        nisa.dma_copy(dst=o.ap(pattern=[[HV * V, C], [1, c1 - c0]], offset=c0,
                               vector_offset=ch["rows"], indirect_dim=0),
                      src=ch["oc"][:, c0:c1])
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


def _head_gu(d, cst, g, hv, L):
    """gU[m, i] = g_m (m <= i) of value head hv (into ``d``): the moving operand of its
    segment sums."""
    d["gU"] = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=d["gU"], op=nl.copy, data=cst["tri_up"][0:L, 0:L],
                    scale=g[:, hv:hv + 1])


def _head_decay(cst, d, L):
    """DT[j, i] = e^{seg(j, i]} ([j, i] layout; 1 where j >= i) from direct segment sums
    seg(j, i] = sum_{j < m <= i} g_m (an fp32 matmul with a 0/1 operator), never
    c_i - c_j of two running sums (that cancels)."""
    d["DT"] = _exp_of_mm(cst["tri_lo"][0:L, 0:L], d["gU"], L, L)


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
    MT = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=MT, data=qk["kq"], op0=nl.multiply, operand0=bs[:, hv:hv + 1],
                              op1=nl.multiply, operand1=d["DT"])
    kd = nl.ndarray((L, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=kd, op=nl.copy, data=qk["kh"], scale=dlb[:, hv:hv + 1])
    d["MT"] = MT
    d["kd"] = kd


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


def _head_state(S, kd, Y, el, hv, K, V, fast):
    """S <- e^{c_last} S + kd^T Y for value head hv."""
    Sh = S[:, hv * V:(hv + 1) * V]
    su = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=su, stationary=_tf(kd, fast), moving=_tf(Y, fast), accumulate=False)
    nisa.scalar_tensor_tensor(dst=Sh, data=Sh, op0=nl.multiply, operand0=el[:, hv:hv + 1],
                              op1=nl.add, operand1=su)
    su = None
