"""The cost model at LNC=2: two programs on the two physical cores of a logical core.

Hand-built traces (synth.py): a "sharded kernel" whose programs each load and
process their own slice of one HBM tensor, timed against the LNC=1 trace of
the whole work.
"""
import pytest

from nki_ssm import perf
from nki_ssm.perf import costs
from nki_ssm.perf.hardware import TRN2
from nki_ssm.sim.trace import Instruction, Region
from tests.perf.synth import dma, hbm, new_storage, sbuf, trace_of, vec

TILE = 128 * 4096          # bytes of one [128, 1024] fp32 tile: 4 KiB rows, full DMA efficiency


def _tagged(insts, pid):
    for inst in insts:
        inst.program_id = pid
    return insts


def _load_and_scale(src, tiles, first=0, compute=True):
    """Load ``tiles`` tiles of ``src`` from tile ``first`` on, each scaled on VectorE into SBUF."""
    insts = []
    for k in range(first, first + tiles):
        t = sbuf(new_storage(), nbytes=4096)
        insts.append(dma(hbm(src, TILE, b0=k * TILE), t, TILE))
        if compute:
            insts.append(vec([t], [sbuf(new_storage(), nbytes=4096)], n=1024, inputs=1,
                             op="tensor_scalar"))
    return insts


def _sharded(tiles, lnc, *, both_full=False, compute=True):
    """The same work as one program (lnc=1) or split in halves over two programs (lnc=2).

    ``both_full``: each of the two programs does all the work (a kernel ignoring program_id).
    """
    src = new_storage()
    if lnc == 1:
        return trace_of(*_load_and_scale(src, tiles, compute=compute))
    half = tiles // 2
    p0 = _load_and_scale(src, tiles if both_full else half, compute=compute)
    p1 = _load_and_scale(src, tiles if both_full else tiles - half, 0 if both_full else half, compute=compute)
    return trace_of(*_tagged(p0, 0), *_tagged(p1, 1))


def _sync(op, pid, engine="gpsimd", nbytes=0):
    inst = Instruction(index=0, op=op, engine=engine, reads=(), writes=(), num_partitions=1, free_size=1,
                       num_inputs=0, nbytes=nbytes, attrs={"partitions": 1})
    inst.program_id = pid
    return inst


def test_split_work_takes_half_the_time():
    t1 = perf.model(_sharded(64, 1))
    t2 = perf.model(_sharded(64, 2))
    assert t2.num_cores == 2 and len(t2.program_time_ns) == 2
    assert t2.time_ns == pytest.approx(max(t2.program_time_ns))
    assert t2.program_time_ns[0] == pytest.approx(t2.program_time_ns[1], rel=0.02)
    assert 0.45 < t2.time_ns / t1.time_ns < 0.55


def test_trace_order_does_not_serialise_the_programs():
    # program 1 comes after program 0 in the trace and touches other bytes of the same HBM
    # tensor (many records: the index folds them); it still starts at once
    tr = _sharded(200, 2, compute=False)
    t = perf.model(tr)
    s = t.schedule
    first_p1 = next(i for i, inst in enumerate(tr.instructions) if inst.program_id == 1)
    assert s.dma_data_start[first_p1] == pytest.approx(TRN2.dma_fixed_ns)
    assert t.program_time_ns[1] == pytest.approx(t.program_time_ns[0], rel=0.02)


def test_both_programs_doing_all_the_work_gain_nothing():
    t1 = perf.model(_sharded(64, 1))
    t2 = perf.model(_sharded(64, 2, both_full=True))
    assert t2.time_ns / t1.time_ns == pytest.approx(1.0, abs=0.02)


def _hbm_limited():
    """trn2 with an HBM share below the DMA engines' rate (16 x 23 B/ns x 0.85 = 313 B/ns)."""
    return TRN2.with_overrides(hbm_bw_per_core=100.0)


def test_hbm_share_binds_when_both_programs_move_data():
    hw = _hbm_limited()
    t1 = perf.model(_sharded(64, 1, compute=False), hw)
    # LNC=1: the core's share of the bank (its partner core runs another kernel)
    assert t1.time_ns == pytest.approx(64 * TILE / 100.0, rel=0.05)
    # both programs move all the data at once: each gets its share, no gain
    both = perf.model(_sharded(64, 2, both_full=True, compute=False), hw)
    assert both.time_ns / t1.time_ns == pytest.approx(1.0, rel=0.05)
    # halves: each program its share, half the bytes
    halves = perf.model(_sharded(64, 2, compute=False), hw)
    assert halves.time_ns / t1.time_ns == pytest.approx(0.5, rel=0.05)
    # the central trn2 constants: the DMA engines bind, not the share
    assert perf.model(_sharded(64, 1, compute=False)).time_ns < t1.time_ns / 2


def test_a_program_alone_uses_the_whole_bank():
    hw = _hbm_limited()
    src = new_storage()
    lnc2 = trace_of(*_tagged(_load_and_scale(src, 64, compute=False), 0),
                    *_tagged([vec([sbuf(new_storage())], [sbuf(new_storage())], n=8)], 1))
    t1 = perf.model(_sharded(64, 1, compute=False), hw)
    t2 = perf.model(lnc2, hw)
    assert t2.time_ns / t1.time_ns == pytest.approx(0.5, rel=0.05)     # 2 x 100 B/ns, below 313


def test_sbuf_to_sbuf_transfers_do_not_use_the_hbm_share():
    hw = _hbm_limited()
    insts = [dma(sbuf(new_storage(), nbytes=4096), sbuf(new_storage(), nbytes=4096), TILE) for _ in range(16)]
    assert perf.model(trace_of(*insts), hw).time_ns == pytest.approx(perf.model(trace_of(*insts)).time_ns)


@pytest.mark.parametrize("op", ["core_barrier", "sendrecv"])
def test_sync_joins_the_programs(op):
    work0 = [vec([sbuf(new_storage())], [sbuf(new_storage())], n=4096) for _ in range(8)]
    work1 = [vec([sbuf(new_storage())], [sbuf(new_storage())], n=4096)]
    after0 = vec([sbuf(new_storage())], [sbuf(new_storage())], n=8)
    after1 = vec([sbuf(new_storage())], [sbuf(new_storage())], n=8)
    sync0, sync1 = _sync(op, 0), _sync(op, 1)
    insts = (_tagged(work0, 0) + [sync0, _tagged([after0], 0)[0]]
             + _tagged(work1, 1) + [sync1, _tagged([after1], 1)[0]])
    t = perf.model(trace_of(*insts))
    s = t.schedule
    idx = {id(inst): k for k, inst in enumerate(insts)}
    b0, b1 = idx[id(sync0)], idx[id(sync1)]
    arrival0 = 8 * costs.compute_ns(work0[0], TRN2)
    # program 1 arrives early and waits for program 0; both leave a semaphore after the later arrival
    assert s.start[b1] < s.start[b0] == pytest.approx(arrival0)
    assert s.end[b0] == pytest.approx(s.end[b1])
    assert s.end[b0] == pytest.approx(arrival0 + TRN2.semaphore_ns)
    assert s.start[idx[id(after1)]] >= s.end[b1]
    assert s.start[idx[id(after0)]] >= s.end[b0]
    assert t.time_ns == pytest.approx(max(t.program_time_ns))


def test_without_a_sync_the_programs_do_not_wait():
    work0 = _tagged([vec([sbuf(new_storage())], [sbuf(new_storage())], n=4096) for _ in range(8)], 0)
    after1 = _tagged([vec([sbuf(new_storage())], [sbuf(new_storage())], n=8)], 1)
    t = perf.model(trace_of(*work0, *after1))
    assert t.schedule.start[8] == 0.0
    assert t.program_time_ns[1] < t.program_time_ns[0] == t.time_ns


def test_sendrecv_moves_its_bytes_after_the_handshake():
    insts = [_sync("sendrecv", 0, engine="dma", nbytes=TILE), _sync("sendrecv", 1, engine="dma", nbytes=TILE)]
    insts[0].attrs.update(partitions=128)
    insts[1].attrs.update(partitions=128)
    t = perf.model(trace_of(*insts))
    xfer = costs.dma_plan(insts[0], TRN2)[1]
    assert t.schedule.end[0] == pytest.approx(TRN2.semaphore_ns + xfer)
    assert t.dma_bytes == 2 * TILE


def test_lnc1_trace_is_one_program():
    t = perf.model(_sharded(8, 1))
    assert t.num_cores == 1 and t.program_time_ns == [pytest.approx(t.time_ns)]


def test_region_helper_kept():
    # synth's hbm() region spans one partition: the two halves of a tensor are disjoint bytes
    a, b = hbm(1, 16, b0=0), hbm(1, 16, b0=16)
    assert isinstance(a, Region) and not a.overlaps(b)


def _row_tiles_kernel(shard: bool):
    """A simulated kernel: every [128, 1024] fp32 row tile of x loaded, scaled, stored; with
    ``shard`` each program takes its half of the tiles (nl.program_id), else all of them."""
    from nki_ssm.sim import isa as nisa
    from nki_ssm.sim import language as nl

    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tiles = x.shape[0] // 128
        n, pid = (nl.num_programs(), nl.program_id(0)) if shard else (1, 0)
        per = tiles // n
        for k in range(pid * per, (pid + 1) * per):
            rows = slice(k * 128, (k + 1) * 128)
            t = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[rows, :])
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
            nisa.dma_copy(dst=out[rows, :], src=t)
        return out

    return kernel


def test_simulated_sharded_kernel_halves_the_time():
    import numpy as np

    pytest.importorskip("nki_ssm.sim.jit")
    from nki_ssm.sim.jit import jit, simulate
    from nki_ssm.sim.trace import record

    x = np.arange(16 * 128 * 1024, dtype=np.float32).reshape(16 * 128, 1024) / 1e6
    times = {}
    for name, shard, lnc in (("lnc1", False, 1), ("sharded", True, 2)):
        k = jit(_row_tiles_kernel(shard))
        with record(target="trn2") as tr:
            out = simulate(k[lnc] if lnc > 1 else k)(x)
        np.testing.assert_array_equal(np.asarray(out), 2 * x)
        times[name] = perf.model(tr)
    t2 = times["sharded"]
    assert t2.num_cores == 2 and len(t2.program_time_ns) == 2
    assert 0.45 < t2.time_ns / times["lnc1"].time_ns < 0.6
