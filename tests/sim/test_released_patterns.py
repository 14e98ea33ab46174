"""Constructs released kernels use where the NKI docs say otherwise: the simulator accepts them.

Released kernels are what the compiler demonstrably takes (charter: where docs and released
kernels disagree, released kernels win). Each accepted construct warns with
``NkiReleasedUseWarning`` (or, for deprecated forms, ``DeprecationWarning``) naming its source.
"""
from __future__ import annotations

import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.errors import NkiReleasedUseWarning
from nki_ssm.sim.jit import jit, simulate


@jit
def leading_ones(decisions):
    """decisions [1, n + 1] int32, a 0 somewhere: out[0, 0] = how many 1s lead it.

    The loop of nki-library d2ad3a5 core/moe/moe_tkg/all_expert_mx_impl.py:311-350: a register
    allocated from a tile element, ``while reg:``, a (1, 1) SBUF index as scalar_offset with
    indirect_dim=1 on HBM, and register_load with keyword arguments.
    """
    width = decisions.shape[1]
    out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
    first = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=first, src=decisions[0:1, 0:1])
    go = nisa.register_alloc(first[0, 0])
    idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.memset(idx, 0)
    while go:
        nisa.tensor_scalar(data=idx, op0=nl.add, operand0=1, dst=idx)
        nxt = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(src=decisions.ap(pattern=[[width, 1], [1, 1]], offset=0,
                                       scalar_offset=idx, indirect_dim=1), dst=nxt)
        nisa.register_load(src=nxt, dst=go)
    nisa.dma_copy(dst=out, src=idx)
    return out


@pytest.mark.nki_version("0.6.0")
@pytest.mark.parametrize("ones", [0, 1, 4])
def test_register_alloc_from_a_tile_and_while_reg(ones):
    d = np.zeros((1, 6), np.int32)
    d[0, :ones] = 1
    with pytest.warns(NkiReleasedUseWarning, match="all_expert_mx_impl.py:311"):
        with pytest.warns(DeprecationWarning, match="while_loop"):
            out = simulate(leading_ones)(d)
    assert int(out[0, 0]) == ones
