"""Host API for the short causal depthwise conv1d (prefill and decode).

``y[t, c] = act(bias[c] + sum_j weight[c, j] * x[t - (W-1) + j, c])`` per
sequence, where inputs before the sequence start come from the conv state
pool (``conv_states [slots, dim, W-1]``, the last W-1 inputs, oldest first)
when ``has_initial_state``, else zeros. ``activation`` is None or "silu".
"""
from __future__ import annotations


from . import _dispatch
from . import _validate as v
from .launch import short_conv as launch

ACTIVATIONS = (None, "silu")
# activations the kernels stream (the weights and the pool may have other dtypes)
STREAMED = ("x",)


def check_conv_weights(dim: int, weight, bias, activation):
    """weight [dim, W], bias [dim] or None, activation (the checks every conv entry shares)."""
    weight = v.require_float("weight", weight)
    v.require_ndim("weight", weight, ("dim", "W"))
    v.require_shape("weight", weight, ("dim", "W"), (dim, None))
    v.check_conv_width(weight.shape[1])
    bias = v.optional_float("bias", bias, ("dim",), (dim,))
    activation = v.require_choice("activation", activation, ACTIVATIONS)
    return weight, bias, activation


def _check_conv_params(dim: int, weight, bias, activation, conv_states):
    """weight [dim, W], bias [dim], activation, conv_states [slots, dim, W-1]."""
    weight, bias, activation = check_conv_weights(dim, weight, bias, activation)
    width = weight.shape[1]
    conv_states = v.check_pool(
        "conv_states", conv_states, ("slots", "dim", "W-1"), (dim, width - 1)
    )
    return weight, bias, activation, conv_states


def _reference_prefill(**kw):
    from nki_ssm.reference.short_conv import short_conv_prefill as ref

    x_dtype = kw["x"].dtype
    y, new_states = ref(
        kw["x"], kw["weight"], kw["bias"], activation=kw["activation"],
        cu_seqlens=kw["cu_seqlens"], conv_states=kw["conv_states"],
        state_indices=kw["state_indices"], has_initial_state=kw["has_initial_state"],
    )
    return _dispatch.cast_rne(y, x_dtype), {"conv_states": new_states}


def _reference_decode(**kw):
    from nki_ssm.reference.short_conv import short_conv_decode as ref

    x_dtype = kw["x"].dtype
    y, new_states = ref(
        kw["x"], kw["weight"], kw["bias"], activation=kw["activation"],
        conv_states=kw["conv_states"], state_indices=kw["state_indices"],
    )
    return _dispatch.cast_rne(y, x_dtype), {"conv_states": new_states}


def validate_prefill(x, weight, bias, *, activation, cu_seqlens, conv_states,
                     state_indices, has_initial_state) -> dict:
    """All pre-launch checks of short_conv_prefill -> normalised kwargs."""
    x = v.require_float("x", x)
    v.require_ndim("x", x, ("num_tokens", "dim"))
    v.require_positive_dims("x", x, ("num_tokens", "dim"), start=1)
    num_tokens, dim = x.shape
    weight, bias, activation, conv_states = _check_conv_params(
        dim, weight, bias, activation, conv_states
    )
    return dict(x=x, weight=weight, bias=bias, activation=activation, conv_states=conv_states,
                **v.check_ragged_batch(cu_seqlens, state_indices, has_initial_state,
                                       num_tokens=num_tokens, tokens_source="x.shape[0]",
                                       pool=conv_states, pool_name="conv_states"))


def validate_decode(x, weight, bias, *, activation, conv_states, state_indices) -> dict:
    """All pre-launch checks of short_conv_decode -> normalised kwargs."""
    x = v.require_float("x", x)
    if x.ndim not in (2, 3):
        raise ValueError(f"x must have shape [num_seqs, dim] or [num_seqs, T, dim], "
                         f"got {x.ndim} dims {tuple(x.shape)}")
    num_seqs = v.check_num_seqs("x", x)
    labels = ("num_seqs", "dim") if x.ndim == 2 else ("num_seqs", "T", "dim")
    v.require_positive_dims("x", x, labels, start=1)
    dim = x.shape[-1]
    weight, bias, activation, conv_states = _check_conv_params(
        dim, weight, bias, activation, conv_states
    )
    idx = v.check_state_indices(state_indices, num_seqs, conv_states.shape[0], "conv_states")
    return dict(x=x, weight=weight, bias=bias, activation=activation,
                conv_states=conv_states, state_indices=idx)


def short_conv_prefill(x, weight, bias=None, *, activation="silu", cu_seqlens, conv_states,
                       state_indices, has_initial_state, backend=None):
    """Causal depthwise conv1d over a ragged batch; updates ``conv_states`` in place.

    x ``[num_tokens, dim]``, weight ``[dim, W]`` (``weight[:, W-1]`` multiplies
    the current token), bias ``[dim]`` or None, cu_seqlens ``[num_seqs + 1]``,
    conv_states ``[slots, dim, W-1]``, state_indices ``[num_seqs]``,
    has_initial_state ``[num_seqs]``. Returns y ``[num_tokens, dim]`` in x's dtype.
    """
    kw = validate_prefill(x, weight, bias, activation=activation, cu_seqlens=cu_seqlens,
                          conv_states=conv_states, state_indices=state_indices,
                          has_initial_state=has_initial_state)
    return _dispatch.run(launch.prefill, kw, pools=("conv_states",),
                         reference=_reference_prefill, backend=backend)


def short_conv_decode(x, weight, bias=None, *, activation="silu", conv_states, state_indices,
                      backend=None):
    """Conv update for T new tokens per sequence (T > 1: speculative steps).

    x ``[num_seqs, T, dim]`` or ``[num_seqs, dim]`` (one token); other
    arguments as in short_conv_prefill; every named slot is a running state
    (decode has no has_initial_state). Returns y shaped like x, in x's dtype.
    """
    kw = validate_decode(x, weight, bias, activation=activation, conv_states=conv_states,
                         state_indices=state_indices)
    return _dispatch.run(launch.decode, kw, pools=("conv_states",),
                         reference=_reference_decode, backend=backend)
