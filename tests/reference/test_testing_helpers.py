"""The shared test checks of nki_ssm.reference.testing catch what they claim to catch."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ssm.reference.testing import (
    array_snapshot,
    assert_arrays_unchanged,
    assert_forms_agree,
    assert_padding_outputs_zero,
    assert_pool_hygiene,
    assert_reads_bf16_exactly,
    named_slots,
    one_sequence,
    padding_rows,
    token_range,
    unnamed_slots,
)


def _batch():
    # 3 sequences of lengths 2, 0, 3; the second is padding; pool of 5 slots
    return dict(x=np.arange(5, dtype=np.float32), cu_seqlens=np.array([0, 2, 2, 5], np.int32),
                state_indices=np.array([3, -1, 0], np.int32),
                pool=np.arange(10, dtype=np.float32).reshape(5, 2))


def test_slots_and_padding_rows():
    b = _batch()
    assert named_slots(b["state_indices"]).tolist() == [3, 0]        # batch order
    assert unnamed_slots(b["state_indices"], 5).tolist() == [1, 2, 4]
    assert padding_rows(b) == [np.s_[2:2]]
    decode = dict(b, state_indices=np.array([-1, 2, -1]))
    del decode["cu_seqlens"]
    assert padding_rows(decode) == [np.s_[0], np.s_[2]]


def test_token_range_and_one_sequence():
    b = dict(_batch(), z=None, has_initial_state=np.array([True, False, True]))
    part = token_range(b, 1, 4, ("x", "z"))
    assert part["x"].tolist() == [1, 2, 3] and part["z"] is None
    assert part["cu_seqlens"].tolist() == [0, 3] and part["cu_seqlens"].dtype == np.int32
    assert part["pool"] is b["pool"] and b["x"].shape == (5,)    # the rest shared, untouched
    last = one_sequence(b, 2, ("x",))
    assert last["x"].tolist() == [2, 3, 4] and last["cu_seqlens"].tolist() == [0, 3]
    assert last["state_indices"].tolist() == [0] and last["has_initial_state"].tolist() == [True]


def test_padding_outputs_zero():
    b = dict(_batch(), cu_seqlens=np.array([0, 2, 4, 5], np.int32))   # padding owns rows 2:4
    out = np.ones((5, 3))
    out[2:4] = 0.0
    assert assert_padding_outputs_zero(out, b) == 1
    out[3, 1] = np.nan
    with pytest.raises(AssertionError, match="padding output"):
        assert_padding_outputs_zero(out, b)


def test_arrays_unchanged_sees_one_bit_and_a_dtype():
    b = _batch()
    before = array_snapshot(b)
    assert_arrays_unchanged(b, before)
    b["x"][0] = -0.0                                     # equal in value, not in bits
    with pytest.raises(AssertionError, match="x modified"):
        assert_arrays_unchanged(b, before)
    b = _batch()
    b["pool"] = b["pool"].astype(np.float64)
    with pytest.raises(AssertionError, match="pool"):
        assert_arrays_unchanged(b, before)


def _truth(x, cu_seqlens, state_indices, pool):
    new = np.asarray(pool, np.float64).copy()
    new[named_slots(state_indices)] *= 3.0
    return np.asarray(x, np.float64) * 2, new


def test_forms_agree_checks_each_named_slot():
    b = _batch()
    b["pool"] = np.ones((5, 2), np.float32) * 1e6
    b["pool"][0] = 1.0                                   # a small slot among large ones
    assert_forms_agree(_truth, _truth, b)

    def off_in_slot_0(**kw):
        out, pool = _truth(**kw)
        pool[0] *= 1 + 1e-9   # ~1e-15 of the whole pool, 1e-9 of slot 0
        return out, pool

    with pytest.raises(AssertionError):
        assert_forms_agree(_truth, off_in_slot_0, b)
    with pytest.raises(AssertionError):                  # not finite
        assert_forms_agree(_truth, lambda **kw: (np.full(5, np.nan), _truth(**kw)[1]), b)


def test_pool_hygiene_catches_a_touched_unnamed_slot_and_an_untouched_named_one():
    b = _batch()
    good = b["pool"].astype(np.float64)
    good[3] += 1.0
    good[0] += 1.0
    assert_pool_hygiene(good, b, pool_name="pool")
    touched = good.copy()
    touched[4] += 1.0
    with pytest.raises(AssertionError, match="unnamed slot 4"):
        assert_pool_hygiene(touched, b, pool_name="pool")
    lazy = good.copy()
    lazy[0] = b["pool"][0]
    with pytest.raises(AssertionError, match="named slot 0 unchanged"):
        assert_pool_hygiene(lazy, b, pool_name="pool")
    # a named slot of an empty sequence may stay, unless every_named is asked for
    empty = dict(b, cu_seqlens=np.array([0, 0, 0, 5], np.int32))
    stay = good.copy()
    stay[3] = b["pool"][3]
    assert_pool_hygiene(stay, empty, pool_name="pool")
    with pytest.raises(AssertionError, match="named slot 3 unchanged"):
        assert_pool_hygiene(stay, empty, pool_name="pool", every_named=True)


def test_reads_bf16_exactly_catches_a_rounding_reference():
    b = dict(x=np.array([1.0, 1 + 2.0 ** -7, -3.5], ml_dtypes.bfloat16), scale=2.0)
    exact = lambda x, scale: (np.asarray(x, np.float64) * scale,)
    assert_reads_bf16_exactly(exact, b)
    # a "reference" that rounds its input to a coarser grid than bf16 differs on the wide copy
    coarse = lambda x, scale: (np.round(np.asarray(x, np.float64) * 64) / 64 * scale,)
    with pytest.raises(AssertionError):
        assert_reads_bf16_exactly(lambda x, scale: exact(x, scale) if x.dtype.name == "bfloat16"
                                  else coarse(x, scale), b)
    with pytest.raises(AssertionError, match="no bfloat16"):
        assert_reads_bf16_exactly(exact, dict(b, x=b["x"].astype(np.float32)))
