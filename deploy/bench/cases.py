"""The bench's cases: simulate's case definitions (same ids, inputs and FLOP / byte models),
so a measured row and a modeled row of the same case line up by ``case_id``."""
from __future__ import annotations

import inspect
import re

import numpy as np

DEFAULT_SETS = ("smoke", "judged")
# the project's numerics targets, as the kernel tests (tests/kernels/test_*_kernels.py): float32
# I/O with exact (fp32) matmuls <= 1e-5; bfloat16 I/O or bf16 TensorE operands <= 3e-3
F32_TOL, BF16_TOL = 1e-5, 3e-3


def select(sets=DEFAULT_SETS, *, contains=None, ops=None, models=None) -> list:
    """Cases of the named simulate sets (deduplicated by id, in order), filtered. The
    backward cases stay in simulate: the bench's worker checks and times the serving ops
    (their pools), not the training backwards yet."""
    from simulate import cases as SC

    out, seen = [], set()
    for name in sets:
        if name not in SC.SETS:
            raise ValueError(f"set must be one of {sorted(SC.SETS)}, got {name!r}")
        for c in SC.select(SC.SETS[name](), models=models, ops=ops):
            if c.entry == "backward" or c.id in seen or (
                    contains and not any(s in c.id for s in contains)):
                continue
            seen.add(c.id)
            out.append(c)
    return out


def find(case_id: str, sets=("smoke", "judged", "default", "full")):
    from simulate import cases as SC

    for name in sets:
        for c in SC.SETS[name]():
            if c.id == case_id:
                return c
    raise KeyError(f"no case {case_id!r} in the sets {sets}")


def slug(case_id: str) -> str:
    """A folder name for a case id (``/`` and ``,`` become ``__`` and ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", case_id.replace("/", "__"))


def tolerance(case) -> float:
    """Relative Frobenius tolerance of the case's output and state (as the kernel tests).

    Ops with a ``precision`` argument (SSD) use its default unless the inputs set it:
    "bf16" TensorE operands -> 3e-3 even for float32 I/O.
    """
    from nki_ssm import ops

    param = inspect.signature(getattr(ops, case.op)).parameters.get("precision")
    precision = None if param is None else param.default
    if precision == "bf16" or np.dtype(case.dtype) != np.dtype(np.float32):
        return BF16_TOL
    return F32_TOL
