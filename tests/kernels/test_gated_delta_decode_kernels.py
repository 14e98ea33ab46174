"""Gated DeltaNet decode with run-time batch composition (issue 10): one compiled program
per sequence bucket, compacted live sequences, mirrored padding positions.

Tolerances and pool checks as in test_gated_delta_kernels.py (DESIGN.md, Numerics):
float32 I/O <= 1e-5 relative Frobenius, bfloat16 <= 3e-3; unnamed slots bit-identical;
padding sequences give zero output and zero intermediate states.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("nki_ssm.backend")

from nki_ssm import ops, sim  # noqa: E402
from nki_ssm.reference.inputs import make_gated_delta_decode_inputs  # noqa: E402
# the kernel-vs-float64 decode check shared with the GDN kernel tests (pytest puts this
# folder on sys.path, as for short_conv_perf)
from test_gated_delta_kernels import _run_and_check  # noqa: E402

BF16 = ml_dtypes.bfloat16
F32_TOL, BF16_TOL = 1e-5, 3e-3




@pytest.mark.parametrize("num_seqs,padding", [(1, 0), (1, 1), (3, 0), (3, 2), (5, 0), (7, 2),
                                              (9, 0), (17, 4)])
def test_decode_one_and_odd_numbers_of_live_sequences(num_seqs, padding):
    """1 sequence, odd live counts, a lone live sequence among padding: positions past
    the live count mirror their batch's first sequence; batches without one do not run
    (issue 14 item 7: no slicing past a list's end)."""
    rng = np.random.default_rng(num_seqs * 10 + padding)
    inp = make_gated_delta_decode_inputs(rng, num_seqs=num_seqs, T=1, H=1, HV=2, K=16, V=16,
                                         padding=padding)
    _run_and_check(inp, F32_TOL, inter=True)


def test_decode_nan_in_padding_inputs_gives_zeros():
    """A padding sequence's q/k/v/gates are never read: NaN there gives zeros."""
    inp = make_gated_delta_decode_inputs(np.random.default_rng(5), num_seqs=3, T=2, H=1, HV=2,
                                         K=16, V=16)
    inp["state_indices"][1] = -1
    for name in ("q", "k", "v"):
        inp[name][1] = np.nan
    o = _run_and_check(inp, F32_TOL)
    assert np.all(np.isfinite(o))


def test_decode_order_compacts_and_mirrors_within_batches():
    from nki_ssm.ops.launch.gated_delta import decode_order

    idx = np.array([-1, 4, -1, 7, 2, -1, -1, -1])
    order, pos, num_iters = decode_order(idx, 8)
    # live 1, 3, 4 first; position 3 mirrors its batch's first (position 2 -> sequence 4)
    assert list(order[:4]) == [1, 3, 4, 4]
    assert list(pos[[1, 3, 4]]) == [0, 1, 2]
    assert num_iters.tolist() == [[1]] and num_iters.dtype == np.int32
    assert decode_order(np.full(4, -1), 4)[2].tolist() == [[0]]


@pytest.mark.parametrize("pool_dtype,tol", [(np.float32, F32_TOL), (BF16, BF16_TOL)])
def test_decode_one_specialisation_per_bucket(pool_dtype, tol):
    """Many random batches within one bucket (9..16 sequences -> bucket 16; padding
    anywhere, all padding included; raw or given gates fixed per test): the kernel is
    compiled once and every call matches the float64 reference."""
    sim.reset_specialisations()

    @settings(max_examples=10, deadline=None)
    @given(data=st.data())
    def check(data):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
        num_seqs = data.draw(st.integers(9, 16))
        inp = make_gated_delta_decode_inputs(rng, num_seqs=num_seqs, T=1, H=1, HV=2, K=16,
                                             V=16, slots=20, pool_dtype=pool_dtype,
                                             padding=data.draw(st.integers(0, num_seqs)))
        _run_and_check(inp, tol)

    check()
    spec = {k: v for k, v in sim.specialisations().items() if "gdn_decode" in k}
    assert list(spec.values()) == [1], spec


def test_decode_program_size_does_not_grow_with_sequences():
    """32 and 512 sequences compile the same program (runtime iteration loop)."""
    from nki_ssm.sim.trace import record

    sizes = []
    for n in (32, 512):
        inp = make_gated_delta_decode_inputs(np.random.default_rng(n), num_seqs=n, T=1, H=1,
                                             HV=2, K=16, V=16)
        with record() as trace:
            ops.gated_delta_decode(**inp, backend="sim")
        sizes.append(trace.program_instructions())
    assert sizes[0] == sizes[1], sizes
