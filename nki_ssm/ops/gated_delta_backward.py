"""Host API: gradients of the Gated DeltaNet prefill (the training op's backward).

    gated_delta_backward(q, k, v, do, *, g=None, beta=None, a=None, b=None, A_log=None,
                         dt_bias=None, scale=None, use_qk_l2norm=False, cu_seqlens,
                         initial_states=None, d_final_states=None, chunk_size=None,
                         backend=None) -> dict

The gradients of ``nki_ssm.ops.gated_delta_forward``'s (o, final_states) given ``do
[num_tokens, HV, V]`` (q's dtype) and ``d_final_states [num_seqs, HV, K, V]`` (None:
zeros): ``dq, dk, dv`` (through the fused q/k L2 norm and the scale), the gates'
gradients -- ``dg, dbeta`` when (g, beta) were given, ``da, db, dA_log, ddt_bias``
when the raw gates were (the others None) -- each in its input's dtype, and
``d_initial_states [num_seqs, HV, K, V]`` (float32; float64 for float64 inputs).

Every argument is checked as ``gated_delta_forward`` checks it (same messages), plus
``do`` (o's shape, q's dtype) and ``d_final_states``. Backends: "reference" (``nki_ssm/reference/gated_delta_backward.py``,
float64), "sim" and "neuron" (the NKI kernel ``nki_ssm/kernels/gated_delta/chunk_backward.py``
through ``nki_ssm.ops.launch.gated_delta_backward``; float32 accumulation).
"""
from __future__ import annotations

from . import _backward
from . import training

GRAD_OF = dict(q="dq", k="dk", v="dv", g="dg", beta="dbeta", a="da", b="db", A_log="dA_log",
               dt_bias="ddt_bias")


def validate_backward(q, k, v, do, *, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm,
                      cu_seqlens, initial_states, d_final_states, chunk_size, backend):
    """All pre-launch checks of gated_delta_backward (``gated_delta_forward``'s, plus do and
    d_final_states) -> (the validated call, the backward launcher's keywords)."""
    gates = dict(g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    call = training.validate_gated_delta(q, k, v, gates=gates, scale=scale,
                                         use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens,
                                         initial_states=initial_states, chunk_size=chunk_size,
                                         backend=backend)
    HV, V = v.shape[1:]
    _backward.check_output_grad(call, "do", do, "q", q, shape=(q.shape[0], HV, V),
                                labels=("num_tokens", "HV", "V"))
    call.states("d_final_states", d_final_states)
    kw = call.kw
    return call, dict({n: kw[n] for n in ("q", "k", "v", *gates, "scale", "use_qk_l2norm",
                                          "cu_seqlens")},
                      do=do, initial_states=initial_states, d_final_states=d_final_states,
                      chunk_size=kw.get("chunk_size"))


def gated_delta_backward(q, k, v, do, *, g=None, beta=None, a=None, b=None, A_log=None,
                         dt_bias=None, scale=None, use_qk_l2norm=False, cu_seqlens,
                         initial_states=None, d_final_states=None, chunk_size=None,
                         backend=None) -> dict:
    """Gradients of the gated delta rule prefill; see the module docstring."""
    call, kw = validate_backward(q, k, v, do, g=g, beta=beta, a=a, b=b, A_log=A_log,
                                 dt_bias=dt_bias, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                 cu_seqlens=cu_seqlens, initial_states=initial_states,
                                 d_final_states=d_final_states, chunk_size=chunk_size,
                                 backend=backend)
    if call.kind != "reference":
        from nki_ssm.ops.launch.gated_delta_backward import backward

        return _backward.cast_grads(call, backward(**kw, backend=call.kind), GRAD_OF)
    from nki_ssm.reference.gated_delta_backward import gated_delta_backward as ref

    gates = ("g", "beta", "a", "b", "A_log", "dt_bias")
    grads = ref(kw["q"], kw["k"], kw["v"], do, **{n: kw[n] for n in gates}, scale=kw["scale"],
                use_qk_l2norm=kw["use_qk_l2norm"], cu_seqlens=kw["cu_seqlens"],
                initial_states=initial_states, d_final_states=d_final_states)
    return _backward.cast_grads(call, grads, GRAD_OF)
