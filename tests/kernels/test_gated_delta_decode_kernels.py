"""Gated DeltaNet decode with run-time batch composition: one compiled program per sequence
bucket, a work list of full groups then batches (two runtime loops, none nested), compacted
live sequences, mirrored padding positions.

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
# NKI 0.6.0 deprecates nl.dynamic_range and dynamic while: the kernel must not warn
pytestmark = pytest.mark.filterwarnings("error::DeprecationWarning")



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


def test_decode_plan_splits_groups_and_batches():
    """(spi, w, main_rows, tail_rows): groups of 16 // T positions (multiple of 4, >= 4,
    <= bucket), batches of 2; a bucket of 1 or 2 has no main loop."""
    from nki_ssm.ops.launch.gated_delta import decode_plan

    assert decode_plan(1) == (1, 1, 0, 1)
    assert decode_plan(2) == (2, 2, 0, 1)
    assert decode_plan(4) == (4, 2, 1, 2)
    assert decode_plan(8) == (8, 2, 1, 4)
    assert decode_plan(64) == (16, 2, 4, 8)
    assert decode_plan(128, T=4) == (4, 2, 32, 2)
    assert decode_plan(8, T=3) == (4, 2, 2, 2)


def test_decode_order_is_a_work_list_of_full_groups_then_batches():
    """Live sequences compacted; full groups of spi in the main loop, the rest in
    batches of 2 in the tail, a position past the live count mirrors its batch's first;
    counts = (main iterations, tail iterations)."""
    from nki_ssm.ops.launch.gated_delta import decode_order

    idx = np.array([-1, 4, -1, 7, 2, -1, -1, -1])
    order, pos, counts = decode_order(idx, 8)        # spi 8: no full group of 3 live
    assert counts.tolist() == [[0, 2]] and counts.dtype == np.int32
    # 8 main positions (never reached), then the tail: 1, 3, 4 and a mirror of 4
    assert list(order[8:12]) == [1, 3, 4, 4]
    assert list(pos[[1, 3, 4]]) == [8, 9, 10]
    assert decode_order(np.full(4, -1), 4)[2].tolist() == [[0, 0]]

    idx = np.arange(32)
    idx[[3, 9, 30]] = -1                              # 29 live in a bucket of 32
    order, pos, counts = decode_order(idx, 32)        # spi 16, 16 tail positions
    live = np.flatnonzero(idx >= 0)
    assert counts.tolist() == [[1, 7]]
    assert list(order[:16]) == list(live[:16])
    assert list(order[32:45]) == list(live[16:]) and order[45] == live[-1]
    assert list(pos[live]) == list(range(16)) + list(range(32, 45))


@pytest.mark.parametrize("num_seqs,padding,T", [(16, 0, 1), (16, 9, 1), (32, 3, 1),
                                                (13, 2, 2), (8, 1, 3)])
def test_decode_main_only_tail_only_and_both(num_seqs, padding, T):
    """Full groups only (16 live of 16), tail only (7 live: no full group), both loops
    (29 of 32; 11 of 16 at T = 2; 7 of 8 at T = 3, groups of 4), with intermediate
    states, against float64."""
    rng = np.random.default_rng(num_seqs * 7 + padding + T)
    inp = make_gated_delta_decode_inputs(rng, num_seqs=num_seqs, T=T, H=1, HV=2, K=16, V=16,
                                         slots=num_seqs + 3, raw_gates=True,
                                         use_qk_l2norm=True, padding=padding)
    _run_and_check(inp, F32_TOL, inter=True)


def _trace(inp, check_tol=None):
    """Run the kernel under the trace recorder (checked against float64 with check_tol)."""
    from nki_ssm.sim.trace import record

    with record() as trace:
        if check_tol is None:
            ops.gated_delta_decode(**inp, return_intermediate_states=True, backend="sim")
        else:
            _run_and_check(inp, check_tol, inter=True)
    return trace


@pytest.mark.parametrize("T", [1, 2])
def test_decode_no_runtime_loop_inside_a_runtime_loop(T):
    """A ragged batch (padding slots among the live ones, every state from the pool,
    several main iterations and a tail with a mirrored position): every instruction
    sits in at most one runtime loop, both loops ran, and the results match float64."""
    rng = np.random.default_rng(40 + T)
    inp = make_gated_delta_decode_inputs(rng, num_seqs=45, T=T, H=1, HV=2, K=16, V=16,
                                         slots=50, padding=8)
    trace = _trace(inp, F32_TOL)
    paths = [inst.loop_path for inst in trace.instructions]
    assert max(len(p) for p in paths) == 1
    assert len({p[0][0] for p in paths if p}) == 2


def test_decode_dmas_never_convert_dtype():
    """bf16 q/k/v and pool: every DMA moves one dtype (conversions on compute engines)."""
    inp = make_gated_delta_decode_inputs(np.random.default_rng(8), num_seqs=7, T=2, H=1, HV=2,
                                         K=16, V=16, dtype=BF16, pool_dtype=BF16, padding=1)
    trace = _trace(inp)
    dmas = [i for i in trace.instructions if i.op.startswith("dma")]
    assert dmas
    for inst in dmas:
        assert inst.dtypes["dst"] == inst.dtypes["src"], inst


def test_decode_tables_layout():
    """Launcher tables, one row per loop iteration: k / q interleaved columns with k on
    partitions, k as one row, v on partitions, g / beta rows; columns run over position,
    token, head; all float32."""
    from nki_ssm.ops.launch._arrays import NUMPY
    from nki_ssm.ops.launch.gated_delta import decode_tables

    rng = np.random.default_rng(0)
    S, T, H, HV, K, V, rows, width = 4, 2, 2, 4, 3, 5, 2, 2
    q, k = rng.standard_normal((2, S, T, H, K)).astype(BF16)
    v = rng.standard_normal((S, T, HV, V)).astype(BF16)
    g, beta = rng.standard_normal((2, S, T, HV))
    kq, kr, vt, gates = decode_tables(NUMPY, q, k, v, g, beta, rows, width)
    assert all(x.dtype == np.float32 for x in (kq, kr, vt, gates))
    assert kq.shape == (rows, K, width * T * H * 2) and vt.shape == (rows, V, width * T * HV)
    i, j, t, h, kk, hv, vv = 1, 1, 1, 0, 2, 3, 4
    s = i * width + j
    assert kq[i, kk, ((j * T + t) * H + h) * 2] == k[s, t, h, kk]
    assert kq[i, kk, ((j * T + t) * H + h) * 2 + 1] == q[s, t, h, kk]
    assert kr[i, ((j * T + t) * H + h) * K + kk] == k[s, t, h, kk]
    assert vt[i, vv, (j * T + t) * HV + hv] == v[s, t, hv, vv]
    assert gates[i, 0, (j * T + t) * HV + hv] == np.float32(g[s, t, hv])
    assert gates[i, 1, (j * T + t) * HV + hv] == np.float32(beta[s, t, hv])


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
    """29 of 32 and 507 of 512 live sequences (both loops run) compile the same program."""
    from nki_ssm.sim.trace import record

    sizes = []
    for n, padding in ((32, 3), (512, 5)):
        inp = make_gated_delta_decode_inputs(np.random.default_rng(n), num_seqs=n, T=1, H=1,
                                             HV=2, K=16, V=16, padding=padding)
        with record() as trace:
            ops.gated_delta_decode(**inp, backend="sim")
        assert len({p[0][0] for p in (i.loop_path for i in trace.instructions) if p}) == 2
        sizes.append(trace.program_instructions())
    assert sizes[0] == sizes[1], sizes


@pytest.mark.parametrize("T", [1, 2])
def test_decode_ragged_batch_equals_separate_calls_bitwise(T):
    """A batch with padding slots that runs both loops (and a mirrored tail position)
    gives, per sequence, the bytes of a one-sequence call (a bucket of one: tail loop
    only, states moved in parts): outputs, final states and intermediate states."""
    rng = np.random.default_rng(60 + T)
    inp = make_gated_delta_decode_inputs(rng, num_seqs=23, T=T, H=2, HV=4, K=16, V=16,
                                         slots=26, raw_gates=True, use_qk_l2norm=True,
                                         padding=4)
    sep = {n: (x.copy() if isinstance(x, np.ndarray) else x) for n, x in inp.items()}
    o, inter = ops.gated_delta_decode(**inp, return_intermediate_states=True, backend="sim")
    per_seq = ("q", "k", "v", "a", "b", "state_indices")
    for s in np.flatnonzero(inp["state_indices"] >= 0):
        kw = {n: (x[s:s + 1] if n in per_seq else x) for n, x in sep.items()}
        o1, inter1 = ops.gated_delta_decode(**kw, return_intermediate_states=True,
                                            backend="sim")
        assert o1.tobytes() == o[s:s + 1].tobytes()
        assert inter1.tobytes() == inter[s:s + 1].tobytes()
    assert sep["ssm_states"].tobytes() == inp["ssm_states"].tobytes()
