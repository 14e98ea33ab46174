"""NKI 0.7 / 0.8 scalars and compiled conditionals: NkiScalar, scalar_load / scalar_store,
``nl.if_else``, ``nki.lnc``.

Sources (SDK 2.34.0 / NKI 0.8.0 unless said): the nki.isa.NkiScalar, scalar_load,
scalar_store and scalar_alu API pages (width fixed at creation, int32 wraps, ``nl.divide``
rounds toward zero and ``nl.fmod`` keeps the dividend's sign, comparisons give an int32 0 / 1
that "cannot be used as a Python if or while condition", int64 only + - *, 1x1 tiles in SBUF
or HBM, no PSUM, no kernel argument or returned tensor, a Python int is no scalar_store
value); nki.language.fori_loop (bounds 32-bit, ``body(i)`` gets an NkiScalar) and if_else (a
Python bool is folded, a run-time condition is a 32-bit NkiScalar available on all engines);
the nki.lnc API pages (``sendrecv`` without ``pipe_id``, ``sendrecv_compute``,
``core_barrier``); NKI 0.7.0: nki/migration ("NKI 0.7.0 also introduces NkiScalar"), its
NkiScalar page (comparisons "traced, but the result cannot be used").
"""
from __future__ import annotations

import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim import nki_lnc
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.isa.nki_scalar import NkiScalar
from nki_ssm.sim.isa.registers import VirtualRegister
from nki_ssm.sim.jit import jit, simulate
from nki_ssm.sim.trace import record

pytestmark = pytest.mark.usefixtures("nki08")


def _i32(v):
    return NkiScalar(v, nl.int32)


# ----------------------------------------------------------------- arithmetic

def test_int32_arithmetic_wraps_and_divides_toward_zero():
    assert (_i32(100000) * 100000).value == 1410065408          # the API page's example
    assert (_i32(2 ** 31 - 1) + 1).value == -2 ** 31
    assert (_i32(-17) / 4).value == -4 and (_i32(-17) // 4).value == -4
    assert (_i32(-17) % 4).value == -1 and (_i32(17) % -4).value == 1
    assert (7 - _i32(10)).value == -3 and (-_i32(5)).value == -5
    assert (100 // _i32(7)).value == 14
    assert nisa.scalar_alu(_i32(3), 9, op=nl.maximum).value == 9
    assert nisa.scalar_alu(-17, 4, op=nl.divide) == -4          # two ints: compile time


def test_comparisons_give_int32_zero_or_one():
    for got, want in ((_i32(3) < 4, 1), (_i32(3) >= 4, 0), (_i32(3) == 3, 1),
                      (_i32(3) != 3, 0), (2 > _i32(1), 1)):
        assert isinstance(got, NkiScalar) and got.dtype == nl.int32 and got.value == want
    u = NkiScalar(2 ** 32 - 1, nl.uint32)           # unsigned compares as unsigned
    assert (u > 1).value == 1 and (u + 1).value == 0


def test_int64_supports_only_add_sub_mul():
    a = NkiScalar(2 ** 40, nl.int64)
    assert (a * 4 + 1).value == 2 ** 42 + 1
    for bad in (lambda: a / 2, lambda: a % 2, lambda: a < 3):
        with pytest.raises(NkiValidationError, match="int64"):
            bad()


def test_operands_must_share_the_dtype_and_fit_its_width():
    with pytest.raises(NkiValidationError, match="same dtype"):
        _i32(1) + NkiScalar(1, nl.int64)
    with pytest.raises(NkiValidationError, match="does not fit"):
        _i32(1) + 2 ** 40


@pytest.mark.parametrize("use", [bool, int, lambda s: range(s), lambda s: [0, 1][s],
                                 lambda s: 1 if s else 0])
def test_a_scalar_cannot_drive_python_control_flow(use):
    with pytest.raises(TypeError, match="run-time value"):
        use(_i32(1) > 0)


def test_division_by_zero_is_an_error():
    with pytest.raises(NkiValidationError, match="division by zero"):
        _i32(1) / 0


def test_nki_07_has_no_division_and_its_comparisons_cannot_be_used(nki07):
    assert (_i32(3) * 2 - 1).value == 5
    with pytest.raises(TypeError, match="0.8.0"):
        _i32(3) / 2
    c = _i32(3) > 2
    with pytest.raises(NkiValidationError, match="cannot be used"):
        c + 1
    with pytest.raises(AttributeError, match="0.8.0"):
        nisa.scalar_alu
    with pytest.raises(AttributeError, match="0.8.0"):
        nl.if_else


def test_nki_06_has_no_scalars(monkeypatch):
    monkeypatch.setenv("NKI_SSM_NKI_VERSION", "0.6.0")
    with pytest.raises(AttributeError, match="0.7.0"):
        nisa.scalar_load


# ----------------------------------------------------------------- scalar_load / scalar_store

def _load_store_kernel(where: str):
    @jit
    def kernel(counts):
        """out[0, 0] = counts[0, 1] * 10 + counts[0, 0], through an SBUF (or internal HBM)
        tile."""
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        buf = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf if where == "sbuf" else nl.hbm)
        nisa.dma_copy(dst=buf, src=counts)
        a = nisa.scalar_load(buf[0:1, 0:1])
        b = nisa.scalar_load(buf[0:1, 1:2])
        res = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.scalar_store(res, b * 10 + a)
        nisa.dma_copy(dst=out, src=res)
        return out
    return kernel


@pytest.mark.parametrize("where", ["sbuf", "hbm"])
def test_scalar_load_and_store_round_trip(where):
    out = simulate(_load_store_kernel(where))(np.array([[3, 4]], np.int32))
    assert out.tolist() == [[43]]


@jit
def load_from_argument(counts):
    out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
    n = nisa.scalar_load(counts[0:1, 0:1])
    res = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.scalar_store(res, n)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_scalar_load_from_a_kernel_argument_is_rejected():
    with pytest.raises(NkiValidationError, match="kernel argument"):
        simulate(load_from_argument)(np.array([[5, 6]], np.int32))


def test_scalar_load_from_a_kernel_argument_is_accepted_under_0_7(nki07):
    # the 0.7 scalar_load page names no such restriction (it arrived with 0.8.0's page)
    assert simulate(load_from_argument)(np.array([[5, 6]], np.int32)).tolist() == [[5]]


@jit
def store_into_returned(x):
    out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.scalar_store(out, nisa.scalar_load(t))
    return out


def test_scalar_store_into_a_returned_tensor_is_rejected():
    with pytest.raises(NkiValidationError, match="returned tensor"):
        simulate(store_into_returned)(np.array([[5]], np.int32))


def _run_in_kernel(fn):
    """Run ``fn()`` inside a launch (for errors raised by one call)."""
    @jit
    def kernel(x):
        fn()
        return None
    simulate(kernel)(np.zeros((1, 1), np.float32))


@pytest.mark.parametrize("shape,dtype,buffer,match", [
    ((1, 2), nl.int32, nl.sbuf, "exactly one element"),
    ((1, 1), nl.float32, nl.sbuf, "dtype"),
    ((1, 1), nl.int32, nl.psum, "PSUM"),
])
def test_scalar_load_rejects_other_tiles(shape, dtype, buffer, match):
    def body():
        t = nl.ndarray(shape, dtype, buffer=buffer)
        nisa.scalar_load(t)
    with pytest.raises(NkiValidationError, match=match):
        _run_in_kernel(body)


def test_scalar_store_rejects_a_python_int_pointing_to_memset():
    def body():
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.scalar_store(t, 3)
    with pytest.raises(TypeError, match="memset"):
        _run_in_kernel(body)


def test_scalar_store_needs_the_scalars_dtype():
    def body():
        t = nl.ndarray((1, 1), nl.int64, buffer=nl.sbuf)
        nisa.scalar_store(t, _i32(3))
    with pytest.raises(NkiValidationError, match="same dtype"):
        _run_in_kernel(body)


# ----------------------------------------------------------------- loops and offsets

def _row(t, i):
    """Row ``i`` (a run-time scalar) of the 2-D HBM tensor ``t``."""
    cols = t.shape[1]
    return t.ap(pattern=[[cols, 1], [1, cols]], offset=0, scalar_offset=i, indirect_dim=0)


@jit
def rows_plus_index(x, counts):
    """Rows 0 .. counts[0]-1 of x, row i plus i, through fori_loop(0, n) and scalar_offset."""
    rows, cols = x.shape
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray((rows, cols), x.dtype, buffer=nl.sbuf)
    nisa.memset(zero, 0.0)
    nisa.dma_copy(dst=out, src=zero)
    c = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=counts)
    n = nisa.scalar_load(c)
    row = nl.ndarray((1, cols), x.dtype, buffer=nl.sbuf)
    idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    idx_f = nl.ndarray((1, 1), x.dtype, buffer=nl.sbuf)

    def body(i):
        nisa.dma_copy(dst=row, src=_row(x, i))
        nisa.scalar_store(idx, i)
        nisa.tensor_copy(dst=idx_f, src=idx)
        nisa.tensor_scalar(dst=row, data=row, op0=nl.add, operand0=idx_f)
        nisa.dma_copy(dst=_row(out, i), src=row)

    nl.fori_loop(0, n, body)
    return out


def test_fori_loop_bound_and_offsets_from_scalars():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    with record() as tr:
        out = simulate(rows_plus_index)(x, np.array([[3]], np.int32))
    want = np.zeros_like(x)
    want[:3] = x[:3] + np.arange(3)[:, None]
    np.testing.assert_array_equal(out, want)
    (loop,) = tr.loops.values()
    assert (loop.entries, loop.iterations) == (1, 3)


def test_fori_loop_body_gets_a_scalar_and_int64_bounds_are_rejected():
    seen = []

    def note(i):
        seen.append(i)

    def body():
        nl.fori_loop(0, 2, note)
        nl.fori_loop(0, NkiScalar(2, nl.int64), note)

    with pytest.raises(NkiValidationError, match="32-bit"):
        _run_in_kernel(body)
    assert all(isinstance(i, NkiScalar) for i in seen) and [i.value for i in seen] == [0, 1]


def test_fori_loop_with_a_register_bound_passes_a_register(nki07):
    seen = []

    def note(i):
        seen.append(i)

    def body():
        r = nisa.register_alloc(2)
        nl.fori_loop(0, r, note)

    _run_in_kernel(body)
    assert all(isinstance(i, VirtualRegister) for i in seen)


def test_on_chip_scalar_offset_must_be_int32():
    def body():
        t = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
        t.ap(pattern=[[4, 2], [1, 2]], scalar_offset=NkiScalar(1, nl.int64), indirect_dim=1)
    with pytest.raises(NkiValidationError, match="nl.int32"):
        _run_in_kernel(body)


def test_vector_offset_rejects_a_scalar():
    def body():
        t = nl.ndarray((4, 4), nl.float32, buffer=nl.hbm)
        t.ap(pattern=[[4, 1], [1, 4]], vector_offset=_i32(1))
    with pytest.raises(TypeError, match="vector_offset"):
        _run_in_kernel(body)


# ----------------------------------------------------------------- nl.if_else

@jit
def branchy(x, flags):
    """out = x + 10 where flags[0] > 0 else x - 10; then + 1 if the Python flag says so."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    f = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=f, src=flags)

    def plus():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=10.0)

    def minus():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=-10.0)

    def one():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

    nl.if_else(nisa.scalar_load(f) > 0, plus, minus)
    nl.if_else(False, one)                 # folded: no instruction at all
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("flag", [1, 0, -3])
def test_if_else_runs_the_selected_branch_and_compiles_both(flag):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with record() as tr:
        out = simulate(branchy)(x, np.array([[flag]], np.int32))
    np.testing.assert_array_equal(out, x + (10 if flag > 0 else -10))
    (branch,) = tr.branches.values()
    assert branch.branch_id == ("if", 0) and branch.outcomes == [flag > 0]
    # dynamic: 2 loads, the taken branch, the store; static: both branches, no folded one
    assert len(tr) == 4 and tr.program_instructions() == 5 and len(tr.unrun) == 1


@jit
def branch_in_loop(x):
    """Row i of x plus 1 when i is even, minus 1 when odd, in a runtime loop."""
    rows, cols = x.shape
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    row = nl.ndarray((1, cols), x.dtype, buffer=nl.sbuf)

    def body(i):
        nisa.dma_copy(dst=row, src=_row(x, i))

        def up():
            nisa.tensor_scalar(dst=row, data=row, op0=nl.add, operand0=1.0)

        def down():
            nisa.tensor_scalar(dst=row, data=row, op0=nl.subtract, operand0=1.0)

        nl.if_else(i % 2 == 0, up, down)
        nisa.dma_copy(dst=_row(out, i), src=row)

    nl.fori_loop(0, rows, body)
    return out


def test_if_else_in_a_runtime_loop_records_every_outcome():
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    with record() as tr:
        out = simulate(branch_in_loop)(x)
    np.testing.assert_array_equal(out, x + np.array([1, -1, 1, -1, 1], np.float32)[:, None])
    (branch,) = tr.branches.values()
    assert branch.branch_id == (0, "if", 0)
    assert branch.outcomes == [True, False, True, False, True] and branch.taken == 3
    assert tr.program_instructions() == 4       # dma, then, else, dma: each compiled once
    assert len(tr) == 5 * 3


@pytest.mark.parametrize("cond,match", [
    (lambda: NkiScalar(1, nl.int64), "32-bit"),
    (lambda: NkiScalar(1, nl.int32, nisa.engine.vector), "all engines"),
])
def test_if_else_condition_rules(cond, match):
    def nothing():
        pass

    def body():
        nl.if_else(cond(), nothing)

    with pytest.raises(NkiValidationError, match=match):
        _run_in_kernel(body)


def test_if_else_rejects_a_register_condition():
    def nothing():
        pass

    def body():
        nl.if_else(VirtualRegister(1), nothing)

    with pytest.raises(TypeError, match="NkiScalar"):
        _run_in_kernel(body)


# ----------------------------------------------------------------- nki.lnc

@jit
def lnc_exchange(x):
    """Program p sends row p of x to the other program, which stores it as its own row (a
    swap), and the elementwise max of both rows (sendrecv_compute) to rows 2 + p."""
    pid = nl.program_id(0)
    cols = x.shape[1]
    out = nl.ndarray((4, cols), x.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((1, cols), x.dtype, buffer=nl.sbuf)
    got = nl.ndarray((1, cols), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[pid:pid + 1, :])
    nki_lnc.sendrecv(src=mine, dst=got, send_to_rank=1 - pid, recv_from_rank=1 - pid)
    nisa.dma_copy(dst=out[pid:pid + 1, :], src=got)
    both = nl.ndarray((1, cols), x.dtype, buffer=nl.sbuf)
    nki_lnc.sendrecv_compute(src=mine, dst=both, send_to_rank=1 - pid,
                             recv_from_rank=1 - pid, reduce_op=nl.maximum)
    nisa.dma_copy(dst=out[2 + pid:3 + pid, :], src=both)
    nki_lnc.core_barrier(out, (0, 1))
    return out


def test_nki_lnc_sendrecv_and_sendrecv_compute():
    x = np.array([[1, 5, 3, 0], [4, 2, 6, -1]], np.float32)
    out = simulate(lnc_exchange[2])(x)
    np.testing.assert_array_equal(out, np.stack([x[1], x[0], x.max(0), x.max(0)]))


def test_nki_lnc_is_new_in_0_8(nki07):
    with pytest.raises(AttributeError, match="nki.lnc"):
        simulate(lnc_exchange[2])(np.zeros((2, 4), np.float32))
