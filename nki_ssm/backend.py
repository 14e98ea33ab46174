"""Which NKI implementation the kernels use: the Neuron SDK's or the simulator's.

``from nki_ssm.backend import nki, nl, nisa`` gives the Neuron SDK's ``nki``
package when it is importable and ``NKI_SSM_BACKEND`` is not ``sim``, and the
bundled simulator (``nki_ssm.sim``) otherwise. ``NKI_SSM_BACKEND``:

- ``auto`` (default): the SDK when importable and new enough, else the
  simulator (with a warning when an older SDK was passed over);
- ``neuron``: the SDK; ImportError when it is not installed or older than
  the minimum;
- ``sim``: the simulator, even when the SDK is installed;
- ``reference``: ops called with ``backend=None`` run the float64 references
  (``default_op_backend()``); the kernels still import against what ``auto``
  picks, so an explicit ``backend="sim"`` still launches them.

An invalid value is a ValueError naming the variable, raised on import.

The kernels target NKI 0.8.0 (Neuron SDK 2.34.0): their run-time bounds and
offsets are ``NkiScalar`` s and their conditionals ``nl.if_else``, which NKI 0.8.0
completed (release-notes/components/nki.rst, 0.8.0), so ``MIN_NKI`` is 0.8.0; users
of older SDKs pin the last nki_ssm release built for them. The simulator imitates
the release ``NKI_SSM_NKI_VERSION`` names (``nki_ssm.sim.version``, default 0.8.0).

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
import warnings

ENV_VAR = "NKI_SSM_BACKEND"
CHOICES = ("auto", "neuron", "sim", "reference")
MIN_NKI = "0.8.0"           # NKI 0.8.0 = Neuron SDK 2.34.0: NkiScalar arithmetic, nl.if_else
MIN_SDK = "2.34.0"


def _release(version: str) -> tuple[int, ...]:
    """``"0.6.0+31049202112.g85070674"`` -> (0, 6, 0); unparsable parts end the tuple."""
    out = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def nki_too_old(version: str) -> bool:
    """Whether NKI release ``version`` ("0.7.0", "0.8.0+31049202112.g85070674") is older
    than ``MIN_NKI`` (an empty version is not)."""
    return bool(version) and _release(version) < _release(MIN_NKI)


def sdk_too_old(sdk) -> str | None:
    """Why the SDK's ``nki`` module is older than ``MIN_NKI`` (None when it is new enough or
    reports no version)."""
    found = str(getattr(sdk, "__version__", "") or "")
    if nki_too_old(found):
        return (f"the installed Neuron SDK has NKI {found}; nki_ssm's kernels need NKI >= "
                f"{MIN_NKI} (Neuron SDK >= {MIN_SDK}: NkiScalar, nl.if_else)")
    return None


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
    from .sim.install import build_nki

    sim_nki = build_nki()
    return sim_nki, sim_nki.language, sim_nki.isa


def choice_from_env() -> str:
    """``$NKI_SSM_BACKEND`` (default "auto"), checked: ValueError naming it otherwise."""
    choice = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV_VAR}: expected one of {', '.join(CHOICES)}, "
                         f"got {os.environ.get(ENV_VAR)!r}")
    return choice


def resolve(choice: str | None = None):
    """``(name, nki, nl, nisa)`` for ``choice`` (default: $NKI_SSM_BACKEND or "auto");
    "reference" exports what "auto" would (the references need no NKI)."""
    if choice is None:
        choice = choice_from_env()
    if choice not in CHOICES:
        raise ValueError(f"{ENV_VAR}: expected one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "reference":
        choice = "auto"
    if choice != "sim":
        sdk = _sdk_modules()
        old = sdk_too_old(sdk[0]) if sdk is not None else None
        if sdk is not None and old is None:
            return ("neuron",) + sdk
        if choice == "neuron":
            raise ImportError(
                f"{ENV_VAR}=neuron but " + (old if old else "the Neuron SDK's `nki` package is "
                                            "not importable") + f"; install the Neuron SDK >= "
                f"{MIN_SDK} (NKI >= {MIN_NKI}) or set {ENV_VAR}=sim (or auto) to use the "
                "bundled simulator")
        if old:
            warnings.warn(f"{old}; using the bundled simulator ({ENV_VAR}=auto)", RuntimeWarning,
                          stacklevel=2)
    return ("sim",) + _sim_modules()


_CHOICE = choice_from_env()
_NAME, nki, nl, nisa = resolve(_CHOICE)


def name() -> str:
    """"neuron" or "sim": the implementation exported as ``nki, nl, nisa``."""
    return _NAME


def default_op_backend() -> str:
    """What ``backend=None`` runs on every entry point: "reference" when
    ``NKI_SSM_BACKEND=reference``, else ``name()``."""
    return "reference" if _CHOICE == "reference" else _NAME


LNC_ENV_VAR = "NEURON_LOGICAL_NC_CONFIG"
LNC_CHOICES = (1, 2)


def logical_nc_config(backend: str | None = None) -> int:
    """The programs a kernel launch runs as (its SPMD grid, ``kernel[lnc]``): 1 or 2.

    ``NEURON_LOGICAL_NC_CONFIG`` (exactly "1" or "2", else ValueError naming it; the
    one place in the package that reads it) on every backend, read now. Unset, it is
    the Neuron runtime's default on the Neuron backend -- 2 on trn2 / trn3 ("With
    LNC=2 (default), these are grouped into 4 Logical NeuronCores",
    aws-neuron-sdk about-neuron/arch/neuron-features/logical-neuroncore-config.rst),
    1 on trn1, whose cores are not grouped -- and 1 on the simulator, so modeled
    figures stay per physical NeuronCore unless a caller asks for 2. The Neuron
    target is ``NEURON_PLATFORM_TARGET_OVERRIDE`` (default trn2, as the simulator's).
    """
    which = name() if backend is None else backend
    raw = os.environ.get(LNC_ENV_VAR)
    if raw is not None:
        # exactly "1" or "2": an empty or padded value is a mistake, not "unset"
        if raw not in ("1", "2"):
            raise ValueError(f"{LNC_ENV_VAR}: expected 1 or 2, got {raw!r}")
        return int(raw)
    if which == "neuron":
        from .sim.targets import current_target

        return 1 if current_target().nc_version <= 2 else 2
    return 1


def run(kernel, *args, backend: str | None = None, lnc: int | None = None, **kwargs):
    """Launch ``kernel`` on ``backend`` ("sim" | "neuron"; None = ``name()``) as a grid
    of ``lnc`` programs (None: ``logical_nc_config(backend)``).

    "sim": ``nki_ssm.sim.simulate(kernel[lnc])(*args)`` -> NumPy outputs, modified
    inputs written back. "neuron": ``kernel[lnc](*args)`` on a NeuronDevice through
    the SDK (needs the SDK exported here, i.e. ``name() == "neuron"``).
    """
    which = name() if backend is None else backend
    if lnc is None:
        lnc = logical_nc_config(which)
    if isinstance(lnc, bool) or lnc not in LNC_CHOICES:
        raise ValueError(f"lnc: expected 1 or 2, got {lnc!r}")
    if which == "sim":
        from .sim.jit import Kernel, simulate
        if not isinstance(kernel, Kernel) and hasattr(kernel, "func") and _NAME == "neuron":
            raise ValueError(
                "backend='sim': this kernel was built with the Neuron SDK's nki.jit; run with "
                "NKI_SSM_BACKEND=sim so kernels are built against the simulator")
        return simulate(kernel[lnc])(*args, **kwargs)
    if which == "neuron":
        if _NAME != "neuron":
            raise ImportError("backend='neuron' needs the Neuron SDK's `nki` package, which is "
                              f"not in use here (nki_ssm.backend.name() == {_NAME!r})")
        return kernel[lnc](*args, **kwargs)
    raise ValueError(f"backend: expected 'sim', 'neuron' or None, got {backend!r}")


__all__ = ["nki", "nl", "nisa", "name", "default_op_backend", "choice_from_env", "run", "logical_nc_config", "LNC_ENV_VAR", "resolve", "nki_too_old", "sdk_too_old", "ENV_VAR", "CHOICES",
           "MIN_NKI", "MIN_SDK"]
