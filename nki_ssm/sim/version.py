"""The NKI version the simulator imitates: ``NKI_SSM_NKI_VERSION`` (``0.8.0`` default; ``0.7.0``,
``0.6.0``, ``0.5.0``).

Rules that differ between releases ask ``nki_version()`` (read on every call,
so a test can switch it with ``monkeypatch.setenv``). Targets: NKI 0.8.0 /
Neuron SDK 2.34.0 (release-notes/components/nki.rst, 0.8.0: NkiScalar arithmetic
through ``scalar_alu``, ``nl.if_else``, ``nki.lnc``; VirtualRegister APIs and
``nisa.sendrecv`` / ``core_barrier`` deprecated), NKI 0.7.0 / SDK 2.33.0 (the
tracing front end; NkiScalar and ``scalar_load`` / ``scalar_store`` introduced;
``nl.dynamic_range`` and ``while reg:`` removed: nki/migration, "Migrating from
NKI 0.6.0 to NKI 0.7.0"), and the older NKI 0.6.0 / SDK 2.32.0 and 0.5.0 / SDK
2.31 for kernels written against them.
"""
from __future__ import annotations

import os

ENV_VAR = "NKI_SSM_NKI_VERSION"
VERSIONS = ("0.5.0", "0.6.0", "0.7.0", "0.8.0")
DEFAULT = "0.8.0"


def nki_version() -> str:
    """The targeted NKI version, one of ``VERSIONS``; ValueError for anything else."""
    v = os.environ.get(ENV_VAR, "").strip() or DEFAULT
    if v not in VERSIONS:
        raise ValueError(f"{ENV_VAR}: expected one of {', '.join(VERSIONS)}, got {v!r}")
    return v


def at_least(version: str) -> bool:
    """The targeted version is ``version`` or newer."""
    return tuple(map(int, nki_version().split("."))) >= tuple(map(int, version.split(".")))


_NKI_07 = ("nki/migration/index.rst, \"Migrating from NKI 0.6.0 to NKI 0.7.0\": NKI 0.7.0 "
           "introduces NkiScalar as the future replacement for VirtualRegister")
_NKI_08 = "release-notes/components/nki.rst, NKI 0.8.0 (Neuron 2.34.0)"

# API that appeared in a release, with the release note that introduces it
SINCE = {
    "nki.language.fori_loop": ("0.6.0", "release-notes/components/nki.rst, NKI 0.6.0, New "
                                        "Features: nl.fori_loop and nl.while_loop"),
    "nki.language.while_loop": ("0.6.0", "release-notes/components/nki.rst, NKI 0.6.0, New "
                                         "Features: nl.fori_loop and nl.while_loop"),
    "nki.isa.topk": ("0.6.0", "release-notes/components/nki.rst, NKI 0.6.0, New Features: "
                              "nisa.topk"),
    "nki.isa.NkiScalar": ("0.7.0", _NKI_07),
    "nki.isa.scalar_load": ("0.7.0", _NKI_07),
    "nki.isa.scalar_store": ("0.7.0", _NKI_07),
    "nki.language.int64": ("0.7.0", "nki.isa.scalar_load API page (SDK 2.33 / 2.34): src "
                                    "\"with dtype nl.int32 or nl.int64\""),
    "nki.isa.scalar_alu": ("0.8.0", _NKI_08 + ": nki.isa.scalar_alu adds arithmetic and "
                                              "comparisons on device scalars"),
    "nki.language.if_else": ("0.8.0", _NKI_08 + ": this release adds dynamic control flow, "
                                                "nki.language.if_else"),
    "nki.language.fmod": ("0.8.0", "nki.isa.scalar_alu API page (SDK 2.34): nl.fmod"),
    "nki.lnc": ("0.8.0", "announce-intent-eos-nki-virtualregister-lnc-apis (SDK 2.34.0): "
                         "nisa.sendrecv / sendrecv_compute / core_barrier move to nki.lnc"),
}


def require(api: str):
    """AttributeError when ``api`` (a key of ``SINCE``) is newer than the targeted NKI: the
    module of that release has no such name."""
    since, source = SINCE[api]
    if not at_least(since):
        raise AttributeError(f"{api} is not in NKI {nki_version()}: it was added in NKI {since} "
                             f"({source}); {ENV_VAR}={nki_version()} targets the older release")


def warn_in_kernel(message: str, category=DeprecationWarning) -> None:
    """Warn ``message``, attributed to the kernel line that used the API: the innermost frame
    outside the simulator (so ``-W error::DeprecationWarning:<kernel module>`` catches it)."""
    import sys
    import warnings
    f, level = sys._getframe(0), 1
    while f is not None and f.f_globals.get("__name__", "").startswith("nki_ssm.sim"):
        f, level = f.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def versioned_getattr(module: str, table: dict):
    """A module ``__getattr__`` serving ``table`` (name -> object) per ``SINCE``."""
    def __getattr__(name):
        obj = table.get(name)
        if obj is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        require(f"{module.replace('nki_ssm.sim', 'nki')}.{name}")
        return obj
    return __getattr__


__all__ = ["ENV_VAR", "VERSIONS", "DEFAULT", "nki_version", "at_least", "SINCE", "require",
           "warn_in_kernel", "versioned_getattr"]
