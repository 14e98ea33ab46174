"""Host API for training: functional prefill forwards (initial states in, output and final
states out, no pool) and the validation the backward ops share with them.

    short_conv_forward(x, weight, bias=None, *, activation="silu", cu_seqlens,
                       initial_states=None, backend=None) -> (y, final_states)
    ssd_forward(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                dt_limit=(0.0, inf), cu_seqlens, initial_states=None, chunk_size=128,
                precision=None, backend=None) -> (y, final_states)
    gated_delta_forward(q, k, v, *, g/beta or a/b/A_log/dt_bias, scale=None,
                        use_qk_l2norm=False, cu_seqlens, initial_states=None,
                        chunk_size=None, backend=None) -> (o, final_states)

Each sequence i of the ragged batch starts from ``initial_states[i]`` (None: zeros)
and ``final_states[i]`` is its state after its last token: ``[num_seqs, dim, W-1]``
(conv), ``[num_seqs, H, P, N]`` (SSD), ``[num_seqs, HV, K, V]`` (GDN), float32 (as the
GPU peers return final states). They run the serving prefill ops
(``nki_ssm.ops.<family>_prefill``, same kernels, same checks and messages) on a
float32 scratch pool holding the initial states, one slot per sequence; the
caller's arrays are never written. ``precision`` (SSD) None follows x's dtype:
"fp32" TensorE operands for float32, "bf16" for bfloat16.

float64: on ``backend="reference"`` every float argument may also be float64 (the
reference computes in float64; ``torch.autograd.gradcheck`` needs it). Such arrays
are checked as float32 copies (same shape, dtype-sharing and value rules and
messages) and the output and final states come back in float64. Other backends
refuse float64 with the forwards' TypeError.
"""
from __future__ import annotations

import math

import numpy as np

from . import _dispatch
from . import _validate as v
from . import gated_delta as _gdn
from . import mamba2_ssd as _ssd
from . import short_conv as _conv

F64 = np.dtype(np.float64)


def _stand_in(value, kind: str):
    """float64 arrays on the reference backend are checked as float32 copies."""
    if kind == "reference" and isinstance(value, np.ndarray) and value.dtype == F64:
        return value.astype(np.float32)
    return value


def _num_seqs(cu_seqlens) -> int:
    """num_seqs as cu_seqlens states it if it looks like a batch (the validators judge it)."""
    if isinstance(cu_seqlens, np.ndarray) and cu_seqlens.ndim == 1 and cu_seqlens.shape[0] >= 2:
        return cu_seqlens.shape[0] - 1
    return 0


def _tail(shape_of) -> tuple:
    """The state's per-sequence shape from the argument shapes; (1,) * 3 while they are
    malformed (the validators reject those before they look at the pool)."""
    try:
        return tuple(int(d) for d in shape_of())
    except (AttributeError, IndexError, TypeError, ValueError):
        return (1, 1, 1)


def check_states(name: str, value, num_seqs: int, labels: tuple, tail: tuple, kind: str):
    """None, or a float array ``[num_seqs, *tail]`` (float64 too on the reference backend)."""
    if value is None:
        return None
    v.require_float(name, _stand_in(value, kind))
    v.require_shape(name, value, labels, (num_seqs, *tail))
    return value


class Call:
    """A validated functional call: ``kw`` (the prefill op's normalised arguments, the
    caller's arrays in them), the family, the state shape and the resolved backend."""

    def __init__(self, family, kw: dict, pool_name: str, state_labels: tuple, tail: tuple,
                 kind: str, initial_states):
        self.family, self.kw, self.pool_name = family, kw, pool_name
        self.state_labels, self.tail, self.kind = state_labels, tail, kind
        self.initial_states = initial_states
        self.num_seqs = kw["cu_seqlens"].shape[0] - 1
        self.float64 = any(isinstance(a, np.ndarray) and a.dtype == F64 for a in kw.values())

    def states(self, name: str, value):
        return check_states(name, value, self.num_seqs, self.state_labels, self.tail, self.kind)

    def pool(self) -> np.ndarray:
        """Scratch pool ``[num_seqs, *tail]`` holding the initial states (float64 or float32)."""
        dtype = F64 if self.float64 else np.float32
        if self.initial_states is None:
            return np.zeros((self.num_seqs, *self.tail), dtype)
        return np.array(self.initial_states, dtype=dtype, copy=True)


def validate(family, arrays: dict, options: dict, *, backend, pool_name: str,
             state_labels: tuple, shape_of, initial_states, validate_prefill=None) -> Call:
    """Run ``family.validate_prefill`` (or ``validate_prefill``, all keywords) on the call
    (float64 stand-ins on the reference backend, a scratch pool of ``num_seqs`` slots)
    and check ``initial_states``."""
    kind = _dispatch.resolve(backend)
    n = _num_seqs(options.get("cu_seqlens"))
    tail = _tail(shape_of)
    checked = {k: _stand_in(a, kind) for k, a in arrays.items()}
    kw = (validate_prefill or family.validate_prefill)(
        **checked, **options, **{pool_name: np.zeros((n, *tail), np.float32)},
        state_indices=np.arange(n, dtype=np.int32), has_initial_state=np.ones(n, bool))
    # the float32 stand-ins hide a float64 array streamed beside float32 ones: the same rule
    # as on every other backend, on the caller's dtypes
    v.require_one_dtype({k: arrays.get(k) for k in family.STREAMED})
    for k, a in arrays.items():      # the caller's arrays (float64 kept) from here on
        if a is not None and k in kw:
            kw[k] = a
    check_states("initial_states", initial_states, n, state_labels, tail, kind)
    return Call(family, kw, pool_name, state_labels, tail, kind, initial_states)


def run_forward(call: Call, prefill, op_args: dict):
    """The prefill op on a scratch pool -> (output, final_states)."""
    pool = call.pool()
    if call.float64:      # reference backend only (validate refused it elsewhere)
        out, new = call.family._reference_prefill(**{**call.kw, call.pool_name: pool})
        return out, np.asarray(new[call.pool_name], dtype=F64)
    n = call.num_seqs
    out = prefill(**op_args, cu_seqlens=call.kw["cu_seqlens"], **{call.pool_name: pool},
                  state_indices=np.arange(n, dtype=np.int32), has_initial_state=np.ones(n, bool),
                  backend=call.kind)
    return out, pool


# ------------------------------------------------------------------ short conv

def validate_short_conv(x, weight, bias, *, activation, cu_seqlens, initial_states,
                        backend) -> Call:
    return validate(_conv, dict(x=x, weight=weight, bias=bias),
                    dict(activation=activation, cu_seqlens=cu_seqlens), backend=backend,
                    pool_name="conv_states", state_labels=("num_seqs", "dim", "W-1"),
                    shape_of=lambda: (x.shape[1], weight.shape[1] - 1),
                    initial_states=initial_states)


def short_conv_forward(x, weight, bias=None, *, activation="silu", cu_seqlens,
                       initial_states=None, backend=None):
    """Causal depthwise conv over a ragged batch from initial states.

    x ``[num_tokens, dim]``, weight ``[dim, W]``, bias ``[dim]``, initial_states
    ``[num_seqs, dim, W-1]`` (the last W-1 inputs before each sequence, oldest first)
    or None. -> (y ``[num_tokens, dim]`` in x's dtype, final_states ``[num_seqs, dim,
    W-1]`` float32; float64 for float64 inputs on the reference backend)."""
    call = validate_short_conv(x, weight, bias, activation=activation, cu_seqlens=cu_seqlens,
                               initial_states=initial_states, backend=backend)
    return run_forward(call, _conv.short_conv_prefill,
                       dict(x=x, weight=weight, bias=bias, activation=activation))


# ------------------------------------------------------------------ Mamba-2 SSD

def ssd_precision(x, precision):
    """None -> "fp32" for float32 / float64 x, "bf16" for bfloat16 x."""
    if precision is None:
        return "bf16" if isinstance(x, np.ndarray) and x.dtype == v.FLOAT_DTYPES[1] else "fp32"
    return precision


def validate_ssd(x, dt, A, B, C, *, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens,
                 initial_states, chunk_size, precision, backend) -> Call:
    return validate(_ssd, dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias),
                    dict(dt_softplus=dt_softplus, dt_limit=dt_limit, cu_seqlens=cu_seqlens,
                         chunk_size=chunk_size, precision=ssd_precision(x, precision)),
                    backend=backend, pool_name="ssm_states",
                    state_labels=("num_seqs", "H", "P", "N"),
                    shape_of=lambda: (x.shape[1], x.shape[2], B.shape[-1]),
                    initial_states=initial_states)


def ssd_forward(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                dt_limit=(0.0, math.inf), cu_seqlens, initial_states=None, chunk_size=128,
                precision=None, backend=None):
    """Chunked SSD over a ragged batch from initial states.

    Arguments as ``nki_ssm.ops.ssd_prefill`` with ``initial_states [num_seqs, H, P, N]``
    (or None) in place of the pool. -> (y ``[num_tokens, H, P]`` in x's dtype,
    final_states ``[num_seqs, H, P, N]`` float32; float64 for float64 inputs on the
    reference backend)."""
    precision = ssd_precision(x, precision)
    call = validate_ssd(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                        dt_limit=dt_limit, cu_seqlens=cu_seqlens, initial_states=initial_states,
                        chunk_size=chunk_size, precision=precision, backend=backend)
    return run_forward(call, _ssd.ssd_prefill,
                       dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                            dt_softplus=dt_softplus, dt_limit=dt_limit, chunk_size=chunk_size,
                            precision=precision))


# ------------------------------------------------------------------ Gated DeltaNet

def validate_gated_delta(q, k, v_, *, gates: dict, scale, use_qk_l2norm, cu_seqlens,
                         initial_states, chunk_size, backend) -> Call:
    def validate_prefill(q, k, v, g, beta, a, b, A_log, dt_bias, **options):
        return _gdn.validate_prefill(q, k, v, gates=dict(g=g, beta=beta, a=a, b=b, A_log=A_log,
                                                         dt_bias=dt_bias), **options)

    return validate(_gdn, dict(q=q, k=k, v=v_, **gates),
                    dict(scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens,
                         chunk_size=chunk_size), backend=backend, pool_name="ssm_states",
                    state_labels=("num_seqs", "HV", "K", "V"),
                    shape_of=lambda: (v_.shape[1], q.shape[2], v_.shape[2]),
                    initial_states=initial_states, validate_prefill=validate_prefill)


def gated_delta_forward(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None,
                        dt_bias=None, scale=None, use_qk_l2norm=False, cu_seqlens,
                        initial_states=None, chunk_size=None, backend=None):
    """Chunked gated delta rule over a ragged batch from initial states.

    Arguments as ``nki_ssm.ops.gated_delta_prefill`` with ``initial_states [num_seqs,
    HV, K, V]`` (or None) in place of the pool. -> (o ``[num_tokens, HV, V]`` in q's
    dtype, final_states ``[num_seqs, HV, K, V]`` float32; float64 for float64 inputs
    on the reference backend)."""
    gates = dict(g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    call = validate_gated_delta(q, k, v, gates=gates, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                cu_seqlens=cu_seqlens, initial_states=initial_states,
                                chunk_size=chunk_size, backend=backend)
    return run_forward(call, _gdn.gated_delta_prefill,
                       dict(q=q, k=k, v=v, **gates, scale=scale, use_qk_l2norm=use_qk_l2norm,
                            chunk_size=chunk_size))
