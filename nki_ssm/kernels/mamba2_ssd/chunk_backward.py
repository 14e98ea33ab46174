"""Mamba-2 SSD chunked prefill backward over a ragged batch (functional: no pool).

Kernel: ``ssd_chunk_backward`` (an ``nki.jit`` kernel). The host launcher
(``nki_ssm/ops/launch/mamba2_ssd_backward.py``, ``backward_tables``) pads the
batch to its buckets and builds the run-time tables described here.

Math (per head h of group g, one chunk of Q tokens i, j; the reference's
recurrence S_t = a_t S_{t-1} + dt'_t x_t B_t^T, y = (S_t C_t + D x_t) silu(z_t)):
c_i is the inclusive cumsum of dt'A in the chunk, E_ij = exp(c_i - c_j) for
j <= i (a direct masked segment sum, never a difference of cumsums), S0 the
state before the chunk, dSe the gradient of the state after it, dy1 =
dy silu(z) (0 on masked rows), CB_ij = C_i.B_j, K = E o CB, Z_ij = E_ij dt'_j
(dy1_i . x_j), M = Z o CB:

    y0_i  = sum_j K_ij dt'_j x_j + e^{c_i} S0 C_i        (recomputed: dz and ddA need it)
    dx_j  = dt'_j [sum_i K_ij dy1_i + e^{c_end-c_j} dSe B_j] + D dy1_j
    dB_j  = sum_i Z_ij C_i + dt'_j e^{c_end-c_j} dSe^T x_j        (summed over the group)
    dC_i  = e^{c_i} S0^T dy1_i + sum_j Z_ij B_j                    (summed over the group)
    dS0   = e^{c_end} dSe + sum_i e^{c_i} dy1_i C_i^T              (the previous chunk's dSe)
    ddA_k = sum_{i>=k} dy1_i.(e^{c_i} S0 C_i) + sum_{i>=k>j} M_ij + sum_{j<k} q_j
            + e^{c_end} <dSe, S0>

with q_j = dt'_j e^{c_end-c_j} x_j.(dSe B_j). ddA_k = dL/d(dt'_k A): every term is a
sum over its own index range (the intra-chunk term is the cross sum over
i >= k > j, computed as R = Li^T M, R_kj = sum_{i>=k} M_ij, masked to j < k and
summed over j; the state term
the exclusive prefix sum of q), never a difference of two long sums, which in
float32 cancels (dA = sum dt' ddA cancels ~10x on realistic gates already).
Then ddt'_k = A ddA_k + x_k.dxr_k (dxr the bracket of dx), dA += dt' ddA,
ddt = ddt' [lo <= u <= hi] sigmoid(dt + dt_bias) (softplus; u the unclipped
dt'), ddt_bias += ddt, dD += dy1 x, dz = dy silu'(z) (y0 + D x).

Design note
===========

What the forward saves: nothing (the host API's backward gets the forward's
inputs, and reads only those). Recomputed here: per chunk dt', its cumsums and
decays, CB, and y0 (for dz, only with z); the chunk-boundary states (loop F) into an
fp32 HBM scratch ``[R + 1, N, H*P]`` (``nl.private_hbm``): 4*H*P*N/Q bytes
per token (20 KiB at Mamba-2 2.7B, Q = 128; 335 MB at 16K tokens; twice that
per head channel at N = 256), plus one d-state block per sequence (the
d_initial_states output).

One compiled program per shape bucket: compile-time arguments are shapes
(token bucket T, sequence bucket S, H, P, N, G, Q) and layer configuration
(dt_softplus, dt limits). The batch composition is run-time int32 data:

- ``frows [R, Q, 2]`` / ``fvals [R, 2]``: every chunk of every live sequence
  in order (R = ceil(T / Q) + S rows; the tail unused): per partition the
  token row (row T past the sequence end: a zero input row, the outputs'
  dump row) and a 0/1 valid flag; the first token row and the scratch block
  the state after the chunk goes to (the next row's, or block R, a dump
  block, after a sequence's last chunk);
- ``brows [R, Q, 2]`` / ``bvals [R, 3]``: the same chunks in reverse order, with
  the first token row, the chunk's forward row (its state block) and its
  sequence;
- ``seqs [S, 3]``: per live sequence its initial-state block (block S of
  ``init_st`` is zeros), the scratch block of its first chunk (R: it has
  none) and its index;
- ``counts [1, 2]``: live sequences, chunk rows: the one row every program
  reads.

Loops (top-level ``nl.fori_loop``s on the scaffold, none nested; the bounds are
device scalars of ``counts``, ``scaffold.trip_counts``; each iteration reads its
table row's cells as device scalars, ``scaffold.for_each_row``, the DMA offsets
of its token rows and state blocks):

S. per sequence: its initial state (S^T layout) -> the scratch block of its
   first chunk; its d_final_states block -> its d_initial_states block (an
   empty sequence's gradient passes through).
F. per chunk, forward order: S^T <- scratch[row] (loop S or the previous
   row wrote it), S_end^T = e^{c_end} S^T + B^T (x dt' e^{c_end-c}) ->
   scratch[next]: per head block one VectorE pass per dstate tile for
   e^{c_end} S^T (e^{c_end} broadcast along each head's P columns), per head
   ScalarE x dt' e^{c_end-c} and a TensorE matmul into one PSUM bank of up to
   512 / P heads, one VectorE add per bank. The blocks use the two block tile
   sets by turns and the next block's loads are issued before this block's work
   (each DMA queue is in order), so they overlap its compute and stores.
B. per chunk, reverse order: dSe^T <- the sequence's d-state block (loop S or
   the previous row wrote it), S0^T <- scratch[row]; the work below; dS0^T ->
   the same block. After a sequence's first chunk it holds d_initial_states.
After the loops, straight-line: the dA, dD, ddt_bias accumulators ([Q, .] in
SBUF, summed over partitions by a ones matmul) -> HBM.

Every iteration loads what it reads (its table row, token rows and state
blocks): no SBUF value is prefetched across iterations; what crosses them is
in HBM (the scratch and d-state blocks) or the float32 accumulators of dA, dD
and ddt_bias.

Per row of loop B: loads of dt (fp32), B, C (their dtype); the chunk-wide
dt' and gate (ScalarE softplus / sigmoid, VectorE compares), the decay sums
(TensorE 0/1 matmuls, ScalarE exp), per group C^T, B^T, CB, CB^T. Then per
head block (at most _BLOCK_COLS columns, half that at N > 128: x, dy, z loaded
in their dtype and read so by VectorE / ScalarE, never widened; dy1, silu'(z),
the dD accumulation on ScalarE / VectorE; the block's segment-sum operands
Wtb[k', (h, i)] = dt'A[k', h] (k' <= i), one GpSimd multiply of the constant
0/1 mask broadcast over the heads)
the heads run as a two-stage software pipeline (stage A of head k+1 issued
before stage B of head k; per-head SBUF temporaries and PSUM banks are rings
of 2, x dt' of 3), each in-order engine queue ordered so that work waiting on
another engine's result comes after work that does not (``_block_grads``).
Stage A: ScalarE per-token scalings, TensorE y_off / segment sum / 6
transposes, ScalarE exp and the PSUM evictions (the transposes two to a PSUM
bank and one eviction: dy1^T | (dy1 e^c)^T, (x dt')^T | (x dt' e^{c_end-c})^T,
S0 | dSe). Then E (a transpose, ScalarE eviction) and K on GpSimd. Stage B:
TensorE dy1 (x dt')^T and (x dt') dy1^T, dx x2, dS, the state terms of dC and
dB, then R = Li^T M (a 0/1 stationary), the Z term of dB, the Z^T term of dC;
VectorE M (from the PSUM product and K), Z = E o it, Z^T = E^T o (x dt')
dy1^T (no transpose of Z), the masked R (into the block's tile), dx and the
state-gradient update; with z, K^T of the next head, y_intra and (VectorE)
y0, dz (without z none of it: it feeds dz alone). Per block: the row dots V,
DI, q', <dSe, S0> (one product and one tensor_reduce over the [rows, heads, P]
view each) and the intra-chunk ddA columns (one tensor_reduce over the masked
R tiles). The block's tail (those row dots but <dSe, S0>, the ddA columns, the
scatters of dx, dz and its dS0^T) is issued inside the next block's pipeline,
after its first two steps: the block tiles are two sets used by turns (one
set, the tail right after its block, where two do not fit the SBUF: Falcon-H1
and Granite heads at LNC=1). Per row at the end: four accumulating matmuls complete ddA, the dt
chain, and the scatters of dx, dz, ddt (one row per partition; masked rows go
to the dump row), of dB / dC (the program's partial slab) and of dS0^T.

PSUM (8 banks of 2 KiB per partition, allocated in each loop body that writes
them): the chunk scratch (decay sums, group terms, then the ddA columns); dC |
dB (2N <= 512 columns); per head, ring of 2: hA (seg, E, dy1^T, (dy1 e^c)^T,
reused for dy1 (x dt')^T, (x dt') dy1^T, R), hB (the other transposes; in
stage B the dS tiles), hC (y_intra, y_off, the two dx terms; loop F's states of
up to 512 / P heads).

dstate: N > 128 is two partition tiles (n0 = 0, 128; the second may be partial):
the states S^T, dSe^T and the per-group B^T, C^T are one SBUF tile per dstate
tile; the contractions over N (CB, CB^T, y_off, the dx state term, the ddA
state term) are accumulating matmuls over the tiles, the [P, N] transposes of
S0 and dSe are assembled from per-tile transposes, and the per-tile matmuls
with N on the output partitions (loop F's state, dS) write one region each.

dB / dC reduction order: within each half of the LNC=2 head split ([0, H/2),
[H/2, H); H odd: one range) the heads of a group accumulate in one PSUM bank in
head order; a group whose heads sit in both halves (gs) has two partials,
which the launcher adds (at LNC=1 the kernel writes the second half's into N
extra columns of dB / dC), so LNC=1 and LNC=2 add the same partials in the same
order: bit-identical gradients.

What binds (modeled, trn2, ``nki_ssm.perf`` as of this commit; Mamba-2 2.7B,
bf16 I/O, one sequence, no z): the per-head cross-engine chain exp -> E -> K
-> M -> R -> masked R, now led by VectorE (73 % busy; M, Z, Z^T, the masked R,
dx, dx out and the dS update are 7 [Q, <=128] VectorE passes per head) and
ScalarE (63 %: 3 scalings, y_off, 3 paired evictions, exp, E, the dx state
term per head); TensorE is 28 % busy (tfloat32 operands at the bf16 rate).
Per 128-token chunk (512-token run / 4, loops F and B, 80 heads, LNC=1):
TensorE 1,696 instructions, ScalarE 895, VectorE 664, GpSimd 172, DMA 64.
512 tokens (``python -m simulate --op backward --model mamba2-2.7b
--range-samples 12 --no-calibration --lnc 1``): 1.60 ms at LNC=1 (1.46-1.76
ms 10-90 %), 0.85 ms at LNC=2; program size 3,539 at LNC=1. 16K tokens
(``--set judged --case 1x16384``, 12 samples): 49.1 ms at LNC=1 (44.7-54.1 ms;
VectorE 75 %, ScalarE 66 %, TensorE 29 %, GpSimd 31 %, DMA 16 % busy; worst
gradient 1.69e-3). The per-head chain's latency binds, not one engine's
throughput: at 512 tokens, dropping the three passes off the chain (masked R,
dx's add, the dS update) outright would save 6 % (ScalarE then binds), those
and the three per-token scalings 13 %; moving work to another engine in a way
that adds a cross-engine step to a head's chain (dxS summed into dx's PSUM by an
identity matmul and evicted on ScalarE, M = Z o CB on GpSimd) costs 8-14 %, and
the scalings as broadcast passes per block or per 4 heads (VectorE, GpSimd) cost
2-8 %. Next: several heads per PSUM bank (the off-chain passes and the ScalarE
PSUM reads as one [Q, 512] pass per bank) together with a deeper pipeline
(three heads in flight), the PSUM budget freed by packing hC's four [Q, P]
regions of two heads into one bank.

LNC: program p of 2 takes heads [p H/2, (p+1) H/2) (H even; odd H: both
programs take every head, ``scaffold.program_share``, and the launcher keeps
program 0's outputs), so both run the same loops and trip counts: one control
flow. Every output and the scratch exist once per program (each program
allocates all of them in the same order and writes only its own: dx, dz, ddt,
dA, dD, ddt_bias, d_init for its heads, a partial dB / dC over its heads for
every token); the launcher joins the head
columns and the groups' dB / dC columns, adding the two partials of the group
whose heads sit in both programs. No HBM tensor is written by both programs: no
sync.

Layouts: token-major, heads on the free dim (x ``[T+Q, H*P]``); states in
the S^T layout ``[N, H*P]`` (dstate on partitions), transposed per head on
TensorE where a contraction over P needs ``[P, N]``. Numerics: fp32
throughout (bfloat16 inputs widened on read; outputs rounded once on write),
with float32 accumulation in PSUM; bfloat16 callers read the per-head and
per-group TensorE operands as tfloat32 views (10 mantissa bits, rounding 2^-11,
a quarter of the bf16 outputs'; B and C exact): worst gradient 1.69e-3 against
float64 at 512 tokens and 16K (the 5e-3 budget); float32 callers keep exact
float32 operands (1e-5); the chunk-level decay sums and the ddA / dt chain
matmuls stay float32. Every decay is exp of a sum <= 0.

Limits: N <= 256 (two dstate tiles: dC | dB share one PSUM bank), P <= 128
(a head's [Q, P] operands are transposed to P partitions; the launcher splits
heads of P > 128 into k heads of P / k, the recurrence being independent along
P), Q <= 128 (a multiple of 16); the program's per-partition SBUF (about 25
fp32 [Q, _BLOCK_COLS] or [128, .] tiles, two of those per state at N > 128, the
block's [Q, heads*Q] masked-R tile and the [Q, H/lnc*P] dD accumulator).

Constructs: those of ``chunk.py`` (the forward) and ``scaffold.py`` (device
scalars, the work-row loops, the LNC split), plus ``nisa.tensor_reduce`` over the
last axis of a 3-D ``.ap`` view of a 2-D tile (the per-head row dots of a block: the
trailing free axes, NKI 0.8 docs; the form of ``gated_delta/chunk.py``) and 3-D
``.ap`` operands of ``nisa.tensor_tensor`` (loop F's e^{c_end} broadcast: a zero
stride, as the segment-sum operand's ``.ap`` here).
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels._common import tf32_view
from nki_ssm.kernels.scaffold import (at_row, for_each_row, lnc_grid, program_share,
                                      trip_counts)

_PMAX = 128
_PSUM_F = 512
_BLOCK_COLS = 1024     # fp32 columns of the per-head-block tiles (16 heads at P = 64)
_MASKED = -1.0e4       # added to masked decay exponents: exp underflows to exactly 0


def _sb(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def _rows_view(src, start, c0, width, nrows):
    """Rows start .. start+nrows-1, columns [c0, c0+width) of the 2-D HBM tensor src
    (``start``: an NkiScalar, a table cell)."""
    return at_row(src, start, [[src.shape[1], nrows], [1, width]], c0)


def _scatter_view(dst, rows, c0, width, base):
    """One row per partition of the 2-D HBM tensor dst: row ``base + rows[q]``."""
    return dst.ap(pattern=[[dst.shape[1], rows.shape[0]], [1, width]],
                  offset=base * dst.shape[1] + c0, vector_offset=rows, indirect_dim=0)


def _block_view(st, block, c0, width, tile):
    """Rows [n0, n0+rows) (``tile`` = (n0, rows), a dstate tile), columns [c0, c0+width)
    of block ``block`` (an NkiScalar: a table cell or the loop's iteration value) of the
    3-D HBM tensor st [blocks, N, cols]."""
    return at_row(st, block, [[st.shape[2], tile[1]], [1, width]], tile[0] * st.shape[2] + c0)


def _psum_tiles(t, names):
    """Fresh one-bank PSUM tiles for ``names`` (a ring of 2 for the per-head ones): each
    runtime-loop body (and the straight-line end) allocates the PSUM it writes."""
    for name in names:
        if name in ("hA", "hB", "hC"):
            t[name] = [_psum_bank(), _psum_bank()]
        else:
            t[name] = _psum_bank()


def _psum_bank():
    return nl.ndarray((_PMAX, _PSUM_F), dtype=nl.float32, buffer=nl.psum)


def _tri(Q, ones, channel_multiplier, step, offset, cmp_op=nl.greater_equal):
    """0/1 fp32 [Q, Q]: 1 where channel_multiplier*k + step*i + offset >= 0 (cmp_op)."""
    t = _sb((Q, Q))
    nisa.affine_select(dst=t, pattern=[[step, Q]], channel_multiplier=channel_multiplier,
                       on_true_tile=ones[0:Q, 0:Q], on_false_value=0.0,
                       cmp_op=cmp_op, offset=offset)
    return t


def _tf(t, x):
    """x as a TensorE operand: its tfloat32 view for bfloat16 callers (t["fast"]), else
    itself (_common.tf32_view)."""
    return tf32_view(x, t["fast"])


def _widen(dst, src, width):
    """fp32 copy of columns [0, width) of a loaded tile (bf16 inputs); an fp32 tile is
    used as it is."""
    if src.dtype == nl.float32:
        return src
    nisa.tensor_copy(dst=dst[:, 0:width], src=src[:, 0:width], engine=nisa.engine.gpsimd)
    return dst


@nki.jit
def ssd_chunk_backward(x, dt, A_rows, B, C, D_rows, z, bias_rows, dy, init_st, dfin_st,
                       frows, fvals, brows, bvals, seqs, counts, heads, dstate, dt_softplus,
                       dt_lo, dt_hi, chunk_size):
    """Gradients of the chunked SSD prefill; returns
    ``(dx, ddt, dz, dB, dC, dA, dD, ddt_bias, d_init)``.

    Inputs (prepared by the launcher; T the token bucket, S the sequence bucket):
      x, dy ``[T + Q, H*P]`` (float32 or bfloat16, one dtype), z like x or None,
      dt ``[T + Q, H]`` float32 (raw dt), B, C ``[T + Q, G*N]`` (x's dtype); rows
      T.. are zeros. A_rows, bias_rows ``[128, H]`` float32 (bias None: no
      dt_bias), D_rows ``[128, H*P]`` float32 or None (D per channel),
      init_st ``[S + 1, N, H*P]`` float32 (initial states in S^T layout, block S
      zeros), dfin_st ``[S, N, H*P]`` float32 (d_final_states, S^T layout),
      the int32 tables of the module docstring.
    Compile-time: heads H, dstate N (<= 256), dt_softplus, dt_lo, dt_hi (dt_hi may be inf),
      chunk_size Q.
    Outputs, one tensor of each per program (``lnc`` of each in a row in the returned
      tuple; w = the program's heads h times P): dx ``[T + 1, w]`` (x's dtype; row T a
      dump row), ddt ``[T + 1, h]`` float32 (through dt_bias, softplus, clip), dz like
      dx (unwritten without z), dB, dC ``[T + 1, G*N (+ N)]`` float32 (partial: the
      program's heads; at LNC=1 with a group straddling the head split H/2, N extra
      columns hold that group's second-half partial: module docstring), dA ``[1, h]``, dD ``[1, w]`` (per channel; unconditionally computed),
      ddt_bias ``[1, h]`` float32, d_init ``[S, N, w]`` float32 (S^T layout).
    """
    T1, HP = x.shape
    H = heads
    P = HP // H
    N = dstate
    GN = B.shape[1]
    G = GN // N
    HPG = H // G
    Q = chunk_size
    Tb = T1 - Q
    S = dfin_st.shape[0]
    R = frows.shape[0]
    f32 = nl.float32
    # this program's heads [h0, h0 + nhp): half of them each when they split; else all of
    # them on both programs (program 1's outputs are its own tensors, which the launcher
    # drops: it runs program 0's work and loops, changing nothing real)
    npr, pid = lnc_grid()
    h0, nhp, _ = program_share(H, npr, pid)
    h1 = h0 + nhp
    c0, c1 = h0 * P, h1 * P
    W = c1 - c0
    groups = []
    for g in range(G):
        if g * HPG < h1 and (g + 1) * HPG > h0:
            groups.append(g)
    # dstate tiles of at most 128 partitions: (first row, rows)
    ntl = []
    for n0 in range(0, N, _PMAX):
        ntl.append((n0, min(_PMAX, N - n0)))
    NT = ntl[0][1]
    hpp = max(1, _PSUM_F // (len(ntl) * P))    # loop F: heads per PSUM bank of states
    # dB / dC reduction order: the heads of a group accumulate in PSUM within each half of
    # the LNC=2 head split ([0, H/2), [H/2, H); H odd: one range), the host adds the two
    # halves' partials; at LNC=1 the second half's part of the group that straddles H/2
    # (gs) goes to N extra columns, so both LNC configurations add the same partials
    hsplit = H
    if H % 2 == 0:
        hsplit = H // 2
    gs = -1
    if hsplit % HPG != 0:
        gs = hsplit // HPG
    extra = 0
    if npr == 1 and gs >= 0:
        extra = N
    # head blocks of the program: the per-block tiles are [Q, hbk*P]
    hbk = max(1, min(nhp, _BLOCK_COLS // P))
    blocks = []
    for a in range(0, nhp, hbk):
        blocks.append((a, min(nhp, a + hbk)))
    WB = hbk * P

    # every output and the scratch: one tensor per program (each program allocates all
    # of them, in the same order, and writes only its own), so no HBM tensor is written
    # by both programs
    rows1 = Tb + 1
    outs = []
    for item in (((rows1, W), x.dtype), ((rows1, nhp), f32), ((rows1, W), x.dtype),
                 ((rows1, GN + extra), f32), ((rows1, GN + extra), f32), ((1, nhp), f32),
                 ((1, W), f32),
                 ((1, nhp), f32), ((S, N, W), f32)):
        per = []
        for p in range(npr):
            per.append(nl.ndarray(item[0], dtype=item[1], buffer=nl.shared_hbm))
        outs.append(per)
    dx = outs[0][pid]
    ddt = outs[1][pid]
    dz = outs[2][pid]
    dB = outs[3][pid]
    dC = outs[4][pid]
    dA = outs[5][pid]
    dD = outs[6][pid]
    dtb = outs[7][pid]
    dinit = outs[8][pid]
    scratches = []
    for p in range(npr):
        scratches.append(nl.ndarray((R + 1, N, W), dtype=f32, buffer=nl.private_hbm))
    scratch = scratches[pid]

    # ---- constants
    ones = _sb((_PMAX, _PMAX))
    nisa.memset(dst=ones, value=1.0)
    t = {"U": _tri(Q, ones, -1, 1, 0),      # U[k, i] = (k <= i)
         "Ls": _tri(Q, ones, 1, -1, -1),    # Ls[k, j] = (k > j)
         "Li": _tri(Q, ones, 1, -1, 0),     # Li[i, k] = (i >= k)
         "Us": _tri(Q, ones, -1, 1, -1),    # Us[j, k] = (j < k)
         "ones": ones, "fast": x.dtype != nl.float32}
    t["I"] = _tri(Q, ones, 1, -1, 0, nl.equal)     # identity
    negs = _sb((Q, Q))
    nisa.memset(dst=negs, value=_MASKED)
    t["NEG"] = _sb((Q, Q))                          # _MASKED where j > i (j = partition)
    nisa.affine_select(dst=t["NEG"], pattern=[[-1, Q]], channel_multiplier=1, on_true_tile=negs,
                       on_false_value=0.0, cmp_op=nl.greater_equal, offset=-1)
    t["A"] = _sb((_PMAX, nhp))
    nisa.dma_copy(dst=t["A"], src=A_rows[:, h0:h1])
    t["bias"] = None
    if bias_rows != None:  # noqa: E711
        t["bias"] = _sb((_PMAX, nhp))
        nisa.dma_copy(dst=t["bias"], src=bias_rows[:, h0:h1])
    t["D"] = None
    if D_rows != None:  # noqa: E711
        t["D"] = _sb((_PMAX, W))
        nisa.dma_copy(dst=t["D"], src=D_rows[:, c0:c1])

    # ---- SBUF tiles (allocated once, before the loops; PSUM: _psum_tiles in each body)
    t["rows"] = _sb((Q, 2), nl.int32)
    t["mask"] = _sb((Q, 1))
    for name in ("sig", "prod"):
        t[name] = _sb((Q, WB))
    t["dt_in"] = _sb((Q, nhp))
    t["B_raw"] = _sb((Q, GN), B.dtype)
    t["C_raw"] = _sb((Q, GN), C.dtype)
    t["Bf"] = _sb((Q, GN))
    t["Cf"] = _sb((Q, GN))
    for name in ("dtp", "dtA", "ecs", "eex", "wd", "gate", "tmp", "ddt", "V", "DI", "qv",
                 "accA", "accB"):
        t[name] = _sb((Q, nhp))
    t["elast"] = _sb((NT, nhp))
    t["Tn"] = _sb((NT, len(ntl) * nhp))
    t["Dacc"] = _sb((Q, W))
    # per-head temporaries: rings of 2 (two heads in flight, _block_grads)
    for name in ("Xd", "dy1e", "y0", "y1", "dD1"):
        t[name] = [_sb((Q, P)), _sb((Q, P))]
    t["xdt"] = [_sb((Q, P)), _sb((Q, P)), _sb((Q, P))]   # read by y_intra a step later
    t["Wtb"] = _sb((Q, hbk * Q))    # the block's segment-sum operands, one [Q, Q] per head
    t["Wc"] = _sb((Q, nhp))         # the intra-chunk ddA term, a column per head
    for name in ("ETm", "Em", "KT", "K", "Zt", "ZTt", "M"):
        t[name] = [_sb((Q, Q)), _sb((Q, Q))]
    # per-head transposes, two to an SBUF tile (one PSUM eviction each): dy1^T | (dy1 e^c)^T,
    # (x dt')^T | (x dt' e^{c_end - c})^T ([P, 2Q]), S0 | dSe ([P, 2N])
    for name in ("dTT", "xTT"):
        t[name] = [_sb((P, 2 * Q)), _sb((P, 2 * Q))]
    t["SD"] = [_sb((P, 2 * N)), _sb((P, 2 * N))]
    t["CT"] = []
    t["BT"] = []
    t["CBTm"] = []
    t["CB"] = []
    for g in range(G):
        CTg = []
        BTg = []
        for item in ntl:
            CTg.append(_sb((item[1], Q)))
            BTg.append(_sb((item[1], Q)))
        t["CT"].append(CTg)
        t["BT"].append(BTg)
        t["CBTm"].append(_sb((Q, Q)))
        t["CB"].append(_sb((Q, Q)))
    t["dBt"] = _sb((Q, GN + extra))
    t["dCt"] = _sb((Q, GN + extra))
    t["out1"] = _sb((1, W))
    nisa.memset(dst=t["dBt"], value=0.0)     # groups without this program's heads stay 0
    nisa.memset(dst=t["dCt"], value=0.0)
    nisa.memset(dst=t["accA"], value=0.0)
    nisa.memset(dst=t["accB"], value=0.0)
    nisa.memset(dst=t["Dacc"], value=0.0)
    # two sets of block tiles when they fit the SBUF (an estimate of the per-partition bytes
    # of every tile; the simulator checks the real figure), else one (the tail then follows
    # its block's pipeline instead of running inside the next one)
    per_set = WB * (2 * 5 + 4 * 6 + 4 * 2 * len(ntl)) + hbk * Q * 4
    fixed = (8 * W + G * (len(ntl) + 1) * 2 * Q * 4 + 16 * GN + 2 * WB * 4 + hbk * Q * 4
             + 24 * 1024)
    nsets = 1
    if fixed + 2 * per_set <= 190 * 1024:
        nsets = 2
    for name in _BLOCK_SET:
        for par in range(nsets):
            if name in ("ST0", "dST"):
                lst = []
                for item in ntl:
                    lst.append(_sb((item[1], WB)))
                t[name + "#" + str(par)] = lst
            elif name in ("x_raw", "dy_raw", "dxo", "dzo"):
                t[name + "#" + str(par)] = _sb((Q, WB), x.dtype)
            elif name == "z_raw":
                t[name + "#" + str(par)] = None
                if z != None:  # noqa: E711
                    t[name + "#" + str(par)] = _sb((Q, WB), z.dtype)
            elif name == "Xb":
                t[name + "#" + str(par)] = _sb((Q, hbk * Q))
            elif name == "pB":
                t[name + "#" + str(par)] = _sb((_PMAX, WB))
            else:
                t[name + "#" + str(par)] = _sb((Q, WB))
        if nsets == 1:
            t[name + "#1"] = t[name + "#0"]
        t[name] = t[name + "#0"]    # loops S, F and the first block of loop B: set 0
    cfg = {"Q": Q, "P": P, "N": N, "G": G, "HPG": HPG, "h0": h0, "nhp": nhp, "c0": c0,
           "ntl": ntl, "NT": NT, "hsplit": hsplit, "gs": gs, "extra": extra, "GN": GN,
           "W": W, "H": H, "x": x, "dt": dt, "B": B, "C": C, "z": z, "dy": dy,
           "soft": dt_softplus, "lo": dt_lo, "hi": dt_hi, "groups": groups, "blocks": blocks,
           "dx": dx, "dz": dz, "dinit": dinit, "nsets": nsets}

    # trip counts: live sequences, chunk rows (the one counts row both programs read)
    n_seqs, n_rows = trip_counts(counts)

    # ---- loop S: initial states -> scratch block of the first chunk; dfin -> dinit
    def seq_body(i, cells):
        ib, fb, seq = cells
        for item in blocks:
            a = item[0]
            b = item[1]
            ca, wb = c0 + a * P, (b - a) * P
            for ti in range(len(ntl)):
                nt = ntl[ti]
                ST0, dST = t["ST0"][ti], t["dST"][ti]
                nisa.dma_copy(dst=ST0[:, 0:wb], src=_block_view(init_st, ib, ca, wb, nt))
                nisa.dma_copy(dst=_block_view(scratch, fb, ca - c0, wb, nt), src=ST0[:, 0:wb])
                nisa.dma_copy(dst=dST[:, 0:wb], src=_block_view(dfin_st, seq, ca, wb, nt))
                nisa.dma_copy(dst=_block_view(dinit, seq, ca - c0, wb, nt), src=dST[:, 0:wb])

    for_each_row(n_seqs, seqs, seq_body)

    # ---- loop F: chunk-boundary states, forward order
    def fwd_body(i, cells):
        t0, blk = cells
        t["t0"] = t0
        _psum_tiles(t, ("pc", "hC"))
        nisa.dma_copy(dst=t["rows"], src=at_row(frows, i, [[2, Q], [1, 2]]))
        _load_common(cfg, t, False)
        _chunk_decays(cfg, t)
        # the block tile sets by turns, the next block's loads issued before this block's
        # work (each DMA queue is in order: not behind this block's stores)
        _fwd_block_loads(cfg, t, scratch, i, 0)
        for bi in range(len(blocks)):
            a = blocks[bi][0]
            b = blocks[bi][1]
            ca, wb = c0 + a * P, (b - a) * P
            if bi + 1 < len(blocks):
                _fwd_block_loads(cfg, t, scratch, i, bi + 1)
            for name in ("x_raw", "ST0", "dST"):
                t[name] = t[name + "#" + str(bi % 2)]
            xw = t["x_raw"]
            # e^{c_end} S^T of the block's heads (one VectorE pass per dstate tile, e^{c_end}
            # broadcast along each head's P columns), then per PSUM bank of hpp heads the
            # B^T (x dt' e^{c_end - c}) matmuls and one add
            for ti in range(len(ntl)):
                nsz = ntl[ti][1]
                nisa.tensor_tensor(dst=_heads_view(t["dST"][ti], nsz, 0, b - a, P),
                                   data1=_heads_view(t["ST0"][ti], nsz, 0, b - a, P),
                                   data2=t["elast"].ap(pattern=[[nhp, nsz], [1, b - a], [0, P]],
                                                       offset=a),
                                   op=nl.multiply)
            for g0 in range(a, b, hpp):
                g1 = min(b, g0 + hpp)
                ps = _r(t, "hC", g0 // hpp)
                for k in range(g0, g1):
                    Xd = _r(t, "Xd", k)
                    nisa.tensor_scalar(dst=Xd, data=xw[:, (k - a) * P:(k - a + 1) * P],
                                       op0=nl.multiply, operand0=t["wd"][:, k:k + 1],
                                       engine=nisa.engine.scalar)
                    g = (h0 + k) // HPG
                    for ti in range(len(ntl)):
                        n0, nsz = ntl[ti]
                        c = (ti * hpp + k - g0) * P
                        nisa.nc_matmul(dst=ps[0:nsz, c:c + P],
                                       stationary=_tf(t, t["Bw"][:, g * N + n0:g * N + n0 + nsz]),
                                       moving=_tf(t, Xd), accumulate=False)
                for ti in range(len(ntl)):
                    nsz = ntl[ti][1]
                    dcols = t["dST"][ti][:, (g0 - a) * P:(g1 - a) * P]
                    nisa.tensor_tensor(dst=dcols, data1=dcols,
                                       data2=ps[0:nsz, ti * hpp * P:(ti * hpp + g1 - g0) * P],
                                       op=nl.add)
            for ti in range(len(ntl)):
                nisa.dma_copy(dst=_block_view(scratch, blk, ca - c0, wb, ntl[ti]),
                              src=t["dST"][ti][:, 0:wb])

    for_each_row(n_rows, fvals, fwd_body)

    # ---- loop B: chunks in reverse order, the state gradient through the d-state blocks
    def bwd_body(i, cells):
        t0, blk, seq = cells
        t["t0"] = t0
        _psum_tiles(t, ("pc", "dCB", "hA", "hB", "hC"))
        nisa.dma_copy(dst=t["rows"], src=at_row(brows, i, [[2, Q], [1, 2]]))
        _load_common(cfg, t, True)
        _chunk_decays(cfg, t)
        _group_terms(cfg, t)
        yr = t["rows"][:, 0:1]
        pending = [None]
        for bi in range(len(blocks)):
            a = blocks[bi][0]
            b = blocks[bi][1]
            ca, wb = c0 + a * P, (b - a) * P
            # the block's tiles: one of two sets in turn, so the previous block's tail (row
            # dots, scatters; issued inside this block's pipeline) reads its own
            for name in _BLOCK_SET:
                t[name] = t[name + "#" + str(bi % 2)]
            _load_block(cfg, t, ca, wb)
            for ti in range(len(ntl)):
                nisa.dma_copy(dst=t["ST0"][ti][:, 0:wb],
                              src=_block_view(scratch, blk, ca - c0, wb, ntl[ti]))
                nisa.dma_copy(dst=t["dST"][ti][:, 0:wb],
                              src=_block_view(dinit, seq, ca - c0, wb, ntl[ti]))
            # <dSe, S0> per state row and head, before stage B updates dSe
            for ti in range(len(ntl)):
                nsz = ntl[ti][1]
                _rowdots(t["pB"], t["Tn"][0:nsz, ti * nhp + a:ti * nhp + b], t["dST"][ti][:, 0:wb],
                         t["ST0"][ti][:, 0:wb], P)
            _block_decay_operand(cfg, t, a, b)
            _block_grads(cfg, t, a, b, pending)
            tail = {"a": a, "b": b, "yr": yr, "seq": seq}
            for name in _BLOCK_SET:
                tail[name] = t[name]
            pending[0] = tail
            if nsets == 1:
                _block_tail(cfg, t, pending)
        _block_tail(cfg, t, pending)
        _chunk_dt(cfg, t)
        nisa.dma_copy(dst=_scatter_view(ddt, yr, 0, nhp, 0), src=t["ddt"])
        nisa.dma_copy(dst=_scatter_view(dB, yr, 0, GN + extra, 0), src=t["dBt"])
        nisa.dma_copy(dst=_scatter_view(dC, yr, 0, GN + extra, 0), src=t["dCt"])

    for_each_row(n_rows, bvals, bwd_body)

    # ---- the end: the per-head accumulators summed over partitions (ones matmul) -> HBM
    _psum_tiles(t, ("pc",))
    for item in ((t["accA"], dA, 0, nhp), (t["accB"], dtb, 0, nhp), (t["Dacc"], dD, 0, W)):
        acc = item[0]
        out = item[1]
        c_a = item[2]
        c_b = item[3]
        w = c_b - c_a
        for a in range(0, w, _PSUM_F):
            b = min(w, a + _PSUM_F)
            ps = t["pc"][0:1, 0:b - a]
            nisa.nc_matmul(dst=ps, stationary=ones[0:Q, 0:1], moving=acc[:, a:b],
                           accumulate=False, is_stationary_onezero=True)
            nisa.tensor_copy(dst=t["out1"][:, a:b], src=ps)
        nisa.dma_copy(dst=out[0:1, c_a:c_b], src=t["out1"][:, 0:w])
    if npr == 2:
        return (outs[0][0], outs[0][1], outs[1][0], outs[1][1], outs[2][0], outs[2][1],
                outs[3][0], outs[3][1], outs[4][0], outs[4][1], outs[5][0], outs[5][1],
                outs[6][0], outs[6][1], outs[7][0], outs[7][1], outs[8][0], outs[8][1])
    return (outs[0][0], outs[1][0], outs[2][0], outs[3][0], outs[4][0], outs[5][0], outs[6][0],
            outs[7][0], outs[8][0])


def _fwd_block_loads(cfg, t, scratch, i, bi):
    """Loop F: x and the state S^T of block bi into its tile set (bi % 2)."""
    Q, P, c0, ntl = cfg["Q"], cfg["P"], cfg["c0"], cfg["ntl"]
    a, b = cfg["blocks"][bi][0], cfg["blocks"][bi][1]
    ca, wb = c0 + a * P, (b - a) * P
    par = str(bi % 2)
    nisa.dma_copy(dst=t["x_raw#" + par][:, 0:wb], src=_rows_view(cfg["x"], t["t0"], ca, wb, Q))
    for ti in range(len(ntl)):
        nisa.dma_copy(dst=t["ST0#" + par][ti][:, 0:wb],
                      src=_block_view(scratch, i, ca - c0, wb, ntl[ti]))


def _load_common(cfg, t, backward):
    """The chunk's dt (program's heads) and B (and C) rows from its first token on, in
    their dtypes, widened to fp32; the valid mask."""
    Q, h0, nhp = cfg["Q"], cfg["h0"], cfg["nhp"]
    GN = cfg["B"].shape[1]
    t0 = t["t0"]
    nisa.dma_copy(dst=t["dt_in"], src=_rows_view(cfg["dt"], t0, h0, nhp, Q))
    nisa.dma_copy(dst=t["B_raw"], src=_rows_view(cfg["B"], t0, 0, GN, Q))
    if backward:
        nisa.dma_copy(dst=t["C_raw"], src=_rows_view(cfg["C"], t0, 0, GN, Q))
    nisa.tensor_copy(dst=t["mask"], src=t["rows"][:, 1:2], engine=nisa.engine.gpsimd)
    t["Bw"] = _widen(t["Bf"], t["B_raw"], GN)
    if backward:
        t["Cw"] = _widen(t["Cf"], t["C_raw"], GN)


def _load_block(cfg, t, ca, wb):
    """x, dy, z of one head block (columns [ca, ca+wb)), widened; dy1 = dy silu(z) valid,
    dyz = dy silu'(z); dD accumulates dy1 x."""
    Q, c0 = cfg["Q"], cfg["c0"]
    t0 = t["t0"]
    nisa.dma_copy(dst=t["x_raw"][:, 0:wb], src=_rows_view(cfg["x"], t0, ca, wb, Q))
    nisa.dma_copy(dst=t["dy_raw"][:, 0:wb], src=_rows_view(cfg["dy"], t0, ca, wb, Q))
    if t["z_raw"] != None:  # noqa: E711
        nisa.dma_copy(dst=t["z_raw"][:, 0:wb], src=_rows_view(cfg["z"], t0, ca, wb, Q))
    # x, dy, z stay in their dtype: every reader is a VectorE / ScalarE / GpSimd
    # instruction (widened on read), none a TensorE operand
    xw = t["x_raw"]
    dyw = t["dy_raw"]
    t["xw"] = xw
    mask = t["mask"][:, 0:1]
    dy1, dyz = t["dy1"][:, 0:wb], t["dyz"][:, 0:wb]
    if t["z_raw"] != None:  # noqa: E711
        zw = t["z_raw"][:, 0:wb]
        sig, silu = t["sig"][:, 0:wb], t["prod"][:, 0:wb]
        nisa.activation(dst=sig, op=nl.sigmoid, data=zw)
        nisa.tensor_tensor(dst=silu, data1=zw, data2=sig, op=nl.multiply)
        # silu'(z) = sig (1 + z - silu)
        nisa.tensor_tensor(dst=dyz, data1=zw, data2=silu, op=nl.subtract)
        nisa.scalar_tensor_tensor(dst=dyz, data=dyz, op0=nl.add, operand0=1.0,
                                  op1=nl.multiply, operand1=sig)
        nisa.tensor_tensor(dst=dyz, data1=dyz, data2=dyw[:, 0:wb], op=nl.multiply)
        nisa.scalar_tensor_tensor(dst=dy1, data=dyw[:, 0:wb], op0=nl.multiply, operand0=mask,
                                  op1=nl.multiply, operand1=silu)
    else:
        nisa.tensor_scalar(dst=dy1, data=dyw[:, 0:wb], op0=nl.multiply, operand0=mask)
    prod = t["prod"][:, 0:wb]
    nisa.tensor_tensor(dst=prod, data1=dy1, data2=xw[:, 0:wb], op=nl.multiply)
    dacc = t["Dacc"][:, ca - c0:ca - c0 + wb]
    nisa.tensor_tensor(dst=dacc, data1=dacc, data2=prod, op=nl.add)


def _chunk_decays(cfg, t):
    """dt' (0 on masked rows), dt'A, e^{c_i}, e^{c_end - c_j}, dt' e^{c_end - c_j}, e^{c_end}
    on the N state partitions; the dt gate (d dt' / d dt, times valid)."""
    Q, nhp = cfg["Q"], cfg["nhp"]
    dt_in, dtp, dtA, gate = t["dt_in"], t["dtp"], t["dtA"], t["gate"]
    mask = t["mask"][:, 0:1]
    pre = dt_in
    if t["bias"] != None:  # noqa: E711
        nisa.tensor_tensor(dst=t["tmp"], data1=dt_in, data2=t["bias"][0:Q, :], op=nl.add)
        pre = t["tmp"]
    u = pre
    if cfg["soft"]:
        nisa.activation(dst=dtp, op=nl.softplus, data=pre)
        u = dtp
    # gate = [u >= lo] [u <= hi] sigmoid(pre) (softplus) valid; dt' = clip(u) valid
    nisa.tensor_scalar(dst=gate, data=u, op0=nl.greater_equal, operand0=cfg["lo"],
                       op1=nl.multiply, operand1=mask)
    if cfg["hi"] < 3.0e38:
        nisa.tensor_scalar(dst=dtA, data=u, op0=nl.multiply, operand0=-1.0,
                           op1=nl.greater_equal, operand1=-cfg["hi"])
        nisa.tensor_tensor(dst=gate, data1=gate, data2=dtA, op=nl.multiply)
    if cfg["soft"]:
        nisa.activation(dst=dtA, op=nl.sigmoid, data=pre)
        nisa.tensor_tensor(dst=gate, data1=gate, data2=dtA, op=nl.multiply)
    if cfg["hi"] < 3.0e38:
        nisa.tensor_scalar(dst=dtp, data=u, op0=nl.maximum, operand0=cfg["lo"],
                           op1=nl.minimum, operand1=cfg["hi"])
    else:
        nisa.tensor_scalar(dst=dtp, data=u, op0=nl.maximum, operand0=cfg["lo"])
    nisa.tensor_scalar(dst=dtp, data=dtp, op0=nl.multiply, operand0=mask)
    nisa.tensor_tensor(dst=dtA, data1=dtp, data2=t["A"][0:Q, :], op=nl.multiply)
    pc = t["pc"]
    for item in ((t["ecs"], t["U"], Q), (t["eex"], t["Ls"], Q),
                            (t["elast"], t["ones"][0:Q, 0:cfg["NT"]], cfg["NT"])):
        dst = item[0]
        stat = item[1]
        rows = item[2]
        nisa.nc_matmul(dst=pc[0:rows, 0:nhp], stationary=stat, moving=dtA, accumulate=False,
                       is_stationary_onezero=True)
        nisa.activation(dst=dst, op=nl.exp, data=pc[0:rows, 0:nhp])
    nisa.tensor_tensor(dst=t["wd"], data1=t["eex"], data2=dtp, op=nl.multiply)


def _group_terms(cfg, t):
    """Per group of the program: C^T, B^T, CB^T (masked to j <= i) and CB."""
    Q, N, ntl = cfg["Q"], cfg["N"], cfg["ntl"]
    pc = t["pc"]
    for g in cfg["groups"]:
        for ti in range(len(ntl)):
            n0 = g * N + ntl[ti][0]
            nsz = ntl[ti][1]
            nisa.nc_transpose(dst=pc[0:nsz, 0:Q], data=t["Cw"][:, n0:n0 + nsz])
            nisa.tensor_copy(dst=t["CT"][g][ti], src=pc[0:nsz, 0:Q], engine=nisa.engine.scalar)
            nisa.nc_transpose(dst=pc[0:nsz, Q:2 * Q], data=t["Bw"][:, n0:n0 + nsz])
            nisa.tensor_copy(dst=t["BT"][g][ti], src=pc[0:nsz, Q:2 * Q],
                             engine=nisa.engine.scalar)
        # CB^T and CB contract over dstate: one accumulating matmul per tile (CB^T only
        # feeds K^T: y_intra, dz; not computed without z)
        if t["z_raw"] != None:  # noqa: E711
            for ti in range(len(ntl)):
                nisa.nc_matmul(dst=pc[0:Q, 2 * Q:3 * Q], stationary=_tf(t, t["BT"][g][ti]),
                               moving=_tf(t, t["CT"][g][ti]), accumulate=ti > 0)
            nisa.tensor_tensor(dst=t["CBTm"][g], data1=pc[0:Q, 2 * Q:3 * Q], data2=t["U"],
                               op=nl.multiply)
        for ti in range(len(ntl)):
            nisa.nc_matmul(dst=pc[0:Q, 3 * Q:4 * Q], stationary=_tf(t, t["CT"][g][ti]),
                           moving=_tf(t, t["BT"][g][ti]), accumulate=ti > 0)
        nisa.tensor_copy(dst=t["CB"][g], src=pc[0:Q, 3 * Q:4 * Q], engine=nisa.engine.scalar)


def _heads_view(tile, rows, c0, nb, P):
    """[rows, nb, P] view of the nb heads' columns from column c0 of a 2-D SBUF tile."""
    return tile.ap(pattern=[[tile.shape[1], rows], [P, nb], [1, P]], offset=c0)


def _rowdots(prod, dst, a, b, P):
    """dst [rows, nb] = per head (P columns each) the sum over its columns of a o b, for
    the nb heads of a block: one VectorE product into the block's product tile and one
    reduce over the last axis of its [rows, nb, P] view."""
    rows, w = a.shape[0], a.shape[1]
    nisa.tensor_tensor(dst=prod[0:rows, 0:w], data1=a, data2=b, op=nl.multiply)
    view = prod.ap(pattern=[[prod.shape[1], rows], [P, w // P], [1, P]], offset=0)
    nisa.tensor_reduce(dst=dst, op=nl.add, data=view, axis=(2,))


# the per-block tiles, two sets used by turns (bwd loop): the block's inputs and the operands
# of its tail (row dots, intra-chunk ddA reduce, scatters)
_BLOCK_SET = ("x_raw", "dy_raw", "z_raw", "dxo", "dzo", "dy1", "dyz", "yoffb", "dxrb", "dxSb",
              "Xb", "pB", "ST0", "dST")


def _block_tail(cfg, t, pending):
    """The tail of the block in ``pending[0]`` (its tiles saved when it was issued), if any:
    V = dy1 . e^c y_off, DI = x . dxr, q' = x . dxS (per token and head), the intra-chunk
    ddA columns (row sums of the masked Li^T M per head), the scatters of dx, dz and the
    block's dS0^T. Issued inside the next block's pipeline, so its VectorE passes and DMAs
    do not hold up the next block's first heads."""
    tail = pending[0]
    if tail == None:  # noqa: E711
        return
    pending[0] = None
    Q, P, c0, ntl = cfg["Q"], cfg["P"], cfg["c0"], cfg["ntl"]
    a, b, yr = tail["a"], tail["b"], tail["yr"]
    ca, wb = c0 + a * P, (b - a) * P
    pB = tail["pB"]
    _rowdots(pB, t["V"][:, a:b], tail["yoffb"][:, 0:wb], tail["dy1"][:, 0:wb], P)
    _rowdots(pB, t["DI"][:, a:b], tail["x_raw"][:, 0:wb], tail["dxrb"][:, 0:wb], P)
    _rowdots(pB, t["qv"][:, a:b], tail["x_raw"][:, 0:wb], tail["dxSb"][:, 0:wb], P)
    xb = tail["Xb"]
    nisa.tensor_reduce(dst=t["Wc"][:, a:b], op=nl.add,
                       data=xb.ap(pattern=[[xb.shape[1], Q], [Q, b - a], [1, Q]], offset=0),
                       axis=(2,))
    nisa.dma_copy(dst=_scatter_view(cfg["dx"], yr, ca - c0, wb, 0), src=tail["dxo"][:, 0:wb])
    if tail["z_raw"] != None:  # noqa: E711
        nisa.dma_copy(dst=_scatter_view(cfg["dz"], yr, ca - c0, wb, 0),
                      src=tail["dzo"][:, 0:wb])
    for ti in range(len(ntl)):
        nisa.dma_copy(dst=_block_view(cfg["dinit"], tail["seq"], ca - c0, wb, ntl[ti]),
                      src=tail["dST"][ti][:, 0:wb])


def _r(t, name, k):
    """Head k's copy of a per-head temporary (rings of 2: heads k and k+1 are in flight;
    x dt' a ring of 3)."""
    return t[name][k % len(t[name])]


def _block_grads(cfg, t, a, b, pending):
    """Loop B's per-head work for the program's heads a .. b-1, software-pipelined over
    two stages: stage A of head k+1 is issued before stage B of head k (every per-head
    temporary and PSUM region is a ring of 2), so each in-order engine queue holds work
    of two heads and the engines overlap. Each engine queue is in order, so what waits on
    another engine's result comes after work that does not: per step, stage A of head
    k+1, stage B's first part of head k (matmuls on stage A's results), E and K of head
    k+1 (after its exp), stage B's second part of head k (the matmuls waiting on VectorE),
    K^T of head k+1, then y0 and dz of head k (y_intra reads K^T)."""
    for step in range(a, b + 1):
        if step < b:
            _head_a(cfg, t, a, step)
        if step > a:
            _head_b(cfg, t, a, step - 1)
        if step < b:
            _head_e(cfg, t, step)
        if step > a:
            _head_b2(cfg, t, a, step - 1)
        # y_intra (K^T and its matmul) only feeds dz: without z nothing of it is needed
        if step < b and t["z_raw"] != None:  # noqa: E711
            nisa.tensor_tensor(dst=_r(t, "KT", step), data1=_r(t, "ETm", step),
                               data2=t["CBTm"][(cfg["h0"] + step) // cfg["HPG"]],
                               op=nl.multiply)
        if step > a and t["z_raw"] != None:  # noqa: E711
            _head_y(cfg, t, a, step - 1)
        if step == min(b, a + 2):
            _block_tail(cfg, t, pending)


def _block_decay_operand(cfg, t, a, b):
    """Wtb[k', (h, i)] = dt'A[k', h] (k' <= i), the segment-sum operand of the block's heads:
    one VectorE pass (the constant 0/1 mask U broadcast over the heads, dt'A along i)."""
    Q, nhp = cfg["Q"], cfg["nhp"]
    wt, U = t["Wtb"], t["U"]
    nisa.tensor_tensor(dst=wt.ap(pattern=[[wt.shape[1], Q], [Q, b - a], [1, Q]], offset=0),
                       data1=U.ap(pattern=[[U.shape[1], Q], [0, b - a], [1, Q]], offset=0),
                       data2=t["dtA"].ap(pattern=[[nhp, Q], [1, b - a], [0, Q]], offset=a),
                       op=nl.multiply, engine=nisa.engine.gpsimd)


def _head_a(cfg, t, a, k):
    """Stage A of head k (no VectorE result needed): per-token scalings, e^c y_off, the
    masked decay matrix E^T (exp on ScalarE), D x, the transposes of dy1, dy1 e^c, x dt',
    x dt' e^{c_end - c} ([P, Q]) and of S0, dSe ([P, N])."""
    Q, P, HPG, h0 = cfg["Q"], cfg["P"], cfg["HPG"], cfg["h0"]
    ntl, NT = cfg["ntl"], cfg["NT"]
    xw, dy1 = t["xw"], t["dy1"]
    dtp, ecs, wd = t["dtp"], t["ecs"], t["wd"]
    ST0, dST = t["ST0"], t["dST"]
    hA, hB, hC = _r(t, "hA", k), _r(t, "hB", k), _r(t, "hC", k)
    g = (h0 + k) // HPG
    cols = slice((k - a) * P, (k - a + 1) * P)
    xdt, Xd, dy1e = _r(t, "xdt", k), _r(t, "Xd", k), _r(t, "dy1e", k)
    ETm = _r(t, "ETm", k)
    yoff = t["yoffb"][:, cols]
    # in dependency order per engine queue: the work that needs only the block's inputs
    # (y_off, the transposes of dy1, S0, dSe) first, so TensorE runs it while GpSimd builds
    # the segment-sum operand
    nisa.tensor_scalar(dst=xdt, data=xw[:, cols], op0=nl.multiply, operand0=dtp[:, k:k + 1],
                       engine=nisa.engine.scalar)
    nisa.tensor_scalar(dst=Xd, data=xw[:, cols], op0=nl.multiply, operand0=wd[:, k:k + 1],
                       engine=nisa.engine.scalar)
    nisa.tensor_scalar(dst=dy1e, data=dy1[:, cols], op0=nl.multiply, operand0=ecs[:, k:k + 1],
                       engine=nisa.engine.scalar)
    # decay matrix E^T [j, i] = exp(sum_{j<k'<=i} dt'A) masked to j <= i: its operand is
    # head k's [Q, Q] of the block's Wtb (_block_decay_operand)
    Wt = t["Wtb"][:, (k - a) * Q:(k - a + 1) * Q]
    if t["z_raw"] != None and t["D"] != None:  # noqa: E711
        y1 = _r(t, "y1", k)             # D x (GpSimd, ahead of K in its queue)
        nisa.tensor_tensor(dst=y1, data1=xw[:, cols], data2=t["D"][0:Q, k * P:(k + 1) * P],
                           op=nl.multiply, engine=nisa.engine.gpsimd)
    # e^c y_off (V = dy1 . e^c y_off: the block's row dots)
    yo = hC[0:Q, P:2 * P]
    for ti in range(len(ntl)):
        nisa.nc_matmul(dst=yo, stationary=_tf(t, t["CT"][g][ti]), moving=_tf(t, ST0[ti][:, cols]),
                       accumulate=ti > 0)
    nisa.activation(dst=yoff, op=nl.copy, data=yo, scale=ecs[:, k:k + 1])
    # transposes: dy1 -> [P, Q]; S0, dSe -> [P, N] per dstate tile (two PSUM regions side by
    # side, one eviction per pair of tiles into S0 | dSe)
    nisa.nc_transpose(dst=hA[0:P, 2 * Q:3 * Q], data=dy1[:, cols])
    SD = _r(t, "SD", k)
    tiles = []
    for item in (ST0, dST):
        for ti in range(len(ntl)):
            tiles.append((item[ti][:, cols], ntl[ti][1]))
    d0 = 0
    for j in range(0, len(tiles), 2):
        w = 0
        for e in range(2):
            nisa.nc_transpose(dst=hB[0:P, 2 * Q + e * NT:2 * Q + e * NT + tiles[j + e][1]],
                              data=tiles[j + e][0])
            w = e * NT + tiles[j + e][1]
        nisa.tensor_copy(dst=SD[:, d0:d0 + w], src=hB[0:P, 2 * Q:2 * Q + w],
                         engine=nisa.engine.scalar)
        d0 += w
    # E^T: the segment sums, + _MASKED above the diagonal (an exact fp32 identity matmul
    # into the same PSUM), so the exp is 0 there: the causal mask costs TensorE, not a
    # VectorE pass
    nisa.nc_matmul(dst=hA[0:Q, 0:Q], stationary=_tf(t, t["Ls"]), moving=_tf(t, Wt), accumulate=False,
                   is_stationary_onezero=True)
    nisa.nc_matmul(dst=hA[0:Q, 0:Q], stationary=_tf(t, t["I"]), moving=_tf(t, t["NEG"]), accumulate=True,
                   is_stationary_onezero=True)
    nisa.activation(dst=ETm, op=nl.exp, data=hA[0:Q, 0:Q])
    # transposes: dy1 e^c, x dt', x dt' e^{c_end - c} -> [P, Q]; one eviction per pair
    nisa.nc_transpose(dst=hA[0:P, 3 * Q:4 * Q], data=dy1e)
    nisa.tensor_copy(dst=_r(t, "dTT", k), src=hA[0:P, 2 * Q:4 * Q], engine=nisa.engine.scalar)
    nisa.nc_transpose(dst=hB[0:P, 0:Q], data=xdt)
    nisa.nc_transpose(dst=hB[0:P, Q:2 * Q], data=Xd)
    nisa.tensor_copy(dst=_r(t, "xTT", k), src=hB[0:P, 0:2 * Q], engine=nisa.engine.scalar)


def _head_e(cfg, t, k):
    """E (the transpose of E^T: it waits on ScalarE's exp, so it is issued after the first
    part of the previous head's stage B) and K = E o CB of head k."""
    Q = cfg["Q"]
    hA = _r(t, "hA", k)
    Em = _r(t, "Em", k)
    nisa.nc_transpose(dst=hA[0:Q, Q:2 * Q], data=_r(t, "ETm", k))
    nisa.tensor_copy(dst=Em, src=hA[0:Q, Q:2 * Q], engine=nisa.engine.scalar)
    nisa.tensor_tensor(dst=_r(t, "K", k), data1=Em,
                       data2=t["CB"][(cfg["h0"] + k) // cfg["HPG"]], op=nl.multiply,
                       engine=nisa.engine.gpsimd)


def _head_y(cfg, t, a, k):
    """y0 = y_intra + e^c y_off and dz = dy silu'(z) (y0 + D x) of head k (issued after
    stage B of head k: y_intra waits on K^T, a VectorE result)."""
    Q, P = cfg["Q"], cfg["P"]
    dyz = t["dyz"]
    cols = slice((k - a) * P, (k - a + 1) * P)
    yi = _r(t, "hC", k)[0:Q, 0:P]
    xdt, KT, y0 = _r(t, "xdt", k), _r(t, "KT", k), _r(t, "y0", k)
    yoff = t["yoffb"][:, cols]
    nisa.nc_matmul(dst=yi, stationary=_tf(t, KT), moving=_tf(t, xdt), accumulate=False)
    if t["z_raw"] != None:  # noqa: E711
        nisa.tensor_tensor(dst=y0, data1=yoff, data2=yi, op=nl.add)
        y1 = y0
        if t["D"] != None:  # noqa: E711
            y1 = _r(t, "y1", k)
            nisa.tensor_tensor(dst=y1, data1=y1, data2=y0, op=nl.add)
        nisa.tensor_tensor(dst=t["dzo"][:, cols], data1=dyz[:, cols], data2=y1,
                           op=nl.multiply)


def _head_b(cfg, t, a, k):
    """Stage B of head k, first part (the matmuls that need only stage A's results, M and
    the dx state term's scaling): Z, Z^T, the two dx terms, C^T (dy1 e^c). With the second
    part (``_head_b2``): the intra-chunk ddA column, dC and dB (accumulated over the
    group's heads in one PSUM bank), dx, and the state gradient dS0^T = e^{c_end} dSe^T +
    C^T (dy1 e^c)."""
    Q, P, N, HPG, h0 = cfg["Q"], cfg["P"], cfg["N"], cfg["HPG"], cfg["h0"]
    ntl = cfg["ntl"]
    dy1, Cw = t["dy1"], t["Cw"]
    eex = t["eex"]
    dST = t["dST"]
    hA, hB, hC = _r(t, "hA", k), _r(t, "hB", k), _r(t, "hC", k)
    g = (h0 + k) // HPG
    n0 = g * N
    cols = slice((k - a) * P, (k - a + 1) * P)
    M = _r(t, "M", k)
    dy1T, xdtT = _r(t, "dTT", k)[:, 0:Q], _r(t, "xTT", k)[:, 0:Q]
    dxS = t["dxSb"][:, cols]
    # TensorE first takes what only needs stage A's results (Z, Z^T, the two dx terms, dS),
    # so the VectorE / ScalarE work between the dependent matmuls below overlaps them
    # dy1 (x dt')^T (over seg's PSUM region, read by now); Z = E o it in the second part
    nisa.nc_matmul(dst=hA[0:Q, 0:Q], stationary=_tf(t, dy1T), moving=_tf(t, xdtT), accumulate=False)
    # its transpose (x dt') dy1^T directly (over E's PSUM region, evicted by now): Z^T =
    # E^T o it needs no transpose of Z
    nisa.nc_matmul(dst=hA[0:Q, Q:2 * Q], stationary=_tf(t, xdtT), moving=_tf(t, dy1T),
                   accumulate=False)
    # dx = dt' (K^T dy1 + e^{c_end - c} B dSe^T) + D dy1 (DI = x . dxr, q' = x . dxS: the
    # block's row dots)
    dxa, dxb = hC[0:Q, 2 * P:3 * P], hC[0:Q, 3 * P:4 * P]
    nisa.nc_matmul(dst=dxa, stationary=_tf(t, _r(t, "K", k)), moving=_tf(t, dy1[:, cols]), accumulate=False)
    for ti in range(len(ntl)):
        nisa.nc_matmul(dst=dxb, stationary=_tf(t, t["BT"][g][ti]), moving=_tf(t, dST[ti][:, cols]),
                       accumulate=ti > 0)
    # C^T (dy1 e^c) per dstate tile into head k's hB region (its transposes were evacuated
    # in stage A), for dS0^T = e^{c_end} dSe^T + C^T (dy1 e^c) at the end
    for ti in range(len(ntl)):
        m0, nsz = ntl[ti]
        nisa.nc_matmul(dst=hB[0:nsz, ti * P:(ti + 1) * P],
                       stationary=_tf(t, Cw[:, n0 + m0:n0 + m0 + nsz]), moving=_tf(t, _r(t, "dy1e", k)),
                       accumulate=False)
    # dC, dB: the group's heads in this half of the head split accumulate in one PSUM
    # bank (both LNC configurations sum the same heads in the same order); the state
    # terms here, the Z terms in the second part
    lo, hi = _half(cfg, h0 + k)
    first = h0 + k == max(lo, g * HPG)
    nisa.nc_matmul(dst=t["dCB"][0:Q, 0:N], stationary=_tf(t, _r(t, "dTT", k)[:, Q:2 * Q]),
                   moving=_tf(t, _r(t, "SD", k)[:, 0:N]),
                   accumulate=not first)
    nisa.nc_matmul(dst=t["dCB"][0:Q, N:2 * N], stationary=_tf(t, _r(t, "xTT", k)[:, Q:2 * Q]),
                   moving=_tf(t, _r(t, "SD", k)[:, N:2 * N]), accumulate=not first)
    if t["D"] != None:  # noqa: E711
        nisa.tensor_tensor(dst=_r(t, "dD1", k), data1=dy1[:, cols],
                           data2=t["D"][0:Q, k * P:(k + 1) * P], op=nl.multiply,
                           engine=nisa.engine.gpsimd)
    # intra-chunk ddA_k' = sum_{j<k'} sum_{i>=k'} M_ij, M = Z o CB = (dy1 (x dt')^T) o K
    nisa.tensor_tensor(dst=M, data1=hA[0:Q, 0:Q], data2=_r(t, "K", k), op=nl.multiply)
    nisa.activation(dst=dxS, op=nl.copy, data=dxb, scale=eex[:, k:k + 1])


def _half(cfg, h):
    """The half of the LNC=2 head split head h is in: [lo, hi)."""
    if h >= cfg["hsplit"]:
        return cfg["hsplit"], cfg["H"]
    return 0, cfg["hsplit"]


def _head_b2(cfg, t, a, k):
    """Stage B of head k, second part: the matmuls that wait on VectorE (R, the Z terms of
    dC and dB), the masked R, dx and the state-gradient update."""
    Q, P, N, HPG, h0 = cfg["Q"], cfg["P"], cfg["N"], cfg["HPG"], cfg["h0"]
    ntl = cfg["ntl"]
    Bw, Cw = t["Bw"], t["Cw"]
    dtp, elast = t["dtp"], t["elast"]
    dST = t["dST"]
    hA, hB, hC = _r(t, "hA", k), _r(t, "hB", k), _r(t, "hC", k)
    h = h0 + k
    g = h // HPG
    n0 = g * N
    cols = slice((k - a) * P, (k - a + 1) * P)
    Zt, ZTt, M = _r(t, "Zt", k), _r(t, "ZTt", k), _r(t, "M", k)
    dxS, dxr = t["dxSb"][:, cols], t["dxrb"][:, cols]
    dxa = hC[0:Q, 2 * P:3 * P]
    # R = Li^T M [k', j] = sum_{i>=k'} M_ij (a 0/1 stationary), masked to j < k' into the
    # block's tile (its row sums, per head: the block's reduce); the Z / Z^T terms of dB /
    # dC (VectorE does Z while TensorE does R)
    nisa.nc_matmul(dst=hA[0:Q, 2 * Q:3 * Q], stationary=_tf(t, t["Li"]), moving=_tf(t, M), accumulate=False,
                   is_stationary_onezero=True)
    nisa.tensor_tensor(dst=Zt, data1=hA[0:Q, 0:Q], data2=_r(t, "Em", k), op=nl.multiply)
    nisa.tensor_tensor(dst=t["Xb"][:, (k - a) * Q:(k - a + 1) * Q], data1=hA[0:Q, 2 * Q:3 * Q],
                       data2=t["Ls"], op=nl.multiply)
    dCp, dBp = t["dCB"][0:Q, 0:N], t["dCB"][0:Q, N:2 * N]
    nisa.nc_matmul(dst=dBp, stationary=_tf(t, Zt), moving=_tf(t, Cw[:, n0:n0 + N]), accumulate=True)
    nisa.tensor_tensor(dst=ZTt, data1=hA[0:Q, Q:2 * Q], data2=_r(t, "ETm", k), op=nl.multiply)
    nisa.nc_matmul(dst=dCp, stationary=_tf(t, ZTt), moving=_tf(t, Bw[:, n0:n0 + N]), accumulate=True)
    lo, hi = _half(cfg, h)
    if h == min(hi, (g + 1) * HPG) - 1:
        o0 = n0
        if cfg["extra"] > 0 and g == cfg["gs"] and h >= cfg["hsplit"]:
            o0 = cfg["GN"]          # LNC=1: the straddling group's second-half partial
        nisa.tensor_copy(dst=t["dCt"][:, o0:o0 + N], src=dCp)
        nisa.tensor_copy(dst=t["dBt"][:, o0:o0 + N], src=dBp, engine=nisa.engine.scalar)
    nisa.tensor_tensor(dst=dxr, data1=dxa, data2=dxS, op=nl.add)
    if t["D"] != None:  # noqa: E711
        nisa.scalar_tensor_tensor(dst=t["dxo"][:, cols], data=dxr, op0=nl.multiply,
                                  operand0=dtp[:, k:k + 1], op1=nl.add,
                                  operand1=_r(t, "dD1", k))
    else:
        nisa.tensor_scalar(dst=t["dxo"][:, cols], data=dxr, op0=nl.multiply,
                           operand0=dtp[:, k:k + 1], engine=nisa.engine.scalar)
    for ti in range(len(ntl)):
        nsz = ntl[ti][1]
        nisa.scalar_tensor_tensor(dst=dST[ti][:, cols], data=dST[ti][:, cols],
                                  op0=nl.multiply, operand0=elast[0:nsz, k:k + 1], op1=nl.add,
                                  operand1=hB[0:nsz, ti * P:(ti + 1) * P])


def _chunk_dt(cfg, t):
    """ddA_k = Wc_k + sum_{i>=k} V_i + sum_{j<k} dt'_j q'_j + e^{c_end} <dSe, S0> (Wc the
    intra-chunk term; four accumulating matmuls), then ddt' = A ddA + DI, dA += dt' ddA, ddt = ddt' gate,
    ddt_bias += ddt."""
    Q, ntl, nhp = cfg["Q"], cfg["ntl"], cfg["nhp"]
    dtp = t["dtp"]
    nisa.tensor_tensor(dst=t["qv"], data1=t["qv"], data2=dtp, op=nl.multiply)
    dps = t["pc"][0:Q, 0:nhp]
    nisa.nc_matmul(dst=dps, stationary=t["I"], moving=t["Wc"], accumulate=False,
                   is_stationary_onezero=True)
    nisa.nc_matmul(dst=dps, stationary=t["Li"], moving=t["V"], accumulate=True)
    nisa.nc_matmul(dst=dps, stationary=t["Us"], moving=t["qv"], accumulate=True)
    for ti in range(len(ntl)):
        nsz = ntl[ti][1]
        Tn = t["Tn"][0:nsz, ti * nhp:(ti + 1) * nhp]
        nisa.tensor_tensor(dst=Tn, data1=Tn, data2=t["elast"][0:nsz, :], op=nl.multiply)
        nisa.nc_matmul(dst=dps, stationary=t["ones"][0:nsz, 0:Q], moving=Tn, accumulate=True)
    tmp = t["tmp"]
    nisa.tensor_tensor(dst=tmp, data1=dps, data2=dtp, op=nl.multiply)
    nisa.tensor_tensor(dst=t["accA"], data1=t["accA"], data2=tmp, op=nl.add)
    nisa.tensor_tensor(dst=tmp, data1=dps, data2=t["A"][0:Q, :], op=nl.multiply)
    nisa.tensor_tensor(dst=tmp, data1=tmp, data2=t["DI"], op=nl.add)
    nisa.tensor_tensor(dst=t["ddt"], data1=tmp, data2=t["gate"], op=nl.multiply)
    nisa.tensor_tensor(dst=t["accB"], data1=t["accB"], data2=t["ddt"], op=nl.add)
