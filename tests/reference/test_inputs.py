"""Input generators, metrics and the model-shapes table."""

from __future__ import annotations

import inspect
import math

import ml_dtypes
import numpy as np
import pytest

from nki_ssm.reference import inputs as I
from nki_ssm.reference import shapes
from nki_ssm.reference.gated_delta import (gated_delta_chunked, gated_delta_decode,
                                           gated_delta_recurrent)
from nki_ssm.reference.mamba2_ssd import ssd_chunked, ssd_decode, ssd_dt, ssd_recurrent
from nki_ssm.reference.metrics import abs_max, max_abs_scaled, rel_fro
from nki_ssm.reference.short_conv import short_conv_decode, short_conv_recurrent
from nki_ssm.reference.testing import assert_forms_agree


# ----------------------------------------------------------------------------- ragged helpers

def test_cu_seqlens_round_trip_with_empty_sequences():
    cu = I.cu_seqlens_from_lengths([3, 0, 5, 0])
    assert cu.dtype == np.int32
    np.testing.assert_array_equal(cu, [0, 3, 3, 8, 8])
    assert I.seqlens_from_cu(cu) == [3, 0, 5, 0]
    with pytest.raises(ValueError, match="lengths"):
        I.cu_seqlens_from_lengths([2, -1])


def test_random_cu_seqlens_bounds(rng):
    cu = I.random_cu_seqlens(rng, 50, 7, min_len=2)
    lengths = np.diff(cu)
    assert cu.dtype == np.int32 and cu[0] == 0 and lengths.size == 50
    assert lengths.min() >= 2 and lengths.max() <= 7
    assert len(set(lengths.tolist())) > 1


def test_make_slots_with_fewer_slots_than_sequences(rng):
    slots, idx, _ = I.make_slots(rng, 5, 2, padding=3)
    assert slots == 2 and sorted(idx[idx >= 0].tolist()) == [0, 1] and (idx == -1).sum() == 3
    slots, idx, _ = I.make_slots(rng, 3, 0, padding=3)
    assert slots == 0 and (idx == -1).all()
    with pytest.raises(ValueError, match="slots must be >= the non-padding sequences"):
        I.make_slots(rng, 5, 2, padding=2)


def test_make_slots_distinct_padding_and_mixed_init(rng):
    slots, idx, init = I.make_slots(rng, 6, 10, padding=2)
    assert slots == 10 and idx.dtype == np.int32 and init.dtype == bool
    assert (idx == -1).sum() == 2
    named = idx[idx >= 0]
    assert len(set(named.tolist())) == 4 and named.max() < 10
    _, _, init_all = I.make_slots(rng, 64, has_initial_state="mixed")
    assert 0 < init_all.sum() < 64
    with pytest.raises(ValueError, match="slots"):
        I.make_slots(rng, 6, 5)
    with pytest.raises(ValueError, match="padding"):
        I.make_slots(rng, 2, padding=3)


# ----------------------------------------------------------------------------- generators

def _kwargs_of(fn):
    return set(inspect.signature(fn).parameters)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_short_conv_inputs_shapes_dtypes_and_ranges(rng, dtype):
    d = I.make_short_conv_inputs(rng, seqlens=[4, 0, 3], dim=5, W=4, dtype=dtype,
                                 pool_dtype=ml_dtypes.bfloat16, padding=1)
    assert set(d) <= _kwargs_of(short_conv_recurrent)
    assert d["x"].shape == (7, 5) and d["x"].dtype == dtype
    assert d["weight"].shape == (5, 4) and d["bias"].shape == (5,)
    assert d["conv_states"].shape == (6, 5, 3) and d["conv_states"].dtype == ml_dtypes.bfloat16
    assert np.abs(d["weight"].astype(np.float64)).max() <= 0.5 + 1e-3   # U(-1/sqrt(W), 1/sqrt(W))
    assert np.all(d["conv_states"].astype(np.float64) != 0)              # random, not zeros
    dd = I.make_short_conv_decode_inputs(rng, num_seqs=3, T=2, dim=5, W=3)
    assert set(dd) <= _kwargs_of(short_conv_decode) and dd["x"].shape == (3, 2, 5)
    assert I.make_short_conv_decode_inputs(rng, num_seqs=3, T=None, dim=5, W=3)["x"].shape == (3, 5)


def test_ssd_inputs_are_realistic(rng):
    d = I.make_ssd_inputs(rng, seqlens=[300, 1, 0], H=64, P=2, N=3, G=4, z=True, D="HP")
    assert set(d) <= _kwargs_of(ssd_recurrent)
    A = d["A"].astype(np.float64)
    assert A.shape == (64,) and A.min() >= -16 and A.max() <= -1 and A.max() - A.min() > 5
    dtp = ssd_dt(d["dt"], d["dt_bias"], d["dt_softplus"], d["dt_limit"])
    assert d["dt_softplus"] is True and dtp.min() > 0
    assert dtp.min() < 1e-2 and dtp.max() > 3.0           # small and large dt' both present
    assert d["B"].shape == (301, 4, 3) and d["z"].shape == (301, 64, 2) and d["D"].shape == (64, 2)
    assert d["ssm_states"].shape == (6, 64, 2, 3)
    raw = I.make_ssd_inputs(rng, seqlens=[40], H=4, P=2, N=3, dt_mode="raw", D=None)
    assert raw["dt_bias"] is None and raw["dt_softplus"] is False and raw["D"] is None
    assert raw["dt"].min() > 0
    dd = I.make_ssd_decode_inputs(rng, num_seqs=3, T=None, H=4, P=2, N=3, G=2)
    assert set(dd) <= _kwargs_of(ssd_decode)
    assert dd["x"].shape == (3, 4, 2) and dd["dt"].shape == (3, 4) and dd["B"].shape == (3, 2, 3)
    assert I.make_ssd_decode_inputs(rng, num_seqs=3, T=5, H=4, P=2, N=3)["x"].shape == (3, 5, 4, 2)
    with pytest.raises(ValueError, match="G"):
        I.make_ssd_inputs(rng, seqlens=[2], H=4, P=2, N=2, G=3)


@pytest.mark.parametrize("raw_gates", [False, True])
def test_gated_delta_inputs_are_realistic(rng, raw_gates):
    d = I.make_gated_delta_inputs(rng, seqlens=[200, 0, 3], H=2, HV=4, K=8, V=5,
                                  raw_gates=raw_gates)
    assert set(d) <= _kwargs_of(gated_delta_recurrent)
    assert d["q"].shape == (203, 2, 8) and d["v"].shape == (203, 4, 5)
    assert d["ssm_states"].shape == (6, 4, 8, 5)
    np.testing.assert_allclose(np.linalg.norm(d["k"].astype(np.float64), axis=-1), 1.0, rtol=1e-6)
    if raw_gates:
        assert d["g"] is None and d["beta"] is None
        decay = np.exp(d["A_log"].astype(np.float64))
        assert decay.min() >= 1 and decay.max() <= 16
        g = -decay * I.softplus(d["a"].astype(np.float64) + d["dt_bias"])
    else:
        assert d["a"] is None and d["A_log"] is None
        g = d["g"].astype(np.float64)
        beta = d["beta"].astype(np.float64)
        assert beta.min() > 0 and beta.max() < 1
    assert g.max() < 0 and g.min() < -5               # realistic: strong decays occur
    l2 = I.make_gated_delta_inputs(rng, seqlens=[5], H=1, HV=1, K=4, V=2, use_qk_l2norm=True)
    assert l2["use_qk_l2norm"] is True
    assert np.abs(np.linalg.norm(l2["k"].astype(np.float64), axis=-1) - 1).max() > 1e-2
    dd = I.make_gated_delta_decode_inputs(rng, num_seqs=3, T=2, H=2, HV=4, K=8, V=5)
    assert set(dd) <= _kwargs_of(gated_delta_decode) and dd["q"].shape == (3, 2, 2, 8)


# ----------------------------------------------------------------------------- gate patterns

def _pattern_positions(cu):
    cu = np.asarray(cu)
    return np.concatenate([np.arange(n) for n in np.diff(cu)] or [np.zeros(0, int)])


@pytest.mark.parametrize("raw_gates", [False, True])
def test_gdn_strong_then_weak_gates(rng, raw_gates):
    d = I.make_gated_delta_inputs(rng, seqlens=[40, 0, 23], H=1, HV=3, K=4, V=2,
                                  raw_gates=raw_gates, gate_pattern="strong_then_weak")
    if raw_gates:
        g = -np.exp(d["A_log"].astype(np.float64)) * I.softplus(
            d["a"].astype(np.float64) + d["dt_bias"].astype(np.float64))
    else:
        g = d["g"].astype(np.float64)
    strong = I.strong_decay_tokens(_pattern_positions(d["cu_seqlens"]))
    assert strong.sum() == 3 * 8 + (8 + 7) and strong[:8].all() and not strong[8:16].any()
    assert strong[40:48].all()                       # blocks restart at each sequence
    assert g[strong].max() < -2.0 and g[strong].min() >= -16 * 5.01
    assert g[~strong].min() > -16 * 2.5e-3 and g[~strong].max() < 0
    dd = I.make_gated_delta_decode_inputs(rng, num_seqs=2, T=10, H=1, HV=2, K=4, V=2,
                                          gate_pattern="strong_then_weak")
    gd = dd["g"].astype(np.float64)
    assert gd[:, :8].max() < -2.0 and gd[:, 8:].min() > -0.05


@pytest.mark.parametrize("dt_mode", ["softplus", "raw"])
def test_ssd_strong_then_weak_dt(rng, dt_mode):
    d = I.make_ssd_inputs(rng, seqlens=[33, 20], H=3, P=2, N=2, dt_mode=dt_mode,
                          gate_pattern="strong_then_weak")
    dtp = ssd_dt(d["dt"], d["dt_bias"], d["dt_softplus"], d["dt_limit"])
    strong = I.strong_decay_tokens(_pattern_positions(d["cu_seqlens"]))
    assert dtp[strong].min() > 0.99 and dtp[strong].max() < 4.01
    assert dtp[~strong].min() > 0.99e-4 and dtp[~strong].max() < 1.01e-3
    dd = I.make_ssd_decode_inputs(rng, num_seqs=2, T=12, H=2, P=2, N=2,
                                  gate_pattern="strong_then_weak")
    dtd = ssd_dt(dd["dt"], dd["dt_bias"], dd["dt_softplus"], dd["dt_limit"])
    assert dtd[:, :8].min() > 0.99 and dtd[:, 8:].max() < 1.01e-3


def test_strong_then_weak_keeps_the_float64_forms_in_agreement(rng):
    """The pattern is hard on float32 kernels, not on the float64 references."""
    gdn = I.make_gated_delta_inputs(rng, seqlens=[150, 37], H=1, HV=2, K=8, V=4,
                                    gate_pattern="strong_then_weak")
    for chunk in (16, 64, 128):
        assert_forms_agree(gated_delta_recurrent,
                           lambda **kw: gated_delta_chunked(**kw, chunk_size=chunk), gdn)
    ssd = I.make_ssd_inputs(rng, seqlens=[150, 37], H=2, P=4, N=8,
                            gate_pattern="strong_then_weak")
    for chunk in (16, 128):
        assert_forms_agree(ssd_recurrent, lambda **kw: ssd_chunked(**kw, chunk_size=chunk), ssd)


def test_realistic_is_the_default_gate_pattern():
    for make, shape in ((I.make_gated_delta_inputs, dict(seqlens=[9, 4], H=1, HV=2, K=4, V=2)),
                        (I.make_ssd_inputs, dict(seqlens=[9, 4], H=2, P=2, N=2))):
        a = make(np.random.default_rng(3), **shape)
        b = make(np.random.default_rng(3), **shape, gate_pattern="realistic")
        for k, v in a.items():
            if isinstance(v, np.ndarray):
                np.testing.assert_array_equal(v, b[k], err_msg=k)
    with pytest.raises(ValueError, match="gate_pattern must be one of"):
        I.make_ssd_decode_inputs(np.random.default_rng(0), num_seqs=1, H=1, P=1, N=1,
                                 gate_pattern="weak")


def test_generators_are_deterministic_given_the_seed():
    a = I.make_ssd_inputs(np.random.default_rng(7), seqlens=[4, 2], H=2, P=2, N=2)
    b = I.make_ssd_inputs(np.random.default_rng(7), seqlens=[4, 2], H=2, P=2, N=2)
    for k, v in a.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, b[k], err_msg=k)


def test_bad_generator_arguments(rng):
    with pytest.raises(TypeError, match="seqlens"):
        I.make_short_conv_inputs(rng, seqlens=5, dim=2, W=3)
    with pytest.raises(ValueError, match="W"):
        I.make_short_conv_inputs(rng, seqlens=[5], dim=2, W=1)
    with pytest.raises(ValueError, match="dt_mode"):
        I.make_ssd_inputs(rng, seqlens=[2], H=2, P=2, N=2, dt_mode="exp")
    with pytest.raises(ValueError, match="HV"):
        I.make_gated_delta_inputs(rng, seqlens=[2], H=2, HV=3, K=2, V=2)


# ----------------------------------------------------------------------------- metrics

def test_rel_fro_and_max_abs_scaled_values():
    ref = np.array([3.0, 4.0])
    assert rel_fro(np.array([3.0, 4.0]), ref) == 0.0
    assert math.isclose(rel_fro(np.array([3.0, 5.0]), ref), 1.0 / 5.0, rel_tol=1e-15)
    assert math.isclose(max_abs_scaled(np.array([3.0, 5.0]), ref), 1.0 / 4.0, rel_tol=1e-15)
    assert abs_max(np.array([3.0, 5.5]), ref) == 1.5


def test_metric_conventions_zero_nan_shape_bf16():
    z = np.zeros(3)
    assert rel_fro(z, z) == 0.0 and max_abs_scaled(z, z) == 0.0
    assert rel_fro(np.ones(3), z) == math.inf and max_abs_scaled(np.ones(3), z) == math.inf
    assert rel_fro(np.zeros((0, 4)), np.zeros((0, 4))) == 0.0
    assert math.isnan(rel_fro(np.array([np.nan, 1.0]), np.ones(2)))
    assert math.isnan(max_abs_scaled(np.ones(2), np.array([1.0, np.nan])))
    with pytest.raises(ValueError, match="shape"):
        rel_fro(np.ones((2, 3)), np.ones((3, 2)))
    # bf16 actual is widened exactly: 1 + 2^-7 is representable in bf16
    a = np.array([1.0 + 2 ** -7], dtype=ml_dtypes.bfloat16)
    assert rel_fro(a, np.array([1.0])) == 2 ** -7


# ----------------------------------------------------------------------------- shapes

def test_model_shapes_match_design():
    m = shapes.SSD_SHAPES["mamba2-2.7b"]
    assert (m.H, m.P, m.N, m.G, m.conv_dim, m.W) == (80, 64, 128, 1, 5376, 4)
    g = shapes.SSD_SHAPES["granite-4.0-h"]
    assert (g.H, g.P, g.N, g.G) == (128, 64, 128, 8)
    assert shapes.SSD_SHAPES["falcon-h1"].N == 256
    q = shapes.GDN_SHAPES["qwen3-next"]
    assert (q.H, q.HV, q.K, q.V, q.conv_dim) == (16, 32, 128, 128, 8192)
    for tp in (2, 4, 8):
        s = shapes.GDN_SHAPES[f"qwen3-next-tp{tp}"]
        assert (s.H, s.HV, s.tp, s.conv_dim) == (16 // tp, 32 // tp, tp, 8192 // tp)
    assert shapes.CONV_SHAPES["qwen3-next"].dim == 8192
    assert shapes.SEQ_LENS == (1, 128, 2048, 16384, 65536)
    assert max(shapes.DECODE_BATCHES) == 512 and min(shapes.DECODE_BATCHES) == 1
    with pytest.raises(ValueError, match="tp"):
        shapes.gdn_tp_shard(q, 3)


def test_pools_are_drawn_slot_by_slot_with_the_same_values():
    """A pool drawn one slot at a time (no float64 copy of the whole pool) holds the values
    of one draw of the whole shape."""
    import ml_dtypes

    from nki_ssm.reference.inputs import _cast, _pool

    for dtype in (np.float32, ml_dtypes.bfloat16):
        whole = _cast(0.5 * np.random.default_rng(3).standard_normal((5, 3, 4)), dtype)
        by_slot = _pool(np.random.default_rng(3), (5, 3, 4), 0.5, dtype)
        assert by_slot.dtype == whole.dtype
        np.testing.assert_array_equal(by_slot.view(np.uint8), whole.view(np.uint8))
