"""Scheduler behaviour on hand-built traces: overlap, dependencies, binding engine."""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nki_ssm import perf
from nki_ssm.perf import costs
from nki_ssm.perf.hardware import TRN2
from tests.perf.synth import act, dma, hbm, mm, new_storage, sbuf, trace_of, vec


def _dur(inst):
    return costs.compute_ns(inst, TRN2)


def test_independent_instructions_on_different_engines_overlap():
    a, b, c, d = (new_storage() for _ in range(4))
    v = vec([sbuf(a)], [sbuf(b)])
    s = act([sbuf(c)], [sbuf(d)])
    t = perf.model(trace_of(v, s))
    assert t.schedule.start[0] == 0 and t.schedule.start[1] == 0
    assert t.time_ns == pytest.approx(max(_dur(v), _dur(s)))
    assert t.time_ns < _dur(v) + _dur(s)


def test_same_engine_runs_in_program_order():
    ids = [new_storage() for _ in range(4)]
    v1 = vec([sbuf(ids[0])], [sbuf(ids[1])])
    v2 = vec([sbuf(ids[2])], [sbuf(ids[3])])
    t = perf.model(trace_of(v1, v2))
    assert t.schedule.start[1] == pytest.approx(t.schedule.end[0])
    assert t.time_ns == pytest.approx(_dur(v1) + _dur(v2))


def test_consumer_waits_for_producer():
    src, buf, out = new_storage(), new_storage(), new_storage()
    load = dma(hbm(src, 128 * 2048), sbuf(buf), 128 * 2048)
    use = vec([sbuf(buf)], [sbuf(out)])
    t = perf.model(trace_of(load, use))
    assert t.schedule.start[1] >= t.schedule.end[0]
    # a DMA signals its consumer through its completion semaphore
    assert t.schedule.start[1] == pytest.approx(t.schedule.end[0] + TRN2.dma_completion_ns)
    # the DMA pays its fixed latency before data moves
    assert t.schedule.dma_data_start[0] == pytest.approx(TRN2.dma_fixed_ns)


def test_disjoint_partitions_of_one_tile_do_not_depend():
    buf, out = new_storage(), new_storage()
    w = act([sbuf(new_storage())], [sbuf(buf, parts=64, p0=0)])
    r = vec([sbuf(buf, parts=64, p0=64)], [sbuf(out)])
    t = perf.model(trace_of(w, r))
    assert t.schedule.start[1] == 0.0


def test_same_engine_read_after_write_pays_pipeline_latency():
    a, b, c = new_storage(), new_storage(), new_storage()
    v1 = vec([sbuf(a)], [sbuf(b)], n=1, inputs=1)
    v2 = vec([sbuf(b)], [sbuf(c)], n=1, inputs=1)
    t = perf.model(trace_of(v1, v2))
    gap = t.schedule.start[1] - t.schedule.end[0]
    assert gap == pytest.approx(TRN2.vector_raw_cycles / TRN2.vector_ghz)


def test_write_after_read_respected():
    buf, out, src = new_storage(), new_storage(), new_storage()
    reader = vec([sbuf(buf)], [sbuf(out)], n=8192)     # long VectorE read of buf
    overwrite = dma(hbm(src, 128 * 2048), sbuf(buf), 128 * 2048)
    t = perf.model(trace_of(reader, overwrite))
    assert t.schedule.dma_data_start[1] >= t.schedule.end[0]


def test_write_after_write_respected():
    buf, a, b = new_storage(), new_storage(), new_storage()
    w1 = vec([sbuf(a)], [sbuf(buf)], n=8192)
    w2 = act([sbuf(b)], [sbuf(buf)], n=16)
    t = perf.model(trace_of(w1, w2))
    assert t.schedule.start[1] >= t.schedule.end[0]
    assert t.schedule.end[1] > t.schedule.end[0]


def _loop(iters, double_buffer, vec_n=2048, dma_bytes=128 * 4096):
    src, out = new_storage(), new_storage()
    single = new_storage()
    insts = []
    for i in range(iters):
        buf = new_storage() if double_buffer else single
        res = new_storage()
        insts.append(dma(hbm(src, dma_bytes, b0=i * dma_bytes), sbuf(buf, nbytes=dma_bytes // 128),
                         dma_bytes))
        insts.append(vec([sbuf(buf, nbytes=dma_bytes // 128)], [sbuf(res)], n=vec_n, inputs=1))
        insts.append(vec([sbuf(res)], [sbuf(out, nbytes=4, b0=4 * i)], n=1, inputs=1, op="reduce"))
    return trace_of(*insts)


def test_double_buffered_dma_hides_behind_compute():
    iters = 8
    dbl = perf.model(_loop(iters, True))
    one = perf.model(_loop(iters, False))
    v = costs.compute_ns(vec([], [], n=2048, inputs=1), TRN2)
    _, xfer = costs.dma_plan(dma(hbm(1, 1), sbuf(1), 128 * 4096), TRN2)
    first_dma = TRN2.dma_fixed_ns + xfer + TRN2.dma_completion_ns
    assert v > xfer  # the loop is compute-bound per iteration
    # with fresh buffers, only the first load is exposed
    reduce = costs.compute_ns(vec([], [], n=1, inputs=1), TRN2) + costs.raw_latency_ns("vector", TRN2)
    assert dbl.time_ns < first_dma + iters * (v + reduce) + 1.0   # + the small dependent reduce
    assert dbl.binding_engine == "vector"
    # one reused buffer serialises load and compute (WAR on the buffer)
    assert one.time_ns > dbl.time_ns + (iters - 1) * 0.9 * first_dma


def test_dma_bound_loop_reports_dma_binding():
    insts = []
    src = new_storage()
    for i in range(16):
        buf, out = new_storage(), new_storage()
        nb = 128 * 8192
        insts.append(dma(hbm(src, nb, b0=i * nb), sbuf(buf, nbytes=8192), nb))
        insts.append(vec([sbuf(buf, nbytes=8192)], [sbuf(out)], n=64, inputs=1))
    t = perf.model(trace_of(*insts))
    assert t.binding_engine == "dma"
    assert t.critical_ns["dma"] > 0.8 * t.time_ns
    assert t.dma_transfers == 16 and t.dma_bytes == 16 * 128 * 8192
    assert t.share["dma"] > 0.9


def test_critical_path_partitions_total_time():
    tr = _loop(5, True)
    t = perf.model(tr)
    assert sum(t.critical_ns.values()) == pytest.approx(t.time_ns)


def test_dma_spreads_over_engines_by_partitions():
    one = dma(hbm(1, 32768), sbuf(2, parts=4, nbytes=8192), 32768, partitions=4)
    full = dma(hbm(1, 128 * 256), sbuf(2, nbytes=256), 128 * 256, partitions=128)
    assert costs.dma_plan(one, TRN2)[0] == 1
    assert costs.dma_plan(full, TRN2)[0] == 16
    # 16 small independent single-engine transfers run concurrently on 16 queues
    insts = [dma(hbm(new_storage(), 32768), sbuf(new_storage(), parts=4, nbytes=8192), 32768,
                 partitions=4) for _ in range(16)]
    t = perf.model(trace_of(*insts))
    single = TRN2.dma_fixed_ns + costs.dma_plan(one, TRN2)[1]
    assert t.time_ns == pytest.approx(single)
    insts.append(dma(hbm(new_storage(), 32768), sbuf(new_storage(), parts=4, nbytes=8192), 32768,
                     partitions=4))
    t17 = perf.model(trace_of(*insts))
    assert t17.time_ns == pytest.approx(single + costs.dma_plan(one, TRN2)[1])


def test_matmul_flops_and_roofline():
    a, b, c = new_storage(), new_storage(), new_storage()
    t = perf.model(trace_of(mm([sbuf(a), sbuf(b)], [Region_psum(c)])))
    assert t.matmul_flops == 2 * 128 * 128 * 512
    flops = t.matmul_flops
    assert t.roofline(flops, 0) == pytest.approx(flops / TRN2.bf16_peak_flops * 1e9 / t.time_ns)
    # one bf16 N=512 matmul runs at the array's rate: 128*128*2*2.4 GHz = 78.6 vs the 79 TFLOPS quoted
    assert t.roofline(flops, 0) == pytest.approx(1.0, rel=0.01)
    assert t.roofline_bound(flops, 0) == "compute"
    with pytest.raises(ValueError, match="min_flops"):
        t.roofline(-1, 0)


def Region_psum(sid):
    from nki_ssm.sim.trace import Region

    return Region("psum", sid, 0, 128, 0, 2048)


def test_target_selection():
    tr = _loop(2, True)
    t2, t3 = perf.model(tr, target="trn2"), perf.model(tr, target="trn3")
    assert t2.target == "trn2" and t3.target == "trn3"
    assert t3.time_ns < t2.time_ns  # faster VectorE clock and DMA on trn3
    with pytest.raises(ValueError, match="target must be one of"):
        perf.model(tr, target="trn9")


def test_large_trace_models_quickly():
    rng = np.random.default_rng(0)
    tiles = [new_storage() for _ in range(64)]
    insts = []
    for i in range(20000):
        a, b = rng.choice(64, 2, replace=False)
        kind = i % 4
        if kind == 0:
            insts.append(dma(hbm(tiles[0], 4096, b0=(i % 97) * 4096), sbuf(tiles[a], nbytes=32), 4096))
        elif kind == 1:
            insts.append(mm([sbuf(tiles[a])], [sbuf(tiles[b])], N=int(rng.integers(1, 512))))
        else:
            insts.append(vec([sbuf(tiles[a], nbytes=int(rng.integers(1, 2048)))],
                             [sbuf(tiles[b], p0=0, nbytes=int(rng.integers(1, 2048)))]))
    tr = trace_of(*insts)
    # CPU time of this process: other jobs sharing the machine do not count
    t0 = time.process_time()
    t = perf.model(tr)
    elapsed = time.process_time() - t0
    assert t.num_instructions == 20000
    assert elapsed < 10.0, f"modeling 2e4 instructions took {elapsed:.1f}s of CPU time"


@st.composite
def _random_trace(draw):
    n = draw(st.integers(1, 25))
    insts = []
    for _ in range(n):
        engine = draw(st.sampled_from(["tensor", "vector", "scalar", "gpsimd", "dma"]))
        nr = draw(st.integers(0, 2))
        regs = []
        for _ in range(nr + 1):
            sid = draw(st.integers(1, 3))
            p0 = draw(st.sampled_from([0, 32, 64]))
            b0 = draw(st.integers(0, 64))
            regs.append(sbuf(sid, parts=draw(st.sampled_from([32, 64])), nbytes=draw(st.integers(1, 64)),
                             p0=p0, b0=b0))
        reads, writes = regs[:-1], regs[-1:]
        if engine == "dma":
            insts.append(dma(reads[0] if reads else hbm(9, 64), writes[0], draw(st.integers(1, 1 << 16)),
                             partitions=writes[0].num_partitions))
        elif engine == "tensor":
            insts.append(mm(reads, writes, N=draw(st.integers(1, 512))))
        else:
            insts.append(vec(reads, writes, engine=engine, n=draw(st.integers(1, 4096)),
                             inputs=max(1, len(reads))))
    return trace_of(*insts)


@settings(max_examples=40, deadline=None)
@given(_random_trace())
def test_schedule_respects_every_dependency_and_engine_order(tr):
    t = perf.model(tr)
    s = t.schedule
    insts = tr.instructions
    begin = np.where(np.array(s.unit) == "dma", s.dma_data_start, s.start)
    for j, b in enumerate(insts):
        for i in range(j):
            a = insts[i]
            raw = any(r.overlaps(w) for r in b.reads for w in a.writes)
            war = any(w.overlaps(r) for w in b.writes for r in a.reads)
            waw = any(w.overlaps(v) for w in b.writes for v in a.writes)
            if raw or war or waw:
                assert begin[j] >= s.end[i] - 1e-9, (i, j, raw, war, waw)
            if a.engine == b.engine and a.engine != "dma":
                assert s.start[j] >= s.end[i] - 1e-9
    assert sum(t.critical_ns.values()) == pytest.approx(t.time_ns)
    assert t.time_ns == pytest.approx(float(s.end.max()))


def _psum(sid):
    from nki_ssm.sim.trace import Region

    return Region("psum", sid, 0, 128, 0, 2048)


@pytest.mark.parametrize("tiles", [8, 9])
def test_psum_banks_limit_tensor_run_ahead(tiles):
    insts = []
    for _ in range(tiles):
        ps, out = new_storage(), new_storage()
        insts.append(mm([sbuf(new_storage())], [_psum(ps)], N=64))
        insts.append(vec([_psum(ps)], [sbuf(out)], n=4096, inputs=1, op="tensor_copy"))
    t = perf.model(trace_of(*insts))
    s = t.schedule
    mm_idx = [i for i, u in enumerate(s.unit) if u == "tensor"]
    first_evict = 1
    if tiles == 8:   # all fit: every matmul runs back to back
        assert s.start[mm_idx[-1]] < s.end[first_evict]
    else:            # the 9th bank is the first tile's, free once its eviction ends
        assert s.start[mm_idx[-1]] >= s.end[first_evict]


def test_sbuf_capacity_bounds_prefetch():
    src = new_storage()
    kib100 = 100 * 1024
    insts = []
    for i in range(3):
        buf, out = new_storage(), new_storage()
        nb = 128 * kib100
        insts.append(dma(hbm(src, nb, b0=i * nb), sbuf(buf, nbytes=kib100), nb))
        insts.append(vec([sbuf(buf, nbytes=kib100)], [sbuf(out, nbytes=64)], n=25600, inputs=1))
    t = perf.model(trace_of(*insts))
    s = t.schedule
    # two 100 KiB tiles fit in 208 KiB; the third load waits for the first tile's reader
    assert s.dma_data_start[4] >= s.end[1]
    assert s.dma_data_start[2] < s.end[1]


def test_optional_semaphore_latency_delays_cross_engine_consumers_only():
    hw = TRN2.with_overrides(semaphore_ns=250.0)
    a, b, c, d = (new_storage() for _ in range(4))
    prod = act([sbuf(a)], [sbuf(b)])
    cross = vec([sbuf(b)], [sbuf(c)])
    same = act([sbuf(b)], [sbuf(d)])
    t = perf.model(trace_of(prod, cross, same), target=hw)
    s = t.schedule
    result = TRN2.scalar_raw_cycles / TRN2.scalar_ghz      # ScalarE's result written, then the semaphore
    assert s.start[1] == pytest.approx(s.end[0] + result + 250.0)
    assert s.start[2] == pytest.approx(s.end[0] + result)


def test_narrow_operand_as_moving_is_cheaper():
    # nki_spec §8.2 [PERF Opt #7]: [1,128] x [128,128] ~64 cycles with the vector moving,
    # ~128 with it stationary
    vec_moving = mm([], [], K=128, M=128, N=1)
    vec_stationary = mm([], [], K=128, M=1, N=128)
    assert costs.tensor_cycles(vec_moving, TRN2) == 64
    assert costs.tensor_cycles(vec_stationary, TRN2) == 128


def test_lnc2_programs_run_on_separate_cores():
    insts = []
    for pid in (0, 1):
        for _ in range(4):
            v = vec([sbuf(new_storage())], [sbuf(new_storage())], n=2048)
            v.program_id = pid
            insts.append(v)
    t = perf.model(trace_of(*insts))
    one = costs.compute_ns(insts[0], TRN2)
    assert t.num_cores == 2
    assert t.time_ns == pytest.approx(4 * one)      # the two cores overlap
    assert t.share["vector"] == pytest.approx(1.0)


def test_dynamic_dma_descriptor_generation():
    def gather(mode):
        return dma(hbm(new_storage(), 4096), sbuf(new_storage(), nbytes=32), 4096,
                   dge_mode=mode, indirect=True)

    static = dma(hbm(new_storage(), 4096), sbuf(new_storage(), nbytes=32), 4096, dge_mode="none")
    t = perf.model(trace_of(static))
    assert t.schedule.dma_data_start[0] == pytest.approx(TRN2.dma_fixed_ns)
    # software DGE: 600 ns of GpSimd per instruction, in GpSimd program order
    sw = perf.model(trace_of(gather("swdge"), gather("swdge")))
    assert sw.busy_ns["gpsimd"] == pytest.approx(2 * TRN2.swdge_issue_ns)
    assert sw.schedule.issue_start[1] == pytest.approx(TRN2.swdge_issue_ns)
    assert sw.schedule.dma_data_start[1] >= 2 * TRN2.swdge_issue_ns
    # hardware DGE: two instances per trn2 core, the third instruction waits for one
    hw3 = perf.model(trace_of(*(gather("hwdge") for _ in range(3))))
    iss = hw3.schedule.issue_start
    assert iss[0] == 0 and iss[1] == 0 and iss[2] == pytest.approx(TRN2.hwdge_issue_ns)
    assert hw3.busy_ns["gpsimd"] == 0
    # compiler's choice for a dynamic DMA: hwdge on trn2, GpSimd (software DGE) on trn1
    auto = trace_of(gather("unknown"))
    assert perf.model(auto, target="trn2").schedule.issue_unit[0] == "hwdge"
    assert perf.model(auto, target="trn1").schedule.issue_unit[0] == "swdge"


def test_optimistic_bracket_speeds_up_a_compute_loop():
    from nki_ssm.perf.hardware import optimistic

    tr = _loop(6, True)
    base, fast = perf.model(tr, target="trn2"), perf.model(tr, target=optimistic("trn2"))
    assert fast.time_ns < base.time_ns and fast.target == "trn2"


def test_swdge_descriptor_work_is_counted():
    g = dma(hbm(new_storage(), 4096), sbuf(new_storage(), nbytes=32), 4096, dge_mode="swdge", indirect=True)
    t = perf.model(trace_of(g))
    (name, count, ns), = [x for x in t.top_ops(5) if x[0] == "gpsimd:swdge descriptors"]
    assert count == 1 and ns == pytest.approx(TRN2.swdge_issue_ns)
