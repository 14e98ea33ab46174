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

    A_sb = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=A_sb, src=A_rows)
    bias_sb = None
    if bias_rows != None:  # noqa: E711  (NKI has no `is`)
        bias_sb = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bias_sb, src=bias_rows)
    D_sb = None
    if D_rows != None:  # noqa: E711
        D_sb = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=D_sb, src=D_rows)
    sel = nl.ndarray((G, pr), dtype=group_sel.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sel, src=group_sel)

    # Gathers run _AHEAD sequences ahead of the compute: the pool is one HBM
    # tensor with run-time indices, so a gather issued after a scatter must
    # wait for it; issuing it before keeps the DMA queues streaming.
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
    # few sequences: split each state DMA in parts so the update of the first
    # row blocks overlaps the gather of the later ones (and their scatter the
    # rest of the update); many sequences overlap across sequences instead
    parts = _PARTS if len(live_ids) <= 2 else 1
    got = {}
    for n in range(len(live_ids) + _AHEAD):
        if n < len(live_ids):
            got[str(n)] = _gather(pool, pool_idx, live_ids[n], pr, nt, N, parts)
        m = n - _AHEAD
        if m >= 0:
            s = live_ids[m]
            idx, nat = got.pop(str(m))
            if pool.dtype == nl.float32:
                S = nat
            else:
                S = nl.ndarray((pr, nt * N), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_copy(dst=S, src=nat)
            for tok in range(T):
                # the last token scatters each part as soon as its blocks are updated
                out = (pool, idx, nat, parts) if tok == T - 1 else None
                _token(x_rows, dt_rows, z_rows, B, C, y, A_sb, bias_sb, D_sb, sel, S,
                       s * T + tok, pr, nt, N, G, dt_softplus, dt_lo, dt_hi, out)
    return y


_AHEAD = 2   # sequences whose state is gathered ahead of the one being updated
_PARTS = 4   # state DMAs per sequence when only one or two sequences are live


def _part_bounds(nt, parts, k):
    """Row blocks [a, b) of part k of ``parts``."""
    tp = (nt + parts - 1) // parts
    return min(nt, k * tp), min(nt, (k + 1) * tp)


def _gather(pool, pool_idx, s, pr, nt, N, parts):
    """(row indices, state tile [pr, nt*N] in the pool dtype) of sequence s (``parts`` DMAs)."""
    idx = nl.ndarray((pr, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=pool_idx[s * pr:(s + 1) * pr, :])
    nat = nl.ndarray((pr, nt * N), dtype=pool.dtype, buffer=nl.sbuf)
    for k in range(parts):
        a, b = _part_bounds(nt, parts, k)
        if b > a:
            view = pool.ap(pattern=[[nt * N, pr], [1, (b - a) * N]], offset=a * N,
                           vector_offset=idx, indirect_dim=0)
            nisa.dma_copy(dst=nat[:, a * N:b * N], src=view)
    return idx, nat


def _scatter(pool, idx, nat, S, pr, nt, N, a, b):
    """Row blocks [a, b) of the updated state back to the pool (one DMA)."""
    if pool.dtype != nl.float32:
        nisa.tensor_copy(dst=nat[:, a * N:b * N], src=S[:, a * N:b * N])
    view = pool.ap(pattern=[[nt * N, pr], [1, (b - a) * N]], offset=a * N, vector_offset=idx,
                   indirect_dim=0)
    nisa.dma_copy(dst=view, src=nat[:, a * N:b * N])


def _token(x_rows, dt_rows, z_rows, B, C, y, A_sb, bias_sb, D_sb, sel, S,
           row, pr, nt, N, G, dt_softplus, dt_lo, dt_hi, out):
    """One token of one sequence: update S [pr, nt*N] in place, write y rows.

    ``out``: None, or (pool, idx, nat, parts) on the last token: each part
    of the state is scattered right after its last row block is updated.
    """
    r0, r1 = row * pr, (row + 1) * pr
    dt_c = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=dt_c, src=dt_rows[r0:r1, :])
    x_c = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_c, src=x_rows[r0:r1, :])
    b_g = nl.ndarray((G, N), dtype=B.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b_g, src=B[row * G:(row + 1) * G, :])
    c_g = nl.ndarray((G, N), dtype=C.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=c_g, src=C[row * G:(row + 1) * G, :])

    # dt' = clip(softplus(dt + dt_bias)); decay exp(dt' A); input weight dt' x
    dtp = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    src = dt_c
    if bias_sb != None:  # noqa: E711
        nisa.tensor_tensor(dst=dtp, data1=dt_c, data2=bias_sb, op=nl.add)
        src = dtp
    if dt_softplus:
        nisa.activation(dst=dtp, op=nl.softplus, data=src)
        src = dtp
    if dt_hi < 3.0e38:
        nisa.tensor_scalar(dst=dtp, data=src, op0=nl.maximum, operand0=dt_lo,
                           op1=nl.minimum, operand1=dt_hi)
    else:
        nisa.tensor_scalar(dst=dtp, data=src, op0=nl.maximum, operand0=dt_lo)
    dA = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dA, data1=dtp, data2=A_sb, op=nl.multiply)
    nisa.activation(dst=dA, op=nl.exp, data=dA)
    dtx = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dtx, data1=dtp, data2=x_c, op=nl.multiply)

    # B and C of each partition's group on every partition (exact 0/1 matmul, K = G)
    bb = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=bb, stationary=sel, moving=b_g, accumulate=False)
    cc = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=cc, stationary=sel, moving=c_g, accumulate=False)

    yc = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
    # per row block t: ScalarE decay, VectorE input, GpSimd C product, ScalarE
    # free-dim sum; software-pipelined (step b: stage k on block b-k) so each
    # engine's in-order queue never waits on work issued in the same step
    tmps = [None] * nt
    prods = [None] * nt
    for b in range(nt + 3):
        t = b
        if t < nt:
            tmps[t] = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=tmps[t], op=nl.copy, data=S[:, t * N:(t + 1) * N],
                            scale=dA[:, t:t + 1])
        t = b - 1
        if 0 <= t < nt:
            nisa.scalar_tensor_tensor(dst=S[:, t * N:(t + 1) * N], data=bb, op0=nl.multiply,
                                      operand0=dtx[:, t:t + 1], op1=nl.add, operand1=tmps[t])
            tmps[t] = None
            if out != None:  # noqa: E711
                for k in range(out[3]):
                    a, e = _part_bounds(nt, out[3], k)
                    if e > a and t == e - 1:
                        _scatter(out[0], out[1], out[2], S, pr, nt, N, a, e)
        t = b - 2
        if 0 <= t < nt:
            prods[t] = nl.ndarray((pr, N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=prods[t], data1=S[:, t * N:(t + 1) * N], data2=cc,
                               op=nl.multiply,
                               engine=nisa.engine.vector)
        t = b - 3
        if 0 <= t < nt:
            nisa.activation(dst=prods[t], op=nl.copy, data=prods[t], reduce_op=nl.add,
                            reduce_res=yc[:, t:t + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce)
            prods[t] = None
    bb = None
    cc = None

    if D_sb != None:  # noqa: E711
        xd = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=xd, data1=x_c, data2=D_sb, op=nl.multiply)
        nisa.tensor_tensor(dst=yc, data1=yc, data2=xd, op=nl.add)
    if z_rows != None:  # noqa: E711
        z_c = nl.ndarray((pr, nt), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=z_c, src=z_rows[r0:r1, :])
        nisa.activation(dst=z_c, op=nl.silu, data=z_c)
        nisa.tensor_tensor(dst=yc, data1=yc, data2=z_c, op=nl.multiply)
    nisa.dma_copy(dst=y[r0:r1, :], src=yc)
