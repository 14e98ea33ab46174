"""The simulator per targeted NKI release (``NKI_SSM_NKI_VERSION``, sim.version / sim.control).

Sources: release-notes/components/nki.rst (aws-neuron-sdk 81ce03ae), NKI 0.6.0: New Features
(nl.fori_loop, nl.while_loop, nisa.topk, tensor_scalar_reduce with reduce_res=None),
Deprecated and Removed APIs (nl.dynamic_range for-loops and ``while reg:`` warn); 0.5.0
Known Issues, Control Flow (nested runtime loops with loop-carried values); aws-neuron-sdk
issue #1346 (NCC_ICFG018 for a runtime loop nested in a runtime loop on NKI 0.5.0, compiles on
0.6.0); the nl.fori_loop docstring (body a function defined in the kernel, ``i`` passed by
value).
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

ENV = "NKI_SSM_NKI_VERSION"
ROWS, COLS = 3, 4


@pytest.fixture
def nki_050(monkeypatch):
    monkeypatch.setenv(ENV, "0.5.0")


def nested_dynamic_ranges(x):
    """out = x + ROWS * COLS, one add per inner iteration of two nested nl.dynamic_range loops."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for r in nl.dynamic_range(ROWS):
        for c in nl.dynamic_range(COLS):
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=t)
    return out


def nested_fori_loops(x):
    """out = x + COLS: row r is loaded, gets 1 added in each of COLS inner iterations, stored."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    row = nl.ndarray((1, COLS), x.dtype, buffer=nl.sbuf)

    def row_body(r):
        nisa.dma_copy(dst=row, src=x.ap(pattern=[[COLS, 1], [1, COLS]], offset=0,
                                        scalar_offset=r, indirect_dim=0))

        def add_one(c):
            nisa.tensor_scalar(dst=row, data=row, op0=nl.add, operand0=1.0)

        nl.fori_loop(0, COLS, add_one)
        nisa.dma_copy(dst=out.ap(pattern=[[COLS, 1], [1, COLS]], offset=0, scalar_offset=r,
                                 indirect_dim=0), src=row)

    nl.fori_loop(0, ROWS, row_body)
    return out


X = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


def test_nki_050_rejects_a_runtime_loop_nested_in_a_runtime_loop(nki_050):
    with pytest.raises(NkiValidationError, match="NCC_ICFG018") as e:
        simulate(jit(nested_dynamic_ranges))(X)
    assert "#1346" in str(e.value) and "0.5.0" in str(e.value)


def test_nki_060_traces_a_fori_loop_nested_in_a_fori_loop():
    with pytest.warns(NkiKnownIssueWarning, match="Could not find register"):
        with record() as tr:
            y = simulate(jit(nested_fori_loops))(X)
    np.testing.assert_array_equal(y, X + COLS)
    assert max(len(i.loop_path) for i in tr.instructions) == 2
    inner = [i for i in tr.instructions if len(i.loop_path) == 2]
    assert len(inner) == ROWS * COLS and {i.op for i in inner} == {"tensor_scalar"}
    assert {i.loop_path[0][0] for i in inner} == {(0,)}       # both levels: one loop each
    assert {i.loop_path[1][0] for i in inner} == {(0, 0)}
    # program: the row body's 2 DMAs + the inner body's add, each body once
    assert tr.program_instructions() == 3


def test_nki_060_api_is_absent_under_050(nki_050):
    for mod, name in ((nl, "fori_loop"), (nl, "while_loop"), (nisa, "topk")):
        assert not hasattr(mod, name)
        with pytest.raises(AttributeError, match=r"not in NKI 0\.5\.0: it was added in NKI 0\.6\.0"):
            getattr(mod, name)


def test_nki_060_api_is_present_by_default():
    assert callable(nl.fori_loop) and callable(nl.while_loop)
    with pytest.raises(NotImplementedError, match="topk"):
        nisa.topk()


@pytest.mark.nki_version("0.6.0")
def test_dynamic_range_is_deprecated_in_060_only(monkeypatch):
    with pytest.warns(DeprecationWarning, match="fori_loop"):
        list(nl.dynamic_range(2))
    monkeypatch.setenv(ENV, "0.5.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(nl.dynamic_range(2))) == 2


@pytest.mark.nki_version("0.6.0")
def test_fori_loop_and_while_loop_do_not_warn():
    tile = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=tile, value=2)
    reg = nisa.register_alloc()
    nisa.register_load(reg, tile)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nl.fori_loop(0, reg, lambda i: None)

        def body(r):
            nisa.tensor_scalar(dst=tile, data=tile, op0=nl.subtract, operand0=1)
            nisa.register_load(r, tile)
            return r
        assert nl.while_loop(reg, body) is None
    # the docstring: the body's r is passed by value; the loop ran to 0, init is untouched
    assert int(tile.read().reshape(-1)[0]) == 0 and reg.runtime_value("t") == 2


def test_tensor_scalar_reduce_without_reduce_res_needs_060(monkeypatch):
    a = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=a, value=1.0)
    nisa.tensor_scalar_reduce(dst=a, data=a, op0=nl.multiply, operand0=2.0, reduce_op=nl.add)
    monkeypatch.setenv(ENV, "0.5.0")
    with pytest.raises(NkiValidationError, match="reduce_res=None needs NKI 0.6.0"):
        nisa.tensor_scalar_reduce(dst=a, data=a, op0=nl.multiply, operand0=2.0, reduce_op=nl.add)


@pytest.mark.nki_version("0.6.0")
def test_fori_loop_passes_the_induction_variable_by_value():
    seen = []

    def body(i):
        seen.append(i.runtime_value("t"))
        nisa.register_move(i, 100)      # "writing to i has no effect on the loop"

    nl.fori_loop(0, 3, body)
    assert seen == [0, 1, 2]
    for i in nl.dynamic_range(1):       # dynamic_range keeps the 0.4.0 rule: frozen
        with pytest.raises(NkiValidationError, match="frozen"):
            nisa.register_load(i, nl.zeros((1, 1), nl.int32, buffer=nl.sbuf))


@jit
def count_down_while_reg(x, n):
    """out = x + n[0]: a dynamic ``while reg:`` loop adds 1 and decrements the counter."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    left = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=left, src=n.ap(pattern=[[1, 1], [1, 1]], offset=0))
    reg = nisa.register_alloc()
    nisa.register_load(reg, left)
    steps = 0
    while steps < 2:                     # a Python while: unrolled, no warning
        steps = steps + 1
    while reg:
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        nisa.tensor_scalar(dst=left, data=left, op0=nl.subtract, operand0=1)
        nisa.register_load(reg, left)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.nki_version("0.6.0")
@pytest.mark.parametrize("count", [0, 1, 3])
def test_while_reg_is_a_runtime_loop_deprecated_in_060(count):
    with pytest.warns(DeprecationWarning, match="while_loop"):
        with record() as tr:
            y = simulate(count_down_while_reg)(X, np.array([count], np.int32))
    np.testing.assert_array_equal(y, X + count)
    assert [lp.iterations for lp in tr.loops.values()] == [count]
    assert tr.program_instructions() == 5                 # 2 DMAs in, the body's 2, 1 out


def test_while_reg_does_not_warn_under_050(nki_050):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = simulate(count_down_while_reg)(X, np.array([2], np.int32))
    np.testing.assert_array_equal(y, X + 2)
