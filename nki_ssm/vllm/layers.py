"""vLLM's Gated DeltaNet and Mamba-2 layers with their sequence mixing on nki_ssm's ops.

Each class subclasses vLLM's own layer and is registered in its place
(``PluggableLayer.register_oot``; vLLM 0.32's ``PluggableLayer.__new__`` instantiates the
registered class whenever a model builds the stock one:
https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/model_executor/custom_op.py).
Weights, projections, norms, the KV-cache spec and the metadata stay vLLM's; only the work
between the input and output projections changes:

- ``GatedDeltaNet`` (for ``QwenGatedDeltaNetAttention``, vllm/model_executor/layers/mamba/
  gdn/qwen_gdn_linear_attn.py): ``forward`` splits the projections as vLLM's
  ``forward_cuda`` does and calls vLLM's custom op ``torch.ops.vllm.qwen_gdn_attention_core``,
  which looks the layer up and calls its ``_forward_core``: ours, which runs the conv and the
  gated delta rule (raw gates a, b, A_log, dt_bias; q/k L2 norm in the op) on
  ``torch.ops.nki_ssm.*``.
- ``Mamba2Mixer`` (for ``MambaMixer2``, vllm/model_executor/layers/mamba/mamba_mixer2.py):
  vLLM's ``forward`` calls
  its custom op ``torch.ops.vllm.mamba_mixer2``, which calls the layer's
  ``conv_ssm_forward``: ours, which runs the conv and the SSD scan (softplus(dt + dt_bias),
  D skip; the z gate stays in vLLM's norm) on ``torch.ops.nki_ssm.*``.

Going through vLLM's own custom ops keeps the sequence mixing opaque to torch.compile (the
op reads the per-step metadata from vLLM's forward context) and keeps vLLM's graph
splitting at the same ops, so eager and compiled runs execute the same code.

State tensors, in place (``MambaBase.bind_kv_cache`` carves them out of one page per
block, so each is a strided view that the host API reads and writes slot by slot):

- conv state: vLLM's default "SD" layout is ``[slots, W-1 (+ num_spec), dim]``; its kernels
  take ``.transpose(-1, -2)``, which is our ``[slots, dim, W-1]`` (the first W-1 columns of
  the wider speculative buffer);
- Gated DeltaNet state: declared ``[slots, HV, V, K]`` (vLLM's FLA kernels index it
  ``i_hv*V*K + v*K + k``, third_party/flash_linear_attention/ops/fused_sigmoid_gating.py);
  ours is its ``.transpose(-1, -2)``, ``[slots, HV, K, V]``;
- Mamba-2 state: ``[slots, H, P, N]``, ours.

Slots: vLLM's null block 0 (NULL_BLOCK_ID, vllm/v1/attention/backends/utils.py) and pad
slot -1 are both our padding, -1. Batches hold decodes first, then prefills
(``split_decodes_and_prefills``); a one-token continuation is a decode.

Prefix caching (``mamba_cache_mode="align"``): vLLM's scheduler splits a prefill at block
boundaries unless every Mamba layer's KV-cache spec says it can export block-boundary states
from inside a prefill (``num_prefill_checkpoint_blocks``, v1/core/sched/scheduler.py
``_mamba_block_aligned_split``). Our layers declare none (``MambaMixer2`` stock declares one),
so every chunk ends on a block boundary and each step reads and writes one slot per request,
the one vLLM's align copy has prepared (v1/worker/mamba_utils.py).

Speculative decoding: a speculative row's T = 1 + drafts tokens start from the state of
its last accepted token (column ``num_accepted_tokens[i] - 1`` of its state indices) and
the state after token t goes to column t, as vLLM's kernels do
(``fused_sigmoid_gating_delta_rule_update``, ``selective_state_update`` with
``num_accepted_tokens``): Gated DeltaNet in one ``gated_delta_decode`` call with per-token
states returned, Mamba-2 in T one-token ``ssd_decode`` steps, each column first taking
the state of the one before it. The conv state is vLLM's rolling buffer of
W-1+num_spec columns, read from column ``num_accepted_tokens[i] - 1``
(``causal_conv1d_update`` with ``num_accepted_tokens``, mamba/ops/causal_conv1d.py).
ReplaySSM and LoRA are refused.
"""
from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention,
)
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2 as _VllmMambaMixer2
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.utils.torch_utils import _encode_layer_name
from vllm.v1.kv_cache_interface import MambaSpec

from nki_ssm.torch import ops as nki

def _metadata(layer, checkpoints: str):
    """``layer``'s attention metadata for the current step, None in a profiling run (no
    states bound yet). Prefill checkpoints (metadata field ``checkpoints``) are an error: our
    layers declare none."""
    metadata = get_forward_context().attn_metadata
    md = metadata.get(layer.prefix) if isinstance(metadata, dict) else None
    if md is not None and getattr(md, checkpoints) is not None:
        raise RuntimeError(f"nki_ssm's {type(layer).__name__} got prefill checkpoints it did "
                           "not declare (num_prefill_checkpoint_blocks)")
    return md


def _slots(indices: torch.Tensor) -> torch.Tensor:
    """vLLM state indices -> ours: the null block (0) and pad slot (-1) become -1, int32."""
    indices = indices.to(torch.int32)
    return torch.where(indices > 0, indices, torch.full_like(indices, -1))


def _conv_buffer(kv_cache: tuple) -> torch.Tensor:
    """The conv state as ``[slots, dim, state_len]`` (a view of vLLM's tensor)."""
    conv = kv_cache[0]
    return conv if is_conv_state_dim_first() else conv.transpose(-1, -2)


def _activation(name) -> str | None:
    if name in ("silu", "swish"):
        return "silu"
    if name is None:
        return None
    raise ValueError(f"nki_ssm's short conv supports SiLU or no activation, got {name!r}")


def _conv_weight(conv1d) -> torch.Tensor:
    """The ``[dim, W]`` conv weight. On CPUs with AVX-512 BF16 vLLM packs a bfloat16 width-4
    weight in place for its own kernel and keeps the plain one beside it
    (``dispatch_cpu_unquantized_gemm``, vllm/model_executor/layers/utils.py)."""
    plain = getattr(conv1d, "_cpu_unpacked_conv_weight", None)
    if plain is not None:
        return plain
    return conv1d.weight.view(conv1d.weight.size(0), conv1d.weight.size(2))


def _flag(values, n: int) -> torch.Tensor:
    """``has_initial_state`` as bool ``[n]`` (None: no sequence has one)."""
    if values is None:
        return torch.zeros(n, dtype=torch.bool)
    return values[:n].to(torch.bool)


def _rolling_conv(xs: torch.Tensor, conv_buf: torch.Tensor, slots: list, accepted: list,
                  conv_args: dict) -> torch.Tensor:
    """Conv of speculative rows ``xs [rows, T, dim]`` on vLLM's rolling conv buffer
    (``conv_buf [slots, dim, W-1+num_spec]``): row i's state is the W-1 columns of its
    buffer (slot ``slots[i]``) from ``accepted[i] - 1``; afterwards the buffer holds those
    columns but the first, then the T new inputs (``causal_conv1d_update`` with
    ``num_accepted_tokens``, vllm/model_executor/layers/mamba/ops/causal_conv1d.py)."""
    width = conv_args["weight"].size(-1)
    length = xs.size(1)
    state = torch.stack([conv_buf[s, :, a - 1: a - 1 + width - 1] if s > 0
                         else conv_buf.new_zeros(conv_buf.shape[1], width - 1)
                         for s, a in zip(slots, accepted)])
    y = nki.short_conv_decode(xs, **conv_args, conv_states=state.clone(),
                              state_indices=torch.tensor(
                                  [j if s > 0 else -1 for j, s in enumerate(slots)],
                                  dtype=torch.int32))
    for j, s in enumerate(slots):
        if s > 0:
            conv_buf[s, :, : width - 2] = state[j, :, 1:]
            conv_buf[s, :, width - 2: width - 2 + length] = xs[j].transpose(0, 1).to(
                conv_buf.dtype)
    return y


def _spec_groups(query_start_loc: torch.Tensor, rows: int):
    """Speculative rows grouped by length: ``(T, rows of that length, their token indices
    [rows * T])`` for each length T > 0 (a row's tokens are contiguous)."""
    cu = query_start_loc[: rows + 1].to(torch.int64).tolist()
    lengths = [cu[i + 1] - cu[i] for i in range(rows)]
    for length in sorted(set(lengths) - {0}):
        group = [i for i in range(rows) if lengths[i] == length]
        yield length, group, torch.tensor([cu[i] + t for i in group for t in range(length)])


# ------------------------------------------------------------------ Gated DeltaNet

class GatedDeltaNet(QwenGatedDeltaNetAttention):
    """vLLM's Qwen3-Next / Qwen3.5 Gated DeltaNet layer with the conv and the gated delta
    rule on nki_ssm's ops (module docstring)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "in_proj_qkv"):
            raise NotImplementedError("nki_ssm's Gated DeltaNet layer does not support LoRA "
                                      "(separate in_proj_qkv / in_proj_z)")
        num_tokens = hidden_states.size(0)
        mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
        ba, _ = self.in_proj_ba(hidden_states)
        if self.gqa_interleaved_layout:      # Qwen3-Next: unpack the interleaved layout
            query, key, value, z, b, a = self.fix_query_key_value_ordering(mixed_qkvz, ba)
            mixed_qkv = torch.cat([t.reshape(num_tokens, -1) for t in (query, key, value)],
                                  dim=-1)
        else:                                # Qwen3.5: [q, k, v, z] and [b, a]
            qkv_size = (self.key_dim * 2 + self.value_dim) // self.tp_size
            mixed_qkv, z = mixed_qkvz.split([qkv_size, self.value_dim // self.tp_size], -1)
            z = z.reshape(num_tokens, -1, self.head_v_dim)
            b, a = self.split_ba(ba)
        core_attn_out = torch.zeros(
            (num_tokens, self.num_v_heads // self.tp_size, self.head_v_dim),
            dtype=hidden_states.dtype, device=hidden_states.device)
        torch.ops.vllm.qwen_gdn_attention_core(
            mixed_qkv, b.contiguous(), a.contiguous(), core_attn_out,
            layer_name=_encode_layer_name(self.prefix))
        return self._output_projection(core_attn_out, z)

    # -- the custom op's body

    def _forward_core(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      core_attn_out: torch.Tensor) -> None:
        md = _metadata(self, "checkpoint")
        if md is None:
            return
        n = md.num_actual_tokens
        mixed_qkv, b, a = mixed_qkv[:n], b[:n], a[:n]
        conv_buf = _conv_buffer(self.kv_cache)
        conv_pool = conv_buf[..., : _conv_weight(self.conv1d).size(-1) - 1]
        ssm_pool = self.kv_cache[1].transpose(-1, -2)          # [slots, HV, K, V]
        if md.spec_sequence_masks is None:
            self._non_spec(md, mixed_qkv, b, a, core_attn_out, conv_pool, ssm_pool)
            return
        if md.num_prefills == 0 and md.num_decodes == 0:
            spec_index = None
            spec_x, spec_b, spec_a = mixed_qkv, b, a
        else:
            spec_index = md.spec_token_indx
            spec_x, spec_b, spec_a = (t.index_select(0, spec_index) for t in (mixed_qkv, b, a))
        spec_out = self._spec(md, spec_x, spec_b, spec_a, conv_buf, ssm_pool)
        if spec_index is None:
            core_attn_out[: spec_out.size(0)] = spec_out
            return
        core_attn_out.index_copy_(0, spec_index, spec_out)
        if md.num_prefills > 0:      # decodes beside speculative rows count as prefills
            rest = md.non_spec_token_indx
            out = self._prefill(md, *(t.index_select(0, rest) for t in (mixed_qkv, b, a)),
                                conv_pool, ssm_pool)
            core_attn_out.index_copy_(0, rest, out)

    def _conv_args(self) -> dict:
        return dict(weight=_conv_weight(self.conv1d), bias=self.conv1d.bias,
                    activation=_activation(self.activation))

    def _gates(self) -> dict:
        return dict(A_log=self.A_log, dt_bias=self.dt_bias, use_qk_l2norm=True)

    def _split_qkv(self, y: torch.Tensor, lead: tuple):
        """Conv output ``[tokens, conv_dim]`` -> q, k ``[*lead, H, K]``, v ``[*lead, HV, V]``."""
        kd, vd = self.key_dim // self.tp_size, self.value_dim // self.tp_size
        q, k, v = y.split([kd, kd, vd], dim=-1)
        return (q.reshape(*lead, -1, self.head_k_dim), k.reshape(*lead, -1, self.head_k_dim),
                v.reshape(*lead, -1, self.head_v_dim))

    def _non_spec(self, md, mixed_qkv, b, a, core_attn_out, conv_pool, ssm_pool) -> None:
        nd = md.num_decode_tokens
        if md.num_decodes > 0:
            idx = _slots(md.non_spec_state_indices_tensor[: md.num_decodes])
            y = nki.short_conv_decode(mixed_qkv[:nd], **self._conv_args(),
                                      conv_states=conv_pool, state_indices=idx)
            q, k, v = self._split_qkv(y, (nd, 1))
            o = nki.gated_delta_decode(q, k, v, a=a[:nd, None], b=b[:nd, None],
                                       **self._gates(), ssm_states=ssm_pool,
                                       state_indices=idx)
            core_attn_out[:nd] = o[:, 0]
        if md.num_prefills > 0:
            end = nd + md.num_prefill_tokens
            core_attn_out[nd:end] = self._prefill(md, mixed_qkv[nd:end], b[nd:end],
                                                  a[nd:end], conv_pool, ssm_pool)

    def _prefill(self, md, x, b, a, conv_pool, ssm_pool) -> torch.Tensor:
        """The prefill rows (``md.prefill_*``: the prefill tail of the batch) -> o."""
        count = md.num_prefills
        cu = md.prefill_query_start_loc[: count + 1].to(torch.int32)
        idx = _slots(md.prefill_state_indices[:count])
        has = _flag(md.prefill_has_initial_state, count)
        tokens = int(cu[-1])
        y = nki.short_conv_prefill(x[:tokens], **self._conv_args(), cu_seqlens=cu,
                                   conv_states=conv_pool, state_indices=idx,
                                   has_initial_state=has)
        q, k, v = self._split_qkv(y, (tokens,))
        o = nki.gated_delta_prefill(q, k, v, a=a[:tokens], b=b[:tokens], **self._gates(),
                                    cu_seqlens=cu, ssm_states=ssm_pool, state_indices=idx,
                                    has_initial_state=has)
        if tokens < x.size(0):
            o = torch.cat([o, o.new_zeros((x.size(0) - tokens,) + tuple(o.shape[1:]))])
        return o

    def _spec(self, md, x, b, a, conv_buf, ssm_pool) -> torch.Tensor:
        """The speculative rows: each row's 1 + drafts tokens from its last accepted state,
        the state after every token committed to that token's slot."""
        rows = md.num_spec_decodes
        accepted = md.num_accepted_tokens[:rows].to(torch.int64).tolist()
        table = md.spec_state_indices_tensor[:rows].to(torch.int64)
        out = x.new_zeros((x.size(0), self.num_v_heads // self.tp_size, self.head_v_dim))
        for length, group, tokens in _spec_groups(md.spec_query_start_loc, rows):
            xs = x.index_select(0, tokens).reshape(len(group), length, -1)
            y = _rolling_conv(xs, conv_buf, [int(table[i, 0]) for i in group],
                              [accepted[i] for i in group], self._conv_args())
            q, k, v = self._split_qkv(y.reshape(len(group) * length, -1), (len(group), length))
            start = torch.tensor([table[i, accepted[i] - 1] for i in group])
            o, states = nki.gated_delta_decode(
                q, k, v, a=a.index_select(0, tokens).reshape(len(group), length, -1),
                b=b.index_select(0, tokens).reshape(len(group), length, -1), **self._gates(),
                ssm_states=ssm_pool, state_indices=_slots(start),
                return_intermediate_states=True)
            for j, i in enumerate(group):
                for t in range(length):
                    slot = int(table[i, t])
                    if slot > 0 and int(start[j]) > 0:
                        ssm_pool[slot] = states[j, t]
            out.index_copy_(0, tokens, o.reshape(len(group) * length, *o.shape[2:]))
        return out


# ------------------------------------------------------------------ Mamba-2

class Mamba2Mixer(_VllmMambaMixer2):
    """vLLM's Mamba-2 mixer with the conv and the SSD scan on nki_ssm's ops (module
    docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.use_replayssm:
            raise NotImplementedError("nki_ssm's MambaMixer2 does not support ReplaySSM "
                                      "(--use-replayssm)")

    def get_kv_cache_spec(self, vllm_config):
        """MambaBase's spec: no prefill checkpoints, so in align mode the scheduler ends
        every prefill chunk on a block boundary (module docstring)."""
        spec = super().get_kv_cache_spec(vllm_config)
        if isinstance(spec, MambaSpec):
            from dataclasses import replace

            spec = replace(spec, num_prefill_checkpoint_blocks=0,
                           prefill_checkpoint_alignment=None)
        return spec

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor) -> None:
        hidden_states_B_C, dt = torch.split(
            projected_states[..., self.tped_intermediate_size:],
            [self.tped_conv_size, self.tped_dt_size], dim=-1)
        md = _metadata(self, "checkpoint_chunk_idx")
        if md is None:
            return
        conv_pool = _conv_buffer(self.kv_cache)[..., : self.conv_kernel_size - 1]
        ssm_pool = self.kv_cache[1]
        nd, npf = md.num_decode_tokens, md.num_prefill_tokens
        if md.num_decodes > 0 and md.num_accepted_tokens is not None:
            self._spec(md, hidden_states_B_C[:nd], dt[:nd], output[:nd], ssm_pool)
        elif md.num_decodes > 0:
            idx = _slots(md.state_indices_tensor_d[: md.num_decodes, 0])
            x = nki.short_conv_decode(hidden_states_B_C[:nd], **self._conv_args(),
                                      conv_states=conv_pool, state_indices=idx)
            output[:nd] = nki.ssd_decode(*self._ssd_inputs(x, dt[:nd]), **self._ssd_args(),
                                         ssm_states=ssm_pool,
                                         state_indices=idx).reshape(nd, -1)
        if md.num_prefills > 0:
            count = md.num_prefills
            cu = md.query_start_loc_p[: count + 1].to(torch.int32)
            tokens = int(cu[-1])
            idx = _slots(md.state_indices_tensor_p[:count])
            has = _flag(md.has_initial_states_p, count)
            x = nki.short_conv_prefill(hidden_states_B_C[nd: nd + tokens],
                                       **self._conv_args(), cu_seqlens=cu,
                                       conv_states=conv_pool, state_indices=idx,
                                       has_initial_state=has)
            fp32 = x.dtype == torch.float32
            output[nd: nd + tokens] = nki.ssd_prefill(
                *self._ssd_inputs(x, dt[nd: nd + tokens]), **self._ssd_args(), cu_seqlens=cu,
                ssm_states=ssm_pool, state_indices=idx, has_initial_state=has,
                precision="fp32" if fp32 else "bf16").reshape(tokens, -1)

    def _spec(self, md, x, dt, output, ssm_pool) -> None:
        """Speculative decoding: the decode rows' 1 + drafts tokens from the state of each
        row's last accepted token, the state after token t committed to the row's column t
        (vLLM's ``selective_state_update`` with ``num_accepted_tokens`` and
        ``dst_state_batch_indices``): one ``ssd_decode`` token step per column, each column
        first taking the state of the one before it."""
        rows = md.num_decodes
        accepted = md.num_accepted_tokens[:rows].to(torch.int64).tolist()
        table = md.state_indices_tensor_d[:rows].to(torch.int64)
        conv_buf = _conv_buffer(self.kv_cache)
        for length, group, tokens in _spec_groups(md.query_start_loc_d, rows):
            xs = x.index_select(0, tokens).reshape(len(group), length, -1)
            y = _rolling_conv(xs, conv_buf, [int(table[i, 0]) for i in group],
                              [accepted[i] for i in group], self._conv_args())
            xh, dt_, A, B, C = self._ssd_inputs(
                y.reshape(len(group) * length, -1), dt.index_select(0, tokens))
            lead = (len(group), length)
            xh, dt_, B, C = (t.reshape(*lead, *t.shape[1:]) for t in (xh, dt_, B, C))
            live = [int(table[i, accepted[i] - 1]) > 0 for i in group]
            out = []
            for t in range(length):
                source = [table[i, accepted[i] - 1] if t == 0 else table[i, t - 1]
                          for i in group]
                column = torch.stack([table[i, t] for i in group])
                for j, ok in enumerate(live):
                    if ok and int(column[j]) > 0 and int(source[j]) != int(column[j]):
                        ssm_pool[column[j]] = ssm_pool[source[j]]
                idx = torch.where(torch.tensor(live), column, torch.zeros_like(column))
                out.append(nki.ssd_decode(xh[:, t], dt_[:, t], A, B[:, t], C[:, t],
                                          **self._ssd_args(), ssm_states=ssm_pool,
                                          state_indices=_slots(idx)))
            y_rows = torch.stack(out, dim=1)                  # [rows, T, H, P]
            output.index_copy_(0, tokens, y_rows.reshape(len(group) * length, -1))

    def _conv_args(self) -> dict:
        return dict(weight=self.conv_weights, bias=self.conv1d.bias,
                    activation=_activation(self.activation))

    def _ssd_args(self) -> dict:
        return dict(D=self.D, dt_bias=self.dt_bias, dt_softplus=True,
                    dt_limit=(0.0, float("inf")))

    def _ssd_inputs(self, conv_out: torch.Tensor, dt: torch.Tensor):
        """(x ``[T, H, P]``, dt ``[T, H]``, A ``[H]``, B, C ``[T, G, N]``) from the conv output."""
        x, B, C = self.split_hidden_states_B_C_fn(conv_out)
        tokens = conv_out.size(0)
        groups = self.n_groups // self.tp_size
        return (x.reshape(tokens, -1, self.head_dim), dt, self.A,
                B.reshape(tokens, groups, -1), C.reshape(tokens, groups, -1))


def register() -> None:
    """Put our layers in vLLM's out-of-tree layer registry (once per process)."""
    for name, cls in (("QwenGatedDeltaNetAttention", GatedDeltaNet),
                      ("MambaMixer2", Mamba2Mixer)):
        if op_registry_oot.get(name) is not cls:
            PluggableLayer.register_oot(cls, name=name)
