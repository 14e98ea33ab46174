"""Tensor model: dtype casts, NkiTensor indexing rules (nki_spec §3.6), views, .ap, regions."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nki_ssm.sim import dtypes as dt
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.tensor import MemoryRegion, NkiTensor, allocate, from_array
from nki_ssm.sim.language import ds


def sbuf(shape, dtype=dt.float32):
    return allocate(shape, dtype, MemoryRegion.sbuf)


def hbm(shape, dtype=dt.float32):
    return allocate(shape, dtype, MemoryRegion.shared_hbm)


def filled(shape, buffer=MemoryRegion.sbuf):
    t = allocate(shape, dt.float32, buffer)
    t.write(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))
    return t


# ------------------------------------------------------------------ dtypes

def test_dtype_objects_compare_as_strings_and_numpy():
    assert dt.bfloat16 == "bfloat16" and dt.float32 == "float32"
    assert dt.bfloat16.np == np.dtype(ml_dtypes.bfloat16)
    assert dt.as_dtype(np.float16) is dt.float16
    assert dt.as_dtype("int32") is dt.int32
    assert dt.tfloat32.np == np.float32 and dt.as_dtype(np.float32) is dt.float32
    assert dt.float8_e4m3.np == np.dtype(ml_dtypes.float8_e4m3)


@pytest.mark.nki_version("0.6.0")
@pytest.mark.parametrize("bad", ["float64", np.float64, np.int64, object, 3])
def test_as_dtype_rejects_non_nki_types(bad):
    with pytest.raises(TypeError, match="dtype"):
        dt.as_dtype(bad)


def test_bf16_cast_rounds_to_nearest_even():
    one = np.float32(1.0)
    ulp = np.float32(2.0 ** -7)  # bf16 spacing at 1.0
    x = np.array([one + ulp / 2, one + 3 * ulp / 2, one + ulp / 2 + 2.0 ** -20], np.float32)
    y = dt.cast(x, dt.bfloat16).astype(np.float32)
    # ties go to the even mantissa; above the tie rounds up
    np.testing.assert_array_equal(y, [1.0, one + 2 * ulp, one + ulp])


@pytest.mark.parametrize("dtype,fmax", [(dt.float8_e4m3, 240.0), (dt.float8_e4m3fn, 448.0),
                                        (dt.float8_e5m2, 57344.0)])
def test_fp8_cast_saturates_to_format_max(dtype, fmax):
    x = np.array([1e6, -1e6, np.inf, fmax * 1.05, 1.0, np.nan], np.float32)
    y = dt.cast(x, dtype).astype(np.float32)
    np.testing.assert_array_equal(y[:5], [fmax, -fmax, fmax, fmax, 1.0])
    assert np.isnan(y[5])


def test_fp8_e4m3_precision_three_mantissa_bits():
    y = dt.cast(np.array([1.0625, 1.1875], np.float32), dt.float8_e4m3).astype(np.float32)
    np.testing.assert_array_equal(y, [1.0, 1.25])  # 1+1/16 ties to even 1.0; 1+3/16 -> 1.25


def test_float_to_int_rounds_half_even_and_saturates():
    x = np.array([2.5, 3.5, -2.5, -0.5, 1e10, -1e10, np.nan, 126.6], np.float32)
    np.testing.assert_array_equal(dt.cast(x, dt.int8), [2, 4, -2, 0, 127, -128, 0, 127])
    np.testing.assert_array_equal(dt.cast(np.array([-3.0, 70000.0]), dt.uint16), [0, 65535])
    np.testing.assert_array_equal(dt.cast(np.array([2**40], np.int64), dt.int32), [2**31 - 1])


def test_bool_cast_is_nonzero():
    np.testing.assert_array_equal(dt.cast(np.array([0.0, 2.0, -1.0]), dt.bool_), [0, 1, 1])


# ------------------------------------------------------------------ allocation

def test_sentinel_nan_for_floats_and_4_for_ints():
    assert np.isnan(sbuf((4, 8)).read()).all()
    assert np.isnan(sbuf((4, 8), dt.bfloat16).read().astype(np.float32)).all()
    assert (sbuf((4, 8), dt.int32).read() == 4).all()
    assert (hbm((3,), dt.uint8).read() == 4).all()


def test_fresh_tensor_strides_and_attributes():
    t = sbuf((128, 64))
    assert t.strides == (64, 1) and t.offset == 0 and t.ndim == 2 and t.size == 128 * 64
    assert t.buffer == "sbuf" and t.buffer == MemoryRegion.sbuf
    assert t.num_partitions == 128 and t.elements_per_partition == 64 and t.partition_start == 0
    h = hbm((4, 128, 32))
    assert h.buffer == "hbm" and h.buffer == MemoryRegion.shared_hbm
    assert h.buffer != MemoryRegion.private_hbm and MemoryRegion.shared_hbm == h.buffer


@pytest.mark.parametrize("shape", [(129, 4), (256, 2)])
def test_partition_dim_over_128_rejected(shape):
    with pytest.raises(NkiValidationError, match="<= 128"):
        sbuf(shape)


def test_on_chip_needs_two_dims():
    with pytest.raises(NkiValidationError, match="at least 2 dims"):
        sbuf((128,))


@pytest.mark.parametrize("shape", [(0, 4), (4, -1)])
def test_non_positive_dims_rejected(shape):
    with pytest.raises(NkiValidationError, match="positive"):
        sbuf(shape)


def test_shape_must_be_ints():
    with pytest.raises(TypeError, match="shape"):
        sbuf((4, 2.5))


def test_write_read_roundtrip_with_cast():
    t = sbuf((2, 3), dt.bfloat16)
    t.write(np.array([[1.00390625, 2, 3], [4, 5, 6]], np.float32))
    r = t.read()
    assert r.dtype == np.dtype(ml_dtypes.bfloat16)
    assert float(r[0, 0]) == 1.0  # RNE to bf16


# ------------------------------------------------------------------ indexing rules (§3.6)

def test_on_chip_integer_on_free_dims_keeps_2d():
    t = sbuf((64, 64, 64))
    assert t[:, 0, 10].shape == (64, 1)
    assert t[0, 0, 10].shape == (1, 1)
    assert t[3].shape == (1, 64, 64)          # partition int keeps size 1
    assert t[:, 5].shape == (64, 64)          # free int drops the dim


def test_language_guide_indexing_examples():
    t = sbuf((64, 64, 64))
    assert t[0, 0, 10].shape == (1, 1)
    assert t[0:64, 0, 0:64].shape == (64, 64) and t[:, 0, :].shape == (64, 64)
    assert t[:, :, ::2].shape == (64, 64, 32)
    assert t[...].shape == (64, 64, 64) and t[:, ...].shape == (64, 64, 64)
    u = t[0, ...]
    assert u.shape == (1, 64, 64) and t[0, ..., :].shape == (1, 64, 64)
    assert u[:, 0:32, :].shape == (1, 32, 64)
    w = sbuf((128, 4, 16))[0:64, :, :].permute((0, 2, 1))[:, 0, :]
    assert w.shape == (64, 4) and w.strides == (64, 16)
    g = sbuf((128, 1024), dt.float16)
    pattern = g.get_pattern()
    pattern[0][1] = 64
    assert g.ap(pattern=pattern).shape == (64, 1024)
    assert g.ap(pattern=[(1024, 128), (2, 512)]).shape == (128, 512)


def test_on_chip_ap_at_most_four_free_dims():
    t = sbuf((4, 2, 2, 2, 2, 2))
    assert t.ap([[32, 4], [16, 2], [8, 2], [4, 2], [1, 4]]).shape == (4, 2, 2, 2, 4)
    with pytest.raises(NkiValidationError, match="at most 4 free dims"):
        t.ap([[32, 4], [16, 2], [8, 2], [4, 2], [2, 2], [1, 2]])


def test_hbm_integer_drops_dim():
    h = hbm((4, 128, 32))
    assert h[0].shape == (128, 32)
    assert h[1, 2].shape == (32,)
    assert h[1, 2, 3].shape == (1,)


def test_slices_steps_negative_ellipsis_ds():
    t = filled((8, 16))
    np.testing.assert_array_equal(t[:, 1:9:2].read(), t.read()[:, 1:9:2])
    np.testing.assert_array_equal(t[-2:, -3].read(), t.read()[-2:, -3][:, None])
    np.testing.assert_array_equal(t[..., 0].read(), t.read()[:, 0:1])
    np.testing.assert_array_equal(t[ds(2, 3), ds(4, 5)].read(), t.read()[2:5, 4:9])


def test_nested_slicing_composes():
    t = filled((16, 64))
    u = t[4:12, 8:40]
    v = u[2:6, 0:32:4]
    np.testing.assert_array_equal(v.read(), t.read()[4:12, 8:40][2:6, 0:32:4])
    assert v.partition_start == 6


def test_hbm_index_values_match_numpy():
    h = filled((4, 6, 5), MemoryRegion.shared_hbm)
    ref = h.read()
    np.testing.assert_array_equal(h[2].read(), ref[2])
    np.testing.assert_array_equal(h[1:3, ::2, -1].read(), ref[1:3, ::2, -1])


def test_index_out_of_range_rejected():
    t = sbuf((8, 16))
    with pytest.raises(NkiValidationError, match="out of range"):
        t[8]
    with pytest.raises(NkiValidationError, match="out of range"):
        t[:, -17]


def test_slice_past_end_rejected_not_clamped():
    with pytest.raises(NkiValidationError, match="out of range"):
        sbuf((8, 16))[:, 8:20]


def test_partition_step_rejected():
    with pytest.raises(NkiValidationError, match="partition dim cannot be strided"):
        sbuf((8, 16))[0:8:2, :]


def test_zero_or_negative_step_rejected():
    with pytest.raises(NkiValidationError, match="step"):
        sbuf((8, 16))[:, ::-1]


def test_too_many_indices_rejected():
    with pytest.raises(NkiValidationError, match="too many indices"):
        sbuf((8, 16))[0, 0, 0]


def test_float_index_rejected():
    with pytest.raises(TypeError, match="index"):
        sbuf((8, 16))[:, 1.5]


def test_item_assignment_rejected():
    t = sbuf((8, 16))
    with pytest.raises(TypeError, match="nisa"):
        t[0] = 1.0


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_hbm_slicing_matches_numpy_property(data):
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    h = filled(shape, MemoryRegion.shared_hbm)
    key = []
    for n in shape:
        a = data.draw(st.integers(0, n - 1))
        b = data.draw(st.integers(a + 1, n))
        step = data.draw(st.integers(1, 3))
        key.append(slice(a, b, step))
    key = tuple(key)
    np.testing.assert_array_equal(h[key].read(), h.read()[key])
    r = h[key].region()
    el = h[key].elements()
    assert r.byte_start == el.min() * 4 and r.byte_stop == (el.max() + 1) * 4


# ------------------------------------------------------------------ views

def test_reshape_contiguous_and_rejects_incompatible():
    t = filled((8, 24))
    np.testing.assert_array_equal(t.reshape((8, 4, 6)).read(), t.read().reshape(8, 4, 6))
    with pytest.raises(NkiValidationError, match="element count"):
        t.reshape((8, 25))
    with pytest.raises(NkiValidationError, match="partition dim"):
        t.reshape((4, 48))
    with pytest.raises(NkiValidationError, match="not contiguous"):
        t[:, 0:24:2].permute((0, 1)).reshape_dim(1, (3, 4)).permute((0, 2, 1)).reshape((8, 12))
    # NumPy could re-stride this slice without a copy, but NKI's reshape
    # rejects any non-contiguous view (API docs; compiler front end)
    with pytest.raises(NkiValidationError, match="not contiguous"):
        t[:, 0:24:2].reshape((8, 3, 4))
    with pytest.raises(NkiValidationError, match="not contiguous"):
        t.reshape((8, 12, 2))[:, :, 0:1].reshape((8, 12))
    # a contiguous slice of the free dim still reshapes
    np.testing.assert_array_equal(t[:, 0:12].reshape((8, 3, 4)).read(),
                                  t.read()[:, 0:12].reshape(8, 3, 4))


def test_hbm_reshape_of_a_strided_slice_is_rejected():
    h = filled((4, 6), MemoryRegion.shared_hbm)
    with pytest.raises(NkiValidationError, match="not contiguous"):
        h[:, 0:3].reshape((12,))
    np.testing.assert_array_equal(h[1:3].reshape((12,)).read(), h.read()[1:3].reshape(12))


def test_hbm_reshape_any_leading_dim():
    h = filled((4, 6), MemoryRegion.shared_hbm)
    np.testing.assert_array_equal(h.reshape((2, 12)).read(), h.read().reshape(2, 12))


def test_view_dtype_scales_last_dim():
    t = sbuf((128, 64))
    assert t.view(dt.uint8).shape == (128, 256)
    assert t.view(dt.int32).shape == (128, 64)
    assert sbuf((128, 256), dt.uint8).view(dt.float32).shape == (128, 64)
    x = sbuf((2, 4))
    x.write(np.array([[1.0, -2.0, 0.5, 3.0]] * 2, np.float32))
    np.testing.assert_array_equal(x.view(dt.int32).read(), x.read().view(np.int32))


def test_view_dtype_rejects_non_contiguous_last_dim():
    with pytest.raises(NkiValidationError, match="contiguous"):
        sbuf((4, 8))[:, ::2].view(dt.uint8)
    with pytest.raises(NkiValidationError, match="divisible"):
        sbuf((4, 6), dt.uint8).view(dt.float32)


def test_view_methods_match_numpy():
    t = filled((4, 2, 3, 4))
    ref = t.read()
    np.testing.assert_array_equal(t.slice(2, 1, 3).read(), ref[:, :, 1:3])
    np.testing.assert_array_equal(t.select(1, 1).read(), ref[:, 1])
    np.testing.assert_array_equal(t.permute((0, 3, 1, 2)).read(), ref.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(t.flatten_dims(1, 2).read(), ref.reshape(4, 6, 4))
    np.testing.assert_array_equal(t.flatten_dims(1, 2).reshape_dim(1, (2, -1)).read(), ref)
    e = t.select(1, 0).expand_dim(1)
    assert e.shape == (4, 1, 3, 4)
    np.testing.assert_array_equal(e.broadcast(1, 5).read(), np.broadcast_to(ref[:, :1], (4, 5, 3, 4)))
    np.testing.assert_array_equal(e.squeeze_dim(1).read(), ref[:, 0])


def test_view_method_constraints():
    t = sbuf((4, 8))
    with pytest.raises(NkiValidationError, match="dims\\[0\\] must be 0"):
        sbuf((4, 2, 3)).permute((1, 0, 2))
    with pytest.raises(NkiValidationError, match="size 1"):
        t.broadcast(1, 4)
    with pytest.raises(NkiValidationError, match="partition"):
        sbuf((1, 8)).broadcast(0, 4)
    with pytest.raises(NkiValidationError, match="partition"):
        t.expand_dim(0)
    with pytest.raises(NkiValidationError, match="not contiguous"):
        sbuf((4, 6, 8))[:, :, 0:4].flatten_dims(1, 2)
    with pytest.raises(NkiValidationError, match="start_dim"):
        sbuf((4, 6, 8)).flatten_dims(0, 1)
    with pytest.raises(NkiValidationError, match="0 <= start < end"):
        t.slice(1, 4, 4)
    with pytest.raises(NkiValidationError, match="-1"):
        t.reshape_dim(1, (-1, -1))


def test_is_contiguous_and_pattern():
    t = sbuf((4, 8))
    assert t.is_contiguous() and t.is_contiguous_free()
    assert not t[:, ::2].is_contiguous()
    assert t[1:3, 2:6].get_pattern() == [[8, 2], [1, 4]]
    assert t[1:3, 2:6].is_contiguous_free()  # one free dim, stride 1


# ------------------------------------------------------------------ .ap

def test_ap_example_from_aps_doc_on_hbm():
    t = filled((1, 256), MemoryRegion.shared_hbm)
    v = t.ap(pattern=[[16, 16], [1, 8]], offset=8)
    w, z = np.meshgrid(np.arange(16), np.arange(8), indexing="ij")
    np.testing.assert_array_equal(v.read(), (8 + 16 * w + z).astype(np.float32))


def test_ap_replaces_the_views_pattern_and_adds_to_its_offset():
    t = filled((1, 64), MemoryRegion.shared_hbm)
    # offset=None inherits the view's offset; the view's strides are ignored
    np.testing.assert_array_equal(t[:, 10:20].ap(pattern=[[1, 4]]).read(), [10, 11, 12, 13])
    np.testing.assert_array_equal(t[:, 0:64:2].ap(pattern=[[1, 3]]).read(), [0, 1, 2])
    # an int offset is added to the view's offset (NkiTensor.ap docstring; released kernels)
    np.testing.assert_array_equal(t[:, 10:20].ap(pattern=[[1, 3]], offset=5).read(), [15, 16, 17])


def test_ap_is_not_composable():
    t = filled((128, 256))
    inner = t.ap(pattern=[[256, 128], [2, 128]])
    outer = inner.ap(pattern=[[256, 128], [1, 64]])
    np.testing.assert_array_equal(outer.read(), t.read()[:, 0:64])


def test_slice_equals_hand_written_ap():
    t = sbuf((128, 64))
    u = t.slice(dim=1, start=8, end=24)
    v = t.ap(pattern=[[64, 128], [1, 16]], offset=8)
    assert u.get_pattern() == v.get_pattern() == [[64, 128], [1, 16]]
    assert u.offset == v.offset == 8


def test_ap_hbm_sliding_window_im2col():
    x = filled((1, 32), MemoryRegion.shared_hbm)
    v = x.ap(pattern=[[1, 4], [1, 6]], offset=3)   # row k = x[3+k : 3+k+6]
    ref = np.stack([np.arange(3 + k, 9 + k) for k in range(4)]).astype(np.float32)
    np.testing.assert_array_equal(v.read(), ref)


def test_ap_on_chip_partition_step_must_equal_free_size():
    t = filled((8, 32))
    np.testing.assert_array_equal(t.ap([[32, 8], [2, 16]]).read(), t.read()[:, ::2])
    with pytest.raises(NkiValidationError, match="free size 32"):
        t.ap([[16, 8], [1, 16]])
    with pytest.raises(NkiValidationError, match="partition pair"):
        t.ap([[1, 32]])


def test_ap_out_of_storage_rejected():
    with pytest.raises(NkiValidationError, match="outside"):
        filled((1, 16), MemoryRegion.shared_hbm).ap([[4, 5], [1, 4]])
    with pytest.raises(NkiValidationError, match="partition row"):
        filled((4, 16)).ap([[16, 4], [1, 17]])


def test_ap_dtype_reinterpret_counts_in_new_elements():
    t = allocate((2, 4), dt.float32, MemoryRegion.sbuf)
    t.write(np.arange(8, dtype=np.float32).reshape(2, 4))
    v = t.ap([[8, 2], [1, 8]], dtype=dt.bfloat16)
    assert v.shape == (2, 8)
    np.testing.assert_array_equal(v.read().view(np.uint16), t.read().view(np.uint16))


def test_ap_vector_offset_gathers_rows():
    src = filled((5, 6), MemoryRegion.shared_hbm)
    idx = allocate((4, 1), dt.int32, MemoryRegion.sbuf)
    idx.write(np.array([[3], [0], [4], [3]]))
    g = src.ap([[6, 4], [1, 6]], vector_offset=idx)
    assert g.is_indirect()
    np.testing.assert_array_equal(g.read(), src.read()[[3, 0, 4, 3]])
    g.write(np.zeros((4, 6)))
    assert (src.read()[[0, 3, 4]] == 0).all() and (src.read()[1] != 0).all()
    r = g.region()
    assert (r.byte_start, r.byte_stop) == (0, 5 * 6 * 4)


def test_ap_vector_offset_out_of_bounds():
    src = filled((5, 6), MemoryRegion.shared_hbm)
    idx = allocate((2, 1), dt.int32, MemoryRegion.sbuf)
    idx.write(np.array([[1], [7]]))
    g = src.ap([[6, 2], [1, 6]], vector_offset=idx)
    with pytest.raises(NkiValidationError, match="out of bounds"):
        g.read()
    np.testing.assert_array_equal(g.indirection.valid(), [True, False])
    assert g.elements(clamp_oob=True)[1, 0] == 0


def test_ap_vector_offset_checks():
    src = hbm((5, 6))
    with pytest.raises(NkiValidationError, match="integer dtype"):
        src.ap([[6, 2], [1, 6]], vector_offset=sbuf((2, 1)))
    with pytest.raises(NkiValidationError, match="rows"):
        src.ap([[6, 3], [1, 6]], vector_offset=sbuf((2, 1), dt.int32))
    with pytest.raises(NkiValidationError, match="HBM"):
        sbuf((4, 6)).ap([[6, 2], [1, 6]], vector_offset=sbuf((2, 1), dt.int32))
    with pytest.raises(NkiValidationError, match="not both"):
        src.ap([[6, 2], [1, 6]], vector_offset=sbuf((2, 1), dt.int32),
               scalar_offset=sbuf((1, 1), dt.int32))


def test_ap_scalar_offset_and_dynamic_select():
    src = filled((4, 3, 5), MemoryRegion.shared_hbm)
    s = allocate((1, 1), dt.int32, MemoryRegion.sbuf)
    s.write(np.array([[2]]))
    v = src.ap([[5, 3], [1, 5]], scalar_offset=s, indirect_dim=0)
    np.testing.assert_array_equal(v.read(), src.read()[2])
    s.write(np.array([[1]]))  # read at access time
    np.testing.assert_array_equal(v.read(), src.read()[1])
    np.testing.assert_array_equal(src.select(0, s).read(), src.read()[1])
    with pytest.raises(NkiValidationError, match="not supported"):
        v[0]


def test_ap_scalar_offset_doc_example_window_must_fit():
    a = filled((512, 512), MemoryRegion.shared_hbm)
    idx = allocate((1, 1), dt.int32, MemoryRegion.sbuf)
    idx.write(np.array([[3 * 128]]))
    v = a.ap(pattern=[[512, 128], [1, 256]], offset=0, scalar_offset=idx, indirect_dim=0)
    np.testing.assert_array_equal(v.read(), a.read()[384:512, 0:256])
    idx.write(np.array([[385]]))   # rows 385..512 would leave the tensor
    assert not v.indirection.valid()[0]
    with pytest.raises(NkiValidationError, match="out of bounds"):
        v.read()


def test_vector_select_doc_example():
    a = filled((128, 512), MemoryRegion.shared_hbm)
    offsets = allocate((64, 1), dt.int32, MemoryRegion.sbuf)
    offsets.write(2 * np.arange(64).reshape(64, 1))
    g = a.vector_select(0, offsets)
    assert g.shape == (64, 512) and g.is_indirect()
    np.testing.assert_array_equal(g.read(), a.read()[0:128:2])
    with pytest.raises(NkiValidationError, match="HBM"):
        sbuf((4, 8)).vector_select(0, offsets)


def test_region_of_on_chip_view():
    t = sbuf((128, 64))
    r = t[32:64, 8:24:2].region()
    assert (r.buffer, r.partition_start, r.num_partitions) == ("sbuf", 32, 32)
    assert (r.byte_start, r.byte_stop) == (8 * 4, 23 * 4)  # elements 8..22
    assert r.storage_id == t.storage.id
    from nki_ssm.sim.trace import Region
    assert r == Region("sbuf", t.storage.id, 32, 32, 32, 92) and hash(r) == hash(
        Region("sbuf", t.storage.id, 32, 32, 32, 92))


def test_region_of_hbm_view():
    r = hbm((4, 128, 32))[2, 0:10].region()
    assert (r.buffer, r.partition_start, r.num_partitions) == ("hbm", 0, 1)
    assert (r.byte_start, r.byte_stop) == (2 * 128 * 32 * 4, (2 * 128 * 32 + 10 * 32) * 4)


def test_from_array_copies_and_rejects_float64():
    a = np.ones((3, 4), np.float32)
    t = from_array(a)
    a[0, 0] = 7
    assert t.read()[0, 0] == 1
    with pytest.raises(TypeError, match="float64"):
        from_array(np.ones(3))


def test_constructor_binds_storage():
    t = sbuf((4, 8))
    u = NkiTensor((4, 8), dt.float32, t.storage)
    assert u.storage is t.storage and u.shape == (4, 8)
    with pytest.raises(NkiValidationError, match="does not cover"):
        NkiTensor((4, 4), dt.float32, t.storage)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_on_chip_indexing_rule_property(data):
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=2, max_size=4)))
    t = filled(shape)
    key, np_key, want = [], [], []
    dropped = []
    for d, n in enumerate(shape):
        if data.draw(st.booleans()):
            i = data.draw(st.integers(-n, n - 1))
            key.append(i)
            np_key.append(slice(i % n, i % n + 1))
            if d == 0:
                want.append(1)
            else:
                dropped.append(len(want))
        else:
            a = data.draw(st.integers(0, n - 1))
            b = data.draw(st.integers(a + 1, n))
            step = 1 if d == 0 else data.draw(st.integers(1, 2))
            key.append(slice(a, b, step))
            np_key.append(slice(a, b, step))
            want.append(len(range(a, b, step)))
    while len(want) < 2:              # the last integer-indexed dim comes back as size 1
        want.insert(dropped.pop(), 1)
    v = t[tuple(key)]
    assert v.shape == tuple(want)
    ref = t.read()[tuple(np_key)]
    np.testing.assert_array_equal(v.read(), ref.reshape(v.shape))
    r = v.region()
    assert r.partition_start == np_key[0].start and r.num_partitions == v.shape[0]


def test_rearrange_doc_example_and_errors():
    t = filled((128, 24))
    r = t.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4})
    assert r.shape == (128, 6, 4)
    np.testing.assert_array_equal(r.read(), t.read().reshape(128, 4, 6).transpose(0, 2, 1))
    m = filled((8, 2, 3)).rearrange(("p", "a", "b"), ("p", ("a", "b")))
    np.testing.assert_array_equal(m.read(), filled((8, 2, 3)).read().reshape(8, 6))
    with pytest.raises(NkiValidationError, match="exactly the names"):
        t.rearrange(("b", "f"), ("b", "g"))
    with pytest.raises(NkiValidationError, match="not contiguous"):
        t.rearrange(("b", ("h", "w")), ("b", ("w", "h")), {"h": 4})
