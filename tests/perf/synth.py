"""Hand-built trace instructions for cost-model unit tests (no simulator needed)."""
from __future__ import annotations

import itertools

from nki_ssm.sim.trace import Instruction, Region, Trace

_ids = itertools.count(1000)


def new_storage() -> int:
    return next(_ids)


def sbuf(sid, parts=128, nbytes=2048, p0=0, b0=0):
    return Region("sbuf", sid, p0, parts, b0, b0 + nbytes)


def hbm(sid, nbytes, b0=0):
    return Region("hbm", sid, 0, 1, b0, b0 + nbytes)


def vec(reads, writes, n=512, inputs=2, engine="vector", op="tensor_tensor", **attrs):
    return Instruction(index=0, op=op, engine=engine, reads=tuple(reads), writes=tuple(writes),
                       num_partitions=128, free_size=n, num_inputs=inputs, nbytes=n * 4 * 128,
                       attrs=dict(attrs))


def act(reads, writes, n=512, **attrs):
    return vec(reads, writes, n=n, inputs=1, engine="scalar", op="activation", **attrs)


def mm(reads, writes, K=128, M=128, N=512, fp32=False, **attrs):
    return Instruction(index=0, op="nc_matmul", engine="tensor", reads=tuple(reads),
                       writes=tuple(writes), num_partitions=K, free_size=N, num_inputs=2,
                       nbytes=M * N * 4, attrs=dict(K=K, M=M, N=N, fp32=fp32, **attrs))


def dma(src, dst, nbytes, partitions=128, **attrs):
    return Instruction(index=0, op="dma_copy", engine="dma", reads=(src,), writes=(dst,),
                       num_partitions=partitions, free_size=nbytes // max(partitions, 1) // 4,
                       num_inputs=1, nbytes=nbytes,
                       attrs=dict(partitions=partitions,
                                  bytes_per_partition=nbytes / max(partitions, 1), **attrs))


def trace_of(*insts, target="trn2") -> Trace:
    tr = Trace(target=target)
    for inst in insts:
        tr.append(inst)
    return tr
