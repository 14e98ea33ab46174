"""Host API: gradients of the Mamba-2 SSD prefill (the training op's backward).

    ssd_backward(x, dt, A, B, C, dy, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                 dt_limit=(0.0, inf), cu_seqlens, initial_states=None, d_final_states=None,
                 chunk_size=128, precision=None, backend=None) -> dict

The gradients of ``nki_ssm.ops.ssd_forward``'s (y, final_states) given ``dy
[num_tokens, H, P]`` (x's dtype) and ``d_final_states [num_seqs, H, P, N]`` (None:
zeros): ``dx, ddt, dA, dB, dC`` and, for the optional inputs given, ``dD, dz,
ddt_bias`` (None for those not given), each in its input's dtype, and
``d_initial_states [num_seqs, H, P, N]`` (float32; float64 for float64 inputs) whether or
not initial states were passed. ddt is through dt_bias, softplus and dt_limit as the
forward applies them (the clip passes the gradient where lo <= dt' <= hi).

Every argument is checked as ``ssd_forward`` checks it (same messages; chunk_size and
precision are the forward's and are validated though the reference ignores them),
plus ``dy`` (x's shape and dtype) and ``d_final_states``. Backends: "reference"
(``nki_ssm/reference/mamba2_ssd_backward.py``, float64), "sim" and "neuron" (the NKI
kernel ``nki_ssm/kernels/mamba2_ssd/chunk_backward.py`` through
``nki_ssm/ops/launch/mamba2_ssd_backward.py``; float32 compute whatever the precision;
the forward's limits, N <= 256 and P <= 512, checked by the shared validation). dB and
dC are bit-identical at LNC=1 and LNC=2.
"""
from __future__ import annotations

import math

from . import _backward
from . import training
from .launch import mamba2_ssd_backward as _launch

GRAD_OF = dict(x="dx", dt="ddt", A="dA", B="dB", C="dC", D="dD", z="dz", dt_bias="ddt_bias")


def validate_backward(x, dt, A, B, C, dy, *, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens,
                      initial_states, d_final_states, chunk_size, precision, backend):
    """All pre-launch checks of ssd_backward (``ssd_forward``'s, plus dy and d_final_states)
    -> (the validated call, the backward launcher's keywords)."""
    call = training.validate_ssd(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                                 dt_softplus=dt_softplus, dt_limit=dt_limit,
                                 cu_seqlens=cu_seqlens, initial_states=initial_states,
                                 chunk_size=chunk_size, precision=precision, backend=backend)
    _backward.check_output_grad(call, "dy", dy, "x", x)
    call.states("d_final_states", d_final_states)
    kw = call.kw
    return call, dict({n: kw[n] for n in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias",
                                          "dt_softplus", "dt_limit", "cu_seqlens", "chunk_size")},
                      dy=dy, initial_states=initial_states, d_final_states=d_final_states)


def ssd_backward(x, dt, A, B, C, dy, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                 dt_limit=(0.0, math.inf), cu_seqlens, initial_states=None, d_final_states=None,
                 chunk_size=128, precision=None, backend=None) -> dict:
    """Gradients of the SSD prefill; see the module docstring for shapes and dtypes."""
    call, kw = validate_backward(x, dt, A, B, C, dy, D=D, z=z, dt_bias=dt_bias,
                                 dt_softplus=dt_softplus, dt_limit=dt_limit,
                                 cu_seqlens=cu_seqlens, initial_states=initial_states,
                                 d_final_states=d_final_states, chunk_size=chunk_size,
                                 precision=precision, backend=backend)
    if call.kind != "reference":
        return _backward.cast_grads(call, _launch.backward(**kw, backend=call.kind), GRAD_OF)
    from nki_ssm.reference.mamba2_ssd_backward import ssd_backward as ref

    grads = ref(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], dy, D=kw["D"], z=kw["z"],
                dt_bias=kw["dt_bias"], dt_softplus=kw["dt_softplus"], dt_limit=kw["dt_limit"],
                cu_seqlens=kw["cu_seqlens"], initial_states=initial_states,
                d_final_states=d_final_states)
    return _backward.cast_grads(call, grads, GRAD_OF)
