"""float64 reference gradients of the Mamba-2 SSD scan, written from the math.

Functional form (no pool): each sequence of a ragged batch starts from its row
of ``initial_states [num_seqs, H, P, N]`` (None: zeros) and ends in its row of
``final_states``. The forward is ``ssd_chunked`` of ``mamba2_ssd.py`` on a pool
holding the initial states; the backward walks the recurrence of that module's
docstring in reverse, token by token, per head (group g = h // (H // G)):

    S_t = a_t S_{t-1} + dt'_t x_t B_t^T,   a_t = exp(dt'_t A)
    y0_t = S_t C_t ;  y1_t = y0_t + D x_t ;  y_t = y1_t silu(z_t)

Given dy and dS_T (the gradient of the final state), with dS the running
gradient of the state after token t:

    dz_t  = dy_t y1_t silu'(z_t) ;  dy1_t = dy_t silu(z_t)
    dD   += dy1_t x_t ;  dx_t += D dy1_t ;  dS += dy1_t C_t^T ;  dC_t += S_t^T dy1_t
    dx_t += dt'_t dS B_t ;  dB_t += dt'_t dS^T x_t
    ddt'_t = x_t^T dS B_t + A a_t <dS, S_{t-1}> ;  dA += dt'_t a_t <dS, S_{t-1}>
    dS_{t-1} = a_t dS

and dt' = clip(u, lo, hi), u = softplus(dt + dt_bias) or dt + dt_bias: the clip
passes the gradient where lo <= u <= hi (as torch.clamp and mamba_ssm's
``_chunk_cumsum_bwd_kernel`` do), softplus multiplies it by sigmoid(dt + dt_bias),
and ddt_bias sums ddt over tokens. d_initial_states is dS after the first token.
Gradients of B and C sum over the heads of their group.
"""

from __future__ import annotations

import math

import numpy as np

from ._pool import f64, f64_or_none, functional_cu_seqlens, silu, states_or_zeros
from .mamba2_ssd import ssd_chunked, ssd_dt

__all__ = ["ssd_forward", "ssd_backward"]

_INF = math.inf


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))


def ssd_forward(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                dt_limit=(0.0, _INF), cu_seqlens, initial_states=None, chunk_size=128):
    """-> (y [num_tokens, H, P], final_states [num_seqs, H, P, N]), float64.

    x [num_tokens, H, P], dt [num_tokens, H], A [H], B, C [num_tokens, G, N],
    D [H] or [H, P], z like x, dt_bias [H], initial_states [num_seqs, H, P, N] or None."""
    num_tokens, H, P = np.shape(x)
    N = np.shape(B)[-1]
    cu = functional_cu_seqlens(cu_seqlens, num_tokens)
    num_seqs = cu.size - 1
    pool = states_or_zeros(initial_states, (num_seqs, H, P, N), "initial_states")
    return ssd_chunked(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                       dt_limit=dt_limit, cu_seqlens=cu, ssm_states=pool,
                       state_indices=np.arange(num_seqs), has_initial_state=np.ones(num_seqs, bool),
                       chunk_size=chunk_size)


def _dt_chain(dt, dt_bias, dt_softplus, dt_limit, ddtp):
    """ddt' -> ddt (through clip, softplus, + dt_bias), and ddt_bias (or None)."""
    u = f64(dt, "dt")
    if dt_bias is not None:
        u = u + f64(dt_bias, "dt_bias")
    pre = u
    if dt_softplus:
        u = np.logaddexp(0.0, pre)
    lo, hi = dt_limit
    g = np.where((u >= lo) & (u <= hi), ddtp, 0.0)
    if dt_softplus:
        g = g * _sigmoid(pre)
    return g, (None if dt_bias is None else g.sum(axis=0))


def ssd_backward(x, dt, A, B, C, dy, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                 dt_limit=(0.0, _INF), cu_seqlens, initial_states=None, d_final_states=None):
    """Gradients of ``ssd_forward``'s (y, final_states) -> dict, float64:

    dx, ddt, dA, dB, dC (shapes of the inputs), dD (D's shape; None without D),
    dz (None without z), ddt_bias (None without dt_bias), d_initial_states
    [num_seqs, H, P, N] (the gradient of the initial state whether or not one was
    passed: None stands for zeros). dy [num_tokens, H, P]; d_final_states
    [num_seqs, H, P, N] or None (zeros)."""
    xs = f64(x, "x")
    num_tokens, H, P = xs.shape
    Bs, Cs = f64(B, "B"), f64(C, "C")
    G, N = Bs.shape[1:]
    group = np.arange(H) // (H // G)
    As = f64(A, "A")
    dts = ssd_dt(dt, dt_bias, dt_softplus, dt_limit)
    dys = f64(dy, "dy")
    zs = f64_or_none(z, "z")
    Ds = f64_or_none(D, "D")
    Dfull = None if Ds is None else (np.repeat(Ds[:, None], P, axis=1) if Ds.ndim == 1 else Ds)
    cu = functional_cu_seqlens(cu_seqlens, num_tokens)
    num_seqs = cu.size - 1
    S0 = states_or_zeros(initial_states, (num_seqs, H, P, N), "initial_states")
    dSf = states_or_zeros(d_final_states, (num_seqs, H, P, N), "d_final_states")

    dx = np.zeros_like(xs)
    ddtp = np.zeros_like(dts)
    dA = np.zeros(H)
    dB, dC = np.zeros_like(Bs), np.zeros_like(Cs)
    dD = None if Ds is None else np.zeros((H, P))
    dz = None if zs is None else np.zeros_like(zs)
    d_init = np.zeros((num_seqs, H, P, N))
    for s in range(num_seqs):
        t0, t1 = int(cu[s]), int(cu[s + 1])
        # forward states S_{t-1} for every token (states[i] before token t0 + i)
        states = np.empty((t1 - t0 + 1, H, P, N))
        states[0] = S0[s]
        for i, t in enumerate(range(t0, t1)):
            a = np.exp(dts[t] * As)
            Bh = Bs[t, group]                                          # [H, N]
            states[i + 1] = (a[:, None, None] * states[i]
                             + dts[t][:, None, None] * xs[t][:, :, None] * Bh[:, None, :])
        dS = dSf[s].copy()
        for i in reversed(range(t1 - t0)):
            t = t0 + i
            Bh, Ch = Bs[t, group], Cs[t, group]
            S, S_prev = states[i + 1], states[i]
            y1 = np.einsum("hpn,hn->hp", S, Ch)
            if Dfull is not None:
                y1 = y1 + Dfull * xs[t]
            dy1 = dys[t]
            if zs is not None:
                sig = _sigmoid(zs[t])
                dz[t] = dys[t] * y1 * (sig * (1.0 + zs[t] * (1.0 - sig)))
                dy1 = dys[t] * silu(zs[t])
            if Dfull is not None:
                dD += dy1 * xs[t]
                dx[t] += Dfull * dy1
            dS += dy1[:, :, None] * Ch[:, None, :]
            np.add.at(dC[t], group, np.einsum("hpn,hp->hn", S, dy1))
            dx[t] += dts[t][:, None] * np.einsum("hpn,hn->hp", dS, Bh)
            np.add.at(dB[t], group, dts[t][:, None] * np.einsum("hpn,hp->hn", dS, xs[t]))
            a = np.exp(dts[t] * As)
            da = np.einsum("hpn,hpn->h", dS, S_prev)
            ddtp[t] = np.einsum("hp,hpn,hn->h", xs[t], dS, Bh) + As * a * da
            dA += dts[t] * a * da
            dS = a[:, None, None] * dS
        d_init[s] = dS
    ddt, ddt_bias = _dt_chain(dt, dt_bias, dt_softplus, dt_limit, ddtp)
    if dD is not None and Ds.ndim == 1:
        dD = dD.sum(axis=1)
    return dict(dx=dx, ddt=ddt, dA=dA, dB=dB, dC=dC, dD=dD, dz=dz, ddt_bias=ddt_bias,
                d_initial_states=d_init)
