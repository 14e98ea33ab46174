"""Gated DeltaNet decode kernel on the simulator, through the host API, against float64.

Targets (DESIGN.md, Numerics): float32 I/O <= 1e-5 relative Frobenius per
output, final state and intermediate states; bfloat16 I/O <= 3e-3. Every
case also checks that slots no sequence names stay bit-identical and that
padding sequences give zero output (and zero intermediate states).
"""
from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

pytest.importorskip("nki_ssm.backend")

from nki_ssm import ops  # noqa: E402
from nki_ssm.reference.gated_delta import gated_delta_decode, gated_delta_recurrent  # noqa: E402
from nki_ssm.reference.inputs import (make_gated_delta_decode_inputs,  # noqa: E402
                                      make_gated_delta_inputs)
from nki_ssm.reference.metrics import rel_fro  # noqa: E402

BF16 = ml_dtypes.bfloat16
F32_TOL, BF16_TOL = 1e-5, 3e-3
_HYP = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _copy(inp):
    return {n: (x.copy() if isinstance(x, np.ndarray) else x) for n, x in inp.items()}


def _f64(x):
    return np.asarray(x).astype(np.float64)


def _run_and_check(inp, tol, inter=False):
    """Kernel (backend="sim") vs float64 reference; returns the kernel's outputs."""
    ref_in = _copy(inp)
    before = inp["ssm_states"].copy()
    out = ops.gated_delta_decode(**inp, return_intermediate_states=inter, backend="sim")
    ref = gated_delta_decode(**ref_in, return_intermediate_states=inter)
    o = out[0] if inter else out
    idx = inp["state_indices"]
    named = idx[idx >= 0]
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    pool = inp["ssm_states"]
    assert o.dtype == inp["q"].dtype and o.shape == ref[0].shape
    assert rel_fro(_f64(o), ref[0]) <= tol
    if named.size:
        assert rel_fro(_f64(pool[named]), ref[1][named]) <= tol
    assert pool[unnamed].tobytes() == before[unnamed].tobytes()
    pad = idx < 0
    assert not np.any(_f64(o[pad]))
    if inter:
        it = out[1]
        assert it.dtype == pool.dtype and it.shape == ref[2].shape
        assert rel_fro(_f64(it), ref[2]) <= tol
        assert not np.any(_f64(it[pad]))
        # the last intermediate state is the final state
        assert it[~pad, -1].tobytes() == pool[idx[~pad]].tobytes()
    return out


@st.composite
def _decode_case(draw, dtype=np.float32):
    H = draw(st.sampled_from([1, 2]))
    HV = H * draw(st.sampled_from([1, 2])) if H == 2 else draw(st.sampled_from([2, 4]))
    K = draw(st.sampled_from([16, 32, 64]))
    V = draw(st.sampled_from([16, 32, 64]))
    T = draw(st.sampled_from([1, 1, 2, 3]))
    num_seqs = draw(st.integers(1, 3))
    padding = draw(st.integers(0, min(1, num_seqs - 1)))
    raw = draw(st.booleans())
    l2 = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    inp = make_gated_delta_decode_inputs(
        np.random.default_rng(seed), num_seqs=num_seqs, T=T, H=H, HV=HV, K=K, V=V,
        raw_gates=raw, use_qk_l2norm=l2, dtype=dtype, pool_dtype=dtype, padding=padding)
    return inp, draw(st.booleans())


# the lnc fixture sets NEURON_LOGICAL_NC_CONFIG once per test, for every example
@settings(_HYP, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
@given(case=_decode_case())
def test_decode_f32_matches_reference(case, lnc):
    inp, inter = case
    _run_and_check(inp, F32_TOL, inter=inter)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=_decode_case(dtype=BF16))
def test_decode_bf16_matches_reference(case, lnc):
    inp, inter = case
    _run_and_check(inp, BF16_TOL, inter=inter)


def test_decode_explicit_scale_and_mixed_pool_dtype(lnc):
    """bf16 pool with float32 activations: state rounded once on store; scale honoured."""
    inp = make_gated_delta_decode_inputs(np.random.default_rng(3), num_seqs=2, T=2, H=1, HV=2,
                                         K=32, V=16, pool_dtype=BF16)
    inp["scale"] = 0.37
    _run_and_check(inp, BF16_TOL, inter=True)


def test_decode_multi_token_equals_single_steps(lnc):
    """T tokens in one call == T calls of one token (same float32 operation order)."""
    rng = np.random.default_rng(11)
    inp = make_gated_delta_decode_inputs(rng, num_seqs=2, T=3, H=2, HV=4, K=16, V=32,
                                         raw_gates=True, use_qk_l2norm=True)
    step = _copy(inp)
    o_all = ops.gated_delta_decode(**inp, backend="sim")
    outs = []
    for t in range(3):
        kw = {n: (x[:, t:t + 1] if n in ("q", "k", "v", "a", "b") else x)
              for n, x in step.items()}
        outs.append(ops.gated_delta_decode(**kw, backend="sim"))
    assert np.concatenate(outs, axis=1).tobytes() == o_all.tobytes()
    assert step["ssm_states"].tobytes() == inp["ssm_states"].tobytes()


def test_decode_continues_a_prefill(lnc):
    """Prefill (reference) then one kernel decode step == the recurrence over L+1 tokens."""
    rng = np.random.default_rng(5)
    H, HV, K, V, L = 1, 2, 32, 32, 7
    full = make_gated_delta_inputs(rng, seqlens=[L + 1], H=H, HV=HV, K=K, V=V, slots=2,
                                   has_initial_state=True)
    ref_o, ref_pool = gated_delta_recurrent(**_copy(full))
    pre = {n: (x[:L] if n in ("q", "k", "v", "g", "beta") else x) for n, x in _copy(full).items()}
    pre["cu_seqlens"] = np.array([0, L], dtype=np.int32)
    ops.gated_delta_prefill(**pre, backend="reference")
    dec = dict(q=full["q"][L:][None], k=full["k"][L:][None], v=full["v"][L:][None],
               g=full["g"][L:][None], beta=full["beta"][L:][None], ssm_states=pre["ssm_states"],
               state_indices=full["state_indices"])
    o = ops.gated_delta_decode(**dec, backend="sim")
    slot = int(full["state_indices"][0])
    assert rel_fro(_f64(o[0]), ref_o[L:]) <= F32_TOL
    assert rel_fro(_f64(pre["ssm_states"][slot]), ref_pool[slot]) <= F32_TOL


def test_decode_huge_gates_do_not_overflow(lnc):
    """Strong decay (g ~ -500) and beta ~ 1: the state collapses onto the new token, no NaN."""
    rng = np.random.default_rng(9)
    inp = make_gated_delta_decode_inputs(rng, num_seqs=2, T=2, H=1, HV=2, K=16, V=16)
    inp["g"] = np.full_like(inp["g"], -500.0)
    inp["beta"] = np.ones_like(inp["beta"])
    out = _run_and_check(inp, F32_TOL)
    assert np.all(np.isfinite(out))


def test_decode_all_padding_touches_nothing(lnc):
    inp = make_gated_delta_decode_inputs(np.random.default_rng(2), num_seqs=2, T=2, H=1, HV=2,
                                         K=16, V=16)
    inp["state_indices"] = np.array([-1, -1], dtype=np.int32)
    before = inp["ssm_states"].copy()
    o, inter = ops.gated_delta_decode(**inp, return_intermediate_states=True, backend="sim")
    assert not np.any(o) and not np.any(inter)
    assert inp["ssm_states"].tobytes() == before.tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [(np.float32, F32_TOL), (BF16, BF16_TOL)])
def test_decode_qwen3_next_tp8_shape(dtype, tol, lnc):
    """Qwen3-Next Gated DeltaNet at TP8 (H=2, HV=4, K=V=128), two speculative tokens."""
    inp = make_gated_delta_decode_inputs(np.random.default_rng(1), num_seqs=3, T=2, H=2, HV=4,
                                         K=128, V=128, raw_gates=True, use_qk_l2norm=True,
                                         dtype=dtype, pool_dtype=dtype, padding=1)
    _run_and_check(inp, tol, inter=True)


@pytest.mark.parametrize("inter", [False, True])
def test_decode_many_sequences_across_io_groups(inter, lnc):
    """More sequences than one I/O group (16) with padding spread over both groups:
    interleaved pairs, odd leftovers and group boundaries all match the reference."""
    rng = np.random.default_rng(21)
    inp = make_gated_delta_decode_inputs(rng, num_seqs=19, T=2, H=1, HV=2, K=16, V=16,
                                         raw_gates=True, use_qk_l2norm=True, padding=4)
    assert np.sum(inp["state_indices"] < 0) == 4
    _run_and_check(inp, F32_TOL, inter=inter)


@pytest.mark.slow
def test_decode_qwen3_next_full_shape_speculative(lnc):
    """Full Qwen3-Next layer (H=16, HV=32, K=V=128), 3 sequences x 4 tokens, bf16 pool and
    I/O with intermediate states: fits SBUF/PSUM on trn2 and meets the bf16 target."""
    inp = make_gated_delta_decode_inputs(np.random.default_rng(4), num_seqs=3, T=4, H=16,
                                         HV=32, K=128, V=128, raw_gates=True,
                                         use_qk_l2norm=True, dtype=BF16, pool_dtype=BF16,
                                         padding=1)
    _run_and_check(inp, BF16_TOL, inter=True)


# ----------------------------------------------------------------------------- prefill

def _prefill_check(inp, tol, chunk_size):
    """Chunked kernel vs the float64 token-by-token reference; returns the output."""
    ref_in = _copy(inp)
    before = inp["ssm_states"].copy()
    o = ops.gated_delta_prefill(**inp, chunk_size=chunk_size, backend="sim")
    ref_o, ref_pool = gated_delta_recurrent(**ref_in)
    idx = inp["state_indices"]
    named = idx[idx >= 0]
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    pool = inp["ssm_states"]
    assert o.dtype == inp["q"].dtype and o.shape == ref_o.shape
    assert rel_fro(_f64(o), ref_o) <= tol
    if named.size:
        assert rel_fro(_f64(pool[named]), ref_pool[named]) <= tol
    assert pool[unnamed].tobytes() == before[unnamed].tobytes()
    cu = inp["cu_seqlens"]
    for n in np.flatnonzero(idx < 0):
        assert not np.any(_f64(o[cu[n]:cu[n + 1]]))
    return o


@st.composite
def _prefill_case(draw, dtype=np.float32):
    H = draw(st.sampled_from([1, 2]))
    HV = H * draw(st.sampled_from([1, 2]))
    K = draw(st.sampled_from([16, 32, 64]))
    V = draw(st.sampled_from([16, 32, 64]))
    lens = draw(st.lists(st.integers(0, 80), min_size=1, max_size=3))
    padding = draw(st.integers(0, len(lens) - 1))
    chunk = draw(st.sampled_from([16, 32, 64, 128]))
    seed = draw(st.integers(0, 2**31 - 1))
    inp = make_gated_delta_inputs(np.random.default_rng(seed), seqlens=lens, H=H, HV=HV, K=K,
                                  V=V, raw_gates=draw(st.booleans()),
                                  use_qk_l2norm=draw(st.booleans()), dtype=dtype,
                                  pool_dtype=dtype, padding=padding)
    return inp, chunk, draw(st.sampled_from([1, 2]))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_prefill_case())
def test_prefill_f32_matches_recurrent_reference(case):
    inp, chunk, lnc = case
    with _at_lnc(lnc):
        _prefill_check(inp, F32_TOL, chunk)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_prefill_case(dtype=BF16))
def test_prefill_bf16_matches_recurrent_reference(case):
    inp, chunk, lnc = case
    with _at_lnc(lnc):
        _prefill_check(inp, BF16_TOL, chunk)


@contextlib.contextmanager
def _at_lnc(lnc):
    """Launches inside run as ``lnc`` programs (NEURON_LOGICAL_NC_CONFIG, as the ``lnc``
    fixture sets it; for hypothesis examples, which draw it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
        yield


def test_prefill_length_one_and_empty_sequences(lnc):
    """T = 1, empty sequences with and without initial state (the latter zero their slot)."""
    inp = make_gated_delta_inputs(np.random.default_rng(8), seqlens=[1, 0, 0, 3], H=1, HV=2,
                                  K=16, V=16, has_initial_state=np.array([True, True, False,
                                                                          False]))
    inp["state_indices"] = np.array([0, 1, 2, 3], dtype=np.int32)
    slot1 = inp["ssm_states"][1].copy()
    _prefill_check(inp, F32_TOL, 16)
    assert inp["ssm_states"][1].tobytes() == slot1.tobytes()
    assert not np.any(inp["ssm_states"][2])


_TOKEN_ARRAYS = ("q", "k", "v", "g", "beta", "a", "b")


def _prefill_tokens(inp, s0, s1, chunk_size, **over):
    """One kernel prefill of tokens [s0, s1) of ``inp`` as a single sequence (pool in
    place; ``over`` replaces other arguments)."""
    kw = {n: (x[s0:s1] if n in _TOKEN_ARRAYS and x is not None else x) for n, x in inp.items()}
    kw["cu_seqlens"] = np.array([0, s1 - s0], dtype=np.int32)
    kw.update(over)
    return ops.gated_delta_prefill(**kw, chunk_size=chunk_size, backend="sim")


def _prefill_separately(inp, chunk_size):
    """Each sequence of the ragged batch ``inp`` in its own kernel call, in order; returns
    the outputs concatenated (``inp``'s pool updated in place)."""
    cu = inp["cu_seqlens"]
    outs = []
    for n in range(len(cu) - 1):
        outs.append(_prefill_tokens(inp, int(cu[n]), int(cu[n + 1]), chunk_size,
                                    state_indices=inp["state_indices"][n:n + 1],
                                    has_initial_state=inp["has_initial_state"][n:n + 1]))
    return np.concatenate(outs)


def test_prefill_continuation_through_pool_equals_one_long_prefill(lnc):
    """Two prefills (the second from the pool) == one prefill over the whole sequence."""
    rng = np.random.default_rng(13)
    L1, L2 = 45, 38
    full = make_gated_delta_inputs(rng, seqlens=[L1 + L2], H=2, HV=4, K=32, V=32,
                                   raw_gates=True, use_qk_l2norm=True, slots=2,
                                   has_initial_state=True)
    one = _copy(full)
    o_one = ops.gated_delta_prefill(**one, chunk_size=32, backend="sim")
    split = _copy(full)
    o_split = np.concatenate([_prefill_tokens(split, 0, L1, 32),
                              _prefill_tokens(split, L1, L1 + L2, 32)])
    assert rel_fro(_f64(o_split), _f64(o_one)) <= 1e-6
    assert rel_fro(_f64(split["ssm_states"]), _f64(one["ssm_states"])) <= 1e-6


def test_prefill_ragged_batch_equals_separate_calls_bitwise(lnc):
    rng = np.random.default_rng(17)
    lens = [23, 70, 5]
    inp = make_gated_delta_inputs(rng, seqlens=lens, H=1, HV=2, K=32, V=16, raw_gates=True)
    batch = _copy(inp)
    o_batch = ops.gated_delta_prefill(**batch, chunk_size=32, backend="sim")
    sep = _copy(inp)
    assert _prefill_separately(sep, 32).tobytes() == o_batch.tobytes()
    assert sep["ssm_states"].tobytes() == batch["ssm_states"].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_prefill_several_chunks_per_iteration(dtype, lnc):
    """Iterations of 4 chunks (HV = 2) and the one-chunk remainder loop: sequences of 6
    chunks (4 + 2, the last short), 8 (two full iterations), exactly 4, 3 (remainder only),
    1 token, empty; initial states mixed and a padding slot. Matches float64 and equals
    separate calls bitwise (each chunk's state update lands before the next chunk's k S,
    whichever iteration the two chunks are in)."""
    from nki_ssm.kernels.gated_delta.chunk import chunks_per_iteration, compact_inputs

    n = chunks_per_iteration(2, compact_inputs(1, 2, dtype != np.float32))
    assert n == 8
    lens = [16 * (n + 1) + 3, 16 * 2 * n, 16 * n, 40, 1, 0]
    inp = make_gated_delta_inputs(np.random.default_rng(31), seqlens=lens, H=1, HV=2, K=32,
                                  V=16, dtype=dtype, pool_dtype=dtype, padding=1,
                                  has_initial_state=np.array([True, False, True, True, False,
                                                              True]))
    tol = F32_TOL if dtype == np.float32 else BF16_TOL
    o_batch = _prefill_check(_copy(inp), tol, 16)
    assert _prefill_separately(_copy(inp), 16).tobytes() == o_batch.tobytes()


def test_prefill_continuation_across_iterations_equals_one_long_prefill(lnc):
    """A prefill of 5 chunks + 3 tokens (one 4-chunk iteration, two remainder chunks), then
    one of 4 chunks from the pool == one prefill of the whole sequence."""
    rng = np.random.default_rng(37)
    L1, L2 = 16 * 5 + 3, 16 * 4
    full = make_gated_delta_inputs(rng, seqlens=[L1 + L2], H=1, HV=2, K=32, V=32, slots=2,
                                   has_initial_state=True)
    one = _copy(full)
    o_one = _prefill_check(one, F32_TOL, 16)
    split = _copy(full)
    o_split = np.concatenate([_prefill_tokens(split, 0, L1, 16),
                              _prefill_tokens(split, L1, L1 + L2, 16)])
    assert rel_fro(_f64(o_split), _f64(o_one)) <= 1e-6
    assert rel_fro(_f64(split["ssm_states"]), _f64(one["ssm_states"])) <= 1e-6


def test_prefill_huge_gates_do_not_overflow(lnc):
    """g ~ -500 per token: cumulative log decay reaches -4e4 in a chunk; masked
    exp(min(c_i - c_j, 0)) keeps everything finite and exact."""
    inp = make_gated_delta_inputs(np.random.default_rng(9), seqlens=[80], H=1, HV=2, K=16,
                                  V=16)
    inp["g"] = np.full_like(inp["g"], -500.0)
    o = _prefill_check(inp, F32_TOL, 64)
    assert np.all(np.isfinite(o))


def test_prefill_then_decode_kernels_equal_recurrence():
    """Kernel prefill then kernel decode step == float64 recurrence over all tokens."""
    rng = np.random.default_rng(6)
    L = 50
    full = make_gated_delta_inputs(rng, seqlens=[L + 1], H=1, HV=2, K=32, V=32, slots=2,
                                   use_qk_l2norm=True, has_initial_state=True)
    ref_o, ref_pool = gated_delta_recurrent(**_copy(full))
    pre = {n: (x[:L] if n in ("q", "k", "v", "g", "beta") else x) for n, x in _copy(full).items()}
    pre["cu_seqlens"] = np.array([0, L], dtype=np.int32)
    o_pre = ops.gated_delta_prefill(**pre, chunk_size=32, backend="sim")
    dec = dict(q=full["q"][L:][None], k=full["k"][L:][None], v=full["v"][L:][None],
               g=full["g"][L:][None], beta=full["beta"][L:][None], use_qk_l2norm=True,
               ssm_states=pre["ssm_states"], state_indices=full["state_indices"])
    o_dec = ops.gated_delta_decode(**dec, backend="sim")
    slot = int(full["state_indices"][0])
    assert rel_fro(_f64(o_pre), ref_o[:L]) <= F32_TOL
    assert rel_fro(_f64(o_dec[0]), ref_o[L:]) <= F32_TOL
    assert rel_fro(_f64(pre["ssm_states"][slot]), ref_pool[slot]) <= F32_TOL


@pytest.mark.parametrize("dtype, tol, chunk", [(np.float32, F32_TOL, 64), (BF16, BF16_TOL, 128),
                                               (np.float32, F32_TOL, 48)])
def test_prefill_many_head_groups(dtype, tol, chunk, lnc):
    """HV = 16 (4 head groups: the packed solve's layout moves by SBUF-to-SBUF DMA and the
    output scattered per group, as at Qwen3-Next TP1/TP2), small head dims, ragged with an
    empty sequence, a padding slot, a short last chunk (chunk 48: blocks of 32 and 16) and
    raw gates with the fused L2 norm."""
    inp = make_gated_delta_inputs(np.random.default_rng(16), seqlens=[150, 0, 33, 1], H=4,
                                  HV=16, K=16, V=32, raw_gates=True, use_qk_l2norm=True,
                                  dtype=dtype, pool_dtype=np.float32, padding=1,
                                  has_initial_state=True)
    _prefill_check(inp, tol, chunk)


@pytest.mark.parametrize("dtype, tol, chunk", [(np.float32, F32_TOL, 48), (BF16, BF16_TOL, 128)])
def test_prefill_odd_head_group(dtype, tol, chunk, lnc):
    """HV = 3 (one head group of 3, fewer than 8 groups): the doubling's products run on PE
    tiles of 2 heads, so the group has a tile of 2 heads and one of 1 (32 rows of a 64-row
    tile); ragged, with a short last block at chunk 48."""
    inp = make_gated_delta_inputs(np.random.default_rng(17), seqlens=[100, 37], H=1, HV=3,
                                  K=32, V=16, dtype=dtype, pool_dtype=np.float32,
                                  has_initial_state=True)
    _prefill_check(inp, tol, chunk)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [(np.float32, F32_TOL), (BF16, BF16_TOL)])
def test_prefill_qwen3_next_tp8_shape(dtype, tol, lnc):
    """Qwen3-Next at TP8 (H=2, HV=4, K=V=128), 300 ragged tokens, chunk 64."""
    inp = make_gated_delta_inputs(np.random.default_rng(3), seqlens=[170, 130], H=2, HV=4,
                                  K=128, V=128, raw_gates=True, use_qk_l2norm=True,
                                  dtype=dtype, pool_dtype=dtype)
    _prefill_check(inp, tol, 64)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [(np.float32, F32_TOL), (BF16, BF16_TOL)])
def test_prefill_qwen3_next_tp1_shape_fits_sbuf(dtype, tol, lnc):
    """Qwen3-Next at TP1 (H=16, HV=32, K=V=128: 8 head groups, the most SBUF the kernel
    holds) with the largest-footprint options, a bf16 pool, raw gates and the fused L2
    norm: it fits SBUF (the simulator raises otherwise) and matches the reference."""
    inp = make_gated_delta_inputs(np.random.default_rng(4), seqlens=[150], H=16, HV=32,
                                  K=128, V=128, raw_gates=True, use_qk_l2norm=True,
                                  dtype=dtype, pool_dtype=BF16, has_initial_state=True)
    # the final state is stored in the bf16 pool: its own rounding (~1.7e-3) is the bound
    _one_sequence_check(inp, tol, BF16_TOL)


def _one_sequence_check(inp, out_tol, state_tol):
    """Default-chunk prefill of a one-sequence batch vs the float64 reference: output and
    final state errors within their bounds."""
    ref_in = _copy(inp)
    o = ops.gated_delta_prefill(**inp, backend="sim")
    ref_o, ref_pool = gated_delta_recurrent(**ref_in)
    slot = inp["state_indices"][0]
    assert rel_fro(_f64(o), ref_o) <= out_tol
    assert rel_fro(_f64(inp["ssm_states"][slot]), ref_pool[slot]) <= state_tol


@pytest.mark.parametrize("op", ["prefill", "decode"])
def test_head_dim_over_128_is_rejected_and_pool_untouched(op):
    """K = 160 does not fit the partition dim: ValueError naming K, no slot changed."""
    rng = np.random.default_rng(0)
    if op == "prefill":
        inp = make_gated_delta_inputs(rng, seqlens=[3], H=1, HV=1, K=160, V=16)
        call = ops.gated_delta_prefill
    else:
        inp = make_gated_delta_decode_inputs(rng, num_seqs=1, H=1, HV=1, K=160, V=16)
        call = ops.gated_delta_decode
    before = inp["ssm_states"].copy()
    with pytest.raises(ValueError, match=r"K \(q.shape\[-1\]\) must be <= 128.*got 160"):
        call(**inp, backend="sim")
    assert inp["ssm_states"].tobytes() == before.tobytes()


def _strong_then_weak(g, cu, chunk, strong=-20.0, weak=-1e-3):
    """Gate pattern of issue 9: inside every chunk (chunks start at each sequence's first
    token) the first half decays strongly, the rest barely; c_i - c_j of two running
    sums over the weak half is a small difference of two large numbers."""
    g = np.array(g, dtype=np.float32, copy=True)
    for n in range(len(cu) - 1):
        for t0 in range(int(cu[n]), int(cu[n + 1]), chunk):
            t1 = min(t0 + chunk, int(cu[n + 1]))
            half = t0 + chunk // 2
            g[t0:min(half, t1)] = strong
            g[min(half, t1):t1] = weak
    return g


@pytest.mark.parametrize("chunk", [16, 32, 64, 128])
def test_prefill_strong_then_weak_decay_inside_one_chunk(chunk, lnc):
    """float32 I/O stays within 1e-5 when a chunk decays strongly then weakly (issue 9:
    pairwise decays from direct segment sums, never a difference of running sums)."""
    inp = make_gated_delta_inputs(np.random.default_rng(40 + chunk), seqlens=[2 * chunk + 5, chunk],
                                  H=1, HV=2, K=16, V=16, has_initial_state=True)
    inp["g"] = _strong_then_weak(inp["g"], inp["cu_seqlens"], chunk)
    _prefill_check(inp, F32_TOL, chunk)


# --------------------------------------------- one program per bucket (issue 10)

_BUCKET_LAYER = dict(H=1, HV=2, K=16, V=16)
_BUCKET_CHUNK = 32
_KERNEL = "nki_ssm.kernels.gated_delta.chunk.gdn_chunk_prefill"


@st.composite
def _bucket_batch(draw, dtype, pool_dtype):
    """A ragged batch inside one bucket (<= 128 tokens, 3 or 4 sequences -> 4) on one pool
    (8 slots: the pool is a persistent buffer, its shape part of the program key): lengths
    0, 1, short and several chunks, padding slots, mixed has_initial_state."""
    num_seqs = draw(st.integers(3, 4))
    lens = draw(st.lists(st.sampled_from([0, 1, 2, 7, 31, 32, 33, 70]), min_size=num_seqs,
                         max_size=num_seqs).filter(lambda x: sum(x) <= 128))
    padding = draw(st.integers(0, num_seqs - 1))
    init = np.array(draw(st.lists(st.booleans(), min_size=num_seqs, max_size=num_seqs)))
    inp = make_gated_delta_inputs(np.random.default_rng(draw(st.integers(0, 2**31 - 1))),
                                  seqlens=lens, **_BUCKET_LAYER, dtype=dtype,
                                  pool_dtype=pool_dtype, padding=padding, slots=8,
                                  has_initial_state=init)
    return inp


@pytest.mark.parametrize("dtype, pool_dtype", [(np.float32, np.float32), (BF16, BF16),
                                               (BF16, np.float32)])
def test_prefill_one_specialisation_per_bucket(dtype, pool_dtype):
    """Batch composition is runtime data: every ragged batch of one bucket runs the same
    compiled program (exactly one specialisation), and each matches float64."""
    from nki_ssm import sim

    sim.reset_specialisations()

    @settings(max_examples=12, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(inp=_bucket_batch(dtype, pool_dtype))
    def run(inp):
        tol = F32_TOL if dtype == np.float32 and pool_dtype == np.float32 else BF16_TOL
        _prefill_check(inp, tol, _BUCKET_CHUNK)
        assert sim.specialisations().get(_KERNEL, 0) <= 1

    run()
    assert sim.specialisations()[_KERNEL] == 1


def test_prefill_program_size_does_not_grow_with_tokens():
    """Static program size (each runtime loop body once) is equal at 2K and 16K tokens and
    for 8 sequences of n + 1 chunks. In every batch a sequence runs n-chunk bodies and single
    remaining chunks and every sequence starts from the pool, so every loop but the
    padding one runs (the simulator counts only loops that ran)."""
    from nki_ssm.kernels.gated_delta.chunk import chunks_per_iteration
    from nki_ssm.sim.trace import record

    sizes = []
    n = chunks_per_iteration(2, False)
    for lens in ([2048 + 128, 128 * (n + 1)], [16384 + 128, 128 * (n + 1)],
                 [128 * (n + 1)] * 8):
        inp = make_gated_delta_inputs(np.random.default_rng(0), seqlens=lens, H=1, HV=2, K=16,
                                      V=16, has_initial_state=True)
        with record() as tr:
            ops.gated_delta_prefill(**inp, chunk_size=128, backend="sim")
        sizes.append(tr.program_instructions())
    assert sizes[0] == sizes[1] == sizes[2]


def test_prefill_tables_layout():
    """Launcher work lists (HV = 8, bf16: bodies of 4 chunks): bodies and the remaining
    chunks one per row (past a sequence end -> the zero row = bucket), each row's source and destination state block (the zero block
    for a first row without initial state), the initial and final state copies, padding
    rows, counts."""
    from nki_ssm.kernels.gated_delta.chunk import chunks_per_iteration
    from nki_ssm.ops.launch.gated_delta import prefill_tables

    per = chunks_per_iteration(8, True)     # H = 4 < HV, bf16: compact tiles
    assert per == 4
    K, HV, Nb = 2, 8, 4
    cu = np.array([0, 5, 5, 9, 30])
    (body_rows, body_state, tail_rows, tail_state, init_tab, final_tab, pad_rows,
     counts) = prefill_tables(cu, np.array([2, 0, -1, 1]), np.array([True, False, True, False]),
                              slots=3, HV=HV, K=K, chunk_size=4, num_tokens_bucket=128,
                              num_seqs_bucket=Nb, H=4, bf16=True)
    E = 128 // 4 + Nb
    assert body_rows.shape == (E // per, per * 4)
    assert tail_rows.shape == (min(E, Nb * (per - 1)), 4)
    assert pad_rows.shape == (E + 1, 4)
    # live positions: 0 (slot 2, 2 chunks), 1 (slot 0, empty), 2 (slot 1, 6 chunks)
    assert body_rows[0].tolist() == list(range(9, 25))
    assert (body_rows[1:] == 128).all()
    assert body_state[0].tolist() == [Nb * K, 2 * K]          # no initial state: zero block
    assert tail_rows[:4].tolist() == [[0, 1, 2, 3], [4, 128, 128, 128], [25, 26, 27, 28],
                                      [29, 128, 128, 128]]
    assert (tail_rows[4:] == 128).all()
    assert tail_state[:4].tolist() == [[0, 0], [0, 0], [2 * K, 2 * K], [2 * K, 2 * K]]
    assert init_tab[0].tolist() == [2 * HV * K, 0]
    assert final_tab[:3].tolist() == [[0, 2 * HV * K], [Nb * K, 0], [2 * K, HV * K]]
    assert pad_rows[0].tolist() == [5, 6, 7, 8] and (pad_rows[1:] == 128).all()
    assert counts.tolist() == [[1, 1, 1, 4, 3]]
    # LNC=2: the programs split the value heads and share the work lists, counts included
    two = prefill_tables(cu, np.array([2, 0, -1, 1]), np.array([True, False, True, False]),
                         slots=3, HV=2 * HV, K=K, chunk_size=4, num_tokens_bucket=128,
                         num_seqs_bucket=Nb, H=8, bf16=True, programs=2)
    for a, b in zip(two[:4] + two[6:7], (body_rows, body_state, tail_rows, tail_state,
                                         pad_rows)):
        assert a.tolist() == b.tolist()
    assert two[7].tolist() == [[1, 1, 1, 4, 3]]
    # HV = 3 does not split: both programs run all three heads (program 1 into dumps), one
    # group, bodies of 8 chunks, so the 6-chunk sequence is all single chunks
    odd = prefill_tables(cu, np.array([2, 0, -1, 1]), np.array([True, False, True, False]),
                         slots=3, HV=3, K=K, chunk_size=4, num_tokens_bucket=128,
                         num_seqs_bucket=Nb, H=1, bf16=True, programs=2)
    assert odd[7].tolist() == [[1, 1, 0, 8, 3]]


def test_prefill_tables_state_sources():
    """HV = 8, bf16 (bodies of 4 chunks): each sequence's first work row (a body if it has 4
    chunks, else its first single chunk) reads the zero block unless it has an initial
    state; every later row, and every row's destination, is the sequence's own block."""
    from nki_ssm.ops.launch.gated_delta import prefill_tables

    K, Nb = 2, 8
    chunks = [6, 0, 4, 8, 3, 5, 0, 1]
    init = np.array([False, True, True, False, False, True, False, False])
    cu = np.concatenate([[0], np.cumsum(np.array(chunks) * 4)])
    n = len(chunks)
    _, body_state, _, tail_state, init_tab, final_tab, _, counts = prefill_tables(
        cu, np.arange(n), init, slots=n, HV=8, K=K, chunk_size=4, num_tokens_bucket=256,
        num_seqs_bucket=Nb, H=4, bf16=True)
    nb, nt = counts[0, 2], counts[0, 3]
    bodies = [c // 4 for c in chunks]
    assert nb == sum(bodies) and nt == sum(c % 4 for c in chunks)
    expect_body = []
    expect_tail = []
    for p in range(n):
        for m in range(bodies[p]):
            first = m == 0 and not init[p]
            expect_body.append([Nb * K if first else p * K, p * K])
        for j in range(chunks[p] % 4):
            first = j == 0 and bodies[p] == 0 and not init[p]
            expect_tail.append([Nb * K if first else p * K, p * K])
    assert body_state[:nb].tolist() == expect_body
    assert tail_state[:nt].tolist() == expect_tail
    assert init_tab[:counts[0, 1], 1].tolist() == [K * p for p in np.flatnonzero(init)]
    assert final_tab[:n, 0].tolist() == [Nb * K if c == 0 and not i else p * K
                                         for p, (c, i) in enumerate(zip(chunks, init))]


@pytest.mark.parametrize("dtype, pool_dtype, raw", [(BF16, BF16, True), (BF16, np.float32, False),
                                                    (np.float32, BF16, True)])
def test_prefill_dmas_never_convert_dtype(dtype, pool_dtype, raw, lnc):
    """Hardware DGE needs matching dtypes (KERNEL_RULES 3): every DMA of the prefill kernel
    moves data in its own dtype (a bf16 pool, bf16 activations with the fused L2 norm, the
    packed solve's float32 blocks); conversions happen on compute engines."""
    from nki_ssm.sim.trace import record

    inp = make_gated_delta_inputs(np.random.default_rng(41), seqlens=[70, 0, 40], H=2, HV=4,
                                  K=16, V=16, raw_gates=raw, use_qk_l2norm=True, dtype=dtype,
                                  pool_dtype=pool_dtype, padding=1, slots=5,
                                  has_initial_state=np.array([True, False, True]))
    with record() as tr:
        _prefill_check(inp, BF16_TOL, 32)
    dmas = [i for i in tr.instructions if i.engine == "dma"]
    assert dmas
    assert [i.dtypes for i in dmas if len(set(i.dtypes.values())) > 1] == []


def test_prefill_all_padding_batch_touches_nothing(lnc):
    """Every sequence is padding: the kernel runs only its padding loop (zeros out), the
    pool stays bit-identical."""
    inp = make_gated_delta_inputs(np.random.default_rng(37), seqlens=[20, 0, 45], H=1, HV=2,
                                  K=16, V=16, slots=4)
    inp["state_indices"] = np.full(3, -1, dtype=np.int32)
    before = inp["ssm_states"].copy()
    o = ops.gated_delta_prefill(**inp, chunk_size=16, backend="sim")
    assert not np.any(_f64(o))
    assert inp["ssm_states"].tobytes() == before.tobytes()


def test_prefill_no_runtime_loop_inside_another(lnc):
    """One runtime loop level (KERNEL_RULES 2): on a ragged batch with initial states,
    padding slots, empty sequences, several 4-chunk bodies and single remaining chunks,
    no instruction of the trace sits in more than one runtime loop."""
    from nki_ssm.sim.trace import record

    inp = make_gated_delta_inputs(np.random.default_rng(31), seqlens=[150, 0, 40, 70, 9],
                                  H=1, HV=2, K=16, V=16,
                                  has_initial_state=np.array([True, True, False, True, False]),
                                  padding=1, slots=6)
    with record() as tr:
        _prefill_check(inp, F32_TOL, 16)
    assert tr.instructions
    depth = max(len(inst.loop_path) for inst in tr.instructions)
    assert depth == 1


def _prefill_at_lnc(inp, lnc, chunk_size):
    """(o, pool, trace) of one kernel prefill of a copy of ``inp`` as ``lnc`` programs."""
    from nki_ssm.sim.trace import record

    kw = _copy(inp)
    with _at_lnc(lnc), record() as tr:
        o = ops.gated_delta_prefill(**kw, chunk_size=chunk_size, backend="sim")
    return o, kw["ssm_states"], tr


def _loop_instructions(tr, pid):
    """How many instructions program ``pid`` ran inside runtime loops."""
    return sum(1 for inst in tr.instructions if inst.program_id == pid and inst.loop_path)


@pytest.mark.parametrize("H, HV, dtype, chunk", [(1, 2, np.float32, 32), (2, 4, np.float32, 32),
                                                 (4, 16, np.float32, 32), (16, 32, BF16, 128)])
def test_prefill_lnc2_splits_heads_and_equals_lnc1_bitwise(H, HV, dtype, chunk):
    """LNC=2: each program computes half the value heads (HV = 2: one each, sharing q/k head
    0; HV = 4: q/k head h in program h; HV = 16: two head groups each; HV = 32, bf16: four
    groups each, solved as LNC=1 solves its eight: chunk 128, four 32-row blocks) over the
    same work lists. On a ragged batch with initial states, a padding slot, an empty sequence and
    several chunks per sequence (4-chunk bodies and single chunks), output and pool equal
    LNC=1 bit for bit; both programs run the same loop iterations; their program sizes are
    equal, <= 20,000 and the same for another batch of the bucket."""
    sizes = []
    for lens, seed in (([150, 0, 40, 70, 9], 31), ([200, 1, 60], 32)):
        n = len(lens)
        inp = make_gated_delta_inputs(np.random.default_rng(seed), seqlens=lens, H=H, HV=HV,
                                      K=16, V=16, raw_gates=True, use_qk_l2norm=True, padding=1,
                                      slots=n + 1, has_initial_state=np.arange(n) % 2 == 0,
                                      dtype=dtype, pool_dtype=dtype)
        o2, pool2, tr = _prefill_at_lnc(inp, 2, chunk)
        assert _loop_instructions(tr, 0) == _loop_instructions(tr, 1) > 0
        sizes.append([tr.program_instructions(0), tr.program_instructions(1)])
        if len(sizes) == 1:
            o1, pool1, _ = _prefill_at_lnc(inp, 1, chunk)
            assert o2.tobytes() == o1.tobytes()
            assert pool2.tobytes() == pool1.tobytes()
    assert sizes[0] == sizes[1]
    assert sizes[0][0] == sizes[0][1] <= 20_000


@pytest.mark.parametrize("H, HV", [(1, 1), (1, 3)])
def test_prefill_lnc2_heads_that_do_not_split_run_on_both_programs(H, HV):
    """HV = 1 or 3 (odd: no even split): both programs compute every head with the same loop
    instructions (one control flow), program 1 into private dumps (from initial states it
    reads there: were any of its writes to reach o or the pool, they would differ from
    LNC=1's); results equal LNC=1 bit for bit; equal program sizes."""
    inp = make_gated_delta_inputs(np.random.default_rng(3), seqlens=[70, 0, 20], H=H, HV=HV,
                                  K=16, V=16, padding=1, slots=4, has_initial_state=True)
    o1, pool1, _ = _prefill_at_lnc(inp, 1, 32)
    o2, pool2, tr = _prefill_at_lnc(inp, 2, 32)
    assert o2.tobytes() == o1.tobytes() and pool2.tobytes() == pool1.tobytes()
    assert _loop_instructions(tr, 0) == _loop_instructions(tr, 1) > 0
    assert tr.program_instructions(0) == tr.program_instructions(1)


def test_prefill_nan_padding_tokens_never_reach_live_outputs(lnc):
    """Rows past a live sequence's end read the launcher's zero row, never the next
    (padding) sequence's tokens: NaN there leaves live outputs exact and padding zero."""
    inp = make_gated_delta_inputs(np.random.default_rng(23), seqlens=[37, 20, 9], H=1, HV=2,
                                  K=16, V=16, has_initial_state=True)
    inp["state_indices"] = np.array([0, -1, 2], dtype=np.int32)
    cu = inp["cu_seqlens"]
    for name in ("q", "k", "v"):
        inp[name][cu[1]:cu[2]] = np.nan
    o = _prefill_check(inp, F32_TOL, 32)
    assert np.all(np.isfinite(o))


@pytest.mark.parametrize("chunk", [16, 64, 128])
@pytest.mark.parametrize("raw", [False, True])
def test_prefill_strong_then_weak_generator_pattern(chunk, raw, lnc):
    """The shared generator's strong-then-weak gates (issue 9): float32 within 1e-5."""
    inp = make_gated_delta_inputs(np.random.default_rng(60 + chunk), seqlens=[2 * chunk + 9, 40],
                                  H=1, HV=2, K=16, V=16, raw_gates=raw, has_initial_state=True,
                                  gate_pattern="strong_then_weak")
    _prefill_check(inp, F32_TOL, chunk)


def test_prefill_program_size_at_qwen3_next_tp1_is_bounded(lnc):
    """Qwen3-Next TP1 (H=16, HV=32, K=V=128): the static program of each program stays under
    20,000 instructions (program size does not depend on the token count: 128 tokens
    suffice); at LNC=2 the two programs (16 value heads each) have the same size."""
    from nki_ssm.sim.trace import record

    inp = make_gated_delta_inputs(np.random.default_rng(0), seqlens=[100, 28], H=16, HV=32,
                                  K=128, V=128, dtype=BF16)
    with record() as tr:
        ops.gated_delta_prefill(**inp, backend="sim")
    sizes = {tr.program_instructions(pid) for pid in range(lnc)}
    assert len(sizes) == 1 and max(sizes) <= 20_000


@pytest.mark.slow
def test_prefill_qwen3_next_tp4_2k_bf16_within_budget(lnc):
    """Issue 15's accuracy bar at a model shape: bf16 I/O (bf16 and tfloat32 TensorE
    operands, the chunk kernel's design note) within 3e-3 of float64 at 2K tokens,
    Qwen3-Next TP4 (H=4, HV=8, K=V=128), realistic gates, default chunk."""
    inp = make_gated_delta_inputs(np.random.default_rng(15), seqlens=[2048], H=4, HV=8, K=128,
                                  V=128, dtype=BF16, has_initial_state=True)
    _one_sequence_check(inp, BF16_TOL, BF16_TOL)


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("raw", [False, True])
def test_prefill_nan_beta_on_a_real_token_is_rejected_pool_untouched(backend, raw, lnc):
    """Issue 26 row 7: the kernel's packed solve would spread a NaN beta of one value head
    to the other heads of its group (0 * NaN on TensorE), the reference keeps it in its
    head; every backend rejects it, naming the argument, and leaves the pool as it was.
    The same value on a padding token is accepted (never read)."""
    inp = make_gated_delta_inputs(np.random.default_rng(1), seqlens=[40, 12], H=1, HV=2,
                                  K=16, V=16, raw_gates=raw)
    inp["state_indices"] = np.array([0, -1], dtype=np.int32)
    name = "b" if raw else "beta"
    bad = _copy(inp)
    bad[name][3, 0] = np.nan
    before = bad["ssm_states"].copy()
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        ops.gated_delta_prefill(**bad, chunk_size=16, backend=backend)
    assert bad["ssm_states"].tobytes() == before.tobytes()
    pad = _copy(inp)
    pad[name][45, 1] = np.nan          # a token of the padding sequence
    o = ops.gated_delta_prefill(**pad, chunk_size=16, backend=backend)
    assert np.all(np.isfinite(_f64(o)))


@pytest.mark.parametrize("H, HV", [(4, 8), (2, 4), (8, 8), (4, 4)])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_prefill_fits_sbuf_at_qwen3_next_shards(H, HV, dtype, lnc):
    """The Qwen3-Next TP4 and TP8 shards (K = V = 128, 2 or 1 head groups per program), and
    the same value heads with one q/k head each (H = HV: no compact tiles, so fewer chunks
    per body or chunks started further apart), with the largest input tiles (q / k
    normalised in float32, raw gates) fit SBUF at LNC=1 and 2 with a full body of
    chunks_per_iteration chunks, a remainder chunk and a padding slot, and match float64."""
    from nki_ssm.kernels.gated_delta.chunk import (chunks_per_iteration, compact_inputs,
                                                   heads_per_program)

    n = chunks_per_iteration(heads_per_program(HV, lnc),
                             compact_inputs(H, HV, dtype != np.float32))
    inp = make_gated_delta_inputs(np.random.default_rng(43), seqlens=[128 * n + 5], H=H,
                                  HV=HV, K=128, V=128, raw_gates=True, use_qk_l2norm=True,
                                  dtype=dtype, padding=1)
    _prefill_check(inp, F32_TOL if dtype == np.float32 else BF16_TOL, chunk_size=None)


def test_chunks_per_iteration_and_stride():
    """About 8 head groups per body (half as many from 2 groups on without compact tiles),
    and a body's chunks started 6 steps apart, 2 with one group and compact tiles: the SBUF
    budget test_prefill_fits_sbuf_at_qwen3_next_shards checks."""
    from nki_ssm.kernels.gated_delta.chunk import chunks_per_iteration, compact_inputs
    from nki_ssm.kernels.gated_delta.chunk_pipeline import chunk_stride

    assert compact_inputs(16, 32, True) and compact_inputs(1, 2, True)
    assert not compact_inputs(16, 32, False) and not compact_inputs(8, 8, True)
    assert [chunks_per_iteration(hv, True) for hv in (32, 16, 8, 4, 2, 1)] == [1, 2, 4, 8, 8, 8]
    assert [chunks_per_iteration(hv, False) for hv in (32, 16, 8, 4, 2)] == [1, 1, 2, 8, 8]
    assert [chunk_stride(g, True) for g in (1, 2, 4, 8)] == [2, 6, 6, 6]
    assert [chunk_stride(g, False) for g in (1, 2, 4, 8)] == [6, 6, 6, 6]


@pytest.mark.parametrize("seqlens", [[64], [1]])
def test_prefill_batch_shorter_than_one_body(seqlens, lnc):
    """A bucket with fewer chunks than one body of chunks_per_iteration(HV) chunks (K = 128:
    one 128-token chunk in the 128-token bucket): the body loop never runs, but its body is
    compiled with its look-ahead row in the table (a static offset out of the table is a
    compile error; the simulator traces unrun bodies too)."""
    inp = make_gated_delta_inputs(np.random.default_rng(11), seqlens=seqlens, H=1, HV=2,
                                  K=128, V=128)
    _prefill_check(inp, F32_TOL, chunk_size=None)
