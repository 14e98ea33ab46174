"""The trace records what the cost model needs: engine, sizes, regions, attrs."""
from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.trace import record

nki = importlib.import_module("nki_ssm.sim.jit")
BF16 = ml_dtypes.bfloat16


@nki.jit
def small_kernel(a, b):
    out = nl.ndarray((64, 256), dtype=nl.float32, buffer=nl.shared_hbm)
    sa = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
    sb_ = nl.ndarray((128, 256), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sa, src=a)
    nisa.dma_copy(dst=sb_, src=b)
    p = nl.ndarray((64, 256), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=sa, moving=sb_)
    e = nl.ndarray((64, 256), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=p, scale=0.5)
    f = nl.ndarray((64, 256), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=f, data1=e, data2=p, op=nl.add)
    nisa.dma_copy(dst=out, src=f)
    return out


def _run():
    a = np.ones((128, 64), BF16)
    b = np.ones((128, 256), BF16)
    with record() as tr:
        nki.simulate(small_kernel)(a, b)
    return tr


def test_trace_engines_and_order():
    tr = _run()
    assert [i.op for i in tr.instructions] == ["dma_copy", "dma_copy", "nc_matmul", "activation",
                                               "tensor_tensor", "dma_copy"]
    assert [i.engine for i in tr.instructions] == ["dma", "dma", "tensor", "scalar", "vector", "dma"]
    assert [i.index for i in tr.instructions] == list(range(6))
    assert tr.target == "trn2"
    assert {e: len(v) for e, v in tr.by_engine().items() if v} == {"dma": 3, "tensor": 1, "scalar": 1,
                                                                  "vector": 1}


def test_trace_matmul_record():
    mm = _run().instructions[2]
    assert mm.attrs["K"] == 128 and mm.attrs["M"] == 64 and mm.attrs["N"] == 256
    assert mm.attrs["fp32"] is False and mm.attrs["is_transpose"] is False
    assert mm.attrs["perf_mode"] == "none" and mm.attrs["onezero"] is False
    assert mm.free_size == 256 and mm.num_partitions == 128 and mm.num_inputs == 2
    assert mm.nbytes == 64 * 256 * 4
    (w,) = mm.writes
    assert (w.buffer, w.partition_start, w.num_partitions, w.byte_start, w.byte_stop) == ("psum", 0, 64, 0, 1024)
    assert {r.buffer for r in mm.reads} == {"sbuf"}
    assert mm.dtypes == {"dst": "float32", "stationary": "bfloat16", "moving": "bfloat16"}
    assert mm.shapes["moving"] == (128, 256)


def test_trace_dma_record():
    tr = _run()
    d = tr.instructions[1]
    # run_bytes: the HBM side is one contiguous run (the rows are adjacent)
    assert d.attrs == {"partitions": 128, "bytes_per_partition": 512, "run_bytes": 128 * 256 * 2,
                       "dge_mode": "unknown", "indirect": False, "transpose": False}
    assert d.nbytes == 128 * 256 * 2 and d.free_size == 256
    (r,) = d.reads
    assert r.buffer == "hbm" and r.byte_stop - r.byte_start == 128 * 256 * 2
    # the final store: SBUF fp32 [64, 256] -> HBM
    st = tr.instructions[5]
    assert st.attrs["partitions"] == 64 and st.attrs["bytes_per_partition"] == 1024


def test_trace_compute_attrs_and_dependencies():
    tr = _run()
    act, tt = tr.instructions[3], tr.instructions[4]
    assert act.attrs["psum_operand"] is True and act.attrs["all_16bit"] is False
    assert act.free_size == 256 and act.num_inputs == 1 and act.nbytes == 64 * 256 * 2
    assert tt.num_inputs == 2 and tt.attrs["contiguous"] is True and tt.attrs["reduce"] is False
    # RAW edges the cost model derives: matmul writes p, activation reads it
    mm = tr.instructions[2]
    assert any(mm.writes[0].overlaps(r) for r in act.reads)
    assert any(act.writes[0].overlaps(r) for r in tt.reads)
    assert not any(tt.writes[0].overlaps(r) for r in act.reads)


def test_trace_strided_view_region_and_16bit_flag():
    t = nl.ndarray((32, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    with record() as tr:
        nisa.tensor_scalar(dst=t[0:32, 8:40:2], data=t[0:32, 0:16], op0=nl.multiply, operand0=2.0)
    inst = tr.instructions[0]
    (w,) = inst.writes
    assert (w.byte_start, w.byte_stop) == (16, 16 + 2 * (2 * 15 + 1))
    assert inst.attrs["all_16bit"] is True and inst.attrs["contiguous"] is False
    assert inst.free_size == 16 and inst.engine == "vector"


def test_trace_engine_override_and_program_id():
    @nki.jit
    def k(x):
        out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((2, 8), dtype=nl.float32, buffer=nl.sbuf)
        rows = nl.ds(2 * nl.program_id(0), 2)       # each program its own rows of out
        nisa.dma_copy(dst=t, src=x[rows, :])
        nisa.tensor_copy(dst=t, src=t, engine=nisa.engine.gpsimd)
        nisa.dma_copy(dst=out[rows, :], src=t)
        return out

    with record() as tr:
        nki.simulate(k[2])(np.zeros((4, 8), np.float32))
    assert [i.program_id for i in tr.instructions] == [0, 0, 0, 1, 1, 1]
    assert tr.instructions[1].engine == "gpsimd"


def test_no_trace_outside_record():
    t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    h = nisa.memset(dst=t, value=0.0)
    assert h.index is None
    with record() as tr:
        h2 = nisa.memset(dst=t, value=0.0)
    assert h2.index == 0 and len(tr) == 1


def test_accumulating_matmul_also_reads_its_psum_tile():
    s = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.sbuf)
    m = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=s, value=1.0)
    nisa.memset(dst=m, value=1.0)
    p = nl.ndarray((4, 16), dtype=nl.float32, buffer=nl.psum)
    with record() as tr:
        nisa.nc_matmul(dst=p, stationary=s, moving=m, accumulate=False)
        nisa.nc_matmul(dst=p, stationary=s, moving=m, accumulate=True)
    first, second = tr.instructions
    assert len(first.reads) == 2 and first.attrs["fp32"] is True
    assert len(second.reads) == 3 and second.reads[2] == p.region()
    assert second.attrs["accumulate"] is True
