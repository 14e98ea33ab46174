"""nki.isa instruction semantics against NumPy: casts, accumulation, masks, edge shapes.

Tiles are allocated directly with nl.ndarray (outside a launch nothing is
counted); values go in and out through dma_copy from HBM tensors, so every
test also exercises the DMA path.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.tensor import from_array

BF16 = ml_dtypes.bfloat16


def sb(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def ps(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.psum)


def load(a, dtype=None, buffer=nl.sbuf):
    """An on-chip tile holding numpy array ``a`` (cast by dma_copy if dtype differs)."""
    h = from_array(np.asarray(a))
    t = nl.ndarray(h.shape, dtype=dtype or h.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=h)
    if buffer is nl.psum:
        p = nl.ndarray(h.shape, dtype=t.dtype, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=t)
        return p
    return t


def val(t):
    return t.read()


def f32(x):
    return np.asarray(x, dtype=np.float32)


# ---------------------------------------------------------------- DMA / copies

def test_dma_copy_casts_through_fp32_with_rne(rng):
    x = rng.standard_normal((16, 40)).astype(np.float32)
    t = load(x, dtype=nl.bfloat16)
    assert t.read().dtype == BF16
    np.testing.assert_array_equal(val(t), x.astype(BF16))   # one RNE rounding
    out = from_array(np.zeros((16, 40), np.float32))
    nisa.dma_copy(dst=out, src=t)
    np.testing.assert_array_equal(out.read(), x.astype(BF16).astype(np.float32))


def test_dma_copy_shapes_may_differ_with_equal_element_count(rng):
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    h = from_array(x)
    t = sb((4, 48))
    nisa.dma_copy(dst=t, src=h)
    np.testing.assert_array_equal(val(t), x.reshape(4, 48))


def test_dma_copy_float_to_int_rounds_half_even_and_saturates():
    x = np.array([[0.5, 1.5, 2.5, -0.5, 300.0, -300.0, np.nan, 2.4]], np.float32)
    t = load(x, dtype=nl.int8)
    np.testing.assert_array_equal(val(t), np.array([[0, 2, 2, 0, 127, -128, 0, 2]], np.int8))


def test_dma_gather_rows_with_vector_offset_and_scatter(rng):
    data = rng.standard_normal((10, 8)).astype(np.float32)
    idx = np.array([[3], [0], [9], [3]], np.int32)
    h = from_array(data)
    it = load(idx)
    g = sb((4, 8))
    nisa.dma_copy(dst=g, src=h.ap(pattern=[[8, 4], [1, 8]], vector_offset=it, indirect_dim=0))
    np.testing.assert_array_equal(val(g), data[idx[:, 0]])
    # scatter the rows back, doubled, into a zero HBM tensor
    out = from_array(np.zeros((10, 8), np.float32))
    d = sb((4, 8))
    nisa.tensor_scalar(dst=d, data=g, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out.ap(pattern=[[8, 4], [1, 8]], vector_offset=it, indirect_dim=0), src=d)
    ref = np.zeros((10, 8), np.float32)
    ref[idx[:, 0]] = 2 * data[idx[:, 0]]
    np.testing.assert_array_equal(out.read(), ref)


def test_dma_gather_oob_skip_leaves_rows_untouched(rng):
    data = rng.standard_normal((5, 4)).astype(np.float32)
    h = from_array(data)
    it = load(np.array([[1], [7], [4]], np.int32))
    g = sb((3, 4))
    nisa.memset(dst=g, value=-1.0)
    nisa.dma_copy(dst=g, src=h.ap(pattern=[[4, 3], [1, 4]], vector_offset=it, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    np.testing.assert_array_equal(val(g)[0], data[1])
    np.testing.assert_array_equal(val(g)[1], -np.ones(4, np.float32))
    np.testing.assert_array_equal(val(g)[2], data[4])


def test_dma_transpose_2d_and_3d(rng):
    x = rng.standard_normal((16, 24)).astype(np.float32).astype(BF16)
    t = load(x)
    d = sb((24, 16), nl.bfloat16)
    nisa.dma_transpose(dst=d, src=t)
    np.testing.assert_array_equal(val(d), x.T)
    y = rng.standard_normal((8, 3, 4)).astype(np.float32)   # rows of 8 fp32: 32-byte aligned
    hy = from_array(y)
    d3 = sb((4, 3, 8))
    nisa.dma_transpose(dst=d3, src=hy, axes=(2, 1, 0))
    np.testing.assert_array_equal(val(d3), y.transpose(2, 1, 0))


def test_tensor_copy_same_dtype_is_bit_exact_and_psum_eviction(rng):
    bits = rng.integers(0, 2 ** 32, size=(8, 16), dtype=np.uint32)
    x = bits.view(np.float32)          # includes NaN payloads
    t = load(x)
    p = ps((8, 16))
    nisa.tensor_copy(dst=p, src=t)
    s = sb((8, 16))
    nisa.tensor_copy(dst=s, src=p, engine=nisa.engine.scalar)
    assert np.array_equal(val(s).view(np.uint32), bits)


def test_tensor_copy_across_dtypes_and_free_ranks(rng):
    x = rng.standard_normal((8, 12)).astype(np.float32)
    t = load(x)
    d = sb((8, 3, 4), nl.bfloat16)
    nisa.tensor_copy(dst=d, src=t)
    np.testing.assert_array_equal(val(d), x.astype(BF16).reshape(8, 3, 4))


def test_memset_values_and_int_dtypes():
    t = sb((4, 5), nl.int16)
    nisa.memset(dst=t, value=-7)
    assert (val(t) == -7).all()
    f = sb((4, 5), nl.bfloat16)
    nisa.memset(dst=f, value=0.1)
    assert (val(f) == BF16(0.1)).all()


# ---------------------------------------------------------------- elementwise

@pytest.mark.parametrize("op,ref", [
    (nl.add, np.add), (nl.subtract, np.subtract), (nl.multiply, np.multiply),
    (nl.maximum, np.maximum), (nl.minimum, np.minimum),
    (nl.greater, lambda a, b: (a > b).astype(np.float32)),
    (nl.equal, lambda a, b: (a == b).astype(np.float32)),
])
def test_tensor_tensor_ops_fp32(rng, op, ref):
    a = rng.standard_normal((32, 33)).astype(np.float32)
    b = rng.standard_normal((32, 33)).astype(np.float32)
    b[0, :5] = a[0, :5]
    d = sb((32, 33))
    nisa.tensor_tensor(dst=d, data1=load(a), data2=load(b), op=op)
    np.testing.assert_array_equal(val(d), ref(a, b))


def test_tensor_tensor_bf16_out_is_one_rounding_of_fp32_result(rng):
    a = rng.standard_normal((16, 64)).astype(np.float32).astype(BF16)
    b = rng.standard_normal((16, 64)).astype(np.float32).astype(BF16)
    d = sb((16, 64), nl.bfloat16)
    nisa.tensor_tensor(dst=d, data1=load(a), data2=load(b), op=nl.multiply)
    exact = a.astype(np.float32) * b.astype(np.float32)
    np.testing.assert_array_equal(val(d), exact.astype(BF16))


def test_tensor_tensor_psum_operand_and_int32_exact_on_gpsimd():
    a = load(np.full((4, 4), 3.0, np.float32), buffer=nl.psum)
    b = load(np.full((4, 4), 2.0, np.float32))
    d = sb((4, 4))
    nisa.tensor_tensor(dst=d, data1=a, data2=b, op=nl.subtract)
    assert (val(d) == 1.0).all()
    big = np.array([[2 ** 30 + 1, 7]], np.int32)
    x = load(big)
    y = load(np.array([[2 ** 30 + 3, -9]], np.int32))
    r = sb((1, 2), nl.int32)
    nisa.tensor_tensor(dst=r, data1=x, data2=y, op=nl.add)   # GpSimd: exact int32
    np.testing.assert_array_equal(val(r), np.array([[2 ** 31 - 1, -2]], np.int32))  # saturates


def test_bitvec_ops_use_raw_bits():
    a = load(np.array([[0b1100, -1]], np.int32))
    b = load(np.array([[0b1010, 0x0F]], np.int32))
    d = sb((1, 2), nl.int32)
    nisa.tensor_tensor(dst=d, data1=a, data2=b, op=nl.bitwise_and, engine=nisa.engine.vector)
    np.testing.assert_array_equal(val(d), [[0b1000, 0x0F]])
    nisa.tensor_scalar(dst=d, data=a, op0=nl.right_shift, operand0=28)
    np.testing.assert_array_equal(val(d), [[0, 0xF]])   # logical shift of -1


def test_tensor_scalar_two_ops_reverse_and_column_operand(rng):
    x = rng.standard_normal((8, 10)).astype(np.float32)
    col = rng.standard_normal((8, 1)).astype(np.float32)
    d = sb((8, 10))
    nisa.tensor_scalar(dst=d, data=load(x), op0=nl.subtract, operand0=load(col), reverse0=True,
                       op1=nl.multiply, operand1=3.0)
    np.testing.assert_allclose(val(d), ((col - x) * f32(3.0)).astype(np.float32), rtol=0, atol=0)


def test_tensor_scalar_unary_ops(rng):
    x = rng.uniform(0.5, 4.0, (4, 8)).astype(np.float32)
    d = sb((4, 8))
    nisa.tensor_scalar(dst=d, data=load(x), op0=nl.reciprocal, operand0=None)
    np.testing.assert_allclose(val(d), 1.0 / x, rtol=1e-7)
    nisa.tensor_scalar(dst=d, data=load(x), op0=nl.rsqrt, operand0=0.0, engine=nisa.engine.gpsimd)
    np.testing.assert_allclose(val(d), 1.0 / np.sqrt(x), rtol=1e-6)


def test_scalar_tensor_tensor_fma(rng):
    x = rng.standard_normal((16, 20)).astype(np.float32)
    w = rng.standard_normal((16, 1)).astype(np.float32)
    acc = rng.standard_normal((16, 20)).astype(np.float32)
    d = sb((16, 20))
    nisa.scalar_tensor_tensor(dst=d, data=load(x), op0=nl.multiply, operand0=load(w),
                              op1=nl.add, operand1=load(acc))
    np.testing.assert_array_equal(val(d), (x * w) + acc)
    nisa.scalar_tensor_tensor(dst=d, data=load(x), op0=nl.add, operand0=1.0, op1=nl.subtract,
                              operand1=load(acc), reverse1=True)
    np.testing.assert_array_equal(val(d), acc - (x + f32(1.0)))


def test_reciprocal_vector(rng):
    x = rng.uniform(1, 2, (3, 7)).astype(np.float32)
    d = sb((3, 7))
    nisa.reciprocal(dst=d, data=load(x))
    np.testing.assert_array_equal(val(d), (np.float32(1) / x))


# ---------------------------------------------------------------- ScalarE

@pytest.mark.parametrize("op,ref", [
    (nl.exp, np.exp), (nl.tanh, np.tanh), (nl.copy, lambda v: v),
    (nl.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
    (nl.silu, lambda v: v / (1 + np.exp(-v))),
    (nl.softplus, lambda v: np.logaddexp(0, v)),
])
def test_activation_functions_scale_bias(rng, op, ref):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    scale = rng.standard_normal((8, 1)).astype(np.float32)
    bias = rng.standard_normal((8, 1)).astype(np.float32)
    d = sb((8, 16))
    nisa.activation(dst=d, op=op, data=load(x), bias=load(bias), scale=load(scale))
    z = (x * scale + bias).astype(np.float32)
    np.testing.assert_allclose(val(d), ref(z.astype(np.float64)), rtol=2e-6, atol=1e-7)


def test_activation_reduce_and_register_chaining(rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    y = rng.standard_normal((8, 16)).astype(np.float32)
    d = sb((8, 16))
    r = sb((8, 1))
    nisa.activation_reduce(dst=d, op=nl.exp, data=load(x), reduce_op=nl.add, reduce_res=r)
    np.testing.assert_allclose(val(r)[:, 0], np.exp(x.astype(np.float64)).sum(1), rtol=1e-5)
    nisa.activation(dst=d, op=nl.copy, data=load(y), scale=2.0, bias=1.0, reduce_op=nl.add,
                    reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=r)
    want = np.exp(x.astype(np.float64)).sum(1) + (2 * y.astype(np.float64) + 1).sum(1)
    np.testing.assert_allclose(val(r)[:, 0], want, rtol=1e-5)


# ---------------------------------------------------------------- reductions

def test_tensor_reduce_trailing_axes_keepdims_negate(rng):
    x = rng.standard_normal((8, 3, 4, 5)).astype(np.float32)
    t = load(x)
    d = sb((8, 3))
    nisa.tensor_reduce(dst=d, op=nl.add, data=t, axis=(2, 3))
    np.testing.assert_allclose(val(d), x.sum(axis=(2, 3)), rtol=1e-5)
    dk = sb((8, 3, 1, 1))
    nisa.tensor_reduce(dst=dk, op=nl.maximum, data=t, axis=[-2, -1], keepdims=True, negate=True)
    np.testing.assert_array_equal(val(dk), -x.max(axis=(2, 3), keepdims=True))
    d1 = sb((8, 1))
    nisa.tensor_reduce(dst=d1, op=nl.multiply, data=t, axis=(1, 2, 3))
    np.testing.assert_allclose(val(d1)[:, 0], x.reshape(8, -1).prod(1), rtol=1e-4)


def test_tensor_scalar_reduce_accumulates_across_tiles(rng):
    x = rng.standard_normal((4, 10)).astype(np.float32)
    y = rng.standard_normal((4, 6)).astype(np.float32)
    d1, d2, r = sb((4, 10)), sb((4, 6)), sb((4, 1))
    nisa.tensor_scalar_reduce(dst=d1, data=load(x), op0=nl.multiply, operand0=2.0,
                              reduce_op=nl.maximum, reduce_res=None)
    nisa.tensor_scalar_reduce(dst=d2, data=load(y), op0=nl.multiply, operand0=2.0,
                              reduce_op=nl.maximum, reduce_res=r,
                              reduce_cmd=nisa.reduce_cmd.reduce, reduce_res_negate=True)
    np.testing.assert_array_equal(val(d1), 2 * x)
    want = -np.maximum((2 * x).max(1), (2 * y).max(1))
    np.testing.assert_array_equal(val(r)[:, 0], want)


def test_tensor_partition_reduce_and_bn_stats_aggr(rng):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    d = sb((1, 8))
    nisa.tensor_partition_reduce(dst=d, op=nl.add, data=load(x))
    np.testing.assert_allclose(val(d)[0], x.sum(0), rtol=1e-5, atol=1e-6)
    big = rng.standard_normal((4, 700)).astype(np.float32) * 3 + 1
    t = load(big)
    stats = sb((4, 12))
    nisa.bn_stats(dst=stats[:, 0:6], data=t[:, 0:512])
    nisa.bn_stats(dst=stats[:, 6:12], data=t[:, 512:700])
    mv = sb((4, 2))
    nisa.bn_aggr(dst=mv, data=stats)
    np.testing.assert_allclose(val(mv)[:, 0], big.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(val(mv)[:, 1], big.var(1), rtol=1e-4)


# ---------------------------------------------------------------- scans

def _scan_ref(a, b, h0):
    h = h0.astype(np.float32).copy()
    out = np.empty_like(a)
    for i in range(a.shape[1]):
        h = (a[:, i] * h).astype(np.float32) + b[:, i]
        out[:, i] = h
    return out


@settings(max_examples=12, deadline=None)
@given(P=st.integers(1, 32), F=st.integers(1, 40), seed=st.integers(0, 2 ** 16))
def test_tensor_tensor_scan_linear_recurrence_property(P, F, seed):
    r = np.random.default_rng(seed)
    a = r.uniform(0.5, 1.0, (P, F)).astype(np.float32)
    b = r.standard_normal((P, F)).astype(np.float32)
    h0 = r.standard_normal((P, 1)).astype(np.float32)
    d = sb((P, F))
    nisa.tensor_tensor_scan(dst=d, data0=load(a), data1=load(b), initial=load(h0),
                            op0=nl.multiply, op1=nl.add)
    np.testing.assert_array_equal(val(d), _scan_ref(a, b, h0[:, 0]))


def test_tensor_tensor_scan_reverse_flags_and_scalar_initial(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    b = rng.standard_normal((4, 6)).astype(np.float32)
    d = sb((4, 6))
    nisa.tensor_tensor_scan(dst=d, data0=load(a), data1=load(b), initial=0.5,
                            op0=nl.subtract, op1=nl.subtract, reverse0=True, reverse1=True)
    h = np.full(4, 0.5, np.float32)
    ref = np.empty_like(a)
    for i in range(6):
        h = b[:, i] - (h - a[:, i])      # reverse0: prev op0 data0 ; reverse1: data1 op1 tmp
        ref[:, i] = h
    np.testing.assert_array_equal(val(d), ref)


def test_tensor_scalar_cumulative_reset_load_and_continue(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    y = rng.standard_normal((4, 5)).astype(np.float32)
    d1, d2 = sb((4, 8)), sb((4, 5))
    nisa.tensor_scalar_cumulative(dst=d1, src=load(x), op0=nl.multiply, op1=nl.add, imm0=2.0)
    nisa.tensor_scalar_cumulative(dst=d2, src=load(y), op0=nl.multiply, op1=nl.add, imm0=2.0,
                                  reduce_cmd=nisa.reduce_cmd.reduce)
    full = np.cumsum(np.concatenate([2 * x, 2 * y], axis=1), axis=1, dtype=np.float32)
    np.testing.assert_allclose(val(d1), full[:, :8], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(val(d2), full[:, 8:], rtol=1e-6, atol=1e-6)
    nisa.tensor_scalar_cumulative(dst=d2, src=load(y), op0=nl.add, op1=nl.maximum, imm0=0.0,
                                  imm1=0.25, reduce_cmd=nisa.reduce_cmd.load_reduce)
    np.testing.assert_array_equal(val(d2), np.maximum.accumulate(
        np.concatenate([np.full((4, 1), 0.25, np.float32), y], 1), axis=1)[:, 1:])


# ---------------------------------------------------------------- GpSimd / selects

def test_iota_pattern_and_channel_multiplier():
    d = sb((4, 2, 3), nl.int32)
    nisa.iota(dst=d, pattern=[[10, 2], [1, 3]], offset=5, channel_multiplier=100)
    p, w, x = np.meshgrid(np.arange(4), np.arange(2), np.arange(3), indexing="ij")
    np.testing.assert_array_equal(val(d), 5 + 100 * p + 10 * w + x)
    f = sb((2, 4), nl.float32)
    nisa.iota(dst=f, pattern=[[-1, 4]], offset=0, channel_multiplier=1)
    np.testing.assert_array_equal(val(f), np.arange(2)[:, None] - np.arange(4)[None, :])


def test_affine_select_causal_mask(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    d = sb((8, 8))
    nisa.affine_select(dst=d, pattern=[[-1, 8]], channel_multiplier=1, on_true_tile=load(x),
                       on_false_value=-9.0, cmp_op=nl.greater_equal, offset=0)
    np.testing.assert_array_equal(val(d), np.where(np.tril(np.ones((8, 8), bool)), x, -9.0))


def test_range_select_ragged_mask_with_max_reduce(rng):
    x = rng.standard_normal((4, 10)).astype(np.float32)
    lo = np.array([[0], [2], [5], [9]], np.float32)
    hi = np.array([[3], [7], [5], [20]], np.float32)
    d, r = sb((4, 10)), sb((4, 1))
    nisa.range_select(dst=d, on_true_tile=load(x), comp_op0=nl.greater_equal, comp_op1=nl.less,
                      bound0=load(lo), bound1=load(hi), reduce_res=r, range_start=0)
    j = np.arange(10)[None, :]
    mask = (j >= lo) & (j < hi)
    want = np.where(mask, x, nisa.FP32_MIN).astype(np.float32)
    np.testing.assert_array_equal(val(d), want)
    np.testing.assert_array_equal(val(r)[:, 0], want.max(1))


def test_select_reduce_with_column_on_false_and_reverse(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    pred = (rng.random((4, 6)) > 0.5).astype(np.uint8)
    onf = rng.standard_normal((4, 1)).astype(np.float32)
    d, r = sb((4, 6)), sb((4, 1))
    nisa.select_reduce(dst=d, predicate=load(pred), on_true=load(x), on_false=load(onf),
                       reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce, reverse_pred=True)
    want = np.where(pred == 0, x, onf)
    np.testing.assert_array_equal(val(d), want)
    np.testing.assert_array_equal(val(r)[:, 0], want.max(1))


def test_nc_stream_shuffle_broadcast_and_255_keeps_dst(rng):
    x = rng.standard_normal((32, 5)).astype(np.float32)
    src = load(x)
    d = sb((64, 5))
    nisa.memset(dst=d, value=7.0)
    nisa.nc_stream_shuffle(dst=d[32:64, :], src=src[0:1, :], shuffle_mask=[0] * 32)
    np.testing.assert_array_equal(val(d)[32:], np.repeat(x[0:1], 32, 0))
    assert (val(d)[:32] == 7.0).all()
    mask = [(i + 1) % 32 for i in range(32)]
    mask[3] = 255
    d2 = sb((32, 5))
    nisa.memset(dst=d2, value=-1.0)
    nisa.nc_stream_shuffle(dst=d2, src=src, shuffle_mask=mask)
    want = x[[(i + 1) % 32 for i in range(32)]]
    want[3] = -1.0
    np.testing.assert_array_equal(val(d2), want)


# ---------------------------------------------------------------- TensorE

def test_nc_matmul_fp32_accumulation_modes(rng):
    s1 = rng.standard_normal((64, 32)).astype(np.float32)
    m1 = rng.standard_normal((64, 48)).astype(np.float32)
    s2 = rng.standard_normal((64, 32)).astype(np.float32)
    m2 = rng.standard_normal((64, 48)).astype(np.float32)
    p = ps((32, 48))
    nisa.nc_matmul(dst=p, stationary=load(s1), moving=load(m1))           # None: overwrites NaN
    r1 = (s1.astype(np.float64).T @ m1).astype(np.float32)
    np.testing.assert_array_equal(val(p), r1)
    nisa.nc_matmul(dst=p, stationary=load(s2), moving=load(m2))           # None: adds
    r2 = (s2.astype(np.float64).T @ m2).astype(np.float32)
    np.testing.assert_array_equal(val(p), r1 + r2)
    nisa.nc_matmul(dst=p, stationary=load(s2), moving=load(m2), accumulate=False)
    np.testing.assert_array_equal(val(p), r2)
    nisa.nc_matmul(dst=p, stationary=load(s1), moving=load(m1), accumulate=True)
    np.testing.assert_array_equal(val(p), r2 + r1)


def test_nc_matmul_auto_accumulate_is_per_element():
    p = ps((4, 8))
    one = load(np.ones((2, 4), np.float32))
    nisa.nc_matmul(dst=p[:, 0:4], stationary=one, moving=load(np.ones((2, 4), np.float32)))
    nisa.nc_matmul(dst=p[:, 2:8], stationary=one, moving=load(np.ones((2, 6), np.float32)))
    np.testing.assert_array_equal(val(p)[0], [2, 2, 4, 4, 2, 2, 2, 2])


def test_nc_matmul_bf16_operands_multidim_free(rng):
    s = rng.standard_normal((128, 4, 8)).astype(np.float32).astype(BF16)
    m = rng.standard_normal((128, 2, 256)).astype(np.float32).astype(BF16)
    p = ps((32, 512))
    nisa.nc_matmul(dst=p, stationary=load(s), moving=load(m))
    ref = s.reshape(128, 32).astype(np.float64).T @ m.reshape(128, 512).astype(np.float64)
    np.testing.assert_array_equal(val(p), ref.astype(np.float32))


def test_nc_matmul_double_row_fp8(rng):
    s = rng.standard_normal((16, 2, 4)).astype(np.float32).astype(ml_dtypes.float8_e4m3)
    m = rng.standard_normal((16, 2, 6)).astype(np.float32).astype(ml_dtypes.float8_e5m2)
    p = ps((4, 6))
    nisa.nc_matmul(dst=p, stationary=load(s), moving=load(m),
                   perf_mode=nisa.matmul_perf_mode.double_row)
    ref = s.astype(np.float64).reshape(32, 4).T @ m.astype(np.float64).reshape(32, 6)
    np.testing.assert_array_equal(val(p), ref.astype(np.float32))


def test_nc_matmul_transpose_mode_and_nc_transpose_bit_exact(rng):
    x = rng.standard_normal((16, 24)).astype(np.float32).astype(BF16)
    x[0, 0] = np.nan
    t = load(x)
    p = ps((24, 16), nl.bfloat16)
    nisa.nc_matmul(dst=p, stationary=t, moving=load(np.eye(16, dtype=np.float32).astype(BF16)),
                   is_transpose=True)
    assert np.array_equal(val(p).view(np.uint16), x.T.view(np.uint16))
    p2 = ps((24, 16), nl.bfloat16)
    nisa.nc_transpose(dst=p2, data=t)
    assert np.array_equal(val(p2).view(np.uint16), x.T.view(np.uint16))
    v = sb((8, 4))
    small = rng.standard_normal((4, 8)).astype(np.float32)
    nisa.nc_transpose(dst=v, data=load(small), engine=nisa.engine.vector)
    np.testing.assert_array_equal(val(v), small.T)


def test_nc_matmul_trn3_bf16_dst_and_wide_n(rng, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    s = rng.standard_normal((32, 8)).astype(np.float32).astype(BF16)
    m = rng.standard_normal((32, 2048)).astype(np.float32).astype(BF16)
    p = ps((8, 2048), nl.bfloat16)
    nisa.nc_matmul(dst=p, stationary=load(s), moving=load(m))
    ref = (s.astype(np.float64).T @ m.astype(np.float64)).astype(np.float32).astype(BF16)
    np.testing.assert_array_equal(val(p), ref)
    assert nisa.get_nc_version() == nisa.nc_version.gen4


def test_instruction_handle_depends_on():
    t = sb((2, 2))
    a = nisa.memset(dst=t, value=1.0, name="a")
    b = nisa.memset(dst=t, value=2.0)
    assert b.depends_on(a) is b and b.dependencies == [a] and a.name == "a"
    with pytest.raises(TypeError, match="depends_on"):
        b.depends_on("a")


# ---------------------------------------------------------------- further instructions

def test_dma_copy_scalar_offset_moves_whole_view(rng):
    data = rng.standard_normal((6, 4, 8)).astype(np.float32)
    h = from_array(data)
    off = load(np.array([[3]], np.int32))
    t = sb((4, 8))
    nisa.dma_copy(dst=t, src=h.ap(pattern=[[8, 4], [1, 8]], scalar_offset=off, indirect_dim=0))
    np.testing.assert_array_equal(val(t), data[3])


def test_exponential_trn3_with_running_sum(rng, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    x = rng.standard_normal((4, 10)).astype(np.float32)
    y = rng.standard_normal((4, 6)).astype(np.float32)
    m = x.max(1, keepdims=True)
    d1, d2, r = sb((4, 10)), sb((4, 6)), sb((4, 1))
    nisa.exponential(dst=d1, src=load(x), max_value=load(m), reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.exponential(dst=d2, src=load(y), max_value=load(m), reduce_cmd=nisa.reduce_cmd.reduce,
                     reduce_res=r)
    np.testing.assert_allclose(val(d1), np.exp(x - m), rtol=1e-6)
    want = np.exp(x - m).sum(1) + np.exp(y - m).sum(1)
    np.testing.assert_allclose(val(r)[:, 0], want, rtol=1e-5)


def test_activate2_trn3_scale_bias_prelu_and_max_reduce(rng, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    x = rng.standard_normal((4, 10)).astype(np.float32)
    d, r = sb((4, 10)), sb((4, 1))
    nisa.activate2(dst=d, op=nl.prelu, data=load(x), imm0=2.0, imm1=0.5, op0=nl.multiply, op1=nl.subtract,
                   relu_param=0.1, reduce_op=nl.maximum, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                   reduce_res=r)
    z = x * np.float32(2) - np.float32(0.5)
    want = np.where(z > 0, z, z * np.float32(0.1))
    np.testing.assert_allclose(val(d), want, rtol=1e-6)
    np.testing.assert_allclose(val(r)[:, 0], want.max(1), rtol=1e-6)


def test_tensor_copy_predicated_tile_and_scalar(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    pred = (rng.random((4, 6)) > 0.5).astype(np.uint8)
    d = sb((4, 6))
    nisa.memset(dst=d, value=5.0)
    nisa.tensor_copy_predicated(dst=d, src=load(x), predicate=load(pred))
    np.testing.assert_array_equal(val(d), np.where(pred != 0, x, 5.0))
    nisa.tensor_copy_predicated(dst=d, src=-1.0, predicate=load(pred), reverse_pred=True)
    np.testing.assert_array_equal(val(d), np.where(pred != 0, x, -1.0))


def test_max8_and_nc_n_gather(rng):
    x = rng.standard_normal((4, 3, 7)).astype(np.float32)
    d = sb((4, 8))
    nisa.max8(dst=d, src=load(x))
    np.testing.assert_array_equal(val(d), -np.sort(-x.reshape(4, -1), axis=1)[:, :8])
    idx = rng.integers(0, 21, (4, 5)).astype(np.uint32)
    g = sb((4, 5))
    nisa.nc_n_gather(dst=g, data=load(x), indices=load(idx))
    np.testing.assert_array_equal(val(g), np.take_along_axis(x.reshape(4, -1), idx.astype(np.int64), 1))


_DTYPES = {"float32": np.float32, "bfloat16": BF16, "float16": np.float16, "int16": np.int16}


@settings(max_examples=20, deadline=None)
@given(P=st.integers(1, 128), F=st.integers(1, 48), seed=st.integers(0, 2 ** 16),
       din=st.sampled_from(sorted(_DTYPES)), dout=st.sampled_from(sorted(_DTYPES)),
       op=st.sampled_from(["add", "multiply", "maximum", "subtract"]))
def test_tensor_tensor_and_scalar_one_rounding_property(P, F, seed, din, dout, op):
    r = np.random.default_rng(seed)
    a = (r.standard_normal((P, F)) * 50).astype(_DTYPES[din])
    b = (r.standard_normal((P, F)) * 50).astype(_DTYPES[din])
    ta, tb = load(a), load(b)
    d = sb((P, F), getattr(nl, dout))
    nisa.tensor_tensor(dst=d, data1=ta, data2=tb, op=getattr(nl, op))
    exact = getattr(np, op)(a.astype(np.float32), b.astype(np.float32))
    from nki_ssm.sim.dtypes import cast
    np.testing.assert_array_equal(val(d), cast(exact, getattr(nl, dout)))
    nisa.tensor_scalar(dst=d, data=ta, op0=getattr(nl, op), operand0=1.5)
    np.testing.assert_array_equal(val(d), cast(getattr(np, op)(a.astype(np.float32), np.float32(1.5)),
                                               getattr(nl, dout)))


def test_nc_find_index8_and_match_replace8_doc_example():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    d, idx = sb((1, 11)), sb((1, 8), nl.uint32)
    nisa.nc_match_replace8(dst=d, data=load(data), vals=load(vals), imm=-1.0, dst_idx=idx)
    np.testing.assert_array_equal(val(idx)[0], [2, 10, 9, 8, 7, 6, 5, 4])     # documented example
    np.testing.assert_array_equal(val(d)[0], [1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1])
    f = sb((1, 8), nl.uint32)
    v2 = np.array([[8, 3, 8, 99, 1, 2, 4, 8]], np.float32)
    nisa.nc_find_index8(dst=f, data=load(data), vals=load(v2))
    np.testing.assert_array_equal(val(f)[0], [4, 2, 5, 0xFFFFFFFF, 0, 1, 3, 6])


def test_dma_compute_add_and_scatter_rmw(rng):
    a = rng.standard_normal((8, 4)).astype(np.float32)
    b = rng.standard_normal((8, 4)).astype(np.float32)
    d = sb((8, 4), nl.bfloat16)
    nisa.dma_compute(dst=d, srcs=[load(a), from_array(b)], reduce_op=nl.add)
    np.testing.assert_array_equal(val(d), (a + b).astype(BF16))
    pool = rng.standard_normal((6, 4)).astype(np.float32)
    hp = from_array(pool)
    it = load(np.array([[4], [1]], np.int32))
    upd = rng.standard_normal((2, 4)).astype(np.float32)
    view = hp.ap(pattern=[[4, 2], [1, 4]], vector_offset=it, indirect_dim=0)
    nisa.dma_compute(dst=view, srcs=[view, load(upd)], reduce_op=nl.add)
    want = pool.copy()
    want[[4, 1]] += upd
    np.testing.assert_array_equal(hp.read(), want)


@pytest.mark.nki_version("0.6.0")
def test_virtual_registers_load_move_store():
    src = load(np.array([[7]], np.int32))
    r = nisa.register_alloc()
    nisa.register_load(r, src)
    r2 = nisa.register_alloc(0)
    nisa.register_move(r2, r)
    out = sb((1, 1), nl.int32)
    nisa.register_store(out, r2)
    assert val(out)[0, 0] == 7
    assert [i.runtime_value("test") for i in nl.dynamic_range(r2)] == list(range(7))


def test_single_thread_gemm_helper_matches_and_restores(rng):
    from nki_ssm.sim.isa import _blas
    a = rng.standard_normal((64, 128))
    b = rng.standard_normal((128, 32))
    np.testing.assert_array_equal(_blas.matmul_f64(a, b), a @ b)
    if _blas._set_local:   # bundled OpenBLAS: the per-thread setting is restored after the call
        before = _blas._set_local(3)
        _blas.matmul_f64(a, b)
        assert _blas._set_local(before) == 3


# ---------------------------------------------------------------- SDK simulator bug-fix regressions (RN 0.4-0.6)

def test_oob_skip_gather_keeps_integer_bits():
    data = np.array([[2 ** 31 - 1, -7], [123456789, 5]], np.int32)
    g = sb((2, 2), nl.int32)
    nisa.memset(dst=g, value=-(2 ** 31))
    it = load(np.array([[1], [9]], np.int32))
    nisa.dma_copy(dst=g, src=from_array(data).ap(pattern=[[2, 2], [1, 2]], vector_offset=it, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    np.testing.assert_array_equal(val(g), [[123456789, 5], [-(2 ** 31), -(2 ** 31)]])


def test_activation_reduce_res_aliasing_dst(rng):
    x = rng.standard_normal((4, 1)).astype(np.float32)
    t = load(x)
    nisa.activation(dst=t, op=nl.exp, data=t, reduce_op=nl.add, reduce_res=t,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    np.testing.assert_allclose(val(t), np.exp(x), rtol=1e-6)


def test_iota_and_affine_select_take_register_offset():
    r = nisa.register_alloc(10)
    d = sb((2, 3), nl.int32)
    nisa.iota(dst=d, pattern=[[1, 3]], offset=r, channel_multiplier=5)
    np.testing.assert_array_equal(val(d), [[10, 11, 12], [15, 16, 17]])
    m = sb((2, 3))
    ones = sb((2, 3))
    nisa.memset(dst=ones, value=1.0)
    nisa.register_move(r, -1)
    nisa.affine_select(dst=m, pattern=[[1, 3]], channel_multiplier=0, on_true_tile=ones,
                       on_false_value=0.0, cmp_op=nl.greater_equal, offset=r)
    np.testing.assert_array_equal(val(m), [[0, 1, 1], [0, 1, 1]])


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=4), nred=st.integers(1, 3),
       keep=st.booleans(), seed=st.integers(0, 2 ** 16), op=st.sampled_from(["add", "maximum", "minimum"]))
def test_tensor_reduce_trailing_axes_property(shape, nred, keep, seed, op):
    shape = [min(shape[0] * 16, 128)] + shape[1:]
    nred = min(nred, len(shape) - 1)
    axes = tuple(range(len(shape) - nred, len(shape)))
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    want = getattr(np, op).reduce(x, axis=axes, keepdims=keep)
    out_shape = want.shape if want.ndim >= 2 else (shape[0], 1)
    d = sb(out_shape)
    nisa.tensor_reduce(dst=d, op=getattr(nl, op), data=load(x), axis=axes, keepdims=keep)
    np.testing.assert_allclose(val(d).reshape(want.shape), want, rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(src=st.sampled_from(["float32", "bfloat16", "float16", "int8", "int32", "float8_e4m3"]),
       dst=st.sampled_from(["float32", "bfloat16", "float16", "int8", "int32", "uint8", "float8_e5m2"]),
       seed=st.integers(0, 2 ** 16))
def test_dma_cast_goes_through_fp32_property(src, dst, seed):
    from nki_ssm.sim.dtypes import cast
    r = np.random.default_rng(seed)
    x = cast((r.standard_normal((8, 16)) * 100).astype(np.float32), getattr(nl, src))
    t = sb((8, 16), getattr(nl, dst))
    nisa.dma_copy(dst=t, src=from_array(x))
    want = x if src == dst else cast(x.astype(np.float32), getattr(nl, dst))
    assert np.array_equal(val(t), want, equal_nan=True)


# ---------------------------------------------------------------- random numbers

def test_rng_uniform_bits_and_seed_determinism():
    seed = load(np.array([[1234]], np.uint32))
    a, b = sb((128, 256), nl.uint32), sb((128, 256), nl.uint32)
    nisa.set_rng_seed(src_seeds=seed)
    nisa.rng(dst=a)
    nisa.set_rng_seed(src_seeds=seed)
    nisa.rng(dst=b)
    assert np.array_equal(val(a), val(b))
    u = val(a).astype(np.float64) / 2 ** 32
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.std() - 12 ** -0.5) < 0.01
    assert len(np.unique(val(a)[:, 0])) == 128          # lanes are decorrelated
    nisa.rng(dst=b)
    assert not np.array_equal(val(a), val(b))            # the stream advances
    small = sb((4, 8), nl.uint8)
    nisa.rng(dst=small, engine=nisa.engine.gpsimd)
    assert val(small).dtype == np.uint8


def test_rand_state_roundtrip_and_dropout():
    st = sb((16, 6), nl.uint32)
    nisa.rand_get_state(dst=st)
    x1, x2 = sb((16, 32), nl.uint32), sb((16, 32), nl.uint32)
    nisa.rng(dst=x1, engine=nisa.engine.gpsimd)
    nisa.rand_set_state(src_seeds=st)
    nisa.rng(dst=x2, engine=nisa.engine.gpsimd)
    assert np.array_equal(val(x1), val(x2))
    data = load(np.ones((128, 200), np.float32))
    d = sb((128, 200))
    nisa.dropout(dst=d, data=data, prob=0.25)
    assert abs((val(d) == 0).mean() - 0.25) < 0.02 and set(np.unique(val(d))) <= {0.0, 1.0}
    nisa.dropout(dst=d, data=data, prob=1.0)
    assert (val(d) == 0).all()
    nisa.dropout(dst=d, data=data, prob=0.0)
    assert (val(d) == 1).all()


def test_rand2_range_on_trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    d = sb((64, 128))
    nisa.rand2(dst=d, min=-2.0, max=3.0)
    v = val(d)
    assert v.min() >= -2.0 and v.max() <= 3.0 and abs(v.mean() - 0.5) < 0.05


def test_sequence_bounds_documented_example():
    seg = load(np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], np.int32))
    d = sb((1, 2, 9), nl.int32)
    nisa.sequence_bounds(dst=d, segment_ids=seg)
    np.testing.assert_array_equal(val(d)[0], [[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]])


def test_nonzero_with_count_documented_example():
    x = np.zeros((32, 8), np.float32)
    x[0] = [0, 1, 1, 0, 0, 1, 0, 0]
    x[16] = [2, 0, 0, 0, 0, 0, 0, 3]
    x[5] = 1.0                                   # not a core's first partition: ignored
    d = sb((32, 9), nl.int32)
    nisa.memset(dst=d, value=7)
    nisa.nonzero_with_count(dst=d, src=load(x), index_offset=16, padding_val=-1)
    np.testing.assert_array_equal(val(d)[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])
    np.testing.assert_array_equal(val(d)[16], [16, 23, -1, -1, -1, -1, -1, -1, 2])
    assert (val(d)[5] == 7).all()


def test_local_gather_per_core_groups(rng):
    src = rng.standard_normal((32, 64)).astype(np.float32)
    idx = rng.integers(0, 16, (32, 2)).astype(np.uint16) * 4
    d = sb((32, 8 * 4))
    nisa.local_gather(dst=d, src_buffer=load(src), index=load(idx), num_elem_per_idx=4, num_valid_indices=8)
    for g in range(2):
        flat = idx[16 * g:16 * g + 16].reshape(-1, order="F")[:8].astype(np.int64)
        pos = (flat[:, None] + np.arange(4)).reshape(-1)
        np.testing.assert_array_equal(val(d)[16 * g:16 * g + 16], src[16 * g:16 * g + 16][:, pos])


def test_sin_arctan_nan_outside_valid_range():
    x = load(np.array([[0.5, -3.0, 9.0, 1.6]], np.float32))
    d = sb((1, 4))
    nisa.activation(dst=d, op=nl.sin, data=x)
    np.testing.assert_allclose(val(d)[0, :2], np.sin([0.5, -3.0]), rtol=1e-6)
    assert np.isnan(val(d)[0, 2])
    nisa.activation(dst=d, op=nl.arctan, data=x)
    assert np.isnan(val(d)[0, 3]) and not np.isnan(val(d)[0, 0])


@settings(max_examples=15, deadline=None)
@given(P=st.integers(1, 16), F=st.integers(1, 30), seed=st.integers(0, 2 ** 16),
       op1=st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum"]))
def test_tensor_scalar_cumulative_matches_sequential_loop(P, F, seed, op1):
    r = np.random.default_rng(seed)
    x = r.uniform(0.5, 1.5, (P, F)).astype(np.float32)
    init = r.uniform(0.5, 1.5, (P, 1)).astype(np.float32)
    d = sb((P, F))
    nisa.tensor_scalar_cumulative(dst=d, src=load(x), op0=nl.multiply, op1=getattr(nl, op1), imm0=1.25,
                                  imm1=load(init), reduce_cmd=nisa.reduce_cmd.load_reduce)
    f = getattr(np, op1)
    reg = init[:, 0].copy()
    want = np.empty_like(x)
    for i in range(F):
        reg = f(x[:, i] * np.float32(1.25), reg).astype(np.float32)   # reg = op1(op0(src, imm0), reg)
        want[:, i] = reg
    np.testing.assert_array_equal(val(d), want)


@settings(max_examples=15, deadline=None)
@given(windows=st.lists(st.tuples(st.integers(0, 24), st.integers(1, 8), st.sampled_from([None, False])),
                        min_size=1, max_size=5), seed=st.integers(0, 2 ** 16))
def test_matmul_first_write_rule_per_element_property(windows, seed):
    """accumulate=None adds only where an earlier matmul wrote; False overwrites its window."""
    r = np.random.default_rng(seed)
    p = ps((4, 32))
    want = np.full((4, 32), np.nan, np.float32)
    written = np.zeros(32, bool)
    for start, width, acc in windows:
        width = min(width, 32 - start)
        s = r.standard_normal((3, 4)).astype(np.float32)
        m = r.standard_normal((3, width)).astype(np.float32)
        nisa.nc_matmul(dst=p[:, start:start + width], stationary=load(s), moving=load(m), accumulate=acc)
        prod = (s.astype(np.float64).T @ m).astype(np.float32)
        cols = slice(start, start + width)
        add = written[cols] if acc is None else np.zeros(width, bool)
        want[:, cols] = np.where(add, want[:, cols] + prod, prod)
        written[cols] = True
    np.testing.assert_array_equal(val(p), want)


def test_nc_version_is_ordered(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    v = nisa.get_nc_version()
    assert v == nisa.nc_version.gen3 and v >= nisa.nc_version.gen3 and v < nisa.nc_version.gen4
    assert v >= 3 and not v > 3 and nisa.nc_version.gen2 <= v
    with pytest.raises(TypeError):
        v < "gen4"


def test_matmul_tfloat32_operands_keep_10_mantissa_bits():
    one_plus = np.float32(1 + 2 ** -12)            # needs 12 mantissa bits: rounds to 1.0 in tf32
    s = sb((1, 1), nl.tfloat32)
    m = sb((1, 1), nl.tfloat32)
    nisa.memset(dst=s, value=float(one_plus))
    nisa.memset(dst=m, value=3.0)
    p = ps((1, 1))
    nisa.nc_matmul(dst=p, stationary=s, moving=m)
    assert val(p)[0, 0] == 3.0
    f = sb((1, 1))
    nisa.memset(dst=f, value=float(one_plus))
    g = sb((1, 1))
    nisa.memset(dst=g, value=3.0)
    nisa.nc_matmul(dst=p, stationary=f, moving=g, accumulate=False)   # float32: exact
    assert val(p)[0, 0] == np.float32(3 * (1 + 2 ** -12))


def test_matmul_rate_flag_float32_vs_tfloat32_views():
    """The trace's ``fp32`` (quarter-rate) flag: set when an operand is float32, not for
    tfloat32 views of float32 tiles (TF32 streams at the BF16 rate, nki_spec §8.1)."""
    from nki_ssm.perf import costs
    from nki_ssm.perf.hardware import TRN2
    from nki_ssm.sim.trace import record
    a, b = sb((128, 128)), sb((128, 128))
    nisa.memset(dst=a, value=1.0)
    nisa.memset(dst=b, value=2.0)
    p = ps((128, 128))
    with record(target="trn2") as tr:
        nisa.nc_matmul(dst=p, stationary=a, moving=b, accumulate=False)
        nisa.nc_matmul(dst=p, stationary=a.view(nl.tfloat32), moving=b.view(nl.tfloat32),
                       accumulate=False)
        nisa.nc_matmul(dst=p, stationary=a.view(nl.tfloat32), moving=b, accumulate=False)
    f32, tf32, mixed = tr.instructions
    assert f32.attrs["fp32"] and mixed.attrs["fp32"] and not tf32.attrs["fp32"]
    assert costs.tensor_cycles(tf32, TRN2) == 128
    assert costs.tensor_cycles(f32, TRN2) == 4 * 128 + 128
    assert val(p)[0, 0] == 128 * 2.0
