"""Pieces every kernel family shares (plain functions: NKI inlines the calls; never decorate
them with ``nki.jit``)."""
from __future__ import annotations

from nki_ssm.backend import nl, nisa


def count_register(counts, k):
    """A register holding ``counts[0, k]`` (int32 HBM ``[1, n]``): DMA'd into a (1, 1) SBUF
    tile on partition 0 and loaded from it (the form released kernels use: nki-library
    experimental/dynamic_shapes/dynamic_elementwise_add.py). Call it before the loop whose
    bound it is: registers are allocated outside runtime loops."""
    one = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=one, src=counts[0:1, k:k + 1])
    reg = nisa.register_alloc()
    nisa.register_load(dst=reg, src=one)
    return reg


def identity(dtype):
    """[128, 128] identity in ``dtype`` (ones where partition == column), built on GpSimd."""
    ones = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    ident = nl.ndarray((128, 128), dtype=dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, pattern=[[-1, 128]], channel_multiplier=1,
                       on_true_tile=ones, on_false_value=0.0, cmp_op=nl.equal)
    return ident
