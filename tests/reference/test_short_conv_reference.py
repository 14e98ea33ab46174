"""float64 short-conv references: recurrent vs vectorised prefill, decode, and the
op's properties (ragged batches, pool continuation, padding, pool hygiene)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nki_ssm.reference.inputs import (
    cu_seqlens_from_lengths,
    make_short_conv_decode_inputs,
    make_short_conv_inputs,
)
from nki_ssm.reference.metrics import rel_fro
from nki_ssm.reference.short_conv import (
    short_conv_decode,
    short_conv_prefill,
    short_conv_recurrent,
)
from nki_ssm.reference.testing import FORMS_TOL as TOL
from nki_ssm.reference.testing import (
    array_snapshot,
    assert_arrays_unchanged,
    assert_forms_agree,
    assert_padding_outputs_zero,
    assert_pool_hygiene,
    assert_reads_bf16_exactly,
    one_sequence,
    token_range,
)


# ----------------------------------------------------------------------------- hand-computed

def test_hand_computed_width2_with_state_and_bias():
    # y_t = 0.5 * x_{t-1} + 2 * x_t + 1, x_{-1} = 10 from the pool
    x = np.array([[1.0], [2.0], [3.0]])
    pool = np.array([[[10.0]], [[-7.0]]])
    y, out = short_conv_recurrent(
        x, np.array([[0.5, 2.0]]), np.array([1.0]), cu_seqlens=np.array([0, 3]),
        conv_states=pool, state_indices=np.array([0]), has_initial_state=np.array([True]))
    np.testing.assert_array_equal(y[:, 0], [8.0, 5.5, 8.0])
    np.testing.assert_array_equal(out[:, 0, 0], [3.0, -7.0])


def test_hand_computed_silu_and_zero_initial_state():
    x = np.array([[1.0], [-2.0]])
    pool = np.full((1, 1, 2), 5.0)     # ignored: has_initial_state False
    y, out = short_conv_prefill(
        x, np.array([[1.0, 1.0, 1.0]]), activation="silu", cu_seqlens=np.array([0, 2]),
        conv_states=pool, state_indices=np.array([0]), has_initial_state=np.array([False]))
    pre = np.array([1.0, -1.0])
    np.testing.assert_allclose(y[:, 0], pre / (1 + np.exp(-pre)), rtol=1e-15)
    np.testing.assert_array_equal(out[0, 0], [1.0, -2.0])


# ----------------------------------------------------------------------------- recurrent vs prefill

@st.composite
def conv_cases(draw):
    seqlens = draw(st.lists(st.integers(0, 12), min_size=1, max_size=4))
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)), seqlens=seqlens,
        dim=draw(st.integers(1, 6)), W=draw(st.integers(2, 6)),
        bias=draw(st.booleans()), activation=draw(st.sampled_from([None, "silu"])),
        padding=draw(st.integers(0, len(seqlens))),
        has_initial_state=draw(st.sampled_from(["mixed", True, False])),
        dtype=draw(st.sampled_from([np.float32, np.float64, ml_dtypes.bfloat16])),
    )


@settings(max_examples=60, deadline=None)
@given(conv_cases())
@example(dict(seed=1, seqlens=[1], dim=3, W=4, bias=True, activation="silu", padding=0,
              has_initial_state=True, dtype=np.float32))                        # T = 1
@example(dict(seed=2, seqlens=[2, 0, 1, 9], dim=2, W=4, bias=False, activation=None,
              padding=1, has_initial_state="mixed", dtype=np.float32))          # T < W, empty, pad
def test_recurrent_and_prefill_agree(case):
    case = dict(case)
    rng = np.random.default_rng(case.pop("seed"))
    inp = make_short_conv_inputs(rng, **case)
    y_r, p_r = assert_forms_agree(short_conv_recurrent, short_conv_prefill, inp)
    assert y_r.dtype == np.float64 and p_r.dtype == np.float64
    assert y_r.shape == inp["x"].shape and p_r.shape == inp["conv_states"].shape


# ----------------------------------------------------------------------------- properties

@pytest.mark.parametrize("form", [short_conv_recurrent, short_conv_prefill])
def test_ragged_batch_equals_separate_calls(rng, form):
    inp = make_short_conv_inputs(rng, seqlens=[5, 0, 2, 11], dim=4, W=4, padding=1)
    y, pool = form(**inp)
    cu = inp["cu_seqlens"]
    for s in range(4):
        y1, pool1 = form(**one_sequence(inp, s, ("x",)))
        np.testing.assert_array_equal(y1, y[cu[s]:cu[s + 1]])
        slot = inp["state_indices"][s]
        if slot >= 0:
            np.testing.assert_array_equal(pool1[slot], pool[slot])


@pytest.mark.parametrize("split", [0, 1, 2, 3, 7, 10])
def test_prefill_in_two_pieces_equals_one(rng, split):
    # splits below W-1 = 3 exercise "the new state takes the tail of (old state ++ x)"
    inp = make_short_conv_inputs(rng, seqlens=[10], dim=3, W=4, has_initial_state="mixed")
    y, pool = short_conv_prefill(**inp)
    y_a, pool_a = short_conv_recurrent(**token_range(inp, 0, split, ("x",)))
    second = dict(token_range(inp, split, 10, ("x",)), conv_states=pool_a,
                  has_initial_state=np.array([True]))
    y_b, pool_b = short_conv_recurrent(**second)
    assert rel_fro(np.concatenate([y_a, y_b]), y) <= TOL
    assert rel_fro(pool_b, pool) <= TOL


@pytest.mark.parametrize("T", [1, 2, 5])
def test_multi_token_decode_equals_repeated_single_token(rng, T):
    inp = make_short_conv_decode_inputs(rng, num_seqs=4, T=T, dim=5, W=4, padding=1)
    y, pool = short_conv_decode(**inp)
    step_pool = inp["conv_states"]
    for t in range(T):
        y_t, step_pool = short_conv_decode(**dict(inp, x=inp["x"][:, t], conv_states=step_pool))
        assert y_t.shape == (4, 5)
        assert rel_fro(y_t, y[:, t]) <= TOL
    assert rel_fro(step_pool, pool) <= TOL


@pytest.mark.parametrize("W", [2, 4, 5])
def test_decode_equals_prefill_continuing_from_pool(rng, W):
    inp = make_short_conv_decode_inputs(rng, num_seqs=3, T=3, dim=4, W=W, padding=1)
    y, pool = short_conv_decode(**inp)
    n, T, dim = inp["x"].shape
    y_p, pool_p = short_conv_prefill(
        inp["x"].reshape(n * T, dim), inp["weight"], inp["bias"], activation=inp["activation"],
        cu_seqlens=cu_seqlens_from_lengths([T] * n), conv_states=inp["conv_states"],
        state_indices=inp["state_indices"], has_initial_state=np.ones(n, bool))
    assert rel_fro(y, y_p.reshape(n, T, dim)) <= TOL
    assert rel_fro(pool, pool_p) <= TOL


@pytest.mark.parametrize("form", ["recurrent", "prefill", "decode"])
def test_padding_and_unnamed_slots_untouched(rng, form):
    if form == "decode":
        inp = make_short_conv_decode_inputs(rng, num_seqs=4, T=2, dim=3, W=3, padding=2, slots=9)
        y, pool = short_conv_decode(**inp)
    else:
        inp = make_short_conv_inputs(rng, seqlens=[3, 4, 0, 2], dim=3, W=3, padding=2, slots=9)
        fn = short_conv_recurrent if form == "recurrent" else short_conv_prefill
        y, pool = fn(**inp)
    assert assert_padding_outputs_zero(y, inp) == 2
    # bit-identical unnamed slots (float32 -> float64 exact); named slots of non-empty
    # sequences changed (so that check is not vacuous)
    assert_pool_hygiene(pool, inp, pool_name="conv_states")


def test_empty_sequence_writes_its_initial_state(rng):
    inp = make_short_conv_inputs(rng, seqlens=[0, 0], dim=2, W=4)
    inp["has_initial_state"] = np.array([True, False])
    _, pool = short_conv_prefill(**inp)
    a, b = inp["state_indices"]
    np.testing.assert_array_equal(pool[a], inp["conv_states"][a])
    np.testing.assert_array_equal(pool[b], 0.0)


@pytest.mark.parametrize("form", [short_conv_recurrent, short_conv_prefill, "decode"])
def test_references_never_modify_inputs(rng, form):
    if form == "decode":
        inp = make_short_conv_decode_inputs(rng, num_seqs=3, T=2, dim=3, W=4)
        fn = short_conv_decode
    else:
        inp = make_short_conv_inputs(rng, seqlens=[4, 2], dim=3, W=4)
        fn = form
    before = array_snapshot(inp)
    fn(**inp)
    assert_arrays_unchanged(inp, before)


def test_bf16_inputs_accepted_and_exact_in_float64(rng):
    inp = make_short_conv_inputs(rng, seqlens=[6, 3], dim=4, W=4, dtype=ml_dtypes.bfloat16,
                                 pool_dtype=ml_dtypes.bfloat16)
    assert inp["x"].dtype == ml_dtypes.bfloat16
    assert_reads_bf16_exactly(short_conv_prefill, inp)


def test_bad_arguments_raise_naming_the_argument(rng):
    inp = make_short_conv_inputs(rng, seqlens=[3], dim=2, W=3)
    with pytest.raises(ValueError, match="activation"):
        short_conv_prefill(**dict(inp, activation="relu"))
    with pytest.raises(ValueError, match="state_indices"):
        short_conv_prefill(**dict(inp, state_indices=np.array([99], np.int32)))
    with pytest.raises(ValueError, match="cu_seqlens"):
        short_conv_recurrent(**dict(inp, cu_seqlens=np.array([0, 2], np.int32)))
    with pytest.raises(ValueError, match="weight"):
        short_conv_prefill(**dict(inp, weight=np.ones((2, 1))))


# ----------------------------------------------------------------------------- model shapes

@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-next", "mamba2-2.7b"])
def test_recurrent_and_prefill_agree_at_model_shape(name):
    from nki_ssm.reference.shapes import CONV_SHAPES

    s = CONV_SHAPES[name]
    rng = np.random.default_rng(12)
    inp = make_short_conv_inputs(rng, seqlens=[130, 2, 1, 0], dim=s.dim, W=s.W, padding=1)
    y_r, p_r = short_conv_recurrent(**inp)
    y_p, p_p = short_conv_prefill(**inp)
    assert rel_fro(y_p, y_r) <= TOL and rel_fro(p_p, p_r) <= TOL
