"""Which NKI implementation the kernels use: the Neuron SDK's or the simulator's.

``from nki_ssm.backend import nki, nl, nisa`` gives the Neuron SDK's ``nki``
package when it is importable and ``NKI_SSM_BACKEND`` is not ``sim``, and the
bundled simulator (``nki_ssm.sim``) otherwise. ``NKI_SSM_BACKEND``:

- ``auto`` (default): the SDK when importable, else the simulator;
- ``neuron``: the SDK; ImportError when it is not installed;
- ``sim``: the simulator, even when the SDK is installed.

The choice is made once, when this module is first imported (kernels bind
``nki.jit`` at import time); ``name()`` reports it. ``resolve()`` evaluates
a choice afresh without changing the exported modules. An ``nki`` that
``nki_ssm.sim.install()`` registered is recognised as the simulator.
"""
from __future__ import annotations

import importlib
import os
import sys
import types

ENV_VAR = "NKI_SSM_BACKEND"
CHOICES = ("auto", "neuron", "sim")


def _sdk_modules() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType] | None:
    """The SDK's (nki, nki.language, nki.isa), or None when it is not importable."""
    current = sys.modules.get("nki")
    if current is not None and getattr(current, "IS_NKI_SSM_SIMULATOR", False):
        return None  # our own install() is answering `import nki`
    try:
        sdk = importlib.import_module("nki")
    except ImportError:
        return None
    if getattr(sdk, "IS_NKI_SSM_SIMULATOR", False):
        return None
    return sdk, importlib.import_module("nki.language"), importlib.import_module("nki.isa")


def _sim_modules():
    from .sim import isa, jit, language

    sim_nki = types.ModuleType("nki", "NKI API served by the nki_ssm CPU simulator")
    sim_nki.IS_NKI_SSM_SIMULATOR = True
    sim_nki.jit = jit.jit
    sim_nki.simulate = jit.simulate
    sim_nki.simulate_kernel = jit.simulate_kernel
    sim_nki.Kernel = jit.Kernel
    sim_nki.language = language
    sim_nki.isa = isa
    return sim_nki, language, isa


def resolve(choice: str | None = None):
    """``(name, nki, nl, nisa)`` for ``choice`` (default: $NKI_SSM_BACKEND or "auto")."""
    if choice is None:
        choice = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV_VAR}: expected one of {', '.join(CHOICES)}, got {choice!r}")
    if choice != "sim":
        sdk = _sdk_modules()
        if sdk is not None:
            return ("neuron",) + sdk
        if choice == "neuron":
            raise ImportError(
                f"{ENV_VAR}=neuron but the Neuron SDK's `nki` package is not importable; install "
                "the Neuron SDK (NKI >= 0.5.0) or set NKI_SSM_BACKEND=sim (or auto) to use the "
                "bundled simulator")
    return ("sim",) + _sim_modules()


_NAME, nki, nl, nisa = resolve()


def name() -> str:
    """"neuron" or "sim": the implementation exported as ``nki, nl, nisa``."""
    return _NAME


def run(kernel, *args, backend: str | None = None, **kwargs):
    """Launch ``kernel`` on ``backend`` ("sim" | "neuron"; None = ``name()``).

    "sim": ``nki_ssm.sim.simulate(kernel)(*args)`` -> NumPy outputs, modified
    inputs written back. "neuron": ``kernel(*args)`` on a NeuronDevice through
    the SDK (needs the SDK exported here, i.e. ``name() == "neuron"``).
    """
    which = name() if backend is None else backend
    if which == "sim":
        from .sim.jit import Kernel, simulate
        if not isinstance(kernel, Kernel) and hasattr(kernel, "func") and _NAME == "neuron":
            raise ValueError(
                "backend='sim': this kernel was built with the Neuron SDK's nki.jit; run with "
                "NKI_SSM_BACKEND=sim so kernels are built against the simulator")
        return simulate(kernel)(*args, **kwargs)
    if which == "neuron":
        if _NAME != "neuron":
            raise ImportError("backend='neuron' needs the Neuron SDK's `nki` package, which is "
                              f"not in use here (nki_ssm.backend.name() == {_NAME!r})")
        return kernel(*args, **kwargs)
    raise ValueError(f"backend: expected 'sim', 'neuron' or None, got {backend!r}")


__all__ = ["nki", "nl", "nisa", "name", "run", "resolve", "ENV_VAR", "CHOICES"]
