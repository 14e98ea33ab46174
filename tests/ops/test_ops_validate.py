"""Property tests of the shared validators and of the correctly rounded bf16 cast."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nki_ssm.ops import _validate as v
from nki_ssm.ops._dispatch import cast_rne

BF16 = ml_dtypes.bfloat16
FAST = settings(max_examples=150, deadline=None)
INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16]


@FAST
@given(values=st.lists(st.integers(-2, 7), min_size=0, max_size=6),
       num_tokens=st.integers(0, 7), dtype=st.sampled_from(INT_DTYPES))
def test_cu_seqlens_accepted_iff_contract_holds(values, num_tokens, dtype):
    cu = np.array(values, np.int64)
    if np.issubdtype(dtype, np.unsignedinteger) and (cu < 0).any():
        cu = np.abs(cu)
    arr = cu.astype(dtype)
    valid = (len(cu) >= 2 and cu[0] == 0 and bool((np.diff(cu) >= 0).all())
             and cu[-1] == num_tokens)
    if valid:
        out, num_seqs = v.check_cu_seqlens(arr, num_tokens, "x.shape[0]")
        assert out.dtype == np.int32 and np.array_equal(out, cu) and num_seqs == len(cu) - 1
        assert not np.shares_memory(out, arr)
    else:
        with pytest.raises(ValueError, match=r"^cu_seqlens"):
            v.check_cu_seqlens(arr, num_tokens, "x.shape[0]")


@FAST
@given(values=st.lists(st.integers(-3, 6), min_size=1, max_size=6), slots=st.integers(0, 5))
def test_state_indices_accepted_iff_contract_holds(values, slots):
    idx = np.array(values, np.int64)
    named = idx[idx >= 0]
    valid = (bool(((idx == -1) | ((idx >= 0) & (idx < slots))).all())
             and len(np.unique(named)) == len(named))
    if valid:
        out = v.check_state_indices(idx, len(idx), slots, "ssm_states")
        assert out.dtype == np.int32 and np.array_equal(out, idx)
    else:
        with pytest.raises(ValueError, match=r"^state_indices"):
            v.check_state_indices(idx, len(idx), slots, "ssm_states")


def test_state_indices_length_and_dtype():
    with pytest.raises(ValueError, match=r"^state_indices must have length num_seqs = 3, got 2"):
        v.check_state_indices(np.array([0, 1]), 3, 4, "ssm_states")
    with pytest.raises(TypeError, match=r"^state_indices must have an integer dtype"):
        v.check_state_indices(np.array([True, False]), 2, 4, "ssm_states")
    with pytest.raises(ValueError, match=r"^state_indices values must fit int32"):
        v.check_state_indices(np.array([2 ** 40]), 1, 4, "ssm_states")


@FAST
@given(chunk=st.integers(-4, 300))
def test_chunk_size_limits(chunk):
    if 16 <= chunk <= 128 and chunk % 16 == 0:
        assert v.check_chunk_size(np.int64(chunk)) == chunk
    else:
        with pytest.raises(ValueError, match=r"^chunk_size must be a multiple of 16 in 16\.\.128"):
            v.check_chunk_size(chunk)


@pytest.mark.parametrize("bad", [True, 64.0, "64", None])
def test_chunk_size_type(bad):
    with pytest.raises(TypeError, match=r"^chunk_size must be an int"):
        v.check_chunk_size(bad)


@pytest.mark.parametrize("value,expected", [((0, 1), (0.0, 1.0)), ([-np.inf, np.inf], (-np.inf, np.inf)),
                                            ((np.float32(0.5), 0.5), (0.5, 0.5))])
def test_dt_limit_accepted(value, expected):
    assert v.check_dt_limit(value) == expected


def test_scale_default_and_numpy_scalars():
    assert v.check_scale(None, 0.125) == 0.125
    assert v.check_scale(np.float32(0.5), 0.125) == 0.5
    with pytest.raises(TypeError, match=r"^scale must be a real number"):
        v.check_scale(True, 0.125)
    with pytest.raises(ValueError, match=r"^scale must be finite and > 0, got -1\.0"):
        v.check_scale(-1, 0.125)


# ---------------------------------------------------------------- bf16 rounding


def _bf16_rne_oracle(x: np.ndarray) -> np.ndarray:
    """float64 -> nearest bfloat16 (ties to even) by integer rounding of the float64 bits.

    Valid for finite normal values inside bfloat16's normal range: keep the
    top 7 explicit mantissa bits, add half-an-ulp minus one plus the kept LSB.
    """
    bits = x.view(np.uint64)
    drop = np.uint64(52 - 7)
    lsb = (bits >> drop) & np.uint64(1)
    rounded = (bits + (np.uint64(1) << (drop - np.uint64(1))) - np.uint64(1) + lsb) >> drop << drop
    return rounded.view(np.float64)


@pytest.mark.parametrize("x,expected", [
    (1 + 2 ** -8 + 2 ** -40, 1 + 2 ** -7),   # just above a tie: ml_dtypes alone gives 1.0
    (1 + 2 ** -8, 1.0),                      # exact tie -> even
    (1 + 3 * 2 ** -8, 1 + 2 ** -6),          # exact tie -> even (up)
    (-(1 + 2 ** -8 + 2 ** -40), -(1 + 2 ** -7)),
    (1 + 2 ** -8 - 2 ** -40, 1.0),
])
def test_cast_rne_rounds_once(x, expected):
    got = cast_rne(np.array([x]), BF16)
    assert got.dtype == BF16 and got.astype(np.float64)[0] == expected


@FAST
@given(st.lists(st.floats(min_value=1e-30, max_value=1e30, allow_nan=False), min_size=1,
                max_size=20), st.lists(st.booleans(), min_size=20, max_size=20))
def test_cast_rne_is_correctly_rounded(mags, signs):
    x = np.array(mags) * np.where(np.array(signs[: len(mags)]), -1.0, 1.0)
    # Also hit near-ties: perturb onto the float64 neighbourhood of bf16 midpoints.
    # half a bf16 ulp away from zero (+2**44 on the float64 bits)
    mid = (_bf16_rne_oracle(x).view(np.uint64) + (np.uint64(1) << np.uint64(44))).view(np.float64)
    for vals in (x, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)):
        got = cast_rne(vals, BF16).astype(np.float64)
        assert np.array_equal(got, _bf16_rne_oracle(vals))


def test_cast_rne_specials_and_float32():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, 1e-300])
    got = cast_rne(x, BF16).astype(np.float64)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf
    assert got[3] == 0 and np.signbit(got[4]) and got[5] == np.inf and got[6] == 0
    y = np.array([1 + 2 ** -24 + 2 ** -40])  # just above a float32 tie
    assert cast_rne(y, np.float32)[0] == np.float32(1 + 2 ** -23)
