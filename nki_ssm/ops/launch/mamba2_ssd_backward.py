"""Launcher of the Mamba-2 SSD backward kernel (``nki_ssm.kernels.mamba2_ssd.chunk_backward``).

Host side only pads to buckets, arranges layouts and builds int32 tables (the
kernel's module docstring describes them); every gradient is computed in the
kernel, the chain through dt_bias / softplus / dt_limit included. After the
launch, device-side array ops only: slicing to the caller's sizes, joining the
programs' outputs (each program writes its heads into its own tensors), the
sum of the programs' dB / dC partial slabs (at LNC=2 the heads of one group may
sit in both programs; LNC=1 adds the same two partials of that group: the
kernel's extra columns), the sum over P of dD for a per-head D, and the S^T ->
[H, P, N] permute of d_initial_states. Heads of P > 128 channels are k heads of
P / k (``_split_heads``; their per-head gradients summed over the k parts).

- token inputs ``[num_tokens, ...]`` become ``[T + Q, width]`` (T the token
  bucket, Q zero rows appended: the rows a chunk past the last token reads);
- initial_states / d_final_states ``[num_seqs, H, P, N]`` become S^T blocks
  ``[S (+1), N, H*P]`` (S the sequence bucket; zeros for None, block S of the
  initial states zeros);
- per-head parameters are repeated on 128 rows, D always per channel.
"""
from __future__ import annotations

import numpy as np

from nki_ssm.ops.launch._arrays import NUMPY, host_call
from nki_ssm.ops.launch.buckets import seq_bucket, token_bucket
from nki_ssm.ops.launch.mamba2_ssd import _D_per_row, _dt_limit

_PMAX = 128
MAX_N = 256          # the kernel tiles dstate in (at most two) 128-partition tiles
MAX_KERNEL_P = 128   # the kernel transposes a head's [Q, P] operands to P partitions


def _head_split(P: int) -> int:
    """Smallest k with P % k == 0 and P / k <= MAX_KERNEL_P."""
    k = 2
    while P % k or P // k > MAX_KERNEL_P:
        k += 1
    return k


def backward_kernel():
    """The ``@nki.jit`` kernel ``backward_call`` launches."""
    from nki_ssm.kernels.mamba2_ssd.chunk_backward import ssd_chunk_backward

    return ssd_chunk_backward


def backward_tables(cu_seqlens, num_tokens: int, num_seqs: int, chunk_size: int):
    """Run-time tables of ``ssd_chunk_backward``: ``(frows [R, Q, 2], fvals [R, 2],
    brows [R, Q, 2], bvals [R, 3], seqs [num_seqs, 3], counts [1, 2])`` int32 with
    ``R = ceil(num_tokens / Q) + num_seqs``; ``num_tokens`` / ``num_seqs`` are the
    buckets (row ``num_tokens``: zero input / dump output row; scratch block R: dump;
    initial-state block ``num_seqs``: zeros). Every program reads all of them (the
    programs split the heads, not the work list). Vectorised array ops only: ``diff`` and ceil-division (chunks per
    sequence), exclusive ``cumsum`` (row bases), ``repeat_interleave`` (row ->
    sequence), ``arange`` broadcast adds, comparisons, ``where``, a flip (reverse
    order), indexed writes into constant tables."""
    Q = chunk_size
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lens = cu[1:] - cu[:-1]
    n = lens.size
    chunks = (lens + Q - 1) // Q
    total = int(chunks.sum())
    R = -(-num_tokens // Q) + num_seqs
    frows = np.zeros((R, Q, 2), dtype=np.int32)
    frows[:, :, 0] = num_tokens
    fvals = np.full((R, 2), num_tokens, dtype=np.int32)
    fvals[:, 1] = R
    brows = frows.copy()
    bvals = np.zeros((R, 3), dtype=np.int32)
    bvals[:, 0] = num_tokens
    bvals[:, 1] = R
    base = np.concatenate([[0], np.cumsum(chunks)[:-1]]).astype(np.int64)
    if total:
        seq_of = np.repeat(np.arange(n), chunks)
        local = np.arange(total) - base[seq_of]
        offs = local[:, None] * Q + np.arange(Q)[None, :]
        valid = offs < lens[seq_of][:, None]
        tok = np.where(valid, cu[:-1][seq_of][:, None] + offs, num_tokens)
        frows[:total, :, 0] = tok
        frows[:total, :, 1] = valid
        fvals[:total, 0] = tok[:, 0]
        last = local == chunks[seq_of] - 1
        fvals[:total, 1] = np.where(last, R, np.arange(total) + 1)
        rev = np.arange(total)[::-1]
        brows[:total] = frows[rev]
        bvals[:total, 0] = tok[rev, 0]
        bvals[:total, 1] = rev
        bvals[:total, 2] = seq_of[rev]
    seqs = np.zeros((num_seqs, 3), dtype=np.int32)
    seqs[:n, 0] = np.arange(n)
    seqs[:n, 1] = np.where(chunks > 0, base, R)
    seqs[:n, 2] = np.arange(n)
    counts = np.array([[n, total]], dtype=np.int32)
    return frows, fvals, brows, bvals, seqs, counts


def _states_st(xp, states, like, S_rows: int, N: int, HP: int):
    """``[num_seqs, H, P, N]`` (or None: zeros) -> float32 S^T blocks ``[S_rows, N, H*P]``
    (zero blocks appended)."""
    if states is None:
        empty = xp.f32(like).reshape(-1)[:0].reshape(0, N * HP)
        return xp.pad_rows(empty, S_rows, N * HP, True).reshape(S_rows, N, HP)
    n = states.shape[0]
    st = xp.permute(xp.f32(states), (0, 3, 1, 2)).reshape(n, N * HP)
    return xp.pad_rows(st, S_rows, N * HP, True).reshape(S_rows, N, HP)


def backward(*, x, dt, A, B, C, dy, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens,
             initial_states, d_final_states, chunk_size, backend):
    """Launch ``ssd_chunk_backward`` on the host path (``backward_call`` with NumPy)."""
    return backward_call(NUMPY, host_call(backend), x=x, dt=dt, A=A, B=B, C=C, dy=dy, D=D, z=z,
                         dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
                         cu_seqlens=cu_seqlens, initial_states=initial_states,
                         d_final_states=d_final_states, chunk_size=chunk_size)


def backward_call(xp, call, *, x, dt, A, B, C, dy, D, z, dt_bias, dt_softplus, dt_limit,
                  cu_seqlens, initial_states, d_final_states, chunk_size):
    """Lay out, launch ``call(backward_kernel(), *args)`` as ``call.lnc`` programs; returns
    the float32 gradients ``dict(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, d_initial_states)``
    in the inputs' shapes (None for D, z, dt_bias not given; ``xp`` arrays)."""
    T, H, P = x.shape
    G, N = B.shape[1:]
    if N > MAX_N:
        raise ValueError(f"ssd_backward: the NKI backward kernel needs dstate N <= {MAX_N}, "
                         f"got N = {N}")
    if P > MAX_KERNEL_P:
        return _split_heads(xp, call, x=x, dt=dt, A=A, B=B, C=C, dy=dy, D=D, z=z,
                            dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
                            cu_seqlens=cu_seqlens, initial_states=initial_states,
                            d_final_states=d_final_states, chunk_size=chunk_size)
    n = int(np.asarray(cu_seqlens).shape[0]) - 1
    Q = int(chunk_size)
    Tb, Sb = token_bucket(T), seq_bucket(n)
    lnc = call.lnc
    split = lnc == 2 and H % 2 == 0
    tables = backward_tables(cu_seqlens, Tb, Sb, Q)

    def tok2d(a, width, f32=False):       # [T, ...] -> [Tb + Q, width], zero rows appended
        if a is None:
            return None
        return xp.pad_rows(a.reshape(T, width), Tb + Q, width, f32)

    HP = H * P
    D_row = None
    if D is not None:
        D_row = xp.broadcast_rows(_D_per_row(xp, D, H, P), _PMAX)
    lo, hi = _dt_limit(dt_limit)
    out = call(backward_kernel(),
               tok2d(x, HP), tok2d(dt, H, f32=True), xp.broadcast_rows(xp.f32(A), _PMAX),
               tok2d(B, G * N), tok2d(C, G * N), D_row, tok2d(z, HP),
               None if dt_bias is None else xp.broadcast_rows(xp.f32(dt_bias), _PMAX),
               tok2d(dy, HP), _states_st(xp, initial_states, x, Sb + 1, N, HP),
               _states_st(xp, d_final_states, x, Sb, N, HP), *(xp.table(t) for t in tables),
               int(H), int(N), bool(dt_softplus), lo, hi, Q)
    # out: dx, ddt, dz, dB, dC, dA, dD, ddt_bias, d_init, each as one tensor per program
    per = {}
    names = ("dx", "ddt", "dz", "dB", "dC", "dA", "dD", "dtb", "dinit")
    for k, name in enumerate(names):
        per[name] = list(out[k * lnc:(k + 1) * lnc])
    if not split:                  # odd H: both programs ran every head; program 0's are kept
        per = {name: v[:1] for name, v in per.items()}

    def joined(name, width):                # the programs' head columns side by side
        w = width // len(per[name])
        parts = [a[:T].reshape(T, w) for a in per[name]]
        return parts[0] if len(parts) == 1 else xp.cat(parts, 1)

    # dB / dC: the heads of a group sum in PSUM within each half of the head split (H/2;
    # H odd: one range); the group that straddles it (gs) has two partials, which are added
    # here in one order at both LNC settings (LNC=2: the programs' slabs; LNC=1: the
    # kernel's N extra columns), so the gradients agree bit for bit
    hsplit = H // 2 if H % 2 == 0 else H
    HPG = H // G
    gs = hsplit // HPG if hsplit % HPG else -1
    GN = G * N

    def summed(name):
        parts = [a[:T] for a in per[name]]
        if len(parts) == 1:
            m = parts[0]
            if m.shape[1] == GN:
                return m.reshape(T, G, N)
            lo, hi, rest = m[:, :gs * N], m[:, gs * N:(gs + 1) * N], m[:, (gs + 1) * N:GN]
            return xp.cat([lo, hi + m[:, GN:], rest], 1).reshape(T, G, N)
        p0, p1 = parts
        if gs < 0:                           # no group straddles: each from its program
            gb = hsplit // HPG
            return xp.cat([p0[:, :gb * N], p1[:, gb * N:]], 1).reshape(T, G, N)
        mid = p0[:, gs * N:(gs + 1) * N] + p1[:, gs * N:(gs + 1) * N]
        return xp.cat([p0[:, :gs * N], mid, p1[:, (gs + 1) * N:]], 1).reshape(T, G, N)

    w = HP // len(per["dinit"])
    d_init = xp.cat([a[:n].reshape(n, N, w) for a in per["dinit"]], 2).reshape(n, N, H, P)
    dD_ch = xp.cat([a.reshape(1, -1) for a in per["dD"]], 1).reshape(H, P)
    grads = dict(dx=joined("dx", HP).reshape(T, H, P), ddt=joined("ddt", H),
                 dA=xp.cat([a.reshape(1, -1) for a in per["dA"]], 1).reshape(H),
                 dB=summed("dB"), dC=summed("dC"), dD=None, dz=None, ddt_bias=None,
                 d_initial_states=xp.permute(d_init, (0, 2, 3, 1)))
    if D is not None:
        grads["dD"] = dD_ch.sum(-1) if tuple(D.shape) == (H,) else dD_ch
    if z is not None:
        grads["dz"] = joined("dz", HP).reshape(T, H, P)
    if dt_bias is not None:
        grads["ddt_bias"] = xp.cat([a.reshape(1, -1) for a in per["dtb"]], 1).reshape(H)
    return grads


def _split_heads(xp, call, *, x, dt, A, B, C, dy, D, z, dt_bias, dt_softplus, dt_limit,
                 cu_seqlens, initial_states, d_final_states, chunk_size):
    """P > MAX_KERNEL_P: the recurrence is independent along P, so a head of P channels
    is k heads of P / k channels sharing its dt, A, D (per head) and dt_bias (contiguous
    reshapes of x, z, dy, D [H, P] and the states; repeats of the per-head arrays); the
    per-head gradients (ddt, dA, ddt_bias, dD of a per-head D) are the sums of the k
    parts."""
    T, H, P = x.shape
    k = _head_split(P)
    Hk, Pk = H * k, P // k

    def per_head(a):
        return None if a is None else xp.repeat(a, k, -1)

    def states(a):
        return None if a is None else a.reshape(a.shape[0], Hk, Pk, a.shape[-1])

    def heads(a):
        return None if a is None else a.reshape(T, Hk, Pk)

    Dk = None
    if D is not None:
        Dk = per_head(D) if tuple(D.shape) == (H,) else D.reshape(Hk, Pk)
    g = backward_call(xp, call, x=heads(x), dt=per_head(dt), A=per_head(A), B=B, C=C,
                      dy=heads(dy), D=Dk, z=heads(z), dt_bias=per_head(dt_bias),
                      dt_softplus=dt_softplus, dt_limit=dt_limit, cu_seqlens=cu_seqlens,
                      initial_states=states(initial_states),
                      d_final_states=states(d_final_states), chunk_size=chunk_size)
    n = g["d_initial_states"].shape[0]
    g["dx"] = g["dx"].reshape(T, H, P)
    g["ddt"] = g["ddt"].reshape(T, H, k).sum(-1)
    g["dA"] = g["dA"].reshape(H, k).sum(-1)
    g["d_initial_states"] = g["d_initial_states"].reshape(n, H, P, B.shape[-1])
    if z is not None:
        g["dz"] = g["dz"].reshape(T, H, P)
    if dt_bias is not None:
        g["ddt_bias"] = g["ddt_bias"].reshape(H, k).sum(-1)
    if D is not None:
        g["dD"] = g["dD"].reshape(H, k).sum(-1) if tuple(D.shape) == (H,) else \
            g["dD"].reshape(H, P)
    return g

