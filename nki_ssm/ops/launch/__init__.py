"""Kernel launchers: host-side layouts, int32 index tables and the launch through ``nki_ssm.backend.run``.

One module per op family (``short_conv``, ...), each with ``prefill`` and/or
``decode`` taking the op's validated keyword arguments plus ``backend``
(contract: docs/contracts.md, Host API).

Each entry point is a thin wrapper over ``prefill_call(xp, call, **kwargs)`` /
``decode_call(...)``: the layouts, table building, launch ``call(kernel,
*args)`` and the way back, written once against the array namespace of
``_arrays``. The host path runs it with NumPy and ``backend.run``; the torch
device path (``nki_ssm.torch.neuron``) with torch ops on the caller's device
and the device call, so the kernel arguments of the two paths cannot fork.
``prefill_kernel()`` / ``decode_kernel()`` name each family's kernels.
"""
