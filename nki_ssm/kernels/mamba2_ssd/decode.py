"""Mamba-2 selective state update (decode, 1..T tokens per sequence), state pool in place.

Design: decode is bound by moving the state (``H*P*N`` floats per sequence,
read and written once per call), so the layout is chosen for the DMA. The
state of one sequence is gathered by indirect DMA: row ``r = h*P + p`` of
``[H*P, N]`` goes to partition ``r // nt``, column block ``r % nt``, so each
partition reads ``nt*N`` contiguous pool elements (one row of the
``[slots*pr, nt*N]`` view: 20 KiB per partition at Mamba-2 2.7B, the DMA's
efficient regime), and partitions never straddle a group. Per-row
quantities (dt, x, z, A, D, dt_bias) are then ``[pr, nt]`` tiles and every
update is a per-partition-scalar instruction over N free elements, in a
five-stage pipeline per row block t:

    ScalarE  tmp = S * exp(dt' A)               (activation copy, column scale)
    input, alternating by block (engine balance):
      t even: VectorE  S = B_bcast * (dt' x) + tmp        (scalar_tensor_tensor)
      t odd:  ScalarE  inp = B_bcast * (dt' x); TensorE PSUM = I tmp + I inp
              (fp32 identity matmuls, 0/1 stationary); ScalarE S = PSUM
    VectorE  prod = S * C_bcast                 (tensor_tensor; every 2nd on
                                                 GpSimd with 1-2 sequences)
    ScalarE  y   = sum_n prod                   (activation copy, add-reduce)
    ScalarE  pool tile = S                      (bf16 pool, last token only)

Two fp32 2-input VectorE passes per state element made VectorE the bound
(~98 % busy at 512 sequences); the TensorE path of odd blocks moves half
of one pass to ScalarE (1-input, faster clock) and TensorE, which were
idle (2.7B, 16 sequences: 375 -> 291 us modeled). Like the prefill's
exact mode it takes fp32 TensorE products and PSUM accumulation as exact
(a 0/1 stationary: each output is 1.0 * tmp + 1.0 * inp, one fp32 add).

State units (SBUF): a sequence's state is cut into as few equal units of
row blocks as keep a unit within ``_UNIT_BYTES`` (48 KiB) per partition,
counting the fp32 working copy and, for a bfloat16 pool, the pool-dtype
tile. Mamba-2 2.7B (20 KiB fp32) and Granite-like (32 KiB fp32, 48 KiB
with a bf16 pool) use one unit; Falcon-H1-like (N = 256: 64 KiB fp32,
96 KiB with a bf16 pool) two. The _AHEAD + 1 = 3 units in flight then take
<= 144 KiB of the 208 KiB usable (Falcon-H1 peak 136 KiB modeled with 4
sequences), whatever the dstate. Units are independent (rows are), so the
results do not depend on the cut (tested bit for bit).

GpSimd generates the descriptors of the indirect (vector_offset,
software-DGE) state gathers and scatters; any compute queued on it delays
them (the cost model, like the hardware, runs GpSimd in order). With many
sequences it does no compute. With one or two it takes every second C
product (from an SBUF copy of C: GpSimd cannot read PSUM), since its few
descriptors are made up front.

B and C rows of each partition's group are broadcast to the ``pr``
partitions on TensorE (one K=G 0/1 selection matmul for [B | C], exact)
and read straight from PSUM. T tokens keep the state in SBUF (float32);
it is written back once. Small DMAs cost ~1 us each in the model (latency,
low efficiency at < 512 B per partition), so the launcher packs x | dt | z
per token, A | dt_bias | D, and B | C into one array each.

Overlap: the four per-block instructions are software-pipelined over the
row blocks (step b: decay of block b, input of b-1, product of b-2, sum of
b-3), so ScalarE and VectorE run concurrently; state gathers are issued two
units ahead of the compute, because a DMA to or from the pool (run-time
indices) has to wait for every earlier one that may overlap it. A
sequence's token inputs are loaded just before its first gather (DMA
queues are FIFO: behind the gathers they held up the first compute by the
whole gather). With only one or two sequences, each unit moves in up to 4
DMAs so the first row blocks update while the rest arrives; each part is
scattered ``_SCATTER_LAG`` blocks after its last update (so the GpSimd
products just issued are not queued behind the scatter's descriptors,
which wait for the last gather).

Modeled (trn2, nki_ssm.perf; ``python3 -m simulate --set judged --op
mamba2_ssd``; Mamba-2 2.7B, float32 state, bf16 I/O; bytes = minimal HBM
traffic against the 368 GB/s core DMA bandwidth):
  1 sequence     24.3 us   58.8 %  (DMA-bound: pool DMAs serialised)
  32 sequences  563.6 us   81.2 %  (VectorE 94 %, DMA queues 92 % busy)
  512 sequences  8.74 ms   83.8 %  (goal >= 60 %)
(before this round: 38.5 us / 37 %, 750 us / 61 %, 11.45 ms / 64 %). The
pool DMAs are serialised by their run-time indices (each waits for the
earlier ones that may overlap it), which bounds the many-sequence case
not far above this.

Compile time: T, the shapes and which sequences are padding (the cache
key; padding rows of y are written as zeros and their slots never
touched). Run time: pool slots (int32 row indices into the pool view).

Numerics: all float32 (no matmul precision choice: the only matmul is the
exact 0/1 broadcast). A bfloat16 pool is widened by the first token's
decay (ScalarE reads the bf16 tile, writes fp32: no separate widening
pass) and rounded once (RNE) by a per-block ScalarE copy on the last
token, pipelined with the update (whole-tile conversions serialised the
update: 2.7B, 16 sequences, bf16 pool 539 -> 369 us modeled).
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels.mamba2_ssd._common import dt_prime


@nki.jit
def ssd_decode_step(xdt_rows, params, BC, group_sel, pool, pool_idx, live, T, has_z, has_bias,
                    has_D, dt_softplus, dt_lo, dt_hi):
    """Selective state update; returns y ``[num_seqs*T*pr, nt]`` float32 (row layout).

    Row layout: state row ``r = h*P + p`` of a sequence sits at partition
    ``r // nt``, column ``r % nt`` (``pr * nt = H*P``), so each partition
    holds ``nt`` consecutive pool rows = one row of the ``pool`` view.
    HBM arrays (prepared by the launcher; per-token and per-row inputs are
    packed so each moves with one DMA: small DMAs cost ~1 us each):
      xdt_rows ``[num_seqs*T*pr, k*nt]`` float32: x, raw dt (per row's
      head) and, if has_z, z, as consecutive ``nt``-column blocks;
      params ``[pr, k*nt]`` float32: A, then dt_bias if has_bias, then D if
      has_D (per row); BC ``[num_seqs*T*G, 2*N]``: B then C;
      group_sel ``[G, pr]`` (BC's dtype, 1 where partition q's rows are in
      group g), pool
      ``[slots*pr, nt*N]`` (the pool ``[slots, H, P, N]``, updated in place),
      pool_idx ``[num_seqs*pr, 1]`` int32 (``slot*pr + q``).
    Compile-time: live (tuple of bools, one per sequence: False = padding,
      zero output, pool untouched), T, has_z, has_bias, has_D, dt_softplus,
      dt_lo, dt_hi.
    """
    pr = params.shape[0]
    k = 2
    if has_z:
        k = 3
    nt = xdt_rows.shape[1] // k
    num_seqs = len(live)
    N = pool.shape[1] // nt
    G = group_sel.shape[0]
    y = nl.ndarray((num_seqs * T * pr, nt), dtype=nl.float32, buffer=nl.shared_hbm)

    live_ids = []
    for s in range(num_seqs):
        if live[s]:
            live_ids.append(s)
    units = _units(live_ids, nt, N, pool.dtype == nl.float32)
    # few sequences: split each unit's DMA in parts so the update of the first
    # row blocks overlaps the gather of the later ones (and their scatter the
    # rest of the update), and let GpSimd take some C products (its queue is
    # free once the few gathers' descriptors are made); many sequences overlap
    # across sequences instead, and GpSimd only makes descriptors
    parts = 1
    gp_every = 0
    if len(live_ids) <= 2:
        parts = max(1, _PARTS // (len(units) // len(live_ids)))
        gp_every = _GPSIMD_EVERY

    # Gathers run _AHEAD units ahead of the compute: the pool is one HBM
    # tensor with run-time indices, so a gather issued after a scatter must
    # wait for it; issuing it before keeps the DMA queues streaming. A
    # sequence's token inputs are loaded right before its first gather (DMA
    # queues are FIFO: behind the gathers they would hold up the compute).
    got = {}
    idxs = {}
    toks = {}
    prm = None
    sel = None
    ident = None
    for n in range(len(units) + _AHEAD):
        if n < len(units):
            s, a, b = units[n][0], units[n][1], units[n][2]
            if a == 0:
                idx = nl.ndarray((pr, 1), dtype=nl.int32, buffer=nl.sbuf)
                nisa.dma_copy(dst=idx, src=pool_idx[s * pr:(s + 1) * pr, :])
                idxs[str(s)] = idx
                if n == 0:
                    prm = nl.ndarray((pr, params.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=prm, src=params)
                    sel = nl.ndarray((G, pr), dtype=group_sel.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=sel, src=group_sel)
                    ident = _identity(pr)
                tl = []
                for tok in range(T):
                    tl.append(_tok_load(xdt_rows, BC, s * T + tok, pr, G, N))
                toks[str(s)] = tl
            got[str(n)] = _gather(pool, idxs[str(s)], pr, nt, N, a, b, parts)
        m = n - _AHEAD
        if m >= 0:
            s, a, b = units[m][0], units[m][1], units[m][2]
            tl = toks[str(s)]
            if a == 0:
                for tok in range(T):
                    _tok_prep(tl[tok], prm, pr, nt, has_bias, dt_softplus, dt_lo, dt_hi)
            nat = got[str(m)]
            got[str(m)] = None
            # fp32 working state; a bf16 pool tile is widened block by block
            # by the first token's decay and narrowed by the last token
            S = nat
            if pool.dtype != nl.float32:
                S = nl.ndarray((pr, (b - a) * N), dtype=nl.float32, buffer=nl.sbuf)
            for tok in range(T):
                # the last token scatters each part as soon as its blocks are updated
                out = None
                if tok == T - 1:
                    out = (pool, idxs[str(s)], nat, parts)
                S_in = S
                if tok == 0:
                    S_in = nat
                _tok_update(tl[tok], sel, ident, S_in, S, a, b, pr, nt, N, gp_every, out)
            S = None
            nat = None
            if b == nt:
                for tok in range(T):
                    _tok_out(tl[tok], prm, y, s * T + tok, pr, nt, has_z, has_bias, has_D)
                toks[str(s)] = None
                idxs[str(s)] = None
    # padding sequences: zero rows of y, no pool access (after the live work:
    # their small stores would otherwise queue ahead of the first gather)
    for s in range(num_seqs):
        if not live[s]:
            zt = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=zt, value=0.0)
            for tok in range(T):
                r0 = (s * T + tok) * pr
                nisa.dma_copy(dst=y[r0:r0 + pr, :], src=zt)
    return y


_AHEAD = 2            # state units gathered ahead of the one being updated
_PARTS = 4            # state DMAs per sequence when only one or two sequences are live
_GPSIMD_EVERY = 2     # with 1-2 sequences, every 2nd C product runs on GpSimd
_SCATTER_LAG = 4      # blocks between a part's last update and its scatter (few sequences)
_PE_CYCLE = 2       # blocks t % _PE_CYCLE != 0 take the TensorE input path
_UNIT_BYTES = 48 * 1024   # SBUF bytes per partition of one state unit (fp32 state + pool copy)


def _units(live_ids, nt, N, f32_pool):
    """State units ``(seq, a, b)``: row blocks [a, b) of a sequence's state.

    A sequence is cut into as few equal units as keep one unit within
    _UNIT_BYTES per partition, so the _AHEAD + 1 units in flight fit in SBUF
    at any dstate (Falcon-H1, N = 256: 64 KiB fp32 per sequence -> 2 units;
    Mamba-2 2.7B and Granite-like: 1 unit).
    """
    row_bytes = N * 4
    if not f32_pool:
        row_bytes = N * 6     # fp32 working copy + the bf16 pool tile
    split = min(nt, (nt * row_bytes + _UNIT_BYTES - 1) // _UNIT_BYTES)
    span = (nt + split - 1) // split
    units = []
    for s in live_ids:
        for a in range(0, nt, span):
            units.append((s, a, min(nt, a + span)))
    return units


def _part_bounds(n, parts, k):
    """Blocks [a, b) of part k of ``parts`` over n blocks."""
    tp = (n + parts - 1) // parts
    return min(n, k * tp), min(n, (k + 1) * tp)


def _gather(pool, idx, pr, nt, N, a, b, parts):
    """Row blocks [a, b) of a sequence's state -> new tile [pr, (b-a)*N] in the
    pool dtype (``parts`` DMAs; ``idx`` [pr, 1] int32 pool rows)."""
    nat = nl.ndarray((pr, (b - a) * N), dtype=pool.dtype, buffer=nl.sbuf)
    for k in range(parts):
        pa, pe = _part_bounds(b - a, parts, k)
        if pe > pa:
            view = pool.ap(pattern=[[nt * N, pr], [1, (pe - pa) * N]], offset=(a + pa) * N,
                           vector_offset=idx, indirect_dim=0)
            nisa.dma_copy(dst=nat[:, pa * N:pe * N], src=view)
    return nat


def _scatter(pool, idx, nat, pr, nt, N, a, pa, pe):
    """Local blocks [pa, pe) of the unit at block a back to the pool (one DMA)."""
    view = pool.ap(pattern=[[nt * N, pr], [1, (pe - pa) * N]], offset=(a + pa) * N,
                   vector_offset=idx, indirect_dim=0)
    nisa.dma_copy(dst=view, src=nat[:, pa * N:pe * N])


def _tok_load(xdt_rows, BC, row, pr, G, N):
    """Start the loads of one token's inputs: x | dt | z rows and B | C (one DMA each)."""
    xdt = nl.ndarray((pr, xdt_rows.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xdt, src=xdt_rows[row * pr:(row + 1) * pr, :])
    bc = nl.ndarray((G, 2 * N), dtype=BC.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=bc, src=BC[row * G:(row + 1) * G, :])
    return {"xdt": xdt, "bc": bc}


def _tok_prep(tk, prm, pr, nt, has_bias, dt_softplus, dt_lo, dt_hi):
    """Per-row quantities of one token, into ``tk``: decay exp(dt' A), dt' x,
    and the y accumulator (all [pr, nt] fp32)."""
    xdt = tk["xdt"]
    bias = None
    if has_bias:
        bias = prm[:, nt:2 * nt]
    dtp = dt_prime(xdt[:, nt:2 * nt], bias, pr, nt, dt_softplus, dt_lo, dt_hi)
    dA = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dA, data1=dtp, data2=prm[:, 0:nt], op=nl.multiply)
    nisa.activation(dst=dA, op=nl.exp, data=dA)
    dtx = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dtx, data1=dtp, data2=xdt[:, 0:nt], op=nl.multiply)
    tk["dA"] = dA
    tk["dtx"] = dtx
    tk["y"] = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)


def _identity(pr):
    """fp32 identity [pr, pr] (the TensorE add of the input path)."""
    ones = nl.ndarray((pr, pr), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    ident = nl.ndarray((pr, pr), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, pattern=[[-1, pr]], channel_multiplier=1, on_true_tile=ones,
                       on_false_value=0.0, cmp_op=nl.equal, offset=0)
    return ident


def _tok_update(tk, sel, ident, S_in, S, a, b, pr, nt, N, gp_every, out):
    """One token on row blocks [a, b): S [pr, (b-a)*N] fp32 <- update of S_in
    (S itself, or the pool-dtype tile on the first token), y columns [a, b).

    ``out``: None, or (pool, idx, nat, parts) on the last token: each part
    of the unit is scattered (``_SCATTER_LAG`` blocks) after its last row
    block is final; a non-fp32 pool tile ``nat`` is first rounded from S
    block by block on ScalarE.
    """
    narrow = False
    if out != None:  # noqa: E711
        narrow = out[2].dtype != nl.float32
    dA, dtx, yc = tk["dA"], tk["dtx"], tk["y"]
    # B and C of each partition's group on every partition (exact 0/1 matmul,
    # K = G, one PSUM bank for [B | C] up to N = 256)
    bc = nl.ndarray((pr, 2 * N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=bc, stationary=sel, moving=tk["bc"], accumulate=False)
    bb = bc[:, 0:N]
    cc = bc[:, N:2 * N]
    # GpSimd takes every gp_every-th C product (VectorE balance); it cannot
    # read PSUM, so it gets an SBUF copy of C (ScalarE)
    cc_g = cc
    if gp_every > 0:
        cc_g = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=cc_g, op=nl.copy, data=cc)

    # per row block u, five stages, software-pipelined (step i: stage k on
    # block i-k) so each engine's in-order queue never waits on work issued
    # in the same step:
    #   0 ScalarE decay tmp = S_in dA (and, TensorE path, inp = B dt'x)
    #   1 input: VectorE S = B dt'x + tmp, or TensorE PSUM = I tmp + I inp
    #   2 ScalarE S = PSUM (TensorE path)
    #   3 VectorE / GpSimd prod = S C
    #   4 ScalarE y = sum prod (and the bf16 pool copy of S)
    # The TensorE path (blocks t % _PE_CYCLE != 0) moves one 2-input fp32
    # pass per element from VectorE to ScalarE / TensorE (engine balance).
    nu = b - a
    tmps = [None] * nu
    inps = [None] * nu
    pss = [None] * nu
    prods = [None] * nu
    for i in range(nu + 4):
        u = i
        if u < nu:
            t = a + u
            tmps[u] = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=tmps[u], op=nl.copy, data=S_in[:, u * N:(u + 1) * N],
                            scale=dA[:, t:t + 1])
            if t % _PE_CYCLE != 0:
                inps[u] = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=inps[u], op=nl.copy, data=bb, scale=dtx[:, t:t + 1])
        u = i - 1
        if 0 <= u < nu:
            t = a + u
            if t % _PE_CYCLE != 0:
                pss[u] = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=pss[u], stationary=ident, moving=tmps[u], accumulate=False,
                               is_stationary_onezero=True)
                nisa.nc_matmul(dst=pss[u], stationary=ident, moving=inps[u], accumulate=True,
                               is_stationary_onezero=True)
                inps[u] = None
            else:
                nisa.scalar_tensor_tensor(dst=S[:, u * N:(u + 1) * N], data=bb,
                                          op0=nl.multiply, operand0=dtx[:, t:t + 1],
                                          op1=nl.add, operand1=tmps[u])
            tmps[u] = None
        u = i - 2
        if 0 <= u < nu:
            if pss[u] != None:  # noqa: E711
                nisa.activation(dst=S[:, u * N:(u + 1) * N], op=nl.copy, data=pss[u])
                pss[u] = None
            if out != None and not narrow:  # noqa: E711
                _scatter_due(out, u, nu, pr, nt, N, a)
        u = i - 3
        if 0 <= u < nu:
            prods[u] = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.sbuf)
            if gp_every > 0 and u % gp_every == gp_every - 1:
                nisa.tensor_tensor(dst=prods[u], data1=S[:, u * N:(u + 1) * N], data2=cc_g,
                                   op=nl.multiply, engine=nisa.engine.gpsimd)
            else:
                nisa.tensor_tensor(dst=prods[u], data1=S[:, u * N:(u + 1) * N], data2=cc,
                                   op=nl.multiply, engine=nisa.engine.vector)
        u = i - 4
        if 0 <= u < nu:
            t = a + u
            nisa.activation(dst=prods[u], op=nl.copy, data=prods[u], reduce_op=nl.add,
                            reduce_res=yc[:, t:t + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce)
            prods[u] = None
            if narrow:
                nisa.activation(dst=out[2][:, u * N:(u + 1) * N], op=nl.copy,
                                data=S[:, u * N:(u + 1) * N])
                _scatter_due(out, u, nu, pr, nt, N, a)


def _scatter_due(out, u, nu, pr, nt, N, a):
    """Scatter the part of ``out`` = (pool, idx, nat, parts) that is due once
    local block u is final (``_SCATTER_LAG`` blocks after the part's last)."""
    for k in range(out[3]):
        pa, pe = _part_bounds(nu, out[3], k)
        if pe > pa and u == min(pe - 1 + _SCATTER_LAG, nu - 1):
            _scatter(out[0], out[1], out[2], pr, nt, N, a, pa, pe)


def _tok_out(tk, prm, y, row, pr, nt, has_z, has_bias, has_D):
    """y rows of one token: (sum_n S C + D x) * silu(z), stored."""
    r0, r1 = row * pr, (row + 1) * pr
    yc, xdt = tk["y"], tk["xdt"]
    if has_D:
        d0 = nt
        if has_bias:
            d0 = 2 * nt
        xd = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=xd, data1=xdt[:, 0:nt], data2=prm[:, d0:d0 + nt], op=nl.multiply)
        nisa.tensor_tensor(dst=yc, data1=yc, data2=xd, op=nl.add)
    if has_z:
        sz = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sz, op=nl.silu, data=xdt[:, 2 * nt:3 * nt])
        nisa.tensor_tensor(dst=yc, data1=yc, data2=sz, op=nl.multiply)
    nisa.dma_copy(dst=y[r0:r1, :], src=yc)
