"""Helpers shared by the drop-ins (fla, mamba_ssm, causal_conv1d): batch layout and errors."""
from __future__ import annotations

import torch


class ArgumentError(ValueError, AssertionError):
    """A bad argument of a drop-in: a ValueError (the project's rule) that is also the
    AssertionError the peers' own ``assert`` checks raise, so callers written against
    the peer catch it as before. The message names the argument."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ArgumentError(message)


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
