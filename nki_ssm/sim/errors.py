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


__all__ = ["NkiValidationError", "NkiCapacityError"]
