"""`profile(kernel, *arrays, target=...)`: run a kernel in the simulator and time its trace."""
from __future__ import annotations

import contextlib
import os

from nki_ssm.perf.hardware import HardwareSpec, get_target
from nki_ssm.perf.model import model, model_range
from nki_ssm.perf.timing import Timing

_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"


@contextlib.contextmanager
def environment(name: str, value: str):
    """Set the environment variable ``name`` to ``value`` for the block, then restore it."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def platform_target(name: str):
    """Set NEURON_PLATFORM_TARGET_OVERRIDE for the block (the simulator reads it), then restore it."""
    return environment(_ENV, name)


def _simulator():
    """The simulator's `simulate(kernel) -> callable` (imported lazily: perf may run without it)."""
    import importlib

    for module in ("nki_ssm.sim.jit", "nki_ssm.sim"):
        try:
            fn = getattr(importlib.import_module(module), "simulate", None)
        except ModuleNotFoundError:
            fn = None
        if fn is not None:
            return fn
    raise RuntimeError("nki_ssm.sim provides no `simulate` (nki_ssm.sim.jit.simulate); "
                       "cannot profile a kernel yet")


def program_instructions(trace) -> int:
    """Static instructions the compiler emits (runtime loop bodies once): the trace's
    ``program_instructions(program_id)`` when the simulator provides it, else ``len(trace)``;
    at LNC=2 the larger of the two programs'."""
    fn = getattr(trace, "program_instructions", None)
    if not callable(fn):
        return len(trace)
    pids = {int(getattr(i, "program_id", 0) or 0) for i in getattr(trace, "instructions", ())} or {0}
    return max(int(fn(pid)) for pid in pids)


def profile(kernel, *arrays, target: "str | HardwareSpec" = "trn2", ranges: bool = True,
            **kwargs) -> tuple[object, Timing]:
    """Run ``kernel(*arrays, **kwargs)`` through the simulator and model its trace.

    Returns ``(outputs, Timing)``; outputs are what the simulated kernel
    returns (HBM inputs it modifies are written back as the simulator does).
    The simulator runs with NEURON_PLATFORM_TARGET_OVERRIDE = ``target`` so
    target-gated instructions are checked for the target being timed.
    ``ranges``: also model the 10-90 % interval (``Timing.time_p10_ns`` /
    ``time_p90_ns``, from ``hardware.RANGE_SAMPLES`` sampled constant tables) and
    the all-fast / all-slow extremes (``time_low_ns`` / ``time_high_ns``):
    RANGE_SAMPLES + 3 scheduling passes instead of one.
    """
    from nki_ssm.sim.trace import record

    hw = get_target(target)
    simulate = _simulator()
    with platform_target(hw.name), record(target=hw.name) as trace:
        outputs = simulate(kernel)(*arrays, **kwargs)
    timing = model_range(trace, hw) if ranges else model(trace, hw)
    timing.program_instructions = program_instructions(trace)
    return outputs, timing
