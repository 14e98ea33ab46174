"""One vLLM run in its own process (the end-to-end tests start one per configuration, since
the plugin and the backend are chosen by environment variables read at start-up).

    python run_vllm.py CONFIG.json OUT.json

CONFIG: ``model`` (a local folder), ``dtype``, ``prompts`` (lists of token ids),
``max_tokens``, ``logprobs``, and optional ``enforce_eager`` (default true),
``enable_prefix_caching``, ``max_num_batched_tokens``, ``max_num_seqs``, ``block_size``,
``speculative_config``, ``rounds`` (the prompts are generated this many times, one
``generate`` call each; prefix-cache hits come from the later rounds).
OUT: per round, per prompt, the greedy tokens and the top logprobs of each position, and the
number of prompt tokens served from the prefix cache; ``mixers``, the classes of the model's
sequence-mixing layers (which layers ran: vLLM's or nki_ssm's); ``spec``, vLLM's
speculative-decoding counters (drafts, draft tokens, accepted tokens).
"""
from __future__ import annotations

import json
import sys


def _mixer_classes(model) -> list:
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    return sorted({f"{type(m).__module__}.{type(m).__name__}" for m in model.modules()
                   if isinstance(m, MambaBase)})


def main(config_path: str, out_path: str) -> None:
    cfg = json.loads(open(config_path).read())
    from vllm import LLM, SamplingParams

    kwargs = dict(model=cfg["model"], dtype=cfg["dtype"], skip_tokenizer_init=True,
                  enforce_eager=cfg.get("enforce_eager", True), seed=0,
                  max_model_len=cfg.get("max_model_len", 512),
                  enable_prefix_caching=cfg.get("enable_prefix_caching", False),
                  max_num_seqs=cfg.get("max_num_seqs", 8),
                  # a small cache: the host has 24 GiB for every process on it
                  kv_cache_memory_bytes=cfg.get("kv_cache_memory_bytes", 64 << 20),
                  gpu_memory_utilization=0.05, disable_log_stats=False)
    for key in ("max_num_batched_tokens", "block_size", "speculative_config",
                "mamba_cache_mode"):
        if key in cfg:
            kwargs[key] = cfg[key]
    if "max_num_batched_tokens" in cfg:
        kwargs["enable_chunked_prefill"] = True
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=cfg["max_tokens"],
                            logprobs=cfg.get("logprobs", 5), detokenize=False, ignore_eos=True)
    rounds = []
    for _ in range(cfg.get("rounds", 1)):
        outs = llm.generate([{"prompt_token_ids": p} for p in cfg["prompts"]], params,
                            use_tqdm=False)
        rounds.append([{
            "tokens": list(o.outputs[0].token_ids),
            "logprobs": [{str(t): lp.logprob for t, lp in pos.items()}
                         for pos in o.outputs[0].logprobs],
            "cached_tokens": o.num_cached_tokens or 0,
        } for o in outs])
    mixers = llm.apply_model(_mixer_classes)[0]
    spec = {m.name: m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value")}
    with open(out_path, "w") as f:
        json.dump({"rounds": rounds, "mixers": mixers, "spec": spec}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
