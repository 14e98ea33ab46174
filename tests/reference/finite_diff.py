"""Central finite differences of a scalar loss in float64, for the reference-gradient tests."""
from __future__ import annotations

import numpy as np

EPS = 1e-5   # roundoff (~1e-16 |loss| / eps) and truncation (~eps^2) both well below 1e-6


def weighted_loss(outputs, weights) -> float:
    """sum_i <outputs[i], weights[i]>: a scalar whose gradient wrt output i is weights[i]."""
    return float(sum(np.sum(np.asarray(o, np.float64) * w) for o, w in zip(outputs, weights)))


def numeric_grad(loss, args: dict, name: str, eps: float = EPS) -> np.ndarray:
    """d loss(**args) / d args[name] by central differences, element by element."""
    base = np.array(args[name], dtype=np.float64)
    grad = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        for sign in (1.0, -1.0):
            bumped = base.copy()
            bumped[i] += sign * eps
            grad[i] += sign * loss(**{**args, name: bumped})
    return grad / (2 * eps)


def rel_err(actual, expected) -> float:
    """Relative Frobenius error (0 when both are zero)."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    den = np.linalg.norm(e)
    return float(np.linalg.norm(a - e) / den) if den else float(np.linalg.norm(a))


def assert_gradients_match(rng, forward, backward, inp: dict, grads: dict, output_grad: str,
                           tol: float, **forward_options) -> None:
    """``backward(**inp, <output_grad>=dy, d_final_states=dfinal)`` against central differences
    of ``<dy, y> + <dfinal, final>`` with ``(y, final) = forward(**inp, **forward_options)``,
    for every input name -> gradient key in ``grads`` (None inputs: None gradients)."""
    y, final = forward(**inp, **forward_options)
    dy, dfinal = rng.standard_normal(y.shape), rng.standard_normal(final.shape)

    def loss(**args):
        return weighted_loss(forward(**args, **forward_options), (dy, dfinal))

    result = backward(**inp, **{output_grad: dy}, d_final_states=dfinal)
    for name, key in grads.items():
        if inp.get(name) is None:
            assert result[key] is None, key
            continue
        err = rel_err(result[key], numeric_grad(loss, inp, name))
        assert err < tol, (name, err)
