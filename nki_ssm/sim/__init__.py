"""nki_ssm's NKI CPU simulator: the documented ``nki``, ``nki.language`` and
``nki.isa`` surface executed eagerly on NumPy, with hardware checks (partition
limits, engine/buffer rules, SBUF/PSUM capacity) and an instruction trace.

Modules: ``errors`` (NkiValidationError, NkiCapacityError, NkiRaceError,
NkiSyncError), ``dtypes``, ``targets`` (trn1/trn2/trn3 limits, NEURON_PLATFORM_TARGET_OVERRIDE),
``tensor`` (Storage, NkiTensor views), ``memory`` (SBUF/PSUM capacity by access
liveness: first to last access, whole runtime loops),
``language`` (nki.language), ``isa`` (nki.isa; ``isa.nki_scalar``: NkiScalar,
scalar_load / scalar_store / scalar_alu), ``nki_lnc`` (nki.lnc: sendrecv,
sendrecv_compute, core_barrier), ``control`` (runtime loops: ``nl.fori_loop`` /
``while_loop``, the older ``nl.dynamic_range`` / ``while reg:``, with NkiScalars or
VirtualRegisters, and ``nl.if_else``, recorded with their structure so the trace gives
both the dynamic instruction count and the program size; a body that runs zero times, and
an if_else callback not taken, is traced once with its effects suppressed; each program's
trip counts and branch outcomes, equal on both LNC programs), ``version``
(``NKI_SSM_NKI_VERSION``: the 0.8.0, 0.7.0, 0.6.0 or 0.5.0 rules),
``jit`` (jit, simulate, ``specialisations()``: the compiles the real
toolchain would make), ``lnc`` (``kernel[2]``: both programs at once over
shared HBM in deterministic lock-step epochs between ``nisa.core_barrier`` /
``sendrecv``, as the SDK simulator's two threads; nki/guides/nki_simulator.rst),
``races`` (HBM bytes the two programs write and read in one epoch: an
``NkiRaceError``), ``simulator`` (``nki.simulator.simulate_kernel``),
``install`` (register the simulator as ``import nki``), ``trace``,
``subset`` (every launched kernel's Python is checked against the subset the
NKI front end, leanprover/KLR, accepts: no comprehensions, lambda, raise, try,
tuple for-targets, min/max of 3+ values, builtins outside KLR's table, ...; every
violation reported in source order), ``frontend`` (the launch runs a rewritten copy
of the kernel that applies KLR's trace-time rules: list/tuple slices inside the
sequence, ``in`` on tuple/list/str only, ``is`` as ``==``, module lists/dicts copied).

``language``, ``isa`` and ``jit`` load on first attribute access, so importing
``nki_ssm.sim.tensor`` alone stays cheap and cycle-free.
"""
from __future__ import annotations

import importlib

from .errors import NkiCapacityError, NkiRaceError, NkiSyncError, NkiValidationError
from .install import install, uninstall
from .targets import current_target

# Marker that lets nki_ssm.backend tell this package from the Neuron SDK even
# when install() has registered it as ``nki``.
IS_NKI_SSM_SIMULATOR = True

_LAZY = {"language": ".language", "isa": ".isa", "jit": ".jit", "tensor": ".tensor",
         "nki_lnc": ".nki_lnc",
         "control": ".control", "simulator": ".simulator", "version": ".version",
         "memory": ".memory", "dtypes": ".dtypes", "targets": ".targets", "trace": ".trace"}
_LAZY_ATTRS = {"simulate": "jit", "simulate_kernel": "jit", "Kernel": "jit", "NkiTensor": "tensor",
               "specialisations": "jit", "reset_specialisations": "jit"}


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(_LAZY[name], __name__)
    if name in _LAZY_ATTRS:
        return getattr(importlib.import_module("." + _LAZY_ATTRS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["NkiValidationError", "NkiCapacityError", "NkiRaceError", "NkiSyncError",
           "current_target", "install", "uninstall",
           "simulate", "simulate_kernel", "Kernel", "NkiTensor", "IS_NKI_SSM_SIMULATOR",
           "specialisations", "reset_specialisations"]
