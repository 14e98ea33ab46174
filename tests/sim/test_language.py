"""nki.language: allocation, buffers, tile_size, ds/loops, op identifiers, convenience ops."""
from __future__ import annotations

import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.jit import jit, simulate


def sb(values, dtype=nl.float32):
    """An SBUF tile holding ``values`` (test helper, outside any kernel)."""
    values = np.asarray(values)
    t = nl.ndarray(values.shape, dtype, buffer=nl.sbuf)
    t.write(values)
    return t


def test_ndarray_sentinels_and_buffers():
    assert np.isnan(nl.ndarray((4, 4), nl.bfloat16).read().astype(np.float32)).all()
    assert (nl.ndarray((4, 4), nl.int16, buffer=nl.psum).read() == 4).all()
    h = nl.ndarray((3, 5), nl.float32, buffer=nl.hbm)
    assert h.buffer == nl.hbm and h.buffer == nl.private_hbm and nl.is_hbm(h.buffer)
    assert nl.hbm is nl.private_hbm


def test_zeros_ones_full_fill_values():
    np.testing.assert_array_equal(nl.zeros((4, 3), nl.float32).read(), 0)
    np.testing.assert_array_equal(nl.ones((4, 3), nl.int32).read(), 1)
    np.testing.assert_array_equal(nl.full((4, 3), 2.5, nl.bfloat16).read().astype(np.float32), 2.5)
    np.testing.assert_array_equal(nl.full((6,), 7, nl.int8, buffer=nl.shared_hbm).read(), 7)
    x = nl.ones((2, 2), nl.float16)
    np.testing.assert_array_equal(nl.zeros_like(x).read(), 0)
    assert nl.zeros_like(x).dtype == nl.float16 and nl.empty_like(x, dtype=nl.int32).dtype == nl.int32


def test_full_rejects_non_numeric_fill():
    with pytest.raises(TypeError, match="fill_value"):
        nl.full((2, 2), "1", nl.float32)


def test_bad_buffer_and_dtype_rejected():
    with pytest.raises(TypeError, match="buffer"):
        nl.ndarray((2, 2), nl.float32, buffer="dram")
    with pytest.raises(TypeError, match="dtype"):
        nl.ndarray((2, 2), np.float64)


def test_address_must_be_a_pair():
    assert nl.ndarray((2, 2), nl.float32, address=(0, 0)).shape == (2, 2)
    with pytest.raises(TypeError, match="address"):
        nl.ndarray((2, 2), nl.float32, address=5)


def test_buffer_predicates():
    assert nl.is_sbuf(nl.sbuf) and nl.is_psum(nl.psum) and nl.is_on_chip(nl.psum)
    assert nl.is_hbm(nl.shared_hbm) and not nl.is_on_chip(nl.hbm) and not nl.is_sbuf(nl.psum)


def test_tile_size_per_target(set_target):
    ts = nl.tile_size
    assert (ts.pmax, ts.psum_bank_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax,
            ts.bn_stats_fmax, ts.psum_num_banks, ts.psum_bank_fmax_bytes) == (
        128, 512, 128, 512, 512, 8, 2048)
    trn2 = ts.sbuf_fmax_bytes
    set_target("trn3")
    assert ts.sbuf_fmax_bytes == trn2 + 32 * 1024
    assert ts.sbuf_size_bytes == 128 * 256 * 1024 and ts.total_available_sbuf_size == ts.sbuf_fmax_bytes


def test_target_env_aliases_and_bad_value(set_target):
    from nki_ssm.sim.targets import current_target
    for alias, want in (("trn1", "trn1"), ("inf2", "trn1"), ("gen3", "trn2"), ("GEN4", "trn3")):
        set_target(alias)
        assert current_target().name == want
    set_target("trn9")
    with pytest.raises(ValueError, match="NEURON_PLATFORM_TARGET_OVERRIDE.*trn9"):
        current_target()


def test_ds_and_ranges():
    t = sb(np.arange(32, dtype=np.float32).reshape(4, 8))
    np.testing.assert_array_equal(t[:, nl.ds(2, 3)].read(), t.read()[:, 2:5])
    assert list(nl.affine_range(3)) == [0, 1, 2]
    assert list(nl.sequential_range(1, 7, 2)) == [1, 3, 5] == list(nl.static_range(1, 7, 2))
    with pytest.raises(NkiValidationError, match="size"):
        nl.ds(0, 0)
    with pytest.raises(TypeError, match="start"):
        nl.ds(0.5, 2)


def test_program_id_axis_checked():
    with pytest.raises(NkiValidationError, match="axis"):
        nl.program_id(1)


def test_op_identifiers_work_as_nisa_ops():
    a = sb(np.array([[1.0, -2.0, 3.0]]))
    b = sb(np.array([[4.0, 5.0, -6.0]]))
    d = nl.ndarray((1, 3), nl.float32)
    for op, ref in ((nl.add, [5, 3, -3]), (nl.maximum, [4, 5, 3]), (nl.multiply, [4, -10, -18]),
                    (nl.max, [4, 5, 3]), (nl.greater, [0, 0, 1])):
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=op)
        np.testing.assert_array_equal(d.read(), [ref])
    nisa.activation(dst=d, op=nl.exp, data=a)
    np.testing.assert_allclose(d.read(), np.exp([[1.0, -2.0, 3.0]]), rtol=1e-6)
    assert nl.add == "add" and nl.add.name == "add" and repr(nl.silu) == "nl.silu"


def test_op_apply_uses_float32_math():
    x = np.array([0.5, -1.0], np.float32)
    np.testing.assert_allclose(nl.silu.apply(x), x / (1 + np.exp(-x)), rtol=1e-6)
    np.testing.assert_array_equal(nl.subtract.apply(x, x), [0, 0])


def test_elementwise_convenience_ops_match_numpy(rng):
    xv = rng.standard_normal((8, 16)).astype(np.float32)
    yv = rng.standard_normal((8, 16)).astype(np.float32)
    x, y = sb(xv), sb(yv)
    np.testing.assert_array_equal(nl.add(x, y).read(), xv + yv)
    np.testing.assert_array_equal(nl.subtract(x, y).read(), xv - yv)
    np.testing.assert_array_equal(nl.multiply(x, 2.0).read(), xv * 2)
    np.testing.assert_array_equal(nl.subtract(1.0, x).read(), 1 - xv)
    np.testing.assert_allclose(nl.exp(x).read(), np.exp(xv), rtol=1e-6)
    np.testing.assert_allclose(nl.tanh(x, dtype=nl.bfloat16).read().astype(np.float32),
                               np.tanh(xv), atol=1e-2)
    np.testing.assert_array_equal(nl.copy(x).read(), xv)


def test_divide_and_broadcasting_binary_rejected():
    x = sb(np.ones((4, 8), np.float32))
    with pytest.raises(NkiValidationError, match="reciprocal"):
        nl.divide(x, x)
    with pytest.raises(NkiValidationError, match="broadcast"):
        nl.add(x, sb(np.ones((4, 1), np.float32)))


def test_convenience_op_on_hbm_rejected():
    h = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
    with pytest.raises(NkiValidationError, match="SBUF or PSUM"):
        nl.exp(h)


def test_load_store_matmul_transpose_in_a_kernel(rng):
    @jit
    def k(a, b):
        ta, tb = nl.load(a), nl.load(b)
        prod = nl.matmul(ta, tb, transpose_x=True)          # a.T @ b
        res = nl.copy(prod)
        trans = nl.copy(nl.transpose(tb))                     # b.T
        out1 = nl.ndarray(res.shape, nl.float32, buffer=nl.shared_hbm)
        out2 = nl.ndarray(trans.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out1, res)
        nl.store(out2, trans)
        return out1, out2

    a = rng.standard_normal((32, 16)).astype(np.float32)
    b = rng.standard_normal((32, 24)).astype(np.float32)
    p, t = simulate(k)(a, b)
    np.testing.assert_allclose(p, a.T @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(t, b.T)


def test_matmul_without_transpose_x(rng):
    @jit
    def k(a, b):
        res = nl.copy(nl.matmul(nl.load(a), nl.load(b)))
        out = nl.ndarray(res.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    a = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.standard_normal((32, 8)).astype(np.float32)
    np.testing.assert_allclose(simulate(k)(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_store_from_psum_rejected():
    p = nl.zeros((4, 4), nl.float32, buffer=nl.psum)
    with pytest.raises(NkiValidationError, match="PSUM"):
        nl.store(nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm), p)


def test_broadcast_to_free_and_partition(rng):
    row = rng.standard_normal((1, 600)).astype(np.float32)
    col = rng.standard_normal((8, 1)).astype(np.float32)
    np.testing.assert_array_equal(nl.broadcast_to(sb(col), (8, 5)).read(), np.broadcast_to(col, (8, 5)))
    np.testing.assert_array_equal(nl.broadcast_to(sb(row), (16, 600)).read(),
                                  np.broadcast_to(row, (16, 600)))
    with pytest.raises(NkiValidationError, match="cannot broadcast"):
        nl.broadcast_to(sb(col), (4, 5))


def test_reductions(rng):
    xv = rng.standard_normal((8, 4, 6)).astype(np.float32)
    x = sb(xv)
    np.testing.assert_allclose(nl.sum(x, axis=(1, 2)).read()[:, 0], xv.sum(axis=(1, 2)), rtol=1e-5)
    np.testing.assert_array_equal(nl.max(x, axis=2).read(), xv.max(axis=2))
    np.testing.assert_array_equal(nl.min(x, axis=-1, keepdims=True).read(), xv.min(axis=2, keepdims=True))
    with pytest.raises(NkiValidationError, match="axis"):
        nl.sum(x, axis=0)


def test_shared_constant_identity_rand_and_seed():
    c = nl.shared_constant(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert c.buffer == nl.shared_hbm and (c.read() == np.arange(6).reshape(2, 3)).all()
    eye = nl.shared_identity_matrix(4)
    assert eye.dtype == nl.uint8 and (eye.read() == np.eye(4)).all()

    @jit
    def k(seed):
        s = nl.full((1, 1), seed, nl.int32)
        nl.random_seed(s)
        a = nl.rand((4, 8), nl.float32)
        nl.random_seed(s)
        b = nl.rand((4, 8), nl.float32)
        out = nl.ndarray((2, 4, 8), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], a)
        nl.store(out[1], b)
        return out

    r = simulate(k)(42)
    np.testing.assert_array_equal(r[0], r[1])
    assert ((r >= 0) & (r < 1)).all() and r[0].std() > 0


def test_device_print(capsys):
    nl.device_print("val:", sb(np.array([[1.5, 2.0]], np.float32)))
    assert "val:" in capsys.readouterr().out
    with pytest.raises(TypeError):
        nl.device_print("x", np.ones(2))


def test_more_convenience_ops(rng):
    xv = rng.standard_normal((8, 32)).astype(np.float32)
    x = sb(xv)
    np.testing.assert_array_equal(nl.negative(x).read(), -xv)
    np.testing.assert_array_equal(nl.logical_not(sb((xv > 0).astype(np.float32))).read(),
                                  (xv <= 0).astype(np.float32))
    np.testing.assert_allclose(nl.mean(x, axis=1).read()[:, 0], xv.mean(axis=1), rtol=1e-5, atol=1e-6)
    e = np.exp(xv - xv.max(axis=1, keepdims=True))
    np.testing.assert_allclose(nl.softmax(x).read(), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    with pytest.raises(NotImplementedError, match="floor"):
        nl.floor(x)


def test_load_transpose2d(rng):
    @jit
    def k(a):
        t = nl.load_transpose2d(a)
        out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    import ml_dtypes
    a = rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(simulate(k)(a), a.T)
