"""Program size counts every runtime-loop body once, run or not (sim.control, sim.trace).

The compiler compiles each runtime loop's body once whatever its trip count (NKI language
guide, "Compilation Model"; nl.dynamic_range deep dive: "a single copy of the body is
generated and the hardware iterates over it at runtime"). A body whose loop runs zero times is
traced once with its effects suppressed: it adds to ``Trace.program_instructions()`` and
``Trace.unrun``, never to ``Trace.instructions`` (what the cost model times), writes no memory
that existed before it, leaves registers and engine accumulators as they were, and reads its
runtime offsets as 0 instead of failing on the garbage a body that never runs would read.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.control import NkiKnownIssueWarning
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.jit import jit, simulate
from nki_ssm.sim.trace import record

N, DIM = 8, 4
GARBAGE = 1 << 20      # what the padding of a row table holds: far out of bounds


def _load_count(table):
    head = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=head, src=table.ap(pattern=[[1, 1], [1, 1]], offset=0))
    count = nisa.register_alloc()
    nisa.register_load(count, head)
    return head, count


def _scaled_row_copy(x, out, table, i, row, row_reg, buf):
    """out[table[1 + i]] = 2 * x[table[1 + i]] (4 instructions; register_load is none)."""
    dim = x.shape[1]
    nisa.dma_copy(dst=row, src=table.ap(pattern=[[1, 1], [1, 1]], offset=1, scalar_offset=i,
                                        indirect_dim=0))
    nisa.register_load(row_reg, row)
    nisa.dma_copy(dst=buf, src=x.ap(pattern=[[dim, 1], [1, dim]], offset=0,
                                    scalar_offset=row_reg, indirect_dim=0))
    nisa.tensor_scalar(dst=buf, data=buf, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out.ap(pattern=[[dim, 1], [1, dim]], offset=0, scalar_offset=row_reg,
                             indirect_dim=0), src=buf)


def _setup(x, table):
    """out zero-filled (2 instructions), the count register (1), the body's tiles."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    nisa.dma_copy(dst=out, src=zero)
    head, count = _load_count(table)
    row_reg = nisa.register_alloc(0)
    buf = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    return out, head, count, row_reg, buf


@jit
def rows_by_fori_loop(x, table):
    out, head, count, row_reg, buf = _setup(x, table)

    def body(i):
        _scaled_row_copy(x, out, table, i, head, row_reg, buf)

    nl.fori_loop(0, count, body)
    return out


@jit
def rows_by_dynamic_range(x, table):
    out, head, count, row_reg, buf = _setup(x, table)
    for i in nl.dynamic_range(count):
        _scaled_row_copy(x, out, table, i, head, row_reg, buf)
    return out


@jit
def rows_by_while_loop(x, table):
    """The while loop counts ``count`` down to 0 in ``head`` and copies row table[1 + head]."""
    out, head, count, row_reg, buf = _setup(x, table)
    idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)

    def body(r):
        nisa.tensor_scalar(dst=head, data=head, op0=nl.subtract, operand0=1)
        nisa.register_load(r, head)
        nisa.dma_copy(dst=idx, src=head)
        nisa.register_load(row_reg, idx)
        _scaled_row_copy(x, out, table, row_reg, idx, row_reg, buf)
        return r

    nl.while_loop(count, body)
    return out


def _table(rows):
    t = np.full(N + 1, GARBAGE, np.int32)
    t[0] = len(rows)
    t[1:1 + len(rows)] = rows
    return t


def _want(x, rows):
    y = np.zeros_like(x)
    y[rows] = 2 * x[rows]
    return y


KERNELS = [(rows_by_fori_loop, 4), (rows_by_dynamic_range, 4), (rows_by_while_loop, 6)]


@pytest.mark.nki_version("0.6.0")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("kernel, body", KERNELS, ids=["fori_loop", "dynamic_range", "while_loop"])
def test_program_size_does_not_depend_on_the_trip_count(kernel, body):
    x = np.arange(N * DIM, dtype=np.float32).reshape(N, DIM)
    sizes = []
    for rows in ([], [3], [0, 5, 7]):
        with record() as tr:
            y = simulate(kernel)(x, _table(rows))
        np.testing.assert_array_equal(y, _want(x, rows))   # nothing of the unrun body leaks
        sizes.append(tr.program_instructions())
        looped = [i for i in tr.instructions if i.loop_path]
        assert len(looped) == body * len(rows)               # only what ran is timed
        assert len(tr.unrun) == (body if not rows else 0)
        assert all(i.loop_path for i in tr.unrun)
        assert all(lp.iterations == len(rows) for lp in tr.loops.values())
    assert sizes == [3 + body] * 3


def test_unrun_body_writes_nothing_and_restores_registers():
    reg = nisa.register_alloc(7)
    tile = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=tile, value=3)

    def body(i):
        fresh = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=fresh, value=5)            # its own tile: written
        nisa.tensor_copy(dst=tile, src=fresh)      # older memory: not written
        nisa.register_load(reg, fresh)
        seen.append(reg.runtime_value("t"))

    seen = []
    with record() as tr:
        nl.fori_loop(0, 0, body)
    assert seen == [5]                      # the body was traced once, computing as it goes
    assert reg.runtime_value("t") == 7      # ... and left the register as it was
    assert int(tile.read().reshape(-1)[0]) == 3
    assert len(tr.instructions) == 0 and len(tr.unrun) == 2     # memset, tensor_copy
    assert tr.program_instructions() == 2


def test_a_loop_whose_body_already_ran_is_not_traced_again():
    seen = []
    with record() as tr:
        for n in (2, 0):
            nl.fori_loop(0, n, lambda i: seen.append(nisa.memset(
                dst=nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf), value=0.0)))
    # two loops (one per unrolled Python iteration): the second never ran -> traced once
    assert len(seen) == 3 and len(tr.unrun) == 1 and tr.program_instructions() == 2


def test_runtime_loops_inside_an_unrun_body_are_traced_once():
    t = nl.ndarray((1, 2), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    count = nisa.register_alloc(GARBAGE)

    def inner(j):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

    def outer(i):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nl.fori_loop(0, count, inner)     # a garbage bound: not read in an unrun body

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NkiKnownIssueWarning)
        with record() as tr:
            nl.fori_loop(0, 0, outer)
    assert [len(i.loop_path) for i in tr.unrun] == [1, 2]
    assert tr.program_instructions() == 2 and len(tr.instructions) == 0
    np.testing.assert_array_equal(t.read(), [[1.0, 1.0]])


def test_static_errors_in_an_unrun_body_are_still_errors():
    a = nl.ndarray((64, 4), nl.float32, buffer=nl.sbuf)

    def body(i):
        nisa.tensor_scalar(dst=a[0:32], data=a, op0=nl.add, operand0=1.0)

    with pytest.raises(NkiValidationError, match="partitions"):
        nl.fori_loop(0, 0, body)
