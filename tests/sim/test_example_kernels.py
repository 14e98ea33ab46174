"""Example kernels in plain NKI style, run through ``simulate`` and checked against NumPy.

Written as a user would write them for the Neuron SDK: destination-first
keyword nisa calls, nl.ndarray allocations, Python range loops, outputs in
nl.shared_hbm and returned.
"""
from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.errors import NkiCapacityError

nki = importlib.import_module("nki_ssm.sim.jit")   # provides nki.jit / nki.simulate

BF16 = ml_dtypes.bfloat16


# ---------------------------------------------------------------- tiled bf16 matmul

@nki.jit
def matmul_kernel(lhsT, rhs):
    """result[M, N] = lhsT[K, M].T @ rhs[K, N], K tiled by 128 and accumulated in PSUM."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = 128, 128, 512
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in range(M // TM):
        for n in range(N // TN):
            res_psum = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in range(K // TK):
                lhs_sb = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_sb = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhs_sb, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                nisa.dma_copy(dst=rhs_sb, src=rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=res_psum, stationary=lhs_sb, moving=rhs_sb, accumulate=(k > 0))
            res_sb = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=res_sb)
    return result


def test_tiled_bf16_matmul_512(rng):
    a = rng.standard_normal((512, 512)).astype(np.float32).astype(BF16)
    b = rng.standard_normal((512, 512)).astype(np.float32).astype(BF16)
    out = nki.simulate(matmul_kernel)(a, b)
    ref = a.astype(np.float64).T @ b.astype(np.float64)
    assert out.dtype == np.float32 and out.shape == (512, 512)
    # four fp32 roundings (one per K tile) on |values| ~ 22: a few ulp
    np.testing.assert_allclose(out, ref, rtol=0, atol=4 * np.spacing(np.float32(np.abs(ref).max())))


# ---------------------------------------------------------------- row softmax

@nki.jit
def softmax_kernel(x):
    R, C = x.shape
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r in range(R // 128):
        t = nl.ndarray((128, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r * 128:(r + 1) * 128, :])
        neg_max = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=t, axis=1, negate=True)
        e = nl.ndarray((128, C), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=t, bias=neg_max, reduce_op=nl.add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        inv = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=s)
        y = nl.ndarray((128, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[r * 128:(r + 1) * 128, :], src=y)
    return out


def test_row_softmax(rng):
    x = (rng.standard_normal((256, 300)) * 4).astype(np.float32)
    y = nki.simulate(softmax_kernel)(x)
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-9)


# ---------------------------------------------------------------- chained cumsum

@nki.jit
def cumsum_kernel(x):
    P, L = x.shape
    F = 256
    out = nl.ndarray((P, L), dtype=nl.float32, buffer=nl.shared_hbm)
    ones = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    carry = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=carry, value=0.0)
    for i in range(L // F):
        t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[:, i * F:(i + 1) * F])
        h = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=h, data0=ones, data1=t, initial=carry, op0=nl.multiply, op1=nl.add)
        nisa.tensor_copy(dst=carry, src=h[:, F - 1:F])
        nisa.dma_copy(dst=out[:, i * F:(i + 1) * F], src=h)
    return out


def test_cumsum_chained_across_tiles(rng):
    x = rng.standard_normal((128, 1024)).astype(np.float32)
    y = nki.simulate(cumsum_kernel)(x)
    # sequential float32 accumulation is exactly what the scan does
    np.testing.assert_array_equal(y, np.add.accumulate(x, axis=1, dtype=np.float32))
    np.testing.assert_allclose(y, np.cumsum(x.astype(np.float64), axis=1), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- causal mask

@nki.jit
def causal_mask_kernel(scores, q0, k0):
    P, F = scores.shape
    out = nl.ndarray((P, F), dtype=scores.dtype, buffer=nl.shared_hbm)
    s = nl.ndarray((P, F), dtype=scores.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=scores)
    m = nl.ndarray((P, F), dtype=scores.dtype, buffer=nl.sbuf)
    # keep q >= k with q = q0 + p (partitions) and k = k0 + f (free)
    nisa.affine_select(dst=m, pattern=[[-1, F]], channel_multiplier=1, on_true_tile=s,
                       on_false_value=-30000.0, cmp_op=nl.greater_equal, offset=q0 - k0)
    nisa.dma_copy(dst=out, src=m)
    return out


@pytest.mark.parametrize("q0,k0", [(0, 0), (128, 0), (0, 64)])
def test_causal_mask_affine_select(rng, q0, k0):
    x = rng.standard_normal((128, 192)).astype(np.float32).astype(BF16)
    y = nki.simulate(causal_mask_kernel)(x, q0, k0)
    q = q0 + np.arange(128)[:, None]
    k = k0 + np.arange(192)[None, :]
    np.testing.assert_array_equal(y, np.where(q >= k, x, BF16(-30000.0)))


# ---------------------------------------------------------------- gather rows

@nki.jit
def gather_kernel(table, indices):
    P = indices.shape[0]
    F = table.shape[1]
    out = nl.ndarray((P, F), dtype=table.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    rows = nl.ndarray((P, F), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=rows, src=table.ap(pattern=[[F, P], [1, F]], vector_offset=idx, indirect_dim=0))
    nisa.dma_copy(dst=out, src=rows)
    return out


def test_gather_rows_by_indices(rng):
    table = rng.standard_normal((1000, 64)).astype(np.float32)
    idx = rng.integers(0, 1000, size=(128, 1)).astype(np.int32)
    y = nki.simulate(gather_kernel)(table, idx)
    np.testing.assert_array_equal(y, table[idx[:, 0]])


# ---------------------------------------------------------------- over capacity

@nki.jit
def too_big_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    keep = []
    for i in range(16):   # 16 live tiles of 16 KiB per partition = 256 KiB > trn2 SBUF
        t = nl.ndarray((128, 4096), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        keep.append(t)
    for t in keep:        # read again at the end: all 16 are live at once
        nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def fits_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in range(16):   # each tile is used by one instruction: one live at a time
        t = nl.ndarray((128, 4096), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_kernel_over_sbuf_capacity_is_rejected():
    x = np.ones((128, 4096), np.float32)
    with pytest.raises(NkiCapacityError, match="SBUF"):
        nki.simulate(too_big_kernel)(x)
    np.testing.assert_array_equal(nki.simulate(fits_kernel)(x), x)
