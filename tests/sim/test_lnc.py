"""LNC=2: two programs at once over shared HBM, core_barrier / sendrecv, HBM race detection.

Sources: aws-neuron-sdk nki/guides/nki_simulator.rst ("Execution": kernel[2] runs two
concurrent programs, each with its own program_id, over shared_hbm inputs; sendrecv and
core_barrier synchronise them) and the nki.isa API page (core_barrier, sendrecv); released
use in aws-neuron/nki-library d2ad3a5 (see nki_ssm/sim/isa/sync.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.errors import (NkiRaceError, NkiReleasedUseWarning, NkiSyncError,
                                NkiValidationError)
from nki_ssm.sim.jit import jit, simulate
from nki_ssm.sim.trace import record

ROWS, COLS = 4, 8


def _line(kernel, text: str) -> str:
    """``file:line`` of the first line of ``kernel``'s source containing ``text``."""
    import inspect
    lines, first = inspect.getsourcelines(kernel.func)
    k = next(i for i, ln in enumerate(lines) if text in ln)
    return f"{__file__}:{first + k}"


def _x():
    return np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


@jit
def same_row_writes(x):
    """Planted race: both programs write row 0 of the output."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[0:1, :])
    nisa.dma_copy(dst=out[0:1, :], src=t)
    return out


@jit
def handoff(x, sync, writer):
    """Program ``writer`` writes x row 2 into a shared scratch tensor (and out row
    ``writer``); the other program reads the scratch and writes it, plus 100, to its own
    out row. ``sync`` puts a core_barrier between the write and the read (writer 1 checks
    the barrier also orders the program that runs second in each epoch before the other)."""
    pid = nl.program_id(0)
    scratch = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
    out = nl.ndarray((2, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    if pid == writer:
        nisa.dma_copy(dst=t, src=x[2:3, :])
        nisa.dma_copy(dst=scratch, src=t)
        nisa.dma_copy(dst=out[pid:pid + 1, :], src=t)
    if sync:
        nisa.core_barrier(data=scratch, cores=[0, 1])     # the list form nki-library uses
    if pid != writer:
        nisa.dma_copy(dst=t, src=scratch)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=100.0)
        nisa.dma_copy(dst=out[pid:pid + 1, :], src=t)
    return out


@jit
def split(x, by_columns):
    """Disjoint writes: each program its own rows (or its own interleaved columns, whose
    covering byte spans overlap but whose bytes do not); both read all of x."""
    pid, n = nl.program_id(0), nl.num_programs(0)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    ids = nl.ndarray((1, 2), nl.int32, buffer=nl.shared_hbm)
    whole = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=whole, src=x)
    nisa.tensor_scalar(dst=whole, data=whole, op0=nl.add, operand0=float(1000 * (pid + 1)))
    if by_columns:
        nisa.dma_copy(dst=out[:, pid::n], src=whole[:, pid::n])
    else:
        rows = x.shape[0] // n
        nisa.dma_copy(dst=out[pid * rows:(pid + 1) * rows, :],
                      src=whole[pid * rows:(pid + 1) * rows, :])
    pn = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=pn[:, 0:1], value=pid)
    nisa.memset(dst=pn[:, 1:2], value=n)
    nisa.dma_copy(dst=ids[:, pid:pid + 1], src=pn[:, pid:pid + 1])
    return out, ids


@jit
def scatter_rows(x, idx):
    """Each program scatters x's rows to out rows idx[pid] (vector_offset, indirect DMA)."""
    pid = nl.program_id(0)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    it = nl.ndarray((2, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=it, src=idx[pid])
    t = nl.ndarray((2, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[2 * pid:2 * pid + 2, :])
    nisa.dma_copy(dst=out.ap(pattern=[[x.shape[1], 2], [1, x.shape[1]]], vector_offset=it,
                             indirect_dim=0), src=t)
    return out


@jit
def register_row_writes(x, rows):
    """Each program writes row rows[pid] of out through a scalar_offset register view."""
    pid = nl.program_id(0)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    r = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=r, src=rows[pid:pid + 1, :])
    reg = nisa.register_alloc()
    nisa.register_load(reg, r)
    t = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[pid:pid + 1, :])
    nisa.dma_copy(dst=out.ap(pattern=[[x.shape[1], 1], [1, x.shape[1]]], offset=0,
                             scalar_offset=reg, indirect_dim=0), src=t)
    return out


@jit
def exchange(x):
    """sendrecv: each program sends its row of x (plus its id) to the other one, which
    stores what it received into its own row of out."""
    pid = nl.program_id(0)
    out = nl.ndarray((2, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    got = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[pid:pid + 1, :])
    nisa.tensor_scalar(dst=mine, data=mine, op0=nl.add, operand0=float(10 * pid))
    nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=1)
    nisa.dma_copy(dst=out[pid:pid + 1, :], src=got)
    return out


def test_planted_overlapping_write_is_reported():
    with pytest.raises(NkiRaceError) as e:
        simulate(same_row_writes[2])(_x())
    msg = str(e.value)
    assert "program 0 writes and program 1 writes element (0, 0)" in msg
    # the tensor (where it was allocated) and both instructions' source lines
    assert f"allocated at {_line(same_row_writes, 'nl.ndarray(x.shape')}" in msg   # out
    # the write, in each program
    assert msg.count(f"write by dma_copy at {_line(same_row_writes, 'dst=out')}") == 2


def test_one_program_reading_what_the_other_writes_is_reported():
    with pytest.raises(NkiRaceError, match="program 0 writes and program 1 reads") as e:
        simulate(handoff[2])(_x(), False, 0)
    msg = str(e.value)
    assert f"Program 0: write by dma_copy at {_line(handoff, 'dst=scratch')}" in msg
    assert f"program 1: read by dma_copy at {_line(handoff, 'src=scratch')}" in msg


def test_barrier_orders_the_write_before_the_read():
    x = _x()
    for writer in (0, 1):
        out = simulate(handoff[2])(x, True, writer)
        np.testing.assert_array_equal(out[writer], x[2])
        np.testing.assert_array_equal(out[1 - writer], x[2] + 100)   # read the other's write


def test_disjoint_writes_pass_and_program_ids_are_0_and_1():
    x = _x()
    for by_columns in (False, True):
        out, ids = simulate(split[2])(x, by_columns)
        want = np.where((np.arange(COLS) % 2 == 0)[None, :], x + 1000, x + 2000) if by_columns \
            else np.concatenate([x[:2] + 1000, x[2:] + 2000])
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(ids, [[0, 2]])   # program_id 0, then num_programs 2
    # LNC=1: one program, id 0 of 1, unchanged
    out, ids = simulate(split)(x, False)
    np.testing.assert_array_equal(out, x + 1000)


@pytest.mark.parametrize("mask", ["whole", "windows"])
def test_strided_writes_meeting_in_one_element_are_reported(mask, monkeypatch):
    if mask == "windows":   # the large-tensor path: index arrays in windows of 5 units
        from nki_ssm.sim import races
        monkeypatch.setattr(races, "_WHOLE", 0)
        monkeypatch.setattr(races, "_WINDOW", 5)

    @jit
    def columns(x, other):
        """Program 0 writes the even columns, program 1 column ``other``."""
        pid = nl.program_id(0)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if pid == 0:
            nisa.dma_copy(dst=out[:, 0::2], src=t[:, 0::2])
        else:
            nisa.dma_copy(dst=out[:, other:other + 1], src=t[:, other:other + 1])
        return out

    simulate(columns[2])(_x(), 3)                 # odd column: the spans meet, bytes do not
    with pytest.raises(NkiRaceError, match=r"1 writes element \(0, 4\) \(byte 16\)"):
        simulate(columns[2])(_x(), 4)


def test_indirect_dma_races_are_byte_exact():
    x = _x()
    ok = np.array([[[0], [2]], [[1], [3]]], np.int32)       # disjoint rows per program
    out = simulate(scatter_rows[2])(x, ok)
    np.testing.assert_array_equal(out, x[[0, 2, 1, 3]])
    clash = np.array([[[0], [2]], [[3], [2]]], np.int32)    # both scatter into row 2
    with pytest.raises(NkiRaceError, match=r"element \(2, 0\)"):
        simulate(scatter_rows[2])(x, clash)


def test_scalar_offset_races_use_the_run_time_offset():
    x = _x()
    out = simulate(register_row_writes[2])(x, np.array([[3], [1]], np.int32))
    np.testing.assert_array_equal(out[[3, 1]], x[:2])
    with pytest.raises(NkiRaceError, match=r"1 writes element \(2, 0\)"):
        simulate(register_row_writes[2])(x, np.array([[2], [2]], np.int32))


def test_sendrecv_swaps_tiles_between_programs():
    x = _x()
    out = simulate(exchange[2])(x)
    np.testing.assert_array_equal(out[0], x[1] + 10)      # program 0 got program 1's tile
    np.testing.assert_array_equal(out[1], x[0])


def test_trace_tags_programs_and_sync_ids():
    with record() as tr:
        simulate(handoff[2])(_x(), True, 0)
    pids = [i.program_id for i in tr.instructions]
    assert set(pids) == {0, 1}
    bars = [i for i in tr.instructions if i.op == "core_barrier"]
    assert [(b.program_id, b.attrs["sync"], b.attrs["sync_id"]) for b in bars] == [
        (0, "core_barrier", 0), (1, "core_barrier", 0)]
    assert bars[0].engine == "gpsimd" and bars[0].attrs["cores"] == (0, 1)
    # program 0's instructions before the barrier come first, then program 1's epoch 0
    first = pids.index(1)
    assert all(p == 0 for p in pids[:first])
    # each program's own instructions (they branch on program_id here)
    assert tr.program_instructions(0) == 4 and tr.program_instructions(1) == 4
    with record() as tr:
        simulate(exchange[2])(_x())
    sr = [i for i in tr.instructions if i.op == "sendrecv"]
    assert [(s.program_id, s.attrs["sync_id"], s.attrs["send_to_rank"]) for s in sr] == [
        (0, 0, 1), (1, 0, 0)]


@jit
def looped(x, counts):
    """A runtime loop with a barrier in its body; each program its own trip count (a
    register loaded from counts[pid]) and its own output row."""
    pid = nl.program_id(0)
    out = nl.ndarray((2, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
    c = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=counts[pid:pid + 1, :])
    n = nisa.register_alloc()
    nisa.register_load(n, c)
    t = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)

    def body(i):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        nisa.core_barrier(data=out, cores=(0, 1))

    nl.fori_loop(0, n, body)
    nisa.dma_copy(dst=out[pid:pid + 1, :], src=t)
    return out


def test_program_sizes_per_program_and_unrun_bodies():
    with record() as tr:
        out = simulate(looped[2])(_x(), np.array([[3], [3]], np.int32))
    np.testing.assert_array_equal(out, 3)
    assert tr.program_instructions(0) == tr.program_instructions(1) == 5
    ids = sorted({i.attrs["sync_id"] for i in tr.instructions if i.op == "core_barrier"})
    assert ids == [0, 1, 2]
    # both programs skip the loop: its body is traced once per program, never run
    with record() as tr:
        out = simulate(looped[2])(_x(), np.array([[0], [0]], np.int32))
    np.testing.assert_array_equal(out, 0)
    assert [(i.program_id, i.op) for i in tr.unrun] == [
        (0, "tensor_scalar"), (0, "core_barrier"), (1, "tensor_scalar"), (1, "core_barrier")]
    assert tr.program_instructions(0) == tr.program_instructions(1) == 5


def test_a_barrier_only_one_program_reaches_is_a_hang():
    # the programs' trip counts differ: the error names the loop where their flows part
    with pytest.raises(NkiSyncError,
                       match=r"program 0 waits at nisa.core_barrier .* at nl.fori_loop \(0,\) "
                             r".*program 0 is still in it, in iteration 2 .*program 1 runs 1 "
                             r"iteration"):
        simulate(looped[2])(_x(), np.array([[2], [1]], np.int32))
    with pytest.raises(NkiSyncError, match=r"program 0 ended while program 1 waits at "
                                           r"nisa.core_barrier.*program 0 runs 1 iteration, "
                                           r"program 1 is still in it"):
        simulate(looped[2])(_x(), np.array([[1], [2]], np.int32))

    @jit
    def mixed(x):
        t = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
        u = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        if nl.program_id(0) == 0:
            nisa.core_barrier(data=x, cores=(0, 1))
        else:
            nisa.sendrecv(src=t, dst=u, send_to_rank=0, recv_from_rank=0, pipe_id=0)
        return None

    with pytest.raises(NkiSyncError, match="different synchronisations"):
        simulate(mixed[2])(_x())


def test_deterministic_results_and_trace():
    runs = []
    for _ in range(3):
        with record() as tr:
            out = simulate(looped[2])(_x(), np.array([[2], [2]], np.int32))
        runs.append((out.tobytes(), [(i.program_id, i.op, i.attrs.get("sync_id"))
                                     for i in tr.instructions]))
    assert runs[0] == runs[1] == runs[2]


def test_error_in_one_program_stops_the_launch_and_changes_nothing():
    @jit
    def fails_in_program_1(state):
        pid = nl.program_id(0)
        t = nl.ndarray((1, state.shape[1]), state.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=7.0)
        nisa.dma_copy(dst=state[pid:pid + 1, :], src=t)
        nisa.core_barrier(data=state, cores=(0, 1))
        if pid == 1:
            nl.ndarray((256, 2), nl.float32, buffer=nl.sbuf)     # > 128 partitions
        return None

    state = np.zeros((2, 4), np.float32)
    with pytest.raises(NkiValidationError, match="partition dim"):
        simulate(fails_in_program_1[2])(state)
    np.testing.assert_array_equal(state, 0)               # no write-back
    out = simulate(split)(_x(), False)[0]                 # the next launch runs normally
    np.testing.assert_array_equal(out, _x() + 1000)


def test_lnc1_barrier_of_one_core_and_rejections(set_target):
    @jit
    def one_core(x, cores):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=t)
        nisa.core_barrier(out, cores)
        return out

    x = _x()
    with record() as tr:
        np.testing.assert_array_equal(simulate(one_core)(x, (0)), x)    # nki-library's (0)
    (bar,) = [i for i in tr.instructions if i.op == "core_barrier"]
    assert bar.attrs["sync_id"] == -1 and bar.attrs["cores"] == (0,)
    np.testing.assert_array_equal(simulate(one_core)(x, (0,)), x)
    with pytest.raises(NkiValidationError, match="LNC=1"):
        simulate(one_core)(x, (0, 1))
    with pytest.raises(NkiValidationError, match=r"cores must be \(0, 1\)"):
        simulate(one_core[2])(x, (0,))
    set_target("trn1")
    with pytest.raises(NkiValidationError, match="NeuronCore-v3"):
        simulate(one_core)(x, (0,))


def test_sendrecv_rules():
    @jit
    def one(x):
        t = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        nisa.sendrecv(src=t, dst=t, send_to_rank=0, recv_from_rank=0, pipe_id=0)
        return None

    with pytest.raises(NkiValidationError, match="needs LNC=2"):
        simulate(one)(_x())

    @jit
    def big_gpsimd(x):
        t = nl.ndarray((1, 512), nl.float32, buffer=nl.sbuf)
        u = nl.ndarray((1, 512), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        nisa.sendrecv(src=t, dst=u, send_to_rank=1 - nl.program_id(0),
                      recv_from_rank=1 - nl.program_id(0), pipe_id=0,
                      dma_engine=nisa.dma_engine.gpsimd_dma)
        return None

    with pytest.raises(NkiValidationError, match="at most 1024 bytes"):
        simulate(big_gpsimd[2])(_x())

    @jit
    def to_self(x):
        t = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
        u = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        nisa.sendrecv(src=t, dst=u, send_to_rank=1, recv_from_rank=1, pipe_id=0)
        return None

    with pytest.raises(NkiSyncError, match="never completes"):
        simulate(to_self[2])(_x())


def test_barrier_on_an_sbuf_tile_warns_as_released_use():
    @jit
    def sbuf_barrier(x):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0)
        nisa.core_barrier(t, (0, 1))
        return None

    with pytest.warns(NkiReleasedUseWarning, match="bwmm_shard_on_I.py:577"):
        simulate(sbuf_barrier[2])(_x())
