"""Drop-ins for ``causal_conv1d`` (Dao-AILab/causal-conv1d 1.6.1) on the nki_ssm short-conv kernels.

``causal_conv1d_fn`` and ``causal_conv1d_update`` take the peer's arguments,
defaults and return values. Where our host API differs, these follow the peer:

- layout is channel-first ``x [batch, dim, seqlen]`` (ours: token-major), any strides;
- ``activation`` defaults to None (identity; ours: "silu"); "silu" and "swish" are the
  same function; anything else raises NotImplementedError, as the peer does;
- ``causal_conv1d_update``'s ``conv_state`` may be wider than ``W - 1`` (``state_len >=
  W - 1``: the state shifts left and the new tokens are appended, the kernel updating
  the last ``W - 1`` columns and torch ops moving the older ones), or a circular buffer
  with ``cache_seqlens`` (written at ``cache_seqlens % state_len``: the ``W - 1`` columns
  before the write position are gathered into a scratch state the kernel convolves
  from, then the new tokens are scattered into the buffer with torch ops);
- a negative ``conv_state_indices`` entry is padding (zero output, state untouched).

The varlen form that vLLM calls ``causal_conv1d_fn`` with is accepted through the
keyword-only arguments ``query_start_loc`` (``[batch + 1]`` prefix sums), ``cache_indices``,
``has_initial_state`` and ``conv_states`` (``[slots, dim, W - 1]``, updated in place with
each sequence's last ``W - 1`` inputs) on ``x [dim, total_tokens]``; ``pad_slot_id``
entries of ``cache_indices`` are padding. ``activation`` keeps the causal-conv1d default
(None) there too.

``seq_idx`` and ``conv_state_indices`` are read on the host (a graph break under
``torch.compile``); dense calls trace fully. Index arguments must have integer
dtypes (``has_initial_state`` bool) and every tensor must be on x's device.

Training: when autograd records and x, weight, bias or initial_states requires grad,
the dense and ``seq_idx`` forms run ``torch.ops.nki_ssm.short_conv_train`` (same
kernel, no pool) and return gradients for exactly the inputs the peer's
``CausalConv1dFn.backward`` does -- x, weight, bias, initial_states
(Dao-AILab/causal-conv1d 0d2252d, causal_conv1d/causal_conv1d_interface.py:67-96);
final_states are differentiable too. The varlen form (serving, in-place
``conv_states``) and ``causal_conv1d_update`` (decode) stay inference-only: their
ops have no autograd formula and a backward through them raises.

Width ``W`` may be 2..8 (the peer: 2..4); float32 and bfloat16 (float16 raises
TypeError). Errors name the argument; the peer's ``assert`` checks raise
``ArgumentError`` (a ValueError and an AssertionError).
"""
from __future__ import annotations

import torch

from . import ops as _ops
from . import training as _training
from ._convert import get_backend
from ._peer import (ArgumentError, check_inputs, check_slots, dense_cu_seqlens,
                    padding_to_minus_one, require, runs, slots_for)

_ACTIVATIONS = (None, "silu", "swish")


def _activation(activation):
    if activation not in _ACTIVATIONS:
        raise NotImplementedError("activation must be None, silu, or swish")
    return None if activation is None else "silu"


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None, *,
                     query_start_loc=None, cache_indices=None, has_initial_state=None,
                     conv_states=None, pad_slot_id=-1):
    """Causal depthwise conv1d: ``out [batch, dim, seqlen]``, or ``(out, final_states)``.

    x ``[batch, dim, seqlen]``; weight ``[dim, W]``; bias ``[dim]``; seq_idx ``[batch,
    seqlen]`` int (a new sequence wherever it changes along a row; excludes
    initial_states and return_final_states, as in the peer); initial_states ``[batch,
    dim, W - 1]``; final_states ``[batch, dim, W - 1]`` in x's dtype (written into
    final_states_out when given). Varlen form: see the module docstring.
    """
    act = _activation(activation)
    check_inputs("x", dict(x=x, weight=weight, bias=bias, seq_idx=seq_idx,
                           initial_states=initial_states, final_states_out=final_states_out,
                           query_start_loc=query_start_loc, cache_indices=cache_indices,
                           has_initial_state=has_initial_state, conv_states=conv_states),
                 integer=("seq_idx", "query_start_loc", "cache_indices"),
                 boolean=("has_initial_state",), batched=query_start_loc is None)
    if query_start_loc is not None:
        return _varlen(x, weight, bias, act, query_start_loc, cache_indices, has_initial_state,
                       conv_states, pad_slot_id)
    require(x.dim() == 3, f"x must have shape [batch, dim, seqlen], got {tuple(x.shape)}")
    require(weight.dim() == 2 and weight.shape[0] == x.shape[1],
            f"weight must have shape [dim, width] = [{x.shape[1]}, *], got {tuple(weight.shape)}")
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    if seq_idx is not None:
        require(initial_states is None, "initial_states must be None if seq_idx is not None")
        require(not return_final_states, "If seq_idx is not None, we don't return final_states_out")
        require(tuple(seq_idx.shape) == (batch, seqlen),
                f"seq_idx must have shape [batch, seqlen] = [{batch}, {seqlen}], "
                f"got {tuple(seq_idx.shape)}")
        cu_list, _ = runs(seq_idx)
        cu = torch.tensor(cu_list, dtype=torch.int32, device=x.device)
    else:
        cu = dense_cu_seqlens(batch, seqlen, x.device)
    num_seqs = cu.shape[0] - 1
    pool_shape = (num_seqs, dim, width - 1)
    if initial_states is not None:
        require(tuple(initial_states.shape) == pool_shape,
                f"initial_states must have shape [batch, dim, width - 1] = {list(pool_shape)}, "
                f"got {tuple(initial_states.shape)}")
    tokens = x.transpose(1, 2).reshape(batch * seqlen, dim)
    if _training.needs_grad(x, weight, bias, initial_states):
        y, final = _training.short_conv_train(tokens, weight, bias, activation=act, cu_seqlens=cu,
                                              initial_states=initial_states,
                                              backend=get_backend())
        return _conv_result(y, final.to(x.dtype), batch, seqlen, dim, return_final_states,
                            final_states_out)
    # a float32 pool, as the training path's: a pool in x's dtype would round float32
    # initial states to bfloat16 before the kernel reads them
    if initial_states is not None:
        pool = initial_states.to(torch.float32).clone()
    else:
        pool = x.new_zeros(pool_shape, dtype=torch.float32)
    y = _ops.short_conv_prefill(
        tokens, weight, bias, activation=act, cu_seqlens=cu, conv_states=pool,
        state_indices=slots_for(num_seqs, x.device),
        has_initial_state=torch.full((num_seqs,), initial_states is not None,
                                     dtype=torch.bool, device=x.device),
        backend=get_backend())
    return _conv_result(y, pool.to(x.dtype), batch, seqlen, dim, return_final_states,
                        final_states_out)


def _conv_result(y, final, batch, seqlen, dim, return_final_states, final_states_out):
    """The peer's return value from token-major y and the final states."""
    out = y.reshape(batch, seqlen, dim).transpose(1, 2).contiguous()
    if not return_final_states:
        return out
    if final_states_out is not None:
        final_states_out.copy_(final)
        return out, final_states_out
    return out, final


def _varlen(x, weight, bias, act, query_start_loc, cache_indices, has_initial_state,
            conv_states, pad_slot_id):
    """vLLM's varlen call: x ``[dim, total_tokens]`` -> out ``[dim, total_tokens]``."""
    require(x.dim() == 2, f"x must have shape [dim, total_tokens] with query_start_loc, "
                          f"got {tuple(x.shape)}")
    dim, _ = x.shape
    width = weight.shape[1]
    num_seqs = query_start_loc.shape[0] - 1
    device = x.device
    if cache_indices is None:
        cache_indices = slots_for(num_seqs, device)
    idx = torch.where(cache_indices == pad_slot_id, torch.full_like(cache_indices, -1),
                      cache_indices)
    if conv_states is None:          # no state to keep: a scratch pool
        conv_states = x.new_zeros((num_seqs, dim, width - 1))
        idx = slots_for(num_seqs, device)
    if has_initial_state is None:
        has_initial_state = torch.zeros(num_seqs, dtype=torch.bool, device=device)
    y = _ops.short_conv_prefill(
        x.transpose(0, 1), weight, bias, activation=act, cu_seqlens=query_start_loc,
        conv_states=conv_states, state_indices=padding_to_minus_one(idx),
        has_initial_state=has_initial_state, backend=get_backend())
    return y.transpose(0, 1).contiguous()


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """One or more new tokens per sequence; ``conv_state`` updated in place.

    x ``[batch, dim]`` or ``[batch, dim, seqlen]``; conv_state ``[batch | slots, dim,
    state_len >= W - 1]``; cache_seqlens ``[batch]`` int (circular buffer);
    conv_state_indices ``[batch]`` int (slots; negative = padding). Returns out shaped
    like x, in x's dtype.
    """
    act = _activation(activation)
    check_inputs("x", dict(x=x, conv_state=conv_state, weight=weight, bias=bias,
                           cache_seqlens=cache_seqlens, conv_state_indices=conv_state_indices),
                 integer=("cache_seqlens", "conv_state_indices"))
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    require(x3.dim() == 3, f"x must have shape [batch, dim] or [batch, dim, seqlen], "
                           f"got {tuple(x.shape)}")
    batch, dim, seqlen = x3.shape
    require(weight.dim() == 2 and weight.shape[0] == dim,
            f"weight must have shape [dim, width] = [{dim}, *], got {tuple(weight.shape)}")
    width = weight.shape[1]
    require(conv_state.dim() == 3 and conv_state.shape[1] == dim,
            f"conv_state must have shape [batch, dim, state_len] = [*, {dim}, *], "
            f"got {tuple(conv_state.shape)}")
    state_len = conv_state.shape[2]
    require(state_len >= width - 1, f"conv_state must have state_len (conv_state.shape[2]) "
                                    f">= width - 1 = {width - 1}, got {state_len}")
    if conv_state_indices is None:
        require(conv_state.shape[0] == batch, f"conv_state.shape[0] must equal batch = {batch} "
                                              f"without conv_state_indices, got "
                                              f"{conv_state.shape[0]}")
        idx = slots_for(batch, x.device)
    else:
        require(tuple(conv_state_indices.shape) == (batch,),
                f"conv_state_indices must have shape [batch] = [{batch}], "
                f"got {tuple(conv_state_indices.shape)}")
        # before the wide and circular forms gather pool rows with them
        check_slots("conv_state_indices", conv_state_indices, conv_state.shape[0], "conv_state")
        idx = padding_to_minus_one(conv_state_indices)
    tokens = x3.transpose(1, 2)                                  # [batch, seqlen, dim]
    if cache_seqlens is not None:
        out = _update_circular(tokens, x3, conv_state, weight, bias, act, cache_seqlens, idx,
                               conv_state_indices is None)
    else:
        out = _update_shift(tokens, x3, conv_state, weight, bias, act, idx,
                            conv_state_indices is None)
    out = out.transpose(1, 2)
    return out.squeeze(-1) if squeeze else out.contiguous()


def _update_shift(tokens, x3, conv_state, weight, bias, act, idx, dense):
    """Shift-left state: the kernel updates the last W-1 columns of the caller's state
    (a view); torch moves the columns before them (state_len > W - 1 only)."""
    width = weight.shape[1]
    state_len = conv_state.shape[2]
    older = state_len - (width - 1)
    if older:
        rows = conv_state if dense else conv_state[idx.clamp(min=0).long()]
        shifted = torch.cat([rows, x3.to(conv_state.dtype)], dim=-1)[..., -state_len:-(width - 1)]
    out = _ops.short_conv_decode(tokens, weight, bias, activation=act,
                                 conv_states=conv_state[..., older:], state_indices=idx,
                                 backend=get_backend())
    if older:
        if dense:
            conv_state[..., :older].copy_(shifted)
        else:
            live = idx >= 0
            conv_state[idx[live].long(), :, :older] = shifted[live]
    return out


def _update_circular(tokens, x3, conv_state, weight, bias, act, cache_seqlens, idx, dense):
    """Circular state: gather the W-1 columns before ``cache_seqlens % state_len`` into a
    scratch state, convolve on the kernel, then scatter the new tokens into the buffer."""
    batch, dim, seqlen = x3.shape
    width = weight.shape[1]
    state_len = conv_state.shape[2]
    if tuple(cache_seqlens.shape) != (batch,):
        raise ArgumentError(f"cache_seqlens must have shape [batch] = [{batch}], "
                            f"got {tuple(cache_seqlens.shape)}")
    pos = cache_seqlens.long()[:, None]
    live = idx >= 0
    rows = conv_state if dense else conv_state[idx.clamp(min=0).long()]
    window = torch.remainder(pos + torch.arange(-(width - 1), 0, device=x3.device), state_len)
    scratch = rows.gather(2, window[:, None, :].expand(-1, dim, -1)).contiguous()
    out = _ops.short_conv_decode(tokens, weight, bias, activation=act, conv_states=scratch,
                                 state_indices=torch.where(live, slots_for(batch, x3.device),
                                                           torch.full_like(idx, -1)),
                                 backend=get_backend())
    write = torch.remainder(pos + torch.arange(seqlen, device=x3.device), state_len)
    updated = rows.scatter(2, write[:, None, :].expand(-1, dim, -1), x3.to(conv_state.dtype))
    if dense:
        conv_state.copy_(torch.where(live[:, None, None], updated, conv_state))
    else:
        conv_state[idx[live].long()] = updated[live]
    return out
