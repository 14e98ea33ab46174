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
