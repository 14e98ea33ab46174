"""float64 reference: functional short causal conv1d forward and its backward.

The training form of the conv: no state pool; every sequence n of the ragged
batch (``cu_seqlens [num_seqs + 1]``) starts from ``initial_states[n]`` (zeros
when None) and returns its final state. Per sequence of L tokens, channel c,
with the window stream ``xx = (initial state ++ x)`` of L + H entries (H = W-1):

    z_t[c]  = bias[c] + sum_{k=0}^{H} weight[c, k] * xx[t + k, c]     t = 0 .. L-1
    y_t[c]  = act(z_t[c])                                             act: None or SiLU
    final   = xx[L : L + H]                                           the last H inputs

so a sequence shorter than H keeps the tail of its initial state in its final
state. Backward, from dy (and d_final_states, the gradient of ``final``):

    dz_t    = dy_t * act'(z_t),   silu'(z) = s (1 + z (1 - s)),  s = sigmoid(z)
    dxx[p]  = sum_k weight[:, k] * dz_{p-k}   (0 <= p-k < L)  + d_final[p - L]  (p >= L)
    dx      = dxx[H:],  d_initial_states = dxx[:H]
    dweight[:, k] = sum_t dz_t * xx[t + k],   dbias = sum_t dz_t

Shapes: x, dy ``[num_tokens, dim]``; weight ``[dim, W]``; bias ``[dim]`` or None;
initial_states, final_states, d_final_states ``[num_seqs, dim, W-1]`` (oldest
first). Everything is computed in float64 from the math above, one sequence at
a time (no autograd).
"""

from __future__ import annotations

import numpy as np

from ._pool import ACTIVATIONS, f64, f64_or_none, silu

__all__ = ["short_conv_forward", "short_conv_backward"]


def _inputs(x, weight, bias, activation, cu_seqlens, initial_states):
    xf = f64(x, "x")
    w = f64(weight, "weight")
    b = f64_or_none(bias, "bias")
    if xf.ndim != 2:
        raise ValueError(f"x must have shape [num_tokens, dim], got {xf.shape}")
    dim = xf.shape[1]
    if w.ndim != 2 or w.shape[0] != dim or w.shape[1] < 2:
        raise ValueError(f"weight must have shape [dim = {dim}, W >= 2], got {w.shape}")
    H = w.shape[1] - 1
    if b is not None and b.shape != (dim,):
        raise ValueError(f"bias must have shape ({dim},), got {b.shape}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if cu.ndim != 1 or cu.shape[0] < 2 or cu[0] != 0 or cu[-1] != xf.shape[0] or \
            (np.diff(cu) < 0).any():
        raise ValueError(f"cu_seqlens must rise from 0 to num_tokens = {xf.shape[0]}, got {cu}")
    num_seqs = cu.shape[0] - 1
    if initial_states is None:
        init = np.zeros((num_seqs, dim, H))
    else:
        init = f64(initial_states, "initial_states")
        if init.shape != (num_seqs, dim, H):
            raise ValueError(f"initial_states must have shape {(num_seqs, dim, H)}, "
                             f"got {init.shape}")
    return xf, w, b, cu, init


def _streams(xf, cu, init):
    """Per sequence n: (start, end, xx [L + H, dim])."""
    for n in range(cu.shape[0] - 1):
        s0, s1 = int(cu[n]), int(cu[n + 1])
        yield n, s0, s1, np.concatenate([init[n].T, xf[s0:s1]], axis=0)


def _pre_activation(xx, w, b, L):
    """z [L, dim] = bias + sum_k w[:, k] * xx[k : k + L]."""
    z = sum(w[:, k] * xx[k:k + L] for k in range(w.shape[1]))
    return z if b is None else z + b


def short_conv_forward(x, weight, bias=None, *, activation=None, cu_seqlens,
                       initial_states=None):
    """-> (y ``[num_tokens, dim]``, final_states ``[num_seqs, dim, W-1]``), float64."""
    xf, w, b, cu, init = _inputs(x, weight, bias, activation, cu_seqlens, initial_states)
    H = w.shape[1] - 1
    y = np.zeros_like(xf)
    final = np.zeros_like(init)
    for n, s0, s1, xx in _streams(xf, cu, init):
        z = _pre_activation(xx, w, b, s1 - s0)
        y[s0:s1] = silu(z) if activation == "silu" else z
        final[n] = xx[xx.shape[0] - H:].T
    return y, final


def _silu_grad(z):
    s = np.exp(-np.logaddexp(0.0, -z))
    return s * (1.0 + z * (1.0 - s))


def short_conv_backward(x, weight, bias, dy, *, activation, cu_seqlens, initial_states=None,
                        d_final_states=None):
    """Gradients of ``short_conv_forward`` -> dict(dx ``[num_tokens, dim]``, dweight
    ``[dim, W]``, dbias ``[dim]`` (None without bias), d_initial_states ``[num_seqs, dim,
    W-1]`` (None without initial_states)), float64."""
    xf, w, b, cu, init = _inputs(x, weight, bias, activation, cu_seqlens, initial_states)
    g = f64(dy, "dy")
    if g.shape != xf.shape:
        raise ValueError(f"dy must have the shape of x {xf.shape}, got {g.shape}")
    W = w.shape[1]
    H = W - 1
    dfin = None
    if d_final_states is not None:
        dfin = f64(d_final_states, "d_final_states")
        if dfin.shape != init.shape:
            raise ValueError(f"d_final_states must have shape {init.shape}, got {dfin.shape}")
    dx = np.zeros_like(xf)
    dw = np.zeros_like(w)
    db = np.zeros(xf.shape[1])
    dinit = np.zeros_like(init)
    for n, s0, s1, xx in _streams(xf, cu, init):
        L = s1 - s0
        dz = g[s0:s1]
        if activation == "silu":
            dz = dz * _silu_grad(_pre_activation(xx, w, b, L))
        dxx = np.zeros_like(xx)                       # [L + H, dim]
        for k in range(W):
            dxx[k:k + L] += w[:, k] * dz
            dw[:, k] += np.sum(dz * xx[k:k + L], axis=0)
        db += dz.sum(axis=0)
        if dfin is not None:
            dxx[L:] += dfin[n].T
        dx[s0:s1] = dxx[H:]
        dinit[n] = dxx[:H].T
    return dict(dx=dx, dweight=dw, dbias=None if b is None else db,
                d_initial_states=None if initial_states is None else dinit)
