"""torch.library custom ops for the six pool-based ops of ``nki_ssm.ops`` (the serving contract).

``torch.ops.nki_ssm.<name>`` with ``<name>`` one of ``short_conv_prefill``,
``short_conv_decode``, ``ssd_prefill``, ``ssd_decode``,
``gated_delta_prefill``, ``gated_delta_decode``. Arguments, shapes, limits
and errors are those of ``nki_ssm.ops`` (docs/contracts.md, Host API), with
torch tensors in place of arrays; the state pool argument (``conv_states`` /
``ssm_states``) is declared mutated and updated in place, named slots only.
Each op has a fake (meta) kernel, so it traces under
``torch.compile(fullgraph=True)`` and passes ``torch.library.opcheck``.

Devices (``_devices``): a call runs on the device of ``x`` (``q``), the CPU
or a Neuron device; every other tensor argument must be on it (ValueError
naming the argument, raised by the real and the fake kernel alike, so a
``meta`` tensor cannot turn a call into shape inference).

Execution: CPU tensors run through ``nki_ssm.ops`` on NumPy views of the
caller's tensors (``backend`` argument: None = what ``NKI_SSM_BACKEND``
picks, the NKI kernel on an implementation or the references, or
"reference" / "sim" / "neuron"); the pools are updated in the caller's memory, with the host
API's guarantee that a rejected call leaves them untouched. Tensors on any
other device go to ``nki_ssm.torch.neuron`` (the kernels called with device
tensors, pools aliased).

Forward only (inference and serving): no autograd formula is registered, so
a backward through these ops raises (they write their pools, and torch admits no
autograd formula on a mutating op). Training: ``nki_ssm.torch.training``.

``gated_delta_decode`` always returns ``(o, intermediate)``; intermediate is
an empty ``[0]`` tensor unless ``return_intermediate_states`` (schemas have
a fixed number of outputs). The Python wrappers of this module
(``short_conv_prefill(...)`` etc.) take the host API's keyword names and
defaults, return what the host API returns, and check the arguments the schema
would convert or refuse on its own terms (``use_qk_l2norm=1`` -> True, a
string ``chunk_size`` -> RuntimeError) with the host API's checks first, so
they give the host API's verdict and message. ``chunk_size`` is ``int?`` in
the schema: None is the host API's to judge (the GDN kernel's default chunk;
a TypeError for SSD).
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

_NS = "nki_ssm"


def _host_call(fn, args: dict):
    """Run host-API op ``fn`` on NumPy views of the tensors in ``args`` (pools in place)."""
    return fn(**{k: to_numpy(v) if isinstance(v, Tensor) else v for k, v in args.items()})


def _neuron():
    from . import neuron

    return neuron


def _on_neuron(args: dict, lead: str) -> bool:
    """Whether the call runs on a Neuron device (``nki_ssm.torch.neuron``) rather than the
    CPU; every tensor argument must be on the device of ``args[lead]`` (``check_devices``)."""
    return _neuron().is_neuron_device(check_devices(args, lead))


# ------------------------------------------------------------------ short conv

@torch.library.custom_op(f"{_NS}::short_conv_prefill", mutates_args=("conv_states",))
def _short_conv_prefill(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                        activation: Optional[str], cu_seqlens: Tensor, conv_states: Tensor,
                        state_indices: Tensor, has_initial_state: Tensor,
                        backend: Optional[str]) -> Tensor:
    args = dict(x=x, weight=weight, bias=bias, activation=activation, cu_seqlens=cu_seqlens,
                conv_states=conv_states, state_indices=state_indices,
                has_initial_state=has_initial_state, backend=backend)
    if _on_neuron(args, "x"):
        return _neuron().short_conv_prefill(**args)
    return from_numpy(_host_call(_host.short_conv_prefill, args))


@_short_conv_prefill.register_fake
def _(x, weight, bias, activation, cu_seqlens, conv_states, state_indices, has_initial_state,
      backend):
    check_devices(locals(), "x")          # locals(): the arguments, by name
    return x.new_empty(x.shape)           # C-contiguous, as the real kernel's output


@torch.library.custom_op(f"{_NS}::short_conv_decode", mutates_args=("conv_states",))
def _short_conv_decode(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                       activation: Optional[str], conv_states: Tensor, state_indices: Tensor,
                       backend: Optional[str]) -> Tensor:
    args = dict(x=x, weight=weight, bias=bias, activation=activation, conv_states=conv_states,
                state_indices=state_indices, backend=backend)
    if _on_neuron(args, "x"):
        return _neuron().short_conv_decode(**args)
    return from_numpy(_host_call(_host.short_conv_decode, args))


@_short_conv_decode.register_fake
def _(x, weight, bias, activation, conv_states, state_indices, backend):
    check_devices(locals(), "x")
    return x.new_empty(x.shape)


# ------------------------------------------------------------------ Mamba-2 SSD

@torch.library.custom_op(f"{_NS}::ssd_prefill", mutates_args=("ssm_states",))
def _ssd_prefill(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                 z: Optional[Tensor], dt_bias: Optional[Tensor], dt_softplus: bool,
                 dt_limit: Sequence[float], cu_seqlens: Tensor, ssm_states: Tensor,
                 state_indices: Tensor, has_initial_state: Tensor, chunk_size: Optional[int],
                 precision: str, backend: Optional[str]) -> Tensor:
    args = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                dt_limit=tuple(dt_limit), cu_seqlens=cu_seqlens, ssm_states=ssm_states,
                state_indices=state_indices, has_initial_state=has_initial_state,
                chunk_size=chunk_size, precision=precision, backend=backend)
    if _on_neuron(args, "x"):
        return _neuron().ssd_prefill(**args)
    return from_numpy(_host_call(_host.ssd_prefill, args))


@_ssd_prefill.register_fake
def _(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, cu_seqlens, ssm_states,
      state_indices, has_initial_state, chunk_size, precision, backend):
    check_devices(locals(), "x")
    return x.new_empty(x.shape)


@torch.library.custom_op(f"{_NS}::ssd_decode", mutates_args=("ssm_states",))
def _ssd_decode(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                z: Optional[Tensor], dt_bias: Optional[Tensor], dt_softplus: bool,
                dt_limit: Sequence[float], ssm_states: Tensor, state_indices: Tensor,
                backend: Optional[str]) -> Tensor:
    args = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                dt_limit=tuple(dt_limit), ssm_states=ssm_states, state_indices=state_indices,
                backend=backend)
    if _on_neuron(args, "x"):
        return _neuron().ssd_decode(**args)
    return from_numpy(_host_call(_host.ssd_decode, args))


@_ssd_decode.register_fake
def _(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, ssm_states, state_indices, backend):
    check_devices(locals(), "x")
    return x.new_empty(x.shape)


# ------------------------------------------------------------------ Gated DeltaNet

@torch.library.custom_op(f"{_NS}::gated_delta_prefill", mutates_args=("ssm_states",))
def _gated_delta_prefill(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor],
                         beta: Optional[Tensor], a: Optional[Tensor], b: Optional[Tensor],
                         A_log: Optional[Tensor], dt_bias: Optional[Tensor],
                         scale: Optional[float], use_qk_l2norm: bool, cu_seqlens: Tensor,
                         ssm_states: Tensor, state_indices: Tensor, has_initial_state: Tensor,
                         chunk_size: Optional[int], backend: Optional[str]) -> Tensor:
    args = dict(q=q, k=k, v=v, g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens,
                ssm_states=ssm_states, state_indices=state_indices,
                has_initial_state=has_initial_state, chunk_size=chunk_size, backend=backend)
    if _on_neuron(args, "q"):
        return _neuron().gated_delta_prefill(**args)
    return from_numpy(_host_call(_host.gated_delta_prefill, args))


@_gated_delta_prefill.register_fake
def _(q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, cu_seqlens, ssm_states,
      state_indices, has_initial_state, chunk_size, backend):
    check_devices(locals(), "q")
    return q.new_empty((q.shape[0], v.shape[1], v.shape[2]))


@torch.library.custom_op(f"{_NS}::gated_delta_decode", mutates_args=("ssm_states",))
def _gated_delta_decode(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor],
                        beta: Optional[Tensor], a: Optional[Tensor], b: Optional[Tensor],
                        A_log: Optional[Tensor], dt_bias: Optional[Tensor],
                        scale: Optional[float], use_qk_l2norm: bool, ssm_states: Tensor,
                        state_indices: Tensor, return_intermediate_states: bool,
                        backend: Optional[str]) -> tuple[Tensor, Tensor]:
    args = dict(q=q, k=k, v=v, g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                scale=scale, use_qk_l2norm=use_qk_l2norm, ssm_states=ssm_states,
                state_indices=state_indices,
                return_intermediate_states=return_intermediate_states, backend=backend)
    if _on_neuron(args, "q"):
        return _neuron().gated_delta_decode(**args)
    out = _host_call(_host.gated_delta_decode, args)
    if return_intermediate_states:
        return from_numpy(out[0]), from_numpy(out[1])
    return from_numpy(out), ssm_states.new_empty((0,))


@_gated_delta_decode.register_fake
def _(q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, ssm_states, state_indices,
      return_intermediate_states, backend):
    check_devices(locals(), "q")
    S, T = q.shape[:2]
    HV, V = v.shape[2:]
    o = q.new_empty((S, T, HV, V))
    if return_intermediate_states:
        return o, ssm_states.new_empty((S, T, HV, q.shape[3], V))
    return o, ssm_states.new_empty((0,))


# ------------------------------------------------------------------ host-API-shaped wrappers

def _require_tensors(args: dict, optional: tuple = ()) -> None:
    """Tensor arguments of a wrapper (None allowed for ``optional`` ones), TypeError naming
    the argument otherwise (the schema's own error would be a RuntimeError)."""
    for name, value in args.items():
        if not (isinstance(value, Tensor) or (value is None and name in optional)):
            raise TypeError(f"{name} must be a torch.Tensor"
                            f"{' or None' if name in optional else ''}, "
                            f"got {type(value).__name__}")


def _chunk_size(value):
    """None (the host API judges it) or the host API's chunk_size check, as a Python int."""
    return None if value is None else _v.check_chunk_size(value)


def _scale(value):
    """None (K**-0.5, computed by the host API) or a finite float > 0."""
    return None if value is None else _v.check_scale(value, 1.0)


def _dt_limit(value) -> list:
    """The host API's (lo, hi) check, as the two-float list the schema takes."""
    return list(_v.check_dt_limit(value))


_GATES = ("g", "beta", "a", "b", "A_log", "dt_bias")


def short_conv_prefill(x, weight, bias=None, *, activation="silu", cu_seqlens, conv_states,
                       state_indices, has_initial_state, backend=None):
    """``nki_ssm.ops.short_conv_prefill`` on tensors (``conv_states`` updated in place)."""
    _require_tensors(dict(x=x, weight=weight, bias=bias, cu_seqlens=cu_seqlens,
                          conv_states=conv_states, state_indices=state_indices,
                          has_initial_state=has_initial_state), optional=("bias",))
    return torch.ops.nki_ssm.short_conv_prefill(
        x, weight, bias, _v.require_choice("activation", activation, ACTIVATIONS), cu_seqlens,
        conv_states, state_indices, has_initial_state, check_backend(backend))


def short_conv_decode(x, weight, bias=None, *, activation="silu", conv_states, state_indices,
                      backend=None):
    """``nki_ssm.ops.short_conv_decode`` on tensors (``conv_states`` updated in place)."""
    _require_tensors(dict(x=x, weight=weight, bias=bias, conv_states=conv_states,
                          state_indices=state_indices), optional=("bias",))
    return torch.ops.nki_ssm.short_conv_decode(
        x, weight, bias, _v.require_choice("activation", activation, ACTIVATIONS), conv_states,
        state_indices, check_backend(backend))


def ssd_prefill(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                dt_limit=(0.0, math.inf), cu_seqlens, ssm_states, state_indices,
                has_initial_state, chunk_size=128, precision="bf16", backend=None):
    """``nki_ssm.ops.ssd_prefill`` on tensors (``ssm_states`` updated in place)."""
    _require_tensors(dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                          cu_seqlens=cu_seqlens, ssm_states=ssm_states,
                          state_indices=state_indices, has_initial_state=has_initial_state),
                     optional=("D", "z", "dt_bias"))
    return torch.ops.nki_ssm.ssd_prefill(
        x, dt, A, B, C, D, z, dt_bias, _v.require_bool("dt_softplus", dt_softplus),
        _dt_limit(dt_limit), cu_seqlens, ssm_states, state_indices, has_initial_state,
        _chunk_size(chunk_size), _v.require_choice("precision", precision, PRECISIONS),
        check_backend(backend))


def ssd_decode(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
               dt_limit=(0.0, math.inf), ssm_states, state_indices, backend=None):
    """``nki_ssm.ops.ssd_decode`` on tensors (``ssm_states`` updated in place)."""
    _require_tensors(dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                          ssm_states=ssm_states, state_indices=state_indices),
                     optional=("D", "z", "dt_bias"))
    return torch.ops.nki_ssm.ssd_decode(
        x, dt, A, B, C, D, z, dt_bias, _v.require_bool("dt_softplus", dt_softplus),
        _dt_limit(dt_limit), ssm_states, state_indices, check_backend(backend))


def gated_delta_prefill(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None,
                        dt_bias=None, scale=None, use_qk_l2norm=False, cu_seqlens, ssm_states,
                        state_indices, has_initial_state, chunk_size=None, backend=None):
    """``nki_ssm.ops.gated_delta_prefill`` on tensors (``ssm_states`` updated in place)."""
    _require_tensors(dict(q=q, k=k, v=v, g=g, beta=beta, a=a, b=b, A_log=A_log,
                          dt_bias=dt_bias, cu_seqlens=cu_seqlens, ssm_states=ssm_states,
                          state_indices=state_indices, has_initial_state=has_initial_state),
                     optional=_GATES)
    return torch.ops.nki_ssm.gated_delta_prefill(
        q, k, v, g, beta, a, b, A_log, dt_bias, _scale(scale),
        _v.require_bool("use_qk_l2norm", use_qk_l2norm), cu_seqlens, ssm_states, state_indices,
        has_initial_state, _chunk_size(chunk_size), check_backend(backend))


def gated_delta_decode(q, k, v, *, g=None, beta=None, a=None, b=None, A_log=None,
                       dt_bias=None, scale=None, use_qk_l2norm=False, ssm_states,
                       state_indices, return_intermediate_states=False, backend=None):
    """``nki_ssm.ops.gated_delta_decode`` on tensors: o, or ``(o, intermediate)``."""
    _require_tensors(dict(q=q, k=k, v=v, g=g, beta=beta, a=a, b=b, A_log=A_log,
                          dt_bias=dt_bias, ssm_states=ssm_states, state_indices=state_indices),
                     optional=_GATES)
    inter = _v.require_bool("return_intermediate_states", return_intermediate_states)
    o, intermediate = torch.ops.nki_ssm.gated_delta_decode(
        q, k, v, g, beta, a, b, A_log, dt_bias, _scale(scale),
        _v.require_bool("use_qk_l2norm", use_qk_l2norm), ssm_states, state_indices, inter,
        check_backend(backend))
    return (o, intermediate) if inter else o
