"""float64 Mamba-2 SSD references: recurrent vs chunked, decode, and the op's
properties (ragged batches, pool continuation, groups, pool hygiene)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nki_ssm.reference.inputs import (
    cu_seqlens_from_lengths,
    make_ssd_decode_inputs,
    make_ssd_inputs,
    softplus,
)
from nki_ssm.reference.mamba2_ssd import ssd_chunked, ssd_decode, ssd_dt, ssd_recurrent
from nki_ssm.reference.metrics import rel_fro
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


def _assert_forms_agree(inp, chunk_size):
    return assert_forms_agree(
        ssd_recurrent, lambda **kw: ssd_chunked(**kw, chunk_size=chunk_size), inp)


# ----------------------------------------------------------------------------- hand-computed

def test_hand_computed_scalar_recursion():
    # H = P = N = G = 1: s_t = exp(dt A) s_{t-1} + dt x_t b_t, y_t = c_t s_t + D x_t
    x, dt, b, c = [1.0, 2.0, -1.0], [0.5, 0.25, 1.0], [1.0, -1.0, 2.0], [2.0, 1.0, 0.5]
    A, D, s0 = -2.0, 0.5, 3.0
    s, ys = s0, []
    for t in range(3):
        s = math.exp(dt[t] * A) * s + dt[t] * x[t] * b[t]
        ys.append(c[t] * s + D * x[t])
    col = lambda v: np.array(v).reshape(3, 1, 1)
    kw = dict(D=np.array([D]), cu_seqlens=np.array([0, 3]), ssm_states=np.full((1, 1, 1, 1), s0),
              state_indices=np.array([0]), has_initial_state=np.array([True]))
    for fn, extra in [(ssd_recurrent, {}), (ssd_chunked, dict(chunk_size=2))]:
        y, pool = fn(col(x), np.array(dt).reshape(3, 1), np.array([A]), col(b), col(c), **kw, **extra)
        np.testing.assert_allclose(y[:, 0, 0], ys, rtol=1e-14)
        np.testing.assert_allclose(pool[0, 0, 0, 0], s, rtol=1e-14)


def test_dt_transform_softplus_bias_and_limit():
    dt = np.array([[-30.0, 0.0, 5.0]])
    bias = np.array([1.0, -1.0, 0.5])
    np.testing.assert_allclose(ssd_dt(dt, bias, True), np.log1p(np.exp(dt + bias)), rtol=1e-15)
    np.testing.assert_array_equal(ssd_dt(dt, bias, True, (0.01, 1.0))[0, [0, 2]], [0.01, 1.0])
    np.testing.assert_array_equal(ssd_dt(dt, None, False), dt.clip(0.0))


# ----------------------------------------------------------------------------- recurrent vs chunked

@st.composite
def ssd_cases(draw):
    G = draw(st.sampled_from([1, 2]))
    seqlens = draw(st.lists(st.integers(0, 13), min_size=1, max_size=4))
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)), seqlens=seqlens,
        H=G * draw(st.sampled_from([1, 2])), G=G,
        P=draw(st.integers(1, 3)), N=draw(st.integers(1, 4)),
        chunk_size=draw(st.integers(1, 8)),
        D=draw(st.sampled_from([None, "H", "HP"])), z=draw(st.booleans()),
        dt_mode=draw(st.sampled_from(["softplus", "raw"])),
        dt_limit=draw(st.sampled_from([(0.0, math.inf), (0.01, 2.0)])),
        padding=draw(st.integers(0, len(seqlens))),
        has_initial_state=draw(st.sampled_from(["mixed", True, False])),
        dtype=draw(st.sampled_from([np.float32, ml_dtypes.bfloat16])),
    )


@settings(max_examples=60, deadline=None)
@given(ssd_cases())
@example(dict(seed=3, seqlens=[1], H=2, G=1, P=2, N=3, chunk_size=4, D="H", z=True,
              dt_mode="softplus", dt_limit=(0.0, math.inf), padding=0, has_initial_state=True,
              dtype=np.float32))                                           # T = 1
@example(dict(seed=4, seqlens=[9, 0, 3, 13], H=4, G=2, P=2, N=2, chunk_size=4, D="HP", z=False,
              dt_mode="raw", dt_limit=(0.0, math.inf), padding=1, has_initial_state="mixed",
              dtype=np.float32))                   # not multiples of the chunk, empty, padding
def test_recurrent_and_chunked_agree(case):
    case = dict(case)
    rng = np.random.default_rng(case.pop("seed"))
    chunk_size = case.pop("chunk_size")
    inp = make_ssd_inputs(rng, **case)
    y, pool = _assert_forms_agree(inp, chunk_size)
    assert y.dtype == np.float64 and y.shape == inp["x"].shape
    assert pool.shape == inp["ssm_states"].shape


def test_chunked_survives_decays_that_would_overflow_if_factored(rng):
    # dt' ~ 10 and A = -16: the chunk cumsum reaches ~ -10000, so exp(-cum_j) would be inf
    inp = make_ssd_inputs(rng, seqlens=[70], H=2, P=2, N=3, dt_mode="raw", has_initial_state=True)
    inp["dt"] = np.full_like(inp["dt"], 10.0)
    inp["A"] = np.full_like(inp["A"], -16.0)
    cum = np.cumsum(10.0 * -16.0 * np.ones(64))
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.exp(-cum[-1]))   # the factored form really would overflow
    _assert_forms_agree(inp, chunk_size=64)


@pytest.mark.parametrize("chunk_size", [1, 3, 16, 64])
def test_chunk_size_does_not_change_the_result(rng, chunk_size):
    inp = make_ssd_inputs(rng, seqlens=[37, 5], H=2, P=3, N=4, z=True)
    y_r, p_r = ssd_recurrent(**inp)
    y_c, p_c = ssd_chunked(**inp, chunk_size=chunk_size)
    assert rel_fro(y_c, y_r) <= TOL and rel_fro(p_c, p_r) <= TOL


# ----------------------------------------------------------------------------- properties

@pytest.mark.parametrize("form", [ssd_recurrent, ssd_chunked])
def test_ragged_batch_equals_separate_calls(rng, form):
    inp = make_ssd_inputs(rng, seqlens=[6, 0, 2, 11], H=2, P=2, N=3, padding=1, z=True)
    y, pool = form(**inp)
    cu = inp["cu_seqlens"]
    per_token = ("x", "dt", "B", "C", "z")
    for s in range(4):
        y1, pool1 = form(**one_sequence(inp, s, per_token))
        assert rel_fro(y1, y[cu[s]:cu[s + 1]]) <= TOL
        slot = inp["state_indices"][s]
        if slot >= 0:
            assert rel_fro(pool1[slot], pool[slot]) <= TOL


@pytest.mark.parametrize("split", [0, 1, 5, 8, 13])
def test_prefill_in_two_pieces_equals_one(rng, split):
    inp = make_ssd_inputs(rng, seqlens=[13], H=2, P=2, N=3, D="HP", z=True)
    y, pool = ssd_chunked(**inp, chunk_size=4)
    per_token = ("x", "dt", "B", "C", "z")
    y_a, pool_a = ssd_chunked(**token_range(inp, 0, split, per_token), chunk_size=4)
    second = dict(token_range(inp, split, 13, per_token), ssm_states=pool_a,
                  has_initial_state=np.array([True]))
    y_b, pool_b = ssd_chunked(**second, chunk_size=4)
    assert rel_fro(np.concatenate([y_a, y_b]), y) <= TOL
    assert rel_fro(pool_b, pool) <= TOL


@pytest.mark.parametrize("T", [1, 2, 5])
def test_multi_token_decode_equals_repeated_single_token(rng, T):
    inp = make_ssd_decode_inputs(rng, num_seqs=4, T=T, H=4, P=2, N=3, G=2, padding=1, z=True)
    y, pool = ssd_decode(**inp)
    step_pool = inp["ssm_states"]
    for t in range(T):
        step = dict(inp, ssm_states=step_pool,
                    **{k: inp[k][:, t] for k in ("x", "dt", "B", "C", "z")})
        y_t, step_pool = ssd_decode(**step)
        assert y_t.shape == (4, 4, 2)
        assert rel_fro(y_t, y[:, t]) <= TOL
    assert rel_fro(step_pool, pool) <= TOL


@pytest.mark.parametrize("T", [None, 1, 3])
def test_decode_equals_prefill_continuing_from_pool(rng, T):
    inp = make_ssd_decode_inputs(rng, num_seqs=3, T=T, H=2, P=3, N=2, padding=1, D="HP", z=True)
    y, pool = ssd_decode(**inp)
    Tn = 1 if T is None else T
    flat = {k: inp[k].reshape((3 * Tn,) + inp[k].shape[(1 if T is None else 2):])
            for k in ("x", "dt", "B", "C", "z")}
    y_p, pool_p = ssd_recurrent(**flat, A=inp["A"], D=inp["D"], dt_bias=inp["dt_bias"],
                                dt_softplus=inp["dt_softplus"], dt_limit=inp["dt_limit"],
                                cu_seqlens=cu_seqlens_from_lengths([Tn] * 3),
                                ssm_states=inp["ssm_states"], state_indices=inp["state_indices"],
                                has_initial_state=np.ones(3, bool))
    assert y.shape == inp["x"].shape
    assert rel_fro(y, y_p.reshape(y.shape)) <= TOL
    assert rel_fro(pool, pool_p) <= TOL


@pytest.mark.parametrize("form", ["recurrent", "chunked", "decode"])
def test_groups_equal_repeating_B_C_per_head(rng, form):
    H, G = 6, 2
    if form == "decode":
        inp = make_ssd_decode_inputs(rng, num_seqs=3, T=2, H=H, P=2, N=3, G=G)
        fn = ssd_decode
    else:
        inp = make_ssd_inputs(rng, seqlens=[7, 4], H=H, P=2, N=3, G=G)
        fn = ssd_recurrent if form == "recurrent" else (lambda **kw: ssd_chunked(**kw, chunk_size=3))
    y, pool = fn(**inp)
    # head h reads group h // (H // G): repeat each group H // G times along the group axis
    rep = {k: np.repeat(inp[k], H // G, axis=-2) for k in ("B", "C")}
    y_h, pool_h = fn(**dict(inp, **rep))
    assert rel_fro(y_h, y) <= TOL and rel_fro(pool_h, pool) <= TOL
    # a different assignment (groups interleaved) must give a different answer
    tiled = {k: np.tile(inp[k], (1,) * (inp[k].ndim - 2) + (H // G, 1)) for k in ("B", "C")}
    y_t, _ = fn(**dict(inp, **tiled))
    assert rel_fro(y_t, y) > 1e-3


@pytest.mark.parametrize("form", ["recurrent", "chunked", "decode"])
def test_padding_and_unnamed_slots_untouched(rng, form):
    if form == "decode":
        inp = make_ssd_decode_inputs(rng, num_seqs=4, T=2, H=2, P=2, N=2, padding=2, slots=9)
        y, pool = ssd_decode(**inp)
    else:
        inp = make_ssd_inputs(rng, seqlens=[3, 4, 0, 2], H=2, P=2, N=2, padding=2, slots=9)
        fn = ssd_recurrent if form == "recurrent" else ssd_chunked
        y, pool = fn(**inp)
    assert assert_padding_outputs_zero(y, inp) == 2
    assert_pool_hygiene(pool, inp, pool_name="ssm_states")    # bit-identical unnamed slots


def test_empty_sequence_writes_its_initial_state(rng):
    inp = make_ssd_inputs(rng, seqlens=[0, 0], H=2, P=2, N=2)
    inp["has_initial_state"] = np.array([True, False])
    for fn in (ssd_recurrent, ssd_chunked):
        _, pool = fn(**inp)
        a, b = inp["state_indices"]
        np.testing.assert_array_equal(pool[a], inp["ssm_states"][a])
        np.testing.assert_array_equal(pool[b], 0.0)


@pytest.mark.parametrize("form", ["recurrent", "chunked", "decode"])
def test_references_never_modify_inputs(rng, form):
    if form == "decode":
        inp = make_ssd_decode_inputs(rng, num_seqs=3, T=2, H=2, P=2, N=2, z=True, D="HP")
        fn = ssd_decode
    else:
        inp = make_ssd_inputs(rng, seqlens=[4, 2], H=2, P=2, N=2, z=True, D="HP")
        fn = ssd_recurrent if form == "recurrent" else ssd_chunked
    before = array_snapshot(inp)
    fn(**inp)
    assert_arrays_unchanged(inp, before)


def test_bf16_inputs_accepted_and_exact_in_float64(rng):
    inp = make_ssd_inputs(rng, seqlens=[6, 3], H=2, P=2, N=3, z=True,
                          dtype=ml_dtypes.bfloat16, pool_dtype=ml_dtypes.bfloat16)
    assert inp["x"].dtype == ml_dtypes.bfloat16 and inp["ssm_states"].dtype == ml_dtypes.bfloat16
    assert_reads_bf16_exactly(lambda **kw: ssd_chunked(**kw, chunk_size=4), inp)


def test_raw_dt_mode_equals_softplus_mode_on_the_same_dt(rng):
    inp = make_ssd_inputs(rng, seqlens=[5], H=2, P=2, N=2)
    assert inp["dt_softplus"] and inp["dt_bias"] is not None
    y, pool = ssd_recurrent(**inp)
    pre = softplus(inp["dt"].astype(np.float64) + inp["dt_bias"])
    y2, pool2 = ssd_recurrent(**dict(inp, dt=pre, dt_bias=None, dt_softplus=False))
    assert rel_fro(y2, y) <= 1e-15 and rel_fro(pool2, pool) <= 1e-15


def test_bad_arguments_raise_naming_the_argument(rng):
    inp = make_ssd_inputs(rng, seqlens=[3], H=4, P=2, N=2, G=2)
    with pytest.raises(ValueError, match="chunk_size"):
        ssd_chunked(**inp, chunk_size=0)
    with pytest.raises(ValueError, match="G"):
        ssd_recurrent(**dict(inp, B=inp["B"][:, :1].repeat(3, 1), C=inp["C"][:, :1].repeat(3, 1)))
    with pytest.raises(ValueError, match="D"):
        ssd_recurrent(**dict(inp, D=np.ones(3)))
    with pytest.raises(ValueError, match="state_indices"):
        ssd_recurrent(**dict(inp, state_indices=np.array([-2], np.int32)))
    with pytest.raises(ValueError, match="ssm_states"):
        ssd_chunked(**dict(inp, ssm_states=inp["ssm_states"][:, :, :, :1]))


# ----------------------------------------------------------------------------- model shapes

@pytest.mark.slow
@pytest.mark.parametrize("name", ["mamba2-2.7b", "granite-4.0-h"])
def test_recurrent_and_chunked_agree_at_model_shape(name):
    from nki_ssm.reference.shapes import SSD_SHAPES

    s = SSD_SHAPES[name]
    rng = np.random.default_rng(11)
    # 131 = one full 128-chunk + a short one; plus T = 1 and an empty sequence
    inp = make_ssd_inputs(rng, seqlens=[131, 1, 0], H=s.H, P=s.P, N=s.N, G=s.G, z=True,
                          padding=0, has_initial_state=True)
    _assert_forms_agree(inp, chunk_size=128)
