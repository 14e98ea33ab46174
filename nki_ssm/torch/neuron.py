"""The Neuron device path of the custom ops: device tensors straight to the ``@nki.jit`` kernels.

Neuron devices (``DEVICE_TYPES``; ``is_neuron_device``) and how a kernel reaches them
(``launch_path``), by runtime:

* TorchNeuron (``torch-neuronx`` 2.13 / 2.14 on the native ``neuron`` device; SDK 2.33
  and 2.34, the "Deep Learning AMI Neuron torch-neuronx 2.14.0" DLAMI): the ``@nki.jit``
  kernel is called with the ``neuron`` tensors inside the ``torch.library`` custom op,
  ``kernel[lnc](*args)``. "A plain ``@nki.jit`` kernel" runs on ``neuron`` tensors eagerly
  (compiled per shapes, dtypes and non-tensor values) and inside
  ``torch.compile(backend="neuron")``, where the custom op is one node of the captured
  graph; training registers the backward with ``register_autograd``
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/guides/how-to-work-with-nki.html).
  TorchNeuron's own ``@nki_op`` decorator registers the same kind of ``torch.library``
  custom op; its exact signature is not verified, so the ops are registered with
  ``torch.library`` directly (``nki_ssm.torch.ops``, ``nki_ssm.torch.training``).
* vLLM Neuron (its plugin, ``vllm_neuron``, loaded in the process; 0.24's runtime was
  ``libtorch_neuronx_lite``): the kernel goes through the plugin's ``wrap_nki`` HOP, as
  the plugin's own models call theirs: ``wrap_nki(kernel)(*args)`` for one program
  (vllm-project/vllm-neuron b3a5a71f, vllm_neuron/model/qwen3_5/deltanet.py) and the
  caller indexed by the grid for more, ``wrap_nki(kernel)[lnc](**kwargs)`` (the 0.24 docs,
  aws-neuron/aws-neuron-sdk 81ce03ae vllm-neuron/docs/model-dev/nki_cpu_simulator.md
  l.22-23). ``WRAP_NKI_RUNTIMES`` lists where the HOP lives.
* ``"xla"``: torch-neuronx 2.9 (PyTorch/XLA), last shipped with SDK 2.31, whose NKI
  (0.5) predates these kernels. The kernel call is TorchNeuron's, so the device is kept
  while that costs nothing; no DLAMI of a supported SDK carries it.

On those tensors ``nki_ssm.torch.ops`` calls the functions of this module
instead of the NumPy host API. Each op:

1. validates with the host API's own checks (``nki_ssm.ops.<family>.validate_*``,
   so every backend gives the same verdict and message), run on metadata
   stand-ins of the activations and pools (shape and dtype, no data) and on host
   copies of the small index tensors (``cu_seqlens``, ``state_indices``,
   ``has_initial_state``; a serving engine builds these on the host anyway);
   a rejected call has touched nothing;
2. runs the launcher's own argument assembly (``nki_ssm.ops.launch.<family>.
   prefill_call`` / ``decode_call``, the very code the NumPy host path runs) with
   ``TorchArrays`` (``_device_arrays``): the layouts are torch ops on the device,
   the launcher picks the kernel, and the two paths cannot fork. The small int32
   batch tables are built by the launcher from the host copies of step 1 and moved
   to the device (why host-built: ``nki_ssm.ops.launch._arrays``); activations
   never leave the device;
3. the pool goes to the kernel as a *view* of the caller's tensor
   (``pool.view(shape)``), so the kernel's in-place pool update is the caller's
   tensor (aliasing, no write-back); a non-contiguous pool goes through a
   contiguous device copy that is copied back with ``copy_`` (still no host round
   trip);
4. the launcher calls ``device_call(kernel, *args, lnc=)`` -- the one boundary with
   the device: ``kernel[lnc](*args)`` or ``wrap_nki(kernel)[lnc](**kwargs)``
   (``launch_path``) -- and lays the output back with torch ops. ``lnc`` is
   ``nki_ssm.backend.logical_nc_config("neuron")`` (``NEURON_LOGICAL_NC_CONFIG``;
   unset, the Neuron runtime's default: 2 on trn2 / trn3), read after validation and
   before anything reaches the device, as on the host path; the launcher shards its
   work lists for that many programs.

The training backwards (``short_conv_backward``, ``ssd_backward``,
``gated_delta_backward``, called by ``nki_ssm.torch.training`` on device tensors) take the
same steps with the host backward's checks (``nki_ssm.ops.<family>_backward``: output
gradient and ``d_final_states`` too) and the backward launcher's ``backward_call``
(``nki_ssm.ops.launch.<family>_backward``); they write no pool and return the host API's
dict of gradients, each in its input's dtype.

``device_call`` is what the CPU tests replace (they run the kernel on the
simulator with NumPy views of the very tensors passed, and check that the
arguments equal the host path's, the layouts and the aliasing); each runtime's
launch path is tested with a fake of that runtime (tests/torch/
test_torch_neuron_runtimes.py: TorchNeuron eager and under ``torch.compile``, vLLM
Neuron's ``wrap_nki``, forward and training backward); the real run needs a trn
instance with the Neuron SDK (tests marked ``trn``). Whether the pool written in
place by the kernel comes back through the HOP is what the bench's first call
checks on the device (deploy/, the pool check and its hint).
"""
from __future__ import annotations

import inspect
import sys

import ml_dtypes
import numpy as np
import torch

from nki_ssm.ops import gated_delta as _gdn_host
from nki_ssm.ops import mamba2_ssd as _ssd_host
from nki_ssm.ops import short_conv as _conv_host
# the backward modules by their own names (nki_ssm.ops re-exports functions of the same names)
from nki_ssm.ops.gated_delta_backward import GRAD_OF as _GDN_GRAD_OF
from nki_ssm.ops.gated_delta_backward import validate_backward as _gdn_validate_backward
from nki_ssm.ops.mamba2_ssd_backward import GRAD_OF as _SSD_GRAD_OF
from nki_ssm.ops.mamba2_ssd_backward import validate_backward as _ssd_validate_backward
from nki_ssm.ops.short_conv_backward import validate_backward as _conv_validate_backward
from nki_ssm.ops.launch import gated_delta as _gdn_launch
from nki_ssm.ops.launch import gated_delta_backward as _gdn_bwd_launch
from nki_ssm.ops.launch import mamba2_ssd as _ssd_launch
from nki_ssm.ops.launch import mamba2_ssd_backward as _ssd_bwd_launch
from nki_ssm.ops.launch import short_conv as _conv_launch
from nki_ssm.ops.launch import short_conv_backward as _conv_bwd_launch
from nki_ssm.torch._device_arrays import TorchArrays

_NP_DTYPE = {torch.float32: np.dtype(np.float32), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
             torch.float16: np.dtype(np.float16), torch.float64: np.dtype(np.float64)}
_INDEX_ARGS = ("cu_seqlens", "state_indices", "has_initial_state")


# Device types of the Neuron device path: "xla" (torch-neuronx 2.9, SDK <= 2.31) and
# "neuron" (the native PrivateUse1 device: TorchNeuron, vLLM Neuron).
DEVICE_TYPES = ("xla", "neuron")
# the packages whose wrap_nki HOP the native device's kernels go through when that package
# runs in the process: vLLM Neuron's plugin (vllm_neuron.nki.nki_hop, 0.29) and 0.24's
# runtime (libtorch_neuronx_lite.nki.nki_hop)
WRAP_NKI_RUNTIMES = ("vllm_neuron", "libtorch_neuronx_lite")


def device_type(device) -> str | None:
    """The type string of ``device`` (a torch.device, a tensor, or a type string like "xla")."""
    if isinstance(device, str):
        return device.split(":")[0]
    device = getattr(device, "device", device)     # a tensor -> its device
    return getattr(device, "type", None)


def is_neuron_device(device) -> bool:
    """Whether ``device`` (torch.device, tensor or type string) is one this module serves."""
    return device_type(device) in DEVICE_TYPES


def wrap_nki():
    """The ``wrap_nki`` HOP of the vLLM Neuron runtime running in this process (its package
    already imported: an installed but idle vLLM is not imported here), or None."""
    if "vllm_neuron" in sys.modules:
        try:
            from vllm_neuron.nki.nki_hop import wrap_nki as hop
            return hop
        except ImportError:
            pass
    if "libtorch_neuronx_lite" in sys.modules:
        try:
            from libtorch_neuronx_lite.nki.nki_hop import wrap_nki as hop
            return hop
        except ImportError:
            pass
    return None


def launch_path(device) -> str:
    """How a kernel reaches ``device``: "jit" (the ``@nki.jit`` kernel called with the device
    tensors: TorchNeuron, XLA) or "wrap_nki" (vLLM Neuron's HOP, when it runs)."""
    kind = device_type(device)
    if kind not in DEVICE_TYPES:
        raise ValueError(f"device must be a Neuron device ({', '.join(DEVICE_TYPES)}), got {kind!r}")
    return "wrap_nki" if kind == "neuron" and wrap_nki() is not None else "jit"


def _kernel_kwargs(kernel, args) -> dict | None:
    """``args`` by the kernel function's parameter names (None: they do not bind)."""
    fn = getattr(kernel, "func", None) or getattr(kernel, "fn", None) or kernel
    try:
        return dict(inspect.signature(fn).bind(*args).arguments)
    except (TypeError, ValueError):
        return None


def device_call(kernel, *args, lnc: int = 1):
    """The device boundary: an ``@nki.jit`` kernel with device tensors (and the kernel's
    compile-time Python values) as a grid of ``lnc`` programs, by the device's
    ``launch_path``: ``kernel[lnc](*args)``, or vLLM Neuron's HOP caller,
    ``wrap_nki(kernel)[lnc](**kwargs)``; for a grid of one the kernel (the caller) itself,
    as the runtimes' own callers do. Replaced in the CPU tests."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    if launch_path(device) == "jit":
        return (kernel if lnc == 1 else kernel[lnc])(*args)
    caller = wrap_nki()(kernel)
    if lnc != 1:
        caller = caller[lnc]
    kwargs = _kernel_kwargs(kernel, args)
    return caller(*args) if kwargs is None else caller(**kwargs)


# ------------------------------------------------------------------ validation

_POOL_ARGS = ("conv_states", "ssm_states")


def _standin(t, layout: bool = False):
    """Shape and dtype of tensor ``t`` as a writeable ndarray with no data: zero strides
    (every read is the one element), or with ``layout`` the tensor's own strides, so the
    host API's pool-overlap check sees the device pool's layout. A ``layout`` stand-in must
    never be read: the host API's pool checks look at shape, dtype and strides only."""
    dtype = _NP_DTYPE.get(t.dtype)
    if dtype is None:
        dtype = torch.empty((), dtype=t.dtype).numpy().dtype
    strides = tuple(s * dtype.itemsize for s in t.stride()) if layout else (0,) * t.dim()
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=tuple(t.shape),
                                           strides=strides, writeable=True)


def _validate(validator, args: dict, **extra) -> dict:
    """The host API's checks on ``args`` -> its normalised values (index arrays on the host)."""
    backend = args.pop("backend", None)
    if backend is None:
        from nki_ssm import backend as nki_backend

        if nki_backend.default_op_backend() == "reference":
            backend = "reference"     # NKI_SSM_BACKEND=reference: the host's float64 references
    if backend not in (None, "neuron"):
        raise ValueError(f"backend must be None or 'neuron' for device tensors, got "
                         f"{backend!r} (move the tensors to the CPU for {backend!r})")
    host = {}
    for name, value in args.items():
        if not isinstance(value, torch.Tensor):
            host[name] = value
        elif name in _INDEX_ARGS:
            host[name] = value.detach().cpu().numpy()
        else:
            host[name] = _standin(value, layout=name in _POOL_ARGS)
    return validator(**host, **extra)


def _shared(validator, launcher_call, args: dict):
    """Validate, then run the launcher's own argument assembly ``launcher_call`` (the one the
    host path runs with NumPy) with torch ops on the caller's device and ``device_call``."""
    t = dict(args)
    kw = _validate(validator, args)
    like = next(v for v in t.values() if isinstance(v, torch.Tensor))
    for name, value in kw.items():     # activations and pools: the caller's device tensors
        if name not in _INDEX_ARGS and isinstance(t.get(name), torch.Tensor):
            kw[name] = t[name]
        elif name not in _INDEX_ARGS and isinstance(value, np.ndarray):
            # a stand-in has no data: the launcher must never see one
            raise AssertionError(f"validated {name!r} has no device tensor")
    from nki_ssm import backend
    from nki_ssm.ops.launch._arrays import KernelCall

    call = KernelCall(lambda kernel, lnc, *a: device_call(kernel, *a, lnc=lnc),
                      backend.logical_nc_config("neuron"))
    return launcher_call(TorchArrays(like.device), call, **kw)


# ------------------------------------------------------------------ short conv

def short_conv_prefill(**args):
    """``torch.ops.nki_ssm.short_conv_prefill`` on device tensors."""
    return _shared(_conv_host.validate_prefill, _conv_launch.prefill_call, args)


def short_conv_decode(**args):
    """``torch.ops.nki_ssm.short_conv_decode`` on device tensors."""
    return _shared(_conv_host.validate_decode, _conv_launch.decode_call, args)


# ------------------------------------------------------------------ Mamba-2 SSD

def ssd_prefill(**args):
    """``torch.ops.nki_ssm.ssd_prefill`` on device tensors."""
    return _shared(_ssd_host.validate_prefill, _ssd_launch.prefill_call, args)


def ssd_decode(**args):
    """``torch.ops.nki_ssm.ssd_decode`` on device tensors."""
    return _shared(_ssd_host.validate_decode, _ssd_launch.decode_call, args)


# ------------------------------------------------------------------ Gated DeltaNet

def _gdn_validator(validator):
    """The GDN host validators take the gates as one dict and v as ``v_``."""
    def call(q, k, v, g, beta, a, b, A_log, dt_bias, **rest):
        gates = dict(g=g, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
        return validator(q, k, v, gates=gates, **rest)

    return call


def gated_delta_decode(**args):
    """``torch.ops.nki_ssm.gated_delta_decode`` on device tensors -> (o, intermediate or [0])."""
    out = _shared(_gdn_validator(_gdn_host.validate_decode), _gdn_launch.decode_call, args)
    if args["return_intermediate_states"]:
        return out
    return out, args["ssm_states"].new_empty((0,))


def gated_delta_prefill(**args):
    """``torch.ops.nki_ssm.gated_delta_prefill`` on device tensors."""
    return _shared(_gdn_validator(_gdn_host.validate_prefill), _gdn_launch.prefill_call, args)


# ------------------------------------------------------------------ backward (training)
#
# The training ops' backwards (``nki_ssm.torch.training``) on device tensors: the host
# backward's checks (``nki_ssm.ops.<family>_backward``, same messages) on stand-ins, then the
# backward launcher's ``backward_call`` with ``TorchArrays``; the dict of the host API back
# (each gradient in its input's dtype, d_initial_states float32 for SSD / GDN).

def _on_neuron(validator):
    """``validator`` with the device tensors' backend, "neuron" (the host checks take one)."""
    return lambda **kw: validator(**kw, backend="neuron")


def _launcher_kwargs(validate_backward):
    """The host backward's ``validate_backward`` -> only the launcher's keywords."""
    return lambda **kw: validate_backward(**kw)[1]


def _in_input_dtypes(grads: dict, args: dict, grad_of: dict) -> dict:
    """The launcher's float32 gradients in their inputs' dtypes (``_backward.cast_grads``:
    one round to nearest even), None for inputs not given."""
    out = dict(grads)
    for name, key in grad_of.items():
        out[key] = None if args[name] is None else grads[key].to(args[name].dtype)
    return out


def short_conv_backward(**args):
    """``torch.ops.nki_ssm.short_conv_train_backward`` on device tensors (keywords of
    ``nki_ssm.ops.short_conv_backward``) -> its dict of gradients."""
    return _shared(_on_neuron(_conv_validate_backward), _conv_bwd_launch.backward_call, args)


def _backward_in_input_dtypes(validate_backward, grad_of, backward_call, args):
    """The host backward's ``validate_backward`` checks, the launcher's ``backward_call``,
    then the float32 gradients in their inputs' dtypes (``grad_of``: input -> gradient key;
    SSD, GDN)."""
    grads = _shared(_on_neuron(_launcher_kwargs(validate_backward)), backward_call, args)
    return _in_input_dtypes(grads, dict(args), grad_of)


def ssd_backward(**args):
    """``torch.ops.nki_ssm.ssd_train_backward`` on device tensors (keywords of
    ``nki_ssm.ops.ssd_backward``) -> its dict of gradients."""
    return _backward_in_input_dtypes(_ssd_validate_backward, _SSD_GRAD_OF,
                                     _ssd_bwd_launch.backward_call, args)


def gated_delta_backward(**args):
    """``torch.ops.nki_ssm.gated_delta_train_backward`` on device tensors (keywords of
    ``nki_ssm.ops.gated_delta_backward``) -> its dict of gradients."""
    return _backward_in_input_dtypes(_gdn_validate_backward, _GDN_GRAD_OF,
                                     _gdn_bwd_launch.backward_call, args)
