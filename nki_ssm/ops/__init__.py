"""Host API: NumPy in, NumPy out.

Every op validates all of its arguments before anything runs (ValueError /
TypeError naming the argument, expected and actual value), dispatches to the
chosen backend (``backend=None | "reference" | "sim" | "neuron"``), writes the
new state into the caller's pool arrays in place on success only, and returns
the output in the input activation dtype. See docs/contracts.md, Host API.
The training entries (``*_forward``, ``*_backward``) write no pool.
"""
from .gated_delta import gated_delta_decode, gated_delta_prefill
from .gated_delta_backward import gated_delta_backward
from .mamba2_ssd import ssd_decode, ssd_prefill
from .mamba2_ssd_backward import ssd_backward
from .short_conv import short_conv_decode, short_conv_prefill
from .training import gated_delta_forward, short_conv_forward, ssd_forward

__all__ = [
    "short_conv_prefill",
    "short_conv_decode",
    "ssd_prefill",
    "ssd_decode",
    "gated_delta_prefill",
    "gated_delta_decode",
    # training: functional forwards (initial states in, final states out) and backwards
    "short_conv_forward",
    "ssd_forward",
    "gated_delta_forward",
    "ssd_backward",
    "gated_delta_backward",
]
