"""Valid host-API calls on backend="reference" against the reference functions."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_case_inputs import OPS, base, pool_name

from nki_ssm.ops._dispatch import cast_rne
from nki_ssm.reference import gated_delta as ref_gdn
from nki_ssm.reference import inputs as gen
from nki_ssm.reference import mamba2_ssd as ref_ssd
from nki_ssm.reference import short_conv as ref_conv
from nki_ssm.reference.metrics import rel_fro
from nki_ssm.reference.testing import (
    array_snapshot,
    assert_arrays_unchanged,
    assert_padding_outputs_zero,
    named_slots,
    token_range,
    unnamed_slots,
)

BF16 = ml_dtypes.bfloat16
F32 = np.float32

# The reference each op must reproduce on backend="reference".
REFERENCE = {
    "short_conv_prefill": ref_conv.short_conv_prefill,
    "short_conv_decode": ref_conv.short_conv_decode,
    "ssd_prefill": ref_ssd.ssd_chunked,
    "ssd_decode": ref_ssd.ssd_decode,
    "gated_delta_prefill": ref_gdn.gated_delta_chunked,
    "gated_delta_decode": ref_gdn.gated_delta_decode,
}


def _copy(kw):
    return {n: (a.copy() if isinstance(a, np.ndarray) else a) for n, a in kw.items()}


def _assert_pool_is_reference(pool, pool_before, ref_pool, state_indices):
    """Named slots hold the reference's new state rounded (RNE) to the pool dtype;
    unnamed slots are bit-identical to ``pool_before``. -> (named, unnamed) slots."""
    named = named_slots(state_indices)
    unnamed = unnamed_slots(state_indices, pool_before.shape[0])
    assert pool[named].tobytes() == cast_rne(ref_pool[named], pool.dtype).tobytes()
    assert pool[unnamed].tobytes() == pool_before[unnamed].tobytes()
    return named, unnamed


@pytest.mark.parametrize("dtype,pool_dtype", [(F32, F32), (BF16, BF16), (F32, BF16), (BF16, F32)],
                         ids=["f32-f32pool", "bf16-bf16pool", "f32-bf16pool", "bf16-f32pool"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_op_matches_reference_and_updates_pool_in_place(op, dtype, pool_dtype):
    kw = base(op, dtype=dtype, pool_dtype=pool_dtype)
    pool_arg = pool_name(kw)
    inputs_before = array_snapshot(kw, [n for n in kw if n != pool_arg])
    pool = kw[pool_arg]
    pool_before = pool.copy()
    ref_out, ref_pool = REFERENCE[op](**_copy(kw))[:2]

    out = OPS[op](**kw, backend="reference")

    assert out.dtype == np.dtype(dtype) and out.shape == ref_out.shape
    assert out.tobytes() == cast_rne(ref_out, dtype).tobytes()
    tol = 1e-6 if dtype is F32 else 2.0 ** -8
    assert rel_fro(out.astype(np.float64), ref_out) <= tol
    assert assert_padding_outputs_zero(out, kw) == 1   # base() pads one sequence

    # pool: same object and dtype, named slots = RNE of the reference, others bit-identical
    assert kw[pool_arg] is pool and pool.dtype == np.dtype(pool_dtype)
    named, unnamed = _assert_pool_is_reference(pool, pool_before, ref_pool, kw["state_indices"])
    assert len(named) and len(unnamed)
    assert not np.array_equal(pool[named], pool_before[named])

    assert_arrays_unchanged(kw, inputs_before)  # nothing but the pool is modified


def test_short_conv_default_activation_is_silu():
    kw = base("short_conv_prefill")
    del kw["activation"]
    y = OPS["short_conv_prefill"](**kw, backend="reference")
    kw2 = base("short_conv_prefill")
    y_ref, _ = ref_conv.short_conv_prefill(**{**kw2, "activation": "silu"})
    y_lin, _ = ref_conv.short_conv_prefill(**{**kw2, "activation": None})
    assert rel_fro(y.astype(np.float64), y_ref) <= 1e-6
    assert rel_fro(y.astype(np.float64), y_lin) > 1e-2


@pytest.mark.parametrize("op", ["short_conv_decode", "ssd_decode"])
def test_single_token_decode_form(op):
    kw = base(op, T=None)
    kw_t = base(op, T=None)
    # the same token as [num_seqs, 1, ...]
    for n in ("x", "dt", "B", "C", "z"):
        if kw_t.get(n) is not None:
            kw_t[n] = kw_t[n][:, None]
    y = OPS[op](**kw, backend="reference")
    y_t = OPS[op](**kw_t, backend="reference")
    assert y.shape == kw["x"].shape
    assert y.tobytes() == y_t[:, 0].tobytes()
    pool = pool_name(kw)
    assert kw[pool].tobytes() == kw_t[pool].tobytes()


@pytest.mark.parametrize("pool_dtype", [F32, BF16])
def test_gated_delta_decode_intermediate_states(pool_dtype):
    kw = base("gated_delta_decode", pool_dtype=pool_dtype)
    o, inter = OPS["gated_delta_decode"](**kw, return_intermediate_states=True,
                                         backend="reference")
    kw2 = base("gated_delta_decode", pool_dtype=pool_dtype)
    o2 = OPS["gated_delta_decode"](**kw2, backend="reference")
    assert o.tobytes() == o2.tobytes()
    assert inter.dtype == np.dtype(pool_dtype) and inter.shape == (3, 2, 4, 16, 8)
    idx = kw["state_indices"]
    for i in np.flatnonzero(idx >= 0):  # the last intermediate state is the new pool slot
        assert inter[i, -1].tobytes() == kw["ssm_states"][idx[i]].tobytes()


def test_ssd_prefill_matches_recurrent_ground_truth():
    kw = base("ssd_prefill")
    y_ref, pool_ref = ref_ssd.ssd_recurrent(**{n: a for n, a in _copy(kw).items()
                                               if n != "chunk_size"})
    y = OPS["ssd_prefill"](**kw, backend="reference")
    named = named_slots(kw["state_indices"])
    assert rel_fro(y.astype(np.float64), y_ref) <= 1e-6
    assert rel_fro(kw["ssm_states"][named].astype(np.float64), pool_ref[named]) <= 1e-6


@pytest.mark.parametrize("op", ["short_conv_prefill", "gated_delta_prefill", "ssd_prefill"])
def test_prefill_in_two_pieces_through_the_pool(op):
    """Pools updated in place carry a sequence across calls (float32, one sequence)."""
    seq = 21
    kw = base(op)
    # one sequence made of all tokens, starting from zeros, in slot 0
    n = kw["cu_seqlens"][-1]
    token_args = [a for a in ("x", "dt", "B", "C", "z", "q", "k", "v", "g", "beta")
                  if isinstance(kw.get(a), np.ndarray)]
    one = dict(kw, cu_seqlens=np.array([0, n], np.int32), state_indices=np.array([0], np.int32),
               has_initial_state=np.array([False]))
    pool_arg = pool_name(kw)
    one[pool_arg] = kw[pool_arg].copy()
    y_one = OPS[op](**one, backend="reference")

    two = dict(one)
    two[pool_arg] = kw[pool_arg].copy()
    cut = min(seq, n - 3)
    y1 = OPS[op](**token_range(two, 0, cut, token_args), backend="reference")
    y2 = OPS[op](**dict(token_range(two, cut, n, token_args),
                        has_initial_state=np.array([True])), backend="reference")
    y_two = np.concatenate([y1, y2]).astype(np.float64)
    assert rel_fro(y_two, y_one.astype(np.float64)) <= 1e-5
    assert rel_fro(two[pool_arg][0].astype(np.float64),
                   one[pool_arg][0].astype(np.float64)) <= 1e-5


def test_index_arrays_of_any_integer_dtype_and_pool_views():
    """int64 / uint8 index arrays are accepted; a pool that is a view is written through."""
    kw = base("short_conv_prefill")
    expected = base("short_conv_prefill")
    OPS["short_conv_prefill"](**expected, backend="reference")
    kw["cu_seqlens"] = kw["cu_seqlens"].astype(np.int64)
    si = kw["state_indices"].astype(np.int64)
    kw["state_indices"] = si
    si_before = si.copy()
    backing = np.zeros((2,) + kw["conv_states"].shape, np.float32)
    backing[1] = kw["conv_states"]
    kw["conv_states"] = backing[1]
    y = OPS["short_conv_prefill"](**kw, backend="reference")
    assert backing[1].tobytes() == expected["conv_states"].tobytes()
    assert not backing[0].any()
    assert np.array_equal(si, si_before)
    assert y.dtype == np.float32


# ---------------------------------------------------------------- varying shapes


def _check_against_reference(op, kw):
    pool_before = kw[pool_name(kw)].copy()
    ref_out, ref_pool = REFERENCE[op](**_copy(kw))[:2]
    out = OPS[op](**kw, backend="reference")
    dtype = kw["x" if "x" in kw else "q"].dtype
    assert out.dtype == dtype and out.tobytes() == cast_rne(ref_out, dtype).tobytes()
    _assert_pool_is_reference(kw[pool_name(kw)], pool_before, ref_pool, kw["state_indices"])


SHAPES = settings(max_examples=12, deadline=None)
seqlens_st = st.lists(st.integers(0, 20), min_size=1, max_size=4)
dtypes_st = st.sampled_from([F32, BF16])


@SHAPES
@given(seqlens=seqlens_st, dim=st.integers(1, 6), W=st.integers(2, 8), bias=st.booleans(),
       dtype=dtypes_st, pool_dtype=dtypes_st, seed=st.integers(0, 2 ** 16), pad=st.booleans())
def test_short_conv_prefill_any_shape(seqlens, dim, W, bias, dtype, pool_dtype, seed, pad):
    kw = gen.make_short_conv_inputs(np.random.default_rng(seed), seqlens=seqlens, dim=dim, W=W,
                                    bias=bias, dtype=dtype, pool_dtype=pool_dtype,
                                    padding=int(pad and len(seqlens) > 1))
    _check_against_reference("short_conv_prefill", kw)


@SHAPES
@given(seqlens=seqlens_st, H=st.sampled_from([1, 2, 4]), gpg=st.sampled_from([1, 2]),
       P=st.integers(1, 4), N=st.integers(1, 5), chunk=st.sampled_from([16, 32, 128]),
       dtype=dtypes_st, seed=st.integers(0, 2 ** 16), D=st.sampled_from([None, "H", "HP"]),
       z=st.booleans())
def test_ssd_prefill_any_shape(seqlens, H, gpg, P, N, chunk, dtype, seed, D, z):
    G = max(H // gpg, 1)
    kw = gen.make_ssd_inputs(np.random.default_rng(seed), seqlens=seqlens, H=H, P=P, N=N, G=G,
                             D=D, z=z, dtype=dtype, padding=int(len(seqlens) > 2))
    kw["chunk_size"] = chunk
    _check_against_reference("ssd_prefill", kw)


@SHAPES
@given(seqlens=seqlens_st, H=st.sampled_from([1, 2]), rep=st.sampled_from([1, 2]),
       K=st.integers(1, 8), V=st.integers(1, 8), raw=st.booleans(), l2=st.booleans(),
       chunk=st.sampled_from([16, 48, 64]), dtype=dtypes_st, seed=st.integers(0, 2 ** 16))
def test_gated_delta_prefill_any_shape(seqlens, H, rep, K, V, raw, l2, chunk, dtype, seed):
    kw = gen.make_gated_delta_inputs(np.random.default_rng(seed), seqlens=seqlens, H=H,
                                     HV=H * rep, K=K, V=V, raw_gates=raw, use_qk_l2norm=l2,
                                     dtype=dtype, padding=int(len(seqlens) > 2))
    kw["chunk_size"] = chunk
    _check_against_reference("gated_delta_prefill", kw)


@SHAPES
@given(num_seqs=st.integers(1, 4), T=st.integers(1, 3), family=st.sampled_from(
    ["short_conv_decode", "ssd_decode", "gated_delta_decode"]), dtype=dtypes_st,
    pool_dtype=dtypes_st, seed=st.integers(0, 2 ** 16))
def test_decode_any_shape(num_seqs, T, family, dtype, pool_dtype, seed):
    rng = np.random.default_rng(seed)
    common = dict(num_seqs=num_seqs, T=T, dtype=dtype, pool_dtype=pool_dtype,
                  padding=int(num_seqs > 1))
    if family == "short_conv_decode":
        kw = gen.make_short_conv_decode_inputs(rng, dim=3, W=4, **common)
    elif family == "ssd_decode":
        kw = gen.make_ssd_decode_inputs(rng, H=2, P=3, N=4, G=1, **common)
    else:
        kw = gen.make_gated_delta_decode_inputs(rng, H=1, HV=2, K=4, V=3, **common)
    _check_against_reference(family, kw)


def _set(**changes):
    return lambda kw: kw.update(changes)


def _cast_arg(name, dtype):
    def mutate(kw):
        kw[name] = kw[name].astype(dtype)
    return mutate


# Valid variants the validation must not reject (mixed parameter dtypes, other index dtypes,
# numpy scalars and flags, optional arguments present or absent).
ACCEPTED = [
    ("short_conv_prefill", _cast_arg("weight", BF16)),
    ("short_conv_prefill", _set(bias=None, activation=None)),
    ("short_conv_prefill", _cast_arg("cu_seqlens", np.uint16)),
    ("short_conv_decode", _cast_arg("state_indices", np.int8)),
    ("ssd_prefill", _cast_arg("dt", BF16)),
    ("ssd_prefill", _set(D=np.ones((4, 8), np.float32), z=None, dt_bias=None,
                         dt_softplus=np.bool_(False))),
    ("ssd_prefill", _set(dt_limit=np.array([0.0, 2.0]), chunk_size=np.int32(32),
                         precision="fp32")),
    ("ssd_decode", _set(dt_limit=[0.001, 0.5])),
    ("gated_delta_prefill", _set(scale=np.float32(0.5), use_qk_l2norm=True, chunk_size=48)),
    ("gated_delta_prefill", _cast_arg("beta", BF16)),
    ("gated_delta_decode", _set(scale=1)),
]


@pytest.mark.parametrize("op,mutate", ACCEPTED)
def test_accepted_variants_match_reference(op, mutate):
    kw = base(op)
    mutate(kw)
    ref_kw = _copy(kw)
    ref_kw.pop("precision", None)
    if op.startswith("ssd_prefill"):
        ref_kw["dt_limit"] = tuple(ref_kw["dt_limit"])
    ref_out, ref_pool = REFERENCE[op](**ref_kw)[:2]
    out = OPS[op](**kw, backend="reference")
    assert out.tobytes() == cast_rne(ref_out, out.dtype).tobytes()
    named = named_slots(kw["state_indices"])
    pool = kw[pool_name(kw)]
    assert pool[named].tobytes() == cast_rne(ref_pool[named], pool.dtype).tobytes()
