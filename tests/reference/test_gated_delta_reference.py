"""Float64 gated delta rule references: recurrent vs chunked, and the properties of
the op (ragged batches, pool continuation, decode, GQA, pool hygiene)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from nki_ssm.reference.gated_delta import (
    gated_delta_chunked,
    gated_delta_decode,
    gated_delta_recurrent,
)
from nki_ssm.reference.inputs import (
    make_gated_delta_decode_inputs,
    make_gated_delta_inputs,
    sigmoid,
    softplus,
)
from nki_ssm.reference.metrics import rel_fro
from nki_ssm.reference.testing import FORMS_TOL as TOL
from nki_ssm.reference.testing import (
    array_snapshot,
    assert_arrays_unchanged,
    assert_forms_agree,
    assert_pool_hygiene,
    named_slots,
    one_sequence,
    token_range,
    unnamed_slots,
)


def _assert_forms_agree(inp, chunk_size):
    return assert_forms_agree(
        gated_delta_recurrent, lambda **kw: gated_delta_chunked(**kw, chunk_size=chunk_size), inp)


# ----------------------------------------------------------------------------- recurrent vs chunked

_CHUNKS = st.sampled_from([16, 32, 64]) | st.integers(1, 40)


@st.composite
def gdn_cases(draw):
    H = draw(st.sampled_from([1, 2]))
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)),
        # 0 and 1 drawn often on purpose: empty sequences and T = 1 are the corner cases
        seqlens=draw(st.lists(st.sampled_from([0, 1]) | st.integers(0, 80),
                              min_size=1, max_size=4)),
        H=H, HV=H * draw(st.sampled_from([1, 2, 3])),
        K=draw(st.integers(1, 8)), V=draw(st.integers(1, 8)),
        chunk_size=draw(_CHUNKS),
        raw_gates=draw(st.booleans()),
        use_qk_l2norm=draw(st.booleans()),
        pad=draw(st.integers(0, 4)),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=gdn_cases())
# the required corner cases, always run
@example(case=dict(seed=1, seqlens=[1], H=1, HV=1, K=4, V=3, chunk_size=64, raw_gates=False,
                   use_qk_l2norm=False, pad=0))                       # T = 1
@example(case=dict(seed=2, seqlens=[0, 70, 0, 1], H=2, HV=4, K=5, V=6, chunk_size=16,
                   raw_gates=True, use_qk_l2norm=True, pad=1))        # empty, padding, ragged
@example(case=dict(seed=3, seqlens=[65, 129], H=1, HV=2, K=8, V=8, chunk_size=64,
                   raw_gates=True, use_qk_l2norm=False, pad=0))       # not multiples of 64
@example(case=dict(seed=4, seqlens=[33, 17, 50], H=2, HV=2, K=3, V=7, chunk_size=7,
                   raw_gates=False, use_qk_l2norm=True, pad=2))       # odd chunk, two padded
def test_recurrent_matches_chunked(case):
    rng = np.random.default_rng(case["seed"])
    pad = min(case["pad"], len(case["seqlens"]))
    inp = make_gated_delta_inputs(
        rng, seqlens=case["seqlens"], H=case["H"], HV=case["HV"], K=case["K"], V=case["V"],
        raw_gates=case["raw_gates"], use_qk_l2norm=case["use_qk_l2norm"], padding=pad)
    _assert_forms_agree(inp, case["chunk_size"])
    lengths = case["seqlens"]
    event(f"chunk boundary crossed: {max(lengths) > case['chunk_size']}")
    event(f"length not a multiple of chunk: {any(n % case['chunk_size'] for n in lengths)}")
    event(f"T=1 present: {1 in lengths}; empty present: {0 in lengths}; padded: {pad > 0}")
    event(f"several sequences: {len(lengths) > 1}; GQA: {case['HV'] > case['H']}")


def test_chunked_state_solve_blocks_and_odd_chunks():
    """Chunks larger than the 16-row solve block, non-multiples of 16, and a long tail."""
    rng = np.random.default_rng(11)
    inp = make_gated_delta_inputs(rng, seqlens=[150, 3, 97], H=2, HV=4, K=6, V=5, padding=0,
                                  raw_gates=True, use_qk_l2norm=True)
    for cs in (5, 16, 24, 33, 48, 64, 100, 128, 256):
        _assert_forms_agree(inp, cs)


def test_realistic_gates_long_sequence_stays_finite():
    """exp(A_log) in [1, 16], L2-normalised keys, 300+ tokens: the factored decay
    exp(c_i) * exp(-c_j) would overflow here; the masked form must not."""
    rng = np.random.default_rng(5)
    inp = make_gated_delta_inputs(rng, seqlens=[333, 301], H=2, HV=4, K=16, V=16,
                                  raw_gates=True, use_qk_l2norm=True, has_initial_state=True)
    g = -np.exp(inp["A_log"].astype(np.float64)) * softplus(
        inp["a"].astype(np.float64) + inp["dt_bias"].astype(np.float64))
    c = np.cumsum(g[:64], axis=0)  # the first chunk's log decay
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(-c)).any(), "inputs too mild to exercise the overflow guard"
    o_r, p_r = _assert_forms_agree(inp, 64)
    assert np.linalg.norm(o_r) > 0 and np.all(np.isfinite(o_r))


@pytest.mark.slow
def test_recurrent_matches_chunked_at_qwen3_next_shape():
    """Qwen3-Next TP1 heads (H 16, HV 32, K = V = 128), realistic raw gates, ragged
    lengths across chunk boundaries; ~1000 tokens (a few seconds)."""
    rng = np.random.default_rng(18)
    inp = make_gated_delta_inputs(rng, seqlens=[700, 1, 0, 300], H=16, HV=32, K=128, V=128,
                                  raw_gates=True, use_qk_l2norm=True, padding=1)
    _assert_forms_agree(inp, 64)


# ----------------------------------------------------------------------------- gates

@pytest.mark.parametrize("fn", [gated_delta_recurrent, gated_delta_chunked])
def test_raw_gates_equal_precomputed_gates(fn):
    rng = np.random.default_rng(6)
    raw = make_gated_delta_inputs(rng, seqlens=[20, 0, 45], H=2, HV=4, K=4, V=3,
                                  raw_gates=True, dtype=np.float64)
    f64 = {n: raw[n].astype(np.float64) for n in ("a", "b", "A_log", "dt_bias")}
    pre = dict(raw, a=None, b=None, A_log=None, dt_bias=None,
               g=-np.exp(f64["A_log"]) * softplus(f64["a"] + f64["dt_bias"]),
               beta=sigmoid(f64["b"]))
    o1, p1 = fn(**raw)
    o2, p2 = fn(**pre)
    assert rel_fro(o1, o2) <= 1e-13
    assert rel_fro(p1, p2) <= 1e-13


# ----------------------------------------------------------------------------- properties

def _prefill_fns():
    return [gated_delta_recurrent, lambda **kw: gated_delta_chunked(**kw, chunk_size=16)]


@pytest.mark.parametrize("fn", _prefill_fns(), ids=["recurrent", "chunked"])
def test_ragged_equals_separate_calls(fn):
    rng = np.random.default_rng(7)
    lengths = [23, 0, 40, 1, 17]
    inp = make_gated_delta_inputs(rng, seqlens=lengths, H=1, HV=2, K=4, V=5, padding=1)
    o_all, p_all = fn(**inp)
    cu = inp["cu_seqlens"]
    pool = inp["ssm_states"]
    for n in range(len(lengths)):
        s, e = int(cu[n]), int(cu[n + 1])
        one = dict(one_sequence(inp, n, ("q", "k", "v", "g", "beta")), ssm_states=pool)
        o_n, pool = fn(**one)
        np.testing.assert_array_equal(o_n, o_all[s:e])
    np.testing.assert_array_equal(pool, p_all)


@pytest.mark.parametrize("fn,tol", [(gated_delta_recurrent, 1e-14),
                                    (lambda **kw: gated_delta_chunked(**kw, chunk_size=16),
                                     TOL)], ids=["recurrent", "chunked"])
@pytest.mark.parametrize("split", [1, 16, 37, 59])
def test_prefill_in_two_pieces_through_pool(fn, tol, split):
    rng = np.random.default_rng(8)
    L = 60
    inp = make_gated_delta_inputs(rng, seqlens=[L], H=2, HV=2, K=5, V=4,
                                  has_initial_state=[False], raw_gates=True)
    o_one, p_one = fn(**inp)
    tok = ("q", "k", "v", "a", "b")
    o1, pool = fn(**token_range(inp, 0, split, tok))
    second = dict(token_range(inp, split, L, tok), ssm_states=pool,
                  has_initial_state=np.array([True]))
    o2, pool = fn(**second)
    assert rel_fro(np.concatenate([o1, o2]), o_one) <= tol
    assert rel_fro(pool, p_one) <= tol


def _decode_inputs(seed, T, padding=1, **kw):
    rng = np.random.default_rng(seed)
    return make_gated_delta_decode_inputs(rng, num_seqs=4, T=T, H=2, HV=4, K=4, V=3,
                                          padding=padding, **kw)


def _step(inp, t, pool):
    """The decode inputs of token t alone (T = 1), continuing from ``pool``."""
    per_tok = ("q", "k", "v", "g", "beta", "a", "b")
    return dict(inp, ssm_states=pool,
                **{n: inp[n][:, t:t + 1] for n in per_tok if inp[n] is not None})


@pytest.mark.parametrize("raw_gates", [False, True])
def test_multi_token_decode_equals_repeated_single_token(raw_gates):
    inp = _decode_inputs(9, T=5, raw_gates=raw_gates, use_qk_l2norm=raw_gates)
    o_all, p_all, inter = gated_delta_decode(**inp, return_intermediate_states=True)
    pool = inp["ssm_states"]
    for t in range(5):
        o_t, pool = gated_delta_decode(**_step(inp, t, pool))
        assert rel_fro(o_t[:, 0], o_all[:, t]) <= 1e-14
        # the state after token t, step by step, equals the returned intermediate state
        for n, s in enumerate(inp["state_indices"]):
            if s >= 0:
                assert rel_fro(inter[n, t], pool[s]) <= 1e-14
    assert rel_fro(pool, p_all) <= 1e-14
    pad = inp["state_indices"] < 0
    assert pad.any() and not inter[pad].any() and not o_all[pad].any()
    np.testing.assert_array_equal(inter[~pad][:, -1], p_all[inp["state_indices"][~pad]])


def test_decode_without_intermediate_returns_pair():
    inp = _decode_inputs(10, T=2)
    res = gated_delta_decode(**inp)
    assert len(res) == 2
    o3, p3, _ = gated_delta_decode(**inp, return_intermediate_states=True)
    np.testing.assert_array_equal(res[0], o3)
    np.testing.assert_array_equal(res[1], p3)


@pytest.mark.parametrize("fn,tol", [(gated_delta_recurrent, 1e-14),
                                    (lambda **kw: gated_delta_chunked(**kw, chunk_size=2),
                                     TOL)], ids=["recurrent", "chunked"])
def test_decode_equals_prefill_continuation(fn, tol):
    T = 3
    inp = _decode_inputs(12, T=T)
    o_d, p_d = gated_delta_decode(**inp)
    flat = {n: inp[n].reshape((-1,) + inp[n].shape[2:])
            for n in ("q", "k", "v", "g", "beta")}
    o_p, p_p = fn(**flat, scale=None, use_qk_l2norm=False, ssm_states=inp["ssm_states"],
                  state_indices=inp["state_indices"], cu_seqlens=np.arange(5, dtype=np.int32) * T,
                  has_initial_state=np.ones(4, bool))
    assert rel_fro(o_p.reshape(o_d.shape), o_d) <= tol
    assert rel_fro(p_p, p_d) <= tol


@pytest.mark.parametrize("fn", _prefill_fns() + [gated_delta_decode],
                         ids=["recurrent", "chunked", "decode"])
def test_gqa_equals_repeated_qk_heads(fn):
    rng = np.random.default_rng(13)
    if fn is gated_delta_decode:
        inp = make_gated_delta_decode_inputs(rng, num_seqs=3, T=4, H=2, HV=6, K=4, V=3,
                                             use_qk_l2norm=True)
        axis = 2
    else:
        inp = make_gated_delta_inputs(rng, seqlens=[19, 30], H=2, HV=6, K=4, V=3,
                                      use_qk_l2norm=True)
        axis = 1
    o1, p1 = fn(**inp)[:2]
    # value head hv reads q/k head hv // 3: repeat each q/k head 3 times, consecutively
    rep = dict(inp, q=np.repeat(inp["q"], 3, axis=axis), k=np.repeat(inp["k"], 3, axis=axis))
    o2, p2 = fn(**rep)[:2]
    assert rel_fro(o1, o2) <= 1e-14
    assert rel_fro(p1, p2) <= 1e-14


def _all_fns():
    return [
        ("recurrent", gated_delta_recurrent, False),
        ("chunked", lambda **kw: gated_delta_chunked(**kw, chunk_size=8), False),
        ("decode", lambda **kw: gated_delta_decode(**kw, return_intermediate_states=True), True),
    ]


@pytest.mark.parametrize("name,fn,decode", _all_fns(), ids=[f[0] for f in _all_fns()])
@pytest.mark.parametrize("pool_dtype", [np.float32, ml_dtypes.bfloat16])
def test_unnamed_slots_identical_and_inputs_unmodified(name, fn, decode, pool_dtype):
    rng = np.random.default_rng(14)
    if decode:
        inp = make_gated_delta_decode_inputs(rng, num_seqs=3, T=3, H=1, HV=2, K=3, V=4,
                                             slots=7, padding=1, pool_dtype=pool_dtype,
                                             dtype=ml_dtypes.bfloat16)
    else:
        inp = make_gated_delta_inputs(rng, seqlens=[9, 0, 14], H=1, HV=2, K=3, V=4, slots=7,
                                      padding=1, pool_dtype=pool_dtype, raw_gates=True,
                                      dtype=ml_dtypes.bfloat16)
    before = array_snapshot(inp)
    out = fn(**inp)
    pool_out = out[1]
    assert_arrays_unchanged(inp, before)
    assert all(r.dtype == np.float64 for r in out)
    assert not np.shares_memory(pool_out, inp["ssm_states"])
    assert len(unnamed_slots(inp["state_indices"], 7)) >= 4
    assert_pool_hygiene(pool_out, inp, pool_name="ssm_states", every_named=True)


def test_has_initial_state_false_ignores_pool_contents():
    rng = np.random.default_rng(15)
    inp = make_gated_delta_inputs(rng, seqlens=[12, 0], H=1, HV=1, K=3, V=3, padding=0,
                                  has_initial_state=False)
    zero_pool = np.zeros_like(inp["ssm_states"])
    for fn in (gated_delta_recurrent, gated_delta_chunked):
        o1, p1 = fn(**inp)
        o2, p2 = fn(**dict(inp, ssm_states=zero_pool))
        np.testing.assert_array_equal(o1, o2)
        named = named_slots(inp["state_indices"])
        np.testing.assert_array_equal(p1[named], p2[named])
        # the empty sequence without initial state leaves the zero state in its slot
        assert not p1[int(inp["state_indices"][1])].any()


def test_single_token_against_hand_computation():
    """One token, one head, from a known state: S' = e^g S + k (beta (v - e^g S^T k))^T."""
    S = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    q = np.array([[[1.0, -1.0]]]); k = np.array([[[0.5, 0.25]]]); v = np.array([[[2.0, 1.0]]])
    g, beta = np.array([[np.log(0.5)]]), np.array([[0.5]])
    Sd = 0.5 * S[0]
    u = 0.5 * (v[0, 0] - Sd.T @ k[0, 0])
    S_new = Sd + np.outer(k[0, 0], u)
    o_exp = S_new.T @ (q[0, 0] * 2.0)
    o, pool = gated_delta_recurrent(q, k, v, g=g, beta=beta, scale=2.0,
                                    cu_seqlens=np.array([0, 1]), ssm_states=S[None],
                                    state_indices=np.array([0]), has_initial_state=[True])
    np.testing.assert_allclose(o[0, 0], o_exp, rtol=1e-15)
    np.testing.assert_allclose(pool[0, 0], S_new, rtol=1e-15)


# ----------------------------------------------------------------------------- bad input

def _base():
    return make_gated_delta_inputs(np.random.default_rng(16), seqlens=[3, 2], H=1, HV=2,
                                   K=2, V=2, padding=0)


@pytest.mark.parametrize("change,exc,words", [
    (lambda d: d.update(a=d["g"], b=d["beta"], A_log=np.zeros(2), dt_bias=np.zeros(2)),
     ValueError, "both"),
    (lambda d: d.update(g=None, beta=None), ValueError, "neither"),
    (lambda d: d.update(beta=None), ValueError, "beta"),
    (lambda d: d.update(g=np.abs(d["g"]) + 0.1), ValueError, "g must be"),
    (lambda d: d.update(g=d["g"][:, :1]), ValueError, "g must have shape"),
    (lambda d: d.update(q=np.repeat(d["q"], 2, axis=1), k=np.repeat(d["k"], 2, axis=1),
                        v=np.zeros((5, 3, 2))), ValueError, "multiple of q/k heads"),
    (lambda d: d.update(k=d["k"][:, :, :1]), ValueError, "k must have shape"),
    (lambda d: d.update(cu_seqlens=np.array([0, 3, 4], np.int32)), ValueError, "cu_seqlens[-1]"),
    (lambda d: d.update(cu_seqlens=np.array([0, 4, 3, 5], np.int32),
                        state_indices=np.array([0, 1, 2], np.int32),
                        has_initial_state=np.ones(3, bool)), ValueError, "non-decreasing"),
    (lambda d: d.update(cu_seqlens=np.array([0., 3., 5.])), TypeError, "cu_seqlens"),
    (lambda d: d.update(state_indices=np.array([0, 99], np.int32)), ValueError, "state_indices"),
    (lambda d: d.update(state_indices=np.array([1, 1], np.int32)), ValueError, "repeat"),
    (lambda d: d.update(has_initial_state=np.ones(3, bool)), ValueError, "has_initial_state"),
    (lambda d: d.update(ssm_states=np.zeros((4, 2, 2, 3))), ValueError, "ssm_states"),
    (lambda d: d.update(q=d["q"].astype(np.int32)), TypeError, "q must have a floating"),
    (lambda d: d.update(scale="x"), TypeError, "scale"),
    (lambda d: d.update(q=d["q"][None]), ValueError, "q must have shape [num_tokens, H, K]"),
])
def test_bad_input_rejected(change, exc, words):
    inp = _base()
    change(inp)
    for fn in (gated_delta_recurrent, gated_delta_chunked):
        with pytest.raises(exc, match=None) as info:
            fn(**inp)
        assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("cs", [0, -1, 2.0, True])
def test_bad_chunk_size(cs):
    with pytest.raises(ValueError, match="chunk_size"):
        gated_delta_chunked(**_base(), chunk_size=cs)


def test_decode_rejects_flat_layout():
    inp = make_gated_delta_decode_inputs(np.random.default_rng(17), num_seqs=2, T=1, H=1, HV=1,
                                         K=2, V=2)
    flat = dict(inp, q=inp["q"][:, 0], k=inp["k"][:, 0], v=inp["v"][:, 0],
                g=inp["g"][:, 0], beta=inp["beta"][:, 0])
    with pytest.raises(ValueError, match=r"q must have shape \[num_seqs, T, H, K\]"):
        gated_delta_decode(**flat)
