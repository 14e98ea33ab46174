"""Host API: gradients of the short causal depthwise conv1d (training form).

The forward this differentiates (``nki_ssm.reference.short_conv_backward``): per
sequence of the ragged batch, ``y[t] = act(bias + sum_k weight[:, k] * xx[t + k])`` over
``xx = (initial_states[n] ++ x)`` (zeros without initial states), final state = the
last W-1 entries of xx. No pool is read or written.
"""
from __future__ import annotations

from . import _backward
from . import _dispatch
from . import training
from .launch import short_conv_backward as launch


def _reference(**kw):
    from nki_ssm.reference.short_conv_backward import short_conv_backward as ref

    g = ref(kw["x"], kw["weight"], kw["bias"], kw["dy"], activation=kw["activation"],
            cu_seqlens=kw["cu_seqlens"], initial_states=kw["initial_states"],
            d_final_states=kw["d_final_states"])
    like = dict(dx="x", dweight="weight", dbias="bias", d_initial_states="initial_states")
    return {key: None if g[key] is None else _dispatch.cast_rne(g[key], kw[src].dtype)
            for key, src in like.items()}


def validate_backward(x, weight, bias, dy, *, activation, cu_seqlens, initial_states,
                      d_final_states, backend) -> dict:
    """All pre-launch checks of short_conv_backward -> normalised kwargs: the functional
    forward's checks and messages (``training.validate_short_conv``: float64 accepted on
    the reference backend) plus ``dy`` (x's shape and dtype) and ``d_final_states``."""
    call = training.validate_short_conv(x, weight, bias, activation=activation,
                                        cu_seqlens=cu_seqlens, initial_states=initial_states,
                                        backend=backend)
    _backward.check_output_grad(call, "dy", dy, "x", x)
    call.states("d_final_states", d_final_states)
    kw = call.kw
    return dict(x=kw["x"], weight=kw["weight"], bias=kw["bias"], dy=dy,
                activation=kw["activation"], cu_seqlens=kw["cu_seqlens"],
                initial_states=initial_states, d_final_states=d_final_states)


def short_conv_backward(x, weight, bias=None, dy=None, *, activation="silu", cu_seqlens,
                        initial_states=None, d_final_states=None, backend=None) -> dict:
    """Gradients of the functional short conv over a ragged batch.

    x, dy ``[num_tokens, dim]`` (same dtype), weight ``[dim, W]``, bias ``[dim]`` or None,
    cu_seqlens ``[num_seqs + 1]``, initial_states / d_final_states ``[num_seqs, dim, W-1]``
    or None (d_final_states: the gradient of the final states the forward returns).
    Returns dict(dx ``[num_tokens, dim]`` in x's dtype, dweight ``[dim, W]`` in weight's,
    dbias ``[dim]`` in bias's or None, d_initial_states ``[num_seqs, dim, W-1]`` in
    initial_states' or None). Backends "reference", "sim", "neuron" (None: the NKI one).
    """
    kw = validate_backward(x, weight, bias, dy, activation=activation, cu_seqlens=cu_seqlens,
                           initial_states=initial_states, d_final_states=d_final_states,
                           backend=backend)
    kind = _dispatch.resolve(backend)
    if kind == "reference":
        return _reference(**kw)
    return launch.backward(**{n: _contiguous(a) for n, a in kw.items()}, backend=kind)


def _contiguous(a):
    """Kernels address HBM tensors as dense row-major buffers."""
    import numpy as np

    return np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a
