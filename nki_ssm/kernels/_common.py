"""Pieces every kernel family shares (plain functions: NKI inlines the calls; never decorate
them with ``nki.jit``)."""
from __future__ import annotations

from nki_ssm.backend import nl, nisa


def identity(dtype, n=128):
    """[n, n] identity in ``dtype`` (ones where partition == column), built on GpSimd."""
    ones = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    ident = nl.ndarray((n, n), dtype=dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, pattern=[[-1, n]], channel_multiplier=1,
                       on_true_tile=ones, on_false_value=0.0, cmp_op=nl.equal)
    return ident


def tf32_view(t, fast):
    """A float32 tile as a TensorE operand: its tfloat32 view when ``fast`` (bf16 callers:
    10 mantissa bits, streamed at the BF16 rate instead of float32's quarter rate, nki_spec
    §8.1), else itself (float32 callers: the exact mode)."""
    if fast:
        return t.view(nl.tfloat32)
    return t
