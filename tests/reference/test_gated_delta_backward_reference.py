"""Reference gradients of the gated delta rule (nki_ssm/reference/gated_delta_backward.py)
against central finite differences of the chunked float64 forward, ragged batches and
continuation."""
from __future__ import annotations

import numpy as np
import pytest

from finite_diff import assert_gradients_match, rel_err
from nki_ssm.reference.gated_delta_backward import gated_delta_backward, gated_delta_forward
from nki_ssm.reference.inputs import make_gated_delta_inputs

GRADS = dict(q="dq", k="dk", v="dv", g="dg", beta="dbeta", a="da", b="db", A_log="dA_log",
             dt_bias="ddt_bias", initial_states="d_initial_states")
TOKEN_ARGS = ("q", "k", "v", "g", "beta", "a", "b")
FD_TOL = 1e-6
EXACT_TOL = 1e-11


def _case(rng, seqlens, *, raw_gates=False, use_qk_l2norm=True, pattern="strong_then_weak",
          H=1, HV=2, K=3, V=4):
    inp = make_gated_delta_inputs(rng, seqlens=seqlens, H=H, HV=HV, K=K, V=V,
                                  raw_gates=raw_gates, use_qk_l2norm=use_qk_l2norm,
                                  dtype=np.float64, gate_pattern=pattern)
    for name in ("ssm_states", "state_indices", "has_initial_state"):
        inp.pop(name)
    inp = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
           for k, v in inp.items()}
    inp["initial_states"] = 0.3 * rng.standard_normal((len(seqlens), HV, K, V))
    return inp


def _check_fd(rng, inp, chunk_size):
    assert_gradients_match(rng, gated_delta_forward, gated_delta_backward, inp, GRADS, "do", FD_TOL,
                           chunk_size=chunk_size)


@pytest.mark.parametrize("raw_gates", [False, True], ids=["g_beta", "raw_gates"])
@pytest.mark.parametrize("use_qk_l2norm", [True, False], ids=["l2norm", "no_l2norm"])
def test_gdn_gradients_match_finite_differences_strong_then_weak(rng, raw_gates, use_qk_l2norm):
    # chunk 16 holds 8 strong-decay tokens then 8 weak ones; an empty sequence; GQA (HV = 2 H)
    inp = _case(rng, [13, 0, 10], raw_gates=raw_gates, use_qk_l2norm=use_qk_l2norm)
    _check_fd(rng, inp, chunk_size=16)


def test_gdn_gradients_with_scale_and_more_heads(rng):
    inp = _case(rng, [7, 4], H=2, HV=4, K=2, V=3, pattern="realistic")
    inp["scale"] = 0.7
    _check_fd(rng, inp, chunk_size=4)


def _part(inp, rows, init):
    one = {k: (v[rows] if k in TOKEN_ARGS and v is not None else v) for k, v in inp.items()}
    one.update(cu_seqlens=np.array([0, rows.stop - rows.start]), initial_states=init)
    return one


@pytest.mark.parametrize("raw_gates", [False, True], ids=["g_beta", "raw_gates"])
def test_gdn_ragged_batch_equals_separate_calls(rng, raw_gates):
    seqlens = [6, 0, 9, 3]
    inp = _case(rng, seqlens, raw_gates=raw_gates)
    o, final = gated_delta_forward(**inp)
    do, dfinal = rng.standard_normal(o.shape), rng.standard_normal(final.shape)
    batch = gated_delta_backward(**inp, do=do, d_final_states=dfinal)
    cu = inp["cu_seqlens"]
    summed = {"dA_log": 0.0, "ddt_bias": 0.0}
    for s in range(len(seqlens)):
        rows = slice(int(cu[s]), int(cu[s + 1]))
        g = gated_delta_backward(**_part(inp, rows, inp["initial_states"][s:s + 1]),
                                 do=do[rows], d_final_states=dfinal[s:s + 1])
        for key in ("dq", "dk", "dv", "dg", "dbeta", "da", "db"):
            if batch[key] is not None and seqlens[s]:
                assert rel_err(g[key], batch[key][rows]) < EXACT_TOL, key
        assert rel_err(g["d_initial_states"][0], batch["d_initial_states"][s]) < EXACT_TOL
        if raw_gates:
            for key in summed:
                summed[key] = summed[key] + g[key]
    if raw_gates:
        for key in summed:
            assert rel_err(summed[key], batch[key]) < EXACT_TOL, key


def test_gdn_continuation_equals_one_long_sequence(rng):
    inp = _case(rng, [22], raw_gates=True)
    split = 9
    o, final = gated_delta_forward(**inp)
    do, dfinal = rng.standard_normal(o.shape), rng.standard_normal(final.shape)
    whole = gated_delta_backward(**inp, do=do, d_final_states=dfinal)
    first = _part(inp, slice(0, split), inp["initial_states"])
    _, mid = gated_delta_forward(**first)
    second = _part(inp, slice(split, 22), mid)
    g2 = gated_delta_backward(**second, do=do[split:], d_final_states=dfinal)
    g1 = gated_delta_backward(**first, do=do[:split], d_final_states=g2["d_initial_states"])
    for key in ("dq", "dk", "dv", "da", "db"):
        assert rel_err(np.concatenate([g1[key], g2[key]]), whole[key]) < EXACT_TOL, key
    for key in ("dA_log", "ddt_bias"):
        assert rel_err(g1[key] + g2[key], whole[key]) < EXACT_TOL, key
    assert rel_err(g1["d_initial_states"], whole["d_initial_states"]) < EXACT_TOL
