"""Mamba-2 selective state update (decode, 1..T tokens per sequence), state pool in place.

Design: decode is bound by moving the state (``H*P*N`` floats per sequence,
read and written once per call), so the layout is chosen for the DMA. The
state of one sequence is gathered with ONE indirect DMA: row ``r = h*P + p``
of ``[H*P, N]`` goes to partition ``r // nt``, column block ``r % nt``, so
each partition reads ``nt*N`` contiguous pool elements (one row of the
``[slots*pr, nt*N]`` view: 20 KiB per partition at Mamba-2 2.7B, the DMA's
efficient regime), and partitions never straddle a group. Per-row
quantities (dt, x, z, A, D, dt_bias) are then ``[pr, nt]`` tiles and every
update is a per-partition-scalar instruction over N free elements:

    ScalarE  tmp = S * exp(dt' A)               (activation copy, column scale)
    VectorE  S   = B_bcast * (dt' x) + tmp      (scalar_tensor_tensor)
    VectorE  prod = S * C_bcast                 (tensor_tensor)
    ScalarE  y   = sum_n prod                   (activation copy, add-reduce)

GpSimd stays free of compute: it generates the descriptors of the indirect
(vector_offset, software-DGE) state gathers and scatters, and any compute
queued on it delays them (the cost model, like the hardware, runs GpSimd
in order).

B and C rows of each partition's group are broadcast to the ``pr``
partitions on TensorE (a K=G 0/1 selection matmul, exact) and read
straight from PSUM (the other operand of each instruction is in SBUF). T tokens keep the state in
SBUF (float32); it is written back once. The launcher only reshapes
per-row inputs (``[.., H*P] -> [.., pr, nt]``, per-head values repeated P
times).

Overlap: the four per-block instructions are software-pipelined over the
row blocks (step b: decay of block b, input of b-1, product of b-2, sum of
b-3), so ScalarE and VectorE run concurrently; state gathers are issued two
sequences ahead of the compute, because a gather issued after a scatter to
the same pool (run-time indices) has to wait for it. With only one or two
sequences, each state moves in 4 DMAs so the first row blocks update while
the rest arrives, and each part is scattered as soon as it is done. Modeled figures (DMA
bandwidth fraction at 1 / 32 / 512 sequences) are in the report; at 32 and
more sequences VectorE (two fp32 passes per state element) and the DMA
queues are both near their limits.

Compile time: T, the shapes and which sequences are padding (the cache
key; padding rows of y are written as zeros and their slots never
touched). Run time: pool slots (int32 row indices into the pool view).

Numerics: all float32 (no matmul precision choice: the only matmul is the
exact 0/1 broadcast). A bfloat16 pool is widened on load and rounded once
(RNE) on store.
"""
from __future__ import annotations

from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels.mamba2_ssd._common import dt_prime, load_f32


@nki.jit
def ssd_decode_step(x_rows, dt_rows, A_rows, B, C, group_sel, D_rows, z_rows, bias_rows,
                    pool, pool_idx, live, T, dt_softplus, dt_lo, dt_hi):
    """Selective state update; returns y ``[num_seqs*T*pr, nt]`` float32 (row layout).

    Row layout: state row ``r = h*P + p`` of a sequence sits at partition
    ``r // nt``, column ``r % nt`` (``pr * nt = H*P``), so each partition
    holds ``nt`` consecutive pool rows = one row of the ``pool`` view.
    HBM arrays (prepared by the launcher):
      x_rows, dt_rows ``[num_seqs*T*pr, nt]`` float32 (dt raw, per row's
      head), z_rows same or None, A_rows, D_rows, bias_rows ``[pr, nt]``
      float32 (D, dt_bias may be None), B, C ``[num_seqs*T*G, N]``,
      group_sel ``[G, pr]`` (B's dtype, 1 where partition q's rows are in
      group g), pool
      ``[slots*pr, nt*N]`` (the pool ``[slots, H, P, N]``, updated in place),
      pool_idx ``[num_seqs*pr, 1]`` int32 (``slot*pr + q``).
    Compile-time: live (tuple of bools, one per sequence: False = padding,
      zero output, pool untouched), T, dt_softplus, dt_lo, dt_hi.
    """
    pr, nt = A_rows.shape
    num_seqs = len(live)
    N = pool.shape[1] // nt
    G = group_sel.shape[0]
    y = nl.ndarray((num_seqs * T * pr, nt), dtype=nl.float32, buffer=nl.shared_hbm)

    A_sb = load_f32(A_rows, pr, nt)
    bias_sb = load_f32(bias_rows, pr, nt)
    D_sb = load_f32(D_rows, pr, nt)
    sel = nl.ndarray((G, pr), dtype=group_sel.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sel, src=group_sel)

    live_ids = []
    for s in range(num_seqs):
        if live[s]:
            live_ids.append(s)
    for s in range(num_seqs):
        if not live[s]:
            zt = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=zt, value=0.0)
            for tok in range(T):
                r0 = (s * T + tok) * pr
                nisa.dma_copy(dst=y[r0:r0 + pr, :], src=zt)

    units = _units(live_ids, nt, N, pool.dtype == nl.float32)
    # few sequences: split each unit's DMA in parts so the update of the first
    # row blocks overlaps the gather of the later ones (and their scatter the
    # rest of the update); many sequences overlap across sequences instead
    parts = 1
    if len(live_ids) <= 2:
        parts = max(1, _PARTS // (len(units) // len(live_ids)))
    # Gathers run _AHEAD units ahead of the compute: the pool is one HBM
    # tensor with run-time indices, so a gather issued after a scatter must
    # wait for it; issuing it before keeps the DMA queues streaming.
    got = {}
    idxs = {}
    toks = []
    for n in range(len(units) + _AHEAD):
        if n < len(units):
            s, a, b = units[n][0], units[n][1], units[n][2]
            if a == 0:
                idx = nl.ndarray((pr, 1), dtype=nl.int32, buffer=nl.sbuf)
                nisa.dma_copy(dst=idx, src=pool_idx[s * pr:(s + 1) * pr, :])
                idxs[str(s)] = idx
            got[str(n)] = _gather(pool, idxs[str(s)], pr, nt, N, a, b, parts)
        m = n - _AHEAD
        if m >= 0:
            s, a, b = units[m][0], units[m][1], units[m][2]
            if a == 0:
                # per-token inputs of the sequence, shared by all its units
                toks = []
                for tok in range(T):
                    toks.append(_tok_in(x_rows, dt_rows, B, C, A_sb, bias_sb, s * T + tok,
                                        pr, nt, N, G, dt_softplus, dt_lo, dt_hi))
            nat = got[str(m)]
            got[str(m)] = None
            if pool.dtype == nl.float32:
                S = nat
            else:
                S = nl.ndarray((pr, (b - a) * N), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_copy(dst=S, src=nat)
            for tok in range(T):
                # the last token scatters each part as soon as its blocks are updated
                out = None
                if tok == T - 1:
                    out = (pool, idxs[str(s)], nat, parts)
                _tok_update(toks[tok], sel, S, a, b, pr, nt, N, out)
            S = None
            nat = None
            if b == nt:
                for tok in range(T):
                    _tok_out(toks[tok], z_rows, D_sb, y, s * T + tok, pr, nt)
                toks = []
                idxs[str(s)] = None
    return y


_AHEAD = 2            # state units gathered ahead of the one being updated
_PARTS = 4            # state DMAs per sequence when only one or two sequences are live
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


def _scatter(pool, idx, nat, S, pr, nt, N, a, pa, pe):
    """Local blocks [pa, pe) of the unit at block a back to the pool (one DMA)."""
    if pool.dtype != nl.float32:
        nisa.tensor_copy(dst=nat[:, pa * N:pe * N], src=S[:, pa * N:pe * N])
    view = pool.ap(pattern=[[nt * N, pr], [1, (pe - pa) * N]], offset=(a + pa) * N,
                   vector_offset=idx, indirect_dim=0)
    nisa.dma_copy(dst=view, src=nat[:, pa * N:pe * N])


def _tok_in(x_rows, dt_rows, B, C, A_sb, bias_sb, row, pr, nt, N, G, dt_softplus, dt_lo,
            dt_hi):
    """Per-row inputs of one token of one sequence: decay exp(dt' A), dt' x,
    B and C rows, the y accumulator (all [pr, nt] fp32 but B, C [G, N])."""
    r0, r1 = row * pr, (row + 1) * pr
    dt_c = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=dt_c, src=dt_rows[r0:r1, :])
    x_c = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_c, src=x_rows[r0:r1, :])
    b_g = nl.ndarray((G, N), dtype=B.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b_g, src=B[row * G:(row + 1) * G, :])
    c_g = nl.ndarray((G, N), dtype=C.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=c_g, src=C[row * G:(row + 1) * G, :])

    dtp = dt_prime(dt_c, bias_sb, pr, nt, dt_softplus, dt_lo, dt_hi)
    dA = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dA, data1=dtp, data2=A_sb, op=nl.multiply)
    nisa.activation(dst=dA, op=nl.exp, data=dA)
    dtx = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dtx, data1=dtp, data2=x_c, op=nl.multiply)
    yc = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    return {"x": x_c, "dA": dA, "dtx": dtx, "b": b_g, "c": c_g, "y": yc}


def _tok_update(tk, sel, S, a, b, pr, nt, N, out):
    """One token on row blocks [a, b): update S [pr, (b-a)*N] in place, y columns [a, b).

    ``out``: None, or (pool, idx, nat, parts) on the last token: each part
    of the unit is scattered right after its last row block is updated.
    """
    dA, dtx, yc = tk["dA"], tk["dtx"], tk["y"]
    # B and C of each partition's group on every partition (exact 0/1 matmul, K = G)
    bb = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=bb, stationary=sel, moving=tk["b"], accumulate=False)
    cc = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=cc, stationary=sel, moving=tk["c"], accumulate=False)

    # per row block u: ScalarE decay, VectorE input, VectorE C product, ScalarE
    # free-dim sum; software-pipelined (step i: stage k on block i-k) so each
    # engine's in-order queue never waits on work issued in the same step
    nu = b - a
    tmps = [None] * nu
    prods = [None] * nu
    for i in range(nu + 3):
        u = i
        if u < nu:
            t = a + u
            tmps[u] = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=tmps[u], op=nl.copy, data=S[:, u * N:(u + 1) * N],
                            scale=dA[:, t:t + 1])
        u = i - 1
        if 0 <= u < nu:
            t = a + u
            nisa.scalar_tensor_tensor(dst=S[:, u * N:(u + 1) * N], data=bb, op0=nl.multiply,
                                      operand0=dtx[:, t:t + 1], op1=nl.add, operand1=tmps[u])
            tmps[u] = None
            if out != None:  # noqa: E711
                for k in range(out[3]):
                    pa, pe = _part_bounds(nu, out[3], k)
                    if pe > pa and u == pe - 1:
                        _scatter(out[0], out[1], out[2], S, pr, nt, N, a, pa, pe)
        u = i - 2
        if 0 <= u < nu:
            prods[u] = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=prods[u], data1=S[:, u * N:(u + 1) * N], data2=cc,
                               op=nl.multiply, engine=nisa.engine.vector)
        u = i - 3
        if 0 <= u < nu:
            t = a + u
            nisa.activation(dst=prods[u], op=nl.copy, data=prods[u], reduce_op=nl.add,
                            reduce_res=yc[:, t:t + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce)
            prods[u] = None


def _tok_out(tk, z_rows, D_sb, y, row, pr, nt):
    """y rows of one token: (sum_n S C + D x) * silu(z), stored."""
    r0, r1 = row * pr, (row + 1) * pr
    yc = tk["y"]
    if D_sb != None:  # noqa: E711
        xd = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=xd, data1=tk["x"], data2=D_sb, op=nl.multiply)
        nisa.tensor_tensor(dst=yc, data1=yc, data2=xd, op=nl.add)
    if z_rows != None:  # noqa: E711
        z_c = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=z_c, src=z_rows[r0:r1, :])
        nisa.activation(dst=z_c, op=nl.silu, data=z_c)
        nisa.tensor_tensor(dst=yc, data1=yc, data2=z_c, op=nl.multiply)
    nisa.dma_copy(dst=y[r0:r1, :], src=yc)
