"""Regression tests for the hostile-caller findings of issue 9 (rows 4-8), host side.

Every call is made on every backend ("reference" and "sim") and must get
the same verdict there: the same error (type and message), or a result;
a rejected call leaves the pool's bytes as they were.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided
from ops_case_inputs import OPS, assert_pools_unchanged, base, pool_name, pool_snapshot

from nki_ssm.ops import _validate
from nki_ssm.reference import gated_delta as ref_gdn
from nki_ssm.reference import inputs as gen
from nki_ssm.reference.metrics import rel_fro

BACKENDS = ("reference", "sim")
PREFILL = ("short_conv_prefill", "ssd_prefill", "gated_delta_prefill")


def _rejected(op: str, kw: dict, backend: str, exc, match: str) -> None:
    """``op(**kw)`` raises ``exc`` matching ``match`` and leaves every pool byte as it was."""
    before = pool_snapshot(kw)
    with pytest.raises(exc, match=match):
        OPS[op](**kw, backend=backend)
    assert_pools_unchanged(kw, before)


# ----------------------------------------------------------------------------- row 4

def _four_sequences(op: str) -> dict:
    """A valid call of a prefill op with 4 sequences of 6 tokens (24 tokens)."""
    rng = np.random.default_rng(4)
    lens = [6, 6, 6, 6]
    if op == "short_conv_prefill":
        return gen.make_short_conv_inputs(rng, seqlens=lens, dim=8, W=4)
    if op == "ssd_prefill":
        return dict(gen.make_ssd_inputs(rng, seqlens=lens, H=2, P=4, N=8), chunk_size=16)
    return dict(gen.make_gated_delta_inputs(rng, seqlens=lens, H=1, HV=2, K=8, V=4),
                chunk_size=16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", PREFILL)
def test_cu_seqlens_wrapping_int32_differences_is_rejected(op, backend):
    kw = _four_sequences(op)
    # every int32 difference of these wraps to a positive step
    kw["cu_seqlens"] = np.array([0, 2**31 - 1, -2**31, -1, 24], np.int32)
    _rejected(op, kw, backend, ValueError,
              r"^cu_seqlens must be non-decreasing, got cu_seqlens\[1\] = 2147483647 > "
              r"cu_seqlens\[2\] = -2147483648")


# ----------------------------------------------------------------------------- row 5

def _overlapping(pool: np.ndarray, slot_stride_bytes: int) -> np.ndarray:
    """A writeable view of ``pool``'s memory with 6 slots ``slot_stride_bytes`` apart."""
    return as_strided(pool, (6,) + pool.shape[1:], (slot_stride_bytes,) + pool.strides[1:])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("stride", ["zero", "half_slot"])
def test_pool_with_overlapping_slots_is_rejected(op, backend, stride):
    kw = base(op)
    name = pool_name(kw)
    buffer = kw[name]
    kw[name] = _overlapping(buffer, 0 if stride == "zero" else buffer.strides[0] // 2)
    kw["state_indices"] = np.where(kw["state_indices"] >= 0, kw["state_indices"] % 6, -1)
    before = buffer.tobytes()
    with pytest.raises(ValueError, match=rf"^{name} must not overlap itself in memory"):
        OPS[op](**kw, backend=backend)
    assert buffer.tobytes() == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_pool_that_does_not_overlap_is_accepted(backend):
    """Every other slot of a larger cache: strided, slots disjoint."""
    kw, kw_dense = base("ssd_decode"), base("ssd_decode")
    cache = np.repeat(kw["ssm_states"], 2, axis=0)
    kw["ssm_states"] = cache[::2]
    y = OPS["ssd_decode"](**kw, backend=backend)
    y_dense = OPS["ssd_decode"](**kw_dense, backend=backend)
    np.testing.assert_array_equal(y, y_dense)
    np.testing.assert_array_equal(cache[::2], kw_dense["ssm_states"])
    np.testing.assert_array_equal(cache[1::2], base("ssd_decode")["ssm_states"])


def test_distinct_memory_check_is_exact_for_strides_that_do_not_nest():
    buf = np.zeros(64, np.float32)
    # element offsets 3i + 2j (i < 2, j < 3): {0, 2, 4, 3, 5, 7}, all distinct
    _validate.require_distinct_memory("pool", as_strided(buf, (2, 3), (12, 8)))
    # element offsets 2i + j (i, j < 3): 2 and 3 appear twice
    with pytest.raises(ValueError, match="^pool must not overlap itself"):
        _validate.require_distinct_memory("pool", as_strided(buf, (3, 3), (8, 4)))
    for dense in (np.zeros((4, 3, 2)), np.zeros((4, 3, 2)).transpose(2, 0, 1)[:, ::-1],
                  np.zeros((0, 3)), np.zeros((1, 1))):
        _validate.require_distinct_memory("pool", dense)


# ----------------------------------------------------------------------------- row 6

def _padding_token(kw: dict, op: str):
    """(row, first token index) of a padding sequence's first token in the gate arrays."""
    pad = int(np.flatnonzero(kw["state_indices"] < 0)[0])
    if "cu_seqlens" in kw:
        cu = kw["cu_seqlens"]
        assert cu[pad + 1] > cu[pad], "the padding sequence must have tokens"
        return (int(cu[pad]),)
    return (pad, 0)


def _live_token(kw: dict):
    live = int(np.flatnonzero(kw["state_indices"] >= 0)[0])
    if "cu_seqlens" in kw:
        cu = kw["cu_seqlens"]
        live = int(np.flatnonzero((kw["state_indices"] >= 0) & (np.diff(cu) > 0))[0])
        return (int(cu[live]),)
    return (live, 0)


def _gdn_call(op: str, raw: bool, seed: int = 6) -> dict:
    """A GDN call whose padding sequence has tokens (state_indices [s0, -1, s1])."""
    rng = np.random.default_rng(seed)
    if op == "gated_delta_prefill":
        kw = gen.make_gated_delta_inputs(rng, seqlens=[5, 7, 19], H=1, HV=2, K=8, V=4,
                                         raw_gates=raw)
        kw["chunk_size"] = 16
    else:
        kw = gen.make_gated_delta_decode_inputs(rng, num_seqs=3, T=2, H=1, HV=2, K=8, V=4,
                                                raw_gates=raw)
    kw["state_indices"] = np.array([4, -1, 1], np.int32)
    return kw


def _spoil_gate(kw: dict, where: tuple, value: float) -> None:
    """Make the log decay of head 0 at token ``where`` equal ``value`` (via g or raw a)."""
    if kw["g"] is not None:
        kw["g"] = kw["g"].copy()
        kw["g"][where + (0,)] = value
    else:   # a = +inf makes softplus infinite: g = -inf; a = nan: g = nan
        kw["a"] = kw["a"].copy()
        kw["a"][where + (0,)] = math.inf if value == -math.inf else math.nan


GDN_OPS = ("gated_delta_prefill", "gated_delta_decode")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("bad", [0.5, math.inf, -math.inf, math.nan, -1e37])
def test_gdn_bad_log_decay_on_a_real_token_is_rejected(op, backend, bad):
    kw = _gdn_call(op, raw=False)
    _spoil_gate(kw, _live_token(kw), bad)
    _rejected(op, kw, backend, ValueError,
              r"^g must be finite, <= 0 \(a log decay\) and >= -2\.66e\+36 on every token of "
              r"a non-padding sequence, got g\[")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("bad", [-math.inf, math.nan])
def test_gdn_raw_gates_giving_a_bad_decay_on_a_real_token_are_rejected(op, backend, bad):
    kw = _gdn_call(op, raw=True)
    _spoil_gate(kw, _live_token(kw), bad)
    _rejected(op, kw, backend, ValueError,
              r"^g = -exp\(A_log\) \* softplus\(a \+ dt_bias\) must be finite, <= 0 .* got g\[")


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("raw", [False, True], ids=["g", "raw"])
def test_gdn_bad_gates_in_padding_tokens_are_accepted_alike_on_every_backend(op, raw):
    """Padding tokens may hold anything: both backends accept and agree."""
    outs = {}
    for backend in BACKENDS:
        kw = _gdn_call(op, raw=raw)
        _spoil_gate(kw, _padding_token(kw, op), math.nan)
        if not raw:
            kw["g"][_padding_token(kw, op) + (1,)] = 3.0
        outs[backend] = (OPS[op](**kw, backend=backend).astype(np.float64), kw["ssm_states"])
    (y_ref, pool_ref), (y_sim, pool_sim) = outs["reference"], outs["sim"]
    assert np.isfinite(y_sim).all() and rel_fro(y_sim, y_ref) <= 1e-5
    assert rel_fro(pool_sim.astype(np.float64), pool_ref.astype(np.float64)) <= 1e-5


def test_reference_gdn_exempts_padding_tokens_and_rejects_real_ones():
    kw = _gdn_call("gated_delta_prefill", raw=False)
    kw.pop("chunk_size")
    pad, live = _padding_token(kw, "gated_delta_prefill"), _live_token(kw)
    kw["g"] = kw["g"].copy()
    kw["g"][pad + (0,)] = 2.0
    for fn in (ref_gdn.gated_delta_recurrent, ref_gdn.gated_delta_chunked):
        fn(**kw)
    kw["g"][live + (0,)] = 2.0
    for fn in (ref_gdn.gated_delta_recurrent, ref_gdn.gated_delta_chunked):
        with pytest.raises(ValueError, match="^g must be finite and <= 0"):
            fn(**kw)


def _ssd_call(op: str, seed: int = 7) -> dict:
    """An SSD call with raw dt' (dt_softplus False) and a padding sequence with tokens."""
    rng = np.random.default_rng(seed)
    if op == "ssd_prefill":
        kw = gen.make_ssd_inputs(rng, seqlens=[5, 7, 19], H=2, P=4, N=8, dt_mode="raw")
        kw["chunk_size"] = 16
        kw["precision"] = "fp32"
    else:
        kw = gen.make_ssd_decode_inputs(rng, num_seqs=3, T=2, H=2, P=4, N=8, dt_mode="raw")
    kw["state_indices"] = np.array([4, -1, 1], np.int32)
    kw["dt_limit"] = (-math.inf, math.inf)
    return kw


SSD_OPS = ("ssd_prefill", "ssd_decode")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", SSD_OPS)
def test_ssd_growing_state_is_rejected(op, backend):
    kw = _ssd_call(op)
    kw["A"] = np.abs(kw["A"])
    _rejected(op, kw, backend, ValueError, r"^A must be finite and <= 0 \(A = -exp\(A_log\)\), got A\[0\]")
    kw = _ssd_call(op)
    kw["dt"] = kw["dt"].copy()
    kw["dt"][_live_token(kw) + (1,)] = -0.25
    if op == "ssd_decode":
        # decode steps the recurrence itself: a negative dt' (mamba_ssm's
        # selective_state_update takes it) is valid and agrees across backends
        ref_kw = {k: (a.copy() if isinstance(a, np.ndarray) else a) for k, a in kw.items()}
        y_ref = OPS[op](**ref_kw, backend="reference").astype(np.float64)
        y = OPS[op](**kw, backend=backend).astype(np.float64)
        assert rel_fro(y, y_ref) <= 1e-5
        return
    _rejected(op, kw, backend, ValueError,
              r"^dt' = .* must be finite and >= 0 with dt' \* A >= -2\.66e\+36 on every token "
              r"of a non-padding sequence, got dt'\[.*\] = -0\.25")


@pytest.mark.parametrize("op", SSD_OPS)
def test_ssd_negative_dt_in_padding_tokens_is_accepted_alike_on_every_backend(op):
    outs = {}
    for backend in BACKENDS:
        kw = _ssd_call(op)
        kw["dt"] = kw["dt"].copy()
        kw["dt"][_padding_token(kw, op)] = -3.0
        outs[backend] = (OPS[op](**kw, backend=backend).astype(np.float64), kw["ssm_states"])
    (y_ref, pool_ref), (y_sim, pool_sim) = outs["reference"], outs["sim"]
    assert rel_fro(y_sim, y_ref) <= 1e-5
    assert rel_fro(pool_sim.astype(np.float64), pool_ref.astype(np.float64)) <= 1e-5


# ----------------------------------------------------------------------------- row 7

def _no_slots(op: str) -> dict:
    """A valid call of ``op`` whose pool has 0 slots (so every sequence is padding)."""
    kw = base(op, slots=0, padding=3)
    assert kw[pool_name(kw)].shape[0] == 0 and (kw["state_indices"] == -1).all()
    return kw


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_pool_without_slots_and_all_padding_returns_zeros(op, backend):
    kw = _no_slots(op)
    dtype = kw["q"].dtype if "q" in kw else kw["x"].dtype
    y = OPS[op](**kw, backend=backend)
    shape = kw["v"].shape if "v" in kw else kw["x"].shape
    assert y.shape == shape and y.dtype == dtype
    assert not y.astype(np.float64).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_without_slots_gdn_decode_intermediate_states_are_zeros(backend):
    kw = _no_slots("gated_delta_decode")
    o, inter = OPS["gated_delta_decode"](**kw, return_intermediate_states=True, backend=backend)
    S, T, HV, V = kw["v"].shape
    assert inter.shape == (S, T, HV, kw["q"].shape[-1], V)
    assert inter.dtype == kw["ssm_states"].dtype
    assert not o.any() and not inter.any()


# ----------------------------------------------------------------------------- row 8

LIMITS = [
    ("ssd_decode", dict(N=264), r"^N \(B\.shape\[-1\]\) must be <= 256 \(ssd_decode kernel"),
    ("ssd_prefill", dict(P=520), r"^P \(x\.shape\[-1\]\) must be <= 512 \(ssd_prefill kernel"),
    ("gated_delta_prefill", dict(K=136), r"^K \(q\.shape\[-1\]\) must be <= 128"),
    ("gated_delta_decode", dict(K=136), r"^K \(q\.shape\[-1\]\) must be <= 128"),
    ("gated_delta_prefill", dict(V=130), r"^V \(v\.shape\[-1\]\) must be <= 128"),
    ("gated_delta_decode", dict(H=1, HV=130, V=2), r"^HV \(v\.shape\[-2\]\) must be <= 128"),
]


def _shaped(op: str, **shape) -> dict:
    rng = np.random.default_rng(8)
    if op == "ssd_decode":
        return gen.make_ssd_decode_inputs(rng, num_seqs=2, **{"H": 1, "P": 4, "N": 8, **shape})
    if op == "ssd_prefill":
        return dict(gen.make_ssd_inputs(rng, seqlens=[3], **{"H": 1, "P": 4, "N": 8, **shape}),
                    chunk_size=16)
    dims = {"H": 1, "HV": 2, "K": 8, "V": 4, **shape}
    if op == "gated_delta_prefill":
        return dict(gen.make_gated_delta_inputs(rng, seqlens=[3], **dims), chunk_size=16)
    return gen.make_gated_delta_decode_inputs(rng, num_seqs=2, **dims)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op,shape,match", LIMITS, ids=[f"{c[0]}-{c[1]}" for c in LIMITS])
def test_kernel_limit_is_checked_up_front_naming_the_argument(op, shape, match, backend):
    _rejected(op, _shaped(op, **shape), backend, ValueError, match)


@pytest.mark.parametrize("op,shape", [("ssd_decode", dict(N=256)), ("ssd_prefill", dict(P=512)),
                                      ("gated_delta_decode", dict(K=128, V=128))])
def test_kernel_limit_itself_runs_on_every_backend(op, shape):
    y_ref = OPS[op](**_shaped(op, **shape), backend="reference").astype(np.float64)
    y_sim = OPS[op](**_shaped(op, **shape), backend="sim").astype(np.float64)
    assert rel_fro(y_sim, y_ref) <= 3e-3
