"""``nki.lnc`` (NKI 0.8.0): communication between the two programs of an LNC=2 grid.

``core_barrier(data, cores, engine=engine.gpsimd, name=None)``,
``sendrecv(src, dst, send_to_rank, recv_from_rank, dma_engine=dma_engine.dma, name=None,
priority=None)`` and ``sendrecv_compute(src, dst, send_to_rank, recv_from_rank, reduce_op,
name=None, priority=None)`` (nki.lnc API pages, SDK 2.34). NKI 0.8.0 moves ``nisa.sendrecv``
/ ``sendrecv_compute`` / ``core_barrier`` here, without ``pipe_id``; the ``nisa`` names stay
as deprecated wrappers (announce-intent-eos-nki-virtualregister-lnc-apis, Neuron 2.34.0).
They run as ``nisa``'s (``sim.isa.sync``: rendezvous of the two programs in lock-step,
``sim.lnc``); ``sendrecv_compute`` writes ``reduce_op(src, the peer's src)`` (nl.add,
nl.maximum, nl.minimum; computed in float32, rounded once to ``dst``'s dtype) to ``dst``.
``priority`` (0 highest .. 3 lowest, DMA quality of service on NeuronCore-v4) has no effect
here; it must be None with ``dma_engine.gpsimd_dma``.
"""
from __future__ import annotations

from . import version as _version
from .isa import sync as _sync
from .isa._enums import dma_engine as _dma_engine, engine as _engine

IS_NKI_SSM_SIMULATOR = True


def core_barrier(data, cores, engine=_engine.gpsimd, name=None):
    """Wait until both programs reach this barrier (``data``: the shared HBM tensor it orders)."""
    _version.require("nki.lnc")
    return _sync.barrier(data, cores, engine, name, module="nki.lnc")


def sendrecv(src, dst, send_to_rank, recv_from_rank, dma_engine=_dma_engine.dma, name=None,
             priority=None):
    """Send ``src`` to program ``send_to_rank``'s ``dst`` while receiving program
    ``recv_from_rank``'s ``src`` into this program's ``dst`` (SBUF tiles, same shape/dtype)."""
    _version.require("nki.lnc")
    return _sync.exchange("sendrecv", src, dst, send_to_rank, recv_from_rank, 0, dma_engine,
                          name, priority=priority, module="nki.lnc")


def sendrecv_compute(src, dst, send_to_rank, recv_from_rank, reduce_op, name=None,
                     priority=None):
    """``dst = reduce_op(src, the src of program recv_from_rank)`` while sending ``src`` to
    program ``send_to_rank`` (both tiles in SBUF or both in private HBM)."""
    _version.require("nki.lnc")
    if reduce_op is None:
        raise TypeError("sendrecv_compute: reduce_op must be nl.add, nl.maximum or nl.minimum")
    return _sync.exchange("sendrecv_compute", src, dst, send_to_rank, recv_from_rank, 0,
                          _dma_engine.dma, name, reduce_op=reduce_op, priority=priority,
                          module="nki.lnc")


__all__ = ["core_barrier", "sendrecv", "sendrecv_compute"]
