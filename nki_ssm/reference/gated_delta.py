"""Float64 references for the gated delta rule (Gated DeltaNet, Qwen3-Next / Qwen3.5).

Per value head ``hv`` with state ``S [K, V]`` and token ``t``::

    S <- exp(g_t) S ;  u = beta_t (v_t - S^T k_t) ;  S <- S + k_t u^T ;  o_t = S^T (scale q_t)

Value head ``hv`` reads q/k head ``hv // (HV // H)``. Gates are either given
as ``g`` (log decay, <= 0) and ``beta``, or raw as ``a, b, A_log, dt_bias``
with ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``.

Three entry points (signatures in docs/contracts.md):

* ``gated_delta_recurrent`` -- token by token, literally the math above.
* ``gated_delta_chunked``   -- the chunked WY / UT form the kernels use.
* ``gated_delta_decode``    -- a few tokens per sequence, optionally returning
  the state after every token (speculative decoding).

All three cast inputs to float64, never modify them, and return float64
arrays plus a new float64 copy of the state pool in which only the named
slots changed. Padding sequences (``state_indices == -1``) give zero outputs
and touch no slot. A sequence of length 0 with ``has_initial_state`` False
writes the zero state to its slot (its final state is the zero initial state).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "gated_delta_recurrent",
    "gated_delta_chunked",
    "gated_delta_decode",
    "resolve_gates",
    "check_log_decay",
    "l2norm",
]

L2NORM_EPS = 1e-6
# Rows per exactly-inverted diagonal block of the chunk's triangular system.
SOLVE_BLOCK = 16


# ----------------------------------------------------------------------------
# small numeric helpers
# ----------------------------------------------------------------------------

def l2norm(x: np.ndarray) -> np.ndarray:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last axis (FLA / transformers convention)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)


def _softplus(x: np.ndarray) -> np.ndarray:
    # Exact softplus, stable for large |x| (no threshold: this is the reference).
    return np.logaddexp(0.0, x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows.
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


# ----------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------

def _as_f64(name: str, x) -> np.ndarray:
    """Float array (any float dtype incl. ml_dtypes bfloat16) -> new float64 array."""
    if x is None:
        raise TypeError(f"{name} must be an array, got None")
    arr = np.asarray(x)
    kind, dname = arr.dtype.kind, arr.dtype.name
    if not (kind == "f" or (kind == "V" and "float" in dname)):
        raise TypeError(f"{name} must have a floating dtype, got {arr.dtype}")
    return np.array(arr, dtype=np.float64, copy=True)


def _as_int(name: str, x, length: int | None = None) -> np.ndarray:
    if x is None:
        raise TypeError(f"{name} must be an integer array, got None")
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {arr.shape[0]}")
    return arr.astype(np.int64)


def _as_bool(name: str, x, length: int) -> np.ndarray:
    if x is None:
        raise TypeError(f"{name} must be a bool array, got None")
    arr = np.asarray(x)
    if arr.dtype.kind not in "biu":
        raise TypeError(f"{name} must have a bool dtype, got {arr.dtype}")
    if arr.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {arr.shape}")
    return arr.astype(bool)


def _check_shape(name: str, arr: np.ndarray, expected: tuple) -> None:
    if arr.shape != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {arr.shape}")


def _check_state_indices(state_indices: np.ndarray, slots: int) -> None:
    bad = (state_indices < -1) | (state_indices >= slots)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"state_indices must be in [-1, {slots}) (slots = ssm_states.shape[0]), "
            f"got state_indices[{i}] = {int(state_indices[i])}")
    named = state_indices[state_indices >= 0]
    if np.unique(named).size != named.size:
        raise ValueError(f"state_indices must not repeat a slot, got {state_indices.tolist()}")


def _check_cu_seqlens(cu: np.ndarray, num_tokens: int) -> None:
    if cu.shape[0] < 1:
        raise ValueError("cu_seqlens must have at least 1 entry (num_seqs + 1), got 0")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens[0] must be 0, got {int(cu[0])}")
    if cu[-1] != num_tokens:
        raise ValueError(
            f"cu_seqlens[-1] must equal num_tokens (q.shape[0]) = {num_tokens}, got {int(cu[-1])}")
    if np.any(np.diff(cu) < 0):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu.tolist()}")


def resolve_gates(lead: tuple, HV: int, *, g=None, beta=None, a=None, b=None,
                  A_log=None, dt_bias=None, live=None) -> tuple[np.ndarray, np.ndarray]:
    """Return float64 ``(g, beta)`` of shape ``lead + (HV,)``.

    Exactly one of the pairs (g, beta) or (a, b, A_log, dt_bias) must be given.
    ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``; ``g`` must be
    finite and <= 0 wherever ``live`` (bool ``lead``, None = everywhere) holds.
    """
    g64, beta64 = _gates_f64(lead, HV, g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    check_log_decay(g64, live)
    return g64, beta64


def _gates_f64(lead: tuple, HV: int, *, g=None, beta=None, a=None, b=None,
               A_log=None, dt_bias=None) -> tuple[np.ndarray, np.ndarray]:
    """``resolve_gates`` without the value check."""
    given = (g is not None or beta is not None)
    raw = any(x is not None for x in (a, b, A_log, dt_bias))
    if given and raw:
        raise ValueError("pass either (g, beta) or (a, b, A_log, dt_bias), got both")
    if not given and not raw:
        raise ValueError("pass either (g, beta) or (a, b, A_log, dt_bias), got neither")
    shape = tuple(lead) + (HV,)
    if given:
        if g is None or beta is None:
            missing = "g" if g is None else "beta"
            raise ValueError(f"{missing} must be given together with the other of (g, beta), got None")
        g64, beta64 = _as_f64("g", g), _as_f64("beta", beta)
        _check_shape("g", g64, shape)
        _check_shape("beta", beta64, shape)
    else:
        for name, val in (("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias)):
            if val is None:
                raise ValueError(f"{name} must be given with the raw gates (a, b, A_log, dt_bias), got None")
        a64, b64 = _as_f64("a", a), _as_f64("b", b)
        A64, dtb64 = _as_f64("A_log", A_log), _as_f64("dt_bias", dt_bias)
        _check_shape("a", a64, shape)
        _check_shape("b", b64, shape)
        _check_shape("A_log", A64, (HV,))
        _check_shape("dt_bias", dtb64, (HV,))
        with np.errstate(over="ignore", invalid="ignore"):
            g64 = -np.exp(A64) * _softplus(a64 + dtb64)
        beta64 = _sigmoid(b64)
    return g64, beta64


def check_log_decay(g64: np.ndarray, live=None) -> None:
    """g finite and <= 0 (a log decay) wherever ``live`` holds (a bool mask of
    g's leading dims; None = everywhere). Padding tokens are exempt: their
    values never enter the math (the host API applies the same rule)."""
    ok = np.isfinite(g64) & (g64 <= 0)
    if live is not None:
        live = np.asarray(live, dtype=bool)
        ok |= ~live.reshape(live.shape + (1,) * (g64.ndim - live.ndim))
    if not ok.all():
        raise ValueError(f"g must be finite and <= 0 (log decay) on every token of a "
                         f"non-padding sequence, got {g64[~ok].flat[0]!r}")


def _prepare(q, k, v, ssm_states, lead_name: str, gates: dict, scale, use_qk_l2norm):
    """Common checks for all entry points; ``lead_name`` names q's leading axes
    ("num_tokens" for prefill, "num_seqs, T" for decode). The gate values are
    checked by the caller once it knows which tokens are padding."""
    q64, k64, v64 = _as_f64("q", q), _as_f64("k", k), _as_f64("v", v)
    pool = _as_f64("ssm_states", ssm_states)
    nlead = len(lead_name.split(","))
    if q64.ndim != nlead + 2:
        raise ValueError(f"q must have shape [{lead_name}, H, K], got {q64.shape}")
    lead, (H, K) = q64.shape[:nlead], q64.shape[nlead:]
    _check_shape("k", k64, q64.shape)
    if v64.ndim != q64.ndim or v64.shape[:nlead] != lead:
        raise ValueError(f"v must have shape [{lead_name}, HV, V] matching q's leading axes "
                         f"{lead}, got {v64.shape}")
    HV, V = v64.shape[nlead:]
    if H == 0 or HV % H != 0:
        raise ValueError(f"v heads HV must be a multiple of q/k heads H = {H}, got HV = {HV}")
    if pool.ndim != 4 or pool.shape[1:] != (HV, K, V):
        raise ValueError(f"ssm_states must have shape [slots, {HV}, {K}, {V}], got {pool.shape}")
    g64, beta64 = _gates_f64(lead, HV, **gates)
    if scale is None:
        scale = K ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
            or not np.isfinite(scale):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    if use_qk_l2norm:
        q64, k64 = l2norm(q64), l2norm(k64)
    # Expand q/k heads to value heads (GQA) once: head hv reads hv // (HV // H).
    rep = HV // H
    q64 = np.repeat(q64, rep, axis=-2) * float(scale)
    k64 = np.repeat(k64, rep, axis=-2)
    return q64, k64, v64, g64, beta64, pool


# ----------------------------------------------------------------------------
# the two algorithms on one sequence (all heads at once)
# ----------------------------------------------------------------------------

def _recurrent_sequence(q, k, v, g, beta, S, states_out=None):
    """Token-by-token on one sequence; q, k [L, HV, K] (q already scaled), v [L, HV, V],
    g, beta [L, HV], S [HV, K, V]. Returns (o [L, HV, V], S). Writes per-token states
    into ``states_out [L, HV, K, V]`` if given."""
    o = np.zeros(v.shape)
    for t in range(q.shape[0]):
        S = np.exp(g[t])[:, None, None] * S
        u = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", S, k[t]))
        S = S + k[t][:, :, None] * u[:, None, :]
        o[t] = np.einsum("hkv,hk->hv", S, q[t])
        if states_out is not None:
            states_out[t] = S
    return o, S


def _unit_lower_inverse(A: np.ndarray, block: int = SOLVE_BLOCK) -> np.ndarray:
    """``(I + A)^{-1}`` for strictly-lower ``A [..., L, L]``, by exact blocks.

    Diagonal ``block``-row blocks: (I - N)^{-1} = (I + N)(I + N^2)(I + N^4)... with
    N = -A_bb nilpotent, so a few doublings are exact. Off-diagonal blocks by block
    forward substitution: T[i, :i] = -T_ii A[i, :i] T[:i, :i].
    """
    L = A.shape[-1]
    T = np.zeros_like(A)
    for s in range(0, L, block):
        e = min(s + block, L)
        n = e - s
        N = -A[..., s:e, s:e]
        inv = np.eye(n) + N
        power, covered = N, 2  # inv = sum_{m < covered} N^m
        while covered < n:
            power = power @ power
            inv = inv + inv @ power
            covered *= 2
        T[..., s:e, s:e] = inv
        if s > 0:
            T[..., s:e, :s] = -inv @ (A[..., s:e, :s] @ T[..., :s, :s])
    return T


def _chunked_sequence(q, k, v, g, beta, S, chunk_size):
    """WY / UT chunked form on one sequence; same arguments as ``_recurrent_sequence``.

    Head-major inside: per chunk of Lc tokens, c = cumsum(g), decay D_ij =
    exp(min(c_i - c_j, 0)) on i >= j (0 above), A = strictly-lower(beta_i k_i.k_j D_ij),
    T = (I + A)^{-1}, W = T (beta exp(c) k), U = T (beta v), v_new = U - W S,
    o = (exp(c) q) S + tril(q k^T * D) v_new, S <- exp(c_last) S + (exp(c_last - c) k)^T v_new.
    """
    L = q.shape[0]
    o = np.zeros(v.shape)
    qh, kh, vh = (x.transpose(1, 0, 2) for x in (q, k, v))  # [HV, L, D]
    gh, bh = g.T, beta.T  # [HV, L]
    for s in range(0, L, chunk_size):
        e = min(s + chunk_size, L)
        n = e - s
        qc, kc, vc, bc = qh[:, s:e], kh[:, s:e], vh[:, s:e], bh[:, s:e]
        c = np.cumsum(gh[:, s:e], axis=1)  # [HV, n], chunk-local log decay
        diff = c[:, :, None] - c[:, None, :]
        lower = np.tril(np.ones((n, n), dtype=bool))
        # exp(min(., 0)): the masked upper triangle (positive differences) never overflows.
        decay = np.where(lower, np.exp(np.minimum(diff, 0.0)), 0.0)
        kkt = kc @ kc.transpose(0, 2, 1)
        A = np.tril(bc[:, :, None] * kkt * decay, k=-1)
        T = _unit_lower_inverse(A)
        ec = np.exp(c)[:, :, None]
        W = T @ (bc[:, :, None] * ec * kc)
        U = T @ (bc[:, :, None] * vc)
        v_new = U - W @ S
        oc = (ec * qc) @ S + ((qc @ kc.transpose(0, 2, 1)) * decay) @ v_new
        o[s:e] = oc.transpose(1, 0, 2)
        c_last = c[:, -1]
        S = np.exp(c_last)[:, None, None] * S + (
            (np.exp(c_last[:, None] - c)[:, :, None] * kc).transpose(0, 2, 1) @ v_new)
    return o, S


# ----------------------------------------------------------------------------
# public entry points
# ----------------------------------------------------------------------------

def _prefill(q, k, v, gates, scale, use_qk_l2norm, cu_seqlens, ssm_states, state_indices,
             has_initial_state, run_sequence):
    q64, k64, v64, g64, beta64, pool = _prepare(
        q, k, v, ssm_states, "num_tokens", gates, scale, use_qk_l2norm)
    num_tokens = q64.shape[0]
    cu = _as_int("cu_seqlens", cu_seqlens)
    _check_cu_seqlens(cu, num_tokens)
    num_seqs = cu.shape[0] - 1
    idx = _as_int("state_indices", state_indices, num_seqs)
    _check_state_indices(idx, pool.shape[0])
    check_log_decay(g64, np.repeat(idx >= 0, np.diff(cu)))
    init = _as_bool("has_initial_state", has_initial_state, num_seqs)
    o = np.zeros(v64.shape)
    HV, K, V = pool.shape[1:]
    for n in range(num_seqs):
        slot = int(idx[n])
        if slot < 0:
            continue  # padding: zero output, no slot touched
        s, e = int(cu[n]), int(cu[n + 1])
        S0 = pool[slot].copy() if init[n] else np.zeros((HV, K, V))
        o[s:e], pool[slot] = run_sequence(q64[s:e], k64[s:e], v64[s:e], g64[s:e], beta64[s:e], S0)
    return o, pool


def gated_delta_recurrent(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None,
                          dt_bias=None, scale=None, use_qk_l2norm=False, cu_seqlens,
                          ssm_states, state_indices, has_initial_state):
    """Token-by-token gated delta rule over a ragged batch (the ground truth).

    q, k ``[num_tokens, H, K]``; v ``[num_tokens, HV, V]``; g, beta, a, b ``[num_tokens, HV]``;
    A_log, dt_bias ``[HV]``; cu_seqlens ``[num_seqs + 1]``; ssm_states ``[slots, HV, K, V]``;
    state_indices, has_initial_state ``[num_seqs]``.
    Returns ``(o [num_tokens, HV, V], ssm_states [slots, HV, K, V])``, float64, new arrays.
    """
    gates = dict(g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    return _prefill(q, k, v, gates, scale, use_qk_l2norm, cu_seqlens, ssm_states,
                    state_indices, has_initial_state, _recurrent_sequence)


def gated_delta_chunked(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None,
                        dt_bias=None, scale=None, use_qk_l2norm=False, cu_seqlens,
                        ssm_states, state_indices, has_initial_state, chunk_size=64):
    """Chunked WY / UT form of ``gated_delta_recurrent`` (same arguments and result).

    Chunks of ``chunk_size`` tokens start at each sequence's first token (never straddle
    sequences); the last chunk of a sequence may be short. The triangular system of a
    chunk is solved exactly on 16-row blocks (no Neumann series over the whole chunk).
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) \
            or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    gates = dict(g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)

    def run(q_, k_, v_, g_, b_, S):
        return _chunked_sequence(q_, k_, v_, g_, b_, S, int(chunk_size))

    return _prefill(q, k, v, gates, scale, use_qk_l2norm, cu_seqlens, ssm_states,
                    state_indices, has_initial_state, run)


def gated_delta_decode(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None,
                       dt_bias=None, scale=None, use_qk_l2norm=False, ssm_states,
                       state_indices, return_intermediate_states=False):
    """Decode ``T`` tokens per sequence, each sequence continuing from its pool slot.

    q, k ``[num_seqs, T, H, K]``; v ``[num_seqs, T, HV, V]``; g, beta, a, b
    ``[num_seqs, T, HV]``; ssm_states ``[slots, HV, K, V]``; state_indices ``[num_seqs]``.
    Returns ``(o [num_seqs, T, HV, V], ssm_states)`` and, with
    ``return_intermediate_states``, also ``intermediate [num_seqs, T, HV, K, V]``: the
    state after each token (zeros for padding sequences).
    """
    gates = dict(g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    q64, k64, v64, g64, beta64, pool = _prepare(
        q, k, v, ssm_states, "num_seqs, T", gates, scale, use_qk_l2norm)
    num_seqs, T = q64.shape[:2]
    idx = _as_int("state_indices", state_indices, num_seqs)
    _check_state_indices(idx, pool.shape[0])
    check_log_decay(g64, idx >= 0)
    o = np.zeros(v64.shape)
    inter = np.zeros((num_seqs, T) + pool.shape[1:]) if return_intermediate_states else None
    for n in range(num_seqs):
        slot = int(idx[n])
        if slot < 0:
            continue
        rec = inter[n] if inter is not None else None
        o[n], pool[slot] = _recurrent_sequence(q64[n], k64[n], v64[n], g64[n], beta64[n],
                                               pool[slot].copy(), rec)
    if return_intermediate_states:
        return o, pool, inter
    return o, pool
