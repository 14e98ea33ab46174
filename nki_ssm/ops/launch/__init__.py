"""Kernel launchers: host-side layouts, int32 index tables and the launch through ``nki_ssm.backend.run``.

One module per op family (``short_conv``, ...), each with ``prefill`` and/or
``decode`` taking the op's validated keyword arguments plus ``backend``
(contract: docs/contracts.md, Host API).
"""
