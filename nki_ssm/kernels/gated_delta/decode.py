"""Gated DeltaNet recurrent decode (1..T tokens per sequence), state pool in place.

Math per value head ``hv`` (q/k head ``h = hv // (HV // H)``), state ``S [K, V]``::

    a = exp(g), kS = S^T k, qS = S^T q           (old state)
    u = beta (v - a kS)
    S' = a S + k u^T                             (= exp(g) S, then the delta update)
    o = S'^T (scale q) = a qS + (k . q) u        (scale folded into q)

With ``use_qk_l2norm`` the raw q, k enter the matmuls and the per-(token,
head) factors ``rk = 1/sqrt(|k|^2 + 1e-6)``, ``rq = scale/sqrt(|q|^2 + 1e-6)``
are applied to the small ``[V, HV]`` results (``kS``, ``qS``, ``k . q``) and
to ``u`` before the outer product (``k u^T = k_raw (rk u)^T``): the state is
never scaled by them.

Layout (every reduction is a TensorE contraction over partitions; the state's
decay and delta update are one VectorE instruction per head group; the DMA
moves the state in runs of 2 KiB):

* state of one sequence in SBUF ``S [P, HV*K*V/P]`` float32, R consecutive
  rows of one head per partition (``state_layout``: R the largest power of two
  dividing K with ``R*V*4 <= 2048`` bytes, 4 at V=128; NG heads share the
  partitions, the largest divisor of HV with ``NG*K/R <= 128``, 4 at K=128;
  QP = K/R partitions per head, P = NG*QP, NGR = HV/NG head groups):
  partition ``p = g*QP + kb`` holds, for each group G, rows ``kb*R + i``
  (i < R) of head ``hv = G*NG + g``: free ``(G, i, v)``. In the pool ``[slots,
  HV*K*V]`` (a slot one contiguous block) that is elements ``G*NG*K*V +
  p*R*V + i*V + v``: each partition reads NGR runs of ``R*V`` contiguous
  elements (2 KiB at V=128; a run of one row, 512 B, streams at a quarter of
  the rate when descriptors need 2 KiB, the slow end of ``dma_min_run_bytes``).
  A slot moves by one DMA per sequence (or per part, by head groups) with a
  run-time start: ``scalar_offset`` = the slot (``nisa.scalar_load`` of a
  column of the iteration's ``[1, width]`` int32 slot row, loaded with the
  inputs), ``indirect_dim=0``, a static pattern;
* per token: ``[kS | qS]`` for all heads lands in one PSUM tile ``[V, 2*HV]``
  (v on partitions) from HV matmuls: per group G, R matmuls (stationary the
  ``[P, V]`` slice of row i of every partition, moving ``[P, 2*NG]``)
  accumulating into the group's ``2*NG`` columns; the moving operand is
  block-diagonal over the group's heads (``mx[(g, kb), (g', c)] = kq_c[kb*R+i]
  * (g == g')``, built once per iteration on VectorE from the ``kx`` table and
  the 0/1 ``blk [P, NG]``), so each head sums only its own partitions. The
  gate/norm math runs on ``[V, HV]`` tiles; ``rk u`` is transposed on TensorE
  (``[HV, V]``, evicted on ScalarE); per group, the rows ``rk u_hv`` go to
  their partitions by a 0/1 matmul (stationary ``sel[:, G] [HV, P]``,
  ``sel[hv, p] = (hv == G*NG + g)``, moving ``uT``; 512 // V groups per PSUM
  bank); ScalarE scales them by ``k`` (``activation`` copy, ``scale`` the
  per-partition column of row ``kb*R + i``: R instructions of V elements per
  group, PSUM -> SBUF ``kub [P, R*V]``) and VectorE applies decay and update in
  one pass, ``S_G = a_G S_G + kub`` (``scalar_tensor_tensor``, ``a_G`` the
  per-partition decay column ``decp``: partition (g, kb) holds head G*NG + g's);
* gates and per-head parameters are broadcast over partitions on TensorE
  (ones ``[1, P]`` stationary, exact 0/1 matmul), sums of squares and
  ``k . q`` over K with a ones ``[K, P]`` stationary (fp32, exact products
  summed in fp32); the decay per partition of the state layout, ``decp [P,
  (jt, G)]``, is the broadcast decay masked by ``blk`` and summed over the
  group's heads (one nonzero term: exact).

Work list and loops
-------------------
Compile-time arguments: shapes (sequence bucket, T, heads, K, V, slots),
dtypes and the layer flags (raw_gates, use_qk_l2norm, scale, want_inter);
batch composition is run-time int32 data the launcher builds
(``nki_ssm.ops.launch.gated_delta.decode_order``): live sequences compacted
first; with E live per program and SPI positions per group (``decode_plan``:
16 // T rounded down to a multiple of 4, at least 4, at most the bucket),
the first ``n_main = E // SPI`` groups run in the main loop, the remaining
``E - n_main*SPI`` positions in ``n_tail`` batches of W = min(2, bucket)
positions in the tail loop; a tail position past E mirrors the first of
its batch (same inputs, same slot: both states are gathered before either
is scattered, and both write the same bytes). ``counts [1, 3]``, the one
row every program reads: ``n_main, n_tail`` and the spare flag, loaded as
``NkiScalar`` s (``scaffold.trip_counts``) before the loops.

LNC grid: launched as ``kernel[2]`` the kernel runs as two programs, one per
physical core of the logical core (``scaffold.lnc_grid``; a launch without a
grid is one program: ``nl.program_ndim() == 0``, as nki-library
attention_bwd.py:1134-1137 tests). The launcher splits the compacted live
sequences into two consecutive runs of E = n_live // 2 and lays out each run
as a bucket of half the size, so both programs run the same trip counts;
with an odd n_live the last live sequence is program 0's spare batch (the
last row of its tail block), run under ``nl.if_else`` on the spare flag
after the loops, while program 1 takes the same branch on a dump batch
whose slot 0 names a private one-slot dump of the pool (``scaffold.dump_rows``;
its o / intermediate rows are its own and never read). Every table stacks the
programs' rows (program 0's, then program 1's); program ``pid`` reads and
writes only rows ``[pid*rows, (pid+1)*rows)`` of each, a static offset added
to the loop's row. Both programs run the same instruction stream (same
program size) over disjoint sequences: no pool slot is touched by both, no
output row is written by both, and no synchronisation is needed. Each program
moves its half of the states on its own core's DMA queues: at 64 sequences
each does the work of a 32-sequence bucket.

Two runtime loops, ``nl.fori_loop(0, n, body)`` with ``body`` an inner
function (``scaffold.work_loop``), one after the other, none nested (every
instruction sits in at most one runtime loop), then the spare batch; what is
unrolled in a body is bounded by SPI, T and the heads. A bucket (per program)
of one or two sequences has no main loop.

* Main loop, iteration ``it`` (an ``NkiScalar``, the ``scalar_offset`` on
  dim 0 of every per-iteration table): the inputs of SPI positions in one DMA
  each; the gate math for all of them; then NB = SPI / 2 batches of two
  sequences whose per-token instruction streams are interleaved (one
  sequence's matmuls fill the other's waits). Software pipeline over three
  state sets allocated before the loop: batch b+2's states are gathered
  while batch b runs; the iteration's first two batches are gathered when it
  starts (nothing is prefetched across iterations: nki-library turns that
  off for dynamic loops, NKI-1582). Every pool access has a run-time start,
  so each spans the whole pool for the dependencies: a gather issued after a
  scatter waits for it, a scatter for every earlier gather and scatter (each
  such hand-over leaves the DMA queues idle for the completion and fixed
  latencies, ~1.2 us; reads after reads overlap). Every position of a main
  iteration is live: no run-time conditional.
* Tail loop: one batch per iteration, each state gathered and scattered in
  ``min(4, NGR)`` parts by head group so the first groups' reductions overlap
  the rest of the gather and their scatter the rest of the update; it reuses
  the main loop's first state set. The spare batch is one more such batch.

Per token and sequence at Qwen3-Next (HV=32, K=V=128; R=4, NG=4, P=128,
NGR=8): TensorE HV = 32 reduction matmuls (fp32, moving 8 columns), NGR = 8
broadcast matmuls (0/1 stationary, 128 columns), one transpose and the gate
broadcasts; ScalarE HV*R/NG = 32 k-scalings of V elements and the transpose's
eviction (plus the gates' activation functions per iteration and, for a
bfloat16 pool, the widening / rounding of the state); VectorE NGR = 8
``scalar_tensor_tensor`` of R*V = 512 elements (decay and update) and ~10
small ``[V, HV]`` ops; DMA the state of every sequence in and out
(``2*HV*K*V*4`` bytes with a float32 pool) in 2 KiB runs, plus ``HV*K*V`` per
token with ``want_inter``, and small input / output rows per iteration.

What binds (modeled, trn2, nki_ssm.perf as of this commit, ``python -m simulate
--op gated_delta_decode``; Qwen3-Next H=16 HV=32 K=V=128, T=1, raw gates, l2norm,
float32 pool, bf16 q/k/v): moving the states. 64 sequences 975 us (10-90 %:
948 us-1.21 ms, 1.24x), 277 GB/s (75 % of the core's DMA bandwidth; DMA queues
90 % busy, ScalarE 59 %, VectorE 58 %, TensorE 43 %) at LNC=1; at LNC=2 0.50x.
The idle 10 % of the queues is the pool hand-overs (~80 of ~1.2 us: one per
scatter and one per gather-after-scatter); the slow end of the interval is
``dma_sustained``. 1 / 32 / 512 sequences: 29.5 us / 489 us / 7.78 ms; 16
sequences of T=2 tokens 484 us. Executed per 64-sequence call: 2,116 ScalarE
activations, 1,010 VectorE instructions, 2,636 TensorE, 155 DMAs. Program:
1,911 static instructions per program (64-sequence bucket, every loop body and
the spare batch once; the same at 512). Tried and slower: the update as one
``scalar_tensor_tensor`` per row i with k as the scalar operand (4x the VectorE
instructions: VectorE binds at 1.11 ms); two state sets (1.015 ms: every
gather waits for the scatter before it). Not tried, estimated slower: the outer
products ``k u^T`` on TensorE (fp32, one matmul of V moving columns per group
and row i: ~20K TensorE cycles per sequence, TensorE would bind).

HBM arguments (prepared by the launcher, ``nki_ssm.ops.launch.gated_delta``),
one row per loop iteration, for the main loop (``*_main``, width SPI, rows
``n_prog * (bucket // n_prog // SPI)``; None without a main loop) and the tail
loop (``*_tail``, width W, rows ``n_prog * (SPI // W)``), program 0's rows
first; columns run over (position j of the row, token t, head), head fastest;
all float32 (the launcher widens q/k/v: no DMA converts a dtype):
  kq     ``[rows, K, width*T*H*2]``: row i, partition k, column
         ``((j*T + t)*H + h)*2 + c`` holds ``k`` (c=0) / ``q`` (c=1);
  kx     ``[rows, P, width*T*NGR*R*2]``: k / q in the state layout, partition
         ``g*QP + kb``, column ``(((j*T + t)*NGR + G)*R + i)*2 + c`` holds row
         ``kb*R + i`` of ``k`` / ``q`` of value head ``G*NG + g``'s q/k head;
  v      ``[rows, V, width*T*HV]``: partition v, column ``(j*T + t)*HV + hv``;
  gate   ``[rows, 2, width*T*HV]``: g and beta (raw: a and b), columns as v;
  slots  int32 ``[rows, width]``: pool slot of each position (the tail tables
         hold one spare row per program after its tail rows);
  head_params ``[1, 2*HV]`` (A_log then dt_bias) or None (g / beta given);
  blk    ``[P, NG]`` 0/1: ``blk[p, g'] = (p // QP == g')``;
  sel    ``[HV, NGR*P]`` 0/1: ``sel[hv, G*P + p] = (hv == G*NG + p // QP)``;
  pool   ``[slots, HV*K*V]`` float32 or bfloat16, updated in place;
  counts int32 ``[1, 3]``: main and tail trip counts and the spare flag.
Returns ``o [rows, V, width*T*HV]`` float32 per loop (v-major; the launcher
transposes and un-permutes) and, with ``want_inter``, ``inter [rows,
width*T*HV*K, V]`` per loop in the pool dtype (state after each token, rows
``((j*T + t)*HV + hv)*K + k``): ``(o_main, o_tail[, inter_main,
inter_tail])``, or the tail's alone without a main loop. Rows the loops do
not reach are never written (the launcher zeroes padding sequences).

Limits: K, V, HV <= 128; ``2*HV <= 512``; the broadcasts of ``rk u`` run over
``max(1, 512 // V)`` head groups per PSUM bank. Numerics: all float32 (state,
gates, matmuls: fp32 TensorE operands; the reductions sum R partial matmuls
in PSUM); a bfloat16 pool is widened on ScalarE after its
same-dtype gather, and the pool and intermediates are rounded once (RNE)
on ScalarE before their same-dtype store.

Constructs whose evidence is documentation only: the scaffolding of
``nki_ssm.kernels.scaffold`` (its docstring: ``nl.fori_loop`` with an
inner-function body and ``NkiScalar`` bounds, the iteration value and table
cells as ``scalar_offset`` with ``indirect_dim=0``, ``nisa.scalar_load`` (of a
``[1, 1]`` slice of a tile: the ``scalar_store`` page),
``nl.if_else``; NKI 0.8.0 docs); ``nl.softplus`` as an
``activation`` function (nki.api.shared.rst, "Supported Activation
Functions"). Everything else follows released nki-library kernels.
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels.gated_delta._common import consecutive_groups
from nki_ssm.kernels.scaffold import (at_row, dump_rows, lnc_grid, run_if, trip_counts,
                                      work_loop)

_STREAMS = 2          # sequences whose per-token instruction streams are interleaved (a batch)
_SETS = 3             # state sets of the main loop (gathers run _SETS - 1 batches ahead)
_PARTS = 4            # state DMAs per sequence in the tail loop (one batch per iteration: latency)
_L2NORM_EPS = 1e-6    # FLA / transformers: x / sqrt(sum x^2 + eps)
_MM_COLS = 512        # moving columns of one fp32 matmul (one PSUM bank on trn2)
_RUN_BYTES = 2048     # DMA run the state layout aims at (a partition's contiguous bytes per head group)


@nki.jit
def gdn_decode_step(kq_main, kx_main, v_main, gate_main, slots_main, kq_tail, kx_tail, v_tail,
                    gate_tail, slots_tail, head_params, blk, sel, pool, counts, T, H, raw_gates,
                    use_qk_l2norm, scale, want_inter):
    """Recurrent gated delta rule for T tokens per sequence (layouts in the module docstring).

    Two runtime loops, one after the other: the main loop over full groups of SPI
    positions (absent when the ``*_main`` tables are None), then the tail loop over
    single batches of W positions; then the spare batch under ``nl.if_else``. ``counts
    [1, 3]`` int32, the one row every program reads: the two trip counts and the spare
    flag (program ``pid`` runs its own rows of every table)."""
    # the LNC grid: program pid runs rows [pid*rows, (pid+1)*rows) of every table (a static
    # offset); no grid (a plain launch) is one program
    n_prog, pid = lnc_grid()
    n_tail_rows = kq_tail.shape[0] // n_prog
    K = kq_tail.shape[1]
    V = v_tail.shape[1]
    W = slots_tail.shape[1]
    HV = v_tail.shape[2] // (W * T)
    lay = _layout(K, V, HV, blk.shape[0], blk.shape[1])
    PB = K
    if V > PB:
        PB = V
    if lay["P"] > PB:
        PB = lay["P"]
    cst = _constants(head_params, blk, sel, HV, K, PB, raw_gates)
    has_main = kq_main != None  # noqa: E711  (NKI has no `is`)

    # trip counts and the spare flag: device scalars of the one counts row both programs
    # read, so both run the same loops and take the same branch
    n_main, n_tail, spare = trip_counts(counts)

    o_tail, inter_tail = _outputs(n_prog * n_tail_rows, W, T, HV, K, V, pool.dtype, want_inter)
    tail_at = pid * n_tail_rows
    parts = min(_PARTS, lay["NGR"])
    tail_states = None
    o_main = None
    inter_main = None
    if has_main:
        n_main_rows = kq_main.shape[0] // n_prog
        SPI = slots_main.shape[1]
        o_main, inter_main = _outputs(n_prog * n_main_rows, SPI, T, HV, K, V, pool.dtype,
                                      want_inter)
        main_at = pid * n_main_rows
        batches = consecutive_groups(SPI, _STREAMS)
        NB = len(batches)
        # NB batches per iteration, software-pipelined inside it: batch b+1's states are
        # gathered while batch b runs; the iteration's first batch is gathered when it
        # starts (nothing is prefetched across iterations: nki-library turns that off for
        # dynamic loops, NKI-1582). Two state sets alternate. Every position of a main
        # iteration is live.
        sets = []
        for q in range(_SETS):
            sets.append(_new_states(_STREAMS, pool, lay, 1))

        def main_body(it):
            at = (it, main_at)
            io = _load_group(kq_main, kx_main, v_main, gate_main, cst, lay, at, SPI, T, H, HV,
                             K, V, PB, raw_gates, use_qk_l2norm, scale)
            sl = _load_slots(slots_main, at)
            for bi in range(min(_SETS - 1, NB)):
                _gather(sets[bi], pool, sl, batches[bi], lay)
            for bi in range(NB):
                if bi + _SETS - 1 < NB:
                    _gather(sets[(bi + _SETS - 1) % _SETS], pool, sl, batches[bi + _SETS - 1],
                            lay)
                _run_batch(io, cst, lay, inter_main, sets[bi % _SETS], at, batches[bi], T, HV,
                           K, V, want_inter, pool)
            _store_o(o_main, io, at)

        work_loop(n_main, main_body)
        # the tail reuses the first state set's tiles, moved in parts
        tail_states = []
        for j in range(W):
            tail_states.append({"nat": sets[0][j]["nat"], "parts": parts})
    else:
        tail_states = _new_states(W, pool, lay, parts)

    # one batch of W positions per iteration (the live positions after the last full
    # group; a second position past the live count mirrors the first: same slot, same
    # inputs, bit-identical bytes written after both gathers). Each state moves in
    # parts (by head group) so the first groups' reductions overlap the rest of the
    # gather, and their scatter the rest of the update.
    tail_batch = []
    for j in range(W):
        tail_batch.append(j)

    def batch_at(at, batch_pool):
        io = _load_group(kq_tail, kx_tail, v_tail, gate_tail, cst, lay, at, W, T, H, HV, K, V,
                         PB, raw_gates, use_qk_l2norm, scale)
        _gather(tail_states, batch_pool, _load_slots(slots_tail, at), tail_batch, lay)
        _run_batch(io, cst, lay, inter_tail, tail_states, at, tail_batch, T, HV, K, V,
                   want_inter, batch_pool)
        _store_o(o_tail, io, at)

    def tail_body(it):
        batch_at((it, tail_at), pool)

    work_loop(n_tail, tail_body)

    # the spare batch (the last row of the program's tail block; LNC=2 with an odd number
    # of live sequences): program 0's last live sequence; the other program takes the same
    # branch on a dump batch whose slot 0 names a private one-slot dump of the pool (its
    # o / intermediate rows are its own, never read): nothing real is written
    spare_pool = pool
    if pid != 0:
        spare_pool = dump_rows(pool, 1)

    def spare_batch():
        batch_at((None, tail_at + n_tail_rows - 1), spare_pool)

    run_if(spare, spare_batch)
    if has_main:
        if want_inter:
            return o_main, o_tail, inter_main, inter_tail
        return o_main, o_tail
    if want_inter:
        return o_tail, inter_tail
    return o_tail


def state_layout(K, V, HV):
    """(R, NG): the state's SBUF layout (module docstring, "Layout"). R rows of one head per
    partition (the largest power of two dividing K with ``R*V*4 <= 2048`` bytes, a DMA run),
    NG heads sharing the partitions (the largest divisor of HV with ``NG*K/R <= 128``)."""
    R = 1
    while K % (R * 2) == 0 and R * 2 * V * 4 <= _RUN_BYTES:
        R = R * 2
    NG = 1
    for d in range(1, HV + 1):
        if HV % d == 0 and d * (K // R) <= 128:
            NG = d
    return R, NG


def _layout(K, V, HV, P, NG):
    """The layout figures: R rows per partition, QP = K/R partitions per head, NG heads per
    partition group (P = NG*QP partitions), NGR = HV/NG groups."""
    QP = P // NG
    return {"R": K // QP, "QP": QP, "NG": NG, "P": P, "NGR": HV // NG}


def _constants(head_params, blk, sel, HV, K, PB, raw_gates):
    """Ones for the partition broadcasts and sums; the layout's 0/1 tables (``blk [P, NG]``:
    partition p belongs to head g of its group; ``sel [HV, NGR*P]``: head hv of group G lands
    on partition p); with raw gates -exp(A_log) and dt_bias ``[PB, HV]`` on every partition
    (from ``head_params [1, 2*HV]`` float32)."""
    cst = {}
    cst["ones_row"] = nl.ndarray((1, PB), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=cst["ones_row"], value=1.0)
    cst["ones_kp"] = nl.ndarray((K, PB), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=cst["ones_kp"], value=1.0)
    cst["blk"] = nl.ndarray(blk.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cst["blk"], src=blk)
    cst["sel"] = nl.ndarray(sel.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cst["sel"], src=sel)
    if raw_gates:
        hp = nl.ndarray((1, 2 * HV), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=hp, src=head_params)
        hp_b = nl.ndarray((PB, 2 * HV), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=hp_b, stationary=cst["ones_row"], moving=hp,
                       is_stationary_onezero=True, accumulate=False)
        neg_A = nl.ndarray((PB, HV), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=neg_A, op=nl.exp, data=hp_b[:, 0:HV])
        nisa.tensor_scalar(dst=neg_A, data=neg_A, op0=nl.multiply, operand0=-1.0)
        dt_b = nl.ndarray((PB, HV), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=dt_b, src=hp_b[:, HV:2 * HV])
        hp_b = None
        cst["neg_A"] = neg_A
        cst["dt_b"] = dt_b
    return cst


def _outputs(rows, width, T, HV, K, V, pool_dtype, want_inter):
    """o ``[rows, V, width*T*HV]`` float32 and, with want_inter, the states after each
    token ``[rows, width*T*HV*K, V]`` in the pool dtype (else None)."""
    o = nl.ndarray((rows, V, width * T * HV), dtype=nl.float32, buffer=nl.shared_hbm)
    inter = None
    if want_inter:
        inter = nl.ndarray((rows, width * T * HV * K, V), dtype=pool_dtype,
                           buffer=nl.shared_hbm)
    return o, inter


def _row_ap(tab, at, pattern, offset):
    """``tab`` (HBM ``[rows, ...]``) at row ``base + it`` (``at = (it, base)``: the loop's
    iteration value, an NkiScalar or None, and a static row, a Python int), ``pattern``
    from element ``offset`` of that row."""
    it, base = at
    row = 1
    for d in tab.shape[1:]:
        row = row * d
    return at_row(tab, it, pattern, base * row + offset)


def _store_o(o, io, at):
    """o row ``at`` ``[V, width]`` in one DMA."""
    rows, V, width = o.shape
    nisa.dma_copy(dst=_row_ap(o, at, [[width, V], [1, width]], 0), src=io["ot"])


def _state_pattern(lay, V, ng):
    """Partition p = (g, kb) -> R*V contiguous elements at ``p*R*V``, for ``ng`` head
    groups of ``NG*K*V`` elements each."""
    RV = lay["R"] * V
    return [[RV, lay["P"]], [lay["NG"] * lay["QP"] * RV, ng], [1, RV]]


def _pool_view(pool, slot, lay, G0, ng, V):
    """Head groups [G0, G0+ng) of one sequence's state in the pool ``[slots, HV*K*V]``: the
    slot's contiguous block at a run-time start (``slot``: an NkiScalar), runs of R*V
    contiguous elements (a static pattern, no per-partition indices)."""
    GKV = lay["NG"] * lay["QP"] * lay["R"] * V
    return pool.ap(pattern=_state_pattern(lay, V, ng), offset=G0 * GKV, scalar_offset=slot,
                   indirect_dim=0)


def _part_groups(NGR, parts, k):
    """Head groups [a, b) of state part k of ``parts``."""
    return (k * NGR) // parts, ((k + 1) * NGR) // parts


def _new_states(n, pool, lay, parts):
    """Per sequence of a batch: {nat [P, HV*K*V/P] pool dtype (the state layout), parts};
    ``_gather`` adds ``at``, the slot as an NkiScalar."""
    out = []
    F = pool.shape[1] // lay["P"]
    for j in range(n):
        st = {}
        st["nat"] = nl.ndarray((lay["P"], F), dtype=pool.dtype, buffer=nl.sbuf)
        st["parts"] = parts
        out.append(st)
    return out


def _load_slots(pool_slots, at):
    """The pool slots of slot row ``at`` (``(it, base)``; ``it`` None: the static row
    ``base``) as one ``[1, width]`` int32 tile, in one small DMA issued with the inputs
    (ahead of the state transfers, so no gather waits behind a state DMA for its slot)."""
    n_rows, spi = pool_slots.shape
    it, base = at
    sl = nl.ndarray((1, spi), dtype=nl.int32, buffer=nl.sbuf)
    if it == None:  # noqa: E711  (NKI has no `is`)
        src = pool_slots[base:base + 1, 0:spi]
    else:
        src = _row_ap(pool_slots, at, [[spi, 1], [1, spi]], 0)
    nisa.dma_copy(dst=sl, src=src)
    return sl


def _gather(states, pool, slots, seqs, lay):
    """Gather the states of positions ``seqs`` (pool slots: columns of ``slots [1, width]``,
    ``_load_slots``) into ``states``, each in its ``parts`` DMAs."""
    for j in range(len(seqs)):
        st = states[j]
        st["at"] = nisa.scalar_load(slots[0:1, seqs[j]:seqs[j] + 1])
        GF = st["nat"].shape[1] // lay["NGR"]
        V = GF // lay["R"]
        for k in range(st["parts"]):
            a, b = _part_groups(lay["NGR"], st["parts"], k)
            nisa.dma_copy(dst=st["nat"][:, a * GF:b * GF],
                          src=_pool_view(pool, st["at"], lay, a, b - a, V))


def _scatter_groups(pool, st, lay, a, b):
    """Head groups [a, b) of one sequence's updated state back to its slot (rounded once
    to the pool dtype)."""
    GF = st["nat"].shape[1] // lay["NGR"]
    V = GF // lay["R"]
    if pool.dtype != nl.float32:
        nisa.tensor_copy(dst=st["nat"][:, a * GF:b * GF], src=st["S"][:, a * GF:b * GF],
                         engine=nisa.engine.scalar)
    nisa.dma_copy(dst=_pool_view(pool, st["at"], lay, a, b - a, V),
                  src=st["nat"][:, a * GF:b * GF])


def _store_state(inter, S, lay, at, row0, V):
    """S [P, HV*K*V/P] (inter's dtype) -> inter row ``at``, its rows row0 + hv*K + k."""
    nisa.dma_copy(dst=_row_ap(inter, at, _state_pattern(lay, V, lay["NGR"]), row0 * V), src=S)


def _partition_sums(dst, data, ones_kp, width):
    """dst [PB, width] (SBUF) = column sums of data [K, width] on every partition
    (0/1 matmuls; with K = 1 this broadcasts a row [1, width] exactly)."""
    for c0 in range(0, width, _MM_COLS):
        w = min(_MM_COLS, width - c0)
        ps = nl.ndarray((dst.shape[0], w), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=ones_kp, moving=data[:, c0:c0 + w],
                       is_stationary_onezero=True, accumulate=False)
        nisa.tensor_copy(dst=dst[:, c0:c0 + w], src=ps)
        ps = None


def _repeat_rows(src, n):
    """``src [P, F]`` (a whole tile) as a ``[P, n, F]`` view repeating it n times (zero stride)."""
    P, F = src.shape
    return src.ap(pattern=[[F, P], [0, n], [1, F]], offset=0)


def _per_value_head(dst, src, n, rep):
    """dst [P, n*rep] = src [P, n] with each column repeated for the rep value heads."""
    P = src.shape[0]
    view = src.ap(pattern=[[n, P], [1, n], [0, rep]], offset=0)   # zero-stride repeat
    nisa.tensor_copy(dst=dst.reshape((P, n, rep)), src=view)


def _load_group(kq_tab, kx_tab, v_tab, gate_tab, cst, lay, at, n, T, H, HV, K, V, PB,
                raw_gates, use_qk_l2norm, scale):
    """Inputs of the n sequence positions of loop row ``at`` (``(it, base)``: row ``base +
    it`` of each float32 table) in one DMA each, and everything that does not depend on the
    state: gates (dec = exp(g), beta), k.q and the l2norm factors, per value head; the
    decay per partition of the state layout and the block-diagonal moving operands of the
    reductions. Column of (position j, token t, value head hv): (j*T + t)*HV + hv."""
    THV = T * HV
    NT = n * T          # (sequence, token) pairs of the iteration
    NTH = NT * H
    P = lay["P"]
    NG = lay["NG"]
    NGR = lay["NGR"]
    R = lay["R"]
    io = {}
    kq = nl.ndarray((K, NTH * 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=kq, src=_row_ap(kq_tab, at, [[NTH * 2, K], [1, NTH * 2]], 0))
    # k / q in the state layout: partition (g, kb), column ((jt*NGR + G)*R + i)*2 + c
    XW = NT * NGR * R * 2
    kx = nl.ndarray((P, XW), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=kx, src=_row_ap(kx_tab, at, [[XW, P], [1, XW]], 0))
    io["kx"] = kx
    # the reductions' moving operands: block-diagonal over the heads of a group,
    # mx[(g, kb), (jt, G, i), g', c] = kx[(g, kb), (jt, G, i), c] * (g == g')
    mx = nl.ndarray((P, NT * NGR * R * NG * 2), dtype=nl.float32, buffer=nl.sbuf)
    NX = NT * NGR * R
    nisa.tensor_tensor(dst=mx.reshape((P, NX, NG, 2)),
                       data1=kx.ap(pattern=[[XW, P], [2, NX], [0, NG], [1, 2]], offset=0),
                       data2=cst["blk"].ap(pattern=[[NG, P], [0, NX], [1, NG], [0, 2]],
                                           offset=0),
                       op=nl.multiply)
    io["mx"] = mx
    io["vt"] = nl.ndarray((V, n * THV), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=io["vt"], src=_row_ap(v_tab, at, [[n * THV, V], [1, n * THV]], 0))
    # g and beta (or a and b) rows are contiguous in the row: one DMA to one partition
    grow = nl.ndarray((1, 2 * n * THV), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=grow, src=_row_ap(gate_tab, at, [[2 * n * THV, 1], [1, 2 * n * THV]],
                                        0))
    io["ot"] = nl.ndarray((V, n * THV), dtype=nl.float32, buffer=nl.sbuf)

    # gates on every partition
    gb = nl.ndarray((PB, 2 * n * THV), dtype=nl.float32, buffer=nl.sbuf)
    _partition_sums(gb, grow, cst["ones_row"], 2 * n * THV)
    dec = nl.ndarray((PB, n * THV), dtype=nl.float32, buffer=nl.sbuf)
    beta = nl.ndarray((PB, n * THV), dtype=nl.float32, buffer=nl.sbuf)
    if raw_gates:
        # g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)
        x3 = dec.reshape((PB, NT, HV))
        nisa.tensor_tensor(dst=x3, data1=gb[:, 0:n * THV].reshape((PB, NT, HV)),
                           data2=_repeat_rows(cst["dt_b"], NT), op=nl.add)
        nisa.activation(dst=dec, op=nl.softplus, data=dec)
        nisa.tensor_tensor(dst=x3, data1=x3,
                           data2=_repeat_rows(cst["neg_A"], NT),
                           op=nl.multiply)
        nisa.activation(dst=dec, op=nl.exp, data=dec)
        nisa.activation(dst=beta, op=nl.sigmoid, data=gb[:, n * THV:2 * n * THV])
    else:
        nisa.activation(dst=dec, op=nl.exp, data=gb[:, 0:n * THV])
        nisa.tensor_copy(dst=beta, src=gb[:, n * THV:2 * n * THV])
    io["dec"] = dec
    io["beta"] = beta
    # the decay of head (G, g) on partitions (g, kb): decp [P, (jt, G)] = sum over g' of
    # dec[jt, G*NG + g'] * (g == g') (one nonzero term: exact)
    dsel = nl.ndarray((P, NT * NGR * NG), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dsel.reshape((P, NT * NGR, NG)),
                       data1=dec.ap(pattern=[[n * THV, P], [NG, NT * NGR], [1, NG]], offset=0),
                       data2=cst["blk"].ap(pattern=[[NG, P], [0, NT * NGR], [1, NG]], offset=0),
                       op=nl.multiply)
    io["decp"] = nl.ndarray((P, NT * NGR), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=io["decp"], op=nl.add, data=dsel.reshape((P, NT * NGR, NG)),
                       axis=2)

    # per (sequence, token, q/k head): k.q and the l2norm factors, on every partition
    rep = HV // H
    kq3 = kq.reshape((K, NTH, 2))
    prod = nl.ndarray((K, NTH), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod.reshape((K, NTH, 1)), data1=kq3[:, :, 0:1],
                       data2=kq3[:, :, 1:2], op=nl.multiply)
    dot = nl.ndarray((PB, NTH), dtype=nl.float32, buffer=nl.sbuf)
    _partition_sums(dot, prod, cst["ones_kp"], NTH)
    rq = nl.ndarray((PB, NTH), dtype=nl.float32, buffer=nl.sbuf)
    io["rkv"] = None
    if use_qk_l2norm:
        sq = nl.ndarray((K, NTH * 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=sq, data1=kq, data2=kq, op=nl.multiply)
        rn = nl.ndarray((PB, NTH * 2), dtype=nl.float32, buffer=nl.sbuf)
        _partition_sums(rn, sq, cst["ones_kp"], NTH * 2)
        nisa.tensor_scalar(dst=rn, data=rn, op0=nl.add, operand0=_L2NORM_EPS)
        nisa.activation(dst=rn, op=nl.rsqrt, data=rn)
        rn3 = rn.reshape((PB, NTH, 2))
        rk = nl.ndarray((PB, NTH), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=rk.reshape((PB, NTH, 1)), src=rn3[:, :, 0:1])
        nisa.tensor_scalar(dst=rq.reshape((PB, NTH, 1)), data=rn3[:, :, 1:2],
                           op0=nl.multiply, operand0=scale)
        nisa.tensor_tensor(dst=dot, data1=dot, data2=rk, op=nl.multiply)
        nisa.tensor_tensor(dst=dot, data1=dot, data2=rq, op=nl.multiply)
        io["rkv"] = nl.ndarray((PB, n * THV), dtype=nl.float32, buffer=nl.sbuf)
        _per_value_head(io["rkv"], rk, NTH, rep)
    else:
        nisa.memset(dst=rq, value=scale)
        nisa.tensor_scalar(dst=dot, data=dot, op0=nl.multiply, operand0=scale)
    io["dotv"] = nl.ndarray((PB, n * THV), dtype=nl.float32, buffer=nl.sbuf)
    _per_value_head(io["dotv"], dot, NTH, rep)
    io["rqv"] = nl.ndarray((PB, n * THV), dtype=nl.float32, buffer=nl.sbuf)
    _per_value_head(io["rqv"], rq, NTH, rep)
    return io


def _run_batch(io, cst, lay, inter, got, at, seqs, T, HV, K, V, want_inter, pool):
    """All T tokens of the batch's sequences, their instruction streams interleaved:
    per token, every sequence's front half (reductions, o, u, decay) is issued before any
    back half (u broadcast and state update), so one sequence's matmuls and vector work
    fill the other's waits."""
    GF = lay["R"] * V
    for j in range(len(seqs)):
        st = got[j]
        if st["nat"].dtype == nl.float32:
            st["S"] = st["nat"]
        else:
            st["S"] = nl.ndarray(st["nat"].shape, dtype=nl.float32, buffer=nl.sbuf)
            for k in range(st["parts"]):
                a, b = _part_groups(lay["NGR"], st["parts"], k)
                nisa.tensor_copy(dst=st["S"][:, a * GF:b * GF], src=st["nat"][:, a * GF:b * GF],
                                 engine=nisa.engine.scalar)
    for t in range(T):
        uts = []
        for j in range(len(seqs)):
            jt = seqs[j] * T + t
            uts.append(_front(io, lay, got[j]["S"], jt, HV, K, V))
        for j in range(len(seqs)):
            s = seqs[j]
            jt = s * T + t
            # the last token scatters each state part as soon as its groups are updated
            out = None
            if t == T - 1:
                out = (pool, got[j])
            _back(io, cst, lay, got[j]["S"], uts[j], jt, HV, V, out)
            if want_inter:
                row0 = jt * HV * K
                if inter.dtype == nl.float32:
                    _store_state(inter, got[j]["S"], lay, at, row0, V)
                else:
                    Sc = nl.ndarray(got[j]["S"].shape, dtype=inter.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=Sc, src=got[j]["S"], engine=nisa.engine.scalar)
                    _store_state(inter, Sc, lay, at, row0, V)


def _front(io, lay, S, jt, HV, K, V):
    """One token (sequence, token) ``jt`` of one sequence up to the state update: writes o
    columns [jt*HV, (jt+1)*HV) of io["ot"]; returns rk*u transposed,
    ``[HV, V]`` (SBUF)."""
    c0 = jt * HV
    c1 = c0 + HV
    NG = lay["NG"]
    NGR = lay["NGR"]
    R = lay["R"]
    GF = R * V
    # [kS | qS] of the old state, v on partitions: per head group, R matmuls (one per row
    # i of the partition's run) accumulate over the K rows; the moving operand is
    # block-diagonal over the group's heads, so each head only sums its own partitions
    p1 = nl.ndarray((V, 2 * HV), dtype=nl.float32, buffer=nl.psum)
    for G in range(NGR):
        for i in range(R):
            col = ((jt * NGR + G) * R + i) * NG * 2
            nisa.nc_matmul(dst=p1[:, 2 * NG * G:2 * NG * (G + 1)],
                           stationary=S[:, G * GF + i * V:G * GF + (i + 1) * V],
                           moving=io["mx"][:, col:col + 2 * NG], accumulate=i > 0)
    # kS and qS as strided [V, HV] views of the PSUM tile
    ks = p1.ap(pattern=[[2 * HV, V], [2, HV]], offset=0)
    qs = p1.ap(pattern=[[2 * HV, V], [2, HV]], offset=1)
    dec = io["dec"][0:V, c0:c1]
    # u = beta (v - a rk kS)
    u = nl.ndarray((V, HV), dtype=nl.float32, buffer=nl.sbuf)
    if io["rkv"] != None:  # noqa: E711
        nisa.tensor_tensor(dst=u, data1=ks, data2=io["rkv"][0:V, c0:c1], op=nl.multiply)
        nisa.tensor_tensor(dst=u, data1=u, data2=dec, op=nl.multiply)
    else:
        nisa.tensor_tensor(dst=u, data1=ks, data2=dec, op=nl.multiply)
    nisa.tensor_tensor(dst=u, data1=io["vt"][:, c0:c1], data2=u, op=nl.subtract)
    nisa.tensor_tensor(dst=u, data1=u, data2=io["beta"][0:V, c0:c1], op=nl.multiply)
    # o = a rq qS + (k.q) u
    ot = io["ot"][:, c0:c1]
    nisa.tensor_tensor(dst=ot, data1=qs, data2=io["rqv"][0:V, c0:c1], op=nl.multiply)
    nisa.tensor_tensor(dst=ot, data1=ot, data2=dec, op=nl.multiply)
    w = nl.ndarray((V, HV), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=w, data1=u, data2=io["dotv"][0:V, c0:c1], op=nl.multiply)
    nisa.tensor_tensor(dst=ot, data1=ot, data2=w, op=nl.add)
    p1 = None
    # rk u with heads on partitions: TensorE transpose, evicted on ScalarE
    if io["rkv"] != None:  # noqa: E711
        nisa.tensor_tensor(dst=u, data1=u, data2=io["rkv"][0:V, c0:c1], op=nl.multiply)
    uT_ps = nl.ndarray((HV, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=uT_ps, data=u)   # SBUF -> PSUM: TensorE
    uT = nl.ndarray((HV, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=uT, op=nl.copy, data=uT_ps)
    uT_ps = None
    return uT


def _back(io, cst, lay, S, uT, jt, HV, V, out):
    """S += k (rk u)^T for every value head (in place; S already decayed by ``_front``):
    per head group, rk u of its heads broadcast to their partitions (a 0/1 matmul,
    stationary ``sel``), then one VectorE ``scalar_tensor_tensor`` per row i of the
    partition's run, ``S_i += k_i * ub`` (k_i: a per-partition column of ``kx``).
    ``out``: None or (pool, state dict): scatter each state part right after its last
    group."""
    P = lay["P"]
    NGR = lay["NGR"]
    R = lay["R"]
    GF = R * V
    gpb = _MM_COLS // V   # head groups per PSUM bank
    if gpb < 1:
        gpb = 1
    for G0 in range(0, NGR, gpb):
        G1 = min(NGR, G0 + gpb)
        ub = nl.ndarray((P, (G1 - G0) * V), dtype=nl.float32, buffer=nl.psum)
        for G in range(G0, G1):
            nisa.nc_matmul(dst=ub[:, (G - G0) * V:(G - G0 + 1) * V],
                           stationary=cst["sel"][:, G * P:(G + 1) * P], moving=uT,
                           is_stationary_onezero=True, accumulate=False)
        for G in range(G0, G1):
            # k_i (rk u)^T on ScalarE: the broadcast rows scaled by the per-partition column
            # of k row kb*R + i (PSUM -> SBUF)
            kub = nl.ndarray((P, GF), dtype=nl.float32, buffer=nl.sbuf)
            for i in range(R):
                col = ((jt * NGR + G) * R + i) * 2
                nisa.activation(dst=kub[:, i * V:(i + 1) * V], op=nl.copy,
                                data=ub[:, (G - G0) * V:(G - G0 + 1) * V],
                                scale=io["kx"][:, col:col + 1])
            # decay and update in one VectorE pass: S_G = a S_G + kub (a: the per-partition
            # column of head G*NG + g)
            SG = S[:, G * GF:(G + 1) * GF]
            d = jt * NGR + G
            nisa.scalar_tensor_tensor(dst=SG, data=SG, op0=nl.multiply,
                                      operand0=io["decp"][:, d:d + 1], op1=nl.add, operand1=kub)
            kub = None
            if out != None:  # noqa: E711
                st = out[1]
                for k in range(st["parts"]):
                    a, b = _part_groups(NGR, st["parts"], k)
                    if b == G + 1:
                        _scatter_groups(out[0], st, lay, a, b)
        ub = None
