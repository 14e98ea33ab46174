"""Launcher of the Gated DeltaNet backward kernel (``chunk_backward.gdn_chunk_backward``).

``backward_call(xp, call, ...)`` lays the arguments out with the array namespace ``xp``
(``_arrays``), launches ``call.lnc`` programs and lays the gradients back:

- before the kernel (device-side array ops, no host loop, no read-back): q, k widened to
  float32, L2-normalised (use_qk_l2norm) and q scaled, both repeated to the value heads;
  the raw gates applied (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)); value
  heads padded with zero heads to a multiple of ``call.lnc`` (each program owns a
  contiguous share); token arrays flattened to ``[num_tokens, HVp*width]`` and padded to
  the token bucket plus one zero row; states as ``[num_seqs*K, HVp*V]`` rows;
- the batch composition as int32 work lists (``backward_tables``);
- after it: the kernel's program-major outputs (each program's heads in its own rows)
  put side by side, dq / dk summed over the value heads of each q/k head, the scale and
  the L2 norm undone, the raw-gate chain (da, db, dA_log, ddt_bias), the padding sliced
  off.

The device-side steps use ``xp`` methods only (``f32``, ``pad_rows``, ``permute``,
``repeat``, ``sum``, ``exp``, ``sqrt``, ``sigmoid``, ``softplus``) and arithmetic
operators.
"""
from __future__ import annotations

import numpy as np

from nki_ssm.ops.launch._arrays import NUMPY, host_call
from nki_ssm.ops.launch.buckets import seq_bucket, token_bucket

L2NORM_EPS = 1e-6


def backward_kernel():
    """The ``@nki.jit`` kernel ``backward_call`` launches."""
    from nki_ssm.kernels.gated_delta.chunk_backward import gdn_chunk_backward

    return gdn_chunk_backward


def backward_tables(cu_seqlens, *, K, chunk_size, num_tokens_bucket, num_seqs_bucket):
    """``(init_tab, seq_rows, fwd_rows, fwd_state, bwd_rows, bwd_state, counts)`` of
    ``gdn_chunk_backward`` (layouts in its docstring), each step a vectorised array op
    (diff, cumsum, repeat_interleave, arange, where, broadcasting)."""
    C = int(chunk_size)
    Tb, Nb = int(num_tokens_bucket), int(num_seqs_bucket)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    nch = (np.diff(cu) + C - 1) // C                      # chunks per sequence
    E = Tb // C + Nb                                      # most chunks of a bucket
    start = np.cumsum(nch) - nch                          # first chunk id of each sequence
    seq = np.repeat(np.arange(nch.size), nch)             # sequence of every chunk
    m = np.arange(seq.size) - start[seq]                  # chunk index within it
    rows = (cu[seq] + m * C)[:, None] + np.arange(C)[None, :]
    rows = np.where(rows < cu[seq + 1][:, None], rows, Tb)
    e = np.arange(seq.size)
    nxt = np.where(m + 1 < nch[seq], e + 1, E)            # last chunk: the trash block
    rev = start[seq] + nch[seq] - 1 - m                   # reverse order within a sequence

    def table(t, length, width, fill):
        out = np.full((length, width), fill, dtype=np.int32)
        out[:t.shape[0]] = t
        return out

    with_chunks = np.flatnonzero(nch > 0)
    seq_rows = table((np.arange(nch.size) * K)[:, None], Nb, 1, 0)
    init_tab = table(np.stack([with_chunks * K, start[with_chunks] * K], axis=1), Nb, 2, 0)
    fwd_rows = table(rows, E + 1, C, Tb)
    fwd_state = table(np.stack([e * K, nxt * K, e * C], axis=1), E + 1, 3, [E * K, E * K, E * C])
    bwd_rows = table(rows[rev], E + 1, C, Tb)
    bwd_state = table(np.stack([rev * K, seq[rev] * K, rev * C], axis=1), E + 1, 3,
                      [E * K, E * K, E * C])
    counts = np.array([[with_chunks.size, seq.size, seq.size, nch.size]], dtype=np.int32)
    return init_tab, seq_rows, fwd_rows, fwd_state, bwd_rows, bwd_state, counts


def backward_chunk(chunk_size):
    """The backward kernel's chunk: 128 (None), else chunk_size rounded up to a multiple of
    32 (its exactly-inverted diagonal blocks), at most 128 (tokens on partitions)."""
    if chunk_size is None:
        return 128
    return min(128, -(-int(chunk_size) // 32) * 32)


def backward(**kw):
    """Launch ``gdn_chunk_backward`` on the host path (``backward_call`` with NumPy)."""
    backend = kw.pop("backend")
    return backward_call(NUMPY, host_call(backend), **kw)


def _fast(q):
    """tfloat32 TensorE operands for 16-bit callers (their 5e-3 gradient budget), float32
    for float32 callers (1e-5)."""
    return q.dtype.itemsize < 4     # a NumPy or a torch dtype


def _l2norm(xp, x):
    """(x / n, n) with n = sqrt(sum x^2 + eps) over the last axis."""
    n = xp.sqrt(xp.sum(x * x, -1, keepdims=True) + L2NORM_EPS)
    return x / n, n


def _pad_heads(xp, x, HVp):
    """x ``[n, HV, w]`` -> ``[n, HVp, w]`` with zero heads appended."""
    n, HV, w = x.shape
    if HV == HVp:
        return x
    t = xp.pad_rows(xp.permute(x, (1, 0, 2)), HVp, n * w)
    return xp.permute(t.reshape(HVp, n, w), (1, 0, 2))


def _state_rows(xp, states, HVp, rows):
    """states ``[S, HV, K, V]`` -> ``[rows, HVp*V]`` float32: ``[K, (hv, V)]`` blocks, zero
    rows after them."""
    S, HV, K, V = states.shape
    t = xp.permute(xp.f32(states), (0, 2, 1, 3)).reshape(S * K, HV, V)
    return xp.pad_rows(_pad_heads(xp, t, HVp), rows, HVp * V)


def _column_major(xp, x, n):
    """A program-major kernel output ``[n*rows, w]`` (program p's rows p*rows..) as
    ``[rows, n*w]`` (its columns p*w..)."""
    rows, w = x.shape[0] // n, x.shape[1]
    return xp.permute(x.reshape(n, rows, w), (1, 0, 2)).reshape(rows, n * w)


def backward_call(xp, call, *, q, k, v, do, g, beta, a, b, A_log, dt_bias, scale,
                  use_qk_l2norm, cu_seqlens, initial_states, d_final_states, chunk_size=None):
    """Gradients of the gated delta rule prefill -> dict of float32 arrays: dq, dk, dv,
    dg / dbeta (or da, db, dA_log, ddt_bias with raw gates; the others None) and
    d_initial_states ``[num_seqs, HV, K, V]``. ``chunk_size`` (None: 128) is rounded up to
    a multiple of 32 (the kernel's exactly-inverted blocks), at most 128."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    rep = HV // H
    S = len(cu_seqlens) - 1
    n = call.lnc
    HVp = -(-HV // n) * n
    Tb, Nb = token_bucket(T), seq_bucket(S)
    C = backward_chunk(chunk_size)
    raw = g is None
    qn, kn = xp.f32(q), xp.f32(k)
    if use_qk_l2norm:
        qn, q_norm = _l2norm(xp, qn)
        kn, k_norm = _l2norm(xp, kn)
    qe = xp.repeat(qn * np.float32(scale), rep, axis=1)
    ke = xp.repeat(kn, rep, axis=1)
    if raw:
        pre = xp.f32(a) + xp.f32(dt_bias)
        negA = -xp.exp(xp.f32(A_log))
        gf, bf = negA * xp.softplus(pre), xp.sigmoid(xp.f32(b))
    else:
        gf, bf = xp.f32(g), xp.f32(beta)

    def tokens(x, w):
        return xp.pad_rows(_pad_heads(xp, x.reshape(T, HV, w), HVp), Tb + 1, HVp * w, f32=True)

    if initial_states is None:
        h0 = xp.pad_rows(xp.f32(v)[:0], Nb * K, HVp * V)
    else:
        h0 = _state_rows(xp, initial_states, HVp, Nb * K)
    if d_final_states is None:
        d_final = xp.pad_rows(xp.f32(v)[:0], Nb * K, HVp * V)
    else:
        d_final = _state_rows(xp, d_final_states, HVp, Nb * K)

    tables = backward_tables(cu_seqlens, K=K, chunk_size=C, num_tokens_bucket=Tb,
                             num_seqs_bucket=Nb)
    dq, dk, dv, dg, dbeta, d_init = call(backward_kernel(), tokens(qe, K), tokens(ke, K),
                                 tokens(v, V), tokens(do, V), tokens(gf, 1), tokens(bf, 1),
                                 h0, d_final, *(xp.table(t) for t in tables), C,
                                 _fast(q))

    def heads(x, w):
        return _column_major(xp, x, n)[:T].reshape(T, HVp, w)[:, :HV]

    dqn = xp.sum(heads(dq, K).reshape(T, H, rep, K), 2) * np.float32(scale)
    dkn = xp.sum(heads(dk, K).reshape(T, H, rep, K), 2)
    if use_qk_l2norm:
        dqn = dqn / q_norm - qn * xp.sum(qn * dqn, -1, keepdims=True) / q_norm
        dkn = dkn / k_norm - kn * xp.sum(kn * dkn, -1, keepdims=True) / k_norm
    d_init = _column_major(xp, d_init, n)[:S * K].reshape(S, K, HVp, V)[:, :, :HV]
    d_init = xp.permute(d_init, (0, 2, 1, 3))
    out = dict(dq=dqn, dk=dkn, dv=heads(dv, V), dg=None, dbeta=None, da=None, db=None,
               dA_log=None, ddt_bias=None, d_initial_states=d_init)
    dgv, dbv = heads(dg, 1).reshape(T, HV), heads(dbeta, 1).reshape(T, HV)
    if not raw:
        out.update(dg=dgv, dbeta=dbv)
        return out
    da = dgv * negA * xp.sigmoid(pre)
    out.update(da=da, db=dbv * bf * (1.0 - bf), dA_log=xp.sum(dgv * gf, 0),
               ddt_bias=xp.sum(da, 0))
    return out
