"""Tiny random-weight hybrid models for the vLLM end-to-end tests, built from transformers
configs and saved to a local folder (no model hub; vLLM loads them with HF_HUB_OFFLINE=1).

``save(kind, folder, dtype)`` writes ``config.json`` and safetensors weights of one model:

- ``granite_hybrid``: GraniteMoeHybrid (Granite-4.0-H's architecture), a Mamba-2 layer
  (H 4 heads of P 16, G 2 groups, N 16, conv W 4) and an attention layer;
- ``qwen3_next``: Qwen3-Next, a Gated DeltaNet layer (2 q/k heads, 4 v heads,
  K = V = 64, conv W 4) and an attention layer.

``vocab`` tokens (256 by default; a small one makes n-gram drafts match often enough for
speculative decoding to accept some). Weights are the transformers initialisation from a fixed seed, with the projections
scaled up so that greedy tokens depend on the sequence mixing (at the stock init
scale a random 2-layer model's logits barely move with the context).
"""
from __future__ import annotations

import json
from pathlib import Path

VOCAB = 256
_TOKENS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=False)
_DECODER = dict(_TOKENS, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, intermediate_size=64, max_position_embeddings=4096)


def _granite_hybrid(tf, vocab: int):
    return tf.GraniteMoeHybridForCausalLM(tf.GraniteMoeHybridConfig(
        **_DECODER, vocab_size=vocab, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16,
        mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=1,
        mamba_chunk_size=16, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=32))


def _qwen3_next(tf, vocab: int):
    return tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(
        **_DECODER, vocab_size=vocab, head_dim=32, layer_types=["linear_attention", "full_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        decoder_sparse_step=1, mlp_only_layers=[]))


BUILDERS = {"granite_hybrid": _granite_hybrid, "qwen3_next": _qwen3_next}


def build(kind: str, seed: int = 0, vocab: int = VOCAB):
    """The transformers float32 model of ``kind`` (random weights from ``seed``)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    model = BUILDERS[kind](tf, vocab).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(4.0)
    return model


def save(kind: str, folder, dtype: str = "float32", seed: int = 0, vocab: int = VOCAB) -> Path:
    """Write the model of ``kind`` to ``folder`` (config.json + model.safetensors)."""
    folder = Path(folder)
    model = build(kind, seed, vocab)
    model.save_pretrained(folder, safe_serialization=True)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["dtype"] = dtype
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def greedy(folder, prompts, max_tokens: int) -> list:
    """transformers' greedy tokens (float32) for each prompt, ``max_tokens`` each (no stop
    token: ignore_eos, as the vLLM runs)."""
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
            out.append(ids[0, len(prompt):].tolist())
    return out
