"""Every hardware check of nki.isa has a violating call here that must raise.

Each case asserts the error type and that the message names the instruction
and the offending operand (and, where there is one, the limit).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.tensor import from_array


def sb(shape, dtype=nl.float32):
    t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
    return t


def ps(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.psum)


def hbm(shape, dtype=np.float32):
    return from_array(np.zeros(shape, dtype=dtype))


def fsb(shape, dtype=nl.float32):
    """An SBUF tile filled with ones."""
    t = sb(shape, dtype)
    nisa.memset(dst=t, value=1 if str(dtype).startswith(("int", "uint")) else 1.0)
    return t


def fps(shape):
    t = ps(shape)
    nisa.memset(dst=t, value=1.0)
    return t


def raises(fn, *words, exc=NkiValidationError):
    with pytest.raises(exc) as ei:
        fn()
    msg = str(ei.value)
    for w in words:
        assert w in msg, f"{w!r} not in error message: {msg}"
    return msg


@pytest.fixture
def trn1(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")


@pytest.fixture
def trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")


# A big SBUF storage used to make views that break partition rules.
def big(shape=(128, 64), dtype=nl.float32):
    return fsb(shape, dtype)


# ---------------------------------------------------------------- generic operand rules

def test_partition_dim_over_128_rejected():
    # on-chip tensors cannot even be allocated with > 128 partitions (sim.tensor);
    # a 256-row HBM tensor is rejected as a compute operand by the instruction
    with pytest.raises(NkiValidationError, match="128"):
        nl.ndarray((129, 4), dtype=nl.float32, buffer=nl.sbuf)
    raises(lambda: nisa.tensor_copy(dst=big(), src=hbm((256, 4))), "tensor_copy", "src", "SBUF or PSUM")


def test_hbm_operand_rejected_by_compute_instruction():
    raises(lambda: nisa.tensor_tensor(dst=fsb((4, 4)), data1=hbm((4, 4)), data2=fsb((4, 4)), op=nl.add),
           "tensor_tensor", "data1", "HBM")


def test_non_tensor_operand_is_type_error():
    raises(lambda: nisa.reciprocal(dst=fsb((4, 4)), data=np.ones((4, 4))), "reciprocal", "data",
           exc=TypeError)


def test_start_partition_rule_for_compute_ops():
    t = big()
    raises(lambda: nisa.tensor_copy(dst=t[16:48, :], src=t[64:96, :]), "tensor_copy", "dst",
           "starts at partition 16", "0/32/64/96")
    raises(lambda: nisa.tensor_copy(dst=t[32:96, :], src=t[0:64, :]), "tensor_copy", "dst", "0/64")
    raises(lambda: nisa.reciprocal(dst=t[0:100, :], data=t[28:128, :]), "reciprocal", "data", "starts")


def test_shape_mismatch_partitions():
    raises(lambda: nisa.tensor_tensor(dst=fsb((8, 4)), data1=fsb((8, 4)), data2=fsb((4, 8)), op=nl.add),
           "tensor_tensor", "data2", "partition")


def test_shape_mismatch_elements_per_partition():
    raises(lambda: nisa.tensor_tensor(dst=fsb((8, 5)), data1=fsb((8, 4)), data2=fsb((8, 4)), op=nl.add),
           "tensor_tensor", "dst", "elements per partition")


def test_raw_int_enum_rejected():
    raises(lambda: nisa.tensor_copy(dst=fsb((4, 4)), src=fsb((4, 4)), engine=5), "tensor_copy", "engine",
           "raw")


def test_unknown_op_rejected():
    raises(lambda: nisa.tensor_tensor(dst=fsb((4, 4)), data1=fsb((4, 4)), data2=fsb((4, 4)), op=nl.exp),
           "tensor_tensor", "op")


def test_two_input_vector_op_not_both_psum():
    raises(lambda: nisa.tensor_tensor(dst=fsb((4, 4)), data1=fps((4, 4)), data2=fps((4, 4)), op=nl.add),
           "tensor_tensor", "data1", "data2", "PSUM")


def test_scan_inputs_not_both_psum():
    raises(lambda: nisa.tensor_tensor_scan(dst=fsb((4, 4)), data0=fps((4, 4)), data1=fps((4, 4)),
                                           initial=0.0, op0=nl.multiply, op1=nl.add),
           "tensor_tensor_scan", "data0", "data1", "PSUM")


def test_scalar_tensor_tensor_not_both_psum():
    raises(lambda: nisa.scalar_tensor_tensor(dst=fsb((4, 4)), data=fps((4, 4)), op0=nl.multiply,
                                             operand0=1.0, op1=nl.add, operand1=fps((4, 4))),
           "scalar_tensor_tensor", "operand1", "PSUM")


def test_gpsimd_power_rejects_psum():
    raises(lambda: nisa.tensor_tensor(dst=fps((4, 4)), data1=fsb((4, 4)), data2=fsb((4, 4)), op=nl.power),
           "tensor_tensor", "GpSimd", "PSUM")


def test_gpsimd_tensor_copy_rejects_psum():
    raises(lambda: nisa.tensor_copy(dst=fsb((4, 4)), src=fps((4, 4)), engine=nisa.engine.gpsimd),
           "tensor_copy", "src", "SBUF")


def test_bitvec_op_needs_integer_dtypes():
    raises(lambda: nisa.tensor_tensor(dst=fsb((4, 4)), data1=fsb((4, 4)), data2=fsb((4, 4)),
                                      op=nl.bitwise_and), "tensor_tensor", "integer", "dst")


def test_abs_max_is_trn3_only():
    raises(lambda: nisa.tensor_tensor(dst=fsb((4, 4)), data1=fsb((4, 4)), data2=fsb((4, 4)), op=nl.abs_max),
           "tensor_tensor", "op", "abs_max", "trn3")


# ---------------------------------------------------------------- DMA

def test_dma_copy_never_psum():
    raises(lambda: nisa.dma_copy(dst=hbm((4, 4)), src=fps((4, 4))), "dma_copy", "src", "PSUM")
    raises(lambda: nisa.dma_copy(dst=ps((4, 4)), src=hbm((4, 4))), "dma_copy", "dst", "PSUM")


def test_dma_copy_element_count_mismatch():
    raises(lambda: nisa.dma_copy(dst=sb((4, 4)), src=hbm((4, 5))), "dma_copy", "src", "dst", "16")


def test_dma_copy_hwdge_requires_equal_dtypes():
    raises(lambda: nisa.dma_copy(dst=sb((4, 4), nl.bfloat16), src=hbm((4, 4)),
                                 dge_mode=nisa.dge_mode.hwdge), "dma_copy", "hwdge", "dtypes")


def test_dma_copy_hwdge_needs_trn2(trn1):
    raises(lambda: nisa.dma_copy(dst=sb((4, 4)), src=hbm((4, 4)), dge_mode=nisa.dge_mode.hwdge),
           "dma_copy", "hwdge", "trn1")


def test_dma_copy_engine_only_with_hwdge():
    raises(lambda: nisa.dma_copy(dst=sb((4, 4)), src=hbm((4, 4)), engine=nisa.engine.scalar),
           "dma_copy", "engine", "hwdge")


def test_dma_copy_priority_is_trn3_only():
    raises(lambda: nisa.dma_copy(dst=sb((4, 4)), src=hbm((4, 4)), priority=1), "dma_copy", "priority")


def test_dma_gather_oob_index_raises():
    h = hbm((5, 4))
    idx = sb((2, 1), nl.int32)
    nisa.memset(dst=idx, value=9)
    raises(lambda: nisa.dma_copy(dst=sb((2, 4)), src=h.ap(pattern=[[4, 2], [1, 4]], vector_offset=idx,
                                                          indirect_dim=0)),
           "dma_copy", "src", "vector_offset", "out of bounds")


def test_dma_gather_rejects_hwdge():
    h = hbm((5, 4))
    idx = sb((2, 1), nl.int32)
    nisa.memset(dst=idx, value=1)
    raises(lambda: nisa.dma_copy(dst=sb((2, 4)), src=h.ap(pattern=[[4, 2], [1, 4]], vector_offset=idx,
                                                          indirect_dim=0),
                                 dge_mode=nisa.dge_mode.hwdge), "dma_copy", "vector_offset", "hwdge")


def test_dma_transpose_dst_must_be_sbuf():
    raises(lambda: nisa.dma_transpose(dst=hbm((4, 8)), src=fsb((8, 4))), "dma_transpose", "dst", "SBUF")


def test_dma_transpose_dtype_must_match():
    raises(lambda: nisa.dma_transpose(dst=sb((4, 8), nl.bfloat16), src=fsb((8, 4))),
           "dma_transpose", "dtype")


def test_dma_transpose_dst_shape_must_be_transposed():
    raises(lambda: nisa.dma_transpose(dst=sb((8, 4)), src=fsb((8, 4))), "dma_transpose", "dst", "(4, 8)")


def test_dma_transpose_dst_32_byte_aligned():
    t = sb((16, 64), nl.bfloat16)
    # start 2 elements (4 bytes) into the partition
    raises(lambda: nisa.dma_transpose(dst=t[:, 2:18], src=fsb((16, 16), nl.bfloat16)),
           "dma_transpose", "dst", "32-byte")
    # rows of 12 bf16 = 24 bytes apart
    u = sb((16, 4, 12), nl.bfloat16)
    raises(lambda: nisa.dma_transpose(dst=u[:, :, 0:8], src=hbm((8, 4, 16), ml_dtypes.bfloat16)),
           "dma_transpose", "dst dim 1", "32-byte")
    nisa.dma_transpose(dst=t[:, 16:32], src=fsb((16, 16), nl.bfloat16))   # 32 bytes in: fine


def test_dma_transpose_hwdge_nki_050_shapes():
    # NKI 0.6.0 accepts src.shape[0] = 8 and a last dim < 128; the 0.5.0 compiler does not
    raises(lambda: nisa.dma_transpose(dst=sb((128, 1, 8), nl.bfloat16),
                                      src=hbm((8, 1, 128), ml_dtypes.bfloat16),
                                      dge_mode=nisa.dge_mode.hwdge), "hwdge", "src.shape[0] == 16")
    raises(lambda: nisa.dma_transpose(dst=sb((64, 16), nl.bfloat16),
                                      src=hbm((16, 64), ml_dtypes.bfloat16),
                                      dge_mode=nisa.dge_mode.hwdge), "hwdge", "src.shape[-1] == 128")
    nisa.dma_transpose(dst=sb((128, 16), nl.bfloat16), src=hbm((16, 128), ml_dtypes.bfloat16),
                       dge_mode=nisa.dge_mode.hwdge)


def test_dma_transpose_hwdge_two_byte_only():
    raises(lambda: nisa.dma_transpose(dst=sb((4, 16)), src=fsb((16, 4)), dge_mode=nisa.dge_mode.hwdge),
           "dma_transpose", "hwdge", "2-byte")


# ---------------------------------------------------------------- TensorE

def mm(dst, s, m, **kw):
    return lambda: nisa.nc_matmul(dst=dst, stationary=s, moving=m, **kw)


def test_matmul_operands_must_be_sbuf():
    raises(mm(ps((4, 8)), fps((2, 4)), fsb((2, 8))), "nc_matmul", "stationary", "SBUF")


def test_matmul_dst_must_be_psum():
    raises(mm(sb((4, 8)), fsb((2, 4)), fsb((2, 8))), "nc_matmul", "dst", "PSUM")


def test_matmul_k_mismatch():
    raises(mm(ps((4, 8)), fsb((2, 4)), fsb((3, 8))), "nc_matmul", "contraction", "2", "3")


def test_matmul_m_over_128():
    raises(mm(ps((4, 8)), fsb((2, 130)), fsb((2, 8))), "nc_matmul", "stationary", "M=130", "128")


def test_matmul_n_over_512_on_trn2():
    raises(mm(ps((4, 520)), fsb((2, 4)), fsb((2, 520))), "nc_matmul", "moving", "N=520", "512")


def test_matmul_n_over_4096_fp32_on_trn3(trn3):
    raises(mm(ps((4, 4100)), fsb((2, 4)), fsb((2, 4100))), "nc_matmul", "N=4100", "4096")


def test_matmul_k_over_row_tile():
    raises(mm(ps((4, 8)), fsb((64, 4)), fsb((64, 8)), tile_position=(0, 0), tile_size=(32, 128)),
           "nc_matmul", "K=64", "row tile")


def test_matmul_tile_position_needs_tile_size():
    raises(mm(ps((4, 8)), fsb((2, 4)), fsb((2, 8)), tile_position=(0, 0)), "nc_matmul", "tile_size")


def test_matmul_tile_position_multiple_of_size():
    raises(mm(ps((4, 8)), fsb((2, 4)), fsb((2, 8)), tile_position=(16, 0), tile_size=(32, 128)),
           "nc_matmul", "tile_position", "multiples")


def test_matmul_dst_fp32_on_trn2():
    raises(mm(ps((4, 8), nl.bfloat16), fsb((2, 4)), fsb((2, 8))), "nc_matmul", "dst", "float32", "trn2")


def test_matmul_dst_within_one_psum_bank():
    big_ps = ps((4, 1024))
    raises(mm(big_ps[:, 256:768], fsb((2, 4)), fsb((2, 512))), "nc_matmul", "dst", "bank", "2048")


def test_matmul_fp32_must_pair_with_fp32():
    raises(mm(ps((4, 8)), fsb((2, 4)), fsb((2, 8), nl.bfloat16)), "nc_matmul", "float32", "stationary",
           "moving")


def test_matmul_rejects_integer_operands():
    raises(mm(ps((4, 8)), fsb((2, 4), nl.int8), fsb((2, 8), nl.int8)), "nc_matmul", "stationary", "dtype")


def test_matmul_dst_shape():
    raises(mm(ps((4, 7)), fsb((2, 4)), fsb((2, 8))), "nc_matmul", "dst", "8 elements")


def test_matmul_double_row_fp8_only():
    raises(mm(ps((4, 8)), fsb((2, 2, 4), nl.bfloat16), fsb((2, 2, 8), nl.bfloat16),
              perf_mode=nisa.matmul_perf_mode.double_row), "nc_matmul", "double_row", "fp8")


def test_matmul_double_row_not_on_trn1(trn1):
    raises(mm(ps((4, 8)), fsb((2, 2, 4), nl.float8_e4m3), fsb((2, 2, 8), nl.float8_e4m3),
              perf_mode=nisa.matmul_perf_mode.double_row), "nc_matmul", "double_row", "trn1")


def test_matmul_accumulate_true_on_unwritten_psum():
    raises(mm(ps((4, 8)), fsb((2, 4)), fsb((2, 8)), accumulate=True), "nc_matmul", "accumulate=True")


def test_matmul_transpose_mode_needs_identity_moving():
    raises(mm(ps((4, 2)), fsb((2, 4)), fsb((2, 2)), is_transpose=True), "nc_matmul", "identity")


def test_nc_transpose_tensor_engine_limit():
    raises(lambda: nisa.nc_transpose(dst=ps((128, 100)), data=fsb((100, 130))), "nc_transpose",
           "[100, 130]", "128x128")


def test_nc_transpose_vector_engine_limit():
    raises(lambda: nisa.nc_transpose(dst=sb((40, 8)), data=fsb((8, 40)), engine=nisa.engine.vector),
           "nc_transpose", "32x32")


def test_nc_transpose_dtype_must_match():
    raises(lambda: nisa.nc_transpose(dst=ps((4, 8), nl.bfloat16), data=fsb((8, 4))),
           "nc_transpose", "dst", "dtype")


# ---------------------------------------------------------------- tensor_scalar family

def ts(**kw):
    base = dict(dst=fsb((4, 4)), data=fsb((4, 4)), op0=nl.multiply, operand0=2.0)
    base.update(kw)
    return lambda: nisa.tensor_scalar(**base)


def test_tensor_scalar_operand_tile_must_be_fp32():
    raises(ts(operand0=fsb((4, 1), nl.bfloat16)), "tensor_scalar", "operand0", "float32")


def test_tensor_scalar_operand_tile_shape():
    raises(ts(operand0=fsb((4, 2))), "tensor_scalar", "operand0", "(4, 1)")


def test_tensor_scalar_op1_operand1_pairing():
    raises(ts(operand1=1.0), "tensor_scalar", "op1", "operand1")


def test_tensor_scalar_mixed_op_kinds():
    raises(ts(dst=fsb((4, 4), nl.int32), data=fsb((4, 4), nl.int32), op0=nl.bitwise_and, operand0=3,
              op1=nl.add, operand1=1), "tensor_scalar", "op0", "op1", "bitvec")


def test_tensor_scalar_scalar_engine_combos_on_trn2():
    raises(ts(op0=nl.subtract, engine=nisa.engine.scalar), "tensor_scalar", "Scalar engine", "trn2")


def test_tensor_scalar_gpsimd_only_rsqrt():
    raises(ts(engine=nisa.engine.gpsimd), "tensor_scalar", "gpsimd", "rsqrt")


def test_tensor_scalar_unary_operand_must_be_none_or_zero():
    raises(ts(op0=nl.abs, operand0=2.0), "tensor_scalar", "operand0", "unary")


def test_square_as_tensor_scalar_op_is_trn3_only():
    raises(ts(op0=nl.square, operand0=None), "tensor_scalar", "op0", "square", "trn3")


def test_memset_float_into_int_tile_rejected():
    # an int into a float tile is accepted (tests/sim/test_frontend_fidelity.py)
    raises(lambda: nisa.memset(dst=sb((4, 4), nl.int32), value=2.0), "memset", "value", "int")


def test_memset_engine_rejected():
    raises(lambda: nisa.memset(dst=sb((4, 4)), value=1.0, engine=nisa.engine.scalar), "memset", "engine")


def test_tensor_copy_scalar_engine_not_on_trn1(trn1):
    raises(lambda: nisa.tensor_copy(dst=sb((4, 4)), src=fsb((4, 4)), engine=nisa.engine.scalar),
           "tensor_copy", "Scalar engine", "NeuronCore-v2")


# ---------------------------------------------------------------- ScalarE

def act(**kw):
    base = dict(dst=sb((4, 4)), op=nl.exp, data=fsb((4, 4)))
    base.update(kw)
    return lambda: nisa.activation(**base)


def test_activation_scalar_bias_needs_trn2(trn1):
    raises(act(bias=1.0), "activation", "bias", "NeuronCore-v3")


def test_activation_bias_free_size_one():
    raises(act(bias=fsb((4, 2))), "activation", "bias", "(4, 1)")


def test_activation_reduce_op_must_be_add():
    raises(act(reduce_op=nl.maximum, reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=sb((4, 1))),
           "activation", "reduce_op", "nl.add")


def test_activation_reduce_res_shape():
    raises(act(reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=sb((4, 2))),
           "activation", "reduce_res", "(4, 1)")


def test_activation_scale_tile_must_be_fp32():
    raises(act(scale=fsb((4, 1), nl.bfloat16)), "activation", "scale", "float32")


def test_activation_op_must_be_activation_function():
    raises(act(op=nl.add), "activation", "op")


# ---------------------------------------------------------------- reductions and scans

def test_tensor_reduce_axis_zero_rejected():
    raises(lambda: nisa.tensor_reduce(dst=sb((4, 1)), op=nl.add, data=fsb((4, 4)), axis=0),
           "tensor_reduce", "axis 0", "partition")


def test_tensor_reduce_axis_must_be_trailing():
    raises(lambda: nisa.tensor_reduce(dst=sb((4, 3)), op=nl.add, data=fsb((4, 2, 3)), axis=1),
           "tensor_reduce", "axis", "trailing")


def test_tensor_reduce_dst_size_consistent():
    raises(lambda: nisa.tensor_reduce(dst=sb((4, 2)), op=nl.add, data=fsb((4, 2, 3)), axis=(1, 2)),
           "tensor_reduce", "dst", "1 elements")


def test_tensor_scalar_cumulative_op1_restricted():
    raises(lambda: nisa.tensor_scalar_cumulative(dst=sb((4, 4)), src=fsb((4, 4)), op0=nl.multiply,
                                                 op1=nl.power, imm0=1.0),
           "tensor_scalar_cumulative", "op1")


def test_tensor_scalar_cumulative_no_int32():
    raises(lambda: nisa.tensor_scalar_cumulative(dst=sb((4, 4), nl.int32), src=fsb((4, 4)),
                                                 op0=nl.multiply, op1=nl.add, imm0=1.0),
           "tensor_scalar_cumulative", "dst", "int32")


def test_tensor_scalar_reduce_op_restricted():
    raises(lambda: nisa.tensor_scalar_reduce(dst=sb((4, 4)), data=fsb((4, 4)), op0=nl.multiply,
                                             operand0=1.0, reduce_op=nl.subtract),
           "tensor_scalar_reduce", "reduce_op")


def test_scan_initial_must_be_column():
    raises(lambda: nisa.tensor_tensor_scan(dst=sb((4, 4)), data0=fsb((4, 4)), data1=fsb((4, 4)),
                                           initial=fsb((4, 2)), op0=nl.multiply, op1=nl.add),
           "tensor_tensor_scan", "initial", "(4, 1)")


def test_bn_stats_free_size_limit():
    raises(lambda: nisa.bn_stats(dst=sb((4, 6)), data=fsb((4, 600))), "bn_stats", "data", "512")


def test_bn_aggr_multiple_of_three():
    raises(lambda: nisa.bn_aggr(dst=sb((4, 2)), data=fsb((4, 7))), "bn_aggr", "data", "multiple of 3")


# ---------------------------------------------------------------- GpSimd and selects

def test_iota_dst_must_be_sbuf():
    raises(lambda: nisa.iota(dst=ps((4, 4)), pattern=[[1, 4]]), "iota", "dst", "SBUF")


def test_iota_pattern_must_cover_dst():
    raises(lambda: nisa.iota(dst=sb((4, 4)), pattern=[[1, 5]]), "iota", "pattern", "5", "4")


def test_affine_select_on_true_must_be_sbuf():
    raises(lambda: nisa.affine_select(dst=sb((4, 4)), pattern=[[-1, 4]], channel_multiplier=1,
                                      on_true_tile=fps((4, 4)), on_false_value=0.0,
                                      cmp_op=nl.greater_equal), "affine_select", "on_true_tile", "SBUF")


def test_affine_select_on_false_must_be_float():
    raises(lambda: nisa.affine_select(dst=sb((4, 4)), pattern=[[-1, 4]], channel_multiplier=1,
                                      on_true_tile=fsb((4, 4)), on_false_value=fsb((4, 1)),
                                      cmp_op=nl.greater_equal), "affine_select", "on_false_value", "float32")


def rs(**kw):
    base = dict(dst=sb((4, 8)), on_true_tile=fsb((4, 8)), comp_op0=nl.greater_equal, comp_op1=nl.less,
                bound0=fsb((4, 1)), bound1=fsb((4, 1)))
    base.update(kw)
    return lambda: nisa.range_select(**base)


def test_range_select_needs_trn2(trn1):
    raises(rs(), "range_select", "NeuronCore-v3", "trn1")


def test_range_select_on_false_value_must_be_fp32_min():
    raises(rs(on_false_value=-1e30), "range_select", "on_false_value", "FP32_MIN")


def test_range_select_bounds_must_be_fp32():
    raises(rs(bound0=fsb((4, 1), nl.int32)), "range_select", "bound0", "float32")


def test_range_select_comparison_ops_only():
    raises(rs(comp_op0=nl.add), "range_select", "comp_op0")


def test_select_reduce_predicate_dtype():
    raises(lambda: nisa.select_reduce(dst=sb((4, 4)), predicate=fsb((4, 4)), on_true=fsb((4, 4)),
                                      on_false=0.0), "select_reduce", "predicate", "dtype")


def test_nc_stream_shuffle_mask_length():
    raises(lambda: nisa.nc_stream_shuffle(dst=sb((32, 4)), src=fsb((32, 4)), shuffle_mask=[0] * 16),
           "nc_stream_shuffle", "shuffle_mask", "32")


def test_nc_stream_shuffle_mask_values():
    raises(lambda: nisa.nc_stream_shuffle(dst=sb((32, 4)), src=fsb((32, 4)), shuffle_mask=[40] * 32),
           "nc_stream_shuffle", "shuffle_mask", "255")


def test_nc_stream_shuffle_start_partition():
    t = big()
    raises(lambda: nisa.nc_stream_shuffle(dst=t[64:128, :], src=t[16:48, :], shuffle_mask=[0] * 32),
           "nc_stream_shuffle", "src", "start partition 16")


def test_nc_stream_shuffle_dtype_must_match():
    raises(lambda: nisa.nc_stream_shuffle(dst=sb((32, 4), nl.bfloat16), src=fsb((32, 4)),
                                          shuffle_mask=[0] * 32), "nc_stream_shuffle", "dtype")


def test_tensor_partition_reduce_op():
    raises(lambda: nisa.tensor_partition_reduce(dst=sb((1, 4)), op=nl.subtract, data=fsb((4, 4))),
           "tensor_partition_reduce", "op")


def test_not_implemented_api_names_itself():
    with pytest.raises(NotImplementedError, match="topk"):
        nisa.topk(val_dst=sb((4, 8)), idx_dst=sb((4, 8)), src=fsb((4, 8)), n=8)


def test_fp8_e4m3_and_e4m3fn_cannot_mix(trn3):
    s = sb((2, 4), nl.float8_e4m3)
    m = sb((2, 8), nl.float8_e4m3fn)
    nisa.memset(dst=s, value=1.0)
    nisa.memset(dst=m, value=1.0)
    raises(mm(ps((4, 8)), s, m), "nc_matmul", "float8_e4m3", "mixed")
    assert ml_dtypes.finfo(ml_dtypes.float8_e4m3).max == 240


def test_exponential_is_trn3_only():
    raises(lambda: nisa.exponential(dst=sb((4, 4)), src=fsb((4, 4))), "exponential", "trn3", "trn2")


def test_activate2_op_combination(trn3):
    raises(lambda: nisa.activate2(dst=sb((4, 4)), op=nl.exp, data=fsb((4, 4)), imm0=1.0, imm1=1.0,
                                  op0=nl.add, op1=nl.add), "activate2", "op0", "op1")


def test_tensor_copy_predicated_predicate_dtype():
    raises(lambda: nisa.tensor_copy_predicated(dst=sb((4, 4)), src=fsb((4, 4)), predicate=fsb((4, 4))),
           "tensor_copy_predicated", "predicate", "uint8")


def test_max8_needs_eight_elements():
    raises(lambda: nisa.max8(dst=sb((4, 8)), src=fsb((4, 4))), "max8", "src", "8 to 16384")


def test_nc_n_gather_index_range():
    idx = sb((4, 2), nl.uint32)
    nisa.memset(dst=idx, value=9)
    raises(lambda: nisa.nc_n_gather(dst=sb((4, 2)), data=fsb((4, 4)), indices=idx), "nc_n_gather",
           "indices", "[0, 4)")


def test_bitvec_tensor_tensor_not_on_gpsimd():
    raises(lambda: nisa.tensor_tensor(dst=fsb((4, 4), nl.int32), data1=fsb((4, 4), nl.int32),
                                      data2=fsb((4, 4), nl.int32), op=nl.bitwise_or,
                                      engine=nisa.engine.gpsimd), "tensor_tensor", "bitvec", "Vector")


def test_dma_compute_reduce_op_and_scales():
    raises(lambda: nisa.dma_compute(dst=sb((4, 4)), srcs=[fsb((4, 4))], reduce_op=nl.multiply),
           "dma_compute", "reduce_op", "nl.add")
    raises(lambda: nisa.dma_compute(dst=sb((4, 4)), srcs=[fsb((4, 4))], reduce_op=nl.add, scales=[2.0]),
           "dma_compute", "scales", "1.0")


def test_register_read_before_write():
    raises(lambda: nisa.register_store(sb((1, 1), nl.int32), nisa.register_alloc()), "register_store",
           "before any value")


def test_register_load_needs_single_element():
    raises(lambda: nisa.register_load(nisa.register_alloc(), fsb((1, 2), nl.int32)), "register_load",
           "src", "one element")


def test_nc_find_index8_dst_dtype():
    raises(lambda: nisa.nc_find_index8(dst=sb((4, 8)), data=fsb((4, 16)), vals=fsb((4, 8))),
           "nc_find_index8", "dst", "uint32")


def test_rng_needs_integer_dst():
    raises(lambda: nisa.rng(dst=sb((4, 4))), "rng", "dst", "integer")


def test_rand2_is_trn3_only():
    raises(lambda: nisa.rand2(dst=sb((4, 4)), min=0.0, max=1.0), "rand2", "trn3")


def test_rand_set_state_word_count():
    raises(lambda: nisa.rand_set_state(src_seeds=fsb((4, 5), nl.uint32)), "rand_set_state", "src_seeds", "6")


def test_dropout_dtype_must_match():
    raises(lambda: nisa.dropout(dst=sb((4, 4), nl.bfloat16), data=fsb((4, 4)), prob=0.5), "dropout", "dst")


def test_local_gather_index_dtype():
    raises(lambda: nisa.local_gather(dst=sb((16, 4)), src_buffer=fsb((16, 8)), index=fsb((16, 1), nl.int32)),
           "local_gather", "index", "uint16")


def test_nonzero_with_count_dst_width():
    raises(lambda: nisa.nonzero_with_count(dst=sb((16, 8), nl.int32), src=fsb((16, 8))),
           "nonzero_with_count", "dst", "9 elements")


def test_at_most_four_free_dims():
    t = sb((4, 4, 4, 4, 4, 4))
    # every free dim stepped by 2: strides (512, 128, 32, 8, 2), none merges: 5 entries
    v = t[:, 0:4:2, 0:4:2, 0:4:2, 0:4:2, 0:4:2]
    raises(lambda: nisa.memset(dst=v, value=0.0), "memset", "dst", "free-dim", "at most 4")
    nisa.memset(dst=t, value=0.0)                                  # dense: one entry
    nisa.memset(dst=t[:, 0:4:2, 0:4:2, 0:4:2, 0:4:2, 0], value=0.0)  # 4 entries
