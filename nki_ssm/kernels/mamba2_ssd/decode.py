"""Mamba-2 selective state update (decode, 1..T tokens per sequence), state pool in place.

One compiled program per shape bucket
-------------------------------------
Compile-time arguments are shapes (the padded sequence bucket, T, H, P, N,
G; P as ``head_dim``) and layer flags only. The batch composition is
run-time int32 data built by the launcher
(``nki_ssm/ops/launch/mamba2_ssd.py``):

- ``seq_table [programs * rows, 128, 2*per]``: a block of ``rows`` table
  rows per program (LNC below): row 0 the program's spare entry, then one
  row per full iteration of the main loop (``per`` entries: live sequences,
  in order), then one row per single-entry iteration (the entry in columns
  0, 1). An entry is two columns; partition 0 of the first holds the
  sequence's first pool row ``slot*pr`` (its state DMAs' ``scalar_offset``);
- ``counts [1, 3]``, the one row every program reads: full iterations,
  single-entry iterations, the spare entry (0 / 1).

The token inputs come in table order (row r, entry e: the sequence the
table places there, zeros where no entry is; ``decode_y_index``) and y
leaves in table order ``[programs * rows, T*pr, per*nt]``, so an
iteration's x | dt | z, B | C and y each move in one DMA per token, at the
iteration's table row (the loop index as ``scalar_offset``); the launcher
maps y back to the batch and zeroes padding sequences' rows.

LNC: two programs split the sequences. Launched as ``kernel[2]`` the kernel
runs as two programs (one per physical core, never synchronised); the
launcher gives each program a run of E = n_live // 2 live sequences, in
order, so both run the same trip counts (``scaffold.trip_counts`` of the one
counts row). With an odd n_live the last live sequence is program 0's spare
entry, run under ``nl.if_else`` on the spare flag; program 1 takes the same
branch on a dump entry (pool rows 0 .. pr-1 of a private dump of the pool,
``scaffold.dump_rows``, and its own y row 0, which nothing reads), so a lone
live sequence runs on program 0 while program 1 computes garbage nothing
reads. Each program reads and writes its own block of table rows (static
offsets). Sequences are independent and own their pool slots, so no HBM
byte one program writes is read or written by the other. Both programs have
the same instructions and the results equal LNC=1's bit for bit (the same
per-sequence operations).

Loops. Every loop that grows with the batch is a runtime loop,
``nl.fori_loop(0, n, body)`` with ``body`` an inner ``def`` of the kernel
(``scaffold.work_loop``), its bound an ``NkiScalar``. No runtime loop runs
inside another; what is unrolled inside a body is bounded by the layer
shape (segments, PSUM banks of the state, T, the entries of an iteration).
One after the other: the main loop (``per`` sequences per iteration,
``entries_per_iteration``: 16, 8 for states over 32 KiB per partition,
fewer for long speculative steps), the single-entry loop (the ``E mod per``
left), the spare entry. An iteration loads everything it reads and
allocates its PSUM tiles: nothing is prefetched across iterations
(nki-library turns that off for dynamic loops, NKI-1582), so each iteration
fills and drains its pipeline once.

Layout (``decode_segments``). Decode is bound by moving the state
(``H*P*N`` floats per sequence, read and written once per call). The state
``[H*P, N]`` of a sequence sits on ``pr`` partitions x ``nt`` row blocks
of N; the nt columns are cut into segments of width c (the largest divisor
of both P and nt) and column ``o + k`` of segment ``(o, o + c)`` at
partition q holds state row ``pr*o + q*c + k``. A partition's rows of one
segment are consecutive rows of one head, so the decay ``exp(dt' A)`` is a
per-partition scalar per segment, and a state moves in one DMA each way
(partition step c*N, segment step pr*c*N, runs of c*N*4 bytes: 4 KiB at
Mamba-2 2.7B, pr 128, nt 40, five segments of 8 rows). Per-row quantities
(dt, x, z, A, D, dt_bias) are ``[pr, nt]`` tiles in the same layout (the
launcher lays them out).

Per token and sequence (Mamba-2 2.7B: 10 PSUM banks of 4 row blocks):
  TensorE  [B | C] on every partition (K = G 0/1 selection matmul, exact)
  ScalarE  B row copy; GpSimd its block diagonal ``BD [cb, cb*N]``
           (affine_select, cb = 512 / N row blocks per bank)
  TensorE  dt'x^T per bank (transposes), one VectorE copy out of PSUM
  ScalarE  S = S * exp(dt' A)       one activation per segment (scale column)
  TensorE  PSUM = I S + (dt'x^T)^T BD   per bank: the decayed state plus the
           input term dt'x[row] * B[n] (K = cb matmul), accumulated in PSUM
  ScalarE  S = PSUM                 one copy per bank
  DMA      the state back to the pool (last token), one DMA
  VectorE  prod = S * C, y = sum_n prod   (C a stride-0 broadcast operand;
           tensor_tensor and tensor_reduce over the whole state)
The prepared per-row quantities (dt', exp(dt' A), dt'x) and y's D and z
terms run once per iteration over all its entries (VectorE / ScalarE,
[pr, per*nt]), so ScalarE loads its softplus / exp / silu tables once per
iteration. Units are software-pipelined: the next unit's broadcasts and
TensorE operands are prepared before the current update, a unit's y
reduction runs after the next unit's update, and gathers run two units
ahead, two at a time (up to five state buffers, by an SBUF budget).

With G > 1 (a partition's segments may lie in different groups) or no PSUM
room the input term is made by VectorE instead (``inp = B (x) dt'x``, two
stride-0 broadcast operands) and added by a second identity matmul.

State units (SBUF): a sequence's state is cut into as few equal units of
row blocks as keep a unit within ``_UNIT_BYTES`` (48 KiB) per partition,
counting the fp32 working copy and, for a bfloat16 pool, the pool-dtype
tile (Falcon-H1-like, N = 256: two units). Units are independent (rows
are), so the results do not depend on the cut (tested bit for bit).

What binds: the pool traffic. Every pool DMA has a run-time offset, so the
dependency rules order a scatter after every earlier pool access and a
gather after every earlier scatter: each switch between reads and writes
waits for the other's completion and the DMA latency (~1.2 us modeled);
gathering two units at a time leaves about 1.5 switches per sequence.

Limits: N <= 256 (the [B | C] broadcast is one PSUM bank of 2N fp32; the
host API rejects N > 256 up front); pr <= 128 partitions for any H*P; T
tokens per sequence (a shape: unrolled, program size grows with T); any
number of sequences (run time); slots*pr < 2^31 (int32 pool rows).

Modeled (trn2, nki_ssm.perf as of this commit; ``python -m simulate --op
ssd_decode --no-calibration``, the 512-sequence case with ``--set judged``;
Mamba-2 2.7B, float32 state, bf16 I/O; share of the 368 GB/s core DMA
bandwidth): 1 sequence 43.2 us (33 %; one sequence fills and drains the
pipeline alone), 32 sequences 603 us (75.9 %, 10-90 %: 559-745 us), 512
sequences 9.55 ms (76.7 %, 10-90 %: 8.84-11.83 ms); the DMA queues bind
(91 % busy at 512: the state traffic plus ~1.5 read/write switches per
sequence), VectorE 73 %, ScalarE 62 %, TensorE 55 %. Per sequence and token:
VectorE ~4 instructions, ScalarE ~16, TensorE ~51, GpSimd 1, DMA ~2.3.
Program size: 1,367 static instructions (every runtime-loop body and both
sides of the spare's ``nl.if_else`` once; the main body holds 16 entries).
LNC=2 (each program's instructions timed on its own core): 32 sequences
305 us per program (0.51 x LNC=1), 512 sequences 4.78 ms (0.50 x); one
sequence 37.9 us (program 0's spare entry, program 1 a dump entry); 1,367
static instructions per program.

Numerics: the state and every update are float32. The TensorE sums are
exact (identity stationary, 0/1) but for the input term: with bf16 B
(bf16 I/O) dt'x is split into bf16 hi + lo (|dt'x - hi - lo| <= 2^-17
|dt'x|) and the two bf16 matmuls against the exact bf16 block diagonal of B
sum in fp32 PSUM; with fp32 B the matmul is fp32. A bfloat16 pool is
widened by the first token's decay (ScalarE reads the bf16 tile, writes
fp32) and rounded once (RNE) by a ScalarE copy on the last token.

Constructs and their evidence: the scaffolding of ``nki_ssm.kernels.scaffold``
(its docstring: ``nl.fori_loop`` with an inner-``def`` body and ``NkiScalar``
bounds, ``nisa.scalar_load`` of DMA-filled SBUF tiles, ``nl.if_else``, DMA
``scalar_offset`` an ``NkiScalar``); stride-0 ``.broadcast`` operands
(nkilib TensorView, NkiTensor docs); matmuls on the whole PE array; no DMA
converts a dtype (the launcher passes x | dt | z in float32).
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels._common import identity
from nki_ssm.kernels.scaffold import at_row, dump_rows, lnc_grid, run_if, trip_counts, work_loop


@nki.jit
def ssd_decode_step(xdt_rows, params, BC, group_sel, pool, seq_table, counts, has_z, has_bias,
                    has_D, dt_softplus, dt_lo, dt_hi, head_dim):
    """Selective state update; returns y ``[num_seqs, T*pr, nt]`` float32 (row layout; rows
    of sequences no entry names, padding ones included, are not written).

    Row layout (``decode_segments(nt, head_dim, pr)``): the nt columns of a
    partition are cut into segments ``(o, e)``; state row ``pr*o + q*(e-o) + k``
    sits at partition q, column ``o + k`` (k < e - o), so a partition's rows
    of one segment are consecutive rows of one head.
    HBM arrays (prepared by the launcher; ``num_seqs`` is the padded bucket):
      xdt_rows ``[num_seqs, T*pr, k*nt]`` float32: x, raw dt (per row's
      head) and, if has_z, z, as consecutive ``nt``-column blocks;
      params ``[pr, k*nt]`` float32: A, then dt_bias if has_bias, then D if
      has_D (per row); BC ``[num_seqs, T*G, 2*N]``: B then C;
      group_sel ``[G, nseg*pr]`` (BC's dtype, 1 where partition q's rows of
      segment j are in group g, at column j*pr + q); pool ``[slots*pr, nt*N]``
      float32 or bfloat16 (the pool ``[slots, H, P, N]``, updated in place by
      the kernel's scatters); seq_table ``[programs * rows, 128, 2*per]`` and
      counts ``[1, 3]`` int32 (the batch composition: module docstring).
    Compile-time: has_z, has_bias, has_D, dt_softplus, dt_lo, dt_hi (layer
      configuration), head_dim (P) and the shapes.
    """
    pr = params.shape[0]
    k = 2
    if has_z:
        k = 3
    T = xdt_rows.shape[1] // pr
    kp = 1
    if has_bias:
        kp = kp + 1
    if has_D:
        kp = kp + 1
    nt = params.shape[1] // kp
    N = pool.shape[1] // nt
    G = group_sel.shape[0]
    programs, pid = lnc_grid()
    rows = seq_table.shape[0] // programs
    per = entries_per_iteration(T, nt * N * 4)
    # y by table row and entry (the launcher maps them back to batch sequences)
    y = nl.ndarray((programs * rows, T * pr, per * nt), dtype=nl.float32, buffer=nl.shared_hbm)

    segs = decode_segments(nt, head_dim, pr)
    spans = _unit_spans(nt, N, pool.dtype == nl.float32)
    parts = 1       # state DMAs per segment run (_pieces); one: each extra pool DMA waits

    # ---- constants and buffers (SBUF, allocated outside the runtime loops)
    prm = nl.ndarray((pr, params.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=prm, src=params)
    # the per-row parameters repeated for the per entries of an iteration: [pr, kp, per*nt]
    prm_rep = nl.ndarray((pr, kp * per * nt), dtype=nl.float32, buffer=nl.sbuf)
    for b in range(kp):
        nisa.tensor_copy(dst=prm_rep[:, b * per * nt:(b + 1) * per * nt].reshape((pr, per, nt)),
                         src=prm[:, b * nt:(b + 1) * nt].reshape((pr, 1, nt)).broadcast(1, per))
    sel = nl.ndarray((G, group_sel.shape[1]), dtype=group_sel.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sel, src=group_sel)
    ident = identity(nl.float32, pr)   # the TensorE add of decay and input
    # this program's block of table rows (the program id is a Python int at trace time:
    # a static offset): row 0 its spare entry, then its main rows and its tail rows
    w = seq_table.shape[2]
    block = pid * rows * 128 * w             # first element of this program's rows
    # full iterations, single-entry iterations, the spare entry (0/1): device scalars of the
    # one counts row both programs read
    n_main, n_tail, spare = trip_counts(counts)

    span_max = 0
    for j in range(len(spans)):
        span_max = max(span_max, spans[j][1] - spans[j][0])
    nats = []
    work = []
    inps = []
    unit_bytes = span_max * N * 4
    if pool.dtype != nl.float32:
        unit_bytes = span_max * N * 6
    # SBUF per partition: token tiles (x | dt | z, B | C, dA, dt'x, y, temp per token),
    # the input-term / product tiles, the state buffers (2..4, as many as fit)
    tok_bytes = T * per * (xdt_rows.shape[2] // per * 4 + 2 * N * 4 + 4 * nt * 4)
    nbuf = 2
    for cand in (3, 4, 5):
        if cand * unit_bytes + 2 * span_max * N * 4 + tok_bytes <= _SBUF_BYTES:
            nbuf = cand
    for b in range(nbuf):
        nats.append(nl.ndarray((pr, span_max * N), dtype=pool.dtype, buffer=nl.sbuf))
        if pool.dtype != nl.float32:
            work.append(nl.ndarray((pr, span_max * N), dtype=nl.float32, buffer=nl.sbuf))
        else:
            work.append(nats[b])
    n_inp = 1
    if nbuf >= 3 and T == 1:
        n_inp = 2           # the deferred reduction's product tile and the next unit's
    for b in range(n_inp):
        inps.append(nl.ndarray((pr, span_max * N), dtype=nl.float32, buffer=nl.sbuf))
    tab = nl.ndarray((128, w), dtype=nl.int32, buffer=nl.sbuf)
    toks = _tok_tiles(xdt_rows.shape[2] // per, BC.dtype, pr, nt, T, G, N, per)
    nbc = 1
    if G > 1:
        nbc = len(segs)
    # one token per unit and three state buffers: the next unit's preparation is issued
    # before this unit's update and this unit's y reduction after the next one's update
    pipe = nbuf >= 3 and T == 1
    n_slots = 2
    if pipe:
        n_slots = 3
    rings = {"n_bc": [0], "n_ps": [0], "n_pe": [0], "nbc": nbc, "segs": segs, "pipe": pipe,
             "n_slots": n_slots}
    # the input term on TensorE (G = 1, its PSUM fits): per PSUM bank of cb row blocks,
    # stationary dt'x^T [cb, pr] (TensorE transposes) and moving the block-diagonal
    # [cb, cb*N] of B (GpSimd affine_select)
    cb = max(1, min(512 // N, pr))
    rings["cb"] = cb
    nch = 0
    for j in range(len(spans)):
        nc_j = 0
        pcs = _pieces(segs, spans[j], parts)
        for i in range(len(pcs)):
            nc_j = nc_j + (pcs[i][1] - pcs[i][0] + cb - 1) // cb
        nch = max(nch, nc_j)
    pe_banks = (nch * pr * 4 + 2047) // 2048
    bc_banks = n_slots * nbc * ((2 * N * 4 + 2047) // 2048)
    rings["n_acc"] = min(_PS_RING, 8 - bc_banks - pe_banks)
    rings["pe"] = _PE_INPUT and G == 1 and rings["n_acc"] >= 2
    # bf16 B (exact) and dt'x split in bf16 hi + lo (|error| <= 2^-17 |dt'x|): two bf16
    # matmuls at the bf16 rate instead of one fp32 at a quarter of it
    rings["hl"] = rings["pe"] and BC.dtype == nl.bfloat16
    rings["mm_dt"] = nl.float32
    rings["nhl"] = 1
    if rings["hl"]:
        rings["mm_dt"] = nl.bfloat16
        rings["nhl"] = 2
        for tok in range(T):
            toks[tok]["hl"] = nl.ndarray((pr, 2 * per * nt), dtype=nl.bfloat16, buffer=nl.sbuf)
    if not rings["pe"]:
        rings["n_acc"] = min(_PS_RING, 8 - bc_banks)
    if rings["pe"]:
        rings["nch"] = nch
        rings["bsb"] = []
        rings["bd"] = []
        rings["dxT"] = []
        for b in range(2):
            rings["bsb"].append(nl.ndarray((cb, N), dtype=rings["mm_dt"], buffer=nl.sbuf))
            rings["bd"].append(nl.ndarray((cb, cb * N), dtype=rings["mm_dt"], buffer=nl.sbuf))
            rings["dxT"].append(nl.ndarray((cb, rings["nhl"] * nch * pr), dtype=rings["mm_dt"],
                                           buffer=nl.sbuf))
    bufs = (tab, toks, nats, work, inps, spans, rings)
    args = (xdt_rows, BC, pool, y, sel, ident, prm_rep, T, pr, nt, N, G, parts, has_z,
            has_bias, has_D, dt_softplus, dt_lo, dt_hi, per)
    pattern = [[w, 128], [1, w]]

    # full iterations: per entries each (main row it)
    def main_body(it):
        _iteration(args, bufs, at_row(seq_table, it, pattern, block + 128 * w), per,
                   (it, pid * rows + 1))

    work_loop(n_main, main_body)

    # single-entry iterations (tail row i, after the main rows)
    def tail_body(i):
        _iteration(args, bufs, at_row(seq_table, n_main + i, pattern, block + 128 * w), 1,
                   (n_main + i, pid * rows + 1))

    work_loop(n_tail, tail_body)

    # the spare entry (LNC=2 with an odd number of live sequences): program 0's last live
    # sequence; the other program runs a dump entry (its row names pool rows 0 .. pr-1 and
    # sequence 0) into private dumps of the pool and of y: nothing real is written
    real = pid == 0
    spare_args = args
    if not real:
        spare_args = (xdt_rows, BC, dump_rows(pool, pr), y, sel, ident, prm_rep,
                      T, pr, nt, N, G, parts, has_z, has_bias, has_D, dt_softplus, dt_lo, dt_hi,
                      per)

    def spare_entry():
        _iteration(spare_args, bufs, at_row(seq_table, None, pattern, block), 1,
                   (None, pid * rows))

    run_if(spare, spare_entry)
    return y


def decode_segments(nt, P, pr):
    """Column segments ``(o, e)`` of the row layout (trace time; the launcher lays the
    rows out by them): partition q, column ``o + k`` holds state row ``pr*o + q*(e-o) +
    k``. Every segment has the width c, the largest divisor of both P and nt, so a
    partition's rows of one segment lie in one head (one decay factor, one group) and a
    state's segments are one access pattern (partition step c*N, segment step pr*c*N;
    Mamba-2 2.7B, nt 40, P 64: five segments of 8 rows)."""
    c = 1
    for d in range(1, min(P, nt) + 1):
        if P % d == 0 and nt % d == 0:
            c = d
    segs = []
    for o in range(0, nt, c):
        segs.append((o, o + c))
    return segs


def _iteration(args, bufs, row_view, n, yrow):
    """One loop iteration: the table row ``row_view`` (n entries), the token inputs of
    all n entries and their per-row quantities (one instruction over the n entries),
    the state units (``_units_of``), then the y rows. All it reads is loaded here (no
    SBUF prefetch across the runtime loop's iterations: nki-library turns it off for
    dynamic loops, NKI-1582), and its PSUM tiles are allocated here."""
    tab, toks, nats, work, inps, spans, rings = bufs
    (xdt_rows, BC, pool, y, sel, ident, prm_rep, T, pr, nt, N, G, parts, has_z, has_bias,
     has_D, dt_softplus, dt_lo, dt_hi, per) = args
    nisa.dma_copy(dst=tab, src=row_view)
    _psum_rings(rings, pr, N)
    slots = []
    for e in range(n):
        # the entry's first pool row slot*pr (partition 0 of its first column): the state
        # DMAs' scalar offset
        slots.append(nisa.scalar_load(tab[0:1, 2 * e:2 * e + 1]))
    _tok_load(xdt_rows, BC, yrow, toks, n, T, pr, G, nt, per)
    _gather(pool, slots[0], nats[0], pr, N, spans[0], parts, rings["segs"])
    _tok_prep_all(toks, prm_rep, T, pr, nt, n, per, has_bias, dt_softplus, dt_lo, dt_hi,
                  rings["hl"])
    _units_of(args, slots, toks, nats, work, inps, spans, rings, n)
    _tok_out_all(toks, prm_rep, y, yrow, T, pr, nt, n, per, has_z, has_bias, has_D)


def _units_of(args, slots, toks, nats, work, inps, spans, rings, n):
    """The units of the n entries of an iteration, software-pipelined: the gather of
    unit m + 1, the preparation of unit m + 1 (broadcasts, TensorE operands: ``pipe``),
    unit m's update, then unit m - 1's y reduction (deferred so VectorE's product and
    reduction overlap the next update); the units cycle through the state buffers."""
    (xdt_rows, BC, pool, y, sel, ident, prm_rep, T, pr, nt, N, G, parts, has_z, has_bias,
     has_D, dt_softplus, dt_lo, dt_hi, per) = args
    nu = len(spans)
    K = n * nu
    nb = len(nats)
    pipe = rings["pipe"]
    # gathers run L units ahead, g at a time (consecutive gathers move in parallel; each
    # switch between pool reads and writes waits for the other's completion): buffers for
    # the unit being reduced (pipe), the one being updated and L + g - 1 in flight
    L = 1
    g = 1
    if pipe:
        if nb >= 5:
            g = 2
        L = nb - g - 1
    for m in range(1, min(L, K)):
        _gather(pool, slots[m // nu], nats[m % nb], pr, N, spans[m % nu], parts, rings["segs"])
    pending = None
    nxt = None
    if pipe:
        nxt = _unit_prep(toks, 0, sel, spans[0], rings, inps[0], [0], pr, nt, N, parts)
    for m in range(K):
        e, j = m // nu, m % nu
        m1 = m + 1
        if m % g == 0:
            for mL in range(m + L, min(K, m + L + g)):
                _gather(pool, slots[mL // nu], nats[mL % nb], pr, N, spans[mL % nu], parts,
                        rings["segs"])
        cur = nxt
        if pipe:
            if m1 < K:
                nxt = _unit_prep(toks, m1 // nu, sel, spans[m1 % nu], rings,
                                 inps[m1 % len(inps)], [0], pr, nt, N, parts)
        late = _unit_main(cur, toks, e, slots[e], sel, ident, pool, nats[m % nb], work[m % nb],
                          inps[m % len(inps)], spans[j], rings, T, pr, nt, N, parts)
        if pending != None:  # noqa: E711
            _reduce_y(pending)
        pending = late
        if not pipe:
            _reduce_y(pending)
            pending = None
    if pending != None:  # noqa: E711
        _reduce_y(pending)


_ENTRIES = 16         # sequences per full iteration (fewer for long speculative steps)
_UNIT_BYTES = 48 * 1024   # SBUF bytes per partition of one state unit (fp32 state + pool copy)
_SBUF_BYTES = 180 * 1024   # state buffers (3 or 4 when they fit, else 2), input terms, tokens
_PE_INPUT = True    # the input term on TensorE where it applies (G = 1, PSUM room)
_PS_RING = 3        # PSUM sum tiles (one bank each) in flight between TensorE and ScalarE


def _unit_spans(nt, N, f32_pool):
    """State units ``(a, b)``: row blocks [a, b) of one sequence's state.

    A state is cut into as few equal units as keep one unit within
    _UNIT_BYTES per partition, so the two unit buffers fit in SBUF at any
    dstate (Falcon-H1, N = 256: 64 KiB fp32 per sequence -> 2 units;
    Mamba-2 2.7B and Granite-like: 1 unit).
    """
    row_bytes = N * 4
    if not f32_pool:
        row_bytes = N * 6     # fp32 working copy + the bf16 pool tile
    split = min(nt, (nt * row_bytes + _UNIT_BYTES - 1) // _UNIT_BYTES)
    span = (nt + split - 1) // split
    spans = []
    for a in range(0, nt, span):
        spans.append((a, min(nt, a + span)))
    return spans


def entries_per_iteration(T, state_bytes=0):
    """Sequences per full iteration of the main loop (the launcher's trip counts are
    ``E // per`` full and ``E % per`` single-entry iterations): an iteration fills and
    drains its pipeline once (nothing is prefetched across iterations), so more entries
    per iteration hide more of it; 16 // T, halved for states over 32 KiB per partition
    (``state_bytes``: their SBUF buffers leave less room for the token tiles)."""
    per = max(1, min(_ENTRIES, 16 // T))
    if state_bytes > 32 * 1024:
        per = max(1, per // 2)
    return per


def _psum_rings(r, pr, N):
    """Fresh PSUM tiles for one loop body: the TensorE sums (one bank each), the
    [B | C] broadcast slots (one tile per segment when G > 1) and the transposes."""
    ps = []
    for i in range(r["n_acc"]):
        ps.append(nl.ndarray((pr, 512), dtype=nl.float32, buffer=nl.psum))
    bc = []
    for i in range(r["n_slots"]):
        one = []
        for j in range(r["nbc"]):
            one.append(nl.ndarray((pr, 2 * N), dtype=nl.float32, buffer=nl.psum))
        bc.append(one)
    r["ps"] = ps
    r["bc"] = bc
    if r["pe"]:
        r["psT"] = nl.ndarray((r["cb"], r["nhl"] * r["nch"] * pr), dtype=r["mm_dt"],
                              buffer=nl.psum)
    r["n_bc"][0] = 0
    r["n_ps"][0] = 0


def _part_bounds(n, parts, k):
    """Blocks [a, b) of part k of ``parts`` over n blocks."""
    tp = (n + parts - 1) // parts
    return min(n, k * tp), min(n, (k + 1) * tp)


def _pieces(segs, span, parts):
    """Column ranges ``(s, e, o, c)`` of the unit ``span`` = [a, b), each inside segment
    ``(o, o + c)``, the segment's share cut in ``parts``."""
    a, b = span
    out = []
    for j in range(len(segs)):
        o, oe = segs[j]
        s0 = max(a, o)
        e0 = min(b, oe)
        if e0 > s0:
            for k in range(parts):
                pa, pe = _part_bounds(e0 - s0, parts, k)
                if pe > pa:
                    out.append((s0 + pa, s0 + pe, o, oe - o))
    return out


def _pool_view(pool, slot, pr, N, s, e, o, c):
    """Columns [s, e) of segment (o, o + c) of the state at pool row ``slot`` (an
    NkiScalar, slot*pr): partition q reads ``(e - s)*N`` contiguous pool elements."""
    return pool.ap(pattern=[[c * N, pr], [1, (e - s) * N]], offset=(pr * o + s - o) * N,
                   scalar_offset=slot, indirect_dim=0)


def _whole_view(pool, slot, pr, N, span, parts, segs):
    """The unit ``span`` = [a, b) as one access pattern when it is whole segments and
    one part (partition q: ``(b - a) / c`` runs of c*N contiguous elements), else None."""
    a, b = span
    c = segs[0][1] - segs[0][0]
    if parts != 1 or a % c != 0 or b % c != 0:
        return None
    return pool.ap(pattern=[[c * N, pr], [pr * c * N, (b - a) // c], [1, c * N]],
                   offset=pr * a * N, scalar_offset=slot, indirect_dim=0)


def _gather(pool, slot, nat, pr, N, span, parts, segs):
    """Row blocks span = [a, b) of an entry's state -> ``nat`` (pool dtype; one DMA, or
    one per piece, ``_pieces``)."""
    a = span[0]
    whole = _whole_view(pool, slot, pr, N, span, parts, segs)
    if whole != None:  # noqa: E711
        c = segs[0][1] - segs[0][0]
        nu = (span[1] - a) // c
        nisa.dma_copy(dst=nat[:, 0:(span[1] - a) * N].reshape((pr, nu, c * N)), src=whole)
        return
    pcs = _pieces(segs, span, parts)
    for i in range(len(pcs)):
        s, e, o, c = pcs[i]
        nisa.dma_copy(dst=nat[:, (s - a) * N:(e - a) * N],
                      src=_pool_view(pool, slot, pr, N, s, e, o, c))


def _tok_tiles(width, bc_dtype, pr, nt, T, G, N, per):
    """Per-token tiles of the per entries of an iteration: inputs x | dt | z
    ``[pr, per*k*nt]`` (entry e at columns e*k*nt, as its row in HBM), B | C
    ``[G, per*2N]``, and the prepared rows dA, dt'x, y ``[pr, per*nt]`` (entry e at
    columns e*nt)."""
    tl = []
    for tok in range(T):
        tl.append({"xdt": nl.ndarray((pr, width * per), dtype=nl.float32, buffer=nl.sbuf),
                   "bc": nl.ndarray((G, per * 2 * N), dtype=bc_dtype, buffer=nl.sbuf),
                   "dA": nl.ndarray((pr, per * nt), dtype=nl.float32, buffer=nl.sbuf),
                   "dtx": nl.ndarray((pr, per * nt), dtype=nl.float32, buffer=nl.sbuf),
                   "y": nl.ndarray((pr, per * nt), dtype=nl.float32, buffer=nl.sbuf),
                   "tmp": nl.ndarray((pr, per * nt), dtype=nl.float32, buffer=nl.sbuf)})
    return tl


def _tok_load(xdt_rows, BC, yrow, tl, n, T, pr, G, nt, per):
    """Loads of the iteration's token inputs, laid out by the launcher in table order:
    x | dt | z of its n entries and their B | C, one DMA each per token, at table row
    ``yrow`` = (row, first) (row an NkiScalar or None, plus the static row first)."""
    w = xdt_rows.shape[2]
    n2 = BC.shape[2]
    for tok in range(T):
        nisa.dma_copy(dst=tl[tok]["xdt"][:, 0:n * (w // per)], src=at_row(
            xdt_rows, yrow[0], [[w, pr], [1, n * (w // per)]], (yrow[1] * T + tok) * pr * w))
        nisa.dma_copy(dst=tl[tok]["bc"][:, 0:n * (n2 // per)], src=at_row(
            BC, yrow[0], [[n2, G], [1, n * (n2 // per)]], (yrow[1] * T + tok) * G * n2))


def _col(t, pr, n, w, c0, nt):
    """Columns [c0, c0 + nt) of each of the n entry blocks of width w of tile t:
    a [pr, n, nt] view."""
    return t[:, 0:n * w].reshape((pr, n, w))[:, :, c0:c0 + nt]


def _tok_prep_all(tl, prm_rep, T, pr, nt, n, per, has_bias, dt_softplus, dt_lo, dt_hi, hl):
    """Per-row quantities of each token of the n entries (one instruction over all of
    them): dt' = clip(softplus(dt + dt_bias)), decay exp(dt' A) and dt' x (fp32
    [pr, n*nt], entry e at columns e*nt)."""
    W = n * nt
    P = per * nt
    for tok in range(T):
        tk = tl[tok]
        xdt = tk["xdt"]
        w = xdt.shape[1] // per
        dtp = tk["tmp"]
        dt3 = _col(xdt, pr, n, w, nt, nt)
        src = dt3
        if has_bias:
            nisa.tensor_tensor(dst=dtp[:, 0:W].reshape((pr, n, nt)), data1=dt3,
                               data2=prm_rep[:, P:P + W].reshape((pr, n, nt)), op=nl.add)
            src = dtp[:, 0:W].reshape((pr, n, nt))
        if dt_softplus:
            nisa.activation(dst=dtp[:, 0:W].reshape((pr, n, nt)), op=nl.softplus, data=src)
            src = dtp[:, 0:W].reshape((pr, n, nt))
        if dt_hi < 3.0e38:
            nisa.tensor_scalar(dst=dtp[:, 0:W].reshape((pr, n, nt)), data=src, op0=nl.maximum,
                               operand0=dt_lo, op1=nl.minimum, operand1=dt_hi)
        else:
            nisa.tensor_scalar(dst=dtp[:, 0:W].reshape((pr, n, nt)), data=src, op0=nl.maximum,
                               operand0=dt_lo)
        nisa.tensor_tensor(dst=tk["dA"][:, 0:W], data1=dtp[:, 0:W], data2=prm_rep[:, 0:W],
                           op=nl.multiply)
        nisa.activation(dst=tk["dA"][:, 0:W], op=nl.exp, data=tk["dA"][:, 0:W])
        nisa.tensor_tensor(dst=tk["dtx"][:, 0:W].reshape((pr, n, nt)),
                           data1=dtp[:, 0:W].reshape((pr, n, nt)),
                           data2=_col(xdt, pr, n, w, 0, nt), op=nl.multiply)
        if hl:
            # dt'x = hi + lo, both bfloat16 (round to nearest even): hi, then the rest
            h = tk["hl"]
            nisa.tensor_copy(dst=h[:, 0:W], src=tk["dtx"][:, 0:W])
            nisa.tensor_tensor(dst=dtp[:, 0:W], data1=tk["dtx"][:, 0:W], data2=h[:, 0:W],
                               op=nl.subtract)
            nisa.tensor_copy(dst=h[:, P:P + W], src=dtp[:, 0:W])


def _runs(rings, a, b):
    """Column runs of [a, b) that share one [B | C] broadcast: the whole range when G = 1
    (one broadcast), else its parts in each segment, as ``(s, e, bc index)``."""
    if rings["nbc"] == 1:
        return [(a, b, 0)]
    out = []
    segs = rings["segs"]
    for j in range(len(segs)):
        s0 = max(a, segs[j][0])
        e0 = min(b, segs[j][1])
        if e0 > s0:
            out.append((s0, e0, j))
    return out


def _chunks(pieces, cb):
    """Column ranges of at most cb row blocks (one PSUM bank), inside the pieces."""
    out = []
    for i in range(len(pieces)):
        s, e, o, c = pieces[i]
        for c0 in range(s, e, cb):
            out.append((c0, min(e, c0 + cb), i))
    return out


def _unit_prep(tl, e, sel, span, rings, inp, toks, pr, nt, N, parts):
    """What entry e's unit ``span`` needs besides its state, per token: the [B | C]
    broadcasts (TensorE, exact 0/1 selection, K = G), and the input term's operands:
    on the TensorE path the block-diagonal of B (ScalarE copy, GpSimd affine_select)
    and dt'x^T per PSUM bank (TensorE transposes, one VectorE copy); else the input
    term itself, ``inp = B (x) dt'x`` (VectorE, stride-0 broadcasts; one token only)."""
    a, b = span
    pieces = _pieces(rings["segs"], span, parts)
    cb = rings["cb"]
    chunks = _chunks(pieces, cb)
    n2 = 2 * N
    out = []
    for ti in range(len(toks)):
        tk = tl[toks[ti]]
        nb_i = rings["n_bc"][0]
        rings["n_bc"][0] = nb_i + 1
        bcs = rings["bc"][nb_i % rings["n_slots"]]
        for j in range(len(bcs)):
            nisa.nc_matmul(dst=bcs[j], stationary=sel[:, j * pr:(j + 1) * pr],
                           moving=tk["bc"][:, e * n2:(e + 1) * n2], accumulate=False)
        prep = {"bcs": bcs, "pieces": pieces, "chunks": chunks, "cb": cb}
        if rings["pe"]:
            k_i = rings["n_pe"][0]
            rings["n_pe"][0] = k_i + 1
            bsb = rings["bsb"][k_i % 2]
            bd = rings["bd"][k_i % 2]
            dxT = rings["dxT"][k_i % 2]
            psT = rings["psT"]
            nisa.activation(dst=bsb, op=nl.copy, data=bcs[0][0:cb, 0:N])
            nisa.affine_select(dst=bd.reshape((cb, cb, N)), pattern=[[1, cb], [0, N]],
                               channel_multiplier=-1,
                               on_true_tile=bsb.reshape((cb, 1, N)).broadcast(1, cb),
                               on_false_value=0.0, cmp_op=nl.equal, offset=0)
            nhl = rings["nhl"]
            for kk in range(len(chunks)):
                c0, c1, i = chunks[kk]
                if nhl == 2:
                    hl = tk["hl"]
                    P2 = hl.shape[1] // 2
                    nisa.nc_transpose(dst=psT[0:c1 - c0, 2 * kk * pr:(2 * kk + 1) * pr],
                                      data=hl[:, e * nt + c0:e * nt + c1])
                    nisa.nc_transpose(dst=psT[0:c1 - c0, (2 * kk + 1) * pr:(2 * kk + 2) * pr],
                                      data=hl[:, P2 + e * nt + c0:P2 + e * nt + c1])
                else:
                    nisa.nc_transpose(dst=psT[0:c1 - c0, kk * pr:(kk + 1) * pr],
                                      data=tk["dtx"][:, e * nt + c0:e * nt + c1])
            nc = nhl * len(chunks) * pr
            nisa.tensor_copy(dst=dxT[:, 0:nc], src=psT[:, 0:nc])
            prep["bd"] = bd
            prep["dxT"] = dxT
        else:
            rs = _runs(rings, a, b)
            for i in range(len(rs)):
                s, f, jb = rs[i]
                w = f - s
                nisa.tensor_tensor(
                    dst=inp[:, (s - a) * N:(f - a) * N].reshape((pr, w, N)),
                    data1=bcs[jb][:, 0:N].reshape((pr, 1, N)).broadcast(1, w),
                    data2=tk["dtx"][:, e * nt + s:e * nt + f].reshape((pr, w, 1)).broadcast(2, N),
                    op=nl.multiply)
        out.append(prep)
    return out


def _unit_main(preps, tl, e, slot, sel, ident, pool, nat, S, inp, span, rings, T, pr, nt, N,
               parts):
    """All T tokens on one state unit (columns ``span``) of entry e; the pool scatter on
    the last token. Returns the last token's deferred y reduction (``_reduce_y``);
    earlier tokens' reductions run before the next token's decay. With T > 1 the input
    term of token t (VectorE path) is made after token t - 1's sums have read ``inp``.

    Per token: ScalarE decay ``S = S_in * exp(dt' A)`` per piece (one head per
    partition and segment: a per-partition scale); TensorE ``PSUM = I S + inp`` per bank
    (512 fp32; inp a K = cb matmul on the TensorE path); ScalarE ``S = PSUM``.
    """
    a, b = span
    narrow = nat.dtype != nl.float32
    whole = _whole_view(pool, slot, pr, N, span, parts, rings["segs"])
    cs = rings["segs"][0][1] - rings["segs"][0][0]
    late = None
    for tok in range(T):
        if late != None:  # noqa: E711
            _reduce_y(late)
            late = None
        if preps == None:  # noqa: E711
            # no pipelining (T > 1 or two state buffers): this token's operands now
            prep = _unit_prep(tl, e, sel, span, rings, inp, [tok], pr, nt, N, parts)[0]
        else:
            prep = preps[tok]
        tk = tl[tok]
        dA = tk["dA"]
        pieces = prep["pieces"]
        chunks = prep["chunks"]
        S_in = S
        if tok == 0:
            S_in = nat
        # decay, one ScalarE instruction per piece (per-partition factor of its head)
        for i in range(len(pieces)):
            s, f, o, c = pieces[i]
            nisa.activation(dst=S[:, (s - a) * N:(f - a) * N], op=nl.copy,
                            data=S_in[:, (s - a) * N:(f - a) * N],
                            scale=dA[:, e * nt + o:e * nt + o + 1])
        # S = I S + inp on TensorE, one PSUM bank at a time, evicted by ScalarE
        last = []
        for i in range(len(pieces)):
            last.append(-1)
        for kk in range(len(chunks)):
            last[chunks[kk][2]] = kk
        for kk in range(len(chunks)):
            c0, c1, i = chunks[kk]
            f0 = (c0 - a) * N
            f1 = (c1 - a) * N
            np_i = rings["n_ps"][0]
            rings["n_ps"][0] = np_i + 1
            ps = rings["ps"][np_i % len(rings["ps"])][:, 0:f1 - f0]
            nisa.nc_matmul(dst=ps, stationary=ident, moving=S[:, f0:f1], accumulate=False,
                           is_stationary_onezero=True)
            if rings["pe"]:
                nhl = rings["nhl"]
                for h in range(nhl):
                    q0 = (nhl * kk + h) * pr
                    nisa.nc_matmul(dst=ps, stationary=prep["dxT"][0:c1 - c0, q0:q0 + pr],
                                   moving=prep["bd"][0:c1 - c0, 0:f1 - f0], accumulate=True)
            else:
                nisa.nc_matmul(dst=ps, stationary=ident, moving=inp[:, f0:f1],
                               accumulate=True, is_stationary_onezero=True)
            nisa.activation(dst=S[:, f0:f1], op=nl.copy, data=ps)
            if tok == T - 1 and whole != None and kk == len(chunks) - 1:  # noqa: E711
                g1 = (b - a) * N
                if narrow:
                    nisa.activation(dst=nat[:, 0:g1], op=nl.copy, data=S[:, 0:g1])
                nisa.dma_copy(dst=whole, src=nat[:, 0:g1].reshape((pr, (b - a) // cs, cs * N)))
            if tok == T - 1 and whole == None and last[i] == kk:  # noqa: E711
                s, f, o, c = pieces[i]
                g0 = (s - a) * N
                g1 = (f - a) * N
                if narrow:
                    nisa.activation(dst=nat[:, g0:g1], op=nl.copy, data=S[:, g0:g1])
                nisa.dma_copy(dst=_pool_view(pool, slot, pr, N, s, f, o, c), src=nat[:, g0:g1])
        late = (S, inp, tk["y"], prep["bcs"], rings, a, b, pr, N, e * nt)
    return late


def _reduce_y(late):
    """y columns [a, b) of a token (``late`` = (S, prod, y, bcs, rings, a, b, pr, N,
    y0), the entry's y columns from y0): prod = S * C (VectorE, C broadcast over the
    rows), then the sum over n (VectorE tensor_reduce); ``prod`` reuses the input-term
    tile."""
    S, prod, yc, bcs, rings, a, b, pr, N, y0 = late
    rs = _runs(rings, a, b)
    for i in range(len(rs)):
        s, e, jb = rs[i]
        w = e - s
        f0 = (s - a) * N
        f1 = (e - a) * N
        nisa.tensor_tensor(dst=prod[:, f0:f1].reshape((pr, w, N)),
                           data1=S[:, f0:f1].reshape((pr, w, N)),
                           data2=bcs[jb][:, N:2 * N].reshape((pr, 1, N)).broadcast(1, w),
                           op=nl.multiply)
        nisa.tensor_reduce(dst=yc[:, y0 + s:y0 + e], op=nl.add,
                           data=prod[:, f0:f1].reshape((pr, w, N)), axis=2)


def _tok_out_all(tl, prm_rep, y, yrow, T, pr, nt, n, per, has_z, has_bias, has_D):
    """y rows of each token of the n entries: (sum_n S C + D x) * silu(z) (one
    instruction over the n entries), stored by one DMA per token at the iteration's
    y row: ``yrow`` = (row, first), row an NkiScalar (or None) added to the static row
    ``first`` of y ``[rows, T*pr, per*nt]``."""
    W = n * nt
    P = per * nt
    for tok in range(T):
        tk = tl[tok]
        yc, xdt, tmp = tk["y"], tk["xdt"], tk["tmp"]
        w = xdt.shape[1] // per
        y3 = yc[:, 0:W].reshape((pr, n, nt))
        t3 = tmp[:, 0:W].reshape((pr, n, nt))
        if has_D:
            d0 = P
            if has_bias:
                d0 = 2 * P
            nisa.tensor_tensor(dst=t3, data1=_col(xdt, pr, n, w, 0, nt),
                               data2=prm_rep[:, d0:d0 + W].reshape((pr, n, nt)), op=nl.multiply)
            nisa.tensor_tensor(dst=yc[:, 0:W], data1=yc[:, 0:W], data2=tmp[:, 0:W], op=nl.add)
        if has_z:
            nisa.activation(dst=t3, op=nl.silu, data=_col(xdt, pr, n, w, 2 * nt, nt))
            nisa.tensor_tensor(dst=yc[:, 0:W], data1=yc[:, 0:W], data2=tmp[:, 0:W],
                               op=nl.multiply)
        off = (yrow[1] * T + tok) * pr * per * nt
        nisa.dma_copy(dst=at_row(y, yrow[0], [[per * nt, pr], [1, W]], off), src=yc[:, 0:W])
