"""Errors raised by the bundled NKI simulator.

Every check the simulator makes (shapes, buffers, engines, dtypes, capacity)
raises one of these, with a message naming the instruction or API call, the
operand and the limit that was violated.
"""
from __future__ import annotations


class NkiValidationError(ValueError):
    """A kernel did something the NKI compiler or the hardware rejects."""


class NkiCapacityError(NkiValidationError):
    """Live SBUF or PSUM allocations exceed what the target holds."""


class NkiReleasedUseWarning(UserWarning):
    """A construct the NKI docs do not allow but a released kernel (nki-library, nki-samples,
    NxD Inference contrib) uses: the simulator accepts it, naming the released file, since
    released kernels are what the compiler demonstrably takes."""


__all__ = ["NkiValidationError", "NkiCapacityError", "NkiReleasedUseWarning"]
