"""Enums and the instruction handle of ``nki.isa`` (values as in NKI 0.5/0.6).

Raw integers are rejected wherever an enum is expected (NKI 0.3.0 release
notes: "Raw integer enum constants no longer accepted").
"""
from __future__ import annotations

from enum import Enum

from ..errors import NkiValidationError


class engine(Enum):
    """NeuronCore engines (``nisa.engine``)."""

    tensor = 1
    vector = 5
    scalar = 2
    gpsimd = 3
    dma = 4
    sync = 6
    unknown = 0


class reduce_cmd(Enum):
    """Accumulator-register commands."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(Enum):
    """DMA descriptor-generation mode."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(Enum):
    """Out-of-bounds handling of indirect DMA."""

    error = 0
    skip = 1


class matmul_perf_mode(Enum):
    """TensorE performance mode."""

    none = "none"
    double_row = "double_row"


class nc_version(Enum):
    """NeuronCore generation of the current target.

    Ordered (``get_nc_version() >= nc_version.gen3``; an int such as ``3`` on
    the right also works), as nki-library kernels compare it.
    """

    gen2 = 2
    gen3 = 3
    gen4 = 4

    def _key(self, other):
        if isinstance(other, nc_version):
            return other.value
        if isinstance(other, int) and not isinstance(other, bool):
            return other
        return NotImplemented

    def __lt__(self, other):
        k = self._key(other)
        return k if k is NotImplemented else self.value < k

    def __le__(self, other):
        k = self._key(other)
        return k if k is NotImplemented else self.value <= k

    def __gt__(self, other):
        k = self._key(other)
        return k if k is NotImplemented else self.value > k

    def __ge__(self, other):
        k = self._key(other)
        return k if k is NotImplemented else self.value >= k


class dma_engine(Enum):
    """DMA transfer engine of ``sendrecv`` (``isa.sync``)."""

    dma = 1
    gpsimd_dma = 2


# Deprecated aliases still used by nki-library.
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


def check_enum(inst: str, arg: str, value, enum_cls):
    """``value`` if it is a member of ``enum_cls``, else NkiValidationError (raw ints included)."""
    if isinstance(value, enum_cls):
        return value
    raise NkiValidationError(
        f"{inst}: {arg} must be a nisa.{enum_cls.__name__} member "
        f"(raw values are rejected since NKI 0.3.0), got {value!r}")


class NkiInstruction:
    """Handle returned by every ISA call: ``name``, ``op`` and scheduling edges.

    ``depends_on(*producers)`` records "this runs after each producer"; the
    simulator executes in program order, so the edges are kept only for
    inspection (``.dependencies``).
    """

    __slots__ = ("op", "name", "index", "dependencies")

    def __init__(self, op: str, name: str | None, index: int | None = None):
        self.op = op
        self.name = name
        self.index = index  # position in the active trace, or None
        self.dependencies: list[NkiInstruction] = []

    def depends_on(self, *producers: "NkiInstruction") -> "NkiInstruction":
        for p in producers:
            if not isinstance(p, NkiInstruction):
                raise TypeError(
                    f"depends_on: producers must be NkiInstruction handles returned by nisa calls, "
                    f"got {type(p).__name__}")
            self.dependencies.append(p)
        return self

    def __repr__(self) -> str:
        return f"NkiInstruction({self.op!r}, name={self.name!r})"
