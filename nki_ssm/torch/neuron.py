"""The Neuron device path of the custom ops: device tensors straight to the ``@nki.jit`` kernels.

On torch-neuronx (XLA) tensors ``nki_ssm.torch.ops`` calls the functions of
this module instead of the NumPy host API. Each op:

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
4. the launcher calls ``device_call(kernel, *args)`` -- the one boundary with the
   device: ``kernel(*args)``, i.e. ``nki.jit``'s PyTorch integration with XLA
   tensors -- and lays the output back with torch ops.

``device_call`` is what the CPU tests replace (they run the kernel on the
simulator with NumPy views of the very tensors passed, and check that the
arguments equal the host path's, the layouts and the aliasing); the real run
needs a trn instance with the Neuron SDK (tests marked ``trn``).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch

from nki_ssm.ops import gated_delta as _gdn_host
from nki_ssm.ops import mamba2_ssd as _ssd_host
from nki_ssm.ops import short_conv as _conv_host
from nki_ssm.ops.launch import gated_delta as _gdn_launch
from nki_ssm.ops.launch import mamba2_ssd as _ssd_launch
from nki_ssm.ops.launch import short_conv as _conv_launch
from nki_ssm.ops.launch.buckets import seq_bucket
from nki_ssm.torch._device_arrays import TorchArrays

_PMAX = 128
_INT32_MAX = np.iinfo(np.int32).max
_NP_DTYPE = {torch.float32: np.dtype(np.float32), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
             torch.float16: np.dtype(np.float16), torch.float64: np.dtype(np.float64)}
_INDEX_ARGS = ("cu_seqlens", "state_indices", "has_initial_state")


def device_call(kernel, *args):
    """The device boundary: an ``@nki.jit`` kernel called with device tensors (and the
    kernel's compile-time Python values). Replaced in the CPU tests."""
    return kernel(*args)


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


def _device(table, like: torch.Tensor):
    return torch.as_tensor(np.ascontiguousarray(table), device=like.device)


def _rows_view(pool: torch.Tensor, rows: int, cols: int):
    """(view handed to the kernel, the pool tensor to copy back into or None).

    A contiguous pool is viewed in place (the kernel writes the caller's tensor);
    a strided one is staged through a contiguous device copy."""
    if rows > _INT32_MAX:
        raise ValueError(f"pool rows {rows} exceed int32 row indices ({_INT32_MAX})")
    if pool.is_contiguous():
        return pool.view(rows, cols), None
    return pool.contiguous().view(rows, cols), pool


def _commit(view: torch.Tensor, strided) -> None:
    if strided is not None:
        strided.copy_(view.view(strided.shape))


def _launch(validator, build, args: dict):
    """Validate, build the kernel's arguments, call the device, commit a staged pool
    -> (the op's arguments, the build's host values for the way back, the kernel's output)."""
    t = dict(args)
    kw = _validate(validator, args)
    kernel, kernel_args, pool_view, strided, back = build(t, kw)
    out = device_call(kernel, *kernel_args)
    _commit(pool_view, strided)
    return t, back, out


def _f32(t):
    return None if t is None else t.to(torch.float32)


def _needs_split(t) -> bool:
    """float32 values bfloat16 does not hold exactly (the launchers' host check, on device)."""
    if t is None or t.dtype != torch.float32:
        return False
    return not torch.equal(t.to(torch.bfloat16).to(torch.float32), t)


def _tok2d(t, num_tokens: int, width: int, dtype=None):
    """``[num_tokens, width]`` (one zero row when there are no tokens: kernels need a row)."""
    if t is None:
        return None
    t = t.reshape(num_tokens, width)
    if dtype is not None:
        t = t.to(dtype)
    if num_tokens == 0:
        t = t.new_zeros((1, width))
    return t.contiguous()


def _batch(kw):
    idx = np.asarray(kw["state_indices"], dtype=np.int64)
    cu = [int(v) for v in np.asarray(kw.get("cu_seqlens", []))]
    seq_lens = tuple(cu[i + 1] - cu[i] for i in range(len(cu) - 1))
    return idx, idx >= 0, seq_lens


def _shared(validator, launcher_call, args: dict):
    """Validate, then run the launcher's own argument assembly ``launcher_call`` (the one the
    host path runs with NumPy) with torch ops on the caller's device and ``device_call``."""
    t = dict(args)
    kw = _validate(validator, args)
    like = next(v for v in t.values() if isinstance(v, torch.Tensor))
    for name, value in kw.items():     # activations and pools: the caller's device tensors
        if name not in _INDEX_ARGS and isinstance(t.get(name), torch.Tensor):
            kw[name] = t[name]
    return launcher_call(TorchArrays(like.device), lambda kernel, *a: device_call(kernel, *a),
                         **kw)


# ------------------------------------------------------------------ short conv

def _conv_prefill_args(t, kw):
    from nki_ssm.kernels.short_conv.prefill import short_conv_prefill_kernel

    x, weight, bias, pool = t["x"], t["weight"], t["bias"], t["conv_states"]
    num_tokens, dim = x.shape
    slots, _, h = pool.shape
    idx, live, _ = _batch(kw)
    oob = slots * dim
    init = np.asarray(kw["has_initial_state"], dtype=bool)
    cu = [int(v) for v in kw["cu_seqlens"]]
    rows, strided = _rows_view(pool, slots * dim, h)
    mm_fp32 = x.dtype == torch.float32 or pool.dtype == torch.float32
    flags = (mm_fp32, mm_fp32 and x.dtype != torch.float32,
             (not mm_fp32) and _needs_split(weight), (not mm_fp32) and _needs_split(bias))
    args = (x.contiguous() if num_tokens else x.new_zeros((1, dim)), weight.contiguous(),
            None if bias is None else bias.contiguous(), rows,
            _device(_conv_launch._row_table(idx, live & init, dim, oob), x),
            _device(_conv_launch._row_table(idx, live, dim, oob), x),
            tuple((cu[s], cu[s + 1]) for s in range(len(cu) - 1)), tuple(bool(v) for v in live),
            "silu" if kw["activation"] == "silu" else "none", bias is not None, *flags)
    return short_conv_prefill_kernel, args, rows, strided, None


def short_conv_prefill(**args):
    """``torch.ops.nki_ssm.short_conv_prefill`` on device tensors."""
    t, _, y = _launch(_conv_host.validate_prefill, _conv_prefill_args, args)
    return y[:0] if t["x"].shape[0] == 0 else y


def _padded_indices(state_indices, num_seqs: int, bucket: int):
    """``state_indices`` padded with -1 to the launcher's sequence bucket (host int64)."""
    idx = np.full(bucket, -1, dtype=np.int64)
    idx[:num_seqs] = np.asarray(state_indices, dtype=np.int64)
    return idx


def _conv_decode_args(t, kw):
    from nki_ssm.kernels.short_conv.decode import short_conv_decode_kernel

    x, weight, bias, pool = t["x"], t["weight"], t["bias"], t["conv_states"]
    x3 = x[:, None, :] if x.dim() == 2 else x
    num_seqs, T, dim = x3.shape
    slots, _, h = pool.shape
    bucket = seq_bucket(num_seqs)
    R = _conv_launch._row_split(bucket, dim)
    idx = _padded_indices(kw["state_indices"], num_seqs, bucket)
    order, pos, pool_rows, num_groups = _conv_launch.decode_tables(idx, bucket, R)
    G = pool_rows.shape[0]
    Pn = order.shape[0] // G
    # the compacted batch: positions past the caller's sequences mirror live ones
    xk = x3.index_select(0, _device(np.minimum(order, num_seqs - 1), x)).reshape(G, Pn, T, dim)
    flat, strided = _rows_view(pool, slots * R, (dim // R) * h)
    taps = (R == 1 and x.dtype == torch.bfloat16 and pool.dtype == torch.bfloat16
            and not _needs_split(weight) and not _needs_split(bias))
    args = (xk.contiguous(), weight.contiguous(), None if bias is None else bias.contiguous(),
            flat, _device(pool_rows, x), _device(num_groups, x),
            "silu" if kw["activation"] == "silu" else "none", bias is not None, R, bool(taps))
    back = dict(at=pos[:num_seqs], live=idx[:num_seqs] >= 0, rows=G * Pn)
    return short_conv_decode_kernel, args, flat, strided, back


def _uncompact(out, back, like, tail: tuple):
    """Rows of the compacted batch back in the caller's order, padding sequences zero."""
    rows = out.reshape((back["rows"],) + tail).index_select(0, _device(back["at"], like))
    live = _device(back["live"], like).reshape((-1,) + (1,) * len(tail))
    return torch.where(live, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


def short_conv_decode(**args):
    """``torch.ops.nki_ssm.short_conv_decode`` on device tensors."""
    t, back, y = _launch(_conv_host.validate_decode, _conv_decode_args, args)
    x = t["x"]
    y = _uncompact(y, back, x, (1 if x.dim() == 2 else x.shape[1], x.shape[-1]))
    return y[:, 0, :] if x.dim() == 2 else y


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
