"""float64 reference gradients of a backward case, computed in pieces that fit in memory.

The float64 reference backwards (``nki_ssm/reference/*_backward.py``) keep every
token's state of a sequence for the reverse walk: ``[L, H, P, N]`` float64 for SSD
(5.2 MB per token at Mamba-2 2.7B) and two ``[L, HV, K, V]`` for GDN (8.4 MB per
token at Qwen3-Next TP1), far beyond this machine's memory at 2K-16K tokens. So:

* SSD and GDN run each sequence in time segments (at most :data:`SEGMENT_BYTES`
  of float64 states each): a float64 forward pass (``ops.<family>_forward``,
  backend "reference") gives the state at every segment's start, then the
  segments' backwards run last to first, each with its start state as
  ``initial_states`` and the next segment's ``d_initial_states`` as its
  ``d_final_states`` -- the chain rule through the state, exact (the
  continuation property the backward kernels are tested on). When the start states
  exceed :data:`STARTS_BYTES` (1.8 GB at 16K tokens of Mamba-2 2.7B), every k-th is kept
  and a block's others are recomputed from it before its backwards run: the same calls
  on the same inputs, so the same values.
* the short conv runs in blocks of channels (depthwise: channels are independent).

Per-token gradients are placed at their tokens / channels; parameter gradients
(dA, dD, ddt_bias, dA_log, dweight, dbias) are summed over the pieces.
"""
from __future__ import annotations

import math

import numpy as np

# float64 state bytes held by one reference backward call
SEGMENT_BYTES = 256e6
# float64 bytes of segment start states kept at once (beyond: every k-th, the rest recomputed)
STARTS_BYTES = 256e6
# conv: channels per reference call (~3x faster than one call at 16K x 8192, as the forward)
CONV_CHANNELS = 512

# arguments with one row per token (sliced by segment), per family
_TOKEN_ARGS = {"mamba2_ssd": ("x", "dt", "B", "C", "z", "dy"),
               "gated_delta": ("q", "k", "v", "g", "beta", "a", "b", "do")}
_FORWARD = {"mamba2_ssd": "ssd_forward", "gated_delta": "gated_delta_forward"}
_BACKWARD = {"short_conv": "short_conv_backward", "mamba2_ssd": "ssd_backward",
             "gated_delta": "gated_delta_backward"}
# conv arguments with a channel axis, and which axis
_CONV_CHANNEL_AXIS = {"x": 1, "dy": 1, "weight": 0, "bias": 0, "initial_states": 1,
                      "d_final_states": 1}
_CONV_GRAD_OF = {"dx": "x", "dweight": "weight", "dbias": "bias", "d_initial_states": "initial_states"}


def _f64(kw: dict) -> dict:
    """Float arrays (bfloat16's dtype kind is "V") as float64; the rest as given."""
    return {n: (a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind in "fV" else a)
            for n, a in kw.items()}


def _conv(kw: dict) -> dict:
    from nki_ssm import ops

    dim = kw["x"].shape[1]
    out = {}
    for c0 in range(0, dim, CONV_CHANNELS):
        ch = slice(c0, c0 + CONV_CHANNELS)
        sub = dict(kw)
        for name, axis in _CONV_CHANNEL_AXIS.items():
            if sub.get(name) is not None:
                sub[name] = kw[name][(slice(None),) * axis + (ch,)]
        part = ops.short_conv_backward(**sub, backend="reference")
        for grad, src in _CONV_GRAD_OF.items():
            if part[grad] is None:
                out.setdefault(grad, None)
                continue
            if grad not in out:
                out[grad] = np.zeros(kw[src].shape, np.float64)
            out[grad][(slice(None),) * _CONV_CHANNEL_AXIS[src] + (ch,)] = part[grad]
    return out


def _segment_tokens(family: str, kw: dict) -> int:
    state = kw["initial_states"][0].size * 8
    per_token = state * (2 if family == "gated_delta" else 1)
    return max(1, int(SEGMENT_BYTES // per_token))


def _sequence(family: str, kw: dict, t0: int, t1: int, s: int, out: dict, seg: int) -> None:
    """One sequence's gradients (tokens t0..t1 of the batch, sequence s) into ``out``."""
    from nki_ssm import ops

    bounds = list(range(t0, t1, seg)) + [t1]
    if len(bounds) == 1:
        bounds = [t0, t1]     # an empty sequence: one empty segment passes its state gradient
    starts = [kw["initial_states"][s:s + 1]]
    one = np.array([0, 0], np.int32)

    def piece(a, b, **extra):
        sub = {n: v for n, v in kw.items() if n not in ("initial_states", "d_final_states")}
        for name in _TOKEN_ARGS[family]:
            if sub.get(name) is not None:
                sub[name] = kw[name][a:b]
        one[1] = b - a
        return dict(sub, cu_seqlens=one.copy(), **extra)

    fwd_names = {n for n in kw if n not in ("dy", "do", "d_final_states")}

    def forward(i, start):
        """The state at segment i + 1's start, from segment i's start state."""
        sub = {n: v for n, v in piece(bounds[i], bounds[i + 1], initial_states=start).items()
               if n in fwd_names}
        return getattr(ops, _FORWARD[family])(**sub, backend="reference")[1]

    # the segments' start states: every one when they fit in STARTS_BYTES, else every k-th
    # (k ~ sqrt(segments)) and the rest recomputed per block (the same calls: the same values)
    nseg = len(bounds) - 1
    every = 1
    if nseg * starts[0].size * 8 > STARTS_BYTES:
        every = max(1, math.isqrt(nseg - 1) + 1)
    kept = {0: starts[0]}
    start = starts[0]
    for i in range(nseg - 1):
        start = forward(i, start)
        if (i + 1) % every == 0:
            kept[i + 1] = start
    del start, starts
    d_final = kw["d_final_states"][s:s + 1]
    for c0 in reversed(range(0, nseg, every)):
        block = [kept.pop(c0)]
        for i in range(c0, min(c0 + every, nseg) - 1):
            block.append(forward(i, block[-1]))
        for i in reversed(range(c0, c0 + len(block))):
            a, b = bounds[i], bounds[i + 1]
            grads = getattr(ops, _BACKWARD[family])(**piece(a, b, initial_states=block[i - c0],
                                                            d_final_states=d_final),
                                                    backend="reference")
            for name, g in grads.items():
                if g is None or name == "d_initial_states":
                    continue
                if name[1:] in _TOKEN_ARGS[family]:     # dx of x, ddt of dt, ...: per token
                    out[name][a:b] = g
                else:
                    out[name] += g
            d_final = grads["d_initial_states"]
        del block
    out["d_initial_states"][s] = d_final[0]


def reference_gradients(case, kw: dict) -> dict:
    """float64 gradients of ``ops.<case.op>`` at ``kw`` (the case's inputs): gradient name ->
    array (None for inputs not given), as one call of the reference backend returns them."""
    from simulate.cases import BACKWARD_GRADS

    kw = _f64(kw)
    if case.family == "short_conv":
        return _conv(kw)
    out = {}
    for grad, src in BACKWARD_GRADS[case.family].items():
        out[grad] = None if kw.get(src) is None else np.zeros(np.shape(kw[src]), np.float64)
    cu = np.asarray(kw["cu_seqlens"])
    seg = _segment_tokens(case.family, kw)
    for s in range(cu.size - 1):
        _sequence(case.family, kw, int(cu[s]), int(cu[s + 1]), s, out, seg)
    return out
