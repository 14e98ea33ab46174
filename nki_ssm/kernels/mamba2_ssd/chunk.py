"""Mamba-2 SSD chunked prefill over a ragged batch with an in-place state pool.

Kernel: ``ssd_chunk_prefill`` (``@nki.jit``). The host launcher
(``nki_ssm/ops/launch/mamba2_ssd.py``) prepares the layouts described in the
kernel docstring; this note is the design.

Design note
===========

Compile time vs run time
------------------------
The ragged layout (``seq_lens``) and which sequences are padding (``live``)
are compile-time tuples, part of the kernel cache key: chunk boundaries
decide instruction shapes (a short last chunk has fewer partitions), and NKI
loops are unrolled at trace time, so a layout-generic kernel would need
dynamic loops with run-time partition counts, which NKI 0.5.0 does not
offer. Padding sequences get zero rows of y and no instructions at all.
Pool slots are run-time data: int32 row indices, gathered / scattered inside
the kernel by indirect DMA (``.ap(vector_offset=...)``, one pool row per
partition); ``has_initial_state == False`` is encoded by the launcher as a
gather index past the pool, which the DMA skips (``oob_mode.skip``) and so
leaves the zero-filled tile (zero initial state).

Layout
------
Tokens of one chunk (Q <= 128, ``chunk_size``) sit on partitions; heads are
concatenated on the free dim (x as ``[L, H*P]``, dt as ``[L, H]``). The
running state of a sequence lives in SBUF in float32 as ``S^T [N, H*P]``
(dstate on partitions, one tile per 128 of N: N up to 256 and beyond), so
both state matmuls contract over partitions without per-chunk transposes; it
is transposed on TensorE only when gathered from / scattered to the pool,
one DMA each per sequence (partition q holds the nt consecutive state rows
``q*nt ..``, ``pr*nt = H*P``: 20 KiB per partition at 2.7B, the DMA's
efficient regime).

Per chunk (prologue, all heads at once)
---------------------------------------
DMA x (widened to fp32 by the DMA), dt, B, C. VectorE/ScalarE:
dt' = clip(softplus(dt + dt_bias)), dtA = dt' A, ln dt' ([L, H]). TensorE
(fp32, 0/1 stationaries flagged onezero): cs = U^T dtA (inclusive cumsum),
ex = Ls^T dtA (sum over the chunk's later tokens), tot = 1^T dtA (chunk
total, broadcast on the N partitions); ScalarE exp of each. Per group:
C^T (TensorE transpose), CB^T [L, L] (fp32, contract N, accumulate N
tiles), causal mask on GpSimd (affine_select).

Per (chunk, head block) item: ten stages, one engine each (mostly)
-----------------------------------------------------------------
Blocks hold ``hb`` heads of one group (``hb*L <= 512`` and ``hb*P <= 512``:
one PSUM bank per tile; hb = 4 at L = 128, P = 64).
 0 ScalarE  W[k, (h,i)] = dtA[k,h] U[k,i] (one head of the block on VectorE)
 1 TensorE  seg = Ls^T W -> seg[j,(h,i)] = sum_{j<k<=i} dtA[k,h] (fp32;
            exactly 0 for j >= i), one matmul for the block
 2 ScalarE  Dm = exp(seg + ln dt'_j) (dt'_j as the exponent bias)
 3 V / G    Mt = Dm * CBmask per head (alternating VectorE / GpSimd);
            ScalarE: bf16 copy of the block's S^T (bf16 mode)
 4 TensorE  y_intra = Mt^T x_h + I^T (x_h D_h) per head, fp32 (x*D on
            ScalarE); y_off = C S^T for the block (one matmul per N tile)
 5 ScalarE  y_off * exp(cs_i) per head; silu(z); Xd = x_h dt'_j exp(ex_j)
 6 VectorE  y = y_off + y_intra (PSUM operand)
 7 GpSimd   (+ x*D for D [H, P]) * silu(z) -> y
 8 TensorE  chunk state B^T Xd per N tile (fp32)
 9 VectorE  S^T <- exp(tot) S^T + chunk state, per head (fp32)
z is loaded and y stored per group of 4 blocks (2 KiB per partition per DMA
at P = 64, bf16), x once per chunk (fp32 via the DMA).

Overlap
-------
The items of a whole sequence (chunk by chunk, block by block) form one
software pipeline: in step b, stage k works on item b - k, stages issued
in order, so every engine's in-order queue only holds work whose inputs
were produced in earlier steps and the five engines run concurrently. A
chunk's prologue is issued half a chunk of steps before its first item;
item (c+1, j) reads the state item (c, j) writes, which the step distance
guarantees when a chunk has more than 6 blocks (otherwise the pipeline
drains at each chunk boundary). Sequences run one after another (the
pipeline drains at each sequence end); the next sequence's state gather is
issued after the current one's first chunk prologue when the state is
<= 32 KiB per partition (2.7B, Granite-like), so it does not wait for the
current scatter (pool DMAs have run-time indices); Falcon-H1's 64 KiB
state is gathered in turn (SBUF).

Engine budget (modeled, trn2, nki_ssm.perf; Mamba-2 2.7B, bf16, 16K tokens)
----------------------------------------------------------------------------
4.81 ms = 3.41 M tokens/s per NeuronCore (goal 2 M); the current cost
model gives 4.67 ms = 3.50 M tokens/s, binding VectorE, 29.1 % of the
roofline (``python3 -m simulate --set judged --op mamba2_ssd``). Busy per 128-token
chunk: ScalarE 36.7 us (binding, 98 %), VectorE 35.8, GpSimd 34.6, TensorE
32.6, DMA 18.7 us; modeled 37.6 us per chunk. Roofline: 1.41 ms (520 MB of
minimal HBM traffic at 368 GB/s; the minimal matmul work takes 0.82 ms at
the bf16 peak), so 29 % of the roofline. What binds is elementwise work: per
chunk and head three passes over the L x L decay matrix (W, exp, Mt) and
~6 passes over the L x P output / state columns; TensorE is not the limit
(the exact mode, all-fp32 TensorE, models at 3.24 M tokens/s with TensorE
99 % busy). Closer to the roof needs fewer elementwise passes (bf16 perf
modes where the precision budget allows; trn3's VectorE exponential) rather
than faster matmuls. Chunk 64 models slower (2.0 M tokens/s at 2K tokens:
per-instruction overheads); 128 is the right chunk on trn2. Granite-like
(H 128, G 8) 16K: 2.01 M tokens/s, ScalarE binding.

SBUF / PSUM budget (bytes per partition; Q = 128)
--------------------------------------------------
State S^T ``H*P*4`` per N tile (2.7B 20 KiB, Granite-like 32 KiB); per
live chunk context (two are live while the pipeline crosses a chunk
boundary): x fp32 ``H*P*4`` (20 / 32 KiB) + B, C, dt, decay columns
(< 10 KiB); items in flight (~10) hold W, Dm, Mt (``hb*L*4`` = 2 KiB each),
y / Xd / S copies (1 KiB each) and z / y group tiles (2 KiB). The simulator
enforces the 208 KiB usable (224 KiB less its reserve); Granite-like in
exact mode is the tightest case and fits. PSUM: one bank per tile; the seg,
y_intra, y_off and state tiles of the items in flight stay within the 8
banks (the simulator counts live banks).

Numerics
--------
dt processing, decay sums, exps, Mt, state and all accumulation in float32.
Decays are always exp of a segment sum computed directly as a masked sum of
per-token dt'A terms (never exp(c_i) * exp(-c_j), never a difference of two
cumsums): no overflow and no cancellation for any gate values (dt' 1e4 with
A = -16 is tested). ``exact=True`` (precision "fp32"): every matmul operand
float32. ``exact=False`` (precision "bf16", the default): only the
state-to-output matmul y_off = C S^T takes bfloat16 operands (C exact for
bf16 models, the fp32 state rounded once); y_intra, D x, CB, the decay sums
and the chunk-state matmul stay fp32. Rounding Mt or x*dt'*decay to bf16
instead costs ~1e-3 of relative error in y and in the states, and the cost
model says those matmuls are not the bottleneck (TensorE ~60 % busy with
fp32, VectorE binding), so the extra precision is free. Measured at model
shapes with bf16 I/O: y error = the bf16 output rounding (~1.6e-3),
states ~1e-7 (float32 pool).
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels.mamba2_ssd._common import dt_prime, load_f32

_PSUM_F = 512      # fp32 elements of one PSUM bank per partition

_PMAX = 128
_IO_BLOCKS = 4     # head blocks per z / y DMA
_W_ON_VECTOR = 0   # block head whose W build runs on VectorE (engine balance)
_PREFETCH_BYTES = 32 * 1024   # state bytes per partition gathered a sequence ahead


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


def _exp_of_matmul(stationary, moving, rows, cols):
    """exp(stationary^T @ moving) as a new fp32 SBUF tile [rows, cols] (fp32 matmul, 0/1 stationary)."""
    ps = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=stationary, moving=moving, accumulate=False,
                   is_stationary_onezero=True)
    out = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=out, op=nl.exp, data=ps)
    return out


def _transpose_to_sbuf(src, rows, cols, dtype):
    """src [rows, cols] (SBUF) -> new SBUF tile [cols, rows] of ``dtype`` via TensorE."""
    ps = nl.ndarray((cols, rows), dtype=src.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=ps, data=src)
    out = nl.ndarray((cols, rows), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=ps)
    return out


def _gather_state(pool, gather_idx, s, HP, N):
    """Start the gather of one sequence's state: (new tile [pr, nt*N] in the pool dtype).

    ``pool`` [slots*pr, nt*N]: partition q of the gather reads state rows
    ``q*nt .. q*nt+nt-1`` (r = h*P + p), one pool row of ``nt*N`` contiguous
    elements, at index ``gather_idx[s*pr + q]`` (``slot*pr + q``, or past the
    pool: skipped, the zero fill stays = zero initial state).
    """
    nt = pool.shape[1] // N
    pr = HP // nt
    idx = nl.ndarray((pr, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=gather_idx[s * pr:(s + 1) * pr, :])
    nat = nl.ndarray((pr, nt * N), dtype=pool.dtype, buffer=nl.sbuf)
    nisa.memset(dst=nat, value=0.0)
    src = pool.ap(pattern=[[nt * N, pr], [1, nt * N]], offset=0, vector_offset=idx,
                  indirect_dim=0)
    nisa.dma_copy(dst=nat, src=src, oob_mode=nisa.oob_mode.skip)
    return nat


def _state_in(nat, ST, HP, N, n_tiles):
    """Gathered state tile -> S^T tiles (TensorE transposes). Column block j
    of ``nat`` holds rows ``q*nt + j``: its transpose lands in the strided
    S^T columns ``j, j+nt, ...``. ``ST[t]`` fp32 [Nt, H*P].
    """
    pr = nat.shape[0]
    nt = HP // pr
    for j in range(nt):
        for t in range(n_tiles):
            n0 = t * _PMAX
            ntile = min(_PMAX, N - n0)
            ps = nl.ndarray((ntile, pr), dtype=nat.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=ps, data=nat[:, j * N + n0:j * N + n0 + ntile])
            nisa.tensor_copy(dst=ST[t][:, j:HP:nt], src=ps,
                             engine=nisa.engine.scalar if j % 2 else nisa.engine.vector)


def _store_state(pool, scatter_idx, s, ST, HP, N, n_tiles):
    """Transpose S^T back to the gather layout and scatter it with one DMA (index past
    the pool: skipped)."""
    nt = pool.shape[1] // N
    pr = HP // nt
    idx = nl.ndarray((pr, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=scatter_idx[s * pr:(s + 1) * pr, :])
    nat = nl.ndarray((pr, nt * N), dtype=pool.dtype, buffer=nl.sbuf)
    for j in range(nt):
        ps = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.psum)
        for t in range(n_tiles):
            n0 = t * _PMAX
            ntile = min(_PMAX, N - n0)
            nisa.nc_transpose(dst=ps[:, n0:n0 + ntile], data=ST[t][:, j:HP:nt])
        nisa.tensor_copy(dst=nat[:, j * N:(j + 1) * N], src=ps,
                         engine=nisa.engine.scalar if j % 2 else nisa.engine.vector)
    dst = pool.ap(pattern=[[nt * N, pr], [1, nt * N]], offset=0, vector_offset=idx,
                  indirect_dim=0)
    nisa.dma_copy(dst=dst, src=nat, oob_mode=nisa.oob_mode.skip)


@nki.jit
def ssd_chunk_prefill(x, dt, A_rows, B, C, D_heads, D_rows, z, bias_rows, pool, gather_idx,
                      scatter_idx, seq_lens, live, heads, dstate, dt_softplus, dt_lo, dt_hi,
                      chunk_size, exact):
    """Chunked SSD prefill; returns y ``[num_tokens, H*P]`` and updates ``pool`` in place.

    HBM arrays (prepared by the launcher):
      x ``[num_tokens, H*P]`` (float32 or bfloat16; y has this dtype),
      dt ``[num_tokens, H]`` float32 (raw dt), A_rows ``[128, H]`` float32 (A
      repeated on 128 rows), B, C ``[num_tokens, G*N]`` (x's dtype),
      D_heads ``[128, H]`` float32 or None (D per head, repeated on 128 rows;
      folded into TensorE as D_h * I), D_rows ``[128, H*P]`` float32 or None
      (D per head and channel, applied on GpSimd), z ``[num_tokens, H*P]`` or None,
      bias_rows ``[128, H]`` float32 or None, pool ``[slots*pr, nt*N]`` (float32
      or bfloat16: the state pool ``[slots, H, P, N]`` viewed as pr rows of nt
      state rows per slot, ``pr*nt = H*P``, pr <= 128; updated in place),
      gather_idx / scatter_idx ``[num_seqs*pr, 1]`` int32 (pool row
      ``slot*pr + q`` for partition q of sequence s at ``s*pr + q``; the first
      row past the pool = skip: no initial state (gather) / padding).
    Compile-time: seq_lens (tuple of ints, sum = num_tokens), live (tuple of
      bools: False = padding sequence, zero output, pool untouched), heads (H),
      dstate (N),
      dt_softplus (bool), dt_lo, dt_hi (floats, dt_hi may be inf), chunk_size
      (<= 128), exact (bool: fp32 matmul operands).
    """
    T, HP = x.shape
    H = heads
    P = HP // H
    N = dstate
    GN = B.shape[1]
    G = GN // N
    HPG = H // G
    Q = chunk_size
    n_tiles = (N + _PMAX - 1) // _PMAX
    md = nl.float32 if exact else nl.bfloat16

    y = nl.ndarray((T, HP), dtype=x.dtype, buffer=nl.shared_hbm)

    ones, U, Ls = _tri_consts(Q)
    A_sb = load_f32(A_rows, _PMAX, H)
    bias_sb = load_f32(bias_rows, _PMAX, H)
    D_sb = load_f32(D_rows, _PMAX, HP)
    DI = None
    if D_heads != None:  # noqa: E711
        DI = _d_heads(D_heads, ones, Q, H)

    # heads per block: one PSUM bank for seg [L, hb*L] and y [L, hb*P]
    hb = max(1, min(HPG, min(_PSUM_F // Q, _PSUM_F // P)))  # min takes 2 args in NKI

    # With a small state (<= _PREFETCH_BYTES per partition) the next live
    # sequence's state is gathered during this one's chunks (after the first
    # chunk's loads), not after this one's scatter: pool DMAs have run-time
    # indices, so a gather issued after a scatter waits for it (2.7B, 4 x 256
    # tokens: 413 -> 386 us modeled). A large state (Falcon-H1: 64 KiB) is
    # gathered in turn: two would not fit next to the chunk pipeline.
    nxt = []
    for s in range(len(seq_lens)):
        nxt.append(-1)
    last = -1
    for s in range(len(seq_lens) - 1, -1, -1):
        nxt[s] = last
        if live[s]:
            last = s
    itemsize = 4
    if pool.dtype != nl.float32:
        itemsize = 2
    early = pool.shape[1] * itemsize <= _PREFETCH_BYTES
    pre = {}
    start = 0
    for s in range(len(seq_lens)):
        n_s = seq_lens[s]
        if not live[s]:
            _zero_rows(y, start, n_s, HP)
            start += n_s
            continue
        ST = []
        for t in range(n_tiles):
            nt = min(_PMAX, N - t * _PMAX)
            ST.append(nl.ndarray((nt, HP), dtype=nl.float32, buffer=nl.sbuf))
        if pre.get(str(s)) == None:  # noqa: E711
            pre[str(s)] = _gather_state(pool, gather_idx, s, HP, N)
        _state_in(pre[str(s)], ST, HP, N, n_tiles)
        pre[str(s)] = None
        ahead = None
        if early and nxt[s] >= 0:
            ahead = (pool, gather_idx, nxt[s])
        nat = _sequence(x, dt, B, C, z, y, A_sb, bias_sb, D_sb, DI, ones, U, Ls, ST, start, n_s,
                        Q, H, P, N, G, HPG, hb, n_tiles, md, dt_softplus, dt_lo, dt_hi, ahead)
        if ahead != None:  # noqa: E711
            pre[str(nxt[s])] = nat
        nat = None

        _store_state(pool, scatter_idx, s, ST, HP, N, n_tiles)
        start += n_s
    return y


def _zero_rows(y, start, n, HP):
    """y rows [start, start+n) = 0 (a padding sequence)."""
    for r0 in range(0, n, _PMAX):
        nr = min(_PMAX, n - r0)
        zt = nl.ndarray((nr, HP), dtype=y.dtype, buffer=nl.sbuf)
        nisa.memset(dst=zt, value=0.0)
        nisa.dma_copy(dst=y[start + r0:start + r0 + nr, :], src=zt)


def _d_heads(D_heads, ones, Q, H):
    """(D per head on Q rows [Q, H] fp32, identity [Q, Q] fp32) for the TensorE D x term."""
    Dh = nl.ndarray((Q, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=Dh, src=D_heads[0:Q, :])
    ident = nl.ndarray((Q, Q), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, pattern=[[-1, Q]], channel_multiplier=1,
                       on_true_tile=ones[:, 0:Q], on_false_value=0.0, cmp_op=nl.equal, offset=0)
    return Dh, ident


def _chunk(x, dt, B, C, z, y, A_sb, bias_sb, D_sb, DI, ones, U, Ls, ST,
           t0, L, H, P, N, G, HPG, hb, n_tiles, md, dt_softplus, dt_lo, dt_hi):
    """Prologue of one chunk of L tokens at token t0 (loads, dt', decay sums,
    C^T and masked CB per group) -> the chunk context the stages use."""
    HP = H * P
    GN = G * N
    # ---- loads (one DMA per tensor, all heads; z and y move per block). x is
    # widened to fp32 by the DMA: y_intra and D x are fp32 matmuls in both modes
    x_in = nl.ndarray((L, HP), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_in, src=x[t0:t0 + L, :])
    dt_in = nl.ndarray((L, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=dt_in, src=dt[t0:t0 + L, :])
    B_mm = nl.ndarray((L, GN), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=B_mm, src=B[t0:t0 + L, :])
    C_mm = nl.ndarray((L, GN), dtype=md, buffer=nl.sbuf)
    nisa.dma_copy(dst=C_mm, src=C[t0:t0 + L, :])

    # ---- dt' and dt'*A for all heads, fp32
    dtp = dt_prime(dt_in, bias_sb, L, H, dt_softplus, dt_lo, dt_hi)
    dtA = nl.ndarray((L, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dtA, data1=dtp, data2=A_sb[0:L, :], op=nl.multiply)
    # ln dt' (clamped into the ScalarE log range; a dt' below 1e-18 contributes
    # < 1e-18 of its term instead of 0)
    lndt = nl.ndarray((L, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=lndt, data=dtp, op0=nl.maximum, operand0=1.0e-18)
    nisa.activation(dst=lndt, op=nl.log, data=lndt)

    # ---- decay sums for all heads (fp32 matmuls with 0/1 operators), then exp
    ecs = _exp_of_matmul(U[0:L, 0:L], dtA, L, H)        # exp(cs_i), cs inclusive cumsum
    wd = _exp_of_matmul(Ls[0:L, 0:L], dtA, L, H)        # exp(sum_{k>j} dtA_k)
    nisa.tensor_tensor(dst=wd, data1=wd, data2=dtp, op=nl.multiply)   # * dt'_j
    elast = []
    for t in range(n_tiles):
        nt = min(_PMAX, N - t * _PMAX)
        # chunk total decay, the same value on each of the nt state partitions
        elast.append(_exp_of_matmul(ones[0:L, 0:nt], dtA, nt, H))

    # ---- per group: C^T tiles and the causally masked CB^T
    CTs, cbms = [], []
    for g in range(G):
        CT = []
        for t in range(n_tiles):
            n0 = g * N + t * _PMAX
            nt = min(_PMAX, N - t * _PMAX)
            CT.append(_transpose_to_sbuf(C_mm[:, n0:n0 + nt], L, nt, md))
        cb_ps = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.psum)
        for t in range(n_tiles):
            n0 = g * N + t * _PMAX
            nt = min(_PMAX, N - t * _PMAX)
            BT = _transpose_to_sbuf(B_mm[:, n0:n0 + nt], L, nt, nl.float32)
            CTf = CT[t]
            if md != nl.float32:
                # CB in fp32 from the C values (bf16-exact for bf16 inputs)
                CTf = nl.ndarray((nt, L), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_copy(dst=CTf, src=CT[t], engine=nisa.engine.scalar)
            # cb[j, i] = sum_n B[j, n] C[i, n]
            nisa.nc_matmul(dst=cb_ps, stationary=BT, moving=CTf, accumulate=(t > 0))
        cb = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=cb, src=cb_ps)
        cb_ps = None
        cbm = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
        # keep i >= j (j = partition): the causal mask of the decay matrix too
        nisa.affine_select(dst=cbm, pattern=[[1, L]], channel_multiplier=-1, on_true_tile=cb,
                           on_false_value=0.0, cmp_op=nl.greater_equal, offset=0)
        CTs.append(CT)
        cbms.append(cbm)

    return {"x_in": x_in, "B_mm": B_mm, "z": z, "y": y, "D_sb": D_sb,
            "Dh": DI[0] if DI != None else None,  # noqa: E711
            "ident": DI[1] if DI != None else None, "U": U,  # noqa: E711
            "Ls": Ls, "CTs": CTs, "cbms": cbms, "ST": ST, "dtA": dtA,
            "dtp": dtp, "lndt": lndt, "ecs": ecs, "wd": wd, "elast": elast, "L": L, "P": P,
            "N": N, "n_tiles": n_tiles, "md": md, "t0": t0}


def _sequence(x, dt, B, C, z, y, A_sb, bias_sb, D_sb, DI, ones, U, Ls, ST, start, n_s, Q,
              H, P, N, G, HPG, hb, n_tiles, md, dt_softplus, dt_lo, dt_hi, ahead):
    """All chunks of one sequence as one software pipeline over (chunk, head block) items.

    ``ahead``: None, or (pool, gather_idx, s) of the next sequence, whose
    state gather is issued right after the first chunk's prologue (its DMA
    then queues behind this sequence's first loads, not ahead of them);
    returns that gathered tile (or None).

    Ten stages per item (``_STAGES``, one engine each); in step b, stage k
    works on item b - k, so each engine's in-order queue holds work whose
    inputs were produced in earlier steps while an item's chain hops between
    engines. A chunk's prologue (loads, dt, cumsums, CB) is issued ``pre``
    steps before its first item so it overlaps the previous chunk's blocks;
    its y rows are stored once its last item leaves the pipeline.
    """
    blocks = []
    for g in range(G):
        for h0 in range(g * HPG, (g + 1) * HPG, hb):
            blocks.append((g, h0, min(hb, (g + 1) * HPG - h0)))
    # z / y move in groups of _IO_BLOCKS consecutive blocks (>= 2 KiB per
    # partition per DMA for bf16 at P = 64) instead of per chunk (SBUF) or per
    # block (DMA efficiency); item tuple: (g, h0, nh, io group, first, last, c0, c1)
    nb0 = len(blocks)
    for j in range(nb0):
        q = j // _IO_BLOCKS
        j0, j1 = q * _IO_BLOCKS, min(nb0, (q + 1) * _IO_BLOCKS) - 1
        g, h0, nh = blocks[j]
        blocks[j] = (g, h0, nh, q, j == j0, j == j1, blocks[j0][1] * P,
                     (blocks[j1][1] + blocks[j1][2]) * P)
    nb = len(blocks)
    chunks = []
    for c0 in range(0, n_s, Q):
        chunks.append((start + c0, min(Q, n_s - c0)))
    nc = len(chunks)
    stages = _STAGES
    ns = len(stages)
    # item (c+1, j) reads the state item (c, j) writes: its state-reading stage
    # must come after that state-writing stage, i.e. nb > _S_WRITE - _S_READ;
    # otherwise drain the pipeline at every chunk boundary
    across = nb > _S_WRITE - _S_READ
    pre = max(1, nb // 2)
    ctxs = [None] * nc
    work = [None] * (nc * nb)
    n_items = nc * nb

    # steps: lists of (stage, item); pro: step -> chunk whose prologue starts it
    nat = None
    steps = []
    pro = {}
    if across:
        for b in range(n_items + ns - 1):
            step = []
            for k in range(ns):
                if 0 <= b - k < n_items:
                    step.append((k, b - k))
            steps.append(step)
        for c in range(nc):
            pro[str(max(0, c * nb - pre))] = c
    else:
        for c in range(nc):
            pro[str(len(steps))] = c
            for b in range(nb + ns - 1):
                step = []
                for k in range(ns):
                    if 0 <= b - k < nb:
                        step.append((k, c * nb + b - k))
                steps.append(step)
    for si in range(len(steps)):
        if pro.get(str(si)) != None:  # noqa: E711  (NKI: no 'in' on a dict)
            # chunk prologue, ahead of the chunk's first item
            c = pro[str(si)]
            t0, L = chunks[c]
            ctxs[c] = _chunk(x, dt, B, C, z, y, A_sb, bias_sb, D_sb, DI, ones, U, Ls, ST,
                             t0, L, H, P, N, G, HPG, hb, n_tiles, md, dt_softplus, dt_lo,
                             dt_hi)
            if c == 0 and ahead != None:  # noqa: E711
                nat = _gather_state(ahead[0], ahead[1], ahead[2], H * P, N)
        for e in range(len(steps[si])):
            k, i = steps[si][e]
            c, j = i // nb, i % nb
            if k == 0:
                work[i] = {}
            stages[k](ctxs[c], blocks[j], work[i])
            if k == ns - 1:
                work[i] = None
                if j == nb - 1:
                    ctxs[c] = None
    return nat


# Stages of one (chunk, head block) item. Each stage runs on one engine
# (mostly), so in a pipeline step every engine's queue holds work whose
# inputs were produced in earlier steps.

def _st_w(ctx, blk, w):
    """ScalarE: W[k, (h,i)] = dtA[k,h] U[k,i] (fp32)."""
    g, h0, nh = blk[0], blk[1], blk[2]
    L, dtA = ctx["L"], ctx["dtA"]
    W = nl.ndarray((L, nh * L), dtype=nl.float32, buffer=nl.sbuf)
    for k in range(nh):
        nisa.tensor_scalar(dst=W[:, k * L:(k + 1) * L], data=ctx["U"][0:L, 0:L],
                           op0=nl.multiply, operand0=dtA[:, h0 + k:h0 + k + 1],
                           engine=nisa.engine.vector if k == _W_ON_VECTOR else nisa.engine.scalar)
    w["W"] = W


def _st_seg(ctx, blk, w):
    """TensorE: seg[j, (h,i)] = sum_{j<k<=i} dtA[k,h] = Ls^T W (fp32, exactly 0 for j >= i)."""
    g, h0, nh = blk[0], blk[1], blk[2]
    L = ctx["L"]
    seg_ps = nl.ndarray((L, nh * L), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=seg_ps, stationary=ctx["Ls"][0:L, 0:L], moving=w["W"], accumulate=False,
                   is_stationary_onezero=True)
    w["W"] = None
    w["seg"] = seg_ps


def _st_exp(ctx, blk, w):
    """ScalarE: Dm = exp(seg + ln dt'_j) (dt'_j enters as the exponent bias)."""
    g, h0, nh = blk[0], blk[1], blk[2]
    L = ctx["L"]
    Dm = nl.ndarray((L, nh * L), dtype=nl.float32, buffer=nl.sbuf)
    for k in range(nh):
        nisa.activation(dst=Dm[:, k * L:(k + 1) * L], op=nl.exp, data=w["seg"][:, k * L:(k + 1) * L],
                        bias=ctx["lndt"][:, h0 + k:h0 + k + 1])
    w["seg"] = None
    w["Dm"] = Dm


def _st_mt(ctx, blk, w):
    """GpSimd / VectorE: Mt = Dm * CBmask per head; ScalarE: bf16 copy of the block's state."""
    g, h0, nh = blk[0], blk[1], blk[2]
    L, P, md, ST = ctx["L"], ctx["P"], ctx["md"], ctx["ST"]
    Mt = nl.ndarray((L, nh * L), dtype=nl.float32, buffer=nl.sbuf)
    for k in range(nh):
        # alternate heads between GpSimd and VectorE (engine balance)
        nisa.tensor_tensor(dst=Mt[:, k * L:(k + 1) * L], data1=w["Dm"][:, k * L:(k + 1) * L],
                           data2=ctx["cbms"][g], op=nl.multiply,
                           engine=nisa.engine.gpsimd if k % 2 else nisa.engine.vector)
    w["Dm"] = None
    w["Mt"] = Mt
    c0, c1 = h0 * P, (h0 + nh) * P
    smm = []
    for t in range(ctx["n_tiles"]):
        if md == nl.float32:
            smm.append(ST[t][:, c0:c1])
        else:
            s_mm = nl.ndarray((ST[t].shape[0], nh * P), dtype=md, buffer=nl.sbuf)
            nisa.tensor_copy(dst=s_mm, src=ST[t][:, c0:c1], engine=nisa.engine.scalar)
            smm.append(s_mm)
    w["S"] = smm


def _st_out_mm(ctx, blk, w):
    """TensorE: y_intra (+ D x) fp32 matmuls per head, y_off per N tile (precision mode)."""
    g, h0, nh = blk[0], blk[1], blk[2]
    L, P, x_in = ctx["L"], ctx["P"], ctx["x_in"]
    Mt = w["Mt"]
    yi_ps = nl.ndarray((L, nh * P), dtype=nl.float32, buffer=nl.psum)
    for k in range(nh):
        h = h0 + k
        nisa.nc_matmul(dst=yi_ps[:, k * P:(k + 1) * P], stationary=Mt[:, k * L:(k + 1) * L],
                       moving=x_in[:, h * P:(h + 1) * P], accumulate=False)
        if ctx["Dh"] != None:  # noqa: E711
            # + D_h x_i: identity stationary, moving x_h D_h (ScalarE, fp32)
            xD = nl.ndarray((L, P), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=xD, data=x_in[:, h * P:(h + 1) * P], op0=nl.multiply,
                               operand0=ctx["Dh"][0:L, h:h + 1], engine=nisa.engine.scalar)
            nisa.nc_matmul(dst=yi_ps[:, k * P:(k + 1) * P], stationary=ctx["ident"][0:L, 0:L],
                           moving=xD, accumulate=True, is_stationary_onezero=True)
    w["Mt"] = None
    yo_ps = nl.ndarray((L, nh * P), dtype=nl.float32, buffer=nl.psum)
    for t in range(ctx["n_tiles"]):
        nisa.nc_matmul(dst=yo_ps, stationary=ctx["CTs"][g][t], moving=w["S"][t],
                       accumulate=(t > 0))
    w["S"] = None
    w["yi"] = yi_ps
    w["yo"] = yo_ps


def _st_scalar(ctx, blk, w):
    """ScalarE: y_off * exp(cs_i) per head, silu(z), chunk-state operand Xd = x dt' exp(ex)."""
    g, h0, nh = blk[0], blk[1], blk[2]
    L, P, md, x_in, ecs = ctx["L"], ctx["P"], ctx["md"], ctx["x_in"], ctx["ecs"]
    c0, c1 = h0 * P, (h0 + nh) * P
    yb = nl.ndarray((L, nh * P), dtype=nl.float32, buffer=nl.sbuf)
    for k in range(nh):
        nisa.activation(dst=yb[:, k * P:(k + 1) * P], op=nl.copy,
                        data=w["yo"][:, k * P:(k + 1) * P], scale=ecs[:, h0 + k:h0 + k + 1])
    w["yo"] = None
    w["yb"] = yb
    if ctx["z"] != None:  # noqa: E711
        t0, q, gc0, gc1 = ctx["t0"], blk[3], blk[6], blk[7]
        if blk[4]:
            zg = nl.ndarray((L, gc1 - gc0), dtype=ctx["z"].dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=zg, src=ctx["z"][t0:t0 + L, gc0:gc1])
            ctx["zg" + str(q)] = zg
        z_b = ctx["zg" + str(q)][:, c0 - gc0:c1 - gc0]
        if blk[5]:
            ctx["zg" + str(q)] = None
        sz = nl.ndarray((L, nh * P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sz, op=nl.silu, data=z_b)
        w["sz"] = sz
    Xd = nl.ndarray((L, nh * P), dtype=nl.float32, buffer=nl.sbuf)
    for k in range(nh):
        h = h0 + k
        nisa.tensor_scalar(dst=Xd[:, k * P:(k + 1) * P], data=x_in[:, h * P:(h + 1) * P],
                           op0=nl.multiply, operand0=ctx["wd"][:, h:h + 1],
                           engine=nisa.engine.scalar)
    w["Xd"] = Xd


def _st_yadd(ctx, blk, w):
    """VectorE: y = y_off + y_intra (PSUM operand)."""
    nisa.tensor_tensor(dst=w["yb"], data1=w["yb"], data2=w["yi"], op=nl.add)
    w["yi"] = None


def _st_yout(ctx, blk, w):
    """GpSimd: + x D (D per channel), * silu(z), into the chunk's y tile."""
    g, h0, nh = blk[0], blk[1], blk[2]
    L, P, D_sb, x_in = ctx["L"], ctx["P"], ctx["D_sb"], ctx["x_in"]
    c0, c1 = h0 * P, (h0 + nh) * P
    yb = w["yb"]
    if D_sb != None:  # noqa: E711
        xd = nl.ndarray((L, nh * P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=xd, data1=x_in[:, c0:c1], data2=D_sb[0:L, c0:c1], op=nl.multiply,
                           engine=nisa.engine.gpsimd)
        nisa.tensor_tensor(dst=yb, data1=yb, data2=xd, op=nl.add, engine=nisa.engine.gpsimd)
    t0, q, gc0, gc1 = ctx["t0"], blk[3], blk[6], blk[7]
    if blk[4]:
        ctx["yg" + str(q)] = nl.ndarray((L, gc1 - gc0), dtype=ctx["y"].dtype, buffer=nl.sbuf)
    yg = ctx["yg" + str(q)]
    y_b = yg[:, c0 - gc0:c1 - gc0]
    if ctx["z"] != None:  # noqa: E711
        nisa.tensor_tensor(dst=y_b, data1=yb, data2=w["sz"], op=nl.multiply,
                           engine=nisa.engine.gpsimd)
        w["sz"] = None
    else:
        nisa.tensor_copy(dst=y_b, src=yb, engine=nisa.engine.gpsimd)
    if blk[5]:
        nisa.dma_copy(dst=ctx["y"][t0:t0 + L, gc0:gc1], src=yg)
        ctx["yg" + str(q)] = None
    w["yb"] = None


def _st_state_mm(ctx, blk, w):
    """TensorE: chunk state B^T Xd per N tile."""
    g, h0, nh = blk[0], blk[1], blk[2]
    P, N, ST, B_mm = ctx["P"], ctx["N"], ctx["ST"], ctx["B_mm"]
    sps = []
    for t in range(ctx["n_tiles"]):
        n0 = g * N + t * _PMAX
        nt = ST[t].shape[0]
        st_ps = nl.ndarray((nt, nh * P), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=st_ps, stationary=B_mm[:, n0:n0 + nt], moving=w["Xd"],
                       accumulate=False)
        sps.append(st_ps)
    w["Xd"] = None
    w["st"] = sps


def _st_state(ctx, blk, w):
    """VectorE: S^T <- exp(total) S^T + chunk state, per head (fp32)."""
    g, h0, nh = blk[0], blk[1], blk[2]
    P, ST, elast = ctx["P"], ctx["ST"], ctx["elast"]
    for t in range(ctx["n_tiles"]):
        for k in range(nh):
            h = h0 + k
            nisa.scalar_tensor_tensor(dst=ST[t][:, h * P:(h + 1) * P],
                                      data=ST[t][:, h * P:(h + 1) * P], op0=nl.multiply,
                                      operand0=elast[t][:, h:h + 1], op1=nl.add,
                                      operand1=w["st"][t][:, k * P:(k + 1) * P])
    w["st"] = None


_STAGES = (_st_w, _st_seg, _st_exp, _st_mt, _st_out_mm, _st_scalar, _st_yadd, _st_yout,
           _st_state_mm, _st_state)
# stage reading the state (the bf16 copy / fp32 view in _st_mt) and the stage
# writing it: item (c+1, j) may only read after item (c, j) wrote
_S_READ, _S_WRITE = 3, 9
