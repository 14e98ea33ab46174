"""What the backward host ops share: the output-gradient check and the gradient casts."""
from __future__ import annotations

import numpy as np

from . import _dispatch
from . import _validate as v
from .training import Call, _stand_in


def check_output_grad(call: Call, name: str, value, ref_name: str, ref, *, shape=None,
                      labels=None) -> None:
    """``value``: the output's gradient, ``ref``'s dtype, the output's shape (``ref``'s
    by default)."""
    arr = v.require_float(name, _stand_in(value, call.kind))
    v.require_same_dtype(name, value, ref_name, ref)
    shape = tuple(ref.shape) if shape is None else shape
    labels = labels or tuple(f"{ref_name}.shape[{i}]" for i in range(len(shape)))
    v.require_shape(name, arr, labels, shape)


def cast_grads(call: Call, grads: dict, grad_of: dict) -> dict:
    """Reference gradients (float64) -> each in its input's dtype; None for inputs not given.
    d_initial_states: float64 for float64 calls, else float32."""
    out = {}
    for name, key in grad_of.items():
        arg = call.kw[name]
        out[key] = None if arg is None else _dispatch.cast_rne(grads[key], arg.dtype)
    out["d_initial_states"] = _dispatch.cast_rne(grads["d_initial_states"],
                                                 np.float64 if call.float64 else np.float32)
    return out
