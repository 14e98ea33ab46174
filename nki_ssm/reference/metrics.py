"""Error metrics used by every test and by simulate/.

Both metrics are computed in float64 whatever the input dtypes (bf16 inputs
are widened through ml_dtypes' numpy casts), so the metric itself adds no
error worth mentioning.

Conventions:
  * shapes must match exactly (no broadcasting: a broadcast would hide a
    layout bug) -> ValueError naming both shapes;
  * 0/0 (reference all zeros and actual equal to it, or both empty) is 0.0;
    x/0 with x > 0 is inf (a non-zero answer where zero was expected is an
    unbounded relative error, never "passes");
  * NaN anywhere in actual or ref gives NaN, which fails every `<= tol` check.
"""

from __future__ import annotations

import numpy as np

__all__ = ["rel_fro", "max_abs_scaled", "abs_max"]


def _pair(actual, ref):
    a = np.asarray(actual).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    if a.shape != r.shape:
        raise ValueError(
            f"actual and ref must have the same shape: actual.shape = {a.shape}, "
            f"ref.shape = {r.shape}"
        )
    return a, r


def _ratio(num: float, den: float) -> float:
    if np.isnan(num) or np.isnan(den):
        return float("nan")
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return float(num / den)


def rel_fro(actual, ref) -> float:
    """Relative Frobenius error ||actual - ref||_F / ||ref||_F in float64.

    Any shape; 0/0 -> 0.0, x/0 -> inf, NaN -> NaN (see module docstring).
    """
    a, r = _pair(actual, ref)
    if a.size == 0:
        return 0.0
    return _ratio(float(np.linalg.norm((a - r).ravel())), float(np.linalg.norm(r.ravel())))


def max_abs_scaled(actual, ref) -> float:
    """max |actual - ref| / max |ref| in float64 (same conventions as rel_fro)."""
    a, r = _pair(actual, ref)
    if a.size == 0:
        return 0.0
    return _ratio(float(np.max(np.abs(a - r))), float(np.max(np.abs(r))))


def abs_max(actual, ref) -> float:
    """Unscaled max |actual - ref| in float64 (0.0 for empty arrays)."""
    a, r = _pair(actual, ref)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - r)))
