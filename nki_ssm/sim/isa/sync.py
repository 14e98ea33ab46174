"""Synchronisation between the programs of an LNC=2 grid: ``core_barrier``, ``sendrecv``.

Signatures and rules from the NKI 0.6.0 API page (aws-neuron-sdk a3247f5, the
Neuron 2.32.0 release, nki/api/nki/isa/__init__.py: ``core_barrier`` line
2601, ``sendrecv`` line 2971) and from released kernels (aws-neuron/nki-library
d2ad3a5):

``core_barrier(data, cores, engine=engine.gpsimd, name=None)``: "a
synchronization point where all specified NeuronCores must reach before any
can proceed"; NeuronCore-v3 or newer; "only allowed ... when LNC ... is
enabled. Currently only cores=(0, 1) is supported"; ``data`` "must be data in
shared HBM". Released kernels differ in three ways, and win:

- ``cores`` as a list: ``cores=[0, 1]`` (core/mlp/mlp_tkg/mlp_tkg_utils.py:253,
  core/router_topk/router_topk.py:1074, core/moe/moe_tkg/all_expert_mx_impl.py:478);
- under one program (``NUM_SHARDS == 1``, i.e. LNC=1) they call it with
  ``cores=(0)`` (an int) or ``(0,)`` (core/moe/moe_cte/bwmm_shard_on_I.py:311,
  2144-2147; bwmm_shard_on_block.py:1055; experimental/moe/forward/
  bwmm_shard_on_H.py:705): accepted at LNC=1 as a barrier of one core, which
  waits for nobody (recorded in the trace, no effect); ``cores=(0, 1)`` at
  LNC=1 is rejected (the docs: LNC must be enabled; core 1 does not exist);
- ``data`` in SBUF: bwmm_shard_on_I.py:577 (``block_idx``, an SBUF (1, 1)
  tile) and bwmm_shard_on_I_mx.py:756 (``block_idx_sbuf``): accepted with an
  ``NkiReleasedUseWarning``.

``sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id,
dma_engine=dma_engine.dma, name=None)``: "The current NeuronCore sends its
src tile to the dst location of the target NeuronCore specified by
send_to_rank, while simultaneously receiving data from recv_from_rank into
its own dst tile"; NeuronCore-v3 or newer, LNC enabled (so rejected at
LNC=1), ranks 0 or 1; src and dst both in SBUF, same dtype, same shape;
``dma_engine.gpsimd_dma`` at most 1024 / 512 / 256 bytes per partition for
32 / 16 / 8-bit types. Released use: core/mlp/mlp_cte/mlp_cte_projection.py:633
(``send_to_rank = recv_from_rank = 1 - program_id``, ``pipe_id=1``),
core/mlp/mlp_tkg/gate_up_projection_mx_shard_H.py:222.

At LNC=2 both are rendezvous of the two programs (``sim.lnc``): each program
stops there until the other arrives; a ``sendrecv`` then copies each
program's ``src`` into its receiver's ``dst``; the HBM accesses before it are
checked for races (``sim.races``). In the trace each is one instruction per
program with ``attrs["sync"]`` (``"core_barrier"`` / ``"sendrecv"``) and
``attrs["sync_id"]`` (the k-th synchronisation of the launch, equal on both
programs; -1 for an LNC=1 barrier and in a body whose loop never runs): see
``sim.trace``.
"""
from __future__ import annotations

import warnings

from . import _core as C
from ._enums import check_enum, dma_engine as _dma_engine, engine as _engine
from .. import control as _control
from .. import lnc as _lnc
from .. import version as _version
from ..errors import NkiReleasedUseWarning
from ..memory import _kernel_site as _site

_SBUF_DATA = ("aws-neuron/nki-library d2ad3a5 src/nkilib_src/nkilib/core/moe/moe_cte/"
              "bwmm_shard_on_I.py:577 (core_barrier(block_idx, (0, 1)) on an SBUF tile)")
# dma_engine.gpsimd_dma: bytes per partition by element size (nki.isa.sendrecv API page)
_GPSIMD_DMA_LIMIT = {4: 1024, 2: 512, 1: 256}


def _grid():
    from .. import jit
    return jit.current_num_programs()


def _nc_v3(inst: str) -> None:
    tgt = C.target()
    if tgt.nc_version < 3:
        C.fail(inst, f"available only on NeuronCore-v3 or newer (trn2, trn3), target is {tgt.name}")


def _cores(inst: str, cores, n: int) -> tuple:
    if isinstance(cores, bool):
        raise TypeError(f"{inst}: cores must be a tuple of core indices, got {cores!r}")
    if isinstance(cores, int):          # cores=(0) in released kernels is the int 0
        cores = (cores,)
    if not isinstance(cores, (tuple, list)) or not all(
            isinstance(c, int) and not isinstance(c, bool) for c in cores):
        raise TypeError(f"{inst}: cores must be a tuple (or list) of int core indices, got "
                        f"{cores!r}")
    got = tuple(cores)
    want = tuple(range(n))
    if sorted(got) != list(want):
        if n == 1:
            C.fail(inst, f"cores={got} at LNC=1: the grid has one program, core 0 (the API page: "
                         "the barrier needs LNC enabled; released kernels pass cores=(0) when "
                         "NUM_SHARDS == 1, e.g. nki-library bwmm_shard_on_I.py:311)")
        C.fail(inst, f"cores must be (0, 1) at LNC=2 (\"Currently only cores=(0, 1) is "
                     f"supported\"), got {got}")
    return got


def _deprecated(api: str) -> None:
    """NKI 0.8.0: the nisa entry points are deprecated wrappers of nki.lnc's."""
    if _version.at_least("0.8.0"):
        _version.warn_in_kernel(
            f"nki.isa.{api} is deprecated in NKI 0.8.0 and will be removed in a future release; "
            f"use nki.lnc.{api}{' without pipe_id' if api.startswith('sendrecv') else ''} "
            "(announce-intent-eos-nki-virtualregister-lnc-apis, Neuron 2.34.0)")


def core_barrier(data, cores, engine=_engine.gpsimd, name=None):
    """Wait until every program of the LNC grid reaches this barrier (see module doc);
    deprecated by NKI 0.8.0 for ``nki.lnc.core_barrier``."""
    _deprecated("core_barrier")
    return barrier(data, cores, engine, name)


def barrier(data, cores, engine=_engine.gpsimd, name=None, module="nisa"):
    """``core_barrier`` (``nisa`` and ``nki.lnc``)."""
    inst = "core_barrier"
    C.check_name(inst, name)
    engine = check_enum(inst, "engine", engine, _engine)
    _nc_v3(inst)
    if not C.is_tensor(data):
        raise TypeError(f"{inst}: data must be an NkiTensor (the shared HBM tensor the programs "
                        f"synchronise on), got {type(data).__name__}")
    n = _grid()
    got = _cores(inst, cores, n)
    kind = data.storage.kind.value
    if data.storage.buffer == "sbuf":
        warnings.warn(f"{inst}: data in SBUF; the API page requires shared HBM, a released "
                      f"kernel does this ({_SBUF_DATA}), so it is accepted",
                      NkiReleasedUseWarning, stacklevel=2)
    elif data.storage.buffer == "psum" or (n > 1 and kind != "shared_hbm"):
        C.fail(inst, f"data must be in shared HBM (\"must be data in shared HBM\"), got a tensor "
                     f"in {kind}")
    eng = C.ENGINE_NAMES.get(engine, "gpsimd")
    run = _lnc.current()
    meets = n > 1 and run is not None and not _control.SUPPRESS_FLOOR
    h = C.emit(inst, eng, name, reads=[data], num_partitions=1, free=1, num_inputs=0, nbytes=0,
               attrs={"sync": inst, "sync_id": run.syncs if meets else -1, "cores": got})
    if meets:
        run.arrive(_lnc.Arrival(C._program_id(), inst, f"{module}.core_barrier at {_site()}", {}))
    return h


def _rank(inst: str, arg: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{inst}: {arg} must be an int rank (0 or 1), got {type(v).__name__}")
    if v not in (0, 1):
        C.fail(inst, f"{arg} must be 0 or 1 (the two cores of an LNC=2 logical core), got {v}")
    return v


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=_dma_engine.dma,
             name=None):
    """Send ``src`` to program ``send_to_rank``'s ``dst`` while receiving program
    ``recv_from_rank``'s ``src`` into this program's ``dst`` (see module doc); deprecated by
    NKI 0.8.0 for ``nki.lnc.sendrecv`` (which has no ``pipe_id``; 0.8.0 ignores it)."""
    _deprecated("sendrecv")
    if isinstance(pipe_id, bool) or not isinstance(pipe_id, int) or pipe_id < 0:
        raise TypeError(f"sendrecv: pipe_id must be a non-negative int, got {pipe_id!r}")
    return exchange("sendrecv", src, dst, send_to_rank, recv_from_rank,
                    pipe_id if not _version.at_least("0.8.0") else 0, dma_engine, name)


_REDUCE_OPS = ("add", "maximum", "minimum")


def exchange(inst, src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=_dma_engine.dma,
             name=None, reduce_op=None, priority=None, module="nisa"):
    """``sendrecv`` (``nisa`` / ``nki.lnc``) and, with ``reduce_op``, ``nki.lnc.sendrecv_compute``
    (``dst = reduce_op(src, the peer's src)``; nl.add / nl.maximum / nl.minimum; src and dst
    both in SBUF or both in private HBM: nki.lnc.sendrecv_compute API page)."""
    C.check_name(inst, name)
    dma_engine = check_enum(inst, "dma_engine", dma_engine, _dma_engine)
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 3:
            raise TypeError(f"{inst}: priority must be None or an int 0 (highest) .. 3 (lowest), "
                            f"got {priority!r}")
        if dma_engine is _dma_engine.gpsimd_dma:
            C.fail(inst, "priority must be None with dma_engine.gpsimd_dma (nki.lnc API page: "
                         "explicit priorities are rejected)")
    _nc_v3(inst)
    if reduce_op is not None:
        if getattr(reduce_op, "name", None) not in _REDUCE_OPS:
            C.fail(inst, f"reduce_op must be nl.add, nl.maximum or nl.minimum, got {reduce_op!r}")
        for arg, t in (("src", src), ("dst", dst)):
            C.tile(inst, arg, t, ("sbuf", "hbm"), quadrant=False)
            if t.storage.buffer == "hbm" and t.storage.kind.value != "private_hbm":
                C.fail(inst, f"{arg} must be in SBUF or private HBM, got {t.storage.kind.value}")
        if src.storage.buffer != dst.storage.buffer:
            C.fail(inst, "src and dst must be in the same memory space (both SBUF or both "
                         "private HBM)")
    else:
        C.tile(inst, "src", src, ("sbuf",), quadrant=False)
        C.tile(inst, "dst", dst, ("sbuf",), quadrant=False)
    if src.dtype != dst.dtype:
        C.fail(inst, f"src and dst must have the same dtype, got src {src.dtype} and dst "
                     f"{dst.dtype}")
    if tuple(src.shape) != tuple(dst.shape):
        C.fail(inst, f"src and dst must have the same shape, got src {tuple(src.shape)} and dst "
                     f"{tuple(dst.shape)}")
    n = _grid()
    to = _rank(inst, "send_to_rank", send_to_rank)
    frm = _rank(inst, "recv_from_rank", recv_from_rank)
    P = src.shape[0]
    bpp = src.elements_per_partition * src.dtype.itemsize
    if dma_engine is _dma_engine.gpsimd_dma:
        limit = _GPSIMD_DMA_LIMIT.get(src.dtype.itemsize)
        if limit is not None and bpp > limit:
            C.fail(inst, f"dma_engine.gpsimd_dma moves at most {limit} bytes per partition of a "
                         f"{8 * src.dtype.itemsize}-bit type, got {bpp}")
    if n == 1:
        C.fail(inst, "sendrecv needs LNC=2 (\"only allowed ... when LNC (Logical NeuronCore) is "
                     "enabled\"); this launch has one program")
    # in the trace both are a "sendrecv" (a compute adds ``reduce_op``): the cost model
    # joins the programs there
    attrs = {"sync": "sendrecv", "sync_id": -1, "send_to_rank": to, "recv_from_rank": frm,
             "pipe_id": pipe_id, "dma_engine": dma_engine.name, "partitions": P,
             "bytes_per_partition": bpp, "dge_mode": "none", "indirect": False,
             "transpose": False}
    if reduce_op is not None:
        attrs["reduce_op"] = reduce_op.name
    kw = dict(reads=[src], writes=[dst], num_partitions=P, free=src.elements_per_partition,
              num_inputs=1, nbytes=P * bpp, operands={"dst": dst, "src": src})
    run = _lnc.current()
    if run is None or _control.SUPPRESS_FLOOR:
        return C.emit("sendrecv", "dma", name, attrs=attrs, **kw)
    attrs["sync_id"] = run.syncs
    pid = C._program_id()
    arrival = _lnc.Arrival(pid, inst, f"{module}.{inst} at {_site()}",
                           {"src": src, "dst": dst, "send_to_rank": to, "recv_from_rank": frm,
                            "pipe_id": pipe_id, "reduce_op": reduce_op})
    h = C.emit("sendrecv", "dma", name, attrs=attrs, **kw)
    run.arrive(arrival)
    return h


__all__ = ["core_barrier", "sendrecv", "barrier", "exchange"]
