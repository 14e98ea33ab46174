"""ALU operators and ScalarE activation functions, as NumPy on float32.

An ``op`` argument is an ``nl`` identifier (``nl.add``, ``nl.exp`` ...); it is
resolved by name (``op.name`` / ``op.__name__`` / a str), so the ISA does not
depend on how ``nki.language`` spells its objects. Arithmetic operators take
and return float32 arrays (the engines compute in fp32); bitvec operators take
and return integer arrays (raw bits). Tables follow nki.api.shared.rst
(ALU-op table, activation table).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import NkiValidationError

_F32 = np.float32

# ---- binary arithmetic (float32 in, float32 out) ----------------------------


def _cmp(fn):
    return lambda a, b: fn(a, b).astype(_F32)


def _logical(fn):
    return lambda a, b: fn(a != 0, b != 0).astype(_F32)


def _power(a, b):
    with np.errstate(all="ignore"):
        return np.power(a, b, dtype=_F32)


def _abs_max(a, b):
    return np.maximum(np.abs(a), np.abs(b))


def _abs_min(a, b):
    return np.minimum(np.abs(a), np.abs(b))


ARITH_BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": _cmp(np.equal),
    "not_equal": _cmp(np.not_equal),
    "greater_equal": _cmp(np.greater_equal),
    "greater": _cmp(np.greater),
    "less_equal": _cmp(np.less_equal),
    "less": _cmp(np.less),
    "logical_and": _logical(np.logical_and),
    "logical_or": _logical(np.logical_or),
    "logical_xor": _logical(np.logical_xor),
    "power": _power,
    "abs_max": _abs_max,   # NeuronCore-v4 only
    "abs_min": _abs_min,   # NeuronCore-v4 only
}
# operators that are NumPy ufuncs (accept out=)
UFUNCS = ("add", "subtract", "multiply", "maximum", "minimum")
COMPARISONS = ("equal", "not_equal", "greater_equal", "greater", "less_equal", "less")
GEN4_ONLY = ("abs_max", "abs_min", "square", "relu")

# ---- unary arithmetic (tensor_scalar op with operand None/0) ---------------


def _rsqrt(a):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (_F32(1.0) / np.sqrt(a)).astype(_F32)


def _recip(a):
    with np.errstate(divide="ignore"):
        return (_F32(1.0) / a).astype(_F32)


ARITH_UNARY = {
    "abs": np.abs,
    "square": np.square,        # v4
    "relu": lambda a: np.maximum(a, _F32(0.0)),  # v4
    "rsqrt": _rsqrt,            # GpSimd
    "reciprocal": _recip,
}

# ---- bitvec (integer raw bits) ----------------------------------------------


def _lshift(a, b):
    return np.left_shift(a, b.astype(a.dtype) if hasattr(b, "astype") else b)


def _rshift_logical(a, b):
    # logical shift right: shift the unsigned bit pattern
    u = a.view(np.dtype(f"u{a.dtype.itemsize}"))
    r = np.right_shift(u, np.asarray(b).astype(u.dtype))
    return r.view(a.dtype)


BITVEC_BINARY = {
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "left_shift": _lshift,
    "right_shift": _rshift_logical,
}
BITVEC_UNARY = {"invert": np.invert}

# Reduction operators legal for tensor_reduce (table column "Legal Reduction op").
ARITH_REDUCE = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}
BITVEC_REDUCE = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
                 "bitwise_xor": np.bitwise_xor}

# Identity of each accumulating op (accumulator reset values).
IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}

_ALIASES = {"max": "maximum", "min": "minimum", "mult": "multiply", "mul": "multiply",
            "sub": "subtract", "divide": "divide", "identity": "copy", "bypass": "bypass"}


_name_cache: dict[int, tuple] = {}


def op_name(op) -> str | None:
    """The canonical name of an ``nl`` operator object (or None if it has none)."""
    hit = _name_cache.get(id(op))
    if hit is not None and hit[0] is op:
        return hit[1]
    name = _op_name(op)
    if name is not None and not isinstance(op, str):
        if len(_name_cache) > 1024:
            _name_cache.clear()
        _name_cache[id(op)] = (op, name)
    return name


def _op_name(op) -> str | None:
    if op is None:
        return None
    if isinstance(op, str):
        name = op
    else:
        name = getattr(op, "name", None) or getattr(op, "__name__", None)
        if not isinstance(name, str):
            return None
    name = name.rsplit(".", 1)[-1]
    return _ALIASES.get(name, name)


def require_op(inst: str, arg: str, op, allowed, what: str) -> str:
    """Resolve ``op`` and check it is in ``allowed``; NkiValidationError otherwise."""
    name = op_name(op)
    if name is None or name not in allowed:
        raise NkiValidationError(
            f"{inst}: {arg} must be {what} ({', '.join('nl.' + a for a in allowed)}), got {op!r}")
    return name


# ---- ScalarE activation functions (float32) --------------------------------

_SQRT2 = math.sqrt(2.0)
_erf_vec = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(_F32)


def _softplus(x):
    x64 = x.astype(np.float64)
    return (np.logaddexp(0.0, x64)).astype(_F32)


def _gelu(x):
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + _erf_vec(x64 / _SQRT2))).astype(_F32)


def _gelu_dx(x):
    x64 = x.astype(np.float64)
    cdf = 0.5 * (1.0 + _erf_vec(x64 / _SQRT2))
    pdf = np.exp(-0.5 * x64 * x64) / math.sqrt(2.0 * math.pi)
    return (cdf + x64 * pdf).astype(_F32)


def _gelu_tanh(x):
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64 ** 3)))).astype(_F32)


def _gelu_sig(x):
    x64 = x.astype(np.float64)
    return (x64 / (1.0 + np.exp(-1.702 * x64))).astype(_F32)


def _gelu_sig_dx(x):
    x64 = x.astype(np.float64)
    s = 1.0 / (1.0 + np.exp(-1.702 * x64))
    return (s + 1.702 * x64 * s * (1.0 - s)).astype(_F32)


def _silu(x):
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        return (x64 / (1.0 + np.exp(-x64))).astype(_F32)


def _silu_dx(x):
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-x64))
    return (s * (1.0 + x64 * (1.0 - s))).astype(_F32)


def _mish(x):
    x64 = x.astype(np.float64)
    return (x64 * np.tanh(np.logaddexp(0.0, x64))).astype(_F32)


def _erf(x):
    return _erf_vec(x.astype(np.float64)).astype(_F32)


def _erf_dx(x):
    x64 = x.astype(np.float64)
    return (2.0 / math.sqrt(math.pi) * np.exp(-x64 * x64)).astype(_F32)


def _ranged(fn, lo, hi):
    """fn inside its documented valid input range, NaN outside.

    ScalarE evaluates a fitted polynomial with no range reduction, so inputs
    outside the valid range give wrong values on hardware (``sin(9.0)`` is
    about 27.65, nki.api.shared.rst); NaN makes such use visible here.
    """
    def g(x):
        with np.errstate(all="ignore"):
            y = fn(x).astype(_F32)
        return np.where((x >= lo) & (x <= hi), y, _F32(np.nan)).astype(_F32)
    return g


def _f32(fn):
    def g(x):
        with np.errstate(all="ignore"):
            return fn(x).astype(_F32)
    return g


# Exact functions in float32/float64; the hardware's piecewise polynomials are
# not modelled (their accuracy is undocumented). sin and arctan, which have no
# range reduction, give NaN outside their valid ranges; log/sqrt/rsqrt/
# reciprocal keep exact values (their ranges only exclude extremes and 0,
# where a NaN would punish legitimate padding rows).
ACTIVATIONS = {
    "copy": lambda x: x,
    "square": _f32(np.square),
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, _F32(0.0)),
    "gelu": _gelu,
    "gelu_dx": _gelu_dx,
    "gelu_apprx_tanh": _gelu_tanh,
    "gelu_apprx_sigmoid": _gelu_sig,
    "gelu_apprx_sigmoid_dx": _gelu_sig_dx,
    "silu": _silu,
    "silu_dx": _silu_dx,
    "tanh": _f32(np.tanh),
    "softplus": _softplus,
    "mish": _mish,
    "erf": _erf,
    "erf_dx": _erf_dx,
    "exp": _f32(np.exp),
    "log": _f32(np.log),
    "sin": _ranged(np.sin, -np.pi, np.pi),
    "arctan": _ranged(np.arctan, -np.pi / 2, np.pi / 2),
    "sqrt": _f32(np.sqrt),
    "rsqrt": _rsqrt,
    "reciprocal": _recip,
    "sign": _f32(np.sign),
    "abs": _f32(np.abs),
}
