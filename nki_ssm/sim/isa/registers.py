"""Virtual registers (``register_alloc/move/load/store``), executed eagerly.

A register holds a 32-bit value that exists only at run time. As under the
NKI tracer front end, it cannot drive Python control flow: ``if reg``,
``while reg``, ``bool(reg)``, ``int(reg)``, ``range(reg)`` or indexing with it
raise ``TypeError`` (nki.isa.VirtualRegister API page, NKI 2.32 docs: "using
a register in Python control flow (if/while) or converting it with int() /
range() raises TypeError"). Registers bound runtime loops
(``nl.dynamic_range``, ``nl.fori_loop``, ``nl.while_loop``; see
``sim.control``) and address memory through ``.ap(scalar_offset=reg)``.
NKI 0.5/0.6 has no arithmetic on registers.

NKI 0.8.0 deprecates them for ``nisa.scalar_load`` / ``scalar_store`` and
``NkiScalar`` (``isa.nki_scalar``): ``register_alloc`` / ``register_move`` /
``register_load`` / ``register_store`` and ``nisa.VirtualRegister`` warn
``DeprecationWarning`` at the kernel line ("When your kernel uses one of them, NKI
raises a DeprecationWarning": announce-intent-eos-nki-virtualregister-lnc-apis,
Neuron 2.34.0).
"""
from __future__ import annotations

import numpy as np

from .. import control as _control
from .. import races as _races
from .. import version as _version
from . import _core as C


def deprecated_under_08(api: str) -> None:
    if _version.at_least("0.8.0"):
        _version.warn_in_kernel(
            f"nki.isa.{api} is deprecated in NKI 0.8.0 and will be removed in a future release; "
            "use nisa.scalar_load / nisa.scalar_store and nisa.NkiScalar "
            "(announce-intent-eos-nki-virtualregister-lnc-apis, Neuron 2.34.0)")


class VirtualRegister:
    """A 32-bit engine-sequencer register holding ``value`` (None until written)."""

    __slots__ = ("value", "frozen")

    def __init__(self, state=None, frozen=False):
        self.value = None if state is None else _int32("VirtualRegister", "state", state)
        self.frozen = bool(frozen)

    def _get(self, what: str) -> int:
        if self.value is None:
            if _control.SUPPRESS_FLOOR:
                return 0    # a body whose loop runs zero times reads garbage (sim.control)
            raise C.NkiValidationError(f"{what}: the register was read before any value was written")
        return self.value

    def runtime_value(self, what: str) -> int:
        """The value the hardware would hold now (for the simulator's own use)."""
        return self._get(what)

    def _set_runtime(self, v: int) -> None:
        self.value = int(v)

    def _no_python(self, *args, **kwargs):
        raise TypeError("a VirtualRegister holds a run-time value: it cannot drive Python control "
                        "flow (if / while / bool / int / range / indexing); use nl.dynamic_range, "
                        "nl.fori_loop or nl.while_loop, and .ap(scalar_offset=reg) for addressing")

    __index__ = __int__ = __bool__ = __float__ = _no_python

    def __repr__(self):
        return f"VirtualRegister({self.value})"


def _int32(inst, arg, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{inst}: {arg} must be an int, got {type(v).__name__}")
    v = int(v)
    if not -2 ** 31 <= v < 2 ** 32:
        C.fail(inst, f"{arg} {v} does not fit a 32-bit register")
    return v


def _reg(inst, arg, r) -> VirtualRegister:
    if not isinstance(r, VirtualRegister):
        raise TypeError(f"{inst}: {arg} must be a VirtualRegister from nisa.register_alloc, got "
                        f"{type(r).__name__}")
    return r


# nisa.register_alloc documents x as None or an int; nki-library at d2ad3a5 passes a one-element
# SBUF tile view, src/nkilib_src/nkilib/core/moe/moe_tkg/all_expert_mx_impl.py:311
# (``nisa.register_alloc(dynamic_decision_sb[0, 0])``): released kernels win.
_ALLOC_FROM_TENSOR = ("aws-neuron/nki-library d2ad3a5 src/nkilib_src/nkilib/core/moe/moe_tkg/"
                      "all_expert_mx_impl.py:311")


def register_alloc(x=None) -> VirtualRegister:
    """A new register, uninitialised (None), holding the int ``x``, or loaded from ``x``, a
    one-element integer tensor (as ``register_load``; with an ``NkiReleasedUseWarning``)."""
    deprecated_under_08("register_alloc")
    if C.is_tensor(x):
        import warnings
        from ..errors import NkiReleasedUseWarning
        warnings.warn(f"register_alloc(x) with a tensor x: the docs allow None or an int; a "
                      f"released kernel does this ({_ALLOC_FROM_TENSOR}), so it is accepted "
                      "and loads the tensor's value", NkiReleasedUseWarning, stacklevel=2)
        r = VirtualRegister()
        _load(r, x)
        return r
    return VirtualRegister(None if x is None else _int32("register_alloc", "x", x))


def register_move(dst, src):
    """``dst = src`` (an int constant or another register)."""
    deprecated_under_08("register_move")
    inst = "register_move"
    d = _reg(inst, "dst", dst)
    if d.frozen:
        C.fail(inst, "dst is a frozen register (a loop induction variable) and cannot be written")
    _control.note_register_write(d)
    d.value = src._get(inst) if isinstance(src, VirtualRegister) else _int32(inst, "src", src)


def _single(inst, arg, t):
    if not C.is_tensor(t):
        raise TypeError(f"{inst}: {arg} must be an NkiTensor with one element, got {type(t).__name__}")
    if t.storage.buffer == "psum":
        C.fail(inst, f"{arg} must be in HBM or SBUF, got PSUM")
    if t.size != 1:
        C.fail(inst, f"{arg} must hold exactly one element (shape [1] or [1, 1]), got shape {tuple(t.shape)}")
    if t.dtype.itemsize > 4:
        C.fail(inst, f"{arg} must be a 32-bit (or narrower) value, got {t.dtype}")


def register_load(dst, src):
    """Load the single (integer) value of ``src`` (HBM or SBUF) into register ``dst``."""
    deprecated_under_08("register_load")
    _load(dst, src)


def _load(dst, src):
    inst = "register_load"
    d = _reg(inst, "dst", dst)
    _single(inst, "src", src)
    if not src.dtype.is_int:
        C.fail(inst, f"src must have an integer dtype, got {src.dtype}")
    if d.frozen:
        C.fail(inst, "dst is a frozen register (a loop induction variable) and cannot be written")
    _control.note_register_write(d)
    d.value = int(src.read().reshape(-1)[0])
    if not _control.SUPPRESS_FLOOR:
        _races.note(inst, reads=(src,))


def register_store(dst, src):
    """Store register ``src`` into the single-element tensor ``dst`` (HBM or SBUF)."""
    deprecated_under_08("register_store")
    inst = "register_store"
    _single(inst, "dst", dst)
    s = _reg(inst, "src", src)
    from ..dtypes import cast
    dst.write(cast(np.asarray([s._get(inst)], dtype=np.int64), dst.dtype).reshape(dst.shape))
    if not _control.SUPPRESS_FLOOR:
        _races.note(inst, writes=(dst,))
