"""float64 reference gradients of the gated delta rule (Gated DeltaNet), written from the math.

Functional form (no pool): each sequence of a ragged batch starts from its row
of ``initial_states [num_seqs, HV, K, V]`` (None: zeros) and ends in its row of
``final_states``. The forward is ``gated_delta_chunked`` of ``gated_delta.py`` on
a pool holding the initial states; the backward walks that module's recurrence
in reverse, token by token, per value head (q/k head hv // (HV // H)):

    S'_t = exp(g_t) S_{t-1} ;  u_t = beta_t (v_t - S'_t^T k_t) ;  S_t = S'_t + k_t u_t^T
    o_t = S_t^T q_t          (q_t = scale l2norm(q_raw) when use_qk_l2norm, else scale q_raw)

Given do and dS_T (the gradient of the final state), dS the running gradient of S_t:

    dS += q_t do_t^T ;  dq_t = S_t do_t
    dk_t = dS u_t ;  du = dS^T k_t ;  w = beta_t du
    dbeta_t = <du, v_t - S'_t^T k_t> ;  dv_t = w ;  dk_t -= S'_t w ;  dS' = dS - k_t w^T
    dg_t = <dS', S'_t> ;  dS_{t-1} = exp(g_t) dS'

then dq/dk sum over the value heads of each q/k head, the scale and the L2 norm
(y = x / n, n = sqrt(|x|^2 + 1e-6): dx = dy / n - x <x, dy> / n^3) are undone,
and raw gates (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)) give
da = dg (-exp(A_log)) sigmoid(a + dt_bias), ddt_bias = sum da, dA_log = sum dg g,
db = dbeta beta (1 - beta). d_initial_states is dS_{-1} of each sequence.
"""

from __future__ import annotations

import numpy as np

from ._pool import functional_cu_seqlens, states_or_zeros
from .gated_delta import L2NORM_EPS, _gates_f64, _sigmoid, gated_delta_chunked

__all__ = ["gated_delta_forward", "gated_delta_backward"]


def _f64(name, a):
    return None if a is None else np.array(np.asarray(a), dtype=np.float64, copy=True)


def gated_delta_forward(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None,
                        dt_bias=None, scale=None, use_qk_l2norm=False, cu_seqlens,
                        initial_states=None, chunk_size=64):
    """-> (o [num_tokens, HV, V], final_states [num_seqs, HV, K, V]), float64.

    q, k [num_tokens, H, K], v [num_tokens, HV, V], gates as ``gated_delta_chunked``,
    initial_states [num_seqs, HV, K, V] or None (zeros)."""
    num_tokens, _, K = np.shape(q)
    HV, V = np.shape(v)[1:]
    cu = functional_cu_seqlens(cu_seqlens, num_tokens)
    num_seqs = cu.size - 1
    pool = states_or_zeros(initial_states, (num_seqs, HV, K, V), "initial_states")
    return gated_delta_chunked(q, k, v, g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                               scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu,
                               ssm_states=pool, state_indices=np.arange(num_seqs),
                               has_initial_state=np.ones(num_seqs, bool), chunk_size=chunk_size)


def _l2norm_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    n = np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)
    return dy / n - x * np.sum(x * dy, axis=-1, keepdims=True) / n ** 3


def gated_delta_backward(q, k, v, do, *, g=None, beta=None, a=None, b=None, A_log=None,
                         dt_bias=None, scale=None, use_qk_l2norm=False, cu_seqlens,
                         initial_states=None, d_final_states=None):
    """Gradients of ``gated_delta_forward``'s (o, final_states) -> dict, float64:

    dq, dk, dv (input shapes); with (g, beta): dg, dbeta; with raw gates: da, db,
    dA_log, ddt_bias (the other gate gradients None); d_initial_states
    [num_seqs, HV, K, V]. do [num_tokens, HV, V]; d_final_states like the final
    states or None (zeros)."""
    q0, k0, v64 = _f64("q", q), _f64("k", k), _f64("v", v)
    num_tokens, H, K = q0.shape
    HV, V = v64.shape[1:]
    rep = HV // H
    raw = g is None and beta is None
    g64, beta64 = _gates_f64((num_tokens,), HV, g=g, beta=beta, a=a, b=b, A_log=A_log,
                             dt_bias=dt_bias)
    scale = K ** -0.5 if scale is None else float(scale)
    qn, kn = q0, k0
    if use_qk_l2norm:
        qn = q0 / np.sqrt(np.sum(q0 * q0, -1, keepdims=True) + L2NORM_EPS)
        kn = k0 / np.sqrt(np.sum(k0 * k0, -1, keepdims=True) + L2NORM_EPS)
    qe = np.repeat(qn, rep, axis=1) * scale                     # [T, HV, K]
    ke = np.repeat(kn, rep, axis=1)
    do64 = _f64("do", do)
    cu = functional_cu_seqlens(cu_seqlens, num_tokens)
    num_seqs = cu.size - 1
    S0 = states_or_zeros(initial_states, (num_seqs, HV, K, V), "initial_states")
    dSf = states_or_zeros(d_final_states, (num_seqs, HV, K, V), "d_final_states")

    dqe, dke, dv = np.zeros_like(qe), np.zeros_like(ke), np.zeros_like(v64)
    dg, dbeta = np.zeros_like(g64), np.zeros_like(beta64)
    d_init = np.zeros_like(S0)
    for s in range(num_seqs):
        t0, t1 = int(cu[s]), int(cu[s + 1])
        L = t1 - t0
        decayed = np.empty((L, HV, K, V))     # S'_t
        after = np.empty((L, HV, K, V))       # S_t
        us = np.empty((L, HV, V))
        S = S0[s]
        for i, t in enumerate(range(t0, t1)):
            Sd = np.exp(g64[t])[:, None, None] * S
            u = beta64[t][:, None] * (v64[t] - np.einsum("hkv,hk->hv", Sd, ke[t]))
            S = Sd + ke[t][:, :, None] * u[:, None, :]
            decayed[i], after[i], us[i] = Sd, S, u
        dS = dSf[s].copy()
        for i in reversed(range(L)):
            t = t0 + i
            dS = dS + qe[t][:, :, None] * do64[t][:, None, :]
            dqe[t] = np.einsum("hkv,hv->hk", after[i], do64[t])
            dke[t] = np.einsum("hkv,hv->hk", dS, us[i])
            du = np.einsum("hkv,hk->hv", dS, ke[t])
            w = beta64[t][:, None] * du
            resid = v64[t] - np.einsum("hkv,hk->hv", decayed[i], ke[t])
            dbeta[t] = np.sum(du * resid, axis=-1)
            dv[t] = w
            dke[t] -= np.einsum("hkv,hv->hk", decayed[i], w)
            dS = dS - ke[t][:, :, None] * w[:, None, :]
            dg[t] = np.einsum("hkv,hkv->h", dS, decayed[i])
            dS = np.exp(g64[t])[:, None, None] * dS
        d_init[s] = dS
    # back through the GQA repeat, the scale and the L2 norm
    dqn = dqe.reshape(num_tokens, H, rep, K).sum(axis=2) * scale
    dkn = dke.reshape(num_tokens, H, rep, K).sum(axis=2)
    if use_qk_l2norm:
        dq, dk = _l2norm_backward(q0, dqn), _l2norm_backward(k0, dkn)
    else:
        dq, dk = dqn, dkn
    out = dict(dq=dq, dk=dk, dv=dv, dg=None, dbeta=None, da=None, db=None, dA_log=None,
               ddt_bias=None, d_initial_states=d_init)
    if not raw:
        out.update(dg=dg, dbeta=dbeta)
        return out
    pre = _f64("a", a) + _f64("dt_bias", dt_bias)
    da = dg * (-np.exp(_f64("A_log", A_log))) * _sigmoid(pre)
    out.update(da=da, db=dbeta * beta64 * (1.0 - beta64), dA_log=np.sum(dg * g64, axis=0),
               ddt_bias=da.sum(axis=0))
    return out
