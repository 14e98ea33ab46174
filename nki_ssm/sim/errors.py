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


class NkiRaceError(NkiValidationError):
    """The two programs of an LNC=2 launch access the same HBM bytes in one epoch (between
    two synchronisations), at least one of them writing (``sim.races``)."""


class NkiSyncError(NkiValidationError):
    """The programs of an LNC=2 launch do not run in step: their control flow differs (a
    runtime loop's trip count or an ``nl.if_else`` outcome: ``sim.control.check_same_flow``),
    or one waits at a ``core_barrier`` / ``sendrecv`` the other never reaches (a hang on
    hardware), or the two reach different kinds of synchronisation or disagree on a
    ``sendrecv``'s partners (``sim.lnc``)."""


class NkiReleasedUseWarning(UserWarning):
    """A construct the NKI docs do not allow but a released kernel (nki-library, nki-samples,
    NxD Inference contrib) uses: the simulator accepts it, naming the released file, since
    released kernels are what the compiler demonstrably takes."""


class NkiWeakEvidenceWarning(UserWarning):
    """A construct that only weak evidence (reports without an attributable source) says the
    compiler rejects: the simulator runs it, and warns naming the evidence."""


__all__ = ["NkiValidationError", "NkiCapacityError", "NkiRaceError", "NkiSyncError",
           "NkiReleasedUseWarning", "NkiWeakEvidenceWarning"]
