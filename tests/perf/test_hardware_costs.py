"""The costs issue 11 added, each shown changing a schedule the way its source says.

Synthetic traces (tests/perf/synth.py) unless the cost comes from a simulator
feature (broadcast lowering, DMA run length, runtime loops), which run tiny kernels.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from nki_ssm import perf
from nki_ssm.perf import costs
from nki_ssm.perf.hardware import TRN1, TRN2, bracket
from tests.perf.synth import act, dma, hbm, mm, new_storage, sbuf, trace_of, vec


def _independent_vector_ops(n_ops, n):
    return [vec([sbuf(new_storage())], [sbuf(new_storage())], n=n, inputs=1) for _ in range(n_ops)]


def test_fixed_cost_is_added_to_every_instruction_not_a_floor():
    # [SHARED] MIN_II ~64 cycles as an addition; the trn2 log: [128, 512] op ~ N + 150 cycles
    fixed = TRN2.vector_overhead_cycles
    small = perf.model(trace_of(*_independent_vector_ops(16, n=8)), TRN2)
    assert small.time_ns == pytest.approx(16 * (8 + fixed) / 0.96)
    as_floor = TRN2.with_overrides(vector_overhead_cycles=0)
    assert perf.model(trace_of(*_independent_vector_ops(16, n=8)), as_floor).time_ns == pytest.approx(16 * 8 / 0.96)
    # large instructions pay the same absolute overhead: it matters in the small-instruction regime
    big = perf.model(trace_of(*_independent_vector_ops(16, n=4096)), TRN2)
    assert big.time_ns == pytest.approx(16 * (4096 + fixed) / 0.96)


def test_cross_engine_semaphore_delays_the_consumer():
    a, b, c = new_storage(), new_storage(), new_storage()
    producer = vec([sbuf(a)], [sbuf(b)], n=512, inputs=1)
    consumer = act([sbuf(b)], [sbuf(c)], n=512)
    t = perf.model(trace_of(producer, consumer), TRN2)
    # after the producer's pipeline latency (its result written), as test_latency_regime shows
    assert t.schedule.start[1] == pytest.approx(t.schedule.end[0] + costs.raw_latency_ns("vector", TRN2)
                                                + TRN2.semaphore_ns)
    # a DMA signals completion through its own semaphore (~300 ns in AWS's trn2 profiles)
    load = dma(hbm(new_storage(), 128 * 2048), sbuf(a), 128 * 2048)
    use = vec([sbuf(a)], [sbuf(b)])
    t2 = perf.model(trace_of(load, use), TRN2)
    assert t2.schedule.start[1] == pytest.approx(t2.schedule.end[0] + TRN2.dma_completion_ns)
    # the store of a loaded tile waits for the load's completion semaphore too
    store = dma(sbuf(a), hbm(new_storage(), 128 * 2048), 128 * 2048)
    t3 = perf.model(trace_of(load, store), TRN2)
    assert t3.schedule.start[1] == pytest.approx(t3.schedule.end[0] + TRN2.dma_completion_ns)


def _acts(*functions):
    return [act([sbuf(new_storage())], [sbuf(new_storage())], n=512, function=f) for f in functions]


def test_activation_table_loads_when_the_function_changes():
    t = perf.model(trace_of(*_acts("exp", "exp", "exp")), TRN2)
    assert t.act_table_loads == 1                        # the first exp loads its table once
    t = perf.model(trace_of(*_acts("exp", "silu", "exp", "copy", "exp")), TRN2)
    assert t.act_table_loads == 3                        # copy needs no table and keeps exp's
    one = costs.compute_ns(_acts("exp")[0], TRN2)
    assert t.time_ns == pytest.approx(5 * one + 3 * TRN2.act_table_load_ns)
    assert t.op_counts["scalar:act_table_load"] == 3
    assert t.op_time_ns["scalar:act_table_load"] == pytest.approx(3 * TRN2.act_table_load_ns)


def test_launch_overhead_is_its_own_line():
    tr = trace_of(*_independent_vector_ops(2, n=512))
    t = perf.model(tr, TRN2)
    no_launch = perf.model(tr, TRN2.with_overrides(launch_ns=0.0))
    assert t.time_ns == no_launch.time_ns               # not hidden in the kernel time
    assert t.launch_ns == 16000.0 and t.time_with_launch_ns == t.time_ns + 16000.0
    assert "16 us launch" in t.summary()


def test_sustained_dma_rate_is_below_the_peak():
    # [PERF Opt #9]: large DMAs reach "close to 70 %"; the central table takes 0.85 of 23 B/ns
    nbytes = 128 * 32768
    big = dma(hbm(new_storage(), nbytes), sbuf(new_storage(), nbytes=32768), nbytes)
    _, ns = costs.dma_plan(big, TRN2)
    assert ns == pytest.approx(nbytes / (16 * 23.0 * 0.85))
    _, slow = costs.dma_plan(big, bracket(TRN2, "high"))
    assert slow == pytest.approx(nbytes / (16 * 23.0 * 0.60))
    # trn1's tutorial kernels moved their tiles at ~0.40 of 16 x 17 B/ns (fitted, hardware.CALIBRATED)
    _, trn1 = costs.dma_plan(big, TRN1)
    assert trn1 == pytest.approx(nbytes / (16 * 17.0 * 0.40))


def test_second_input_costs_a_share_of_a_pass():
    # [A1] ~2N for two inputs is the slow end; trn1's fused-Mamba profile fits ~1.1N (hardware.CALIBRATED)
    two = vec([], [], n=512, inputs=2)
    fixed = TRN1.vector_overhead_cycles
    assert costs.vector_cycles(two, TRN1) == math.ceil(512 * (1 + TRN1.vector_second_input)) + fixed
    assert costs.vector_cycles(two, bracket(TRN1, "high")) == 2 * 512 + bracket(TRN1, "high").vector_overhead_cycles
    # bf16 perf modes keep the documented rule: two all-SBUF 16-bit inputs at 2x -> N
    two16 = vec([], [], n=512, inputs=2, all_16bit=True, psum_operand=False)
    assert costs.vector_cycles(two16, TRN2) == 512 + TRN2.vector_overhead_cycles


def test_fp32_weight_load_is_not_hidden():
    insts = [mm([sbuf(new_storage())], [sbuf(new_storage(), nbytes=2048)], N=512, fp32=True) for _ in range(8)]
    t = perf.model(trace_of(*insts), TRN2)
    # 4N per fp32 matmul plus its stationary load at the fp32 rate (128 x 4 / 4 cycles)
    assert t.time_ns == pytest.approx(8 * (4 * 512 + 128) / 2.4)
    bf = [mm([sbuf(new_storage())], [sbuf(new_storage(), nbytes=2048)], N=512) for _ in range(8)]
    assert perf.model(trace_of(*bf), TRN2).time_ns == pytest.approx(8 * 512 / 2.4)   # LS hidden


def _iteration(path, n=512):
    """One loop body: a VectorE op and an independent ScalarE op."""
    v = vec([sbuf(new_storage())], [sbuf(new_storage())], n=n, inputs=1)
    s = act([sbuf(new_storage())], [sbuf(new_storage())], n=64)
    for inst in (v, s):
        inst.loop_path = path
    return [v, s]


def test_runtime_loop_iterations_pay_a_boundary():
    loop = ("kernel.py", 10)
    looped = trace_of(*[i for it in range(4) for i in _iteration(((loop, it),))])
    flat = trace_of(*[i for _ in range(4) for i in _iteration(())])
    t_loop, t_flat = perf.model(looped, TRN2), perf.model(flat, TRN2)
    assert t_loop.loop_iterations == 4 and t_flat.loop_iterations == 0
    per_iter = TRN2.loop_barrier_ns + TRN2.loop_branch_ns
    assert t_loop.loop_overhead_ns == pytest.approx(4 * per_iter)
    # every iteration starts after both engines drained the previous one, then barrier + branch
    v = costs.compute_ns(looped.instructions[0], TRN2)
    assert t_loop.time_ns == pytest.approx(4 * (v + per_iter))
    # unrolled, the engines overlap and nothing is charged
    assert t_flat.time_ns == pytest.approx(4 * v)
    s = t_loop.schedule
    assert s.start[2] == pytest.approx(max(s.end[0], s.end[1]) + per_iter)


def test_nested_runtime_loops_count_each_iteration_start():
    outer, inner = ("k.py", 1), ("k.py", 2)
    insts = []
    for i in range(2):
        for j in range(3):
            insts += _iteration(((outer, i), (inner, j)))
    t = perf.model(trace_of(*insts), TRN2)
    assert t.loop_iterations == 2 + 2 * 3                # outer starts + inner starts


def test_ranges_bracket_the_central_time():
    tr = trace_of(*_acts("exp", "silu"), *_independent_vector_ops(4, n=256),
                  dma(hbm(new_storage(), 128 * 4096), sbuf(new_storage(), nbytes=4096), 128 * 4096))
    t = perf.model_range(tr, "trn2")
    assert t.time_low_ns < t.time_ns < t.time_high_ns
    assert t.launch_low_ns < t.launch_ns < t.launch_high_ns
    assert not t.range_clamped
    t1 = perf.model_range(tr, TRN1)
    assert t1.target == "trn1" and t1.time_low_ns < t1.time_ns


def test_range_always_contains_the_central_figure(monkeypatch):
    # list scheduling is not monotone: if the fast end's schedule comes out slower, the
    # range is widened to the central figure and says so
    from nki_ssm.perf import hardware

    tr = trace_of(*_independent_vector_ops(4, n=256))
    swapped = {k: (b, a) for k, (a, b) in hardware.ranges("trn2").items()}
    monkeypatch.setattr(hardware, "ranges", lambda spec: swapped)
    t = perf.model_range(tr, "trn2")
    assert t.time_low_ns == t.time_ns == t.time_high_ns and t.range_clamped


# ------------------------------------------------------------ with the simulator

@pytest.fixture(scope="module")
def sim():
    pytest.importorskip("nki_ssm.sim.jit")
    from nki_ssm.sim import isa as nisa
    from nki_ssm.sim import language as nl
    from nki_ssm.sim.jit import simulate
    from nki_ssm.sim.trace import record

    return nl, nisa, simulate, record


def test_partition_broadcast_costs_its_compiler_lowering(sim):
    # fused_mamba.rst: a partition broadcast is "a separate instruction on TensorE";
    # the simulator's staging copy, ones memset and PSUM copy are not in the compiled program
    nl, nisa, simulate, record = sim

    def kernel(row, x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        r = nl.ndarray(row.shape, dtype=row.dtype, buffer=nl.sbuf)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=r, src=row)
        nisa.dma_copy(dst=t, src=x)
        b = nl.broadcast_to(r, x.shape)
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=t, data2=b, op=nl.multiply)
        nisa.dma_copy(dst=out, src=y)
        return out

    row = np.arange(512, dtype=np.float32)[None, :]
    x = np.ones((128, 512), np.float32)
    with record(target="trn2") as tr:
        out = simulate(kernel)(row, x)
    np.testing.assert_array_equal(np.asarray(out), np.broadcast_to(row, x.shape))
    tagged = [i for i in tr.instructions if (i.attrs or {}).get("lowering") == "nl.broadcast_to"]
    assert {i.op for i in tagged} >= {"tensor_copy", "memset", "nc_matmul"}
    t = perf.model(tr, "trn2")
    # VectorE is busy only with the multiply; TensorE runs the ones-matmul at the 0/1 fp32 rate
    tt = [i for i in tr.instructions if i.op == "tensor_tensor"][0]
    assert t.busy_ns["vector"] == pytest.approx(costs.compute_ns(tt, TRN2))
    assert t.busy_ns["tensor"] == pytest.approx((2 * 512 + 128) / 2.4)


def test_dma_run_length_recorded_and_priced(sim):
    nl, nisa, simulate, record = sim

    def load_cols(x, width):
        out = nl.ndarray((128, width), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, width), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:128, 0:width])
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.ones((128, 2048), np.float32)
    with record(target="trn2") as tr:
        simulate(load_cols)(x, 64)           # 256 B runs, 8 KiB apart
    narrow = tr.instructions[0]
    assert narrow.attrs["run_bytes"] == 256 and narrow.attrs["bytes_per_partition"] == 256
    with record(target="trn2") as tr2:
        simulate(load_cols)(x, 2048)         # whole rows: one contiguous 1 MiB run
    assert tr2.instructions[0].attrs["run_bytes"] == 128 * 2048 * 4
    # the short runs move at 256 / dma_min_run_bytes (512: issue 11's rule) of the sustained rate
    _, ns = costs.dma_plan(narrow, TRN2)
    assert ns == pytest.approx(128 * 256 / (16 * 23.0 * 0.85 * 256 / TRN2.dma_min_run_bytes))
    assert ns == pytest.approx(2 * 128 * 256 / (16 * 23.0 * 0.85))


def test_profile_reports_program_and_dynamic_instructions(sim):
    nl, nisa, simulate, record = sim
    if not hasattr(nl, "fori_loop"):
        pytest.skip("simulator without runtime loops")

    def kernel(x, n):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)

        def body(i):
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

        nl.fori_loop(0, n, body)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.zeros((128, 64), np.float32)
    out, t = perf.profile(kernel, x, 5, target="trn2")
    np.testing.assert_array_equal(np.asarray(out), x + 5)
    assert t.num_instructions == 2 + 5 and t.program_instructions == 2 + 1
    assert t.loop_iterations == 5
    assert t.time_low_ns <= t.time_ns <= t.time_high_ns
