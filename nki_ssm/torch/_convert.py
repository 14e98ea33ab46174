"""CPU tensor <-> NumPy views, and the backend the torch layer passes to ``nki_ssm.ops``.

The CPU path of every custom op hands ``nki_ssm.ops`` NumPy *views* of the
caller's tensors (no copy for the pools), so the host API's in-place pool
update lands in the caller's tensor. bfloat16 has no NumPy dtype; it is
viewed bit for bit as ``ml_dtypes.bfloat16`` through int16.
"""
from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import torch

BACKENDS = (None, "reference", "sim", "neuron")
_state = {"backend": None}


def get_backend():
    """The ``backend`` the drop-ins and the HF patch pass to the custom ops (default None:
    what ``NKI_SSM_BACKEND`` picks: the kernel on an NKI implementation, or the float64
    references for ``reference``; see ``nki_ssm.backend``)."""
    return _state["backend"]


def check_backend(backend):
    """``backend`` itself if it is None, "reference", "sim" or "neuron" (the host API's
    ValueError otherwise)."""
    if not (backend is None or (isinstance(backend, str) and backend in BACKENDS)):
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, "
                         f"got {backend!r}")
    return backend


def set_backend(backend) -> None:
    """Set the default backend of the drop-ins: None, "reference", "sim" or "neuron"."""
    _state["backend"] = check_backend(backend)


@contextlib.contextmanager
def use_backend(backend):
    """``with use_backend("reference"): ...`` runs the drop-ins on that backend."""
    previous = get_backend()
    set_backend(backend)
    try:
        yield
    finally:
        _state["backend"] = previous


def to_numpy(t):
    """A NumPy view of CPU tensor ``t`` (same memory; bfloat16 as ml_dtypes.bfloat16); None stays None."""
    if t is None:
        return None
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A new CPU tensor holding ``a`` (copied, so it never aliases an input)."""
    a = np.array(a, copy=True, order="C")
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
