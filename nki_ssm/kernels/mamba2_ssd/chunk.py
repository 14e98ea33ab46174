"""Mamba-2 SSD chunked prefill over a ragged batch with an in-place state pool.

Kernel: ``ssd_chunk_prefill`` (``@nki.jit``). The host launcher
(``nki_ssm/ops/launch/mamba2_ssd.py``, ``prefill_tables``) pads the batch to
its buckets and builds the run-time tables described here; this note is the
design.

Design note
===========

One compiled program per shape bucket
-------------------------------------
Compile-time arguments are shapes (the token bucket T, the sequence bucket
S, H, P, N, G, chunk_size Q) and layer configuration (dt_softplus, dt
limits, precision) only. The batch composition is run-time int32 data, the
same tables for every program of the launch:

- the work list, every group of K consecutive chunks (K = 2, 4 or 8, the
  launcher's ``prefill_per`` from the buckets: the largest with T >= K*Q*S;
  the kernel reads it off the table's width) of every live sequence in batch
  order (padding sequences are left out by the launcher), then all-masked
  rows: ``pair_rows [ceil(T / KQ) + S, Q, 2K]`` holds per group, for each of
  its KQ token positions, the token row (partition q: chunk c in column 2c)
  and a 0/1 valid flag (column 2c + 1); ``pair_vals [.., K + 2]`` the first
  token row of each chunk, the group's S^T block and the block its state
  starts from. Chunk k of a sequence covers its tokens ``k*Q ..``; a
  sequence whose chunk count is not a multiple of K ends in all-masked
  chunks. Masked positions name row T (the inputs' zero rows, y's dump row);
- ``init_table [S, 128, 2]``: the live sequences with an initial state, in
  order: the pool row ``slot*parts*pr + q`` of partition q (column 0, q <
  pr; part 0's rows, see LNC) and (partition 0 of column 1) the sequence's
  S^T block;
- ``final_table [S, 128, 2]``: every live sequence: its pool rows and the
  block holding its final state (the zero block for an empty sequence
  without an initial state);
- ``zero_table [ceil(T / Q), Q, 1]``: the token rows of padding sequences, Q
  per row (unused entries name the dump row);
- ``counts [1, 4]``: sequences with an initial state, pairs, live
  sequences, zero_table rows in use (every program reads this one row).

S^T blocks: an fp32 HBM scratch ``[S + 1, N, Hp*P]`` the kernel allocates
(``nl.private_hbm``, one per core: each program has its own): block k holds
live sequence k's state in the S^T layout (initial, then after each pair,
then final), block S zeros.

LNC: two programs split the heads
---------------------------------
Launched as ``kernel[2]`` (trn2 / trn3 at LNC=2) the kernel runs as two
programs, one per physical core, that never synchronise. The heads are
independent, so the programs split them (``scaffold.program_share``):
program ``pid`` (a Python int at trace time) takes the Hp = H/2 heads from
``h_base = pid*Hp`` (the launcher first makes an odd H 2H heads of P/2
channels: the recurrence is independent along P). Both programs run the
whole work list (the tables, counts included, are shared and read-only) on
their own heads, so they take one control flow: the same trip counts, read
from the one counts row. Heads that do not split (an odd H of odd P, e.g.
one head) run on both: program 1 runs program 0's heads into private dumps
of y and the pool (``scaffold.destination``; it reads its states from the
uninitialised dump and computes on garbage nothing reads). Otherwise each
program works on its own heads: static column slices of x, z, dt, A, D,
dt_bias and of y (disjoint columns: each y byte, the dump row and the
padding rows included, is written by one program), the B / C columns of
the groups their heads read (at a group shared by the programs both read
it), and their own pool rows: the launcher views the pool ``[slots, H, P,
N]`` as ``[slots*parts*pr, nt*N]`` (``pr*nt = Hp*P``), part p of a slot
``pr`` rows after part 0, a static offset added to the gathers' and
scatters' element offset. A program reads no HBM byte the other writes.
The programs have the same instructions (same Hp, block structure and
trip counts), so equal program sizes; the results equal LNC=1's bit for
bit (every output element is computed by the same operations: matmuls
contract over tokens or dstate, never over heads or channels). Modeled
figures: "Engine budget" below.

Loops
-----
Four runtime loops on the scaffold (``scaffold.work_loop`` /
``for_each_row``: ``nl.fori_loop`` with an inner-``def`` body), one after
the other, none inside another (nested runtime loops: unverified on NKI
0.7 / 0.8). The bounds are device scalars of the counts row
(``scaffold.trip_counts``). Table rows are addressed by the loop's
iteration value as ``scalar_offset``; a chunk's token rows by its first
token row (a cell of ``pair_vals`` loaded as a device scalar, the
``scalar_offset`` of one contiguous DMA per input: hardware DGE on trn2),
a sequence's S^T block likewise (a cell of its table row); y rows and pool
rows by ``vector_offset`` (one row per partition). What is unrolled inside
a body is bounded by the layer shape (head blocks, dstate tiles, groups).
Each body allocates the PSUM banks it writes and loads what it reads: no
SBUF value is prefetched across iterations (nki-library turns that off for
dynamic loops, NKI-1582); what crosses them goes through HBM (the S^T
blocks).

A. Initial states (trip count: sequences with an initial state): gather
   the slot's state from the pool, transpose it on TensorE into S^T (SBUF,
   fp32) and store S^T to the sequence's block. Block S is zeroed before
   the loop. An uninitialised slot is never read.
B. Groups (trip count: all K-chunk groups of all sequences): K chunks per
   iteration, chunk c in context c mod 2 (``_pair``). An iteration loads
   chunk 0, its state source block (within a sequence the block the
   previous group stored: an exact fp32 round trip; at a sequence start its
   initial state or zeros) into S^T in SBUF, block by block, then chunks 1
   .. K-1 (chunk c >= 2 once chunk c - 2, its context's previous chunk, is
   done and its y stored); after its last chunk has updated a head block of
   S^T (stage 9), that block is stored to the group's S^T block. So a
   sequence boundary is data (the source block), not a branch, and every
   group runs the same instructions. The chunks of an iteration share one
   pipeline (more than 5 blocks; chunk c starts nb steps after chunk c - 1,
   and at least one step after chunk c - 2 is done) or drain between them;
   the pipeline drains at the iteration end. An all-masked chunk adds
   exactly 0 (decay exp(0) = 1, zero input; exact mode: the state is
   unchanged bit for bit, bf16 mode with the TensorE state path: rounded
   to tfloat32 once more); its y rows go to the dump row.
C. Final states (trip count: live sequences): load the sequence's final
   block into S^T, transpose it back and scatter it to the slot (the
   kernel's own writes to its HBM input are the pool update).
D. Padding tokens (trip count: zero_table rows in use): zero rows of y.

The S^T round trip costs DMA only (2 x H*P*N*4 bytes per pair: 5.2 MB at
Mamba-2 2.7B, ~20 us of the core's DMA bandwidth against ~200 us of compute
per pair); a group's loads wait for the previous group's last stores (the
iteration boundary, ~10-20 us at Mamba-2 2.7B, paid once per K chunks).

Masking
-------
A chunk loads the Q token rows from its first token on. Rows past the
sequence end hold the next sequence's tokens or zeros: the launcher zeroes
the tokens of padding sequences (a masked fill on the copy it makes to pad
the batch to its bucket; a padding token may hold NaN) and appends Q zero
rows, so every loaded value is finite (NaN * 0 cannot arise). Masked rows
get dt' = 0 (dt' times the 0/1 valid flag): decay exp(0) = 1 and input
x dt' = 0 exactly, so a masked row adds exactly 0 to the state and to the
valid outputs (CB is causally masked, and masked rows are the last of a
chunk). A
ragged batch therefore equals separate calls bit for bit. Every y row is
written exactly once: a live token's row by its chunk's scatter (masked
partitions write the dump row, sliced off by the host), a padding token's
row by loop D; bucket padding rows are sliced off.

Layout
------
Tokens of one chunk (Q <= 128) sit on partitions; heads are concatenated on
the free dim (x as ``[Q, H*P]``, dt as ``[Q, H]``). The running state lives
in SBUF in float32 as ``S^T [N, H*P]`` (dstate on partitions, one tile per
128 of N, N <= 256), so both state matmuls contract over partitions without
per-chunk transposes; it is transposed on TensorE only in loops A and C, in
pieces of <= 4 KiB per partition (partition q holds state rows
``q*nt ..``, one pool row segment per partition; a bf16 pool is transposed
by an exact identity matmul into the fp32 PSUM scratch).

Per chunk (prologue: loads, then compute)
-----------------------------------------
Loads (in the inputs' dtypes: a DMA never converts): the chunk's rows, dt
(fp32), B, C (the compute's inputs first), x and z. Compute: B and C widened to fp32
(GpSimd copies, bf16 inputs), dt' = clip(softplus(dt + dt_bias)) * valid,
dtA = dt' A ([Q, H]). TensorE (fp32, 0/1 stationaries flagged
onezero): cs = U^T dtA (inclusive cumsum), ex = Ls^T dtA (sum over the
chunk's later tokens), tot = 1^T dtA (chunk total, broadcast on the N
partitions); ScalarE exp of each; the x factors [dt' | dt' exp(ex) | D]
([Q, 3H]). The segment sums' moving operands for all heads, one
instruction each (``_seg_operands``; sub-blocks of sb = 32 tokens, 16 when
Q is not a multiple of 32): WB [Q, (2, H, sb)], part 0 dtA repeated over
sb columns (ScalarE), part 1 dtA * Uloc, Uloc[k, i'] = (k mod sb <= i')
(VectorE for chunk 0, whose prologue opens the iteration on empty engines;
GpSimd for chunk 1, beside chunk 0's items), when the contexts' WB fit SBUF
(``wbc``); else stage 0 builds the block's own WB [Q, (2, hb, sb)] (ScalarE
copy, GpSimd product: [Q, 128] each at Q = 128): so at Mamba-2 2.7B in bf16
mode, where D_h I takes the room, and at Falcon-H1-like shapes. Per group: C^T and B^T (TensorE transposes, fp32), CB^T [Q, Q]
(fp32, contract N, accumulate N tiles), causal mask (VectorE product with
the 0/1 matrix U, from PSUM). Chunk 0's
prologue opens the iteration; chunk 1 loads in its first step and computes
nb/2 steps later (DMA queues and engines are in order: an engine reaching
the compute earlier would wait for the loads).

Per (chunk, head block) item: ten stages, one engine each (mostly)
-----------------------------------------------------------------
Blocks hold ``hb`` heads of one group (hb*Q <= 512, 2*hb*P <= 512 and
n_tiles*hb*P <= 512: one PSUM bank per tile; hb = 4 at Q = 128, P = 64).
No 128 x 128 work runs on GpSimd. "tf32" below: in bf16 mode the fp32
tile is read as tfloat32 (the BF16 rate); in exact mode as float32.
 0 without per-chunk WB: the block's WB (ScalarE copy, GpSimd product)
 1 TensorE  seg[j, (b, h, i')] = sum_{j<k<=b*sb+i'} dtA[k, h]: per
            sub-block b, Lpre[b]^T WB part 0 (the tokens of earlier
            sub-blocks, Lpre[b] = Ls on rows k < b*sb) + Lin[b]^T WB part 1
            (sub-block b itself, Lin[b] = Ls on its rows), accumulated in
            one PSUM bank: 2*Q/sb - 1 matmuls of N = hb*sb (tf32, 0/1
            stationaries); exactly 0 for j >= i
 2 ScalarE  Dm = exp(seg), one instruction for the block (in [0, 1])
 3 VectorE  one instruction each for the block: Mt[j, (h, i)] = Dm *
            CBmask (CBmask repeated over the heads by a zero stride, Mt
            written head-major); [xf | Xd | xD] = x * [dt' | dt' exp(ex) |
            D] (x read two or three times by a zero stride; no xD with
            ``dib``)
 4 TensorE  y_intra = Mt^T xf per head (tf32); + D x: with ``dib`` (bf16
            mode, bf16 x, D per head) a bf16 matmul of D_h I (built once,
            [Q, H*Q] bf16) against x, else I^T (x D) (tf32); y_off = C S^T
            for the block (tf32, one matmul per N tile), both in one PSUM bank
 5 y_off * exp(cs_i): VectorE, one instruction for the block (exp(cs)
            repeated over P by a zero stride), on every other full block
            and on partial ones; ScalarE per head on the others. ScalarE:
            silu(z). GpSimd: e^tot S^T (blocks on the TensorE state path)
 6 VectorE  y = y_off + y_intra (PSUM operand); long pipelines (``pe_add``):
            TensorE identity matmul (tf32) accumulating y_off * exp(cs) into
            y_intra's PSUM bank (y ring of 4 banks)
 7 (+ x*D for D [H, P]) * silu(z) on VectorE -> the chunk's y tile (written
            over z's columns: z's SBUF tile doubles as y's); without z and
            with ``pe_add`` the PSUM sum is copied to the y tile on ScalarE
 8 TensorE  chunk state B^T Xd per N tile (tf32); TensorE state path: +
            I^T (e^tot S^T) into the same PSUM bank (tf32)
 9 VectorE  S^T <- exp(tot) S^T + chunk state, per head (fp32); TensorE
            state path (every block with ``pe_add`` and one dstate tile):
            ScalarE copies the PSUM sum back. Chunk 1 of a pair: the block's
            S^T store
A chunk's y tile is scattered to its token rows once its items are done
(chunk 1's in quarters, halves below 8 blocks, so little is left in flight
at the iteration end). Item (1, j) reads the state item (0, j) writes
(stages 4 and 5 read, 9 writes): more than 5 blocks keep them apart in a
shared pipeline.

SBUF / PSUM budget
------------------
SBUF tiles allocated in a runtime loop body are live for the whole loop, so
they are allocated before the loops: the chunk contexts (x and z / y in
their dtype, ``H*P*2`` each for bf16, B, C, dt, decay columns, C^T and CB per
group), the state S^T (``H*P*4`` per N tile), a <= 4 KiB
state-transfer piece, and the item temporaries as round-robin rings (a
buffer written in stage k and last read in stage k' has k' - k + 1
copies). Two contexts when the estimate fits ``_SBUF_BUDGET`` (200 of the
208 KiB usable), else one (its loads then wait for the previous chunk:
Falcon-H1-like, 64 KiB of state; bit-identical results, tested). PSUM (8
banks of 2 KiB per partition, allocated in each loop body that writes
them): seg x2, y_intra|y_off x3 (x4 with ``pe_add``), chunk state x2
(``pe_add``: both in one bank), one prologue / state-transfer scratch bank.

Numerics
--------
dt processing, decay sums, exps, Mt, state and all accumulation in float32.
Decays are always exp of a segment sum computed directly as a masked sum of
per-token dt'A terms (never exp(c_i) * exp(-c_j), never a difference of two
cumsums): the sub-block form adds, for each (j, i), the dt'A of the tokens
j < k <= i only (earlier sub-blocks through Lpre, the own sub-block through
Lin and Uloc), all <= 0, so no overflow and no cancellation for any gate
values (dt' 1e4 with A = -16, strong-then-weak decays in one chunk: tested).
Each decay factor lies in [0, 1]; the input weight dt'_j multiplies x_j (xf,
Xd) rather than entering an exponent, so the intra-chunk term is exp(seg) *
CB * (x dt'): bounded by |CB| |x| dt' and exactly 0 on masked rows.
``exact=True`` (precision "fp32"): every matmul operand float32.
``exact=False`` (precision "bf16", the default): the segment sums, y_intra,
y_off, the chunk state and the identity adds read their fp32 tiles as
tfloat32 (10 mantissa bits: dt'A, Mt, x dt', C, the fp32 state, B, Xd
rounded once, 2^-11 relative; 0/1 stationaries exact); with bf16 x and D
per head the D x term is a bf16 matmul of D_h I (D rounded to bf16) against
x (exact). CB and the decay sums cs / ex / tot stay fp32. Measured at
Mamba-2 2.7B (bf16 I/O, 2K tokens): 1.69e-3 output, 2.1e-4 state (float64
reference). The state's HBM round trips are fp32: exact.

Constructs and their evidence
-----------------------------
The scaffold's (``scaffold.py``: device scalars from ``nisa.scalar_load``
as loop bounds and DMA ``scalar_offset``, ``nl.fori_loop`` with an
inner-``def`` body, the LNC split, private dumps), among them
``scalar_load`` of a 1x1 slice of a table row's SBUF tile (the S^T block
of a sequence table row); ``vector_offset`` gathers and
scatters with one row per partition (``bwmm_shard_on_I.py``); kernel HBM
scratch in ``nl.private_hbm``, written and read back by DMA
(``bwmm_shard_on_block.py``; read in a runtime loop at a dynamic offset:
``all_expert_mx_impl.py``). Here the scratch is written and read inside
loop B, a block's load after its store: the order is their dependency
through the scratch tensor, which the compiler must keep with run-time
offsets (the construct with the least precedent in this kernel). Matmuls
on the whole PE array only; no DMA converts a dtype.

Engine budget and what binds
----------------------------
Modeled (trn2, nki_ssm.perf as of this commit; ``python -m simulate --op
ssd_prefill --model mamba2-2.7b --range-samples 12 --no-calibration``;
Mamba-2 2.7B, bf16 I/O, float32 pool, one 2K-token sequence): 861 us
(10-90 %: 825-1039) = 2.38 M tokens/s, VectorE-bound (busy: ScalarE 80 %,
VectorE 77 %, GpSimd 59 %, TensorE 40 %, DMA 26 %); 512 tokens 293 us; 16K
tokens (``python -m simulate --set judged --case
ssd_prefill/mamba2-2.7b/1x16384 --range-samples 12 --no-calibration``)
6.21 ms (10-90 %: 5.95-7.56) = 2.64 M tokens/s, 22 % of the roofline (K = 8
chunks per iteration; K = 2 was 6.68 ms). Per
128-token chunk (the 16K trace over its 128 chunks): ~57 VectorE, ~107
ScalarE, ~25 GpSimd, ~387 TensorE instructions. Per 4-head block: VectorE
Mt and [xf | Xd] (~0.8 us each) and, on every other block, y_off * exp(cs)
(0.5 us); ScalarE Dm = exp(seg) (0.6 us), y_off * exp(cs) per head on the
other blocks (0.9 us), the y eviction and the state copy-back (0.4 us
each), WB part 0 (0.3 us); GpSimd e^tot S^T (1.0 us) and WB part 1 (0.6
us); TensorE ~0.6 us (tfloat32 / bf16 rates). What binds: VectorE and
ScalarE in step at ~1.8-2 us per block, plus ~10-20 us per loop-B iteration
(K chunks) at its boundary (the previous group's last y and state
stores, then chunk 0's prologue chain). Every chunk loads two
activation tables (softplus, exp: 256 loads at 16K). Closer to the roof
needs fewer [Q, hb*P] elementwise passes per block (y_off * exp(cs), the y
eviction, the state copy-back, e^tot S^T) and the softplus work of all K
chunks before their exps (one load of each table per iteration). A short
batch pays the fixed HBM traffic of the S^T blocks (zero block,
initial state stored and loaded, one pair's round trip, final state
loaded: ~5 x 4 MB at H*P = 8192).

LNC=2 (same model, each program's instructions timed on its own core;
the programs never synchronise): 505 us per program at 2K tokens, 0.59 x
LNC=1 (16K: 3.65 ms per program, 0.59 x) (10 blocks per program: the K
chunks share one pipeline; the per-iteration boundary, the constants and the
pipeline fill are paid by both programs).

Program size (static instructions, ``Trace.program_instructions()``):
4,864 at 2K and 16K tokens (K = 8), 2,544 at 512 (K = 4); at LNC=2 2,574 /
1,354 per program (both programs).
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels._common import tf32_view
from nki_ssm.kernels.mamba2_ssd._common import dt_prime, load_f32
from nki_ssm.kernels.scaffold import (at_row, destination, for_each_row, lnc_grid,
                                      program_share, trip_counts, work_loop)

_PSUM_F = 512      # fp32 elements of one PSUM bank per partition
_PMAX = 128
_PE_STATE_CYCLE = 1   # one block in this many updates the state on TensorE (pe_state)
_SBUF_BUDGET = 200 * 1024   # bytes per partition the tile estimate may plan for (of 208 KiB)
_WB_SLACK = 12 * 1024   # bytes per partition kept free when planning the per-chunk WB tiles
_NAT_BYTES = 4 * 1024   # bytes per partition of one piece of a state gather / scatter


@nki.jit
def ssd_chunk_prefill(x, dt, A_rows, B, C, D_heads, D_rows, z, bias_rows, pool, pair_rows,
                      pair_vals, init_table, final_table, zero_table, counts, heads, dstate, dt_softplus, dt_lo, dt_hi, chunk_size, exact):
    """Chunked SSD prefill; returns y ``[num_tokens + Q, H*P]`` and updates ``pool`` in place.

    ``num_tokens`` is the padded token bucket; rows ``num_tokens ..`` of every
    token input are zero (the masked-row source) and row ``num_tokens`` of y a
    dump row.
    HBM arrays (prepared by the launcher):
      x ``[num_tokens + Q, H*P]`` (float32 or bfloat16; y has this dtype),
      dt ``[num_tokens + Q, H]`` float32 (raw dt), A_rows ``[128, H]`` float32
      (A repeated on 128 rows), B, C ``[num_tokens + Q, G*N]`` (x's dtype),
      D_heads ``[128, H]`` float32 or None (D per head on 128 rows; folded
      into TensorE as D_h * I), D_rows ``[128, H*P]`` float32 or None (D per
      head and channel), z ``[num_tokens + Q, H*P]`` or None, bias_rows
      ``[128, H]`` float32 or None, pool ``[slots*pr, nt*N]`` (float32 or
      bfloat16: the state pool ``[slots, H, P, N]`` as parts * pr rows of nt
      state rows per slot, parts = 2 when the launch's programs split the
      heads, else 1, ``pr*nt = H*P / parts``, pr <= 128; updated in place by
      the kernel's scatters),
      pair_rows ``[groups, Q, 2K]``, pair_vals ``[groups, K + 2]``, init_table and
      final_table ``[num_seqs, 128, 2]``, zero_table ``[ceil(num_tokens / Q),
      Q, 1]``, counts ``[1, 4]`` int32: the batch composition (module
      docstring), the same for every program.
    Compile-time: heads (H; under LNC=2 program pid takes heads ``pid*H/2 ..``
      when H is even, all of them otherwise), dstate (N), dt_softplus (bool),
      dt_lo, dt_hi (floats, dt_hi may be inf), chunk_size Q (a multiple of 16
      in 16..128), exact (bool: fp32 matmul operands), and the shapes.
    Limits: N <= 256 (two dstate tiles; the host API checks it), P <= 256,
      H*P*4 bytes per partition of fp32 state per dstate tile within SBUF.
    """
    T1, HP_all = x.shape
    P = HP_all // heads
    N = dstate
    HPG = heads // (B.shape[1] // N)     # heads per group
    # this program's heads [h_base, h_base + H) (static: the program id is a Python int at
    # trace time): half of them each when they split, else all of them on every program,
    # program 1 running program 0's loops into private dumps of y and the pool (real False)
    programs, pid = lnc_grid()
    h_base, H, real = program_share(heads, programs, pid)
    part = h_base // H          # the pool view's part of a slot (launcher: heads // H parts)
    HP = H * P
    # the groups its heads read (local group gl is group g_lo + gl)
    g_lo = h_base // HPG
    G = (h_base + H - 1) // HPG - g_lo + 1
    GN = G * N
    Q = chunk_size
    n_tiles = (N + _PMAX - 1) // _PMAX
    fast = not exact
    y = nl.ndarray((T1, HP_all), dtype=x.dtype, buffer=nl.shared_hbm)
    y_out = destination(y, real)
    pool = destination(pool, real)

    ones, U, Ls = _tri_consts(Q)
    sb, Lpre, Lin, Uloc = _seg_consts(Q, ones, U, Ls)
    A_sb = load_f32(A_rows[:, h_base:h_base + H], _PMAX, H)
    bias_sb = None
    if bias_rows != None:  # noqa: E711
        bias_sb = load_f32(bias_rows[:, h_base:h_base + H], _PMAX, H)
    D_sb = None
    if D_rows != None:  # noqa: E711
        D_sb = load_f32(D_rows[:, h_base * P:h_base * P + HP], _PMAX, HP)
    DI = None
    if D_heads != None:  # noqa: E711
        DI = _d_heads(D_heads, ones, Q, h_base, H)
    # heads per block: seg [Q, hb*Q], y [Q, 2*hb*P] and the state [., n_tiles*hb*P]
    # each fill at most one PSUM bank
    # (two-argument min / max only: the NKI front end rejects more)
    hb = max(1, min(min(HPG, _PSUM_F // Q), min((_PSUM_F // 2) // P, (_PSUM_F // n_tiles) // P)))
    blocks = _head_blocks(G, g_lo, HPG, h_base, H, hb)

    cst = {"ones": ones, "U": U, "Ls": Ls, "sb": sb, "Lpre": Lpre, "Lin": Lin, "Uloc": Uloc,
           "fast": fast, "A": A_sb, "bias": bias_sb, "D_sb": D_sb,
           "Dh": None, "ident": None, "H": H, "P": P, "N": N, "G": G, "Q": Q,
           "n_tiles": n_tiles, "dt_softplus": dt_softplus, "dt_lo": dt_lo,
           "dt_hi": dt_hi, "x": x, "dt": dt, "B": B, "C": C, "z": z, "y": y_out,
           "h_base": h_base, "g_lo": g_lo}
    if DI != None:  # noqa: E711
        cst["Dh"] = DI[0]
        cst["ident"] = DI[1]
    else:
        cst["ident"] = _identity(ones, Q)
    # prologue temporaries (the PSUM scratch bank: _new_psum in each loop body)
    cst["BT"] = nl.ndarray((_PMAX, Q), dtype=nl.float32, buffer=nl.sbuf)

    # running state S^T, fp32, one tile per 128 of N (persistent)
    ST = []
    for t in range(n_tiles):
        ST.append(nl.ndarray((min(_PMAX, N - t * _PMAX), HP), dtype=nl.float32, buffer=nl.sbuf))
    cst["ST"] = ST
    # two chunk contexts (double-buffered loads) when they fit in SBUF beside the
    # state, else one (its loads then wait for the previous chunk's last block:
    # the pipeline drains between the two chunks of an iteration)
    zbytes = _itemsize(x.dtype)
    if z != None:  # noqa: E711
        zbytes = _itemsize(z.dtype)
    xbytes = _itemsize(x.dtype)
    braw = 0                                # B and C as loaded, when not fp32
    if B.dtype != nl.float32:
        braw = braw + _itemsize(B.dtype)
    if C.dtype != nl.float32:
        braw = braw + _itemsize(C.dtype)
    ctx_bytes = (HP * (xbytes + zbytes) + GN * (8 + braw) + H * 4 * (6 + n_tiles)
                 + G * Q * (n_tiles * 4 + 4) + 6 * H)
    # state + transfer piece + item rings (W, Dm; yb, sz, Xd, xd, xfD) + constants
    fixed = (n_tiles * HP * 4 + _NAT_BYTES + 4 * hb * Q * 4 + 30 * hb * P * 4 + 10 * _PMAX * 4
             + 2 * (Q // sb) * Q * 4 + 4 * hb * sb * 4)
    # the segment sums' operands per chunk for all heads when they fit, else per block
    wbytes = 2 * H * sb * 4
    # bf16 mode, bf16 x, D per head: the D x term as a TensorE matmul against D_h I (bf16,
    # built once) instead of an x D product per block
    cst["dib"] = fast and x.dtype == nl.bfloat16 and cst["Dh"] != None  # noqa: E711
    if cst["dib"]:
        fixed = fixed + H * Q * 2
    double = fixed + 2 * ctx_bytes <= _SBUF_BUDGET
    # (with _WB_SLACK: the estimate leaves out small tiles, up to ~20 KiB at P = 128)
    cst["wbc"] = fixed + ctx_bytes + wbytes <= _SBUF_BUDGET - _WB_SLACK
    if double:
        cst["wbc"] = fixed + 2 * (ctx_bytes + wbytes) <= _SBUF_BUDGET - _WB_SLACK
    if cst["dib"]:
        cst["DIb"] = nl.ndarray((Q, H * Q), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=cst["DIb"].ap(pattern=[[H * Q, Q], [Q, H], [1, Q]], offset=0),
                           data1=cst["ident"].ap(pattern=[[Q, Q], [0, H], [1, Q]], offset=0),
                           data2=cst["Dh"].ap(pattern=[[H, Q], [1, H], [0, Q]], offset=0),
                           op=nl.multiply)
    c0 = _ctx_tiles(cst, G, n_tiles)
    ctxs = [c0, c0]
    if double:
        ctxs[1] = _ctx_tiles(cst, G, n_tiles)
    if cst["Dh"] != None:  # noqa: E711
        for c in ctxs:
            nisa.tensor_copy(dst=c["fac"][:, 2 * H:3 * H], src=cst["Dh"][0:Q, :])
    # long pipelines (at least as many blocks as stages, two contexts, the chunk-state PSUM pair in
    # one bank) balance the engines through TensorE: y_off * exp(cs) is added to y_intra
    # by an identity matmul into its PSUM bank instead of on VectorE, which carries the
    # float products, with the 4 y banks that longer PSUM lifetime needs
    nb = len(blocks)
    cst["pe_add"] = double and nb >= len(_STAGES) and 2 * n_tiles * hb * P <= _PSUM_F
    rings = _item_rings(cst, hb)
    # ... and the state update of every block goes the same way: VectorE e*S,
    # TensorE accumulates it into the chunk-state PSUM, ScalarE copies back
    cst["pe_state"] = cst["pe_add"] and n_tiles == 1
    cst["nb"] = nb
    cst["hb"] = hb
    # blocks whose y_off * exp(cs) runs on VectorE (one instruction) rather than ScalarE
    # (one per head): partial blocks and every other full one (the same count of each
    # engine's instructions in both LNC programs, whose partial blocks may sit elsewhere)
    vec = []
    nfull = 0
    for blk in blocks:
        if blk[2] < hb:
            vec.append(True)
        else:
            vec.append(nfull % 2 == 0)
            nfull = nfull + 1
    cst["vec_ecs"] = vec
    # the state's HBM transfers in pieces of blocks (each DMA pays a descriptor issue and
    # a fixed latency): loads [block 0 | to nb/4 | to nb/2 | rest], stores of chunk 1's
    # blocks [to nb/4 | to nb/2 | to 3nb/4 | to nb-1 | last block], each issued after
    # its last block's stage 9 (piece: (last block, first column, end column))
    cst["st_loads"] = _state_pieces(blocks, P, [1, nb // 4, nb // 2, nb])
    cst["st_stores"] = _state_pieces(blocks, P, [nb // 4, nb // 2, 3 * nb // 4, nb - 1, nb])
    if cst["pe_state"]:
        rings["eS"] = _ring(4, (N, hb * P), nl.float32, nl.sbuf)
        cst["ident_n"] = cst["ident"]
        if Q != N:
            cst["ident_n"] = _identity(_ones_n(N), N)

    # trip counts (the one counts row every program reads): live sequences with an
    # initial state, K-chunk groups of all live sequences, live sequences, zero_table rows
    n_init, n_pairs, n_live, n_zero = trip_counts(counts)
    num_seqs = init_table.shape[0]
    nt_rows = pool.shape[1] // N            # state rows per pool row
    pr = HP // nt_rows
    # this program's pool rows: pr per part of a slot (the launcher's pool view has
    # parts * pr rows per slot; the tables name part 0's)
    cst["pool_base"] = part * pr * nt_rows * N
    # two halves of _NAT_BYTES: a state piece is jb pool-row blocks per partition
    jb = max(1, min(nt_rows, (_NAT_BYTES // 2) // (N * _itemsize(pool.dtype))))
    nat = nl.ndarray((pr, 2 * jb * N), dtype=pool.dtype, buffer=nl.sbuf)
    if pool.dtype != nl.float32:
        cst["ident_pool"] = nl.ndarray((_PMAX, _PMAX), dtype=pool.dtype, buffer=nl.sbuf)
        nisa.affine_select(dst=cst["ident_pool"], pattern=[[-1, _PMAX]], channel_multiplier=1,
                           on_true_tile=ones[0:_PMAX, 0:_PMAX] if Q == _PMAX else _ones128(),
                           on_false_value=0.0, cmp_op=nl.equal, offset=0)
    # S^T blocks in HBM: one per live sequence (its initial, then running, then
    # final state) and block num_seqs, zeros. nl.private_hbm: each program (core)
    # has its own
    cst["scratch"] = nl.ndarray((num_seqs + 1, N, HP), dtype=nl.float32, buffer=nl.private_hbm)
    cst["pair_rows"] = pair_rows
    cst["K"] = pair_vals.shape[1] - 2        # chunks per loop-B iteration (2 or 4)
    tab = nl.ndarray((_PMAX, 2), dtype=nl.int32, buffer=nl.sbuf)       # a sequence's pool rows

    for t in range(n_tiles):
        nisa.memset(dst=ST[t], value=0.0)
    _state_dma(cst, num_seqs, 0, HP, True)

    # ---- loop A: initial states from the pool, transposed into their S^T blocks
    def init_body(i):
        _new_psum(cst)
        blk = _seq_row(init_table, i, tab)
        _state_in(pool, tab, nat, cst, pr, nt_rows, jb)
        _state_dma(cst, blk, 0, HP, True)

    work_loop(n_init, init_body)

    # ---- loop B: every K-chunk group of every live sequence, K chunks per iteration
    # (contexts 0 and 1 alternate). Each iteration loads its own chunks and its state source
    # block and stores its state block, block by block (_st_state)
    def pair_body(i, cells):
        _new_psum(cst)
        _new_psum_rings(cst, rings, hb)
        _pair(cst, ctxs, blocks, rings, i, cells, double)

    for_each_row(n_pairs, pair_vals, pair_body)

    # ---- loop C: final states from their S^T blocks, transposed into the pool
    # (the kernel's own writes to its HBM input are the pool update)
    def final_body(i):
        _new_psum(cst)
        blk = _seq_row(final_table, i, tab)
        _state_dma(cst, blk, 0, HP, False)
        _state_out(pool, tab, nat, cst, pr, nt_rows, jb)

    work_loop(n_live, final_body)

    # ---- loop D: tokens of padding sequences, zero rows of y, Q rows per DMA
    # (unused partitions write the dump row); the zeros come from context 0's
    # x tile (dead by now: SBUF is tight at H*P = 8192)
    zt = ctxs[0]["x_in"]
    nisa.memset(dst=zt, value=0.0)
    zidx = ctxs[0]["yrows"]

    def zero_body(i):
        nisa.dma_copy(dst=zidx, src=at_row(zero_table, i, [[1, Q], [1, 1]]))
        nisa.dma_copy(dst=y_out.ap(pattern=[[HP_all, Q], [1, HP]], offset=h_base * P,
                                   vector_offset=zidx, indirect_dim=0), src=zt)

    work_loop(n_zero, zero_body)
    return y


def _state_pieces(blocks, P, ends):
    """Pieces of consecutive blocks ending before the (increasing) block counts ``ends``
    (empty ones dropped): (last block, first column, end column) of S^T."""
    out = []
    b0 = 0
    for e in ends:
        if e > b0:
            out.append((e - 1, blocks[b0][1] * P, (blocks[e - 1][1] + blocks[e - 1][2]) * P))
            b0 = e
    return out


def _head_blocks(G, g_lo, HPG, h_base, H, hb):
    """Head blocks ``(local group, first local head, heads)`` of the program's heads
    h_base .. h_base+H-1: up to hb heads of one group each."""
    blocks = []
    for gl in range(G):
        lo = max((g_lo + gl) * HPG, h_base) - h_base
        hi = min((g_lo + gl + 1) * HPG, h_base + H) - h_base
        for h0 in range(lo, hi, hb):
            blocks.append((gl, h0, min(hb, hi - h0)))
    return blocks


def _seq_row(table, i, tab):
    """Row i of a sequence table ``[num_seqs, 128, 2]``: its pool rows -> tab (one per
    partition); returns its S^T block (partition 0 of column 1) as a device scalar."""
    nisa.dma_copy(dst=tab, src=at_row(table, i, [[2, _PMAX], [1, 2]]))
    return nisa.scalar_load(tab[0:1, 1:2])


def _state_dma(cst, block, c0, c1, store):
    """Columns [c0, c1) of S^T to (``store``) or from S^T block ``block`` of the HBM
    scratch (an int, or a device scalar: a run-time block)."""
    N, HP, sc = cst["N"], cst["H"] * cst["P"], cst["scratch"]
    for t in range(cst["n_tiles"]):
        ntile = min(_PMAX, N - t * _PMAX)
        pattern = [[HP, ntile], [1, c1 - c0]]
        if isinstance(block, int):
            view = at_row(sc, None, pattern, (block * N + t * _PMAX) * HP + c0)
        else:
            view = at_row(sc, block, pattern, t * _PMAX * HP + c0)
        if store:
            nisa.dma_copy(dst=view, src=cst["ST"][t][:, c0:c1])
        else:
            nisa.dma_copy(dst=cst["ST"][t][:, c0:c1], src=view)


def _ones_n(n):
    t = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    return t


def _ones128():
    t = nl.ndarray((_PMAX, _PMAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    return t


def _itemsize(dtype):
    if dtype == nl.float32:
        return 4
    return 2


def _tri_consts(Q):
    """fp32 constants: ones [Q, 128], U[k, i] = (k <= i), Ls[k, j] = (k > j) [Q, Q]."""
    ones = nl.ndarray((Q, _PMAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    U = nl.ndarray((Q, Q), dtype=nl.float32, buffer=nl.sbuf)
    # keep where i - k >= 0 (k = partition, i = free index)
    nisa.affine_select(dst=U, pattern=[[1, Q]], channel_multiplier=-1, on_true_tile=ones[:, 0:Q],
                       on_false_value=0.0, cmp_op=nl.greater_equal, offset=0)
    Ls = nl.ndarray((Q, Q), dtype=nl.float32, buffer=nl.sbuf)
    # keep where k - j - 1 >= 0
    nisa.affine_select(dst=Ls, pattern=[[-1, Q]], channel_multiplier=1, on_true_tile=ones[:, 0:Q],
                       on_false_value=0.0, cmp_op=nl.greater_equal, offset=-1)
    return ones, U, Ls


def _seg_consts(Q, ones, U, Ls):
    """Constants of the segment-sum matmuls (fp32, 0/1), sub-blocks of sb tokens (32, or
    16 when Q is not a multiple of 32): Lpre[b][k, j] = Ls[k, j] (k < b*sb) for b >= 1
    (None for b = 0), Lin[b][k, j] = Ls[k, j] (b*sb <= k < (b+1)*sb), Uloc [Q, sb]
    [k, i'] = ((k mod sb) <= i'). Returns (sb, Lpre, Lin, Uloc)."""
    sb = 32
    if Q % 32 != 0:
        sb = 16
    nsb = Q // sb
    Lpre = [None]
    for b in range(1, nsb + 1):
        if b == nsb:
            Lpre.append(Ls)
        else:
            t = nl.ndarray((Q, Q), dtype=nl.float32, buffer=nl.sbuf)
            # keep where b*sb - 1 - k >= 0
            nisa.affine_select(dst=t, pattern=[[0, Q]], channel_multiplier=-1, on_true_tile=Ls,
                               on_false_value=0.0, cmp_op=nl.greater_equal, offset=b * sb - 1)
            Lpre.append(t)
    Lin = []
    for b in range(nsb):
        t = nl.ndarray((Q, Q), dtype=nl.float32, buffer=nl.sbuf)
        # keep where k - b*sb >= 0 (of Lpre[b + 1]: k < (b+1)*sb)
        nisa.affine_select(dst=t, pattern=[[0, Q]], channel_multiplier=1, on_true_tile=Lpre[b + 1],
                           on_false_value=0.0, cmp_op=nl.greater_equal, offset=-b * sb)
        Lin.append(t)
    Lpre = Lpre[0:nsb]
    # Uloc[k, i'] = sum_c U[k, c*sb + i'] (k in sub-block c): the group indicator G[k, c]
    G = nl.ndarray((Q, nsb), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=G, pattern=[[-sb, nsb]], channel_multiplier=1, on_true_tile=ones[:, 0:nsb],
                       on_false_value=0.0, cmp_op=nl.greater_equal, offset=0)
    nisa.affine_select(dst=G, pattern=[[sb, nsb]], channel_multiplier=-1, on_true_tile=G,
                       on_false_value=0.0, cmp_op=nl.greater_equal, offset=sb - 1)
    tmp = nl.ndarray((Q, sb, nsb), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=tmp, data1=U.ap(pattern=[[Q, Q], [1, sb], [sb, nsb]], offset=0),
                       data2=G.ap(pattern=[[nsb, Q], [0, sb], [1, nsb]], offset=0), op=nl.multiply)
    Uloc = nl.ndarray((Q, sb), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=Uloc, op=nl.add, data=tmp, axis=(2,))
    return sb, Lpre, Lin, Uloc


def _identity(ones, Q):
    """fp32 identity [Q, Q] (TensorE adds: the D x term, y_off into y_intra)."""
    ident = nl.ndarray((Q, Q), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, pattern=[[-1, Q]], channel_multiplier=1,
                       on_true_tile=ones[:, 0:Q], on_false_value=0.0, cmp_op=nl.equal, offset=0)
    return ident


def _d_heads(D_heads, ones, Q, h_base, H):
    """(D of heads h_base .. h_base+H-1 on Q rows [Q, H] fp32, identity [Q, Q] fp32) for
    the TensorE D x term."""
    Dh = nl.ndarray((Q, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=Dh, src=D_heads[0:Q, h_base:h_base + H])
    return Dh, _identity(ones, Q)


def _pps(cst):
    """The prologue / state-transfer PSUM scratch bank (one: seg, y and the chunk
    state take the other seven)."""
    return cst["pps"]


def _new_psum(cst):
    """A fresh prologue / state-transfer PSUM bank: each runtime-loop body allocates the
    PSUM it writes (as the released runtime-loop kernels do)."""
    cst["pps"] = nl.ndarray((_PMAX, _PSUM_F), dtype=nl.float32, buffer=nl.psum)


def _state_in(pool, tab, nat, cst, pr, nt, jb):
    """The slot's state (pool rows in column 0 of ``tab``) -> S^T tiles: gathered in
    pieces of jb state rows per partition (one pool-row segment per partition;
    the two halves of ``nat`` alternate, so a piece's gather overlaps the
    previous piece's transposes), each transposed on TensorE into one of four
    rotating column regions of the PSUM scratch (so TensorE runs ahead of the
    copies). Piece column j holds state rows ``q*nt + j``: its transpose lands
    in the strided S^T columns ``j, j+nt, ...``."""
    N, n_tiles, ST, HP = cst["N"], cst["n_tiles"], cst["ST"], cst["H"] * cst["P"]
    n_reg = _PSUM_F // _PMAX
    n = 0
    for j0 in range(0, nt, jb):
        nj = min(jb, nt - j0)
        half = nat[:, ((j0 // jb) % 2) * jb * N:((j0 // jb) % 2 + 1) * jb * N]
        src = pool.ap(pattern=[[nt * N, pr], [1, nj * N]], offset=cst["pool_base"] + j0 * N,
                      vector_offset=tab[0:pr, 0:1], indirect_dim=0)
        nisa.dma_copy(dst=half[:, 0:nj * N], src=src)
        for jj in range(nj):
            j = j0 + jj
            for t in range(n_tiles):
                n0 = t * _PMAX
                ntile = min(_PMAX, N - n0)
                reg = (n % n_reg) * _PMAX
                n += 1
                ps = _pps(cst)[0:ntile, reg:reg + pr]
                if nat.dtype == nl.float32:
                    nisa.nc_transpose(dst=ps, data=half[:, jj * N + n0:jj * N + n0 + ntile])
                else:
                    # a bf16 transpose would need a bf16 PSUM bank: transpose by an
                    # exact identity matmul into the fp32 scratch instead
                    nisa.nc_matmul(dst=ps, stationary=half[:, jj * N + n0:jj * N + n0 + ntile],
                                   moving=cst["ident_pool"][0:pr, 0:pr], accumulate=False)
                nisa.tensor_copy(dst=ST[t][:, j:HP:nt], src=ps,
                                 engine=nisa.engine.scalar if n % 2 else nisa.engine.vector)


def _state_out(pool, tab, nat, cst, pr, nt, jb):
    """S^T back to the gather layout (TensorE transposes into rotating PSUM
    regions, in pieces alternating the halves of ``nat``) and scattered."""
    N, n_tiles, ST, HP = cst["N"], cst["n_tiles"], cst["ST"], cst["H"] * cst["P"]
    n_reg = _PSUM_F // N
    n = 0
    for j0 in range(0, nt, jb):
        nj = min(jb, nt - j0)
        half = nat[:, ((j0 // jb) % 2) * jb * N:((j0 // jb) % 2 + 1) * jb * N]
        for jj in range(nj):
            j = j0 + jj
            reg = (n % n_reg) * N
            n += 1
            ps = _pps(cst)[0:pr, reg:reg + N]
            for t in range(n_tiles):
                n0 = t * _PMAX
                ntile = min(_PMAX, N - n0)
                nisa.nc_transpose(dst=ps[:, n0:n0 + ntile], data=ST[t][:, j:HP:nt])
            nisa.tensor_copy(dst=half[:, jj * N:(jj + 1) * N], src=ps,
                             engine=nisa.engine.scalar if n % 2 else nisa.engine.vector)
        dst = pool.ap(pattern=[[nt * N, pr], [1, nj * N]], offset=cst["pool_base"] + j0 * N,
                      vector_offset=tab[0:pr, 0:1], indirect_dim=0)
        nisa.dma_copy(dst=dst, src=half[:, 0:nj * N])


def _ctx_tiles(cst, G, n_tiles):
    """SBUF tiles of one chunk context (allocated once; two contexts alternate)."""
    Q, H, P, N = cst["Q"], cst["H"], cst["P"], cst["N"]
    HP, GN = H * P, G * N
    f32 = nl.float32
    c = {"rows": nl.ndarray((Q, 2), dtype=nl.int32, buffer=nl.sbuf),
         "yrows": nl.ndarray((Q, 1), dtype=nl.int32, buffer=nl.sbuf),
         "mask": nl.ndarray((Q, 1), dtype=f32, buffer=nl.sbuf),
         "x_in": nl.ndarray((Q, HP), dtype=cst["x"].dtype, buffer=nl.sbuf),
         "dt_in": nl.ndarray((Q, H), dtype=f32, buffer=nl.sbuf),
         "B_mm": nl.ndarray((Q, GN), dtype=f32, buffer=nl.sbuf),
         "C_in": nl.ndarray((Q, GN), dtype=f32, buffer=nl.sbuf),
         "t0": nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf),
         "z": None, "elast": [], "CTs": [], "CTfs": [], "cbms": []}
    # B and C land in their own dtype (a DMA does not convert); GpSimd widens them
    # to the fp32 tiles in the prologue compute. x stays in its dtype: the engines
    # read it as it is, and stage 3 widens each block for the fp32 y_intra matmul
    c["B_raw"] = c["B_mm"]
    c["C_raw"] = c["C_in"]
    if cst["B"].dtype != f32:
        c["B_raw"] = nl.ndarray((Q, GN), dtype=cst["B"].dtype, buffer=nl.sbuf)
    if cst["C"].dtype != f32:
        c["C_raw"] = nl.ndarray((Q, GN), dtype=cst["C"].dtype, buffer=nl.sbuf)
    for name in ("dtA", "ecs"):
        c[name] = nl.ndarray((Q, H), dtype=f32, buffer=nl.sbuf)
    # the segment sums' moving operands for all heads [Q, (part, h, i')]: part 0 dtA
    # repeated over the sb columns of a sub-block, part 1 dtA masked by Uloc
    sb = cst["sb"]
    if cst["wbc"]:
        c["WB"] = nl.ndarray((Q, 2 * H * sb), dtype=f32, buffer=nl.sbuf)
    # dt' in columns [0, H), dt' exp(ex) in [H, 2H), D per head in [2H, 3H) (written
    # once, before the loops): the per-head factors of x in stage 3's one instruction
    c["fac"] = nl.ndarray((Q, 3 * H), dtype=f32, buffer=nl.sbuf)
    c["dtp"] = c["fac"][:, 0:H]
    c["wd"] = c["fac"][:, H:2 * H]
    if cst["z"] != None:  # noqa: E711
        # y is written over z's columns once silu(z) of the block is taken (SBUF:
        # H*P*2 bytes per partition and context); the chunk's y store is issued
        # before the context's next loads
        c["z"] = nl.ndarray((Q, HP), dtype=cst["z"].dtype, buffer=nl.sbuf)
        c["yt"] = c["z"]
    else:
        c["yt"] = nl.ndarray((Q, HP), dtype=cst["y"].dtype, buffer=nl.sbuf)
    for t in range(n_tiles):
        ntile = min(_PMAX, N - t * _PMAX)
        c["elast"].append(nl.ndarray((ntile, H), dtype=f32, buffer=nl.sbuf))
    for g in range(G):
        CT = []
        for t in range(n_tiles):
            ntile = min(_PMAX, N - t * _PMAX)
            CT.append(nl.ndarray((ntile, Q), dtype=f32, buffer=nl.sbuf))
        c["CTs"].append(CT)
        c["cbms"].append(nl.ndarray((Q, Q), dtype=f32, buffer=nl.sbuf))
    return c


def _item_rings(cst, hb):
    """Per-item SBUF temporaries, reused round-robin by item index (``_pick``): a buffer
    written in stage k and last read in stage k' needs k' - k + 1 of them (program order
    then keeps every read before the next write). The PSUM rings: ``_new_psum_rings``."""
    Q, P, n_tiles, N = cst["Q"], cst["P"], cst["n_tiles"], cst["N"]
    f32 = nl.float32
    r = {"Dm": _ring(2, (Q, hb * Q), f32, nl.sbuf), "Mt": _ring(2, (Q, hb * Q), f32, nl.sbuf),
         "yb": _ring(3, (Q, hb * P), f32, nl.sbuf), "sz": _ring(3, (Q, hb * P), f32, nl.sbuf),
         "xd": _ring(2, (Q, hb * P), f32, nl.sbuf),
         # [xf | Xd | xD], written in stage 3, read in stages 4 (xf, xD) and 8 (Xd)
         "xfD": _ring(6, (Q, 3 * hb * P), f32, nl.sbuf)}
    if not cst["wbc"]:
        r["WB"] = _ring(2, (Q, 2 * hb * cst["sb"]), f32, nl.sbuf)
    return r


def _new_psum_rings(cst, r, hb):
    """The item PSUM rings, allocated afresh in the pair loop's body: seg x2, y_intra |
    y_off x3 (x4 with ``pe_add``: y is read from PSUM a stage later), the chunk state x2
    (with ``pe_add`` both in one bank). With the scratch bank: 8 banks."""
    Q, P, n_tiles = cst["Q"], cst["P"], cst["n_tiles"]
    f32 = nl.float32
    r["seg"] = _ring(2, (Q, hb * Q), f32, nl.psum)
    ny = 3
    if cst["pe_add"]:
        ny = 4
    r["yps"] = _ring(ny, (Q, 2 * hb * P), f32, nl.psum)
    w = n_tiles * hb * P
    if cst["pe_add"]:
        st = nl.ndarray((_PMAX, 2 * w), dtype=f32, buffer=nl.psum)
        r["st"] = [st[:, 0:w], st[:, w:2 * w]]
    else:
        r["st"] = _ring(2, (_PMAX, w), f32, nl.psum)


def _pick(ring, w):
    """The buffer of item ``w["i"]`` in a round-robin ring."""
    return ring[w["i"] % len(ring)]


def _ring(n, shape, dtype, buf):
    """n tiles of one shape (a round-robin buffer)."""
    out = []
    for i in range(n):
        out.append(nl.ndarray(shape, dtype=dtype, buffer=buf))
    return out


def _load_rows(dst, src, start, col0):
    """dst [Q, w] <- columns col0 .. col0+w-1 of rows start .. start+Q-1 of the HBM
    tensor src [rows, width] (``start``: a device scalar; a dynamic offset, so
    hardware DGE on trn2 and no GpSimd descriptor work)."""
    nisa.dma_copy(dst=dst, src=at_row(src, start, [[src.shape[1], dst.shape[0]],
                                                   [1, dst.shape[1]]], col0))


def _prologue_loads(cst, c, which, i, t0):
    """Chunk ``which`` (0, 1) of pair i of the work list: its token rows and valid flags
    (pair_rows), then dt, B, C (the prologue's inputs), x and z for its Q tokens from its
    first token row ``t0`` (a device scalar, a cell of pair_vals) on, into the context
    ``c`` (in the inputs' dtypes: a DMA does not convert). Rows past the sequence end
    hold the next sequence's tokens or zeros (the launcher zeroes padding sequences'
    tokens and pads the inputs with Q zero rows): finite values, masked by dt' = 0."""
    Q, P, N = cst["Q"], cst["P"], cst["N"]
    nisa.dma_copy(dst=c["rows"], src=at_row(cst["pair_rows"], i, [[2 * cst["K"], Q], [1, 2]],
                                            2 * which))
    h_base, g0 = cst["h_base"], cst["g_lo"] * N
    _load_rows(c["dt_in"], cst["dt"], t0, h_base)
    _load_rows(c["B_raw"], cst["B"], t0, g0)
    _load_rows(c["C_raw"], cst["C"], t0, g0)
    _load_rows(c["x_in"], cst["x"], t0, h_base * P)
    if c["z"] != None:  # noqa: E711
        _load_rows(c["z"], cst["z"], t0, h_base * P)


def _prologue_compute(cst, c, weng):
    """dt' (masked: 0 past the sequence end), decay sums, C^T and the masked CB per
    group, from the context's loaded tiles. ``weng``: the engine of the segment sums'
    masked operand (VectorE at an iteration's start, where the pipeline is empty; GpSimd
    for chunk 1, whose prologue runs beside chunk 0's items)."""
    Q, H, N, G, n_tiles = cst["Q"], cst["H"], cst["N"], cst["G"], cst["n_tiles"]
    nisa.tensor_copy(dst=c["mask"], src=c["rows"][:, 1:2], engine=nisa.engine.gpsimd)
    # the y store's rows: the next chunk's rows may land in c["rows"] before it
    nisa.tensor_copy(dst=c["yrows"], src=c["rows"][:, 0:1], engine=nisa.engine.gpsimd)
    if cst["B"].dtype != nl.float32:
        nisa.tensor_copy(dst=c["B_mm"], src=c["B_raw"], engine=nisa.engine.gpsimd)
    if cst["C"].dtype != nl.float32:
        nisa.tensor_copy(dst=c["C_in"], src=c["C_raw"], engine=nisa.engine.gpsimd)

    # ---- dt' (0 on masked rows: decay 1, no input) and dt'*A, fp32
    dtp0 = dt_prime(c["dt_in"], cst["bias"], Q, H, cst["dt_softplus"], cst["dt_lo"],
                    cst["dt_hi"])
    dtp, dtA = c["dtp"], c["dtA"]
    nisa.tensor_scalar(dst=dtp, data=dtp0, op0=nl.multiply, operand0=c["mask"][:, 0:1])
    nisa.tensor_tensor(dst=dtA, data1=dtp, data2=cst["A"][0:Q, :], op=nl.multiply)
    # the segment sums' moving operands for every head at once: dtA repeated over a
    # sub-block's sb columns (ScalarE), dtA * Uloc (GpSimd)
    if cst["wbc"]:
        _seg_operands(cst, c["WB"], dtA, 0, H, weng)

    # ---- decay sums for all heads (fp32 matmuls with 0/1 operators), then exp
    # each sum in its own PSUM columns while they fit the bank (TensorE then
    # does not wait for the previous sum's exp)
    step = 0
    if (2 + n_tiles) * H <= _PSUM_F:
        step = H
    _exp_of_matmul(cst, c["ecs"], cst["U"], dtA, Q, H, 0)          # exp(cs_i), inclusive cumsum
    _exp_of_matmul(cst, c["wd"], cst["Ls"], dtA, Q, H, step)       # exp(sum_{k>j} dtA_k)
    nisa.tensor_tensor(dst=c["wd"], data1=c["wd"], data2=dtp, op=nl.multiply)   # * dt'_j
    for t in range(n_tiles):
        ntile = min(_PMAX, N - t * _PMAX)
        # chunk total decay, the same value on each of the ntile state partitions
        _exp_of_matmul(cst, c["elast"][t], cst["ones"][0:Q, 0:ntile], dtA, ntile, H,
                       (2 + t) * step)

    # ---- per group: C^T tiles and the causally masked CB^T (fp32)
    for g in range(G):
        tp = _pps(cst)                       # C^T at [0, Q), B^T at [Q, 2Q), CB at [2Q, 3Q)
        cb_ps = tp[0:Q, 2 * Q:3 * Q]
        for t in range(n_tiles):
            n0 = g * N + t * _PMAX
            ntile = min(_PMAX, N - t * _PMAX)
            ct_ps = tp[0:ntile, 0:Q]
            nisa.nc_transpose(dst=ct_ps, data=c["C_in"][:, n0:n0 + ntile])
            CT = c["CTs"][g][t]
            nisa.tensor_copy(dst=CT, src=ct_ps, engine=nisa.engine.scalar)
            CTf = CT
            bt_ps = tp[0:ntile, Q:2 * Q]
            nisa.nc_transpose(dst=bt_ps, data=c["B_mm"][:, n0:n0 + ntile])
            BT = cst["BT"][0:ntile, :]
            nisa.tensor_copy(dst=BT, src=bt_ps, engine=nisa.engine.scalar)
            # cb[j, i] = sum_n B[j, n] C[i, n]
            nisa.nc_matmul(dst=cb_ps, stationary=BT, moving=CTf, accumulate=(t > 0))
        _cb_masked(cst, c, g)


def _cb_masked(cst, c, g):
    """CB^T of group g -> cbm (the causal mask by select: also the decay matrix's)."""
    Q = cst["Q"]
    cb_ps = _pps(cst)[0:Q, 2 * Q:3 * Q]
    # keep i >= j (j = partition): the causal mask of the decay matrix too; a
    # VectorE product with the 0/1 matrix U straight from PSUM (CB is finite:
    # every loaded row is), not a GpSimd select, whose queue holds the W builds
    # TensorE waits for
    nisa.tensor_tensor(dst=c["cbms"][g], data1=cb_ps, data2=cst["U"][0:Q, 0:Q], op=nl.multiply)


def _exp_of_matmul(cst, out, stationary, moving, rows, cols, col0):
    """out [rows, cols] = exp(stationary^T @ moving) (fp32 matmul, 0/1 stationary;
    PSUM scratch columns from col0)."""
    ps = _pps(cst)[0:rows, col0:col0 + cols]
    nisa.nc_matmul(dst=ps, stationary=stationary, moving=moving, accumulate=False,
                   is_stationary_onezero=True)
    nisa.activation(dst=out, op=nl.exp, data=ps)


def _store_y(cst, c, c0=0, c1=None):
    """Columns [c0, c1) (default: all) of the chunk's y rows, scattered to its token rows
    (masked rows: the dump row)."""
    y = cst["y"]
    if c1 == None:  # noqa: E711
        c1 = c["yt"].shape[1]
    nisa.dma_copy(dst=y.ap(pattern=[[y.shape[1], cst["Q"]], [1, c1 - c0]],
                           offset=cst["h_base"] * cst["P"] + c0, vector_offset=c["yrows"],
                           indirect_dim=0), src=c["yt"][:, c0:c1])


def _pair(cst, ctxs, blocks, rings, i, cells, double):
    """Pair i of the work list (contexts 0 and 1) as one software pipeline over
    (chunk, head block) items. ``cells``: the pair's row of pair_vals (device
    scalars): the first token rows of its chunks, its S^T block and its state's
    source block.

    The iteration loads everything it reads (no SBUF value crosses iterations):
    first chunk 0 and the source state, then chunk 1, whose prologue compute is
    issued inside chunk 0's items. Ten stages per item (``_STAGES``, one engine
    each); in step b, stage k works on item b - k, so each engine's in-order
    queue holds work whose inputs were produced in earlier steps. Item (1, j)
    reads the state item (0, j) writes: with more than _S_WRITE - _S_READ blocks
    the two chunks share one pipeline, else it drains between them. The
    pipeline drains at the end of the iteration.
    """
    K = cst["K"]
    t0s = cells[0:K]
    cst["dst"] = cells[K]
    nb = len(blocks)
    ns = len(_STAGES)
    pre = max(1, nb // 2)
    shared = double and nb > _S_WRITE - _S_READ
    # chunk c's first item step and the first step after its last item. Shared
    # pipeline: chunk c follows chunk c - 1 directly, but not before _LEAD steps after
    # chunk c - 2 (its context's previous chunk) is done (its loads and prologue go
    # between); drained: one pipeline after the other
    start = []
    done = []
    for c in range(K):
        if not shared:
            start.append(c * (nb + ns - 1))
        elif c < 2:
            start.append(c * nb)
        else:
            start.append(max(start[c - 1] + nb, done[c - 2] + _LEAD))
        done.append(start[c] + nb + ns - 1)
    steps = []        # lists of (stage, item): stage k of chunk c's item j at step start[c]+j+k
    for b in range(done[K - 1]):
        step = []
        for k in range(ns):
            for c in range(K):
                j = b - k - start[c]
                if 0 <= j < nb:
                    step.append((k, c * nb + j))
        steps.append(step)
    # chunk c's prologue (c >= 1): (step of its loads, step of its compute). Two
    # contexts: chunk 1 loads at step 1 and computes at nb - pre; chunk c >= 2 loads once
    # chunk c - 2 (its context's previous chunk) is done and its y stored, and computes
    # pre steps before its items (not before its loads). One context: once the previous
    # chunk's items are done (the drained pipelines meet there)
    pro = [(0, 0)]
    for c in range(1, K):
        if not double:
            pro.append((done[c - 1], done[c - 1]))
        elif c == 1:
            pro.append((min(1, len(steps)), max(min(1, len(steps)), nb - pre)))
        else:
            pro.append((done[c - 2], max(done[c - 2], start[c] - pre)))
    # the last chunk's y in pieces (quarters of its blocks, halves below 8 blocks), each
    # stored once its blocks' stage 7 has run, the last after the last step (so little
    # of it is left in flight at the iteration end, where the next iteration waits for
    # it); the other chunks' y once their items are done (before their context's next
    # loads: z's tile is y's)
    ystore = []          # (step, first column, end column) of each piece
    ysplit = 0
    if shared and nb >= 4:
        npc = 2
        if nb >= 8:
            npc = 4
        for q in range(1, npc):
            bq = q * nb // npc
            col = blocks[bq][1] * cst["P"]
            ystore.append((start[K - 1] + bq - 1 + _S_YOUT, ysplit, col))
            ysplit = col
    # chunk 0's prologue and the state come first
    _prologue_loads(cst, ctxs[0], 0, i, t0s[0])
    for piece in cst["st_loads"]:
        _state_dma(cst, cells[K + 1], piece[1], piece[2], False)
    _prologue_compute(cst, ctxs[0], nisa.engine.vector)
    for si in range(len(steps)):
        for c in range(K - 1):
            if si == done[c]:
                _store_y(cst, ctxs[c % 2])
        for c in range(1, K):
            if si == pro[c][0]:
                _prologue_loads(cst, ctxs[c % 2], c, i, t0s[c])
        for c in range(1, K):
            if si == pro[c][1]:
                _prologue_compute(cst, ctxs[c % 2], nisa.engine.gpsimd)
        for e in range(len(steps[si])):
            k, item = steps[si][e]
            c, j = item // nb, item % nb
            _STAGES[k](cst, ctxs[c % 2], blocks[j], {"i": item, "c": c}, rings)
        for piece in ystore:
            if piece[0] == si:
                _store_y(cst, ctxs[(K - 1) % 2], piece[1], piece[2])
    _store_y(cst, ctxs[(K - 1) % 2], ysplit)


# Stages of one (chunk, head block) item. Each stage runs on one engine
# (mostly), so in a pipeline step every engine's queue holds work whose
# inputs were produced in earlier steps.

def _seg_operands(cst, WB, dtA, h0, nh, eng):
    """WB [Q, (part, h, i')] for heads h0 .. h0+nh-1 of dtA [Q, H]: part 0 dtA repeated
    over a sub-block's sb columns (ScalarE), part 1 dtA * Uloc (``eng``), one instruction
    each for all the heads."""
    Q, sb, H = cst["Q"], cst["sb"], cst["H"]
    F = WB.shape[1]
    dtA_rep = dtA.ap(pattern=[[H, Q], [1, nh], [0, sb]], offset=h0)
    nisa.tensor_copy(dst=WB.ap(pattern=[[F, Q], [sb, nh], [1, sb]], offset=0), src=dtA_rep,
                     engine=nisa.engine.scalar)
    nisa.tensor_tensor(dst=WB.ap(pattern=[[F, Q], [sb, nh], [1, sb]], offset=F // 2),
                       data1=dtA_rep, data2=cst["Uloc"].ap(pattern=[[sb, Q], [0, nh], [1, sb]], offset=0),
                       op=nl.multiply, engine=eng)


def _st_w(cst, ctx, blk, w, r):
    """The segment sums' operands of the block when they are not built per chunk (SBUF)."""
    g, h0, nh = blk
    if not cst["wbc"]:
        _seg_operands(cst, _pick(r["WB"], w), ctx["dtA"], h0, nh, nisa.engine.gpsimd)


def _st_seg(cst, ctx, blk, w, r):
    """TensorE: seg[j, (b, h, i')] = sum_{j<k<=i} dtA[k, h], i = b*sb + i', for the block's
    heads: per sub-block b of sb tokens, the tokens of earlier sub-blocks (Lpre[b]
    against dtA repeated over the sub-block's columns) plus those of b itself up to i
    (Lin[b] against dtA * Uloc). Every term is a dt'A <= 0, so the sum is a direct
    segment sum (no difference of running sums), exactly 0 for j >= i."""
    g, h0, nh = blk
    Q, sb, H, fast = cst["Q"], cst["sb"], cst["H"], cst["fast"]
    seg = _pick(r["seg"], w)
    wsb = nh * sb
    if cst["wbc"]:
        WB, m0, m1 = ctx["WB"], h0 * sb, (H + h0) * sb
    else:
        WB, m0, m1 = _pick(r["WB"], w), 0, cst["hb"] * sb
    for b in range(Q // sb):
        dst = seg[:, b * wsb:(b + 1) * wsb]
        if b > 0:
            nisa.nc_matmul(dst=dst, stationary=tf32_view(cst["Lpre"][b], fast),
                           moving=tf32_view(WB, fast)[:, m0:m0 + wsb], accumulate=False,
                           is_stationary_onezero=True)
        nisa.nc_matmul(dst=dst, stationary=tf32_view(cst["Lin"][b], fast),
                       moving=tf32_view(WB, fast)[:, m1:m1 + wsb],
                       accumulate=(b > 0), is_stationary_onezero=True)


def _st_exp(cst, ctx, blk, w, r):
    """ScalarE: Dm = exp(seg), one instruction for the block (seg <= 0: Dm in [0, 1];
    dt'_j enters through stage 4's moving operand x_j dt'_j)."""
    g, h0, nh = blk
    Q = cst["Q"]
    Dm, seg = _pick(r["Dm"], w), _pick(r["seg"], w)
    nisa.activation(dst=Dm[:, 0:nh * Q], op=nl.exp, data=seg[:, 0:nh * Q])


def _heads3(t, c0, nh, m):
    """Columns [c0, c0 + nh*m) of tile ``t [rows, F]`` as a ``[rows, nh, m]`` view."""
    rows, F = t.shape
    return t.ap(pattern=[[F, rows], [m, nh], [1, m]], offset=c0)


def _per_head(t, h0, nh, m):
    """Columns [h0, h0 + nh) of a per-head tile ``t [rows, H]`` repeated m times each
    (zero stride) as a ``[rows, nh, m]`` view: one operand value per (partition, head)."""
    rows, F = t.shape
    return t.ap(pattern=[[F, rows], [1, nh], [0, m]], offset=h0)


def _st_mt(cst, ctx, blk, w, r):
    """VectorE, one instruction each for the block: Mt[j, (h, i)] = Dm[j, (b, h, i')] *
    CBmask[j, i] (CBmask repeated over the heads by a zero stride; the head-major Mt is
    stage 4's per-head stationary); the x products [xf | Xd | xD] = x *
    [dt' | dt' exp(ex) | D] (fp32; no xD with ``dib``; x read nf times by a zero
    stride)."""
    g, h0, nh = blk
    Q, P, sb, hb, H = cst["Q"], cst["P"], cst["sb"], cst["hb"], cst["H"]
    nsb = Q // sb
    Dm, Mt = _pick(r["Dm"], w), _pick(r["Mt"], w)
    F = Dm.shape[1]
    cbm = ctx["cbms"][g]
    nisa.tensor_tensor(dst=Mt.ap(pattern=[[F, Q], [sb, nsb], [Q, nh], [1, sb]], offset=0),
                       data1=Dm.ap(pattern=[[F, Q], [nh * sb, nsb], [sb, nh], [1, sb]], offset=0),
                       data2=cbm.ap(pattern=[[Q, Q], [sb, nsb], [0, nh], [1, sb]], offset=0),
                       op=nl.multiply, engine=nisa.engine.vector)
    c0 = h0 * P
    xfD = _pick(r["xfD"], w)
    XF = xfD.shape[1]
    nf, fac, nfac = 2, ctx["fac"], 3
    if cst["Dh"] != None and not cst["dib"]:  # noqa: E711
        nf = nf + 1
    nisa.tensor_tensor(dst=xfD.ap(pattern=[[XF, Q], [hb * P, nf], [P, nh], [1, P]], offset=0),
                       data1=ctx["x_in"].ap(pattern=[[H * P, Q], [0, nf], [P, nh], [1, P]],
                                            offset=c0),
                       data2=fac.ap(pattern=[[nfac * H, Q], [H, nf], [1, nh], [0, P]], offset=h0),
                       op=nl.multiply, engine=nisa.engine.vector)


def _xD(cst, w, r, k):
    """Head k's x D columns of the block's x-products tile."""
    hb, P = cst["hb"], cst["P"]
    return _pick(r["xfD"], w)[:, (2 * hb + k) * P:(2 * hb + k + 1) * P]


def _st_out_mm(cst, ctx, blk, w, r):
    """TensorE: y_intra (+ D x) matmuls per head, y_off = C S^T per N tile (tfloat32
    views of the fp32 tiles in bf16 mode; D x in bf16 with ``dib``), into one PSUM bank: y_intra at columns [0, nh*P),
    y_off after."""
    g, h0, nh = blk
    Q, P, fast = cst["Q"], cst["P"], cst["fast"]
    Mt, yps, hb = _pick(r["Mt"], w), _pick(r["yps"], w), cst["hb"]
    xfD = _pick(r["xfD"], w)
    ident = tf32_view(cst["ident"], fast)
    for k in range(nh):
        yi = yps[:, k * P:(k + 1) * P]
        nisa.nc_matmul(dst=yi, stationary=tf32_view(Mt, fast)[:, k * Q:(k + 1) * Q],
                       moving=tf32_view(xfD, fast)[:, k * P:(k + 1) * P], accumulate=False)
        if cst["dib"]:
            # + D_h x_i: stationary D_h I (bf16), moving x_h
            h = h0 + k
            nisa.nc_matmul(dst=yi, stationary=cst["DIb"][:, h * Q:(h + 1) * Q],
                           moving=ctx["x_in"][:, h * P:(h + 1) * P], accumulate=True)
        elif cst["Dh"] != None:  # noqa: E711
            # + D_h x_i: identity stationary, moving x_h D_h (stage 3)
            nisa.nc_matmul(dst=yi, stationary=ident[0:Q, 0:Q], moving=tf32_view(_xD(cst, w, r, k), fast),
                           accumulate=True, is_stationary_onezero=True)
    yo = yps[:, nh * P:2 * nh * P]
    c0, c1 = h0 * P, (h0 + nh) * P
    for t in range(cst["n_tiles"]):
        nisa.nc_matmul(dst=yo, stationary=tf32_view(ctx["CTs"][g][t], fast),
                       moving=tf32_view(cst["ST"][t], fast)[:, c0:c1], accumulate=(t > 0))


def _st_scalar(cst, ctx, blk, w, r):
    """ScalarE: y_off * exp(cs_i) per head, silu(z); GpSimd: the chunk-state operand
    Xd = x dt' exp(ex); VectorE: e^tot S^T (blocks on the TensorE state path). Xd and
    e^tot S^T one instruction each for the block (the per-head factor repeated over P
    by a zero stride)."""
    g, h0, nh = blk
    P, x_in = cst["P"], ctx["x_in"]
    c0, c1 = h0 * P, (h0 + nh) * P
    yps, yb = _pick(r["yps"], w), _pick(r["yb"], w)
    if cst["vec_ecs"][w["i"] % cst["nb"]]:
        # one VectorE instruction (exp(cs) repeated over P by a zero stride)
        nisa.tensor_tensor(dst=_heads3(yb, 0, nh, P), data1=_heads3(yps, nh * P, nh, P),
                           data2=_per_head(ctx["ecs"], h0, nh, P), op=nl.multiply,
                           engine=nisa.engine.vector)
    else:
        for k in range(nh):
            nisa.activation(dst=yb[:, k * P:(k + 1) * P], op=nl.copy,
                            data=yps[:, (nh + k) * P:(nh + k + 1) * P],
                            scale=ctx["ecs"][:, h0 + k:h0 + k + 1])
    if ctx["z"] != None:  # noqa: E711
        nisa.activation(dst=_pick(r["sz"], w)[:, 0:nh * P], op=nl.silu,
                        data=ctx["z"][:, c0:c1])
    if _pe_state(cst, w):
        # e^tot * S (the block's state, final since the previous chunk's stage 9)
        nisa.tensor_tensor(dst=_heads3(_pick(r["eS"], w), 0, nh, P),
                           data1=_heads3(cst["ST"][0], c0, nh, P),
                           data2=_per_head(ctx["elast"][0], h0, nh, P), op=nl.multiply,
                           engine=nisa.engine.gpsimd)


def _st_yadd(cst, ctx, blk, w, r):
    """y = y_off + y_intra: VectorE (PSUM operand), or with ``pe_add`` TensorE
    (fp32 identity matmul accumulating y_off * exp(cs) into y_intra's PSUM)."""
    g, h0, nh = blk
    P, Q = cst["P"], cst["Q"]
    yb = _pick(r["yb"], w)[:, 0:nh * P]
    yi = _pick(r["yps"], w)[:, 0:nh * P]
    if _pe_add(cst, w):
        nisa.nc_matmul(dst=yi, stationary=tf32_view(cst["ident"], cst["fast"])[0:Q, 0:Q],
                       moving=tf32_view(_pick(r["yb"], w), cst["fast"])[:, 0:nh * P], accumulate=True,
                       is_stationary_onezero=True)
    else:
        nisa.tensor_tensor(dst=yb, data1=yb, data2=yi, op=nl.add)


def _st_yout(cst, ctx, blk, w, r):
    """VectorE: + x D (D per channel), * silu(z), into the chunk's y tile (the sum is
    in PSUM with ``pe_add``)."""
    g, h0, nh = blk
    P, D_sb, x_in, Q = cst["P"], cst["D_sb"], ctx["x_in"], cst["Q"]
    c0, c1 = h0 * P, (h0 + nh) * P
    yb = _pick(r["yb"], w)[:, 0:nh * P]
    ysum = yb
    if _pe_add(cst, w):
        ysum = _pick(r["yps"], w)[:, 0:nh * P]
    if D_sb != None:  # noqa: E711
        xd = _pick(r["xd"], w)[:, 0:nh * P]
        nisa.tensor_tensor(dst=xd, data1=x_in[:, c0:c1], data2=D_sb[0:Q, c0:c1], op=nl.multiply,
                           engine=nisa.engine.vector)
        nisa.tensor_tensor(dst=yb, data1=ysum, data2=xd, op=nl.add, engine=nisa.engine.vector)
        ysum = yb
    y_b = ctx["yt"][:, c0:c1]
    if ctx["z"] != None:  # noqa: E711
        nisa.tensor_tensor(dst=y_b, data1=ysum, data2=_pick(r["sz"], w)[:, 0:nh * P],
                           op=nl.multiply, engine=nisa.engine.vector)
    elif _pe_add(cst, w):
        # PSUM -> the y tile: ScalarE on odd blocks (VectorE / ScalarE balance)
        nisa.tensor_copy(dst=y_b, src=ysum, engine=nisa.engine.scalar)
    else:
        nisa.tensor_copy(dst=y_b, src=ysum, engine=nisa.engine.gpsimd)


def _st_state_mm(cst, ctx, blk, w, r):
    """TensorE: chunk state B^T Xd per N tile (one PSUM bank for all tiles)."""
    g, h0, nh = blk
    P, N, B_mm = cst["P"], cst["N"], ctx["B_mm"]
    st = _pick(r["st"], w)
    fast, hb = cst["fast"], cst["hb"]
    Bs, Xd = tf32_view(B_mm, fast), tf32_view(_pick(r["xfD"], w), fast)[:, hb * P:(hb + nh) * P]
    for t in range(cst["n_tiles"]):
        n0 = g * N + t * _PMAX
        ntile = min(_PMAX, N - t * _PMAX)
        nisa.nc_matmul(dst=st[0:ntile, t * nh * P:(t + 1) * nh * P],
                       stationary=Bs[:, n0:n0 + ntile], moving=Xd, accumulate=False)
    if _pe_state(cst, w):
        nisa.nc_matmul(dst=st[0:N, 0:nh * P], stationary=tf32_view(cst["ident_n"], fast)[0:N, 0:N],
                       moving=tf32_view(_pick(r["eS"], w), fast)[:, 0:nh * P], accumulate=True,
                       is_stationary_onezero=True)


def _st_state(cst, ctx, blk, w, r):
    """VectorE: S^T <- exp(total) S^T + chunk state, per head (fp32); blocks on the
    TensorE path (``_pe_state``): ScalarE copies the PSUM sum back. After a pair's
    chunk 1 the block goes to the pair's S^T block in HBM (the next pair loads its
    source block, this one within a sequence, at its start)."""
    g, h0, nh = blk
    P, ST, elast = cst["P"], cst["ST"], ctx["elast"]
    st = _pick(r["st"], w)
    if _pe_state(cst, w):
        nisa.activation(dst=ST[0][:, h0 * P:(h0 + nh) * P], op=nl.copy,
                        data=st[0:ST[0].shape[0], 0:nh * P])
    else:
        for t in range(cst["n_tiles"]):
            ntile = ST[t].shape[0]
            for k in range(nh):
                h = h0 + k
                nisa.scalar_tensor_tensor(dst=ST[t][:, h * P:(h + 1) * P],
                                          data=ST[t][:, h * P:(h + 1) * P], op0=nl.multiply,
                                          operand0=elast[t][:, h:h + 1], op1=nl.add,
                                          operand1=st[0:ntile,
                                                      (t * nh + k) * P:(t * nh + k + 1) * P])
    if w["c"] == cst["K"] - 1:
        for piece in cst["st_stores"]:
            if piece[0] == w["i"] % cst["nb"]:
                _state_dma(cst, cst["dst"], piece[1], piece[2], True)


def _pe_state(cst, w):
    """Whether item ``w``'s block updates the state on TensorE / ScalarE (one block
    in _PE_STATE_CYCLE: TensorE / VectorE / ScalarE balance)."""
    return cst["pe_state"] and (w["i"] % cst["nb"]) % _PE_STATE_CYCLE == 0


def _pe_add(cst, w):
    """Whether item ``w``'s block adds y_off to y_intra on TensorE (every block when
    ``pe_add``: measured better than leaving some on VectorE)."""
    return cst["pe_add"]


_STAGES = (_st_w, _st_seg, _st_exp, _st_mt, _st_out_mm, _st_scalar, _st_yadd, _st_yout,
           _st_state_mm, _st_state)
# stage reading the state (the bf16 copy / fp32 view in _st_mt / _st_out_mm) and
# the stage writing it: item (1, j) may only read after item (0, j) wrote
_S_READ, _S_WRITE = 4, 9
_S_YOUT = 7        # the stage writing the chunk's y tile
_LEAD = 1          # steps between a context's chunk done and its next chunk's first item
