"""Drop-ins for ``mamba_ssm``'s Mamba-2 ops (state-spaces/mamba, ``mamba_ssm.ops.triton``).

``mamba_chunk_scan_combined`` and ``selective_state_update`` take the peer's
arguments, defaults and return values. Where our host API differs, these
follow the peer:

- ``chunk_size``: any positive int. The result of the chunked scan does not
  depend on the chunk size (it is the same recurrence, evaluated blockwise), and
  our kernel takes a multiple of 16 in 16..128, so the call runs on
  ``min(128, max(16, chunk_size // 16 * 16))`` (Mamba-2's default 256 -> 128;
  transformers' tiny test configs' 8 -> 16).
- precision follows the input dtype: float32 x runs float32 TensorE operands
  (our host API's default is bf16 operands), bfloat16 x runs bf16 operands.
- ``seq_idx [batch, seqlen]``: a new sequence wherever the id changes along a row
  (state reset there, as in the peer); ``initial_states [batch, H, P, N]`` is the
  state before the first token of each row (the peer resets chunk-granularly and
  can drop it when the row's first sequence ends inside the first chunk; here it
  always applies to that first sequence). ``final_states`` is the state at the end
  of each row; ``varlen_states`` (``return_varlen_states``, batch 1) the final state
  of each ``cu_seqlens`` sequence, whose boundaries must be sequence boundaries of
  ``seq_idx`` (the peer would otherwise read states carried across them:
  ArgumentError). As in the peer, ``final_states`` come back in float32 and
  ``varlen_states`` in ``state_dtype``, else C's dtype.
  The sequences of ``seq_idx`` / ``cu_seqlens`` are read on the host (their count
  is data: a graph break under ``torch.compile``); dense calls trace fully.
- ``selective_state_update`` updates ``state`` in place (named slots) and applies
  no ``dt_limit`` (the peer has none). Mamba2 passes per-head values broadcast
  to the per-head-dim forms ``dt [B, H, P]``, ``A [H, P, N]``, ``dt_bias [H, P]``
  with zero strides; those are read per head for free. A ``dt``, ``A`` or
  ``dt_bias`` that really varies over P (or N) cannot run on our kernels (they
  take per-head values): ArgumentError naming it. ``D [H, P]`` may vary.
  A negative ``state_batch_indices`` entry is padding (zero output, state
  untouched), as in the peer.

Training: when autograd records and x, dt, A, B, C, D, z, dt_bias or initial_states
requires grad, ``mamba_chunk_scan_combined`` runs ``torch.ops.nki_ssm.ssd_train``
(same kernel, no pool) and returns gradients for exactly the inputs the peer's
``MambaChunkScanCombinedFn.backward`` does -- x, dt (through dt_bias, softplus and
dt_limit), A, B, C, D, z, dt_bias, initial_states (state-spaces/mamba e9594ce,
mamba_ssm/ops/triton/ssd_combined.py:620-625); final_states and varlen_states are
differentiable too. Two numerical differences from the peer's backward: softplus is
exact (the peer switches to identity above 20), and dt_limit passes the gradient
where lo <= dt' <= hi, as the peer's ``_chunk_cumsum_bwd_kernel`` does
(ssd_chunk_state.py:152-160). ``selective_state_update`` (decode) stays
inference-only: its op has no autograd formula and a backward through it raises.

float32 and bfloat16 only (float16 raises TypeError naming the argument).
The peer's ``assert`` checks raise ``ArgumentError`` (ValueError and AssertionError).
"""
from __future__ import annotations

import math

import torch

from . import ops as _ops
from . import training as _training
from ._convert import get_backend
from ._peer import (ArgumentError, check_inputs, check_slots, constant_over, dense_cu_seqlens,
                    is_int, padding_to_minus_one, require, runs, slots_for)

_KERNEL_CHUNK_MULTIPLE = 16
_KERNEL_CHUNK_MAX = 128


def kernel_chunk_size(chunk_size) -> int:
    """The chunk our kernel runs for a peer ``chunk_size`` (same result, see module doc)."""
    if not is_int(chunk_size) or chunk_size < 1:
        raise ArgumentError(f"chunk_size must be a positive int, got {chunk_size!r}")
    multiple = int(chunk_size) // _KERNEL_CHUNK_MULTIPLE * _KERNEL_CHUNK_MULTIPLE
    return min(_KERNEL_CHUNK_MAX, max(_KERNEL_CHUNK_MULTIPLE, multiple))


def _segments(x, seq_idx, cu_seqlens, return_varlen_states):
    """(cu over the batch*seqlen tokens, first sequence of each row, last sequence of each row,
    sequence index of each cu_seqlens sequence or None)."""
    batch, seqlen = x.shape[:2]
    if seq_idx is None:
        cu = dense_cu_seqlens(batch, seqlen, x.device)
        first = last = list(range(batch))
        cu_list = None
    else:
        require(tuple(seq_idx.shape) == (batch, seqlen),
                f"seq_idx must have shape [batch, seqlen] = [{batch}, {seqlen}], "
                f"got {tuple(seq_idx.shape)}")
        cu_list, rows = runs(seq_idx)
        cu = torch.tensor(cu_list, dtype=torch.int32, device=x.device)
        first = [rows.index(r) for r in range(batch)]
        last = [len(rows) - 1 - rows[::-1].index(r) for r in range(batch)]
    varlen = None
    if return_varlen_states:
        require(cu_seqlens is not None, "cu_seqlens must be provided if return_varlen_states "
                                        "is True")
        require(batch == 1, "passing cu_seqlens to get the varlen states is only supported if "
                            "batch dimension is 1")
        ends = [int(e) for e in cu_seqlens.detach().cpu().tolist()]
        bounds = [0, seqlen] if cu_list is None else cu_list
        require(ends[0] == 0 and ends[-1] == seqlen and all(e in bounds for e in ends),
                f"cu_seqlens must start at 0, end at seqlen = {seqlen} and mark sequence "
                f"boundaries of seq_idx (boundaries {bounds}), got {ends}")
        varlen = [bounds.index(e) - 1 for e in ends[1:]]
    return cu, first, last, varlen


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False,
                              state_dtype=None):
    """Chunked SSD: out ``[batch, seqlen, H, P]`` (x's dtype), plus ``final_states [batch, H,
    P, N]`` (float32) and/or ``varlen_states [num_seqs, H, P, N]`` (``state_dtype``, else
    C's dtype) when asked, in the peer's order."""
    require(x.dim() == 4, f"x must have shape [batch, seqlen, nheads, headdim], "
                          f"got {tuple(x.shape)}")
    check_inputs("x", dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                           initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens),
                 integer=("seq_idx", "cu_seqlens"))
    batch, seqlen, H, P = x.shape
    require(B.dim() == 4 and tuple(B.shape[:2]) == (batch, seqlen),
            f"B must have shape [batch, seqlen, ngroups, dstate] = [{batch}, {seqlen}, *, *], "
            f"got {tuple(B.shape)}")
    N = B.shape[3]
    chunk = kernel_chunk_size(chunk_size)
    cu, first, last, varlen = _segments(x, seq_idx, cu_seqlens, return_varlen_states)
    num_seqs = cu.shape[0] - 1
    pool = torch.zeros((num_seqs, H, P, N), dtype=torch.float32, device=x.device)
    has_init = torch.zeros(num_seqs, dtype=torch.bool, device=x.device)
    if initial_states is not None:
        require(tuple(initial_states.shape) == (batch, H, P, N),
                f"initial_states must have shape [batch, nheads, headdim, dstate] = "
                f"{[batch, H, P, N]}, got {tuple(initial_states.shape)}")
        if seq_idx is None:
            pool = initial_states.to(torch.float32).clone()
            has_init = torch.ones(num_seqs, dtype=torch.bool, device=x.device)
        else:
            pool[first] = initial_states.to(torch.float32)
            has_init[first] = True
    def flat(t):      # [batch, seqlen, ...] -> [batch * seqlen, ...]
        return None if t is None else t.reshape((batch * seqlen,) + tuple(t.shape[2:]))

    precision = "fp32" if x.dtype == torch.float32 else "bf16"
    if _training.needs_grad(x, dt, A, B, C, D, z, dt_bias, initial_states):
        init = None
        if initial_states is not None:    # the pool's rows, differentiably
            init = torch.zeros_like(pool).index_copy(0, torch.tensor(first, device=x.device),
                                                     initial_states.to(torch.float32))
        y, pool = _training.ssd_train(
            flat(x), flat(dt), A, flat(B), flat(C), D=D, z=flat(z), dt_bias=dt_bias,
            dt_softplus=bool(dt_softplus), dt_limit=tuple(dt_limit), cu_seqlens=cu,
            initial_states=init, chunk_size=chunk, precision=precision, backend=get_backend())
    else:
        y = _ops.ssd_prefill(
            flat(x), flat(dt), A, flat(B), flat(C), D=D, z=flat(z), dt_bias=dt_bias,
            dt_softplus=bool(dt_softplus), dt_limit=tuple(dt_limit), cu_seqlens=cu,
            ssm_states=pool, state_indices=slots_for(num_seqs, x.device),
            has_initial_state=has_init, chunk_size=chunk, precision=precision,
            backend=get_backend())
    out = y.reshape(batch, seqlen, H, P)
    results = [out]
    if return_final_states:          # float32, as the peer's _state_passing_fwd allocates them
        results.append(pool[last] if seq_idx is not None else pool)
    if return_varlen_states:         # the peer's chunk_state_varlen: the chunk states' dtype
        results.append(pool[varlen].to(state_dtype if state_dtype is not None else C.dtype))
    return results[0] if len(results) == 1 else tuple(results)


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False, state_batch_indices=None):
    """One decode step: out ``[batch, (nheads,) dim]`` in x's dtype; ``state`` updated in place.

    state ``[batch | slots, (nheads,) dim, dstate]``; x, dt, z ``[batch, (nheads,) dim]``;
    A ``[(nheads,) dim, dstate]``; B, C ``[batch, (ngroups,) dstate]``; D, dt_bias
    ``[(nheads,) dim]``; state_batch_indices ``[batch]`` (negative = padding).
    """
    check_inputs("x", dict(x=x, state=state, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                           state_batch_indices=state_batch_indices),
                 integer=("state_batch_indices",))
    has_heads = state.dim() > 3
    if state.dim() == 3:
        state = state.unsqueeze(1)
    x = x.unsqueeze(1) if x.dim() == 2 else x
    dt = dt.unsqueeze(1) if dt.dim() == 2 else dt
    A = A.unsqueeze(0) if A.dim() == 2 else A
    B = B.unsqueeze(1) if B.dim() == 2 else B
    C = C.unsqueeze(1) if C.dim() == 2 else C
    if D is not None and D.dim() == 1:
        D = D.unsqueeze(0)
    if z is not None and z.dim() == 2:
        z = z.unsqueeze(1)
    if dt_bias is not None and dt_bias.dim() == 1:
        dt_bias = dt_bias.unsqueeze(0)
    _, nheads, dim, dstate = state.shape
    batch = x.shape[0]
    require(tuple(x.shape) == (batch, nheads, dim),
            f"x must have shape [batch, nheads, dim] = [{batch}, {nheads}, {dim}], "
            f"got {tuple(x.shape)}")
    require(dt.shape == x.shape, f"dt must have the shape of x {tuple(x.shape)}, "
                                 f"got {tuple(dt.shape)}")
    require(tuple(A.shape) == (nheads, dim, dstate),
            f"A must have shape [nheads, dim, dstate] = [{nheads}, {dim}, {dstate}], "
            f"got {tuple(A.shape)}")
    require(B.dim() == 3 and B.shape[0] == batch and B.shape[2] == dstate,
            f"B must have shape [batch, ngroups, dstate] = [{batch}, *, {dstate}], "
            f"got {tuple(B.shape)}")
    require(nheads % B.shape[1] == 0, "nheads must be divisible by ngroups")
    require(C.shape == B.shape, f"C must have the shape of B {tuple(B.shape)}, "
                                f"got {tuple(C.shape)}")
    if D is not None:
        require(tuple(D.shape) == (nheads, dim), f"D must have shape [nheads, dim] = "
                                                 f"[{nheads}, {dim}], got {tuple(D.shape)}")
        if D.stride(-1) == 0:            # per head, broadcast over dim (Mamba2)
            D = D[:, 0]
    if z is not None:
        require(z.shape == x.shape, f"z must have the shape of x {tuple(x.shape)}, "
                                    f"got {tuple(z.shape)}")
    if dt_bias is not None:
        require(tuple(dt_bias.shape) == (nheads, dim),
                f"dt_bias must have shape [nheads, dim] = [{nheads}, {dim}], "
                f"got {tuple(dt_bias.shape)}")
        dt_bias = constant_over("dt_bias", dt_bias, (1,), "dim")
    if state_batch_indices is not None:
        require(tuple(state_batch_indices.shape) == (batch,),
                f"state_batch_indices must have shape [batch] = [{batch}], "
                f"got {tuple(state_batch_indices.shape)}")
        check_slots("state_batch_indices", state_batch_indices, state.shape[0], "state")
        idx = padding_to_minus_one(state_batch_indices)
    else:
        require(state.shape[0] == batch, f"state.shape[0] must equal batch = {batch} without "
                                         f"state_batch_indices, got {state.shape[0]}")
        idx = slots_for(batch, x.device)
    dt_head = constant_over("dt", dt, (2,), "dim")
    A_head = constant_over("A", A, (1, 2), "dim and dstate")
    out = _ops.ssd_decode(x, dt_head, A_head, B, C, D=D, z=z, dt_bias=dt_bias,
                          dt_softplus=bool(dt_softplus), dt_limit=(-math.inf, math.inf),
                          ssm_states=state, state_indices=idx, backend=get_backend())
    return out if has_heads else out.squeeze(1)
