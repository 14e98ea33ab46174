"""nki_ssm's NKI CPU simulator: the documented ``nki``, ``nki.language`` and
``nki.isa`` surface executed eagerly on NumPy, with hardware checks (partition
limits, engine/buffer rules, SBUF/PSUM capacity) and an instruction trace.

Modules: ``errors`` (NkiValidationError, NkiCapacityError), ``dtypes``,
``targets`` (trn1/trn2/trn3 limits, NEURON_PLATFORM_TARGET_OVERRIDE),
``tensor`` (Storage, NkiTensor views), ``memory`` (capacity accounting),
``language`` (nki.language), ``isa`` (nki.isa), ``jit`` (jit, simulate),
``install`` (register the simulator as ``import nki``), ``trace``.
"""
from __future__ import annotations

from .errors import NkiCapacityError, NkiValidationError
from .targets import current_target

# Marker that lets nki_ssm.backend tell this package from the Neuron SDK even
# when install() has registered it as ``nki``.
IS_NKI_SSM_SIMULATOR = True

__all__ = ["NkiValidationError", "NkiCapacityError", "current_target", "IS_NKI_SSM_SIMULATOR"]
