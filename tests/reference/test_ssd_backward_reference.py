"""Reference gradients of Mamba-2 SSD (nki_ssm/reference/mamba2_ssd_backward.py) against
central finite differences of the chunked float64 forward, ragged batches and continuation."""
from __future__ import annotations

import numpy as np
import pytest

from finite_diff import assert_gradients_match, rel_err
from nki_ssm.reference.inputs import make_ssd_inputs
from nki_ssm.reference.mamba2_ssd_backward import ssd_backward, ssd_forward

# input name -> gradient key
GRADS = dict(x="dx", dt="ddt", A="dA", B="dB", C="dC", D="dD", z="dz", dt_bias="ddt_bias",
             initial_states="d_initial_states")
FD_TOL = 1e-6      # central differences at eps 1e-5 in float64 are good to ~1e-7
EXACT_TOL = 1e-11  # the same arithmetic split differently


def _case(rng, seqlens, *, D="H", z=True, pattern="strong_then_weak", dt_mode="softplus",
          dt_limit=(0.0, float("inf")), G=2, H=4, P=3, N=4):
    inp = make_ssd_inputs(rng, seqlens=seqlens, H=H, P=P, N=N, G=G, dtype=np.float64, D=D, z=z,
                          dt_mode=dt_mode, dt_limit=dt_limit, gate_pattern=pattern)
    for name in ("ssm_states", "state_indices", "has_initial_state"):
        inp.pop(name)
    num_seqs = len(seqlens)
    inp["initial_states"] = 0.5 * rng.standard_normal((num_seqs, H, P, N))
    inp["A"] = inp["A"].astype(np.float64)
    for name in ("D", "dt_bias"):
        if inp[name] is not None:
            inp[name] = inp[name].astype(np.float64)
    return inp


def _check_fd(rng, inp, chunk_size):
    assert_gradients_match(rng, ssd_forward, ssd_backward, inp, GRADS, "dy", FD_TOL,
                           chunk_size=chunk_size)


@pytest.mark.parametrize("D", ["H", "HP", None])
def test_ssd_gradients_match_finite_differences_strong_then_weak(rng, D):
    # chunk 16 holds the 8 strong-decay tokens then 8 weak ones of each pattern block;
    # an empty sequence in the middle, lengths not multiples of the chunk
    inp = _case(rng, [13, 0, 11], D=D, z=D != "HP")
    _check_fd(rng, inp, chunk_size=16)


def test_ssd_gradients_through_dt_limit_and_without_softplus(rng):
    inp = _case(rng, [9, 6], pattern="realistic", dt_limit=(0.05, 1.5))
    dtp = np.logaddexp(0.0, inp["dt"] + inp["dt_bias"])
    assert ((dtp < 0.05) | (dtp > 1.5)).any() and ((dtp > 0.05) & (dtp < 1.5)).any()
    _check_fd(rng, inp, chunk_size=4)
    raw = _case(rng, [7], pattern="realistic", dt_mode="raw", G=1)
    assert raw["dt_bias"] is None and not raw["dt_softplus"]
    _check_fd(rng, raw, chunk_size=4)


def test_ssd_gradients_without_initial_state(rng):
    inp = _case(rng, [5, 1], z=False)
    inp["initial_states"] = None
    y, final = ssd_forward(**inp)
    dy, dfinal = rng.standard_normal(y.shape), rng.standard_normal(final.shape)
    grads = ssd_backward(**inp, dy=dy, d_final_states=dfinal)
    # the gradient of the (zero) initial state is still returned
    with_zeros = ssd_backward(**{**inp, "initial_states": np.zeros_like(final)}, dy=dy,
                              d_final_states=dfinal)
    for key, value in grads.items():
        if value is not None:
            np.testing.assert_array_equal(value, with_zeros[key])
    assert np.abs(grads["d_initial_states"]).max() > 0


def test_ssd_ragged_batch_equals_separate_calls(rng):
    seqlens = [6, 0, 9, 3]
    inp = _case(rng, seqlens)
    y, final = ssd_forward(**inp)
    dy, dfinal = rng.standard_normal(y.shape), rng.standard_normal(final.shape)
    batch = ssd_backward(**inp, dy=dy, d_final_states=dfinal)
    cu = inp["cu_seqlens"]
    per_head = {"dA", "dD", "ddt_bias"}
    summed = {k: 0.0 for k in per_head}
    for s in range(len(seqlens)):
        rows = slice(int(cu[s]), int(cu[s + 1]))
        one = {k: (v[rows] if k in ("x", "dt", "B", "C", "z") else v) for k, v in inp.items()}
        one.update(cu_seqlens=np.array([0, seqlens[s]]), initial_states=inp["initial_states"][s:s + 1])
        g = ssd_backward(**one, dy=dy[rows], d_final_states=dfinal[s:s + 1])
        for key in ("dx", "ddt", "dB", "dC", "dz"):
            assert rel_err(g[key], batch[key][rows]) < EXACT_TOL or seqlens[s] == 0, key
        assert rel_err(g["d_initial_states"][0], batch["d_initial_states"][s]) < EXACT_TOL
        for key in per_head:
            summed[key] = summed[key] + g[key]
    for key in per_head:
        assert rel_err(summed[key], batch[key]) < EXACT_TOL, key


def test_ssd_continuation_equals_one_long_sequence(rng):
    inp = _case(rng, [21])
    split = 13
    y, final = ssd_forward(**inp)
    dy, dfinal = rng.standard_normal(y.shape), rng.standard_normal(final.shape)
    whole = ssd_backward(**inp, dy=dy, d_final_states=dfinal)

    def part(rows, init):
        one = {k: (v[rows] if k in ("x", "dt", "B", "C", "z") else v) for k, v in inp.items()}
        one.update(cu_seqlens=np.array([0, rows.stop - rows.start]), initial_states=init)
        return one

    first = part(slice(0, split), inp["initial_states"])
    _, mid = ssd_forward(**first)
    second = part(slice(split, 21), mid)
    g2 = ssd_backward(**second, dy=dy[split:], d_final_states=dfinal)
    g1 = ssd_backward(**first, dy=dy[:split], d_final_states=g2["d_initial_states"])
    for key in ("dx", "ddt", "dB", "dC", "dz"):
        assert rel_err(np.concatenate([g1[key], g2[key]]), whole[key]) < EXACT_TOL, key
    for key in ("dA", "dD", "ddt_bias"):
        assert rel_err(g1[key] + g2[key], whole[key]) < EXACT_TOL, key
    assert rel_err(g1["d_initial_states"], whole["d_initial_states"]) < EXACT_TOL
