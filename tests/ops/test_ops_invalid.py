"""Invalid host-API calls: right error type, argument named, pools untouched."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from ops_case_inputs import OPS, assert_pools_unchanged, base, pool_snapshot

BF16 = ml_dtypes.bfloat16


def put(**changes):
    """Mutation that replaces keyword arguments."""
    return lambda kw: kw.update(changes)


def apply(name, fn):
    """Mutation that replaces one argument by fn(current value, kwargs)."""
    def mutate(kw):
        kw[name] = fn(kw[name], kw)
    return mutate


def readonly(a, _):
    a = a.copy()
    a.flags.writeable = False
    return a


def wider_conv(width):
    """weight [dim, width] with a matching pool, so only W itself is wrong."""
    def mutate(kw):
        dim = kw["weight"].shape[0]
        kw["weight"] = np.ones((dim, width), np.float32)
        kw["conv_states"] = np.zeros((kw["conv_states"].shape[0], dim, max(width - 1, 0)),
                                     np.float32)
    return mutate


def slots_of(kw):
    return next(kw[n].shape[0] for n in ("conv_states", "ssm_states") if n in kw)


# (op, mutation, error type, regex that must name the argument)
CASES = [
    # --- short conv prefill
    ("short_conv_prefill", apply("x", lambda a, _: a.tolist()), TypeError, r"^x must be a numpy\.ndarray"),
    ("short_conv_prefill", apply("x", lambda a, _: a.astype(np.float64)), TypeError, r"^x must have dtype .*float64"),
    ("short_conv_prefill", apply("x", lambda a, _: a[:, :, None]), ValueError, r"^x must have shape \[num_tokens, dim\]"),
    ("short_conv_prefill", wider_conv(1), ValueError, r"^W \(weight\.shape\[1\]\) must be in 2\.\.8, got 1"),
    ("short_conv_prefill", wider_conv(9), ValueError, r"^W \(weight\.shape\[1\]\) must be in 2\.\.8, got 9"),
    ("short_conv_prefill", apply("weight", lambda a, _: a[:-1]), ValueError, r"^weight must have shape \[dim, W\] = \[8, \*\], got \(7, 4\)"),
    ("short_conv_prefill", apply("bias", lambda a, _: a[:-1]), ValueError, r"^bias must have shape \[dim\]"),
    ("short_conv_prefill", put(activation="relu"), ValueError, r"^activation must be one of None, 'silu', got 'relu'"),
    ("short_conv_prefill", apply("conv_states", lambda a, _: np.zeros(a.shape[:2] + (4,), a.dtype)), ValueError, r"^conv_states must have shape \[slots, dim, W-1\]"),
    ("short_conv_prefill", apply("conv_states", lambda a, _: a.astype(np.int32)), TypeError, r"^conv_states must have dtype"),
    ("short_conv_prefill", apply("conv_states", readonly), ValueError, r"^conv_states must be writeable"),
    ("short_conv_prefill", apply("cu_seqlens", lambda a, _: a.astype(np.float32)), TypeError, r"^cu_seqlens must have an integer dtype"),
    ("short_conv_prefill", apply("cu_seqlens", lambda a, _: a[None]), ValueError, r"^cu_seqlens must be 1-D"),
    ("short_conv_prefill", apply("cu_seqlens", lambda a, _: a + 1), ValueError, r"^cu_seqlens\[0\] must be 0, got 1"),
    ("short_conv_prefill", put(cu_seqlens=np.array([0, 6, 5, 24], np.int32)), ValueError, r"^cu_seqlens must be non-decreasing, got cu_seqlens\[1\] = 6 > cu_seqlens\[2\] = 5"),
    ("short_conv_prefill", put(cu_seqlens=np.array([0, 5, 5, 23], np.int32)), ValueError, r"^cu_seqlens\[-1\] must equal num_tokens \(x\.shape\[0\]\) = 24, got 23"),
    ("short_conv_prefill", put(cu_seqlens=np.array([0], np.int32)), ValueError, r"^cu_seqlens must have num_seqs \+ 1 >= 2 entries"),
    ("short_conv_prefill", apply("state_indices", lambda a, _: a[:2]), ValueError, r"^state_indices must have length num_seqs = 3, got 2"),
    ("short_conv_prefill", apply("state_indices", lambda a, kw: np.array([0, slots_of(kw), -1])), ValueError, r"^state_indices\[1\] must be -1 or in \[0, slots\) = \[0, 6\)"),
    ("short_conv_prefill", put(state_indices=np.array([0, -2, 1])), ValueError, r"^state_indices\[1\] must be -1 or in \[0, slots\)"),
    ("short_conv_prefill", put(state_indices=np.array([2, -1, 2])), ValueError, r"^state_indices must not repeat a slot within a call, got slot 2 at positions \[0, 2\]"),
    ("short_conv_prefill", apply("has_initial_state", lambda a, _: a.astype(np.int32)), TypeError, r"^has_initial_state must have dtype bool"),
    ("short_conv_prefill", apply("has_initial_state", lambda a, _: a[:1]), ValueError, r"^has_initial_state must have shape \[num_seqs\] = \[3\]"),
    ("short_conv_prefill", put(backend="gpu"), ValueError, r"^backend must be one of None, 'reference', 'sim', 'neuron', got 'gpu'"),
    # --- short conv decode
    ("short_conv_decode", apply("x", lambda a, _: a[None]), ValueError, r"^x must have shape \[num_seqs, dim\] or \[num_seqs, T, dim\]"),
    ("short_conv_decode", apply("x", lambda a, _: a[:, :0]), ValueError, r"^x\.shape\[1\] \(T\) must be >= 1"),
    ("short_conv_decode", apply("conv_states", lambda a, _: a[:, :-1]), ValueError, r"^conv_states must have shape \[slots, dim, W-1\] = \[\*, 8, 3\]"),
    ("short_conv_decode", put(state_indices=np.array([1, 1, 0])), ValueError, r"^state_indices must not repeat"),
    # --- SSD prefill
    ("ssd_prefill", apply("B", lambda a, _: np.concatenate([a, a[:, :1]], 1)), ValueError, r"^H must be a multiple of G .*got H = 4, G = 3"),
    ("ssd_prefill", apply("C", lambda a, _: a[..., :-1]), ValueError, r"^C must have shape \[num_tokens, G, N\] = \[24, 2, 16\]"),
    ("ssd_prefill", apply("B", lambda a, _: a.astype(BF16)), TypeError, r"^B must have the same dtype as x \(float32\), got bfloat16"),
    ("ssd_prefill", apply("z", lambda a, _: a[:, :-1]), ValueError, r"^z must have shape \[num_tokens, H, P\]"),
    ("ssd_prefill", apply("dt", lambda a, _: a[:-1]), ValueError, r"^dt must have shape \[num_tokens, H\] = \[24, 4\]"),
    ("ssd_prefill", apply("A", lambda a, _: a[:, None]), ValueError, r"^A must have shape \[H\] = \[4\]"),
    ("ssd_prefill", put(D=np.ones((4, 3), np.float32)), ValueError, r"^D must have shape \[H\] = \[4\] or \[H, P\] = \[4, 8\]"),
    ("ssd_prefill", apply("dt_bias", lambda a, _: np.ones(5, np.float32)), ValueError, r"^dt_bias must have shape \[H\]"),
    ("ssd_prefill", put(dt_softplus=1), TypeError, r"^dt_softplus must be a bool"),
    ("ssd_prefill", put(dt_limit=(1.0, 0.5)), ValueError, r"^dt_limit must satisfy lo <= hi"),
    ("ssd_prefill", put(dt_limit=(0.0, float("nan"))), ValueError, r"^dt_limit must satisfy lo <= hi \(no NaN\)"),
    ("ssd_prefill", put(dt_limit=(0.0, 1.0, 2.0)), TypeError, r"^dt_limit must be a \(lo, hi\) pair"),
    ("ssd_prefill", put(chunk_size=100), ValueError, r"^chunk_size must be a multiple of 16 in 16\.\.128, got 100"),
    ("ssd_prefill", put(chunk_size=256), ValueError, r"^chunk_size must be a multiple of 16"),
    ("ssd_prefill", put(chunk_size=64.0), TypeError, r"^chunk_size must be an int"),
    ("ssd_prefill", put(precision="fp8"), ValueError, r"^precision must be one of 'bf16', 'fp32', got 'fp8'"),
    ("ssd_prefill", apply("ssm_states", lambda a, _: a[..., :-1]), ValueError, r"^ssm_states must have shape \[slots, H, P, N\] = \[\*, 4, 8, 16\]"),
    ("ssd_prefill", put(cu_seqlens=np.array([0, 5, 5, 25], np.int64)), ValueError, r"^cu_seqlens\[-1\] must equal num_tokens \(x\.shape\[0\]\) = 24, got 25"),
    # --- SSD decode
    ("ssd_decode", apply("x", lambda a, _: a[:, 0, 0]), ValueError, r"^x must have shape \[num_seqs, H, P\] or \[num_seqs, T, H, P\]"),
    ("ssd_decode", apply("dt", lambda a, _: a[:, :1]), ValueError, r"^dt must have shape \[num_seqs, T, H\] = \[3, 2, 4\]"),
    ("ssd_decode", apply("state_indices", lambda a, kw: np.array([slots_of(kw) + 5, 0, 1])), ValueError, r"^state_indices\[0\] must be -1 or in \[0, slots\)"),
    ("ssd_decode", apply("ssm_states", lambda a, _: a.astype(np.float16)), TypeError, r"^ssm_states must have dtype float32 or bfloat16, got float16"),
    # --- Gated DeltaNet prefill
    ("gated_delta_prefill", apply("v", lambda a, _: np.concatenate([a, a[:, :1]], 1)), ValueError, r"^HV must be a multiple of H .*got HV = 5, H = 2"),
    ("gated_delta_prefill", apply("k", lambda a, _: a[..., :-1]), ValueError, r"^k must have shape \[num_tokens, H, K\] = \[24, 2, 16\]"),
    ("gated_delta_prefill", apply("v", lambda a, _: a.astype(BF16)), TypeError, r"^v must have the same dtype as q"),
    ("gated_delta_prefill", put(a=np.zeros((24, 4), np.float32)), ValueError, r"^gates: pass either g and beta, or a, b, A_log and dt_bias, not both; got g, beta, a"),
    ("gated_delta_prefill", put(beta=None), ValueError, r"^beta is required when g is given"),
    ("gated_delta_prefill", put(g=None, beta=None), ValueError, r"^gates: .*got none"),
    ("gated_delta_prefill", put(g=None, beta=None, a=np.zeros((24, 4), np.float32), b=np.zeros((24, 4), np.float32), dt_bias=np.zeros(4, np.float32)), ValueError, r"^A_log is required"),
    ("gated_delta_prefill", apply("g", lambda a, _: a[:, :2]), ValueError, r"^g must have shape \[num_tokens, HV\] = \[24, 4\]"),
    ("gated_delta_prefill", put(scale=0.0), ValueError, r"^scale must be finite and > 0, got 0\.0"),
    ("gated_delta_prefill", put(scale=float("inf")), ValueError, r"^scale must be finite and > 0"),
    ("gated_delta_prefill", put(scale="0.25"), TypeError, r"^scale must be a real number"),
    ("gated_delta_prefill", put(chunk_size=8), ValueError, r"^chunk_size must be a multiple of 16 in 16\.\.128, got 8"),
    ("gated_delta_prefill", put(use_qk_l2norm="yes"), TypeError, r"^use_qk_l2norm must be a bool"),
    ("gated_delta_prefill", apply("ssm_states", lambda a, _: a.transpose(0, 1, 3, 2).copy()), ValueError, r"^ssm_states must have shape \[slots, HV, K, V\] = \[\*, 4, 16, 8\]"),
    ("gated_delta_prefill", apply("state_indices", lambda a, _: a.astype(np.float64)), TypeError, r"^state_indices must have an integer dtype"),
    # --- Gated DeltaNet decode
    ("gated_delta_decode", apply("q", lambda a, _: a[:, 0]), ValueError, r"^q must have shape \[num_seqs, T, H, K\]"),
    ("gated_delta_decode", put(return_intermediate_states=None), TypeError, r"^return_intermediate_states must be a bool"),
    ("gated_delta_decode", put(state_indices=np.array([0, 3, 3])), ValueError, r"^state_indices must not repeat a slot within a call, got slot 3"),
    ("gated_delta_decode", apply("beta", lambda a, _: a[:, :1]), ValueError, r"^beta must have shape \[num_seqs, T, HV\] = \[3, 2, 4\]"),
    ("gated_delta_decode", put(k=None), TypeError, r"^k must be a numpy\.ndarray, got NoneType"),
]


def _case_id(case):
    op, _, exc, regex = case
    return f"{op}-{exc.__name__}-{regex[1:40]}"


def test_at_least_25_distinct_invalid_calls_across_all_families():
    assert len({(c[0], c[3]) for c in CASES}) >= 25
    assert {c[0] for c in CASES} == set(OPS)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_invalid_call_raises_naming_argument_and_leaves_pools(case):
    op, mutate, exc, regex = case
    kw = base(op)
    OPS[op](**kw, backend="reference")  # the unmodified call is valid
    kw = base(op)
    mutate(kw)
    before = pool_snapshot(kw)
    with pytest.raises(exc, match=regex):
        OPS[op](**kw)
    assert_pools_unchanged(kw, before)


@pytest.mark.parametrize("op", sorted(OPS))
def test_failing_reference_backend_leaves_pools(op, monkeypatch):
    """An exception inside the backend (after validation) must not touch the pools."""
    import nki_ssm.ops._dispatch as dispatch

    real_run = dispatch.run

    def run_with_broken_reference(launcher, kwargs, *, pools, reference, backend):
        def broken(**kw):
            reference(**kw)  # compute the real update, then fail before returning
            raise RuntimeError("backend failed")
        return real_run(launcher, kwargs, pools=pools, reference=broken, backend=backend)

    monkeypatch.setattr(dispatch, "run", run_with_broken_reference)
    kw = base(op)
    before = pool_snapshot(kw)
    with pytest.raises(RuntimeError, match="backend failed"):
        OPS[op](**kw, backend="reference")
    assert_pools_unchanged(kw, before)
