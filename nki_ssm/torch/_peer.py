"""Helpers shared by the drop-ins (fla, mamba_ssm, causal_conv1d): batch layout and errors.

The drop-ins check what they read or convert themselves -- devices, index dtypes,
slot ranges, the batch size -- under the peer's argument names, before any
tensor is gathered or converted, so the message names what the caller passed
(the custom ops below them name the host API's arguments).
"""
from __future__ import annotations

import numbers

import torch

from ._devices import check_devices


class ArgumentError(ValueError, AssertionError):
    """A bad argument of a drop-in: a ValueError (the project's rule) that is also the
    AssertionError the peers' own ``assert`` checks raise, so callers written against
    the peer catch it as before. The message names the argument."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ArgumentError(message)


def check_inputs(lead: str, tensors: dict, *, integer: tuple = (), boolean: tuple = (),
                 batched: bool = True) -> None:
    """A drop-in's tensor arguments (name -> tensor or None): every one on the device of
    ``tensors[lead]`` (ValueError), the ``integer`` ones of an integer dtype and the
    ``boolean`` ones bool (TypeError; the peers would index with them, and a float
    ``cu_seqlens`` converted to int32 would silently truncate). ``batched``: the lead's
    ``shape[0]`` is the batch, which must be >= 1. Each value must be a tensor or None
    (TypeError)."""
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_devices(tensors, lead)
    for name in integer:
        t = tensors[name]
        if t is not None and (t.dtype.is_floating_point or t.dtype.is_complex
                              or t.dtype == torch.bool):
            raise TypeError(f"{name} must have an integer dtype (int32), got {t.dtype}")
    for name in boolean:
        t = tensors[name]
        if t is not None and t.dtype != torch.bool:
            raise TypeError(f"{name} must have dtype bool, got {t.dtype}")
    x = tensors[lead]
    if batched and (x.dim() == 0 or x.shape[0] < 1):
        raise ValueError(f"{lead}.shape[0] (batch) must be >= 1, got shape {tuple(x.shape)}")


def check_slots(name: str, indices: torch.Tensor, slots: int, pool: str) -> None:
    """Peer slot indices ``[batch]``: negative (padding) or in [0, slots), no slot twice.
    Read on the host (a graph break under torch.compile), before they index the pool."""
    values = indices.detach().to("cpu", torch.int64).tolist()
    for i, slot in enumerate(values):
        if slot >= slots:
            raise ValueError(f"{name}[{i}] must be negative (padding) or in [0, slots) = "
                             f"[0, {slots}) (slots = {pool}.shape[0]), got {slot}")
    named = [s for s in values if s >= 0]
    if len(set(named)) != len(named):
        slot = next(s for s in named if named.count(s) > 1)
        where = [i for i, s in enumerate(values) if s == slot]
        raise ValueError(f"{name} must not repeat a slot within a call, got slot {slot} "
                         f"at positions {where}")


def is_int(value) -> bool:
    """A Python or NumPy integer, not a bool (the host API's rule for sizes; NumPy's
    bool is no ``numbers.Integral``)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def dense_cu_seqlens(batch: int, seqlen: int, device) -> torch.Tensor:
    """int32 ``[batch + 1]`` prefix sums of ``batch`` rows of ``seqlen`` tokens each."""
    return torch.arange(batch + 1, dtype=torch.int32, device=device) * seqlen


def slots_for(num_seqs: int, device) -> torch.Tensor:
    """int32 ``[num_seqs]``: sequence i owns pool slot i (a scratch pool per call)."""
    return torch.arange(num_seqs, dtype=torch.int32, device=device)


def padding_to_minus_one(indices: torch.Tensor) -> torch.Tensor:
    """The peers treat any negative slot index as padding; the host API wants exactly -1."""
    return torch.where(indices < 0, torch.full_like(indices, -1), indices).to(torch.int32)


def runs(seq_idx: torch.Tensor) -> tuple[list[int], list[int]]:
    """Sequences of a packed ``seq_idx [batch, seqlen]`` (a new sequence wherever the id
    changes along a row) -> (cu_seqlens over the flattened ``batch*seqlen`` tokens, row of
    each sequence). Host-side: the number of sequences is data."""
    ids = seq_idx.detach().to("cpu", torch.int64)
    batch, seqlen = ids.shape
    cu, rows = [0], []
    for r in range(batch):
        row = ids[r]
        starts = [0] + (torch.nonzero(row[1:] != row[:-1]).flatten() + 1).tolist()
        for s, e in zip(starts, starts[1:] + [seqlen]):
            cu.append(r * seqlen + e)
            rows.append(r)
    return cu, rows


def constant_over(name: str, t: torch.Tensor, dims: tuple, what: str) -> torch.Tensor:
    """``t`` indexed at 0 along ``dims`` after checking it does not vary along them
    (free when those strides are 0, as Mamba2's ``repeat`` views; otherwise a value
    check). ValueError naming ``name`` when it varies."""
    if not all(t.stride(d) == 0 or t.shape[d] == 1 for d in dims):
        first = t
        for d in dims:
            first = first.narrow(d, 0, 1)
        if not torch.equal(t, first.expand_as(t)):
            raise ArgumentError(
                f"{name} must be constant over {what} (one value per head, as Mamba2 passes "
                f"it); the nki_ssm kernels take per-head values and cannot apply a {name} that "
                f"varies over {what}")
    for d in sorted(dims, reverse=True):
        t = t.select(d, 0)
    return t
