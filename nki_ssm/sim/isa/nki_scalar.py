"""Device scalars: ``NkiScalar``, ``scalar_load``, ``scalar_store``, ``scalar_alu`` (NKI 0.7.0+).

An ``NkiScalar`` holds one integer that exists only at run time (an engine
sequencer register). The simulator executes eagerly, so it holds the value;
what the NKI tracer does with it is checked, each rule from the docs of the
targeted release (``sim.version``):

- NKI 0.7.0 introduces NkiScalar and ``scalar_load`` / ``scalar_store``
  (nki/migration, "Migrating from NKI 0.6.0 to NKI 0.7.0"); the 0.7 pages
  (nki.isa.NkiScalar, scalar_load) allow ``nl.int32`` / ``nl.int64`` scalars,
  ``+ - *`` at both widths, comparisons "traced, but the result cannot be
  used" (rejected here wherever the result is used) and rejected on int64;
- NKI 0.8.0 (release-notes/components/nki.rst, 0.8.0: "scalar_alu adds
  arithmetic and comparisons on device scalars, including nl.uint32
  scalars"; nki.isa.scalar_alu and NkiScalar API pages, SDK 2.34.0):
  ``nl.uint32`` scalars; ``/`` and ``//`` are ``nl.divide`` (integer division
  rounded toward zero), ``%`` is ``nl.fmod`` (remainder with the sign of the
  dividend), both 32-bit only; a comparison gives an ``nl.int32`` NkiScalar
  holding 0 or 1, usable as an operand, a store, a loop bound, an offset or an
  ``nl.if_else`` condition; int64 supports only ``+ - *``;
- width is fixed at creation: 32-bit arithmetic wraps (``100000 * 100000`` is
  1410065408), a Python int operand must fit the width, both scalar operands
  must have the same dtype (NkiScalar API page);
- an NkiScalar cannot drive Python control flow: ``if s``, ``while s``,
  ``bool(s)``, ``int(s)``, ``range(s)`` and indexing raise ``TypeError``
  (scalar_alu API page: the result "cannot be used as a Python if or while
  condition"; as for VirtualRegister);
- ``scalar_load(src)`` / ``scalar_store(dst, value)``: a tensor naming exactly
  one element (a 1x1 slice of a larger tile works) in SBUF or HBM, not PSUM;
  ``scalar_store`` takes an NkiScalar only (a Python int "stored nothing on the
  tracer": write constants with ``nisa.memset``) of the tile's width (0.7) /
  dtype (0.8). NKI 0.8.0 (scalar_load / scalar_store API pages, SDK 2.34.0)
  adds: an optional ``engine=`` (the sequencer that holds / writes the value; a
  value bound to one sequencer cannot be stored without ``engine=`` nor be an
  ``nl.if_else`` condition, which must be "available on all engines"), and
  "kernel arguments and returned tensors cannot be used directly as src [or
  dst]; the same restriction applies to slices and views on such tiles"
  (copy into an internal tile with ``dma_copy`` first): checked here for
  arguments when the call is made, for returned tensors when the kernel
  returns.

Where a scalar is accepted (``sim.control``, ``sim.tensor``, ``isa.dma``):
``nl.fori_loop`` bounds (32-bit: "the trip-count comparison has no 64-bit
form"), the loop's induction value, ``scalar_offset`` of ``.ap()`` and so of
DMA and indirect addressing (int32 on SBUF / PSUM, int32 or int64 on HBM:
scalar_load API page; a signed scalar under 0.8.0), ``nl.if_else``
conditions (32-bit). Not as a ``vector_offset`` (UNVERIFIED in the docs).

Not modelled: scalar loads, stores and arithmetic are sequencer work and add
no instruction to the trace (as the register instructions before them).
"""
from __future__ import annotations

import numpy as np

from .. import control as _control
from .. import dtypes as _dt
from .. import races as _races
from .. import version as _version
from . import _core as C
from ._enums import check_enum, engine as _engine

# dtype name -> (bits, signed)
_WIDTH = {"int32": (32, True), "uint32": (32, False), "int64": (64, True)}
_MIXED = "several engines"      # engine binding of a value computed from two sequencers' values

_NO_PYTHON = ("an NkiScalar holds a run-time value: it cannot drive Python control flow (if / "
              "while / bool / int / range / indexing; nki.isa.scalar_alu API page: a comparison "
              "\"cannot be used as a Python if or while condition\"); use nl.if_else(cond, "
              "then_fn, else_fn), nl.fori_loop / nl.while_loop, and .ap(scalar_offset=...) for "
              "addressing")


def _wrap(v: int, bits: int, signed: bool) -> int:
    m = 1 << bits
    v &= m - 1
    if signed and v >= m >> 1:
        v -= m
    return v


def _scalar_dtypes() -> tuple[str, ...]:
    return ("int32", "uint32", "int64") if _version.at_least("0.8.0") else ("int32", "int64")


class NkiScalar:
    """One run-time integer of ``dtype`` (``nl.int32`` default, ``nl.uint32``, ``nl.int64``),
    held by ``engine``'s sequencer (None: available on every engine)."""

    __slots__ = ("value", "dtype", "engine", "unusable")

    def __init__(self, state, dtype=None, engine=None):
        d = _dt.int32 if dtype is None else _dt.as_dtype(dtype, "NkiScalar dtype")
        if d.name not in _WIDTH:
            raise C.NkiValidationError(f"NkiScalar: dtype must be one of "
                                       f"{', '.join(_scalar_dtypes())}, got {d}")
        if isinstance(state, bool) or not isinstance(state, (int, np.integer)):
            raise TypeError(f"NkiScalar: state must be an int, got {type(state).__name__}")
        self.value = _wrap(int(state), *_WIDTH[d.name])
        self.dtype = d
        self.engine = engine
        self.unusable = None        # why the value cannot be used (an NKI 0.7.0 comparison)

    # -- the simulator's own access
    def runtime_value(self, what: str) -> int:
        """The value the hardware would hold now; raises where the tracer rejects a use."""
        if self.unusable is not None:
            raise C.NkiValidationError(f"{what}: {self.unusable}")
        return self.value

    @property
    def bits(self) -> int:
        return _WIDTH[self.dtype.name][0]

    def require_32bit(self, what: str) -> "NkiScalar":
        """Raise unless a 32-bit scalar (fori_loop bounds, if_else conditions, on-chip offsets)."""
        if self.unusable is not None:
            raise C.NkiValidationError(f"{what}: {self.unusable}")
        if self.bits != 32:
            raise C.NkiValidationError(
                f"{what}: a {self.dtype} NkiScalar is not accepted here, it must be 32-bit "
                "(nki.isa.scalar_load API page: a 64-bit scalar \"cannot bound an "
                "nki.language.fori_loop(), because the loop's trip-count comparison has no "
                "64-bit form\"; on SBUF / PSUM an offset must be nl.int32)")
        return self

    # -- arithmetic (traced: each operator is one scalar_alu on the sequencer)
    def _operand(self, what: str, other):
        """(value, engine) of ``other`` for a binary op with this scalar, or None."""
        if isinstance(other, NkiScalar):
            if other.unusable is not None:
                raise C.NkiValidationError(f"{what}: {other.unusable}")
            if other.dtype != self.dtype:
                raise C.NkiValidationError(
                    f"{what}: operands of dtypes {self.dtype} and {other.dtype}; scalar "
                    "operands must have the same dtype (nki.isa.NkiScalar API page: \"so long "
                    "as the dtypes match\"; scalar_alu: \"same width and signedness\")")
            return other.value, other.engine
        if isinstance(other, (int, np.integer)) and not isinstance(other, (bool, np.bool_)):
            v = int(other)
            bits, _ = _WIDTH[self.dtype.name]
            if not -(1 << (bits - 1)) <= v < (1 << bits):
                raise C.NkiValidationError(f"{what}: the int {v} does not fit the {self.dtype} "
                                           "scalar it is combined with (width is fixed at creation)")
            return v, None
        return None

    def _binary(self, op: str, other, reflected: bool = False):
        what = f"NkiScalar {_SYMBOL[op]}"
        if self.unusable is not None:
            raise C.NkiValidationError(f"{what}: {self.unusable}")
        got = self._operand(what, other)
        if got is None:
            return NotImplemented
        b, eng = got
        a = self.value
        if reflected:
            a, b = b, a
        return _apply(op, a, b, self.dtype, _join(self.engine, eng), what)

    def __add__(self, o):
        return self._binary("add", o)

    def __radd__(self, o):
        return self._binary("add", o, True)

    def __sub__(self, o):
        return self._binary("subtract", o)

    def __rsub__(self, o):
        return self._binary("subtract", o, True)

    def __mul__(self, o):
        return self._binary("multiply", o)

    def __rmul__(self, o):
        return self._binary("multiply", o, True)

    def __truediv__(self, o):
        return self._binary("divide", o)

    def __rtruediv__(self, o):
        return self._binary("divide", o, True)

    __floordiv__ = __truediv__
    __rfloordiv__ = __rtruediv__

    def __mod__(self, o):
        return self._binary("fmod", o)

    def __rmod__(self, o):
        return self._binary("fmod", o, True)

    def __neg__(self):
        return self._binary("subtract", 0, True)

    def __pos__(self):
        return self

    def __lt__(self, o):
        return self._binary("less", o)

    def __le__(self, o):
        return self._binary("less_equal", o)

    def __gt__(self, o):
        return self._binary("greater", o)

    def __ge__(self, o):
        return self._binary("greater_equal", o)

    def __eq__(self, o):
        return self._binary("equal", o)

    def __ne__(self, o):
        return self._binary("not_equal", o)

    __hash__ = object.__hash__

    def _no_python(self, *args, **kwargs):
        raise TypeError(_NO_PYTHON)

    __index__ = __int__ = __bool__ = __float__ = _no_python

    def __repr__(self):
        eng = "" if self.engine is None else f", engine={self.engine}"
        return f"NkiScalar({self.value}, {self.dtype}{eng})"


_SYMBOL = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "fmod": "%",
           "maximum": "max", "minimum": "min", "less": "<", "less_equal": "<=", "greater": ">",
           "greater_equal": ">=", "equal": "==", "not_equal": "!="}
_COMPARE = {"less": lambda a, b: a < b, "less_equal": lambda a, b: a <= b,
            "greater": lambda a, b: a > b, "greater_equal": lambda a, b: a >= b,
            "equal": lambda a, b: a == b, "not_equal": lambda a, b: a != b}
_ARITH = ("add", "subtract", "multiply", "divide", "fmod", "maximum", "minimum")


def _join(a, b):
    """Engine binding of a value computed from values bound to ``a`` and ``b``."""
    if a is None or a is b:
        return b
    if b is None:
        return a
    return _MIXED


def _trunc_div(a: int, b: int, what: str) -> int:
    if b == 0:
        if _control.SUPPRESS_FLOOR:
            return 0     # a body that never runs computes on garbage (sim.control)
        raise C.NkiValidationError(f"{what}: division by zero (the hardware result is undefined)")
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _apply(op: str, a: int, b: int, dtype, engine, what: str) -> NkiScalar:
    bits, signed = _WIDTH[dtype.name]
    if not signed:     # unsigned scalars compare and divide as unsigned (scalar_load, SDK 2.34)
        a, b = a & 0xFFFFFFFF, b & 0xFFFFFFFF
    if op in _COMPARE:
        if bits == 64:
            raise C.NkiValidationError(
                f"{what}: comparisons of nl.int64 scalars are rejected at compile time "
                "(nki.isa.NkiScalar API page: at 64 bits only +, - and * exist)")
        out = NkiScalar(int(_COMPARE[op](a, b)), _dt.int32, engine)
        if not _version.at_least("0.8.0"):
            out.unusable = (f"the result of an NkiScalar comparison cannot be used in NKI "
                            f"{_version.nki_version()} (nki.isa.NkiScalar API page of NKI 0.7.0: "
                            "comparisons are \"traced, but the result cannot be used\"; NKI "
                            "0.8.0's scalar_alu gives an int32 0 / 1)")
        return out
    if op in ("add", "subtract", "multiply"):
        v = a + b if op == "add" else a - b if op == "subtract" else a * b
        return NkiScalar(_wrap(v, bits, signed), dtype, engine)
    # divide / fmod / maximum / minimum: NKI 0.8.0's scalar_alu, 32-bit only
    if not _version.at_least("0.8.0"):
        raise TypeError(f"{what}: NkiScalar has no {op} in NKI {_version.nki_version()} (only "
                        "+, - and *; nki.isa.scalar_alu, which adds nl.divide / nl.fmod / "
                        "nl.maximum / nl.minimum, arrived in NKI 0.8.0)")
    if bits == 64:
        raise C.NkiValidationError(f"{what}: nl.{op} on nl.int64 scalars is rejected at compile "
                                   "time (nki.isa.scalar_alu API page: int64 supports only add, "
                                   "subtract and multiply)")
    if op == "divide":
        v = _trunc_div(a, b, what)
    elif op == "fmod":
        v = a - b * _trunc_div(a, b, what)
    else:
        v = max(a, b) if op == "maximum" else min(a, b)
    return NkiScalar(_wrap(v, bits, signed), dtype, engine)


def runtime_int(v, what: str) -> int:
    """The value of an NkiScalar or a VirtualRegister (the simulator's own use)."""
    return v.runtime_value(what)


# ----------------------------------------------------------------- instructions

def _kernel_io(inst: str, arg: str, t) -> None:
    """NKI 0.8.0: no kernel argument (nor a view of one) as scalar_load src / scalar_store dst."""
    if not _version.at_least("0.8.0"):
        return
    from .. import jit
    if jit.is_kernel_argument(t.storage):
        C.fail(inst, f"{arg} is (a view of) a kernel argument; scalar loads and stores operate "
                     "on internal tiles (scalar_load / scalar_store API pages, SDK 2.34: "
                     "\"Kernel arguments and returned tensors cannot be used directly\"): "
                     "dma_copy the value into an SBUF tile first")
    jit.note_scalar_access(t.storage, inst)


def _one_element(inst: str, arg: str, t) -> None:
    if not C.is_tensor(t):
        raise TypeError(f"{inst}: {arg} must be an NkiTensor naming one element, got "
                        f"{type(t).__name__}")
    if t.storage.buffer == "psum":
        C.fail(inst, f"{arg} must be in SBUF or HBM, got PSUM (tensor_copy the value to SBUF)")
    if t.size != 1:
        C.fail(inst, f"{arg} must name exactly one element (a 1x1 tile or slice), got shape "
                     f"{tuple(t.shape)}")
    if t.dtype.name not in _scalar_dtypes():
        C.fail(inst, f"{arg} must have dtype {' / '.join('nl.' + d for d in _scalar_dtypes())} "
                     f"in NKI {_version.nki_version()}, got {t.dtype}")
    if t.indirection is not None:
        C.fail(inst, f"{arg} must be a direct view (no scalar_offset / vector_offset)")


def _engine_arg(inst: str, engine):
    if engine is None:
        return None
    if not _version.at_least("0.8.0"):
        raise TypeError(f"{inst}() got an unexpected keyword argument 'engine' (NKI "
                        f"{_version.nki_version()}; engine= arrived in NKI 0.8.0)")
    engine = check_enum(inst, "engine", engine, _engine)
    if engine in (_engine.unknown, _engine.dma):
        C.fail(inst, f"engine must name a sequencer (tensor, vector, scalar, gpsimd, sync), got "
                     f"{engine}")
    return engine


def scalar_load(src, engine=None) -> NkiScalar:
    """The value of ``src`` (one int32 / int64 element, uint32 under 0.8.0, in SBUF or HBM) as
    an NkiScalar of ``src``'s dtype."""
    inst = "scalar_load"
    _version.require("nki.isa.scalar_load")
    eng = _engine_arg(inst, engine)
    _one_element(inst, "src", src)
    _kernel_io(inst, "src", src)
    v = src.read().reshape(-1)[0]
    if not _control.SUPPRESS_FLOOR:
        _races.note(inst, reads=(src,))
    return NkiScalar(int(v), src.dtype, eng)


def scalar_store(dst, value, engine=None) -> None:
    """Write NkiScalar ``value`` into ``dst`` (one element of the same dtype, SBUF or HBM)."""
    inst = "scalar_store"
    _version.require("nki.isa.scalar_store")
    eng = _engine_arg(inst, engine)
    if not isinstance(value, NkiScalar):
        hint = (" A Python int is not accepted (it stored nothing on the tracer, scalar_store "
                "API page): write a compile-time constant with nisa.memset(dst, value)"
                if isinstance(value, (int, np.integer)) else "")
        raise TypeError(f"{inst}: value must be an NkiScalar, got {type(value).__name__}.{hint}")
    v = value.runtime_value(inst)
    _one_element(inst, "dst", dst)
    if _version.at_least("0.8.0"):
        if dst.dtype != value.dtype:
            C.fail(inst, f"dst has dtype {dst.dtype} but value is a {value.dtype} scalar (dst "
                         "must have the same dtype as value)")
        if eng is None and value.engine is not None:
            C.fail(inst, f"value is bound to {value.engine}; without engine= the store runs on "
                         "every sequencer and the value must be available on all of them "
                         "(scalar_store API page): pass engine=")
    elif dst.dtype.itemsize * 8 != value.bits:
        C.fail(inst, f"dst has dtype {dst.dtype} but value is a {value.dtype} scalar (dst must "
                     "have the same width as value)")
    _kernel_io(inst, "dst", dst)
    dst.write(np.asarray([v], dtype=dst.dtype.np).reshape(dst.shape))
    if not _control.SUPPRESS_FLOOR:
        _races.note(inst, writes=(dst,))


def scalar_alu(data1, data2, op, name=None):
    """``op(data1, data2)`` on scalars (NkiScalar or Python int; NKI 0.8.0): arithmetic keeps
    the scalar's dtype, a comparison gives an int32 0 / 1 NkiScalar; two Python ints are
    evaluated at compile time (an int, or a bool for a comparison)."""
    inst = "scalar_alu"
    _version.require("nki.isa.scalar_alu")
    C.check_name(inst, name)
    op_name = getattr(op, "name", None)
    if op_name not in _SYMBOL:
        raise C.NkiValidationError(f"{inst}: op must be one of "
                                   f"{', '.join('nl.' + k for k in _SYMBOL)}, got {op!r}")
    for arg, v in (("data1", data1), ("data2", data2)):
        if not isinstance(v, NkiScalar) and (isinstance(v, (bool, np.bool_))
                                             or not isinstance(v, (int, np.integer))):
            raise TypeError(f"{inst}: {arg} must be an NkiScalar or an int, got "
                            f"{type(v).__name__}")
    if not isinstance(data1, NkiScalar) and not isinstance(data2, NkiScalar):
        a, b = int(data1), int(data2)
        if op_name in _COMPARE:
            return bool(_COMPARE[op_name](a, b))
        if op_name == "divide":
            return _trunc_div(a, b, inst)
        if op_name == "fmod":
            return a - b * _trunc_div(a, b, inst)
        return {"add": a + b, "subtract": a - b, "multiply": a * b, "maximum": max(a, b),
                "minimum": min(a, b)}[op_name]
    if isinstance(data1, NkiScalar):
        return data1._binary(op_name, data2)
    return data2._binary(op_name, data1, reflected=True)


__all__ = ["NkiScalar", "scalar_load", "scalar_store", "scalar_alu", "runtime_int"]
