"""NKI data types and their NumPy / ml_dtypes storage.

In NKI 0.5.0 the dtypes are plain strings (``nl.float32 == "float32"``); our
:class:`DType` is a ``str`` subclass that also carries the NumPy dtype used to
store it, so kernels can compare, print and pass dtypes exactly as on the
SDK while the simulator keeps bf16 / fp8 data in ml_dtypes arrays.

Rounding (:func:`cast`): float targets round to nearest even through
ml_dtypes; fp8 targets saturate finite values to the format's largest finite
value (Neuron converts with saturation; ml_dtypes alone would give inf/NaN);
float -> integer rounds to nearest even and saturates to the integer range
(NaN becomes 0), as the SDK simulator does since NKI 0.6.0.
"""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np


class DType(str):
    """An NKI dtype: the string name of the type plus its storage dtype.

    ``np``: the NumPy dtype the simulator stores it as; ``itemsize``: bytes
    per element; ``is_float`` / ``is_int``; ``is_fp8``.
    """

    np: np.dtype
    itemsize: int
    is_float: bool
    is_int: bool
    is_fp8: bool

    def __new__(cls, name: str, np_dtype) -> "DType":
        self = super().__new__(cls, name)
        self.np = np.dtype(np_dtype)
        self.itemsize = self.np.itemsize
        self.is_float = self.np.kind == "f" or name.startswith("float8") or name == "bfloat16"
        self.is_int = self.np.kind in "iu" and name != "bool_"
        self.is_fp8 = name.startswith("float8")
        return self

    @property
    def name(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"nl.{str.__str__(self)}"

    __hash__ = str.__hash__


bool_ = DType("bool_", np.uint8)  # NKI stores booleans as one byte
int8 = DType("int8", np.int8)
int16 = DType("int16", np.int16)
int32 = DType("int32", np.int32)
uint8 = DType("uint8", np.uint8)
uint16 = DType("uint16", np.uint16)
uint32 = DType("uint32", np.uint32)
float16 = DType("float16", np.float16)
float32 = DType("float32", np.float32)
# nl.int64 (NKI 0.7.0+): only for scalar_load / scalar_store tiles and the DMAs that fill them
# (nki.isa.scalar_load API page: "Unlike the compute instructions, scalar_load accepts
# nl.int64"); not in ALL, so as_dtype gives it only when the targeted NKI has it.
int64 = DType("int64", np.int64)
bfloat16 = DType("bfloat16", ml_dtypes.bfloat16)
# tfloat32 (1,8,10) is stored as float32 without mantissa truncation: TensorE
# reads only the top 10 mantissa bits, which the matmul model may apply.
tfloat32 = DType("tfloat32", np.float32)
# Legacy Neuron fp8 (finite max 240), as nki-library's _get_fp8_e4m3_max_pos_val.
float8_e4m3 = DType("float8_e4m3", ml_dtypes.float8_e4m3)
float8_e4m3fn = DType("float8_e4m3fn", ml_dtypes.float8_e4m3fn)
float8_e5m2 = DType("float8_e5m2", ml_dtypes.float8_e5m2)
float8_e8m0fnu = DType("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu)

ALL: tuple[DType, ...] = (
    bool_, int8, int16, int32, uint8, uint16, uint32, float16, float32, bfloat16,
    tfloat32, float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu,
)
_BY_NAME = {str.__str__(d): d for d in ALL}
_BY_NAME.update({"bool": bool_, "float": float32, "half": float16})
# numpy storage dtype -> canonical NKI dtype (float32 wins over tfloat32, uint8 over bool_)
_BY_NP: dict[np.dtype, DType] = {}
for _d in ALL:
    if _d not in (tfloat32, bool_):
        _BY_NP.setdefault(_d.np, _d)
_BY_NP[np.dtype(np.bool_)] = bool_

_FP8_MAX = {d.np: float(ml_dtypes.finfo(d.np).max) for d in (float8_e4m3, float8_e4m3fn, float8_e5m2)}


def as_dtype(dtype, what: str = "dtype") -> DType:
    """The NKI dtype for ``dtype`` (a DType, its name, a NumPy or ml_dtypes type).

    Raises TypeError naming ``what`` for anything else.
    """
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        d = _BY_NAME.get(dtype)
        if d is None and dtype == "int64" and _int64_ok():
            return int64
        if d is None:
            raise TypeError(f"{what}: expected an NKI dtype such as nl.float32, got {dtype!r}")
        return d
    try:
        npd = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{what}: expected an NKI dtype such as nl.float32, got {dtype!r}") from None
    d = _BY_NP.get(npd)
    if d is None and npd == int64.np and _int64_ok():
        return int64
    if d is None:
        raise TypeError(f"{what}: NumPy dtype {npd} has no NKI equivalent (float64 is not an NKI type, nor int64 before NKI 0.7.0)")
    return d


def _int64_ok() -> bool:
    from .version import at_least
    return at_least("0.7.0")


def from_numpy(np_dtype) -> DType:
    """The NKI dtype that stores like ``np_dtype`` (float32 for float32, etc.)."""
    return as_dtype(np_dtype, "array dtype")


def is_float(dtype) -> bool:
    return as_dtype(dtype).is_float


def is_int(dtype) -> bool:
    return as_dtype(dtype).is_int


def cast(values, dtype) -> np.ndarray:
    """``values`` converted to ``dtype``'s storage type with hardware rounding.

    Floats: round to nearest even (ml_dtypes), fp8 saturating at the format's
    finite max. Float -> int: round half to even, saturate, NaN -> 0.
    Int -> int: saturate. bool_: nonzero -> 1.
    Returns a new array (or ``values`` itself when no conversion is needed).
    """
    d = dtype if isinstance(dtype, DType) else as_dtype(dtype)
    target = d.np
    a = np.asarray(values)
    if a.dtype == target and d is not bool_:
        return a
    if d is bool_:
        return (a != 0).astype(np.uint8)
    if d.is_fp8 and target in _FP8_MAX:
        m = _FP8_MAX[target]
        a = np.asarray(a, dtype=np.float32) if a.dtype.kind not in "f" or a.dtype.itemsize < 4 else a
        # clip keeps NaN as NaN; inf saturates too (finite-only formats have no inf)
        return np.clip(a, -m, m).astype(target)
    if target.kind == "f" or d is bfloat16 or d is float8_e8m0fnu:
        if a.dtype.kind in "iub":
            a = a.astype(np.float64)
        return a.astype(target)
    # integer target
    info = np.iinfo(target)
    if a.dtype.kind in "f" or a.dtype in (np.dtype(ml_dtypes.bfloat16),) or a.dtype.kind == "V":
        f = np.asarray(a, dtype=np.float64)
        f = np.rint(np.nan_to_num(f, nan=0.0, posinf=info.max, neginf=info.min))
        return np.clip(f, info.min, info.max).astype(target)
    if a.dtype.kind == "b":
        return a.astype(target)
    # int -> int: saturate through int64 (uint64 inputs never occur in NKI)
    return np.clip(a.astype(np.int64), info.min, info.max).astype(target)


PRECISE_FP_ENV = "NKI_PRECISE_FP"
# "low-precision dtypes (bfloat16, float8_e4m3, float8_e5m2)" (nki_simulator.rst)
_WIDENED = frozenset({"bfloat16", "float8_e4m3", "float8_e5m2"})


def precise_fp() -> bool:
    """``NKI_PRECISE_FP`` (aws-neuron-sdk nki/guides/nki_simulator.rst, "Precise
    Floating-Point Mode"): 1 (default) stores bfloat16 / fp8 through ml_dtypes; 0 stores
    them as float32, so no rounding or truncation happens inside a kernel."""
    v = os.environ.get(PRECISE_FP_ENV, "").strip()
    if v in ("", "1"):
        return True
    if v == "0":
        return False
    raise ValueError(f"{PRECISE_FP_ENV}: expected 0 or 1, got {v!r}")


def storage_np(d: "DType") -> np.dtype:
    """The NumPy dtype a new tensor of ``d`` is held in: ``d.np``, or float32 for a
    low-precision float under ``NKI_PRECISE_FP=0``."""
    if d.name in _WIDENED and not precise_fp():
        return np.dtype(np.float32)
    return d.np


def cast_float32(values) -> np.ndarray:
    """``values`` as float32 (how Vector/Scalar/GpSimd engines read every operand)."""
    a = np.asarray(values)
    if a.dtype == np.float32:
        return a
    return a.astype(np.float32)


__all__ = [
    "PRECISE_FP_ENV", "precise_fp", "storage_np", "DType", "ALL", "as_dtype", "from_numpy", "is_float", "is_int", "cast", "cast_float32",
    "bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32",
    "bfloat16", "tfloat32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
]
