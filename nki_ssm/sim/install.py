"""Opt-in: make ``import nki`` resolve to the nki_ssm simulator.

For users without the Neuron SDK who want to run an unmodified NKI kernel
file (``import nki; import nki.language as nl; import nki.isa as nisa``)::

    import nki_ssm.sim
    nki_ssm.sim.install()          # no-op (returns False) if the SDK is importable
    import my_kernel_file          # its `import nki` now gets the simulator
    y = nki.simulate(my_kernel_file.kernel)(x)
    y = nki.simulator.simulate_kernel(my_kernel_file.kernel, (x,), {}, lnc=2)

The registered modules carry ``IS_NKI_SSM_SIMULATOR = True`` so code (e.g.
``nki_ssm.backend``) can tell them from the SDK.
"""
from __future__ import annotations

import importlib.machinery
import sys
import types

_NAMES = ("nki", "nki.language", "nki.isa", "nki.typing", "nki.simulator", "nki.lnc")


def is_simulator_module(module) -> bool:
    return bool(getattr(module, "IS_NKI_SSM_SIMULATOR", False))


def sdk_importable() -> bool:
    """True when a real ``nki`` package (not ours) can be imported."""
    mod = sys.modules.get("nki")
    if mod is not None:
        return not is_simulator_module(mod)
    return importlib.machinery.PathFinder.find_spec("nki") is not None


def build_nki() -> types.ModuleType:
    """A module ``nki`` serving the simulator: ``jit``, ``simulate``, ``simulator``
    (``simulate_kernel(func, args, kwargs, lnc=...)``), ``language``, ``isa``, ``lnc``,
    ``typing``.

    As in the SDK with ``NKI_SIMULATOR=1`` (aws-neuron-sdk nki/guides/nki_simulator.rst,
    "Running the Simulator"), calling a ``@nki.jit`` kernel runs it on the simulator, with
    NumPy or torch CPU tensors; there is no device here, so it does so whatever
    ``NKI_SIMULATOR`` says.
    """
    from . import isa, jit, language, nki_lnc, simulator, tensor, version

    nki = types.ModuleType("nki", "NKI API served by the nki_ssm CPU simulator")
    nki.IS_NKI_SSM_SIMULATOR = True
    nki.__version__ = f"{version.DEFAULT}+nki_ssm.sim"
    nki.__path__ = []  # a package, so `import nki.language` looks in sys.modules
    nki.jit = jit.jit
    nki.simulate = jit.simulate
    nki.simulate_kernel = jit.simulate_kernel      # the older spelling: (kernel, *arrays)
    nki.Kernel = jit.Kernel
    from .dtypes import DType
    nki.dtype = DType  # used in kernel signatures as an annotation (nki-library: `dtype: nki.dtype`)
    nki.language = language
    nki.isa = isa
    nki.lnc = nki_lnc        # NKI 0.8.0 (its functions refuse older targets)
    simulator.IS_NKI_SSM_SIMULATOR = True
    nki.simulator = simulator

    typing = types.ModuleType("nki.typing", "Type names for kernel annotations")
    typing.IS_NKI_SSM_SIMULATOR = True
    typing.tensor = tensor.NkiTensor
    typing.NkiTensor = tensor.NkiTensor
    nki.typing = typing
    nki.tensor = tensor.NkiTensor

    for m in (language, isa):
        m.IS_NKI_SSM_SIMULATOR = True
    return nki


def _build() -> dict[str, types.ModuleType]:
    nki = build_nki()
    return {"nki": nki, "nki.language": nki.language, "nki.isa": nki.isa,
            "nki.typing": nki.typing, "nki.simulator": nki.simulator, "nki.lnc": nki.lnc}


def install(force: bool = False) -> bool:
    """Register the simulator as ``nki``, ``nki.language``, ``nki.isa``, ``nki.typing``.

    Does nothing and returns False when the Neuron SDK is importable, unless
    ``force``; returns True when the simulator is (now) registered.
    """
    if not force and sdk_importable():
        return False
    current = sys.modules.get("nki")
    if current is not None and is_simulator_module(current):
        return True
    sys.modules.update(_build())
    return True


def uninstall() -> None:
    """Remove the simulator's ``nki*`` entries from sys.modules (the SDK's stay)."""
    for name in _NAMES:
        mod = sys.modules.get(name)
        if mod is not None and is_simulator_module(mod):
            del sys.modules[name]


__all__ = ["install", "uninstall", "sdk_importable", "is_simulator_module", "build_nki"]
