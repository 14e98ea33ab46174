"""torch.library training ops: functional prefill forwards with autograd.

torch refuses an autograd formula on an op that mutates its arguments, and the
serving prefill ops (``nki_ssm.torch.ops``) write their state pools; so training
runs on these functional ops, which take each sequence's initial state and
return the output and the final states, writing nothing:

    torch.ops.nki_ssm.short_conv_train(x, weight, bias, activation, cu_seqlens,
                                       initial_states, backend) -> (y, final_states)
    torch.ops.nki_ssm.ssd_train(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit,
                                cu_seqlens, initial_states, chunk_size, precision,
                                backend) -> (y, final_states)
    torch.ops.nki_ssm.gated_delta_train(q, k, v, g, beta, a, b, A_log, dt_bias, scale,
                                        use_qk_l2norm, cu_seqlens, initial_states,
                                        chunk_size, backend) -> (o, final_states)

Shapes, dtypes and checks are those of ``nki_ssm.ops.short_conv_forward`` /
``ssd_forward`` / ``gated_delta_forward`` (final states ``[num_seqs, ...]``
float32; float64 tensors run on ``backend="reference"`` only, for
``torch.autograd.gradcheck``). The forward runs the serving prefill kernels on a
scratch pool (CPU tensors through the host API, Neuron tensors through
``nki_ssm.torch.neuron``).

Backward (``torch.library.register_autograd``): gradients of the output and of the
final states go to ``torch.ops.nki_ssm.<op>_backward`` (its own custom op with a fake
kernel, so the backward traces too), which calls ``nki_ssm.ops.short_conv_backward``,
``ssd_backward`` or ``gated_delta_backward``; the forward saves its inputs and the
backward recomputes the states. Gradients are returned for every floating tensor
input that was given: conv x, weight, bias, initial_states; SSD x, dt, A, B, C, D, z,
dt_bias, initial_states; GDN q, k, v and g, beta or a, b, A_log, dt_bias, and
initial_states. The backward host ops run the NKI backward kernels
(``nki_ssm/kernels/<family>/..._backward.py``) on "sim" / "neuron" and the float64
reference on "reference" (CPU tensors); on Neuron tensors the backward runs the same
kernels through ``nki_ssm.torch.neuron.<family>_backward`` (the host API's checks and
messages on stand-ins, then the backward launcher's ``backward_call`` with torch ops on
the device; activations never leave it).

The Python wrappers (``short_conv_train(...)`` etc.) take the host API's keywords
and defaults and run its checks on the arguments the schema would convert.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from nki_ssm import ops as _host
from nki_ssm.ops import _validate as _v
from nki_ssm.ops.mamba2_ssd import PRECISIONS
from nki_ssm.ops.short_conv import ACTIVATIONS

from ._convert import check_backend, from_numpy, to_numpy
from ._devices import check_devices
from .ops import _GATES, _chunk_size, _dt_limit, _on_neuron, _require_tensors, _scale

_NS = "nki_ssm"


def needs_grad(*tensors) -> bool:
    """True when autograd records and a tensor among ``tensors`` requires grad (the drop-ins
    then run the training ops)."""
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad
                                           for t in tensors)


def _state_dtype(t: Tensor) -> torch.dtype:
    """Final states are float32 (float64 for a float64 call)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _numpy_args(args: dict) -> dict:
    return {k: to_numpy(v.contiguous()) if isinstance(v, Tensor) else v for k, v in args.items()}


def _forward(host_fn, args: dict, lead: str, neuron_fn, pool_name: str, tail: tuple):
    """CPU: the host API's functional forward. Neuron: the serving prefill on a scratch
    pool holding the initial states (float32), one slot per sequence."""
    from . import neuron

    if not _on_neuron(args, lead):
        out, final = host_fn(**_numpy_args(args))
        return from_numpy(out), from_numpy(final)
    device = args[lead].device
    init = args.pop("initial_states")
    cu = args["cu_seqlens"]
    n = cu.shape[0] - 1
    pool = (torch.zeros((n, *tail), dtype=torch.float32, device=device) if init is None
            else init.to(torch.float32).clone().contiguous())
    out = getattr(neuron, neuron_fn)(
        **args, **{pool_name: pool}, state_indices=torch.arange(n, dtype=torch.int32, device=device),
        has_initial_state=torch.ones(n, dtype=torch.bool, device=device))
    return out, pool


def _backward(host_fn, args: dict, lead: str, order: dict) -> tuple:
    """The backward: the host API ``host_fn`` on CPU tensors, its device path (the function
    of ``nki_ssm.torch.neuron`` of the same name) on Neuron tensors -> the gradients of the
    inputs ``order`` names (input -> gradient key), an empty ``[0]`` tensor for inputs that
    were not given (a schema has a fixed number of outputs)."""
    from . import neuron

    if not _on_neuron(args, lead):
        grads, tensor = host_fn(**_numpy_args(args)), from_numpy
    else:
        grads, tensor = getattr(neuron, host_fn.__name__)(**args), (lambda g: g)
    x = args[lead]
    return tuple(x.new_empty((0,)) if args[name] is None
                 else tensor(grads[key]).to(args[name].dtype) for name, key in order.items())


def _fake_grads(inputs: dict, order: dict, lead: Tensor) -> tuple:
    """Fake backward outputs: each present input's shape and dtype, else ``[0]``."""
    return tuple(lead.new_empty((0,)) if inputs[name] is None
                 else torch.empty_like(inputs[name], memory_format=torch.contiguous_format)
                 for name in order)


def _grad_or_none(grad: Tensor, given) -> Optional[Tensor]:
    return None if given is None else grad


def _zeros_if_none(grad, like_shape, like: Tensor, dtype) -> Tensor:
    return torch.zeros(like_shape, dtype=dtype, device=like.device) if grad is None else grad


# ------------------------------------------------------------------ short conv

_CONV_GRADS = {"x": "dx", "weight": "dweight", "bias": "dbias",
               "initial_states": "d_initial_states"}


@torch.library.custom_op(f"{_NS}::short_conv_train", mutates_args=())
def _short_conv_train(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                      activation: Optional[str], cu_seqlens: Tensor,
                      initial_states: Optional[Tensor],
                      backend: Optional[str]) -> tuple[Tensor, Tensor]:
    args = dict(x=x, weight=weight, bias=bias, activation=activation, cu_seqlens=cu_seqlens,
                initial_states=initial_states, backend=backend)
    return _forward(_host.short_conv_forward, args, "x", "short_conv_prefill", "conv_states",
                    (x.shape[1], weight.shape[1] - 1))


@_short_conv_train.register_fake
def _(x, weight, bias, activation, cu_seqlens, initial_states, backend):
    check_devices(locals(), "x")
    return x.new_empty(x.shape), x.new_empty(
        (cu_seqlens.shape[0] - 1, x.shape[1], weight.shape[1] - 1), dtype=_state_dtype(x))


@torch.library.custom_op(f"{_NS}::short_conv_train_backward", mutates_args=())
def _short_conv_train_backward(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                               activation: Optional[str], cu_seqlens: Tensor,
                               initial_states: Optional[Tensor], dy: Tensor,
                               d_final_states: Tensor,
                               backend: Optional[str]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    args = dict(x=x, weight=weight, bias=bias, dy=dy, activation=activation,
                cu_seqlens=cu_seqlens, initial_states=initial_states,
                d_final_states=d_final_states, backend=backend)
    return _backward(_host.short_conv_backward, args, "x", _CONV_GRADS)


@_short_conv_train_backward.register_fake
def _(x, weight, bias, activation, cu_seqlens, initial_states, dy, d_final_states, backend):
    check_devices(locals(), "x")
    return _fake_grads(locals(), _CONV_GRADS, x)


def _conv_setup(ctx, inputs, output):
    x, weight, bias, activation, cu_seqlens, initial_states, backend = inputs
    ctx.save_for_backward(x, weight, bias, cu_seqlens, initial_states)
    ctx.activation, ctx.backend = activation, backend
    ctx.final_shape = output[1].shape


def _conv_backward(ctx, dy, d_final):
    x, weight, bias, cu_seqlens, initial_states = ctx.saved_tensors
    dy = _zeros_if_none(dy, x.shape, x, x.dtype)
    d_final = _zeros_if_none(d_final, ctx.final_shape, x, _state_dtype(x))
    dx, dweight, dbias, dinit = torch.ops.nki_ssm.short_conv_train_backward(
        x, weight, bias, ctx.activation, cu_seqlens, initial_states, dy.contiguous(),
        d_final.contiguous(), ctx.backend)
    return (dx, dweight, _grad_or_none(dbias, bias), None, None,
            _grad_or_none(dinit, initial_states), None)


torch.library.register_autograd(f"{_NS}::short_conv_train", _conv_backward,
                                setup_context=_conv_setup)


# ------------------------------------------------------------------ Mamba-2 SSD

_SSD_GRADS = {"x": "dx", "dt": "ddt", "A": "dA", "B": "dB", "C": "dC", "D": "dD", "z": "dz",
              "dt_bias": "ddt_bias", "initial_states": "d_initial_states"}


@torch.library.custom_op(f"{_NS}::ssd_train", mutates_args=())
def _ssd_train(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
               z: Optional[Tensor], dt_bias: Optional[Tensor], dt_softplus: bool,
               dt_limit: Sequence[float], cu_seqlens: Tensor, initial_states: Optional[Tensor],
               chunk_size: Optional[int], precision: Optional[str],
               backend: Optional[str]) -> tuple[Tensor, Tensor]:
    args = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                dt_limit=tuple(dt_limit), cu_seqlens=cu_seqlens, initial_states=initial_states,
                chunk_size=chunk_size, precision=precision, backend=backend)
    if _on_neuron(args, "x"):                        # the serving op's precision default
        args["precision"] = precision or ("fp32" if x.dtype == torch.float32 else "bf16")
    return _forward(_host.ssd_forward, args, "x", "ssd_prefill", "ssm_states",
                    (x.shape[1], x.shape[2], B.shape[-1]))


@_ssd_train.register_fake
def _(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens, initial_states,
      chunk_size, precision, backend):
    check_devices(locals(), "x")
    return x.new_empty(x.shape), x.new_empty(
        (cu_seqlens.shape[0] - 1, x.shape[1], x.shape[2], B.shape[-1]), dtype=_state_dtype(x))


@torch.library.custom_op(f"{_NS}::ssd_train_backward", mutates_args=())
def _ssd_train_backward(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                        D: Optional[Tensor], z: Optional[Tensor], dt_bias: Optional[Tensor],
                        dt_softplus: bool, dt_limit: Sequence[float], cu_seqlens: Tensor,
                        initial_states: Optional[Tensor], chunk_size: Optional[int],
                        precision: Optional[str], dy: Tensor, d_final_states: Tensor,
                        backend: Optional[str]) -> tuple[Tensor, Tensor, Tensor, Tensor,
                                                         Tensor, Tensor, Tensor, Tensor,
                                                         Tensor]:
    args = dict(x=x, dt=dt, A=A, B=B, C=C, dy=dy, D=D, z=z, dt_bias=dt_bias,
                dt_softplus=dt_softplus, dt_limit=tuple(dt_limit), cu_seqlens=cu_seqlens,
                initial_states=initial_states, d_final_states=d_final_states,
                chunk_size=chunk_size, precision=precision, backend=backend)
    return _backward(_host.ssd_backward, args, "x", _SSD_GRADS)


@_ssd_train_backward.register_fake
def _(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens, initial_states,
      chunk_size, precision, dy, d_final_states, backend):
    check_devices(locals(), "x")
    return _fake_grads(locals(), _SSD_GRADS, x)


def _ssd_setup(ctx, inputs, output):
    (x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens, initial_states,
     chunk_size, precision, backend) = inputs
    ctx.save_for_backward(x, dt, A, B, C, D, z, dt_bias, cu_seqlens, initial_states)
    ctx.options = (dt_softplus, list(dt_limit), chunk_size, precision, backend)
    ctx.final_shape = output[1].shape


def _ssd_backward(ctx, dy, d_final):
    x, dt, A, B, C, D, z, dt_bias, cu_seqlens, initial_states = ctx.saved_tensors
    dt_softplus, dt_limit, chunk_size, precision, backend = ctx.options
    dy = _zeros_if_none(dy, x.shape, x, x.dtype)
    d_final = _zeros_if_none(d_final, ctx.final_shape, x, _state_dtype(x))
    grads = torch.ops.nki_ssm.ssd_train_backward(
        x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens, initial_states,
        chunk_size, precision, dy.contiguous(), d_final.contiguous(), backend)
    dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinit = grads
    return (dx, ddt, dA, dB, dC, _grad_or_none(dD, D), _grad_or_none(dz, z),
            _grad_or_none(ddt_bias, dt_bias), None, None, None,
            _grad_or_none(dinit, initial_states), None, None, None)


torch.library.register_autograd(f"{_NS}::ssd_train", _ssd_backward, setup_context=_ssd_setup)


# ------------------------------------------------------------------ Gated DeltaNet

_GDN_GRADS = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "beta": "dbeta", "a": "da",
              "b": "db", "A_log": "dA_log", "dt_bias": "ddt_bias",
              "initial_states": "d_initial_states"}


@torch.library.custom_op(f"{_NS}::gated_delta_train", mutates_args=())
def _gated_delta_train(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor],
                       beta: Optional[Tensor], a: Optional[Tensor], b: Optional[Tensor],
                       A_log: Optional[Tensor], dt_bias: Optional[Tensor],
                       scale: Optional[float], use_qk_l2norm: bool, cu_seqlens: Tensor,
                       initial_states: Optional[Tensor], chunk_size: Optional[int],
                       backend: Optional[str]) -> tuple[Tensor, Tensor]:
    args = dict(q=q, k=k, v=v, g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens,
                initial_states=initial_states, chunk_size=chunk_size, backend=backend)
    return _forward(_host.gated_delta_forward, args, "q", "gated_delta_prefill", "ssm_states",
                    (v.shape[1], q.shape[2], v.shape[2]))


@_gated_delta_train.register_fake
def _(q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, cu_seqlens, initial_states,
      chunk_size, backend):
    check_devices(locals(), "q")
    return q.new_empty((q.shape[0], v.shape[1], v.shape[2])), q.new_empty(
        (cu_seqlens.shape[0] - 1, v.shape[1], q.shape[2], v.shape[2]), dtype=_state_dtype(q))


@torch.library.custom_op(f"{_NS}::gated_delta_train_backward", mutates_args=())
def _gated_delta_train_backward(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor],
                                beta: Optional[Tensor], a: Optional[Tensor],
                                b: Optional[Tensor], A_log: Optional[Tensor],
                                dt_bias: Optional[Tensor], scale: Optional[float],
                                use_qk_l2norm: bool, cu_seqlens: Tensor,
                                initial_states: Optional[Tensor], chunk_size: Optional[int],
                                do: Tensor, d_final_states: Tensor, backend: Optional[str]
                                ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                           Tensor, Tensor, Tensor, Tensor]:
    args = dict(q=q, k=k, v=v, do=do, g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens,
                initial_states=initial_states, d_final_states=d_final_states,
                chunk_size=chunk_size, backend=backend)
    return _backward(_host.gated_delta_backward, args, "q", _GDN_GRADS)


@_gated_delta_train_backward.register_fake
def _(q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, cu_seqlens, initial_states,
      chunk_size, do, d_final_states, backend):
    check_devices(locals(), "q")
    return _fake_grads(locals(), _GDN_GRADS, q)


def _gdn_setup(ctx, inputs, output):
    (q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, cu_seqlens, initial_states,
     chunk_size, backend) = inputs
    ctx.save_for_backward(q, k, v, g, beta, a, b, A_log, dt_bias, cu_seqlens, initial_states)
    ctx.options = (scale, use_qk_l2norm, chunk_size, backend)
    ctx.final_shape = output[1].shape


def _gdn_backward(ctx, do, d_final):
    q, k, v, g, beta, a, b, A_log, dt_bias, cu_seqlens, initial_states = ctx.saved_tensors
    scale, use_qk_l2norm, chunk_size, backend = ctx.options
    do = _zeros_if_none(do, (q.shape[0], v.shape[1], v.shape[2]), q, q.dtype)
    d_final = _zeros_if_none(d_final, ctx.final_shape, q, _state_dtype(q))
    grads = torch.ops.nki_ssm.gated_delta_train_backward(
        q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, cu_seqlens,
        initial_states, chunk_size, do.contiguous(), d_final.contiguous(), backend)
    dq, dk, dv, dg, dbeta, da, db, dA_log, ddt_bias, dinit = grads
    gates = [_grad_or_none(grad, given) for grad, given in
             zip((dg, dbeta, da, db, dA_log, ddt_bias), (g, beta, a, b, A_log, dt_bias))]
    return (dq, dk, dv, *gates, None, None, None, _grad_or_none(dinit, initial_states), None,
            None)


torch.library.register_autograd(f"{_NS}::gated_delta_train", _gdn_backward,
                                setup_context=_gdn_setup)


# ------------------------------------------------------------------ host-API-shaped wrappers

def short_conv_train(x, weight, bias=None, *, activation="silu", cu_seqlens,
                     initial_states=None, backend=None):
    """``nki_ssm.ops.short_conv_forward`` on tensors, differentiable -> (y, final_states)."""
    _require_tensors(dict(x=x, weight=weight, bias=bias, cu_seqlens=cu_seqlens,
                          initial_states=initial_states), optional=("bias", "initial_states"))
    return torch.ops.nki_ssm.short_conv_train(
        x, weight, bias, _v.require_choice("activation", activation, ACTIVATIONS), cu_seqlens,
        initial_states, check_backend(backend))


def ssd_train(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
              dt_limit=(0.0, math.inf), cu_seqlens, initial_states=None, chunk_size=128,
              precision=None, backend=None):
    """``nki_ssm.ops.ssd_forward`` on tensors, differentiable -> (y, final_states)."""
    _require_tensors(dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                          cu_seqlens=cu_seqlens, initial_states=initial_states),
                     optional=("D", "z", "dt_bias", "initial_states"))
    return torch.ops.nki_ssm.ssd_train(
        x, dt, A, B, C, D, z, dt_bias, _v.require_bool("dt_softplus", dt_softplus),
        _dt_limit(dt_limit), cu_seqlens, initial_states, _chunk_size(chunk_size),
        None if precision is None else _v.require_choice("precision", precision, PRECISIONS),
        check_backend(backend))


def gated_delta_train(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None, dt_bias=None,
                      scale=None, use_qk_l2norm=False, cu_seqlens, initial_states=None,
                      chunk_size=None, backend=None):
    """``nki_ssm.ops.gated_delta_forward`` on tensors, differentiable -> (o, final_states)."""
    _require_tensors(dict(q=q, k=k, v=v, g=g, beta=beta, a=a, b=b, A_log=A_log,
                          dt_bias=dt_bias, cu_seqlens=cu_seqlens, initial_states=initial_states),
                     optional=(*_GATES, "initial_states"))
    return torch.ops.nki_ssm.gated_delta_train(
        q, k, v, g, beta, a, b, A_log, dt_bias, _scale(scale),
        _v.require_bool("use_qk_l2norm", use_qk_l2norm), cu_seqlens, initial_states,
        _chunk_size(chunk_size), check_backend(backend))
