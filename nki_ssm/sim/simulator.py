"""``nki.simulator``: the simulator entry point serving engines call.

vLLM Neuron's CPU mode (``VLLM_NEURON_CPU_MODE=1`` with ``NKI_SIMULATOR=1``) runs
every NKI kernel through ``nki.simulator.simulate_kernel(func, args, kwargs,
lnc=lnc)`` with NumPy arrays and the LNC size (vllm-project/vllm-neuron,
docs/model-dev/cpu-development.md, "How it works", and its
``simulate_nki_kernel``, which passes ``args=()`` and every tensor in
``kwargs``). Here that is ``nki.simulate(func[lnc])(*args, **kwargs)``:
same argument conversion, outputs and write-back of modified inputs
(``sim.jit``).
"""
from __future__ import annotations

from .jit import Kernel


def simulate_kernel(func, args=(), kwargs=None, lnc=None):
    """Run ``func`` (a ``@nki.jit`` kernel or its plain function) on the simulator.

    ``args``: tuple or list of positional arguments; ``kwargs``: dict of keyword
    arguments (or None); ``lnc``: None or 1 (one program) or 2 (a grid of two,
    ``nl.program_id(0)`` 0 and 1). Returns what ``nki.simulate`` returns:
    NumPy outputs (torch tensors when torch tensors went in).
    """
    if not callable(func):
        raise TypeError(f"simulate_kernel: func must be a kernel function, got {type(func).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"simulate_kernel: args must be a tuple of positional arguments, got "
                        f"{type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"simulate_kernel: kwargs must be a dict or None, got {type(kwargs).__name__}")
    kernel = func if isinstance(func, Kernel) else Kernel(func)
    if lnc is not None:
        if isinstance(lnc, bool) or not isinstance(lnc, int) or lnc not in (1, 2):
            raise ValueError(f"simulate_kernel: lnc must be None, 1 or 2, got {lnc!r}")
        kernel = kernel[lnc]
    return kernel.simulate(*args, **(kwargs or {}))


__all__ = ["simulate_kernel"]
