"""Engine accumulator registers that persist across instructions.

VectorE has one accumulator per lane shared by ``tensor_scalar_reduce``,
``tensor_scalar_cumulative``, ``range_select``, ``select_reduce`` (and
``exponential``); ScalarE has ``reduce_regs`` used by ``activation``. Both are
per SPMD program and start as NaN, so a kernel reading them before a reset
shows NaN instead of an accidental zero. Lanes are indexed by the absolute
partition of the instruction's data operand.
"""
from __future__ import annotations

import numpy as np

from . import _core as C

_vector: dict[int, np.ndarray] = {}
_scalar: dict[int, np.ndarray] = {}
_rng: dict[tuple, dict] = {}


def _key():
    """(launch, program id): state is per program and does not leak across launches."""
    try:
        from .. import jit
        launch = id(jit._launches[-1]) if jit._launches else None
    except ImportError:
        launch = None
    return launch, C._program_id()


def _regs(table):
    pid = _key()
    r = table.get(pid)
    if r is None:
        if len(table) > 16:
            table.clear()
        r = np.full(C.PMAX, np.nan, dtype=np.float32)
        table[pid] = r
    return r


def vector_acc() -> np.ndarray:
    """The VectorE accumulator (128 float32 lanes) of the running program."""
    return _regs(_vector)


def scalar_regs() -> np.ndarray:
    """ScalarE reduce_regs (128 float32 lanes) of the running program."""
    return _regs(_scalar)


def rng_states() -> dict:
    """{engine name: [128, words] uint32 PRNG lane states} of the running program."""
    key = _key()
    r = _rng.get(key)
    if r is None:
        if len(_rng) > 16:
            _rng.clear()
        r = {}
        _rng[key] = r
    return r


def snapshot():
    """A copy of every register table (a body whose loop runs zero times restores it)."""
    return ({k: v.copy() for k, v in _vector.items()}, {k: v.copy() for k, v in _scalar.items()},
            {k: {e: a.copy() for e, a in d.items()} for k, d in _rng.items()})


def restore(saved) -> None:
    for table, old in zip((_vector, _scalar, _rng), saved):
        table.clear()
        table.update(old)


def reset_all():
    """Forget all register state (every lane back to NaN, generators unseeded)."""
    _vector.clear()
    _scalar.clear()
    _rng.clear()
