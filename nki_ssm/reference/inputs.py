"""Realistic random inputs for every op family, at any shape.

Each `make_*_inputs` returns a dict of keyword arguments accepted by both the
reference (`nki_ssm.reference.*`) and the host-API op (`nki_ssm.ops.*`) of
that family: `ref_fn(**inputs)` and `op(**inputs)` both work. Arrays are in
the requested `dtype` (`np.float32`, `np.float64` or `ml_dtypes.bfloat16`);
state pools in `pool_dtype`; `cu_seqlens`, `state_indices` int32;
`has_initial_state` bool. Small per-head parameters (A, A_log, dt_bias, D)
are float32 as in the models (they are fp32 parameters there).

Realism (the inputs every kernel is tested on):
  * Mamba-2: A = -exp(A_log), A in [-16, -1]; dt raw ~ N(0, 1.5^2) with a
    few large spikes, passed through softplus(dt + dt_bias) in the op
    (`dt_softplus=True`, the default) so dt' spans ~1e-3 .. 10; with
    `dt_mode="raw"` the generator applies softplus itself and passes
    dt' > 0 with dt_bias None, dt_softplus False. B, C, x, z ~ N(0, 1).
  * Gated DeltaNet: g = -exp(A_log) * softplus(a + dt_bias), exp(A_log) in
    [1, 16]; beta = sigmoid(b); keys (and queries) L2-normalised, or raw
    with `use_qk_l2norm=True`; v ~ N(0, 1).
  * `gate_pattern="strong_then_weak"` (SSD and GDN generators): in every
    block of `PATTERN_BLOCK` = 16 tokens from each sequence's start (so
    every chunk of 16, 32, ..., 128 tokens holds whole blocks), the first
    `PATTERN_STRONG` = 8 tokens decay strongly and the other 8 barely:
    GDN `a + dt_bias` ~ U(2, 5) then U(-8, -6) (g about -2..-80, then
    -3e-4..-4e-2); SSD dt' ~ U(1, 4) then U(1e-4, 1e-3) (dt' A about
    -1..-64, then -1e-4..-1.6e-2). Chunk sums of the
    log decays then grow large while neighbouring tokens differ by little,
    which exposes decays formed as differences of running sums (they
    cancel in float32). The default "realistic" draws as described above.
  * Conv: weight ~ U(-1/sqrt(W), 1/sqrt(W)), bias likewise.
  * Pools are filled with random values (so "untouched slot" checks mean
    something); `state_indices` is a random subset of distinct slots, some
    replaced by -1 (padding) when `padding > 0`; `has_initial_state` mixed
    by default. By default `slots = num_seqs + 3`, so some slots are named
    by no sequence.

Ragged layout helpers: `cu_seqlens_from_lengths`, `random_seqlens`,
`random_cu_seqlens`, `seqlens_from_cu`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "cu_seqlens_from_lengths", "seqlens_from_cu", "random_seqlens", "random_cu_seqlens",
    "make_slots", "softplus", "sigmoid", "l2norm",
    "make_short_conv_inputs", "make_short_conv_decode_inputs",
    "make_ssd_inputs", "make_ssd_decode_inputs",
    "make_gated_delta_inputs", "make_gated_delta_decode_inputs",
    "GATE_PATTERNS", "PATTERN_BLOCK", "PATTERN_STRONG", "strong_decay_tokens",
]

# Gate patterns of the SSD and GDN generators (module docstring).
GATE_PATTERNS = ("realistic", "strong_then_weak")
PATTERN_BLOCK = 16    # tokens per strong-then-weak block: the smallest chunk size
PATTERN_STRONG = 8    # strong-decay tokens at the start of each block


# ----------------------------------------------------------------------------- math helpers

def softplus(x):
    """log(1 + exp(x)) in float64, overflow-free (no threshold switch: exact)."""
    x = np.asarray(x, dtype=np.float64)
    return np.logaddexp(0.0, x)


def sigmoid(x):
    """1 / (1 + exp(-x)) in float64, overflow-free."""
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -x))


def l2norm(x, axis=-1, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) along `axis`, float64 (eps inside the sqrt, as FLA/HF)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.sum(x * x, axis=axis, keepdims=True) + eps)


# ----------------------------------------------------------------------------- ragged layout

def cu_seqlens_from_lengths(lengths: Sequence[int]) -> np.ndarray:
    """int32 `[num_seqs + 1]` prefix sums of `lengths` (lengths may be 0)."""
    lengths = [int(n) for n in lengths]
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths must be >= 0, got {lengths}")
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)


def seqlens_from_cu(cu_seqlens) -> list[int]:
    """Per-sequence lengths from `cu_seqlens`."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    return [int(n) for n in np.diff(cu)]


def strong_decay_tokens(positions) -> np.ndarray:
    """bool: which tokens (by position in their sequence) decay strongly under
    ``gate_pattern="strong_then_weak"``."""
    return np.asarray(positions) % PATTERN_BLOCK < PATTERN_STRONG


def _positions(cu: np.ndarray) -> np.ndarray:
    """int64 ``[num_tokens]``: each token's position inside its sequence."""
    cu = np.asarray(cu, dtype=np.int64)
    lengths = np.diff(cu)
    return np.arange(int(cu[-1])) - np.repeat(cu[:-1], lengths)


def _decode_positions(lead: tuple) -> np.ndarray:
    """Token positions of a decode batch ``[num_seqs, (T)]``: t (0 for one token)."""
    return np.broadcast_to(np.arange(lead[1]) if len(lead) == 2 else np.zeros(1, np.int64),
                           lead)


def _check_pattern(gate_pattern: str) -> None:
    if gate_pattern not in GATE_PATTERNS:
        raise ValueError(f"gate_pattern must be one of {GATE_PATTERNS}, got {gate_pattern!r}")


def random_seqlens(rng: np.random.Generator, num_seqs: int, max_len: int, *,
                   min_len: int = 0) -> list[int]:
    """`num_seqs` lengths uniform in [min_len, max_len] (min_len 0 allows empty sequences)."""
    if num_seqs < 0 or min_len < 0 or max_len < min_len:
        raise ValueError(
            f"need num_seqs >= 0 and 0 <= min_len <= max_len, got num_seqs={num_seqs}, "
            f"min_len={min_len}, max_len={max_len}"
        )
    return [int(n) for n in rng.integers(min_len, max_len + 1, size=num_seqs)]


def random_cu_seqlens(rng: np.random.Generator, num_seqs: int, max_len: int, *,
                      min_len: int = 0) -> np.ndarray:
    """int32 cu_seqlens of `num_seqs` random lengths in [min_len, max_len]."""
    return cu_seqlens_from_lengths(random_seqlens(rng, num_seqs, max_len, min_len=min_len))


def _lengths(seqlens) -> list[int]:
    if isinstance(seqlens, (int, np.integer)):
        raise TypeError(f"seqlens must be a sequence of lengths, got the int {seqlens}")
    lengths = [int(n) for n in seqlens]
    if any(n < 0 for n in lengths):
        raise ValueError(f"seqlens must be >= 0, got {lengths}")
    return lengths


def make_slots(rng: np.random.Generator, num_seqs: int, slots: int | None = None, *,
               padding: int = 0, has_initial_state="mixed"):
    """(slots, state_indices int32 [num_seqs], has_initial_state bool [num_seqs]).

    `state_indices` are distinct random slots; `padding` of them (random
    positions) are replaced by -1. `slots` may be below num_seqs (down to
    num_seqs - padding, 0 for an all-padding batch). `has_initial_state`: "mixed" (random),
    True, False, or a bool sequence of length num_seqs.
    """
    if slots is None:
        slots = num_seqs + 3
    if not 0 <= padding <= num_seqs:
        raise ValueError(f"padding must be in [0, num_seqs = {num_seqs}], got {padding}")
    if slots < num_seqs - padding:
        raise ValueError(f"slots must be >= the non-padding sequences num_seqs - padding = "
                         f"{num_seqs - padding}, got {slots}")
    if slots >= num_seqs:
        idx = rng.permutation(slots)[:num_seqs].astype(np.int32)
        if padding:
            idx[rng.permutation(num_seqs)[:padding]] = -1
    else:   # fewer slots than sequences (down to 0): only the padding ones go without
        idx = np.full(num_seqs, -1, np.int32)
        live = np.sort(rng.permutation(num_seqs)[padding:])
        idx[live] = rng.permutation(slots)[:live.size]
    if isinstance(has_initial_state, str):
        if has_initial_state != "mixed":
            raise ValueError(f"has_initial_state must be 'mixed', a bool or a bool array, "
                             f"got {has_initial_state!r}")
        init = rng.random(num_seqs) < 0.5
    elif np.ndim(has_initial_state) == 0:
        init = np.full(num_seqs, bool(has_initial_state))
    else:
        init = np.asarray(has_initial_state, dtype=bool)
        if init.shape != (num_seqs,):
            raise ValueError(f"has_initial_state must have shape ({num_seqs},), got {init.shape}")
    return int(slots), idx, init.astype(bool)


def _cast(a, dtype):
    return np.asarray(a, dtype=np.float64).astype(dtype)


def _pool(rng, shape: tuple, scale: float, dtype) -> np.ndarray:
    """``_cast(scale * rng.standard_normal(shape), dtype)`` drawn one slot at a time: the same
    values (the generator's stream is read in the same order) without a float64 array of the
    whole pool (a 515-slot Mamba-2 2.7B pool is 2.7 GB in float64, 1.35 GB in float32)."""
    out = np.empty(shape, dtype)
    for slot in range(shape[0]):
        out[slot] = _cast(scale * rng.standard_normal(shape[1:]), dtype)
    return out


# ----------------------------------------------------------------------------- short conv

def _conv_params(rng, dim, W, bias, dtype, weight_dtype=None):
    """weight `[dim, W]` and bias `[dim]` (or None) in `weight_dtype` (None: `dtype`)."""
    if W < 2:
        raise ValueError(f"W must be >= 2, got {W}")
    wdt = dtype if weight_dtype is None else weight_dtype
    bound = 1.0 / np.sqrt(W)
    weight = _cast(rng.uniform(-bound, bound, size=(dim, W)), wdt)
    b = _cast(rng.uniform(-bound, bound, size=(dim,)), wdt) if bias else None
    return weight, b


def make_short_conv_inputs(rng: np.random.Generator, *, seqlens, dim: int, W: int,
                           slots: int | None = None, dtype=np.float32,
                           pool_dtype=np.float32, padding: int = 0,
                           has_initial_state="mixed", bias: bool = True,
                           activation: str | None = "silu", weight_dtype=None) -> dict:
    """Prefill inputs: x `[num_tokens, dim]`, weight `[dim, W]`, bias `[dim]` or None,
    activation, cu_seqlens, conv_states `[slots, dim, W-1]`, state_indices,
    has_initial_state. weight and bias are in `weight_dtype` (None: `dtype`)."""
    lengths = _lengths(seqlens)
    cu = cu_seqlens_from_lengths(lengths)
    slots, idx, init = make_slots(rng, len(lengths), slots, padding=padding,
                                  has_initial_state=has_initial_state)
    weight, b = _conv_params(rng, dim, W, bias, dtype, weight_dtype)
    return dict(
        x=_cast(rng.standard_normal((int(cu[-1]), dim)), dtype),
        weight=weight, bias=b, activation=activation, cu_seqlens=cu,
        conv_states=_pool(rng, (slots, dim, W - 1), 1.0, pool_dtype),
        state_indices=idx, has_initial_state=init,
    )


def make_short_conv_decode_inputs(rng: np.random.Generator, *, num_seqs: int, T: int | None = 1,
                                  dim: int, W: int, slots: int | None = None,
                                  dtype=np.float32, pool_dtype=np.float32, padding: int = 0,
                                  bias: bool = True, activation: str | None = "silu",
                                  weight_dtype=None) -> dict:
    """Decode inputs: x `[num_seqs, T, dim]` (or `[num_seqs, dim]` when T is None),
    weight, bias, activation, conv_states `[slots, dim, W-1]`, state_indices.
    weight and bias are in `weight_dtype` (None: `dtype`)."""
    slots, idx, _ = make_slots(rng, num_seqs, slots, padding=padding)
    weight, b = _conv_params(rng, dim, W, bias, dtype, weight_dtype)
    xshape = (num_seqs, dim) if T is None else (num_seqs, T, dim)
    return dict(
        x=_cast(rng.standard_normal(xshape), dtype), weight=weight, bias=b,
        activation=activation,
        conv_states=_pool(rng, (slots, dim, W - 1), 1.0, pool_dtype),
        state_indices=idx,
    )


# ----------------------------------------------------------------------------- Mamba-2 SSD

def _softplus_inv(y):
    """x with softplus(x) = y > 0, float64."""
    y = np.asarray(y, dtype=np.float64)
    return y + np.log(-np.expm1(-y))


def _ssd_dt(rng, shape, H, dt_mode, positions=None):
    """dt (raw), dt_bias, dt_softplus for the two dt conventions; with token
    ``positions`` (gate_pattern "strong_then_weak") dt' follows the pattern."""
    if dt_mode not in ("softplus", "raw"):
        raise ValueError(f"dt_mode must be 'softplus' or 'raw', got {dt_mode!r}")
    # Mamba-2 init: dt_bias = softplus^-1(dt0), dt0 log-uniform in [1e-3, 1e-1].
    dt0 = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), size=H))
    dt_bias = _softplus_inv(dt0)
    raw = 1.5 * rng.standard_normal(shape)
    # a few large spikes: dt' up to ~10, so dt' * A reaches -160 (state wiped)
    spikes = rng.random(shape) < 0.05
    raw = np.where(spikes, rng.uniform(2.0, 10.0, size=shape), raw)
    if positions is not None:
        strong = strong_decay_tokens(positions)[..., None]
        target = np.where(strong, rng.uniform(1.0, 4.0, size=shape),
                          rng.uniform(1e-4, 1e-3, size=shape))
        raw = _softplus_inv(target) - dt_bias
    if dt_mode == "softplus":
        return _f32(raw), _f32(dt_bias), True
    return softplus(raw + dt_bias), None, False


def _f32(a):
    return np.asarray(a, dtype=np.float32)


def _ssd_params(rng, H, P, D, dtype):
    A = _f32(-np.exp(rng.uniform(np.log(1.0), np.log(16.0), size=H)))
    if D is None:
        Dv = None
    elif D == "H":
        Dv = _f32(rng.uniform(0.5, 1.5, size=H))
    elif D == "HP":
        Dv = _f32(rng.uniform(0.5, 1.5, size=(H, P)))
    else:
        raise ValueError(f"D must be None, 'H' or 'HP', got {D!r}")
    return A, Dv


def _check_groups(H, G):
    if G < 1 or H % G:
        raise ValueError(f"G must divide H = {H}, got G = {G}")


def make_ssd_inputs(rng: np.random.Generator, *, seqlens, H: int, P: int, N: int, G: int = 1,
                    slots: int | None = None, dtype=np.float32, pool_dtype=np.float32,
                    padding: int = 0, has_initial_state="mixed", D: str | None = "H",
                    z: bool = False, dt_mode: str = "softplus",
                    dt_limit=(0.0, float("inf")), gate_pattern: str = "realistic") -> dict:
    """Prefill inputs: x `[num_tokens, H, P]`, dt `[num_tokens, H]`, A `[H]`,
    B, C `[num_tokens, G, N]`, D (`[H]` for D="H", `[H, P]` for "HP", or None),
    z `[num_tokens, H, P]` or None, dt_bias `[H]` or None, dt_softplus, dt_limit,
    cu_seqlens, ssm_states `[slots, H, P, N]`, state_indices, has_initial_state.
    `gate_pattern`: "realistic" or "strong_then_weak" (module docstring)."""
    _check_groups(H, G)
    _check_pattern(gate_pattern)
    lengths = _lengths(seqlens)
    cu = cu_seqlens_from_lengths(lengths)
    T = int(cu[-1])
    slots, idx, init = make_slots(rng, len(lengths), slots, padding=padding,
                                  has_initial_state=has_initial_state)
    A, Dv = _ssd_params(rng, H, P, D, dtype)
    dt, dt_bias, sp = _ssd_dt(rng, (T, H), H, dt_mode,
                              None if gate_pattern == "realistic" else _positions(cu))
    return dict(
        x=_cast(rng.standard_normal((T, H, P)), dtype), dt=_cast(dt, dtype), A=A,
        B=_cast(rng.standard_normal((T, G, N)), dtype),
        C=_cast(rng.standard_normal((T, G, N)), dtype),
        D=Dv, z=_cast(rng.standard_normal((T, H, P)), dtype) if z else None,
        dt_bias=dt_bias, dt_softplus=sp, dt_limit=tuple(dt_limit), cu_seqlens=cu,
        ssm_states=_pool(rng, (slots, H, P, N), 0.5, pool_dtype),
        state_indices=idx, has_initial_state=init,
    )


def make_ssd_decode_inputs(rng: np.random.Generator, *, num_seqs: int, T: int | None = None,
                           H: int, P: int, N: int, G: int = 1, slots: int | None = None,
                           dtype=np.float32, pool_dtype=np.float32, padding: int = 0,
                           D: str | None = "H", z: bool = False, dt_mode: str = "softplus",
                           dt_limit=(0.0, float("inf")),
                           gate_pattern: str = "realistic") -> dict:
    """Decode inputs: x `[num_seqs, H, P]` (T None) or `[num_seqs, T, H, P]`,
    dt `[num_seqs, (T,) H]`, A, B, C `[num_seqs, (T,) G, N]`, D, z, dt_bias,
    dt_softplus, dt_limit, ssm_states `[slots, H, P, N]`, state_indices.
    `gate_pattern` as in make_ssd_inputs (token t of each sequence is at position t)."""
    _check_groups(H, G)
    _check_pattern(gate_pattern)
    slots, idx, _ = make_slots(rng, num_seqs, slots, padding=padding)
    lead = (num_seqs,) if T is None else (num_seqs, T)
    A, Dv = _ssd_params(rng, H, P, D, dtype)
    dt, dt_bias, sp = _ssd_dt(rng, lead + (H,), H, dt_mode,
                              None if gate_pattern == "realistic" else _decode_positions(lead))
    return dict(
        x=_cast(rng.standard_normal(lead + (H, P)), dtype), dt=_cast(dt, dtype), A=A,
        B=_cast(rng.standard_normal(lead + (G, N)), dtype),
        C=_cast(rng.standard_normal(lead + (G, N)), dtype),
        D=Dv, z=_cast(rng.standard_normal(lead + (H, P)), dtype) if z else None,
        dt_bias=dt_bias, dt_softplus=sp, dt_limit=tuple(dt_limit),
        ssm_states=_pool(rng, (slots, H, P, N), 0.5, pool_dtype),
        state_indices=idx,
    )


# ----------------------------------------------------------------------------- Gated DeltaNet

def _gdn_tensors(rng, lead, H, HV, K, V, raw_gates, use_qk_l2norm, dtype, positions=None):
    """q, k, v and the gates; token ``positions`` (gate_pattern
    "strong_then_weak") replace the realistic a by the pattern's."""
    if H < 1 or HV % H:
        raise ValueError(f"HV must be a multiple of H = {H}, got HV = {HV}")
    q = rng.standard_normal(lead + (H, K))
    k = rng.standard_normal(lead + (H, K))
    if not use_qk_l2norm:
        # the kernel gets already-normalised q/k (the model normalises upstream)
        q, k = l2norm(q), l2norm(k)
    A_log = np.log(rng.uniform(1.0, 16.0, size=HV))
    dt_bias = rng.uniform(0.0, 2.0, size=HV)
    a = rng.standard_normal(lead + (HV,))
    b = rng.standard_normal(lead + (HV,))
    out = dict(q=_cast(q, dtype), k=_cast(k, dtype),
               v=_cast(rng.standard_normal(lead + (HV, V)), dtype),
               use_qk_l2norm=bool(use_qk_l2norm), scale=None)
    if positions is not None:
        strong = strong_decay_tokens(positions)[..., None]
        pre = np.where(strong, rng.uniform(2.0, 5.0, size=lead + (HV,)),
                       rng.uniform(-8.0, -6.0, size=lead + (HV,)))
        a = pre - dt_bias
    if raw_gates:
        out.update(g=None, beta=None, a=_cast(a, dtype), b=_cast(b, dtype),
                   A_log=_f32(A_log), dt_bias=_f32(dt_bias))
    else:
        g = -np.exp(A_log) * softplus(a + dt_bias)
        # g and beta stay float32 (as in the models: gates are computed in fp32)
        out.update(g=_f32(g), beta=_cast(sigmoid(b), dtype), a=None, b=None,
                   A_log=None, dt_bias=None)
    return out


def make_gated_delta_inputs(rng: np.random.Generator, *, seqlens, H: int, HV: int, K: int,
                            V: int, raw_gates: bool = False, use_qk_l2norm: bool = False,
                            slots: int | None = None, dtype=np.float32,
                            pool_dtype=np.float32, padding: int = 0,
                            has_initial_state="mixed", gate_pattern: str = "realistic") -> dict:
    """Prefill inputs: q, k `[num_tokens, H, K]`, v `[num_tokens, HV, V]`, either
    g, beta `[num_tokens, HV]` (raw_gates False) or a, b `[num_tokens, HV]` with
    A_log, dt_bias `[HV]` (raw_gates True; the unused ones are None), scale None,
    use_qk_l2norm, cu_seqlens, ssm_states `[slots, HV, K, V]`, state_indices,
    has_initial_state. `gate_pattern`: "realistic" or "strong_then_weak"
    (module docstring)."""
    _check_pattern(gate_pattern)
    lengths = _lengths(seqlens)
    cu = cu_seqlens_from_lengths(lengths)
    slots, idx, init = make_slots(rng, len(lengths), slots, padding=padding,
                                  has_initial_state=has_initial_state)
    out = _gdn_tensors(rng, (int(cu[-1]),), H, HV, K, V, raw_gates, use_qk_l2norm, dtype,
                       None if gate_pattern == "realistic" else _positions(cu))
    out.update(cu_seqlens=cu,
               ssm_states=_pool(rng, (slots, HV, K, V), 0.1, pool_dtype),
               state_indices=idx, has_initial_state=init)
    return out


def make_gated_delta_decode_inputs(rng: np.random.Generator, *, num_seqs: int, T: int = 1,
                                   H: int, HV: int, K: int, V: int, raw_gates: bool = False,
                                   use_qk_l2norm: bool = False, slots: int | None = None,
                                   dtype=np.float32, pool_dtype=np.float32,
                                   padding: int = 0, gate_pattern: str = "realistic") -> dict:
    """Decode inputs: q, k `[num_seqs, T, H, K]`, v `[num_seqs, T, HV, V]`, gates
    `[num_seqs, T, HV]` (as make_gated_delta_inputs; token t of each sequence is
    at position t of `gate_pattern`), ssm_states `[slots, HV, K, V]`, state_indices."""
    _check_pattern(gate_pattern)
    slots, idx, _ = make_slots(rng, num_seqs, slots, padding=padding)
    out = _gdn_tensors(rng, (num_seqs, T), H, HV, K, V, raw_gates, use_qk_l2norm, dtype,
                       None if gate_pattern == "realistic" else _decode_positions((num_seqs, T)))
    out.update(ssm_states=_pool(rng, (slots, HV, K, V), 0.1, pool_dtype),
               state_indices=idx)
    return out
