"""jit / simulate / simulate_kernel: arguments, outputs, write-back, LNC grid, trace target."""
from __future__ import annotations

import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim import trace
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.jit import Kernel, jit, simulate, simulate_kernel


@jit
def scale_copy(x, factor):
    """out = x * factor through SBUF; factor is a compile-time float."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    nisa.dma_copy(dst=out, src=t)
    return out


@jit
def increment_in_place(state, fail):
    """state += 1 in HBM; optionally fails after the write (to test write-back atomicity)."""
    t = nl.ndarray(state.shape, state.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=state)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=state, src=t)
    if fail:
        nl.ndarray((256, 2), nl.float32, buffer=nl.sbuf)  # partition dim > 128: rejected
    return None


def test_simulate_returns_numpy_and_keeps_inputs(rng):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    x0 = x.copy()
    y = simulate(scale_copy)(x, 2.5)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(y, x0 * np.float32(2.5), rtol=0, atol=0)
    np.testing.assert_array_equal(x, x0)


def test_direct_call_and_simulate_kernel_spelling(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(scale_copy(x, 3.0), simulate_kernel(scale_copy, x, 3.0))
    np.testing.assert_array_equal(scale_copy(x, 3.0), x * np.float32(3.0))


def test_plain_function_can_be_simulated(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(simulate(scale_copy.func)(x, factor=1.0), x)


def test_modified_input_written_back_on_success():
    s = np.zeros((4, 8), np.float32)
    assert simulate(increment_in_place)(s, False) is None
    np.testing.assert_array_equal(s, np.ones((4, 8)))


def test_failed_launch_changes_nothing():
    s = np.zeros((4, 8), np.float32)
    with pytest.raises(NkiValidationError, match="<= 128"):
        simulate(increment_in_place)(s, True)
    np.testing.assert_array_equal(s, np.zeros((4, 8)))


def test_list_argument_rejected():
    with pytest.raises(TypeError, match="tuple"):
        simulate(scale_copy)([1.0, 2.0], 1.0)


def test_unsupported_argument_type_rejected():
    with pytest.raises(TypeError, match="'factor'"):
        simulate(scale_copy)(np.ones((2, 2), np.float32), object())


def test_float64_array_argument_rejected():
    with pytest.raises(TypeError, match="'x'.*float64"):
        simulate(scale_copy)(np.ones((2, 2)), 1.0)


def test_output_must_be_shared_hbm():
    @jit
    def bad(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    with pytest.raises(NkiValidationError, match="shared_hbm"):
        simulate(bad)(np.ones((2, 2), np.float32))


def test_returning_on_chip_tensor_rejected():
    @jit
    def bad(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        return t

    with pytest.raises(NkiValidationError, match="shared_hbm"):
        simulate(bad)(np.ones((2, 2), np.float32))


def test_tuple_outputs_and_compile_time_values():
    @jit
    def two(x, shape, flag, label, nothing):
        assert shape == (2, 3) and flag == True and label == "a" and nothing == None  # noqa: E711,E712
        a = nl.ndarray(shape, x.dtype, buffer=nl.shared_hbm)
        b = nl.ndarray(shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=x)
        return a, b

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a, b = simulate(two)(x, (2, 3), True, "a", None)
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, x)


def test_lnc_grid_runs_each_program_with_its_id():
    @jit
    def halves(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        n = nl.num_programs()
        rows = x.shape[0] // n
        t = nl.ndarray((rows, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[pid * rows:(pid + 1) * rows, :])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(10 * (pid + 1)))
        nisa.dma_copy(dst=out[pid * rows:(pid + 1) * rows, :], src=t)
        return out

    x = np.zeros((8, 4), np.float32)
    y = simulate(halves[2])(x)
    np.testing.assert_array_equal(y[:4], 10)
    np.testing.assert_array_equal(y[4:], 20)
    np.testing.assert_array_equal(simulate(halves)(x), 10)  # grid 1: one program
    assert nl.program_id(0) == 0 and nl.num_programs() == 1 and nl.program_ndim() == 0


def test_lnc_programs_must_allocate_same_shared_tensors():
    @jit
    def diverge(x):
        shape = (2, 2) if nl.program_id(0) == 0 else (3, 3)
        out = nl.ndarray(shape, x.dtype, buffer=nl.shared_hbm)
        return out

    with pytest.raises(NkiValidationError, match="same shared"):
        simulate(diverge[2])(np.ones((2, 2), np.float32))


@pytest.mark.parametrize("grid", [0, 3, 8, (1, 2), 1.0])
def test_bad_lnc_grid_rejected(grid):
    with pytest.raises(NkiValidationError, match="lnc|grid"):
        scale_copy[grid]


@pytest.mark.parametrize("kw", ["platform_target", "mode"])
def test_removed_jit_options_rejected(kw):
    with pytest.raises(NkiValidationError, match="0.3.0"):
        jit(lambda x: x, **{kw: "trn2"})


def test_jit_forms():
    def f(x):
        return None
    assert isinstance(jit(f), Kernel)
    assert isinstance(jit()(f), Kernel)
    assert jit(jit(f)).func is f
    with pytest.raises(TypeError):
        jit(3)


def test_trace_records_target_and_instructions(set_target):
    set_target("trn3")
    with trace.record() as tr:
        simulate(scale_copy)(np.ones((4, 4), np.float32), 2.0)
    assert tr.target == "trn3"
    assert [i.op for i in tr.instructions][0] == "dma_copy" and len(tr) == 3


def test_plain_helper_and_jit_sub_kernel_are_inlined(rng):
    """Sub-kernels are inlined. The migration guide asks for plain functions, but released
    kernels call nki.jit kernels from kernels (nki-library d2ad3a5 core/moe/moe_cte/moe_cte.py:351):
    accepted with a warning naming that file."""
    plain = scale_copy.func

    @jit
    def outer(x):
        return plain(x, 2.0)

    x = rng.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_array_equal(simulate(outer)(x), x * np.float32(2.0))

    @jit
    def outer_jit(x):
        return scale_copy(x, 2.0)

    from nki_ssm.sim.subset import NkiFrontendWarning
    with pytest.warns(NkiFrontendWarning, match="decorated with nki.jit.*moe_cte.py:351"):
        np.testing.assert_array_equal(simulate(outer_jit)(x), x * np.float32(2.0))


def test_inputs_are_hbm_and_shared_under_lnc2():
    seen = []

    @jit
    def k(x):
        seen.append(x.buffer)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        nisa.dma_copy(dst=out[pid:pid + 1, :], src=x[pid:pid + 1, :])
        return out

    simulate(k)(np.ones((2, 2), np.float32))
    simulate(k[2])(np.ones((2, 2), np.float32))
    assert seen[0] == nl.hbm and seen[1] == nl.shared_hbm and seen[2] == nl.shared_hbm


@pytest.mark.oracles
def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    x = torch.arange(8, dtype=torch.bfloat16).reshape(2, 4)
    y = simulate(scale_copy)(x, 2.0)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    assert torch.equal(y, x * 2)
    s = torch.zeros((4, 8), dtype=torch.float32)
    simulate(increment_in_place)(s, False)
    assert torch.equal(s, torch.ones((4, 8)))


@jit
def bf16_sum_of_three(x):
    """out = x + 0.01 + 0.01 + 0.01 through a bf16 SBUF tile (three roundings in precise mode)."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for _ in range(3):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=0.01)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_nki_precise_fp(monkeypatch):
    """nki_simulator.rst, "Precise Floating-Point Mode": NKI_PRECISE_FP=1 (default) stores
    bfloat16 through ml_dtypes (rounded on every write); 0 stores it as float32 (no rounding
    inside the kernel); other values are an error."""
    import ml_dtypes
    x = np.full((2, 4), 1.0, np.float32)
    exact = x + np.float32(0.01) * 3
    precise = bf16_sum_of_three(x)
    third = np.float32(0.01)
    want = x.astype(ml_dtypes.bfloat16)
    for _ in range(3):
        want = (want.astype(np.float32) + third).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(precise, want.astype(np.float32))
    assert np.abs(precise - exact).max() > 1e-3
    monkeypatch.setenv("NKI_PRECISE_FP", "1")
    np.testing.assert_array_equal(bf16_sum_of_three(x), precise)
    peak = bf16_sum_of_three.last_memory_usage[0]["sbuf_peak"]
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    y = bf16_sum_of_three(x)
    np.testing.assert_allclose(y, exact, rtol=1e-6)
    yb = bf16_sum_of_three(x.astype(ml_dtypes.bfloat16))      # outputs keep their dtype:
    assert yb.dtype == ml_dtypes.bfloat16                      # rounded once, on the way out
    np.testing.assert_array_equal(yb, exact.astype(ml_dtypes.bfloat16))
    # capacity counts the tile's bf16 bytes, not the float32 copy the simulator holds
    assert bf16_sum_of_three.last_memory_usage[0]["sbuf_peak"] == peak
    monkeypatch.setenv("NKI_PRECISE_FP", "yes")
    with pytest.raises(ValueError, match="NKI_PRECISE_FP: expected 0 or 1"):
        bf16_sum_of_three(x)
