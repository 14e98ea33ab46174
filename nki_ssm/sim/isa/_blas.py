"""Single-threaded float64 GEMM for ``nc_matmul``.

TensorE tiles are small (at most 128 x 128 x 512 on trn2): one BLAS thread
computes one in well under a millisecond, while OpenBLAS's thread pool on a
busy machine makes the same call 10-40x slower (measured 0.37 ms vs 15 ms on
the shared 2-core CI box). When NumPy's bundled OpenBLAS exposes
``openblas_set_num_threads_local`` (0.3.27+), the calling thread is switched
to one BLAS thread for the product and restored afterwards; otherwise the
plain product is used.
"""
from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

_set_local = None  # None: not looked up yet; False: unavailable


def _lookup():
    global _set_local
    _set_local = False
    try:
        root = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
        for path in glob.glob(os.path.join(root, "*openblas*")):
            fn = ctypes.CDLL(path).openblas_set_num_threads_local
            fn.argtypes = [ctypes.c_int]
            fn.restype = ctypes.c_int
            _set_local = fn
            return
    except (OSError, AttributeError):
        _set_local = False


def matmul_f64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` (float64 operands) on one BLAS thread when that can be arranged."""
    if _set_local is None:
        _lookup()
    if not _set_local:
        return a @ b
    prev = _set_local(1)
    try:
        return a @ b
    finally:
        _set_local(prev)
