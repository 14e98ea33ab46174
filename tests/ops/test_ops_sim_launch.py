"""Host API -> real kernel launcher -> simulator, at tiny shapes.

Checks the glue, not the kernel's numerics in depth (the kernel tests do
that): the default backend picks the launcher, the output has the input
dtype and matches the reference to the float32 target, named pool slots
are updated in place and unnamed slots stay bit-identical.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from ops_case_inputs import OPS, base, pool_name

from nki_ssm.ops import _dispatch
from nki_ssm.reference.metrics import rel_fro
from nki_ssm.reference.testing import named_slots, unnamed_slots


# DESIGN.md, Numerics: float32 I/O <= 1e-5; bfloat16 I/O <= 3e-3 (relative Frobenius).
DTYPES = [(np.float32, 1e-5), (ml_dtypes.bfloat16, 3e-3)]


@pytest.mark.parametrize("dtype,target", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_sim_backend_through_launcher(op, dtype, target, monkeypatch):
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    kw = base(op, dtype=dtype, pool_dtype=dtype)
    kw_ref = base(op, dtype=dtype, pool_dtype=dtype)
    if op == "ssd_prefill":
        # float32 I/O meets the 1e-5 target with fp32 matmul operands; the default
        # precision="bf16" feeds TensorE bf16 operands (~3e-3 here, by design).
        kw["precision"] = "fp32"
    pool_arg = pool_name(kw)
    pool, before = kw[pool_arg], kw[pool_arg].copy()
    assert _dispatch.resolve(None) == "sim"

    y = OPS[op](**kw)  # default backend: the kernel on the simulator
    y_ref = OPS[op](**kw_ref, backend="reference")

    assert y.dtype == np.dtype(dtype) and y.shape == y_ref.shape
    assert rel_fro(y.astype(np.float64), y_ref.astype(np.float64)) <= target
    assert kw[pool_arg] is pool and pool.dtype == np.dtype(dtype)
    named = named_slots(kw["state_indices"])
    unnamed = unnamed_slots(kw["state_indices"], pool.shape[0])
    assert pool[unnamed].tobytes() == before[unnamed].tobytes()
    assert rel_fro(pool[named].astype(np.float64),
                   kw_ref[pool_arg][named].astype(np.float64)) <= target
