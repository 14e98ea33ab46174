"""One H100's measured times at nki_ssm's shapes: the yardstick of the report's per-chip table.

Forward figures (``H100_NS``) and training-step figures, forward + backward
(``H100_TRAINING_NS``, ``TRAINING_SOURCE``), at the same shapes.

The figures were measured for this project on a rented GPU (nothing here
runs on one): one H100 SXM 80GB, measured 2026-11-24 with ``triton.testing.do_bench`` (warm-up 50,
300 ms of repetitions), eager PyTorch 2.11 + Triton 3.6, no CUDA graphs, bf16
data, float32 states, random inputs with realistic gates. Peers:
flash-linear-attention (fla-core 0.6.0), mamba_ssm (main, Triton SSD path),
FLA's Triton causal conv.

A trn2 chip is 8 physical NeuronCores (4 logical cores of 2 at LNC=2: the
same silicon; aws-neuron-sdk logical-neuroncore-config.rst); a trn3 chip is
8 NeuronCore-v4 (trainium3.rst), grouped alike. The per-chip figure is the
modeled time of one launch divided by the launches a chip runs at once: 8 at
LNC=1 (one per physical core), 4 at LNC=2 (one per logical core); it assumes
they split the work perfectly.
"""
from __future__ import annotations

SOURCE = ("one H100 SXM 80GB, 2026-11-24, triton.testing.do_bench (warm-up 50, 300 ms), eager PyTorch 2.11 + "
          "Triton 3.6, no CUDA graphs, bf16 data, fp32 states; FLA fla-core 0.6.0, mamba_ssm main (Triton "
          "SSD), FLA Triton causal conv (measured for this project at its shapes)")
NEURONCORES_PER_CHIP = 8

_FLA_CHUNK = "FLA chunk_gated_delta_rule"
_FLA_DECODE = "FLA fused_recurrent_gated_delta_rule"
_MAMBA_CHUNK = "mamba_ssm mamba_chunk_scan_combined (chunk 256)"
_MAMBA_DECODE = "mamba_ssm selective_state_update"
_FLA_CONV = "FLA Triton causal_conv1d + SiLU"

# (op, model, layout as in simulate's case ids) -> (peer, measured time in ns)
H100_NS = {
    ("gated_delta_prefill", "qwen3-next", "1x16384"): (_FLA_CHUNK, 1.061e6),
    ("gated_delta_prefill", "qwen3-next", "8x2048"): (_FLA_CHUNK, 1.097e6),
    ("gated_delta_prefill", "qwen3-next", "1x2048"): (_FLA_CHUNK, 0.962e6),
    ("gated_delta_prefill", "qwen3-next-tp4", "1x16384"): (_FLA_CHUNK, 1.136e6),
    ("gated_delta_decode", "qwen3-next", "32seq"): (_FLA_DECODE, 0.113e6),
    ("gated_delta_decode", "qwen3-next", "64seq"): (_FLA_DECODE, 0.116e6),
    ("gated_delta_decode", "qwen3-next", "512seq"): (_FLA_DECODE, 0.873e6),
    ("short_conv_prefill", "qwen3-next", "1x16384"): (_FLA_CONV, 0.279e6),
    ("short_conv_prefill", "qwen3-next", "8x2048"): (_FLA_CONV, 0.290e6),
    ("ssd_prefill", "mamba2-2.7b", "1x16384"): (_MAMBA_CHUNK, 0.849e6),
    ("ssd_prefill", "mamba2-2.7b", "8x2048"): (_MAMBA_CHUNK, 1.300e6),
    ("ssd_prefill", "granite-4.0-h", "1x16384"): (_MAMBA_CHUNK, 1.245e6),
    ("ssd_decode", "mamba2-2.7b", "32seq"): (_MAMBA_DECODE, 0.144e6),
    ("ssd_decode", "mamba2-2.7b", "512seq"): (_MAMBA_DECODE, 1.163e6),
}


def _key(case_id: str) -> tuple:
    """(op, model, batch layout) of a case id."""
    return tuple((case_id.split("/") + ["", "", ""])[:3])


def h100_for(case_id: str) -> tuple[str, float] | None:
    """(peer, H100 time in ns) measured at the case's op, model and batch layout, or None."""
    return H100_NS.get(_key(case_id))


def chip_ns(per_core_ns: float, lnc: int = 1) -> float:
    """Modeled time of one chip: the time of one launch on a (logical) core over the chip's
    8 / ``lnc`` (logical) cores, split perfectly."""
    if lnc not in (1, 2):
        raise ValueError(f"lnc must be 1 or 2, got {lnc!r}")
    return per_core_ns / (NEURONCORES_PER_CHIP // lnc)


# ---- training step: forward + backward --------------------------------------------------
TRAINING_SOURCE = (
    "one H100 80GB HBM3, 2026-11-27, triton.testing.do_bench (warm-up 25, 200 ms), torch 2.11 + Triton 3.6, "
    "bf16 data, fp32 states, a random upstream gradient; FLA fla-core chunk_gated_delta_rule, mamba_ssm "
    "mamba_chunk_scan_combined (chunk 256, dt_softplus, D, dt_bias), FLA Triton causal_conv1d + SiLU "
    "(measured for this project at its shapes)")
# FLA refuses its gated dq/dk backward on Hopper with Triton 3.4 to 3.7.0 because it gives
# wrong gradients there (FLA issue #640); its GDN rows were timed with that guard off
FLA_HOPPER_NOTE = ("FLA's gated backward refuses to run on Hopper with Triton 3.4–3.7.0 (wrong gradients, "
                   "FLA issue #640); its figures were timed with that guard off: timing only, not a "
                   "checked gradient")
_FLA_CHUNK_TRAIN = f"{_FLA_CHUNK} forward + backward"
_MAMBA_CHUNK_TRAIN = f"{_MAMBA_CHUNK} forward + backward"
_FLA_CONV_TRAIN = f"{_FLA_CONV} forward + backward"

# (backward op, model, layout as in simulate's case ids) -> (peer, measured forward + backward ns)
H100_TRAINING_NS = {
    ("gated_delta_backward", "qwen3-next", "1x16384"): (_FLA_CHUNK_TRAIN, 4.840e6),
    ("gated_delta_backward", "qwen3-next", "8x2048"): (_FLA_CHUNK_TRAIN, 4.955e6),
    ("gated_delta_backward", "qwen3-next-tp4", "1x16384"): (_FLA_CHUNK_TRAIN, 2.519e6),
    ("gated_delta_backward", "qwen3-next-tp4", "8x2048"): (_FLA_CHUNK_TRAIN, 2.754e6),
    ("ssd_backward", "mamba2-2.7b", "1x16384"): (_MAMBA_CHUNK_TRAIN, 4.324e6),
    ("ssd_backward", "granite-4.0-h", "1x16384"): (_MAMBA_CHUNK_TRAIN, 6.080e6),
    ("short_conv_backward", "qwen3-next", "1x16384"): (_FLA_CONV_TRAIN, 1.769e6),
    ("short_conv_backward", "qwen3-next", "8x2048"): (_FLA_CONV_TRAIN, 1.770e6),
}


def h100_training_for(case_id: str) -> tuple[str, float] | None:
    """(peer, H100 forward + backward time in ns) at a backward case's model and batch, or None."""
    return H100_TRAINING_NS.get(_key(case_id))
