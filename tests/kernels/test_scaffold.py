"""The kernels' run-time scaffolding (nki_ssm/kernels/scaffold.py) on small planted kernels:
trip counts and table cells as device scalars, the work-list loop, the compiled conditional,
the LNC split with dump destinations, the state round trip with a dtype conversion."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ssm import backend
from nki_ssm.backend import nki, nl, nisa
from nki_ssm.kernels import scaffold
from nki_ssm.sim.trace import record


def test_padded_split_and_program_share():
    assert scaffold.padded_split(7, 2) == (4, [(0, 4), (4, 3)])
    assert scaffold.padded_split(1, 2) == (1, [(0, 1), (1, 0)])
    assert scaffold.padded_split(0, 2) == (0, [(0, 0), (0, 0)])
    assert scaffold.padded_split(5, 1) == (5, [(0, 5)])
    assert scaffold.program_share(8, 2, 1) == (4, 4, True)
    assert scaffold.program_share(3, 2, 0) == (0, 3, True)
    assert scaffold.program_share(3, 2, 1) == (0, 3, False)


@nki.jit
def _copy_rows(x, counts, table):
    """out[table[i, 1]] = x[table[i, 0]] * 2 for the first counts[0, 0] rows; +1 on every
    row when counts[0, 1] (a compiled conditional); each program a half of the columns when
    they split, else program 1 runs program 0's columns into a dump of out."""
    programs, pid = scaffold.lnc_grid()
    rows, cols = x.shape
    first, width, real = scaffold.program_share(cols, programs, pid)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    dst = scaffold.destination(out, real)
    n, bump = scaffold.trip_counts(counts)
    t = nl.ndarray((1, width), dtype=x.dtype, buffer=nl.sbuf)

    def row(i, cells):
        nisa.dma_copy(dst=t, src=scaffold.at_row(x, cells[0], [[cols, 1], [1, width]], first))
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)

        def add_one():
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

        scaffold.run_if(bump, add_one)
        nisa.dma_copy(dst=scaffold.at_row(dst, cells[1], [[cols, 1], [1, width]], first), src=t)

    scaffold.for_each_row(n, table, row)
    return out


@pytest.mark.parametrize("cols", [8, 7])        # splits between two programs; does not
@pytest.mark.parametrize("bump", [0, 1])
def test_a_planted_kernel_on_the_scaffolding(cols, bump):
    x = np.arange(5 * cols, dtype=np.float32).reshape(5, cols)
    table = np.array([[3, 0], [0, 1], [4, 2], [9, 9]], dtype=np.int32)  # the last row unused
    counts = np.array([[3, bump]], dtype=np.int32)
    want = np.stack([x[3], x[0], x[4]]) * 2 + bump
    outs = {}
    for lnc in (1, 2):
        with record() as trace:
            out = np.asarray(backend.run(_copy_rows, x, counts, table, backend="sim", lnc=lnc))
        np.testing.assert_array_equal(out[:3], want)
        outs[lnc] = out[:3].tobytes()
        loops = {(p, k): (lp.entries, lp.iterations) for (p, k), lp in trace.loops.items()}
        assert {k: v for (p, k), v in loops.items() if p == 0} == {(0,): (1, 3)}
        if lnc == 2:
            assert loops[(1, (0,))] == loops[(0, (0,))]
            assert [trace.branches[(p, ((0,) + ("if", 0)))].outcomes for p in (0, 1)] == \
                [[bool(bump)] * 3] * 2
    assert outs[1] == outs[2]


@nki.jit
def _round_trip(pool, scratch_rows):
    """Slot 1 of a bf16 pool -> float32 scratch row 0 -> slot 0 of the pool (hbm_copy: the
    DMAs keep each side's dtype, VectorE converts)."""
    scratch = nl.ndarray((scratch_rows, pool.shape[1]), dtype=nl.float32, buffer=nl.private_hbm)
    work = nl.ndarray((1, pool.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    scaffold.hbm_copy(scratch[0:1, :], pool[1:2, :], work)
    scaffold.hbm_copy(pool[0:1, :], scratch[0:1, :], work)
    return pool


def test_hbm_copy_converts_through_float32():
    pool = np.arange(16, dtype=np.float32).reshape(2, 8).astype(ml_dtypes.bfloat16)
    out = np.asarray(backend.run(_round_trip, pool, 1, backend="sim"))
    assert out[0].tobytes() == out[1].tobytes() and out[0, 3] == 11
