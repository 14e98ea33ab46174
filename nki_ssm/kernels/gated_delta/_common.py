"""Pieces shared by the Gated DeltaNet prefill and decode kernels (plain functions: NKI
inlines the calls; never decorate them with ``nki.jit``)."""
from __future__ import annotations


def consecutive_groups(n, size):
    """``range(n)`` split into consecutive lists of ``size`` indices (the last may be
    shorter): head groups of the prefill's pipeline, sequence batches of the decode's."""
    groups = []
    for i0 in range(0, n, size):
        ids = []
        for i in range(i0, min(i0 + size, n)):
            ids.append(i)
        groups.append(ids)
    return groups
