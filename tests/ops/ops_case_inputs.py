"""Small valid inputs for every host-API op, and pool snapshots (tests/ops helpers)."""
from __future__ import annotations

import numpy as np

from nki_ssm import ops
from nki_ssm.reference import inputs as gen
from nki_ssm.reference.testing import array_snapshot, assert_arrays_unchanged

OPS = {
    "short_conv_prefill": ops.short_conv_prefill,
    "short_conv_decode": ops.short_conv_decode,
    "ssd_prefill": ops.ssd_prefill,
    "ssd_decode": ops.ssd_decode,
    "gated_delta_prefill": ops.gated_delta_prefill,
    "gated_delta_decode": ops.gated_delta_decode,
}
POOL_NAMES = ("conv_states", "ssm_states")
# (launcher family, entry point) of each op: nki_ssm.ops.launch.<family>.<entry>
FAMILY = {"short_conv_prefill": ("short_conv", "prefill"),
          "short_conv_decode": ("short_conv", "decode"),
          "ssd_prefill": ("mamba2_ssd", "prefill"), "ssd_decode": ("mamba2_ssd", "decode"),
          "gated_delta_prefill": ("gated_delta", "prefill"),
          "gated_delta_decode": ("gated_delta", "decode")}

# Lengths cover an empty sequence and one that is not a multiple of the chunk (16).
SEQLENS = [5, 0, 19]
CONV = dict(dim=8, W=4)
SSD = dict(H=4, P=8, N=16, G=2)
GDN = dict(H=2, HV=4, K=16, V=8)


def base(op: str, *, seed: int = 0, dtype=np.float32, pool_dtype=np.float32, **extra) -> dict:
    """Fresh keyword arguments of a valid call of ``op`` (one padding sequence)."""
    rng = np.random.default_rng(seed)
    common = {"dtype": dtype, "pool_dtype": pool_dtype, "padding": 1, **extra}
    if op == "short_conv_prefill":
        return gen.make_short_conv_inputs(rng, seqlens=SEQLENS, **CONV, **common)
    if op == "short_conv_decode":
        common.setdefault("T", 2)
        return gen.make_short_conv_decode_inputs(rng, num_seqs=3, **CONV, **common)
    if op == "ssd_prefill":
        kw = gen.make_ssd_inputs(rng, seqlens=SEQLENS, **SSD, z=True, **common)
        kw["chunk_size"] = 16
        return kw
    if op == "ssd_decode":
        common.setdefault("T", 2)
        return gen.make_ssd_decode_inputs(rng, num_seqs=3, **SSD, z=True, **common)
    if op == "gated_delta_prefill":
        kw = gen.make_gated_delta_inputs(rng, seqlens=SEQLENS, **GDN, **common)
        kw["chunk_size"] = 16
        return kw
    if op == "gated_delta_decode":
        return gen.make_gated_delta_decode_inputs(rng, num_seqs=3, T=2, **GDN, **common)
    raise KeyError(op)


def pool_name(kw: dict) -> str:
    """The name of the pool argument of a call (conv_states or ssm_states)."""
    return next(n for n in POOL_NAMES if n in kw)


def pool_snapshot(kw: dict) -> dict:
    """dtype, shape and raw bytes of every pool argument (bit-identity, NaN payloads included)."""
    return array_snapshot(kw, POOL_NAMES)


def assert_pools_unchanged(kw: dict, before: dict) -> None:
    assert_arrays_unchanged(kw, before, "changed by a rejected call")
