"""Tiny random-config transformers models of every family nki_ssm.torch.hf patches (no downloads)."""
from __future__ import annotations

import transformers as tf

VOCAB = 64
_TOKENS = dict(vocab_size=VOCAB, pad_token_id=0, eos_token_id=None, bos_token_id=None)
_DECODER = dict(_TOKENS, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=48)
# Mamba-2 mixer: H = 4 heads of P = 8 (expand 1 x hidden 32), G = 2 groups, N = 16, W = 4
_MAMBA = dict(mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=16,
              mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=16)
_GDN = dict(head_dim=8, layer_types=["linear_attention", "full_attention"],
            linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4)


def _qwen3_next():
    return tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(
        **_DECODER, **_GDN, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16))


def _qwen3_5():
    return tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**_DECODER, **_GDN))


def _qwen3_5_moe():
    return tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(
        **_DECODER, **_GDN, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16))


def _mamba2():
    return tf.Mamba2ForCausalLM(tf.Mamba2Config(
        **_TOKENS, hidden_size=32, num_hidden_layers=2, num_heads=8, head_dim=8, n_groups=2,
        state_size=16, conv_kernel=4, chunk_size=8, expand=2))


def _bamba():
    return tf.BambaForCausalLM(tf.BambaConfig(
        **_DECODER, **_MAMBA, attn_layer_indices=[1]))


def _granitemoehybrid():
    return tf.GraniteMoeHybridForCausalLM(tf.GraniteMoeHybridConfig(
        **_DECODER, **_MAMBA, layer_types=["mamba", "attention"], num_local_experts=4,
        num_experts_per_tok=2, shared_intermediate_size=16))


def _falcon_h1():
    return tf.FalconH1ForCausalLM(tf.FalconH1Config(
        **_DECODER, **_MAMBA, mamba_d_ssm=32, head_dim=8, mamba_rms_norm=True))


def _nemotron_h():
    return tf.NemotronHForCausalLM(tf.NemotronHConfig(
        **{k: v for k, v in _DECODER.items() if k != "num_hidden_layers"},
        layers_block_type=["mamba", "attention"], mamba_num_heads=4, mamba_head_dim=8,
        n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=16, head_dim=8))


def _zamba2():
    return tf.Zamba2ForCausalLM(tf.Zamba2Config(
        **_DECODER, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_headdim=8,
        mamba_ngroups=2, chunk_size=16, layers_block_type=["mamba", "hybrid"],
        num_mem_blocks=1, adapter_rank=4))


BUILDERS = {
    "qwen3_next": _qwen3_next, "qwen3_5": _qwen3_5, "qwen3_5_moe": _qwen3_5_moe, "mamba2": _mamba2, "bamba": _bamba,
    "granitemoehybrid": _granitemoehybrid, "falcon_h1": _falcon_h1, "nemotron_h": _nemotron_h,
    "zamba2": _zamba2,
}
