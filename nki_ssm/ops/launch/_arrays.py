"""The few array operations a launcher lays out kernel arguments with, as one namespace.

A launcher's argument assembly (``gated_delta.prefill_call`` / ``decode_call``)
is written once against this namespace and run by both paths, so they cannot
fork: the NumPy host API with ``NUMPY`` (below), and the torch device path
(``nki_ssm.torch.neuron.TorchArrays``: the same methods as torch ops on the
caller's device tensors). Every method is a layout step a device runs (pad,
gather rows, permute, cast, broadcast); none reads data back to the host.

The small int32 batch tables are the exception by design: the launchers build
them with NumPy from the host index arrays (``cu_seqlens``, ``state_indices``,
``has_initial_state``) and hand them over with ``table``. The host API has to
read those arrays on the host anyway, before launch, for its checks (slots in
range, lengths consistent; the same verdict on every backend and nothing
touched on rejection), so building the tables from the same host copies adds
no device-to-host transfer; only the tables go to the device (each a few
vectorised ops, listed in the launchers' docstrings, should a caller want them
built on device). Index arguments of ``take`` / ``where_rows`` are host arrays
too, for the same reason.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np


def cast_rne(values, dtype) -> np.ndarray:
    """``values`` cast to ``dtype`` with one round-to-nearest-even.

    ml_dtypes casts float64 -> bfloat16 through float32, rounding twice
    (1 + 2**-8 + 2**-40 becomes 1.0 instead of 1 + 2**-7). Rounding float64
    to float32 *to odd* first makes the second RNE step exact, because
    float32 keeps more than bfloat16's 8 significant bits + 2.
    """
    dtype = np.dtype(dtype)
    a = np.asarray(values)
    if dtype != np.dtype(ml_dtypes.bfloat16) or a.dtype != np.float64:
        return a.astype(dtype)
    with np.errstate(over="ignore"):  # beyond float32 range is inf in bfloat16 too
        f = a.astype(np.float32)
    back = f.astype(np.float64)
    fix = (back != a) & np.isfinite(f) & ((f.view(np.uint32) & 1) == 0)
    if fix.any():
        toward = np.where(a[fix] > back[fix], np.float32(np.inf), np.float32(-np.inf))
        f[fix] = np.nextafter(f[fix], toward)
    return f.astype(dtype)


class NumpyArrays:
    """The namespace on NumPy arrays (the host API's path through ``nki_ssm.backend.run``)."""

    def f32(self, a):
        """float32 copy (or view) of ``a``; None stays None."""
        return None if a is None else np.asarray(a, dtype=np.float32)

    def is_f32(self, a) -> bool:
        return np.dtype(a.dtype) == np.float32

    def is_bf16(self, a) -> bool:
        return np.dtype(a.dtype) == np.dtype(ml_dtypes.bfloat16)

    def exact_in_bf16(self, a) -> bool:
        """Whether every value of ``a`` is a bfloat16 value (a compile-time flag's input:
        on device this reads one bool back)."""
        f32 = np.asarray(a, dtype=np.float32)
        return bool(np.array_equal(f32.astype(ml_dtypes.bfloat16).astype(np.float32), f32))

    def contiguous(self, a):
        return None if a is None else np.ascontiguousarray(a)

    def pad_rows(self, a, num_rows: int, width: int, f32: bool = False):
        """``a`` as ``[n, width]`` rows (float32 with ``f32``) followed by zero rows up to
        ``num_rows`` (torch.nn.functional.pad)."""
        n = a.shape[0]
        out = np.zeros((num_rows, width), dtype=np.float32 if f32 else a.dtype)
        out[:n] = np.asarray(a).reshape(n, width)
        return out

    def broadcast_rows(self, a, num_rows: int):
        """``[num_rows, *a.shape]``, every row ``a`` (contiguous)."""
        return np.ascontiguousarray(np.broadcast_to(a, (num_rows,) + tuple(a.shape)))

    def cat(self, arrays, axis: int = 0):
        return np.concatenate(arrays, axis=axis)

    def stack(self, arrays, axis: int = 0):
        return np.stack(arrays, axis=axis)

    def permute(self, a, axes):
        """``a`` with its axes in the order ``axes``, contiguous."""
        return np.ascontiguousarray(np.transpose(a, axes))

    def repeat(self, a, repeats: int, axis: int):
        """Each element of ``a`` ``repeats`` times along ``axis`` (torch.repeat_interleave)."""
        return np.repeat(np.asarray(a), repeats, axis=axis)

    def take(self, a, index):
        """Rows ``index`` (a host int array) of ``a`` (torch.index_select)."""
        return np.asarray(a)[np.asarray(index)]

    def where_rows(self, keep, a):
        """Rows of ``a`` where ``keep`` (host bool ``[a.shape[0]]``), zero elsewhere."""
        keep = np.asarray(keep).reshape((-1,) + (1,) * (a.ndim - 1))
        return np.where(keep, a, np.zeros((), dtype=a.dtype))

    def cast_like(self, a, like):
        """``a`` in ``like``'s dtype, rounded once to nearest even."""
        return cast_rne(a, like.dtype)

    def sum(self, a, axis: int, keepdims: bool = False):
        """Sum over ``axis`` (torch.sum(dim=, keepdim=))."""
        return np.sum(a, axis=axis, keepdims=keepdims)

    def exp(self, a):
        return np.exp(a)

    def sqrt(self, a):
        return np.sqrt(a)

    def sigmoid(self, a):
        """1 / (1 + e^-a) (torch.sigmoid), as e^{-softplus(-a)}: no overflow."""
        return np.exp(-np.logaddexp(0.0, -a)).astype(a.dtype)

    def softplus(self, a):
        """log(1 + e^a) (torch.nn.functional.softplus)."""
        return np.logaddexp(0.0, a).astype(a.dtype)

    def table(self, t):
        """A host-built index table as a kernel argument (here: itself, contiguous)."""
        return np.ascontiguousarray(t)

    def pool_view(self, pool, shape):
        """The pool as the kernel's view of ``shape`` (a copy for a strided pool)."""
        return pool.reshape(shape)

    def commit(self, view, pool) -> None:
        """Make the kernel's writes to ``view`` the caller's ``pool`` (no-op for a view)."""
        if not np.shares_memory(view, pool):
            pool[...] = view.reshape(pool.shape)


NUMPY = NumpyArrays()


class KernelCall:
    """``call(kernel, *args)``: how a launcher launches a kernel, and ``call.lnc``, the
    number of programs the launch runs as (1 or 2: the launcher shards its work lists
    across them). ``launch(kernel, lnc, *args)`` does the launching."""

    def __init__(self, launch, lnc: int):
        if isinstance(lnc, bool) or lnc not in (1, 2):
            raise ValueError(f"lnc: expected 1 or 2, got {lnc!r}")
        self._launch = launch
        self.lnc = int(lnc)

    def __call__(self, kernel, *args):
        return self._launch(kernel, self.lnc, *args)


def host_call(backend, lnc: int | None = None):
    """The ``KernelCall`` of the host path (with ``NUMPY``): the kernel on ``backend``'s NKI
    (``nki_ssm.backend.run``) as ``lnc`` programs (None: ``backend.logical_nc_config``)."""
    from nki_ssm import backend as _backend

    def launch(kernel, programs, *args):
        return _backend.run(kernel, *args, backend=backend, lnc=programs)

    return KernelCall(launch, _backend.logical_nc_config(backend) if lnc is None else lnc)
