"""Host API for the Mamba-2 SSD layer (chunked prefill and selective state update).

Math (docs/contracts.md): ``dt' = clip(softplus(dt + dt_bias) if dt_softplus
else dt + dt_bias, *dt_limit)``; ``h = exp(dt' A) h + dt' x B^T``;
``y = C h + D x``; ``y *= silu(z)`` when z is given. Head h uses group
``h // (H // G)``. State pool ``ssm_states [slots, H, P, N]``.

dtype rule: x, B, C and z are streamed together and must share one dtype
(float32 or bfloat16), which is also the output dtype; dt, A, D, dt_bias
may each be float32 or bfloat16.
"""
from __future__ import annotations

import math

import numpy as np

from . import _dispatch
from . import _validate as v
from .launch import mamba2_ssd as launch

# TensorE operand precision of the kernel's matmuls; the reference backend
# computes in float64 whatever is asked.
PRECISIONS = ("bf16", "fp32")
# Kernel limits (nki_ssm/kernels/mamba2_ssd/*.py docstrings): decode moves
# [B | C] (2N columns) through one fp32 PSUM bank of 512; prefill keeps a
# head's P output columns in one bank and dstate in at most two 128-partition
# tiles (the backward accumulates dC | dB, 2N columns, in one bank).
MAX_DECODE_N = 256
MAX_PREFILL_N = 256
MAX_PREFILL_P = 512
# activations the kernels stream together: one dtype (float32 or bfloat16)
STREAMED = ("x", "B", "C", "z")


def _dt_prime(kw: dict) -> np.ndarray:
    """dt' = clip(softplus(dt + dt_bias) if dt_softplus else dt + dt_bias, *dt_limit), float64."""
    d = kw["dt"].astype(np.float64)
    if kw["dt_bias"] is not None:
        d = d + kw["dt_bias"].astype(np.float64)
    if kw["dt_softplus"]:
        d = np.logaddexp(0.0, d)
    return np.clip(d, *kw["dt_limit"])


def _check_decay_values(kw: dict, live: np.ndarray, *, decaying: bool) -> None:
    """A finite and <= 0; on the tokens of non-padding sequences dt' finite,
    with dt' * A >= ``LOG_DECAY_FLOOR``, and (``decaying``, prefill) dt' >= 0.

    One rule for every backend: the prefill kernel builds decays from chunk
    sums of dt' A and weights inputs by ln dt', which is the recurrence only
    for decaying states. Decode steps the recurrence directly, so a negative
    dt' (which mamba_ssm's selective_state_update accepts) is valid there.
    ``live`` marks real tokens (dt's leading dims).
    """
    A = kw["A"].astype(np.float64)
    bad = ~(np.isfinite(A) & (A <= 0))
    if bad.any():
        h = int(np.argmax(bad))
        raise ValueError(f"A must be finite and <= 0 (A = -exp(A_log)), got A[{h}] = {float(A[h])!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        dtp = _dt_prime(kw)
        ok = np.isfinite(dtp) & (dtp * A >= v.LOG_DECAY_FLOOR)
        if decaying:
            ok &= dtp >= 0
    v.require_on_live_tokens(
        "dt' = clip(softplus(dt + dt_bias) or dt + dt_bias, *dt_limit)", ok, live, dtp,
        f"finite{' and >= 0' if decaying else ''} with dt' * A >= {v.LOG_DECAY_FLOOR:.3g}",
        element="dt'")


def _check_ssd(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states,
               lead: tuple) -> dict:
    """Checks shared by prefill and decode; ``lead`` names x's leading dims."""
    x_labels = (*lead, "H", "P")
    v.require_positive_dims("x", x, x_labels, start=len(lead))
    lead_shape = x.shape[: len(lead)]
    H, P = x.shape[len(lead):]

    dt = v.require_float("dt", dt)
    v.require_shape("dt", dt, (*lead, "H"), (*lead_shape, H))
    A = v.require_float("A", A)
    v.require_shape("A", A, ("H",), (H,))

    B = v.require_float("B", B)
    v.require_same_dtype("B", B, "x", x)
    v.require_ndim("B", B, (*lead, "G", "N"))
    v.require_shape("B", B, (*lead, "G", "N"), (*lead_shape, None, None))
    v.require_positive_dims("B", B, (*lead, "G", "N"), start=len(lead))
    G, N = B.shape[len(lead):]
    v.require_divides("G", G, "H", H, "B.shape[-2] and x.shape[-2]")
    C = v.require_float("C", C)
    v.require_same_dtype("C", C, "x", x)
    v.require_shape("C", C, (*lead, "G", "N"), (*lead_shape, G, N))

    if D is not None:
        D = v.require_float("D", D)
        if D.shape not in ((H,), (H, P)):
            raise ValueError(f"D must have shape [H] = [{H}] or [H, P] = [{H}, {P}], "
                             f"got {tuple(D.shape)}")
    z = v.optional_float("z", z, x_labels, x.shape)
    if z is not None:
        v.require_same_dtype("z", z, "x", x)
    dt_bias = v.optional_float("dt_bias", dt_bias, ("H",), (H,))
    dt_softplus = v.require_bool("dt_softplus", dt_softplus)
    dt_limit = v.check_dt_limit(dt_limit)
    ssm_states = v.check_pool("ssm_states", ssm_states, ("slots", "H", "P", "N"), (H, P, N))
    return dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                dt_softplus=dt_softplus, dt_limit=dt_limit, ssm_states=ssm_states)


def validate_prefill(x, dt, A, B, C, *, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens,
                     ssm_states, state_indices, has_initial_state, chunk_size,
                     precision) -> dict:
    """All pre-launch checks of ssd_prefill -> normalised kwargs."""
    x = v.require_float("x", x)
    v.require_ndim("x", x, ("num_tokens", "H", "P"))
    kw = _check_ssd(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states,
                    ("num_tokens",))
    kw.update(v.check_ragged_batch(cu_seqlens, state_indices, has_initial_state,
                                   num_tokens=x.shape[0], tokens_source="x.shape[0]",
                                   pool=kw["ssm_states"], pool_name="ssm_states"))
    kw["chunk_size"] = v.check_chunk_size(chunk_size)
    kw["precision"] = v.require_choice("precision", precision, PRECISIONS)
    v.require_at_most("P (x.shape[-1])", x.shape[-1], MAX_PREFILL_P,
                      "ssd_prefill kernel: a head's outputs fill one PSUM bank")
    v.require_at_most("N (B.shape[-1])", kw["B"].shape[-1], MAX_PREFILL_N,
                      "ssd_prefill kernels: dstate in at most two 128-partition tiles")
    _check_decay_values(kw, v.live_tokens(kw["cu_seqlens"], kw["state_indices"]), decaying=True)
    return kw


def validate_decode(x, dt, A, B, C, *, D, z, dt_bias, dt_softplus, dt_limit, ssm_states,
                    state_indices) -> dict:
    """All pre-launch checks of ssd_decode -> normalised kwargs.

    x is ``[num_seqs, H, P]`` (one token) or ``[num_seqs, T, H, P]``.
    """
    x = v.require_float("x", x)
    if x.ndim not in (3, 4):
        raise ValueError(f"x must have shape [num_seqs, H, P] or [num_seqs, T, H, P], "
                         f"got {x.ndim} dims {tuple(x.shape)}")
    lead = ("num_seqs",) if x.ndim == 3 else ("num_seqs", "T")
    num_seqs = v.check_num_seqs("x", x)
    if x.ndim == 4 and x.shape[1] < 1:
        raise ValueError(f"x.shape[1] (T) must be >= 1, got {x.shape[1]}")
    kw = _check_ssd(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states, lead)
    kw["state_indices"] = v.check_state_indices(state_indices, num_seqs,
                                                kw["ssm_states"].shape[0], "ssm_states")
    v.require_at_most("N (B.shape[-1])", kw["B"].shape[-1], MAX_DECODE_N,
                      "ssd_decode kernel: B and C share one PSUM bank of 512 fp32 columns")
    _check_decay_values(kw, kw["state_indices"] >= 0, decaying=False)
    return kw


def _reference_prefill(**kw):
    from nki_ssm.reference.mamba2_ssd import ssd_chunked as ref

    args = {k: kw[k] for k in kw if k not in ("x", "dt", "A", "B", "C", "precision")}
    y, new_states = ref(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], **args)
    return _dispatch.cast_rne(y, kw["x"].dtype), {"ssm_states": new_states}


def _reference_decode(**kw):
    from nki_ssm.reference.mamba2_ssd import ssd_decode as ref

    args = {k: kw[k] for k in kw if k not in ("x", "dt", "A", "B", "C")}
    y, new_states = ref(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], **args)
    return _dispatch.cast_rne(y, kw["x"].dtype), {"ssm_states": new_states}


def ssd_prefill(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                dt_limit=(0.0, math.inf), cu_seqlens, ssm_states, state_indices,
                has_initial_state, chunk_size=128, precision="bf16", backend=None):
    """Chunked SSD over a ragged batch; updates ``ssm_states`` in place.

    x ``[num_tokens, H, P]``, dt ``[num_tokens, H]``, A ``[H]``, B and C
    ``[num_tokens, G, N]`` (G | H), D ``[H]`` or ``[H, P]``, z
    ``[num_tokens, H, P]``, dt_bias ``[H]``, cu_seqlens ``[num_seqs + 1]``,
    ssm_states ``[slots, H, P, N]``, state_indices and has_initial_state
    ``[num_seqs]``; chunk_size a multiple of 16 in 16..128; precision "bf16"
    or "fp32" (kernel matmul operands). Returns y ``[num_tokens, H, P]`` in
    x's dtype.

    Precision: the default "bf16" rounds the state-to-output matmul's
    operands (C, the float32 state) to bfloat16, so even float32 callers get
    y only within ~2e-3 of float64 (measured 1.6e-3..2.6e-3 relative
    Frobenius on the simulator, ``python3 docs/measure_numerics.py
    precision``; states stay ~1e-7); pass precision="fp32" for the 1e-5
    float32 target (~1e-7). Limits (every backend): P <= 512, N <= 256; A <= 0 and,
    on tokens of non-padding sequences, dt' finite and >= 0.
    """
    kw = validate_prefill(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                          dt_limit=dt_limit, cu_seqlens=cu_seqlens, ssm_states=ssm_states,
                          state_indices=state_indices, has_initial_state=has_initial_state,
                          chunk_size=chunk_size, precision=precision)
    return _dispatch.run(launch.prefill, kw, pools=("ssm_states",),
                         reference=_reference_prefill, backend=backend)


def ssd_decode(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
               dt_limit=(0.0, math.inf), ssm_states, state_indices, backend=None):
    """Selective state update for 1 or T tokens per sequence.

    x ``[num_seqs, H, P]`` or ``[num_seqs, T, H, P]``; dt ``[num_seqs, (T,) H]``;
    B, C ``[num_seqs, (T,) G, N]``; z like x; other arguments as in
    ssd_prefill. Returns y shaped like x, in x's dtype. Limits (every
    backend): N <= 256; A <= 0; dt' finite (negative dt' is valid in decode).
    """
    kw = validate_decode(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                         dt_limit=dt_limit, ssm_states=ssm_states, state_indices=state_indices)
    return _dispatch.run(launch.decode, kw, pools=("ssm_states",),
                         reference=_reference_decode, backend=backend)
