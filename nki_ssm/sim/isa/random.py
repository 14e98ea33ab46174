"""Pseudo-random instructions: ``rng``, ``rand2``, ``dropout``, ``set_rng_seed``,
``rand_set_state``, ``rand_get_state``.

Each engine lane runs XORWOW (the generator the ``rand2`` documentation
names): state words (x, y, z, w, v, d); a step is
``t = x ^ (x >> 2); x, y, z, w = y, z, w, v; v = (v ^ (v << 4)) ^ (t ^ (t << 1));
d += 362437; out = v + d``. GpSimd lanes hold 6 state words (one
generator); VectorE lanes hold 24 (four generators, used round-robin over
a partition's elements). That layout and the way ``set_rng_seed`` expands
one 32-bit seed into lane states (splitmix32 of seed and lane) are our
assumptions: streams are deterministic and well distributed, not the
hardware's bits. Unseeded engines start from seed 0. State is per SPMD
program, like the accumulators.
"""
from __future__ import annotations

import numpy as np

from . import _core as C
from . import _state as S
from ._enums import check_enum, engine as _engine

_U32 = np.uint32
_WORDS = {"gpsimd": 6, "vector": 24}


def _splitmix32(x: np.ndarray) -> np.ndarray:
    x = (x + np.uint32(0x9E3779B9)).astype(_U32)
    x = ((x ^ (x >> np.uint32(16))) * np.uint32(0x85EBCA6B)).astype(_U32)
    x = ((x ^ (x >> np.uint32(13))) * np.uint32(0xC2B2AE35)).astype(_U32)
    return (x ^ (x >> np.uint32(16))).astype(_U32)


def _seeded(seed: int, words: int) -> np.ndarray:
    """[128, words] lane states derived from one 32-bit seed."""
    lane = np.arange(C.PMAX, dtype=_U32)[:, None]
    k = np.arange(words, dtype=_U32)[None, :]
    with np.errstate(over="ignore"):
        st = _splitmix32((np.uint32(seed) ^ (lane * np.uint32(0x632BE5AB)) ^ (k * np.uint32(0x1B873593))).astype(_U32))
    st[:, 0::6] |= np.uint32(1)   # an all-zero xorwow state would be stuck
    return st


def _states(eng: str) -> np.ndarray:
    table = S.rng_states()
    st = table.get(eng)
    if st is None:
        st = _seeded(0, _WORDS[eng])
        table[eng] = st
    return st


def _draw(eng: str, lanes: slice, P: int, F: int) -> np.ndarray:
    """[P, F] uint32 from the lanes' generators (advances the state)."""
    st = _states(eng)
    gens = _WORDS[eng] // 6
    s = st[lanes].reshape(P, gens, 6).copy()
    out = np.empty((P, F), dtype=_U32)
    with np.errstate(over="ignore"):
        for i in range(F):
            g = i % gens
            x, y, z, w, v, d = (s[:, g, k] for k in range(6))
            t = x ^ (x >> np.uint32(2))
            nv = (v ^ (v << np.uint32(4))) ^ (t ^ (t << np.uint32(1)))
            nd = d + np.uint32(362437)
            s[:, g, 0], s[:, g, 1], s[:, g, 2], s[:, g, 3], s[:, g, 4], s[:, g, 5] = y, z, w, v, nv, nd
            out[:, i] = nv + nd
    st[lanes] = s.reshape(P, -1)
    return out


def _lanes(t):
    return slice(t.partition_start, t.partition_start + t.shape[0])


def rng(dst, engine=_engine.vector, name=None):
    """32 random bits per element into integer ``dst`` (least significant bits kept)."""
    inst = "rng"
    C.check_name(inst, name)
    engine = check_enum(inst, "engine", engine, _engine)
    if engine not in (_engine.vector, _engine.gpsimd):
        C.fail(inst, f"engine must be engine.vector or engine.gpsimd, got {engine}")
    if engine is _engine.gpsimd and C.target().nc_version < 3:
        C.fail(inst, f"engine=gpsimd needs NeuronCore-v3 or newer, target is {C.target().name}")
    C.tile(inst, "dst", dst, ("sbuf",) if engine is _engine.gpsimd else ("sbuf", "psum"))
    if not dst.dtype.is_int:
        C.fail(inst, f"dst must be an integer dtype (int8..uint32), got {dst.dtype}")
    P, F = dst.shape[0], dst.elements_per_partition
    eng = C.ENGINE_NAMES[engine]
    bits = _draw(eng, _lanes(dst), P, F)
    dst.write(bits.astype(dst.dtype.np).reshape(dst.shape))   # astype keeps the low bits
    return C.emit(inst, eng, name, writes=[dst], num_partitions=P, free=F, num_inputs=0,
                  nbytes=P * F * dst.dtype.itemsize, compute=(dst,), operands={"dst": dst})


def rand2(dst, min, max, name=None):  # noqa: A002  (documented parameter names)
    """Uniform float32 values in [min, max] per element (NeuronCore-v4, VectorE)."""
    inst = "rand2"
    C.check_name(inst, name)
    if C.target().nc_version < 4:
        C.fail(inst, f"rand2 is NeuronCore-v4 (trn3) only, target is {C.target().name}")
    C.tile(inst, "dst", dst)
    P, F = dst.shape[0], dst.elements_per_partition
    lo = C.scalar_or_column(inst, "min", min, P, fp32=True)
    hi = C.scalar_or_column(inst, "max", max, P, fp32=True)
    if np.any(np.asarray(lo) >= np.asarray(hi)):
        C.fail(inst, "min must be < max")
    u = _draw("vector", _lanes(dst), P, F).astype(np.float64) / 2.0 ** 32
    C.write(dst, (lo + (hi - lo) * u).astype(np.float32))
    return C.emit(inst, "vector", name, writes=[dst], num_partitions=P, free=F, num_inputs=0,
                  nbytes=P * F * dst.dtype.itemsize, compute=(dst,), operands={"dst": dst})


def dropout(dst, data, prob, name=None):
    """Zero each element of ``data`` with probability ``prob`` (scalar or (P, 1)); VectorE."""
    inst = "dropout"
    C.check_name(inst, name)
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    C.same_shape(inst, "data", data, "dst", dst)
    if dst.dtype.name != data.dtype.name:
        C.fail(inst, f"dst dtype must equal data dtype {data.dtype}, got {dst.dtype}")
    P, F = data.shape[0], data.elements_per_partition
    if C.is_tensor(prob) and data.dtype.is_int and prob.dtype.name != "float32":
        C.fail(inst, f"prob must be float32 for integer data, got {prob.dtype}")
    if C.is_tensor(prob) and not prob.dtype.is_float:
        C.fail(inst, f"prob must have a float dtype, got {prob.dtype}")
    p = C.scalar_or_column(inst, "prob", prob, P, fp32=False)
    u = _draw("vector", _lanes(data), P, F).astype(np.float64) / 2.0 ** 32
    keep = u >= np.asarray(p, dtype=np.float64)
    x = C.read_raw(data)
    dst.write(np.where(keep, x, np.zeros((), x.dtype)).reshape(dst.shape))
    return C.emit(inst, "vector", name, reads=[data] + ([prob] if C.is_tensor(prob) else []),
                  writes=[dst], num_partitions=P, free=F, num_inputs=1,
                  nbytes=P * F * dst.dtype.itemsize, compute=(dst, data), operands={"dst": dst, "data": data})


def set_rng_seed(src_seeds, name=None):
    """Seed the VectorE generators from the 32-bit value of a [1, 1] SBUF/PSUM tensor."""
    inst = "set_rng_seed"
    C.check_name(inst, name)
    C.tile(inst, "src_seeds", src_seeds)
    if tuple(src_seeds.shape) != (1, 1) or src_seeds.dtype.itemsize != 4:
        C.fail(inst, f"src_seeds must be a [1, 1] 32-bit tensor, got {tuple(src_seeds.shape)} {src_seeds.dtype}")
    seed = int(src_seeds.read().reshape(-1).view(_U32)[0])
    S.rng_states()["vector"] = _seeded(seed, _WORDS["vector"])
    return C.emit(inst, "vector", name, reads=[src_seeds], num_partitions=1, free=1, num_inputs=1,
                  nbytes=0, compute=(src_seeds,), operands={"src_seeds": src_seeds})


def _state_engine(inst, engine):
    engine = check_enum(inst, "engine", engine, _engine)
    v = C.target().nc_version
    if v < 3:
        C.fail(inst, f"{inst} needs NeuronCore-v3 or newer, target is {C.target().name}")
    if engine not in (_engine.gpsimd, _engine.vector) or (engine is _engine.vector and v < 4):
        C.fail(inst, f"engine must be engine.gpsimd (or engine.vector on NeuronCore-v4+), got {engine}")
    return C.ENGINE_NAMES[engine]


def rand_set_state(src_seeds, engine=_engine.gpsimd, name=None):
    """Load per-lane generator states (uint32, 6 words GpSimd / 24 VectorE per partition) from SBUF."""
    inst = "rand_set_state"
    C.check_name(inst, name)
    eng = _state_engine(inst, engine)
    C.tile(inst, "src_seeds", src_seeds, ("sbuf",))
    words = _WORDS[eng]
    if src_seeds.dtype.name != "uint32" or src_seeds.elements_per_partition != words:
        C.fail(inst, f"src_seeds must be uint32 with {words} elements per partition for {eng}, "
                     f"got {src_seeds.dtype} with {src_seeds.elements_per_partition}")
    _states(eng)[_lanes(src_seeds)] = C.read_raw(src_seeds)
    P = src_seeds.shape[0]
    return C.emit(inst, eng, name, reads=[src_seeds], num_partitions=P, free=words, num_inputs=1,
                  nbytes=0, compute=(src_seeds,), operands={"src_seeds": src_seeds})


def rand_get_state(dst, engine=_engine.gpsimd, name=None):
    """Store the per-lane generator states into ``dst`` (uint32, 6 or 24 words per partition)."""
    inst = "rand_get_state"
    C.check_name(inst, name)
    eng = _state_engine(inst, engine)
    bufs = ("sbuf",) if eng == "gpsimd" or C.target().nc_version < 4 else ("sbuf", "psum")
    C.tile(inst, "dst", dst, bufs)
    words = _WORDS[eng]
    if dst.dtype.name != "uint32" or dst.elements_per_partition != words:
        C.fail(inst, f"dst must be uint32 with {words} elements per partition for {eng}, "
                     f"got {dst.dtype} with {dst.elements_per_partition}")
    dst.write(_states(eng)[_lanes(dst)].reshape(dst.shape))
    P = dst.shape[0]
    return C.emit(inst, eng, name, writes=[dst], num_partitions=P, free=words, num_inputs=0,
                  nbytes=P * words * 4, compute=(dst,), operands={"dst": dst})
