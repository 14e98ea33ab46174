"""Runtime control: registers, runtime loops, register addressing, program size and
specialisations (nki_ssm.sim.control; issue 10 part 1).

Sources: NKI docs nki.isa.VirtualRegister (2.32: a register in Python if/while, int() or
range() raises TypeError under the tracer), register_alloc/move/load/store, nl.dynamic_range
(int or register bounds, compile-time positive step), nl.fori_loop / nl.while_loop (0.6.0),
nl.no_reorder (no dynamic loops inside), NKI 0.4.0 release notes (frozen induction register),
the NKI language guide "Compilation Model" / "Kernel Caching" (one program per cache key).
"""
from __future__ import annotations

import numpy as np
import pytest

import nki_ssm.sim as sim
from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.jit import jit, simulate
from nki_ssm.sim.trace import record

ROW = 4


# registers and nl.dynamic_range: the forms of NKI 0.6.0
pytestmark = pytest.mark.nki_version("0.6.0")


@jit
def gather_listed_rows(x, table):
    """out[r] = x[r] for the rows listed in table[1 : 1 + table[0]], zeros elsewhere."""
    num_rows, dim = x.shape
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    head = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=head, src=table.ap(pattern=[[1, 1], [1, 1]], offset=0))
    count = nisa.register_alloc()
    nisa.register_load(count, head)
    zero = nl.ndarray((1, dim), x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    for r in nl.dynamic_range(num_rows):
        nisa.dma_copy(dst=out.ap(pattern=[[dim, 1], [1, dim]], offset=0, scalar_offset=r,
                                 indirect_dim=0), src=zero)
    for i in nl.dynamic_range(count):
        row = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=table.ap(pattern=[[1, 1], [1, 1]], offset=1, scalar_offset=i,
                                            indirect_dim=0))
        buf = nl.ndarray((1, dim), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=buf, src=x.ap(pattern=[[dim, 1], [1, dim]], offset=0,
                                        scalar_offset=row, indirect_dim=0))
        nisa.dma_copy(dst=out.ap(pattern=[[dim, 1], [1, dim]], offset=0, scalar_offset=row,
                                 indirect_dim=0), src=buf)
    return out


def _table(rows, size=9):
    t = np.zeros(size, np.int32)
    t[0] = len(rows)
    t[1:1 + len(rows)] = rows
    return t


@pytest.mark.parametrize("rows", [[], [3], [0, 2, 5, 7], list(range(8))])
def test_runtime_loop_gathers_the_rows_the_table_lists(rows):
    x = np.arange(8 * ROW, dtype=np.float32).reshape(8, ROW)
    y = simulate(gather_listed_rows)(x, _table(rows))
    want = np.zeros_like(x)
    want[rows] = x[rows]
    np.testing.assert_array_equal(y, want)


def test_program_size_does_not_grow_with_the_trip_count():
    x = np.ones((64, ROW), np.float32)
    sizes, dynamic = set(), []
    for rows in ([1], [2, 9, 33], list(range(0, 64, 2))):
        with record() as tr:
            simulate(gather_listed_rows)(x, _table(rows, 65))
        sizes.add(tr.program_instructions())
        dynamic.append(len(tr))
    # dma(table) + memset + zero-fill body (1) + gather body (3)
    assert sizes == {6}
    assert dynamic == sorted(dynamic) and dynamic[0] < dynamic[-1]


def test_trace_marks_loop_and_iteration():
    x = np.ones((4, ROW), np.float32)
    with record() as tr:
        simulate(gather_listed_rows)(x, _table([1, 2]))
    paths = [inst.loop_path for inst in tr.instructions]
    assert paths[0] == () and paths[1] == ()
    zero_fill = [p for p in paths if p and p[0][0] == (0,)]
    assert [p[0][1] for p in zero_fill] == [0, 1, 2, 3]
    loops = {lp.loop_id: (lp.entries, lp.iterations) for lp in tr.loops.values()}
    assert loops == {(0,): (1, 4), (1,): (1, 2)}


def test_specialisations_count_distinct_cache_keys():
    sim.reset_specialisations()
    x = np.ones((8, ROW), np.float32)
    for rows in ([1], [2, 3], [], [7, 6, 5]):
        simulate(gather_listed_rows)(x, _table(rows))          # same shapes: one program
    name = next(k for k in sim.specialisations() if k.endswith("gather_listed_rows"))
    assert sim.specialisations()[name] == 1
    simulate(gather_listed_rows)(np.ones((16, ROW), np.float32), _table([1]))   # new shape
    assert sim.specialisations()[name] == 2


def test_non_tensor_arguments_are_part_of_the_cache_key():
    @jit
    def scaled_copy(x, flag):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    sim.reset_specialisations()
    x = np.ones((2, 2), np.float32)
    for flag in (1, 2, 2, 3):
        simulate(scaled_copy)(x, flag)
    assert [v for k, v in sim.specialisations().items() if k.endswith("scaled_copy")] == [3]


@pytest.mark.parametrize("use", ["bool", "int", "range", "ds", "if"])
def test_registers_cannot_drive_python_control_flow(use):
    r = nisa.register_alloc(3)

    def run():
        if use == "bool":
            return bool(r)
        if use == "int":
            return int(r)
        if use == "range":
            return range(r)
        if use == "ds":
            return nl.ds(r, 4)
        if r:
            return 1
        return 0

    with pytest.raises(TypeError, match="run-time value|must be an int"):
        run()


def test_induction_variable_is_frozen():
    for i in nl.dynamic_range(2):
        with pytest.raises(NkiValidationError, match="frozen"):
            nisa.register_move(i, 5)


def test_dynamic_range_takes_register_bounds_and_a_positive_static_step():
    lo, hi = nisa.register_alloc(2), nisa.register_alloc(9)
    assert [i.runtime_value("t") for i in nl.dynamic_range(lo, hi, 3)] == [2, 5, 8]
    with pytest.raises(NkiValidationError, match="step"):
        list(nl.dynamic_range(0, 4, 0))
    with pytest.raises(NkiValidationError, match="step"):
        list(nl.dynamic_range(0, 4, nisa.register_alloc(1)))
    with pytest.raises(TypeError, match="stop"):
        list(nl.dynamic_range(2.5))


def test_fori_loop_and_while_loop_run_at_runtime():
    seen = []
    nl.fori_loop(0, 6, lambda i: seen.append(i.runtime_value("t")), step=2)
    assert seen == [0, 2, 4]
    count = nisa.register_alloc(3)
    tile = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    visits = []

    def body(r):
        visits.append(r.runtime_value("t"))
        nisa.register_store(tile, r)
        nisa.tensor_scalar(dst=tile, data=tile, op0=nl.subtract, operand0=1)
        nxt = nisa.register_alloc()
        nisa.register_load(nxt, tile)
        return nxt

    # the 0.6.0 docstring: "the condition is checked before each iteration"; returns None
    assert nl.while_loop(count, body) is None
    assert visits == [3, 2, 1]
    with pytest.raises(TypeError, match="init"):
        nl.while_loop(3, body)


def test_no_runtime_loop_inside_no_reorder():
    with nl.no_reorder():
        with pytest.raises(NkiValidationError, match="no_reorder"):
            list(nl.dynamic_range(2))
    assert [1 for _ in nl.dynamic_range(2)] == [1, 1]   # fine outside


def test_a_body_that_changes_between_iterations_is_rejected():
    """The compiler traces a runtime loop's body once; Python state that changes per
    iteration would make the simulator run a different program than the device."""
    @jit
    def drifting(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        extra = [0]
        for _ in nl.dynamic_range(3):
            nisa.tensor_copy(dst=t, src=t)
            if extra[0] == 1:
                nisa.tensor_copy(dst=t, src=t)
            extra[0] = extra[0] + 1
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.raises(NkiValidationError, match="iteration 1 .* different instruction stream"):
        simulate(drifting)(np.ones((2, 2), np.float32))


def test_scalar_offset_register_is_bounds_checked():
    x = np.ones((4, ROW), np.float32)
    with pytest.raises(NkiValidationError, match="out of bounds"):
        simulate(gather_listed_rows)(x, _table([4, 1]))

