"""Drop-ins for flash-linear-attention's Gated DeltaNet ops (``fla.ops.gated_delta_rule``, 0.6).

``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` take FLA's
arguments, defaults and return values: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``
(GVA: ``HV % H == 0``), g (log decay) and beta ``[B, T, HV]``; with ``cu_seqlens``
(``[N + 1]`` prefix sums) ``B`` must be 1 and the ``N`` sequences are packed along T.
They return ``(o [B, T, HV, V] in q's dtype, final_state)`` where final_state is
``[N, HV, K, V]`` float32 (``[N, HV, V, K]`` with ``state_v_first``) when
``output_final_state``, else None. ``initial_state`` is read, never written (ours:
an in-place pool; here a float32 scratch pool per call holds it).

Gates as FLA's kernels fuse them: ``use_gate_in_kernel`` (g is the raw ``a``
projection, ``g = -exp(A_log) * softplus(a + dt_bias)``), ``use_beta_sigmoid_in_kernel``
(beta is raw, ``sigmoid``), ``allow_neg_eigval`` (beta doubled). With both raw
gates (and no ``allow_neg_eigval``) our kernel computes them; otherwise the gates
are formed in float32 torch first. ``scale`` defaults to ``K ** -0.5``;
``use_qk_l2norm_in_kernel`` normalises q and k per token (``x / sqrt(sum x^2 + 1e-6)``).

Not supported (NotImplementedError naming it): ``cp_context`` (context
parallelism), and in the recurrent form ``gk`` / ``gv`` (per-key / per-value
decay) and element-wise beta ``[B, T, HV, V]``. ``chunk_size`` (keyword) must be
16, 32 or 64 as in FLA. ``chunk_indices`` / ``cu_seqlens_cpu`` are accepted and
unused (our kernels build their own tables). The fused recurrent form with
``cu_seqlens`` runs the chunked kernel (same math; our decode kernel takes equal
token counts per sequence). ``beta=None`` means ones ``[B, T, HV]``.

Training: when autograd records and q, k, v, g, beta, A_log, dt_bias or
initial_state requires grad, the chunked form runs
``torch.ops.nki_ssm.gated_delta_train`` (same kernel, no pool) and returns gradients
for exactly the inputs FLA's ``ChunkGatedDeltaRuleFunction.backward`` does -- q, k, v,
g, beta, initial_state, and A_log, dt_bias with ``use_gate_in_kernel``
(fla-org/flash-linear-attention bc3b101, fla/ops/gated_delta_rule/chunk.py:340-391);
final_state is differentiable too. The recurrent form on dense batches (decode) stays
inference-only, as FLA's own fused recurrent backward is (it raises
NotImplementedError there): a backward through it raises.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import ops as _ops
from . import training as _training
from ._convert import get_backend
from ._peer import check_inputs, dense_cu_seqlens, is_int, slots_for

_CHUNK_SIZES = (16, 32, 64)


def _check_heads(q, k, v):
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must have the same number of heads, but got "
                         f"q.shape[2]={q.shape[2]} and k.shape[2]={k.shape[2]}")
    H, HV = q.shape[2], v.shape[2]
    if HV % H != 0:
        raise ValueError(f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by "
                         f"num_heads (H={H}), but got HV % H = {HV % H}")


def _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias):
    """Devices (q's), cu_seqlens' integer dtype and the batch, under FLA's names."""
    check_inputs("q", dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                           cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias),
                 integer=("cu_seqlens",))


def _gates(g, beta, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
           allow_neg_eigval) -> dict:
    """Keyword gates of the custom ops: raw (a, b, A_log, dt_bias) or (g, beta)."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    if use_gate_in_kernel and A_log is None:
        raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True`.")
    HV = beta.shape[-1]
    if use_gate_in_kernel and dt_bias is None:
        dt_bias = beta.new_zeros((HV,), dtype=torch.float32)
    if use_gate_in_kernel and use_beta_sigmoid_in_kernel and not allow_neg_eigval:
        return dict(a=g, b=beta, A_log=A_log.float(), dt_bias=dt_bias.float())
    if use_gate_in_kernel:
        g = -A_log.float().exp() * F.softplus(g.float() + dt_bias.float())
    if use_beta_sigmoid_in_kernel:
        beta = beta.float().sigmoid() * (2.0 if allow_neg_eigval else 1.0)
    return dict(g=g, beta=beta)


def _pool(initial_state, num_seqs, HV, K, V, state_v_first, device):
    """float32 scratch pool ``[N, HV, K, V]`` holding initial_state (or zeros)."""
    if initial_state is None:
        return torch.zeros((num_seqs, HV, K, V), dtype=torch.float32, device=device)
    if initial_state.shape[0] != num_seqs:
        raise ValueError(f"The number of initial states is expected to be equal to the number "
                         f"of input sequences, i.e., {num_seqs} rather than "
                         f"{initial_state.shape[0]}.")
    state = initial_state.transpose(-1, -2) if state_v_first else initial_state
    expected = (num_seqs, HV, K, V)
    if tuple(state.shape) != expected:
        layout = "[N, HV, V, K]" if state_v_first else "[N, HV, K, V]"
        shown = (num_seqs, HV, V, K) if state_v_first else expected
        raise ValueError(f"initial_state must have shape {layout} = {list(shown)}, "
                         f"got {tuple(initial_state.shape)}")
    return state.to(torch.float32).clone().contiguous()


def _run(q, k, v, gates, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
         state_v_first, cu_seqlens, chunk_size, recurrent):
    _check_heads(q, k, v)
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    if cu_seqlens is not None:
        if q.shape[0] != 1:
            raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} when "
                             f"using `cu_seqlens`.Please flatten variable-length inputs before "
                             f"processing.")
        cu = cu_seqlens        # an integer dtype (checked); the op checks its values
    else:
        cu = dense_cu_seqlens(B, T, q.device)
    num_seqs = cu.shape[0] - 1
    pool = _pool(initial_state, num_seqs, HV, K, V, state_v_first, q.device)
    if not recurrent and _training.needs_grad(q, k, v, initial_state, *gates.values()):
        o, final = _training.gated_delta_train(
            q.reshape(B * T, H, K), k.reshape(B * T, H, K), v.reshape(B * T, HV, V),
            **{n: t.reshape((B * T,) + tuple(t.shape[2:])) if n in ("g", "beta", "a", "b")
               else t for n, t in gates.items()},
            scale=scale, use_qk_l2norm=bool(use_qk_l2norm_in_kernel), cu_seqlens=cu,
            initial_states=None if initial_state is None else pool, chunk_size=chunk_size,
            backend=get_backend())
        o = o.reshape(B, T, HV, V)
        if not output_final_state:
            return o, None
        return o, final.transpose(-1, -2).contiguous() if state_v_first else final
    slots = slots_for(num_seqs, q.device)
    common = dict(scale=scale, use_qk_l2norm=bool(use_qk_l2norm_in_kernel), ssm_states=pool,
                  state_indices=slots, backend=get_backend())
    if recurrent and cu_seqlens is None:
        o = _ops.gated_delta_decode(q, k, v, **gates, **common)
    else:
        flat = {n: t.reshape((B * T,) + tuple(t.shape[2:])) for n, t in gates.items()
                if n in ("g", "beta", "a", "b")}
        heads = {n: t for n, t in gates.items() if n in ("A_log", "dt_bias")}
        o = _ops.gated_delta_prefill(
            q.reshape(B * T, H, K), k.reshape(B * T, H, K), v.reshape(B * T, HV, V),
            **flat, **heads, cu_seqlens=cu,
            has_initial_state=torch.full((num_seqs,), initial_state is not None,
                                         dtype=torch.bool, device=q.device),
            chunk_size=chunk_size, **common)
        o = o.reshape(B, T, HV, V)
    final = None
    if output_final_state:
        final = pool.transpose(-1, -2).contiguous() if state_v_first else pool
    return o, final


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                           chunk_indices=None, cp_context=None, **kwargs):
    """FLA's ``chunk_gated_delta_rule`` on the nki_ssm chunked kernel -> ``(o, final_state)``."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated "
                             "`transpose_state_layout`.")
        state_v_first = kwargs.pop("transpose_state_layout")
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in "
                                 "`[B, T, H, ...]` format.")
    if cp_context is not None:
        raise NotImplementedError("cp_context (context parallelism) is not supported by the "
                                  "nki_ssm drop-in")
    chunk_size = kwargs.pop("chunk_size", 64)
    if not is_int(chunk_size) or chunk_size not in _CHUNK_SIZES:
        raise ValueError(f"`chunk_size` must be 16, 32, or 64 for Gated Delta Rule, "
                         f"got {chunk_size}.")
    _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens, kwargs.get("A_log"),
                  kwargs.get("dt_bias"))
    _check_heads(q, k, v)
    gates = _gates(g, beta, kwargs.get("use_gate_in_kernel", False), kwargs.get("A_log"),
                   kwargs.get("dt_bias"), use_beta_sigmoid_in_kernel, allow_neg_eigval)
    return _run(q, k, v, gates, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, state_v_first, cu_seqlens, chunk_size, False)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                                     initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                                     allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, **kwargs):
    """FLA's ``fused_recurrent_gated_delta_rule`` on the nki_ssm kernels -> ``(o, final_state)``."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated "
                             "`transpose_state_layout`.")
        state_v_first = kwargs.pop("transpose_state_layout")
    for name, value in (("gk", gk), ("gv", gv)):
        if value is not None:
            raise NotImplementedError(f"{name} (per-key / per-value decay) is not supported by "
                                      f"the nki_ssm drop-in; pass the per-head decay g")
    _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias)
    _check_heads(q, k, v)
    B, T = q.shape[:2]
    HV = v.shape[2]
    if use_gate_in_kernel and g is None:
        raise ValueError("`g` (raw pre-activation) must be provided when "
                         "`use_gate_in_kernel=True`.")
    if beta is None:
        beta = torch.ones((B, T, HV), dtype=q.dtype, device=q.device)
    if beta.dim() == 4:
        raise NotImplementedError("element-wise beta [B, T, HV, V] is not supported by the "
                                  "nki_ssm drop-in; pass beta [B, T, HV]")
    if g is None:
        g = torch.zeros((B, T, HV), dtype=torch.float32, device=q.device)
    gates = _gates(g, beta, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                   allow_neg_eigval)
    return _run(q, k, v, gates, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, state_v_first, cu_seqlens, 64, True)


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
