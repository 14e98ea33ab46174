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
def test_decode_one_and_odd_numbers_of_live_sequences(num_seqs, padding, lnc):
    """1 sequence, odd live counts, a lone live sequence among padding: positions past
    the live count mirror their batch's first sequence; batches without one do not run
    (issue 14 item 7: no slicing past a list's end)."""
    rng = np.random.default_rng(num_seqs * 10 + padding)
    inp = make_gated_delta_decode_inputs(rng, num_seqs=num_seqs, T=1, H=1, HV=2, K=16, V=16,
                                         padding=padding)
    _run_and_check(inp, F32_TOL, inter=True)


def test_decode_nan_in_padding_inputs_gives_zeros(lnc):
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
    one spare row after the tail; counts = (main iterations, tail iterations, spare)."""
    from nki_ssm.ops.launch.gated_delta import decode_order

    idx = np.array([-1, 4, -1, 7, 2, -1, -1, -1])
    order, pos, slot_of, counts = decode_order(idx, 8)   # spi 8: no full group of 3 live
    assert counts.tolist() == [[0, 2, 0]] and counts.dtype == np.int32
    assert order.shape == (8 + 4 * 2 + 2,)
    # 8 main positions (never reached), then the tail: 1, 3, 4 and a mirror of 4
    assert list(order[8:12]) == [1, 3, 4, 4]
    assert list(pos[[1, 3, 4]]) == [8, 9, 10]
    assert list(slot_of[8:12]) == [4, 7, 2, 2]
    assert decode_order(np.full(4, -1), 4)[3].tolist() == [[0, 0, 0]]

    idx = np.arange(32)
    idx[[3, 9, 30]] = -1                              # 29 live in a bucket of 32
    order, pos, slot_of, counts = decode_order(idx, 32)   # spi 16, 16 tail positions
    live = np.flatnonzero(idx >= 0)
    assert counts.tolist() == [[1, 7, 0]]
    assert list(order[:16]) == list(live[:16])
    assert list(order[32:45]) == list(live[16:]) and order[45] == live[-1]
    assert list(pos[live]) == list(range(16)) + list(range(32, 45))


def test_decode_order_splits_sequences_between_two_programs():
    """LNC=2: the compacted live sequences in two consecutive runs of n_live // 2, each
    program laid out as a bucket of half the size (program 0's main positions, program 1's,
    then program 0's tail and spare row, program 1's), one counts row for both: the same
    trip counts; an odd n_live leaves the last live sequence as program 0's spare, program
    1's spare row names the dump slot 0."""
    from nki_ssm.ops.launch.gated_delta import decode_order

    idx = np.arange(100, 132)
    idx[[3, 9, 30]] = -1                              # 29 live in a bucket of 32
    live = np.flatnonzero(idx >= 0)
    order, pos, slot_of, counts = decode_order(idx, 32, programs=2)
    # per program: a bucket of 16 -> spi 16, one main row, 8 tail rows of 2 and a spare row
    assert order.shape == (2 * 16 + 2 * 18,)
    assert counts.tolist() == [[0, 7, 1]]             # 14 each, tails only; one spare
    assert list(order[32:46]) == list(live[:14])     # program 0's tail
    assert list(order[50:64]) == list(live[14:28])   # program 1's tail
    assert list(order[48:50]) == [live[28]] * 2      # program 0's spare row
    assert list(pos[live]) == list(range(32, 46)) + list(range(50, 64)) + [48]
    assert list(slot_of[48:50]) == [idx[live[28]]] * 2 and list(slot_of[66:68]) == [0, 0]
    shares = [idx[live[:14]], idx[live[14:28]]]
    for p, where in enumerate((np.r_[32:46], np.r_[50:64])):
        assert set(slot_of[where]) <= set(shares[p])
    order, pos, slot_of, counts = decode_order(np.arange(64), 64, programs=2)
    assert counts.tolist() == [[2, 0, 0]]            # 32 each: two full groups each
    assert list(order[:64]) == list(range(64)) and list(pos) == list(range(64))
    # one live sequence: no loop iteration; program 0's spare, program 1's dump
    idx = np.full(8, -1)
    idx[5] = 3
    order, pos, slot_of, counts = decode_order(idx, 8, programs=2)
    assert counts.tolist() == [[0, 0, 1]]
    # per program a bucket of 4: spi 4 (8 main positions), 2 tail rows of 2 and a spare row
    assert pos[5] == 8 + 2 * 2 and order[12] == 5 and slot_of[12] == 3
    assert list(slot_of[18:20]) == [0, 0]


@pytest.mark.parametrize("num_seqs,padding,T", [(16, 0, 1), (16, 9, 1), (32, 3, 1),
                                                (13, 2, 2), (8, 1, 3)])
def test_decode_main_only_tail_only_and_both(num_seqs, padding, T, lnc):
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
def test_decode_no_runtime_loop_inside_a_runtime_loop(T, lnc):
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
    for pid in range(lnc):       # both loops ran in every program
        ran = {i.loop_path[0][0] for i in trace.instructions if i.loop_path and i.program_id == pid}
        assert len(ran) == 2, (pid, ran)


def test_decode_dmas_never_convert_dtype(lnc):
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
    partitions, k / q in the state layout, v on partitions, g / beta rows; columns run over position,
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
    # kx: the state layout (partition (g, kb), column (position, token, G, i, k|q))
    from nki_ssm.kernels.gated_delta.decode import state_layout
    R, NG = state_layout(K, V, HV)
    QP, NGR = K // R, HV // NG
    assert kr.shape == (rows, NG * QP, width * T * NGR * R * 2)
    for hv_ in range(HV):
        G, gg = divmod(hv_, NG)
        kb, r = divmod(kk, R)
        col = (((j * T + t) * NGR + G) * R + r) * 2
        assert kr[i, gg * QP + kb, col] == k[s, t, hv_ // (HV // H), kk]
        assert kr[i, gg * QP + kb, col + 1] == q[s, t, hv_ // (HV // H), kk]
    assert vt[i, vv, (j * T + t) * HV + hv] == v[s, t, hv, vv]
    assert gates[i, 0, (j * T + t) * HV + hv] == np.float32(g[s, t, hv])
    assert gates[i, 1, (j * T + t) * HV + hv] == np.float32(beta[s, t, hv])


@pytest.mark.parametrize("pool_dtype,tol", [(np.float32, F32_TOL), (BF16, BF16_TOL)])
def test_decode_one_specialisation_per_bucket(pool_dtype, tol, lnc):
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


def test_decode_program_size_does_not_grow_with_sequences(lnc):
    """40 of 64 and 507 of 512 live sequences (both loops run, in each program at LNC=2)
    compile the same program, and the LNC programs are equal in size."""
    from nki_ssm.sim.trace import record

    sizes = []
    for n, padding in ((64, 24), (512, 5)):
        inp = make_gated_delta_decode_inputs(np.random.default_rng(n), num_seqs=n, T=1, H=1,
                                             HV=2, K=16, V=16, padding=padding)
        with record() as trace:
            ops.gated_delta_decode(**inp, backend="sim")
        assert len({p[0][0] for p in (i.loop_path for i in trace.instructions) if p}) == 2
        sizes.append([trace.program_instructions(p) for p in range(lnc)])
    assert sizes[0] == sizes[1] and len(set(sizes[0])) == 1, sizes


@pytest.mark.parametrize("T", [1, 2])
def test_decode_ragged_batch_equals_separate_calls_bitwise(T, lnc):
    """A batch with padding slots that runs both loops (and a mirrored tail position)
    gives, per sequence, the bytes of a one-sequence call (a bucket of one: tail loop
    only, states moved in parts; at LNC=2 program 1 gets nothing): outputs, final states and
    intermediate states."""
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



@pytest.mark.parametrize("T,raw,pool_dtype", [(1, True, np.float32), (3, False, BF16)])
def test_decode_lnc2_equals_lnc1_bitwise(T, raw, pool_dtype, monkeypatch):
    """A ragged batch (padding slots among the live sequences, both loops and a mirrored tail
    position in each program, T tokens with intermediate states): the two programs of LNC=2
    give the bytes of LNC=1 (outputs, intermediate and final states, unnamed slots untouched);
    both programs run both loops; no pool slot a program reads or writes is written by the
    other (the slot tables), and outputs are rows of one program (a static offset); their
    programs are the same size, <= 20,000, and the same for another batch of the bucket.
    (The trace's HBM spans of run-time-offset DMAs cover the whole tensor, so the slots are
    checked on the tables.)"""
    from nki_ssm.ops.launch.gated_delta import decode_order, decode_plan
    from nki_ssm.sim.trace import record

    inp = make_gated_delta_decode_inputs(np.random.default_rng(70 + T), num_seqs=59, T=T, H=2,
                                         HV=4, K=16, V=16, slots=64, raw_gates=raw,
                                         use_qk_l2norm=raw, pool_dtype=pool_dtype, padding=6)
    runs = {}
    for lnc in (1, 2):
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
        kw = {n: (x.copy() if isinstance(x, np.ndarray) else x) for n, x in inp.items()}
        with record() as trace:
            o, inter = ops.gated_delta_decode(**kw, return_intermediate_states=True,
                                              backend="sim")
        runs[lnc] = (o, inter, kw["ssm_states"], trace)
    for a, b in zip(runs[1][:3], runs[2][:3]):
        assert a.tobytes() == b.tobytes()
    trace = runs[2][3]
    for pid in (0, 1):
        ran = {i.loop_path[0][0] for i in trace.instructions if i.loop_path and i.program_id == pid}
        assert len(ran) == 2, (pid, ran)
        assert trace.branches[(pid, ("if", 0))].outcomes == [True]      # 53 live: a spare
    idx = np.full(64, -1)
    idx[:59] = inp["state_indices"]
    spi, w, main_rows, tail_rows = decode_plan(32, T)
    order, pos, slot_of, counts = decode_order(idx, 64, T, 2)
    main = slot_of[:2 * main_rows * spi]
    tail = slot_of[2 * main_rows * spi:].reshape(2, tail_rows + 1, w)
    n_main, n_tail, spare = counts[0]
    touched = []
    for p in (0, 1):
        m = main.reshape(2, main_rows, spi)[p]
        # main rows run, tail rows run, the spare row (program 0's only: program 1's is a
        # dump slot of its own)
        slots = set(m[:n_main].ravel()) | set(tail[p][:n_tail].ravel())
        if spare and p == 0:
            slots |= set(tail[p][tail_rows])
        assert slots                    # both programs have work
        touched.append(slots)
    assert not touched[0] & touched[1]
    sizes = [trace.program_instructions(p) for p in (0, 1)]
    assert sizes[0] == sizes[1] <= 20_000, sizes
    other = make_gated_delta_decode_inputs(np.random.default_rng(1), num_seqs=33, T=T, H=2,
                                           HV=4, K=16, V=16, slots=64, raw_gates=raw,
                                           use_qk_l2norm=raw, pool_dtype=pool_dtype, padding=1)
    with record() as trace:
        ops.gated_delta_decode(**other, return_intermediate_states=True, backend="sim")
    assert [trace.program_instructions(p) for p in (0, 1)] == sizes


def test_one_slot_pool_one_live_sequence_at_lnc2(monkeypatch):
    """One live sequence in a one-slot pool at LNC=2: it is program 0's spare batch, program
    1 runs a dump batch into its private one-slot dump: no HBM race between the programs,
    the result and the pool as the reference's."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    rng = np.random.default_rng(7)
    N, H, HV, K, V = 6, 1, 2, 16, 16
    q = rng.standard_normal((N, 1, H, K)).astype(np.float32)
    k = rng.standard_normal((N, 1, H, K)).astype(np.float32)
    v = rng.standard_normal((N, 1, HV, V)).astype(np.float32)
    g = -np.abs(rng.standard_normal((N, 1, HV))).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (N, 1, HV)).astype(np.float32)
    pool = rng.standard_normal((1, HV, K, V)).astype(np.float32)
    si = np.array([-1, -1, 0, -1, -1, -1], np.int32)
    kw = dict(g=g, beta=beta, state_indices=si, use_qk_l2norm=True)
    ref_pool = pool.copy()
    want = ops.gated_delta_decode(q, k, v, ssm_states=ref_pool, backend="reference", **kw)
    got = ops.gated_delta_decode(q, k, v, ssm_states=pool, backend="sim", **kw)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
    assert np.linalg.norm(pool - ref_pool) <= 1e-5 * np.linalg.norm(ref_pool)
