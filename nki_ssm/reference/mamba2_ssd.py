"""float64 reference: Mamba-2 SSD (state space duality) scan with a state pool.

Math, per head h (group g = h // (H // G)), state S [P, N], token t:

    dt'_t = clip(softplus(dt_t + dt_bias_h) if dt_softplus else dt_t + dt_bias_h, *dt_limit)
    S     = exp(dt'_t A_h) S + dt'_t x_t B_t^T            x_t [P], B_t [N] (group g)
    y_t   = S C_t + D_h x_t                               C_t [N] (group g); D [H] or [H, P]
    y_t  *= silu(z_t)                                     only when z is given

softplus is exact (log1p(exp(.)), no threshold switch); the clip is applied
unconditionally (with the default (0, inf) it changes nothing for dt' >= 0).

Shapes (prefill, ragged by cu_seqlens [num_seqs + 1]):
    x [num_tokens, H, P], dt [num_tokens, H], A [H], B, C [num_tokens, G, N],
    D [H] or [H, P] or None, z [num_tokens, H, P] or None, dt_bias [H] or None,
    ssm_states [slots, H, P, N], state_indices [num_seqs], has_initial_state [num_seqs]
Decode: x [num_seqs, H, P] or [num_seqs, T, H, P], dt [num_seqs, (T,) H],
    B, C [num_seqs, (T,) G, N], z like x; always starts from the pool.

Pool semantics as the other families: a sequence's slot receives its final
state (an empty sequence writes its initial state: the pool value, or zeros
when has_initial_state is False); padding (slot -1) outputs zeros and touches
nothing; other slots are copied unchanged. Returns (y float64, new pool float64).

Three forms: `ssd_recurrent` (token by token, the ground truth), `ssd_chunked`
(the SSD block algorithm: intra-chunk masked decay matrix, chunk states,
inter-chunk state passing, state-to-output term; chunks restart at every
sequence start, the last chunk of a sequence may be short), `ssd_decode`
(selective state update over a batch of sequences, T steps).
"""

from __future__ import annotations

import math

import numpy as np

from ._pool import decode_slots, f64, f64_or_none, ragged_segments, silu

__all__ = ["ssd_recurrent", "ssd_chunked", "ssd_decode", "ssd_dt"]

_INF = math.inf


def ssd_dt(dt, dt_bias=None, dt_softplus=False, dt_limit=(0.0, _INF)) -> np.ndarray:
    """dt' = clip(softplus(dt + dt_bias) if dt_softplus else dt + dt_bias, *dt_limit), float64.

    dt `[..., H]`, dt_bias `[H]` or None."""
    d = f64(dt, "dt")
    if dt_bias is not None:
        d = d + f64(dt_bias, "dt_bias")
    if dt_softplus:
        d = np.logaddexp(0.0, d)
    lo, hi = dt_limit
    return np.clip(d, lo, hi)


class _Params:
    """float64 copies of every input and the derived sizes, checked for shape."""

    def __init__(self, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states, lead):
        self.x = f64(x, "x")
        lead_shape = self.x.shape[:lead]
        if self.x.ndim != lead + 2:
            raise ValueError(f"x must have {lead + 2} dims [..., H, P], got shape {self.x.shape}")
        H, P = self.x.shape[lead:]
        self.B, self.C = f64(B, "B"), f64(C, "C")
        if self.B.ndim != lead + 2 or self.B.shape[:lead] != lead_shape:
            raise ValueError(f"B must have shape {lead_shape} + (G, N), got {self.B.shape}")
        G, N = self.B.shape[lead:]
        if self.C.shape != self.B.shape:
            raise ValueError(f"C must have the shape of B {self.B.shape}, got {self.C.shape}")
        if G < 1 or H % G:
            raise ValueError(f"G (B.shape[-2]) must divide H = {H}, got {G}")
        self.A = f64(A, "A")
        if self.A.shape != (H,):
            raise ValueError(f"A must have shape ({H},), got {self.A.shape}")
        if np.shape(dt) != lead_shape + (H,):
            raise ValueError(f"dt must have shape {lead_shape + (H,)}, got {np.shape(dt)}")
        if dt_bias is not None and np.shape(dt_bias) != (H,):
            raise ValueError(f"dt_bias must have shape ({H},), got {np.shape(dt_bias)}")
        self.dt = ssd_dt(dt, dt_bias, dt_softplus, dt_limit)
        Df = f64_or_none(D, "D")
        if Df is not None:
            if Df.shape == (H,):
                Df = np.repeat(Df[:, None], P, axis=1)
            elif Df.shape != (H, P):
                raise ValueError(f"D must have shape ({H},) or ({H}, {P}), got {Df.shape}")
        self.D = Df
        self.z = f64_or_none(z, "z")
        if self.z is not None and self.z.shape != self.x.shape:
            raise ValueError(f"z must have the shape of x {self.x.shape}, got {self.z.shape}")
        self.pool = f64(ssm_states, "ssm_states")
        if self.pool.ndim != 4 or self.pool.shape[1:] != (H, P, N):
            raise ValueError(f"ssm_states must have shape [slots, {H}, {P}, {N}], "
                             f"got {self.pool.shape}")
        self.H, self.P, self.N, self.G = H, P, N, G
        # group of each head, as an index array: head h reads B/C group h // (H // G)
        self.group = np.arange(H) // (H // G)

    def finish(self, y, x, z):
        """y + D x, then the z gate (same for every form)."""
        if self.D is not None:
            y = y + self.D * x
        if z is not None:
            y = y * silu(z)
        return y


def _prefill(p, cu_seqlens, state_indices, has_initial_state, run_sequence):
    """The ragged walk both prefill forms share: per non-padding sequence, its initial
    state (pool slot or zeros), ``run_sequence(seg, S0) -> (y [L, H, P] without D/z,
    S_end [H, P, N])``, then D/z and the slot write. -> (y [num_tokens, H, P], pool)."""
    y = np.zeros_like(p.x)
    for seg in ragged_segments(p.x.shape[0], cu_seqlens, state_indices, has_initial_state,
                               p.pool.shape[0]):
        if seg.is_padding:
            continue   # zero output, no slot touched
        S = p.pool[seg.slot].copy() if seg.has_initial_state else np.zeros((p.H, p.P, p.N))
        rows = slice(seg.start, seg.end)
        y_seq, S = run_sequence(seg, S)
        y[rows] = p.finish(y_seq, p.x[rows], None if p.z is None else p.z[rows])
        p.pool[seg.slot] = S
    return y, p.pool


def ssd_recurrent(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                  dt_limit=(0.0, _INF), cu_seqlens, ssm_states, state_indices,
                  has_initial_state):
    """Token by token, per head, straight from the math. -> (y [num_tokens, H, P], ssm_states)."""
    p = _Params(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states, lead=1)

    def run_sequence(seg, S):
        y = np.zeros((seg.length, p.H, p.P))
        for i, t in enumerate(range(seg.start, seg.end)):
            for h in range(p.H):
                g = p.group[h]
                S[h] = (math.exp(p.dt[t, h] * p.A[h]) * S[h]
                        + p.dt[t, h] * np.outer(p.x[t, h], p.B[t, g]))
                y[i, h] = S[h] @ p.C[t, g]
        return y, S

    return _prefill(p, cu_seqlens, state_indices, has_initial_state, run_sequence)


def _chunk(p, S0, x, dt, B, C):
    """One chunk of Lc tokens of one sequence, all heads.

    x [Lc, H, P], dt [Lc, H], B, C [Lc, H, N] (already expanded to heads), S0 [H, P, N].
    Returns (y [Lc, H, P] without D/z, S_end [H, P, N])."""
    Lc = x.shape[0]
    cum = np.cumsum(dt * p.A, axis=0)                          # [Lc, H], inclusive, <= 0, falling
    # decay from token j to token i (i >= j): exp(cum_i - cum_j); masked before exp so the
    # upper triangle never evaluates a positive exponent (never exp(cum_i) * exp(-cum_j))
    diff = cum[:, None, :] - cum[None, :, :]                   # [i, j, H]
    causal = np.tril(np.ones((Lc, Lc), dtype=bool))[:, :, None]
    Ldec = np.where(causal, np.exp(np.minimum(diff, 0.0)), 0.0)
    # intra-chunk (the "diagonal block"): y_i = sum_j (C_i . B_j) L_ij dt_j x_j
    CB = np.einsum("ihn,jhn->ijh", C, B)                       # [i, j, H]
    y_diag = np.einsum("ijh,jh,jhp->ihp", CB * Ldec, dt, x)
    # state entering the chunk, decayed to token i and read by C_i
    y_off = np.einsum("ihn,hpn->ihp", C, S0) * np.exp(cum)[:, :, None]
    # chunk state: S_end = exp(cum_last) S0 + sum_j exp(cum_last - cum_j) dt_j x_j B_j^T
    decay_to_end = np.exp(np.minimum(cum[-1][None, :] - cum, 0.0))   # [Lc, H]
    S_end = (np.exp(cum[-1])[:, None, None] * S0
             + np.einsum("jh,jhp,jhn->hpn", decay_to_end * dt, x, B))
    return y_diag + y_off, S_end


def ssd_chunked(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                dt_limit=(0.0, _INF), cu_seqlens, ssm_states, state_indices,
                has_initial_state, chunk_size=128):
    """The SSD chunked algorithm with any chunk_size >= 1; chunks restart at each
    sequence start and the state is passed from chunk to chunk.
    -> (y [num_tokens, H, P], ssm_states)."""
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    p = _Params(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states, lead=1)
    Bh, Ch = p.B[:, p.group, :], p.C[:, p.group, :]           # [num_tokens, H, N]

    def run_sequence(seg, S):
        y = np.zeros((seg.length, p.H, p.P))
        for c0 in range(seg.start, seg.end, chunk_size):
            c1 = min(c0 + chunk_size, seg.end)
            y[c0 - seg.start:c1 - seg.start], S = _chunk(
                p, S, p.x[c0:c1], p.dt[c0:c1], Bh[c0:c1], Ch[c0:c1])
        return y, S

    return _prefill(p, cu_seqlens, state_indices, has_initial_state, run_sequence)


def ssd_decode(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
               dt_limit=(0.0, _INF), ssm_states, state_indices):
    """Selective state update: x `[num_seqs, H, P]` (one token) or `[num_seqs, T, H, P]`,
    all sequences at once, T steps from the pool. -> (y shaped like x, ssm_states)."""
    ndim = np.ndim(x)
    if ndim not in (3, 4):
        raise ValueError(f"x must have shape [num_seqs, H, P] or [num_seqs, T, H, P], "
                         f"got {np.shape(x)}")
    p = _Params(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states,
                lead=ndim - 2)
    xs, dts, Bs, Cs, zs = p.x, p.dt, p.B, p.C, p.z
    if ndim == 3:    # one token: add the T axis
        xs, dts, Bs, Cs = xs[:, None], dts[:, None], Bs[:, None], Cs[:, None]
        zs = None if zs is None else zs[:, None]
    num_seqs, T = xs.shape[:2]
    slots = decode_slots(num_seqs, state_indices, p.pool.shape[0])
    live = np.nonzero(slots >= 0)[0]
    S = p.pool[slots[live]]                                    # [n, H, P, N]
    y = np.zeros_like(xs)
    for t in range(T):
        dtt = dts[live, t]                                     # [n, H]
        Bt = Bs[live, t][:, p.group, :]                        # [n, H, N]
        Ct = Cs[live, t][:, p.group, :]
        xt = xs[live, t]                                       # [n, H, P]
        S = (np.exp(dtt * p.A)[:, :, None, None] * S
             + np.einsum("sh,shp,shn->shpn", dtt, xt, Bt))
        yt = np.einsum("shpn,shn->shp", S, Ct)
        y[live, t] = p.finish(yt, xt, None if zs is None else zs[live, t])
    p.pool[slots[live]] = S
    return (y[:, 0] if ndim == 3 else y), p.pool
