"""float64 short-conv backward reference against central finite differences of its
functional forward, and the forward against the pool reference."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ssm.reference.short_conv import short_conv_prefill
from nki_ssm.reference.short_conv_backward import short_conv_backward, short_conv_forward

EPS = 1e-6


def _loss(x, w, b, init, dy, dfin, activation, cu):
    """<dy, y> + <d_final, final>: its gradients are what the backward returns."""
    y, fin = short_conv_forward(x, w, b, activation=activation, cu_seqlens=cu,
                                initial_states=init)
    return float(np.sum(dy * y) + (0.0 if dfin is None else np.sum(dfin * fin)))


def _numeric(f, a):
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + EPS
        hi = f()
        a[i] = old - EPS
        lo = f()
        a[i] = old
        g[i] = (hi - lo) / (2 * EPS)
    return g


def _case(rng, lengths, dim, W, bias, init, dfin):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    n, S, H = int(cu[-1]), len(lengths), W - 1
    return dict(
        x=rng.standard_normal((n, dim)), w=rng.standard_normal((dim, W)) * 0.7,
        b=rng.standard_normal(dim) if bias else None,
        init=rng.standard_normal((S, dim, H)) if init else None,
        dy=rng.standard_normal((n, dim)),
        dfin=rng.standard_normal((S, dim, H)) if dfin else None, cu=cu)


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("lengths,W,bias,init,dfin", [
    ([5, 0, 2, 1, 7], 4, True, True, True),     # empty, T=1, T < W, ragged
    ([6], 2, False, False, False),
    ([3, 9], 3, True, False, True),             # d_final without initial state
    ([1, 2], 5, False, True, False),            # every sequence shorter than W-1
])
def test_backward_matches_finite_differences(rng, activation, lengths, W, bias, init, dfin):
    c = _case(rng, lengths, 3, W, bias, init, dfin)
    got = short_conv_backward(c["x"], c["w"], c["b"], c["dy"], activation=activation,
                              cu_seqlens=c["cu"], initial_states=c["init"],
                              d_final_states=c["dfin"])

    def loss():
        return _loss(c["x"], c["w"], c["b"], c["init"], c["dy"], c["dfin"], activation, c["cu"])

    for key, name in (("dx", "x"), ("dweight", "w"), ("dbias", "b"),
                      ("d_initial_states", "init")):
        if c[name] is None:
            assert got[key] is None, key
            continue
        np.testing.assert_allclose(got[key], _numeric(loss, c[name]), rtol=1e-6, atol=1e-7,
                                   err_msg=key)


def test_forward_matches_the_pool_reference(rng):
    lengths, dim, W = [4, 0, 1, 6], 5, 4
    c = _case(rng, lengths, dim, W, True, True, False)
    y, fin = short_conv_forward(c["x"], c["w"], c["b"], activation="silu", cu_seqlens=c["cu"],
                                initial_states=c["init"])
    S = len(lengths)
    y_ref, pool = short_conv_prefill(c["x"], c["w"], c["b"], activation="silu",
                                     cu_seqlens=c["cu"], conv_states=c["init"].copy(),
                                     state_indices=np.arange(S), has_initial_state=np.ones(S, bool))
    np.testing.assert_allclose(y, y_ref, rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(fin, pool)


def test_final_state_of_a_short_sequence_keeps_the_initial_tail():
    x = np.array([[7.0]])
    init = np.array([[[1.0, 2.0, 3.0]]])
    _, fin = short_conv_forward(x, np.ones((1, 4)), cu_seqlens=np.array([0, 1]),
                                initial_states=init)
    np.testing.assert_array_equal(fin[0, 0], [2.0, 3.0, 7.0])
    # and its gradient flows back to the initial state's last two entries and to x
    g = short_conv_backward(x, np.zeros((1, 4)), None, np.zeros((1, 1)), activation=None,
                            cu_seqlens=np.array([0, 1]), initial_states=init,
                            d_final_states=np.array([[[10.0, 20.0, 30.0]]]))
    np.testing.assert_array_equal(g["d_initial_states"][0, 0], [0.0, 10.0, 20.0])
    np.testing.assert_array_equal(g["dx"][:, 0], [30.0])
