"""Every decode kernel runs a batch of one sequence and odd numbers of (live) sequences.

The NKI front end rejects slicing a tuple or list past its end (KLR/Trace/Term.lean
312-320, "slice index out of bounds"; the simulator applies the rule while the kernel
runs, sim/frontend.py), so Python that groups sequences with ``ids[i:i + n]`` compiles
only when the batch divides evenly. These cases are where such code breaks: 1 sequence,
odd sequence counts, and odd live counts behind padding slots. Small shapes; each output
and pool is checked against the float64 reference with the family's float32 bound.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("nki_ssm.backend")

from nki_ssm import ops  # noqa: E402
from nki_ssm.reference import gated_delta as gdn_ref  # noqa: E402
from nki_ssm.reference import mamba2_ssd as ssd_ref  # noqa: E402
from nki_ssm.reference import short_conv as conv_ref  # noqa: E402
from nki_ssm.reference.inputs import (make_gated_delta_decode_inputs,  # noqa: E402
                                      make_short_conv_decode_inputs, make_ssd_decode_inputs)
from nki_ssm.reference.metrics import rel_fro  # noqa: E402

# (num_seqs, padding slots): 1 sequence, odd counts, odd live counts behind padding
BATCHES = [(1, 0), (3, 0), (5, 0), (4, 1), (6, 3)]
TOL = 1e-5        # float32 bound shared by the three families' own tests (<= theirs)


def _copy(inp):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inp.items()}


def _check_pool(after, before, ref_pool, state_indices):
    idx = np.asarray(state_indices)
    named = idx[idx >= 0]
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    assert after[unnamed].tobytes() == before[unnamed].tobytes()
    if named.size:
        assert rel_fro(after[named].astype(np.float64), ref_pool[named]) <= TOL


def _check_padding_rows_zero(y, state_indices):
    for s in np.flatnonzero(np.asarray(state_indices) < 0):
        assert not np.any(y[s])


@pytest.mark.parametrize("num_seqs, padding", BATCHES)
def test_short_conv_decode_batch_sizes(num_seqs, padding):
    inp = make_short_conv_decode_inputs(np.random.default_rng(num_seqs), num_seqs=num_seqs,
                                        T=1, dim=128, W=4, padding=padding)
    ref_in = _copy(inp)
    before = inp["conv_states"].copy()
    y = ops.short_conv_decode(inp["x"], inp["weight"], inp["bias"], activation="silu",
                              conv_states=inp["conv_states"],
                              state_indices=inp["state_indices"], backend="sim")
    y_ref, pool_ref = conv_ref.short_conv_decode(
        ref_in["x"], ref_in["weight"], ref_in["bias"], activation="silu",
        conv_states=ref_in["conv_states"], state_indices=ref_in["state_indices"])
    live = np.asarray(inp["state_indices"]) >= 0
    assert y.shape == y_ref.shape
    assert rel_fro(y[live].astype(np.float64), y_ref[live]) <= TOL
    _check_pool(inp["conv_states"], before, pool_ref, inp["state_indices"])


@pytest.mark.parametrize("num_seqs, padding", BATCHES)
def test_gated_delta_decode_batch_sizes(num_seqs, padding, lnc):
    inp = make_gated_delta_decode_inputs(np.random.default_rng(num_seqs), num_seqs=num_seqs,
                                         T=1, H=1, HV=2, K=16, V=16, padding=padding)
    ref_in = _copy(inp)
    before = inp["ssm_states"].copy()
    o = ops.gated_delta_decode(**inp, backend="sim")
    o_ref, pool_ref = gdn_ref.gated_delta_decode(**ref_in)[:2]
    assert o.shape == o_ref.shape
    assert rel_fro(o.astype(np.float64), o_ref) <= TOL
    _check_pool(inp["ssm_states"], before, pool_ref, inp["state_indices"])
    _check_padding_rows_zero(o, inp["state_indices"])


@pytest.mark.parametrize("num_seqs, padding", BATCHES)
def test_ssd_decode_batch_sizes(num_seqs, padding):
    inp = make_ssd_decode_inputs(np.random.default_rng(num_seqs), num_seqs=num_seqs,
                                 H=2, P=8, N=16, G=1, padding=padding)
    ref_in = _copy(inp)
    kw = _copy(inp)
    before = kw["ssm_states"].copy()
    y = ops.ssd_decode(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"), kw.pop("C"),
                       backend="sim", **kw)
    y_ref, pool_ref = ssd_ref.ssd_decode(**ref_in)
    assert y.shape == y_ref.shape
    assert rel_fro(y, y_ref) <= TOL
    _check_pool(kw["ssm_states"], before, pool_ref, inp["state_indices"])
    _check_padding_rows_zero(y, inp["state_indices"])
