"""Host API for the Gated DeltaNet layer (chunked prefill and recurrent decode).

Math (docs/contracts.md): ``S <- exp(g) S; u = beta (v - S^T k);
S <- S + k u^T; o = S^T (scale q)``, with gates given either as ``g`` (log
decay) and ``beta``, or raw as ``a, b, A_log, dt_bias`` (``g = -exp(A_log) *
softplus(a + dt_bias)``, ``beta = sigmoid(b)``) — exactly one of the two
sets. Value head hv reads q/k head ``hv // (HV // H)``. State pool
``ssm_states [slots, HV, K, V]``.

dtype rule: q, k and v must share one dtype (float32 or bfloat16), which is
also the output dtype; gate arrays may each be float32 or bfloat16.
Intermediate states (decode, ``return_intermediate_states=True``) are
returned in the pool dtype.
"""
from __future__ import annotations

import numpy as np

from . import _dispatch
from . import _validate as v
from .launch import gated_delta as launch

_DIRECT = ("g", "beta")
_RAW = ("a", "b", "A_log", "dt_bias")
# Kernel limits (nki_ssm/kernels/gated_delta/*.py docstrings): K and V sit on
# the 128 partitions in both kernels, and so do the value heads of decode's
# per-token [V, HV] gate tiles.
MAX_K = MAX_V = MAX_HV = 128
# activations the kernels stream together: one dtype (float32 or bfloat16)
STREAMED = ("q", "k", "v")


def _check_gates(gates: dict, lead: tuple, lead_shape: tuple, HV: int) -> dict:
    """Exactly one gate set, each array shaped ``[*lead, HV]`` or ``[HV]``."""
    given = [n for n in (*_DIRECT, *_RAW) if gates[n] is not None]
    direct = [n for n in _DIRECT if gates[n] is not None]
    raw = [n for n in _RAW if gates[n] is not None]
    if direct and raw:
        raise ValueError("gates: pass either g and beta, or a, b, A_log and dt_bias, not both; "
                         f"got {', '.join(given)}")
    if not given:
        raise ValueError("gates: pass either g and beta, or a, b, A_log and dt_bias; got none")
    chosen = _DIRECT if direct else _RAW
    missing = [n for n in chosen if gates[n] is None]
    if missing:
        raise ValueError(f"{missing[0]} is required when {', '.join(direct or raw)} "
                         f"{'is' if len(given) == 1 else 'are'} given "
                         f"(gate set: {', '.join(chosen)})")
    out = {n: None for n in (*_DIRECT, *_RAW)}
    for n in chosen:
        per_head = n in ("A_log", "dt_bias")
        labels, shape = (("HV",), (HV,)) if per_head else ((*lead, "HV"), (*lead_shape, HV))
        out[n] = v.optional_float(n, gates[n], labels, shape)
    return out


def _check_gdn(q, k, v_, gates, scale, use_qk_l2norm, ssm_states, lead: tuple) -> dict:
    """Checks shared by prefill and decode; ``lead`` names q's leading dims."""
    q = v.require_float("q", q)
    qk_labels = (*lead, "H", "K")
    v.require_ndim("q", q, qk_labels)
    v.require_positive_dims("q", q, qk_labels, start=len(lead) if lead[0] == "num_tokens" else 0)
    lead_shape = q.shape[: len(lead)]
    H, K = q.shape[len(lead):]
    k = v.require_float("k", k)
    v.require_same_dtype("k", k, "q", q)
    v.require_shape("k", k, qk_labels, q.shape)
    v_ = v.require_float("v", v_)
    v.require_same_dtype("v", v_, "q", q)
    v_labels = (*lead, "HV", "V")
    v.require_ndim("v", v_, v_labels)
    v.require_shape("v", v_, v_labels, (*lead_shape, None, None))
    v.require_positive_dims("v", v_, v_labels, start=len(lead))
    HV, V = v_.shape[len(lead):]
    v.require_divides("H", H, "HV", HV, "q.shape[-2] and v.shape[-2]")
    for label, value, limit in (("K (q.shape[-1])", K, MAX_K), ("V (v.shape[-1])", V, MAX_V),
                                ("HV (v.shape[-2])", HV, MAX_HV)):
        v.require_at_most(label, value, limit, "gated delta kernels: partition dim")
    kw = dict(q=q, k=k, v=v_, **_check_gates(gates, lead, lead_shape, HV))
    kw["scale"] = v.check_scale(scale, K ** -0.5)
    kw["use_qk_l2norm"] = v.require_bool("use_qk_l2norm", use_qk_l2norm)
    kw["ssm_states"] = v.check_pool("ssm_states", ssm_states, ("slots", "HV", "K", "V"),
                                    (HV, K, V))
    return kw


def _check_gate_values(kw: dict, live: np.ndarray) -> None:
    """Log decays on the tokens of non-padding sequences: finite, <= 0 and
    >= ``LOG_DECAY_FLOOR``, given as g or computed from the raw gates.

    One rule for every backend: the chunked kernels decay by exp(min(c_i -
    c_j, 0)) of chunk sums of g, which is the recurrence only for g <= 0,
    and the float64 reference applies the same rule (padding exempt).
    ``live`` marks real tokens (``[num_tokens]`` or ``[num_seqs, T]``).
    """
    what = f"finite, <= 0 (a log decay) and >= {v.LOG_DECAY_FLOOR:.3g}"
    if kw["g"] is not None:
        g = kw["g"].astype(np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(g) & (g <= 0) & (g >= v.LOG_DECAY_FLOOR)
        v.require_on_live_tokens("g", ok, live, g, what)
        return
    a = kw["a"].astype(np.float64)
    pre = a + kw["dt_bias"].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        g = -np.exp(kw["A_log"].astype(np.float64)) * np.logaddexp(0.0, pre)
        ok = np.isfinite(g) & (g <= 0) & (g >= v.LOG_DECAY_FLOOR)
    v.require_on_live_tokens("g = -exp(A_log) * softplus(a + dt_bias)", ok, live, g, what,
                             element="g")


def _check_beta_values(kw: dict, live: np.ndarray) -> None:
    """beta (or sigmoid(b)) finite on the tokens of non-padding sequences (prefill).

    The prefill kernel solves 4 value heads in one block-diagonal matmul, so a
    NaN in one head's beta would become 0 * NaN = NaN in the other three heads
    of the group, while the reference keeps it in its head: rejected on every
    backend instead (b = +-inf gives a finite sigmoid and passes).
    """
    what = "finite (beta = sigmoid(b) when raw gates are given)"
    if kw["beta"] is not None:
        beta = kw["beta"].astype(np.float64)
        v.require_on_live_tokens("beta", np.isfinite(beta), live, beta, what)
        return
    b = kw["b"].astype(np.float64)
    v.require_on_live_tokens("b", ~np.isnan(b), live, b, "not NaN (beta = sigmoid(b))")


def validate_prefill(q, k, v_, *, gates: dict, scale, use_qk_l2norm, cu_seqlens, ssm_states,
                     state_indices, has_initial_state, chunk_size) -> dict:
    """All pre-launch checks of gated_delta_prefill -> normalised kwargs."""
    kw = _check_gdn(q, k, v_, gates, scale, use_qk_l2norm, ssm_states, ("num_tokens",))
    kw.update(v.check_ragged_batch(cu_seqlens, state_indices, has_initial_state,
                                   num_tokens=kw["q"].shape[0], tokens_source="q.shape[0]",
                                   pool=kw["ssm_states"], pool_name="ssm_states"))
    # None: the kernel's default chunk for the layer shape (ops.launch.gated_delta)
    kw["chunk_size"] = None if chunk_size is None else v.check_chunk_size(chunk_size)
    live = v.live_tokens(kw["cu_seqlens"], kw["state_indices"])
    _check_gate_values(kw, live)
    _check_beta_values(kw, live)
    return kw


def validate_decode(q, k, v_, *, gates: dict, scale, use_qk_l2norm, ssm_states, state_indices,
                    return_intermediate_states) -> dict:
    """All pre-launch checks of gated_delta_decode -> normalised kwargs."""
    kw = _check_gdn(q, k, v_, gates, scale, use_qk_l2norm, ssm_states, ("num_seqs", "T"))
    num_seqs = v.check_num_seqs("q", kw["q"])
    kw["state_indices"] = v.check_state_indices(state_indices, num_seqs,
                                                kw["ssm_states"].shape[0], "ssm_states")
    kw["return_intermediate_states"] = v.require_bool("return_intermediate_states",
                                                      return_intermediate_states)
    _check_gate_values(kw, kw["state_indices"] >= 0)
    return kw


def _reference_prefill(**kw):
    from nki_ssm.reference.gated_delta import gated_delta_chunked as ref

    args = {n: kw[n] for n in kw if n not in ("q", "k", "v")}
    if args["chunk_size"] is None:
        args["chunk_size"] = 64     # the chunked form is exact for any chunk size
    o, new_states = ref(kw["q"], kw["k"], kw["v"], **args)
    return _dispatch.cast_rne(o, kw["q"].dtype), {"ssm_states": new_states}


def _reference_decode(**kw):
    from nki_ssm.reference.gated_delta import gated_delta_decode as ref

    args = {n: kw[n] for n in kw if n not in ("q", "k", "v")}
    result = ref(kw["q"], kw["k"], kw["v"], **args)
    o = _dispatch.cast_rne(result[0], kw["q"].dtype)
    if kw["return_intermediate_states"]:
        inter = _dispatch.cast_rne(result[2], kw["ssm_states"].dtype)
        return (o, inter), {"ssm_states": result[1]}
    return o, {"ssm_states": result[1]}


def gated_delta_prefill(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None,
                        dt_bias=None, scale=None, use_qk_l2norm=False, cu_seqlens, ssm_states,
                        state_indices, has_initial_state, chunk_size=None, backend=None):
    """Chunked gated delta rule over a ragged batch; updates ``ssm_states`` in place.

    q, k ``[num_tokens, H, K]``, v ``[num_tokens, HV, V]`` (H | HV); g, beta
    or a, b ``[num_tokens, HV]``; A_log, dt_bias ``[HV]``; scale None
    (K**-0.5) or finite > 0; cu_seqlens ``[num_seqs + 1]``; ssm_states
    ``[slots, HV, K, V]``; state_indices, has_initial_state ``[num_seqs]``;
    chunk_size a multiple of 16 in 16..128 or None (the kernel's default for the
    layer shape). Returns o ``[num_tokens, HV, V]``
    in q's dtype.
    """
    gates = dict(g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    kw = validate_prefill(q, k, v, gates=gates, scale=scale, use_qk_l2norm=use_qk_l2norm,
                          cu_seqlens=cu_seqlens, ssm_states=ssm_states,
                          state_indices=state_indices, has_initial_state=has_initial_state,
                          chunk_size=chunk_size)
    return _dispatch.run(launch.prefill, kw, pools=("ssm_states",),
                         reference=_reference_prefill, backend=backend)


def gated_delta_decode(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None,
                       dt_bias=None, scale=None, use_qk_l2norm=False, ssm_states,
                       state_indices, return_intermediate_states=False, backend=None):
    """Recurrent update for T tokens per sequence (T > 1: speculative decoding).

    q, k ``[num_seqs, T, H, K]``, v ``[num_seqs, T, HV, V]``; gates
    ``[num_seqs, T, HV]`` (A_log, dt_bias ``[HV]``). Returns o
    ``[num_seqs, T, HV, V]`` in q's dtype, or ``(o, intermediate)`` with
    intermediate ``[num_seqs, T, HV, K, V]`` (state after each token, pool
    dtype) when return_intermediate_states.
    """
    gates = dict(g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    kw = validate_decode(q, k, v, gates=gates, scale=scale, use_qk_l2norm=use_qk_l2norm,
                         ssm_states=ssm_states, state_indices=state_indices,
                         return_intermediate_states=return_intermediate_states)
    return _dispatch.run(launch.decode, kw, pools=("ssm_states",),
                         reference=_reference_decode, backend=backend)
