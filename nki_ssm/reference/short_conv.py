"""float64 reference: short causal depthwise conv1d with a state pool.

Math, per channel c of sequence tokens x_0 .. x_{L-1} with the W-1 inputs
before x_0 taken from the state (zeros when has_initial_state is False):

    y_t[c] = act( bias[c] + sum_{k=0}^{W-1} weight[c, k] * x_{t-(W-1)+k}[c] )

so weight[:, W-1] multiplies the current token (as F.conv1d with padding
W-1 and the causal crop, and causal-conv1d). act is None or "silu".

Shapes:
    x            [num_tokens, dim]   (prefill, ragged by cu_seqlens [num_seqs + 1])
    x            [num_seqs, T, dim]  (decode; [num_seqs, dim] also accepted = T of 1)
    weight       [dim, W], W >= 2;   bias [dim] or None
    conv_states  [slots, dim, W-1]   the last W-1 inputs of a sequence, oldest first

Pool semantics: after a sequence, its slot holds the last W-1 entries of
(initial state ++ its inputs), so a sequence shorter than W-1 keeps the tail
of the old state. An empty sequence with a slot writes its initial state
(zeros when has_initial_state is False). Padding sequences (slot -1) output
zeros and touch nothing; slots no sequence names are copied unchanged.
Decode always starts from the pool.

Every function returns (y float64, a new float64 copy of the pool).
"""

from __future__ import annotations

import numpy as np

from ._pool import ACTIVATIONS, f64, f64_or_none, ragged_segments, decode_slots, silu

__all__ = ["short_conv_recurrent", "short_conv_prefill", "short_conv_decode"]


def _params(x, weight, bias, activation, conv_states, x_ndim_ok):
    xf = f64(x, "x")
    w = f64(weight, "weight")
    b = f64_or_none(bias, "bias")
    pool = f64(conv_states, "conv_states")
    if xf.ndim not in x_ndim_ok:
        raise ValueError(f"x must have {' or '.join(map(str, x_ndim_ok))} dims, got shape {xf.shape}")
    dim = xf.shape[-1]
    if w.ndim != 2 or w.shape[0] != dim or w.shape[1] < 2:
        raise ValueError(f"weight must have shape [dim = {dim}, W >= 2], got {w.shape}")
    W = w.shape[1]
    if b is not None and b.shape != (dim,):
        raise ValueError(f"bias must have shape ({dim},), got {b.shape}")
    if pool.ndim != 3 or pool.shape[1:] != (dim, W - 1):
        raise ValueError(f"conv_states must have shape [slots, {dim}, {W - 1}], got {pool.shape}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return xf, w, b, pool


def _act(y, activation):
    return silu(y) if activation == "silu" else y


def short_conv_recurrent(x, weight, bias=None, *, activation=None, cu_seqlens, conv_states,
                         state_indices, has_initial_state):
    """Token by token, literally from the math: a W-wide window slides over
    (state ++ x). x `[num_tokens, dim]` -> (y `[num_tokens, dim]`, conv_states)."""
    xf, w, b, pool = _params(x, weight, bias, activation, conv_states, (2,))
    y = np.zeros_like(xf)
    for seg in ragged_segments(xf.shape[0], cu_seqlens, state_indices, has_initial_state,
                               pool.shape[0]):
        if seg.is_padding:
            continue
        window = pool[seg.slot].copy() if seg.has_initial_state else np.zeros(pool.shape[1:])
        for t in range(seg.start, seg.end):
            full = np.concatenate([window, xf[t][:, None]], axis=1)     # [dim, W], oldest first
            acc = np.sum(full * w, axis=1)
            if b is not None:
                acc = acc + b
            y[t] = _act(acc, activation)
            window = full[:, 1:]
        pool[seg.slot] = window
    return y, pool


def short_conv_prefill(x, weight, bias=None, *, activation=None, cu_seqlens, conv_states,
                       state_indices, has_initial_state):
    """Vectorised per sequence: y = sum_k weight[:, k] * xx[k : k + L] over the
    padded stream xx = (state ++ x). Same contract as short_conv_recurrent."""
    xf, w, b, pool = _params(x, weight, bias, activation, conv_states, (2,))
    W = w.shape[1]
    y = np.zeros_like(xf)
    for seg in ragged_segments(xf.shape[0], cu_seqlens, state_indices, has_initial_state,
                               pool.shape[0]):
        if seg.is_padding:
            continue
        init = pool[seg.slot].T if seg.has_initial_state else np.zeros((W - 1, xf.shape[1]))
        xx = np.concatenate([init, xf[seg.start:seg.end]], axis=0)    # [L + W - 1, dim]
        L = seg.length
        acc = sum(w[:, k] * xx[k:k + L] for k in range(W))
        if b is not None:
            acc = acc + b
        y[seg.start:seg.end] = _act(acc, activation)
        pool[seg.slot] = xx[L:].T          # last W-1 rows of xx
    return y, pool


def short_conv_decode(x, weight, bias=None, *, activation=None, conv_states, state_indices):
    """Decode: x `[num_seqs, T, dim]` (or `[num_seqs, dim]`) continuing from the
    pool with a state shift per token, all sequences at once.
    Returns (y shaped like x, conv_states)."""
    xf, w, b, pool = _params(x, weight, bias, activation, conv_states, (2, 3))
    squeeze = xf.ndim == 2
    if squeeze:
        xf = xf[:, None, :]
    num_seqs, T, dim = xf.shape
    slots = decode_slots(num_seqs, state_indices, pool.shape[0])
    live = np.nonzero(slots >= 0)[0]
    state = pool[slots[live]]                       # [n_live, dim, W-1], a copy
    y = np.zeros_like(xf)
    for t in range(T):
        xt = xf[live, t, :]                         # [n_live, dim]
        acc = np.einsum("scw,cw->sc", state, w[:, :-1]) + xt * w[:, -1]
        if b is not None:
            acc = acc + b
        y[live, t, :] = _act(acc, activation)
        # shift left by one column, append the new input
        state = np.concatenate([state[:, :, 1:], xt[:, :, None]], axis=2)
    pool[slots[live]] = state
    return (y[:, 0, :] if squeeze else y), pool
