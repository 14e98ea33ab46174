"""The launchers' array namespace (``nki_ssm.ops.launch._arrays``) as torch ops on device tensors.

``nki_ssm.torch.neuron`` runs a launcher's own argument assembly (e.g.
``gated_delta.prefill_call``) with ``TorchArrays``, so the device path lays out
exactly what the NumPy host path lays out: every method here is the torch
counterpart of the ``NumpyArrays`` method of the same name, runs on the tensors'
device and never reads data back. Host-built index tables (and host index arrays
of ``take`` / ``where_rows``) move to the device with ``table``; why they are
host-built is said in ``_arrays``.
"""
from __future__ import annotations

import numpy as np
import torch


class TorchArrays:
    """The namespace on torch tensors of ``device`` (the caller's device)."""

    def __init__(self, device):
        self.device = device

    def f32(self, a):
        return None if a is None else a.to(torch.float32)

    def is_f32(self, a) -> bool:
        return a.dtype == torch.float32

    def is_bf16(self, a) -> bool:
        return a.dtype == torch.bfloat16

    def exact_in_bf16(self, a) -> bool:
        f32 = a.to(torch.float32)
        return bool(torch.equal(f32.to(torch.bfloat16).to(torch.float32), f32))

    def contiguous(self, a):
        return None if a is None else a.contiguous()

    def pad_rows(self, a, num_rows: int, width: int, f32: bool = False):
        n = a.shape[0]
        a = a.reshape(n, width)
        if f32:
            a = a.to(torch.float32)
        return torch.cat([a, a.new_zeros((num_rows - n, width))]).contiguous()

    def broadcast_rows(self, a, num_rows: int):
        return a.expand((num_rows,) + tuple(a.shape)).contiguous()

    def cat(self, arrays, axis: int = 0):
        return torch.cat(list(arrays), dim=axis)

    def stack(self, arrays, axis: int = 0):
        return torch.stack(list(arrays), dim=axis)

    def permute(self, a, axes):
        return a.permute(*axes).contiguous()

    def repeat(self, a, repeats: int, axis: int):
        return a.repeat_interleave(repeats, dim=axis)

    def take(self, a, index):
        return a.index_select(0, self.table(np.asarray(index, dtype=np.int64)))

    def where_rows(self, keep, a):
        keep = self.table(np.asarray(keep, dtype=bool)).reshape((-1,) + (1,) * (a.dim() - 1))
        return torch.where(keep, a, torch.zeros((), dtype=a.dtype, device=a.device))

    def cast_like(self, a, like):
        return a.to(like.dtype)          # one round to nearest even from float32

    def sum(self, a, axis: int, keepdims: bool = False):
        return a.sum(dim=axis, keepdim=keepdims)

    def exp(self, a):
        return torch.exp(a)

    def sqrt(self, a):
        return torch.sqrt(a)

    def sigmoid(self, a):
        # the NumPy namespace's formula, e^{-softplus(-a)}, so both paths round alike
        return torch.exp(-self.softplus(-a))

    def softplus(self, a):
        # log(1 + e^a) without F.softplus's linear branch above its threshold (as NumPy's)
        return torch.logaddexp(torch.zeros_like(a), a)

    def table(self, t):
        return torch.as_tensor(np.ascontiguousarray(t), device=self.device)

    def pool_view(self, pool, shape):
        """``pool.view(shape)`` (the kernel writes the caller's tensor); a strided pool is
        staged through a contiguous device copy (``commit`` copies it back)."""
        return (pool if pool.is_contiguous() else pool.contiguous()).view(shape)

    def commit(self, view, pool) -> None:
        if view.untyped_storage().data_ptr() != pool.untyped_storage().data_ptr():
            pool.copy_(view.view(pool.shape))
