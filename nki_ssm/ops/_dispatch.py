"""Backend resolution and the launch/commit step shared by every op.

Each op names its kernel launcher with a plain import (``from .launch import
gated_delta as launch`` ... ``run(launch.prefill, ...)``), so the path op ->
launcher -> kernel reads top to bottom and tools that follow imports can
follow it. ``backend=None`` runs what ``nki_ssm.backend.default_op_backend()``
names: that launcher on the NKI implementation ``NKI_SSM_BACKEND`` picks
("sim" or "neuron"), or the float64 reference when it is ``reference``;
``"sim"`` / ``"neuron"`` run the launcher on that implementation;
``"reference"`` runs the float64 reference.

A pool with zero slots (every sequence then is padding) launches nothing on
any backend: the call returns zero outputs, computed by the reference.

Pool safety: the reference returns new arrays, which are committed into the
caller's pools (named slots only, cast to the pool dtype with
round-to-nearest-even) after every output has been computed and cast. A
launcher updates pools in place itself; if it raises, the named slots are
restored from a snapshot taken before the launch, so a failed call leaves
every pool as it was (a launcher writing outside the named slots is a kernel
bug this cannot undo). Launchers see C-contiguous arrays only: a strided
pool is handed to them, and to the reference, as a compact pool of the
named slots (``compact``), so a call's cost never grows with the pool.
"""
from __future__ import annotations

import numpy as np

from .launch._arrays import cast_rne  # noqa: F401  (the ops' cast; it lives with the launchers)
from .launch import gated_delta as _gated_delta_launch
from .launch import mamba2_ssd as _ssd_launch
from .launch import short_conv as _conv_launch
from .launch.buckets import seq_bucket

BACKENDS = (None, "reference", "sim", "neuron")
# (launcher family, entry) -> launcher, for tools that list which ops run a kernel
# (simulate, deploy); each op imports its own launcher.
_LAUNCHERS = {
    ("short_conv", "prefill"): _conv_launch.prefill,
    ("short_conv", "decode"): _conv_launch.decode,
    ("mamba2_ssd", "prefill"): _ssd_launch.prefill,
    ("mamba2_ssd", "decode"): _ssd_launch.decode,
    ("gated_delta", "prefill"): _gated_delta_launch.prefill,
    ("gated_delta", "decode"): _gated_delta_launch.decode,
}


def find_launcher(family: str, entry: str):
    """``nki_ssm.ops.launch.<family>.<entry>``, or None for an op without a launcher."""
    return _LAUNCHERS.get((family, entry))


def nki_backend_name() -> str:
    """What ``backend=None`` runs on: ``nki_ssm.backend.default_op_backend()``
    ("reference", "sim" or "neuron").

    Imported on first use: choosing it imports the Neuron SDK or the simulator,
    which a caller passing an explicit backend never needs.
    """
    from nki_ssm import backend

    return backend.default_op_backend()


def resolve(backend) -> str:
    """``backend`` (None, "reference", "sim", "neuron") -> "reference", "sim" or "neuron"."""
    if not (backend is None or (isinstance(backend, str) and backend in BACKENDS)):
        raise ValueError(
            f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}"
        )
    return nki_backend_name() if backend is None else backend


def named_slots(state_indices: np.ndarray) -> np.ndarray:
    """Pool slots this call may write: the non-padding state_indices."""
    return state_indices[state_indices >= 0]


def compact(kwargs: dict, pools: tuple, size: int | None = None) -> dict:
    """``kwargs`` with each pool replaced by a new C-contiguous pool of ``size`` slots
    (default: one per named slot) holding the named slots in the order the batch names
    them (zeros after), and ``state_indices`` renumbered to match (-1 stays -1).

    Reads the caller's pools slot by slot (a gather of the named slots), so its cost
    follows the batch, not the pool: a pool that is a strided view into a larger cache
    (a serving engine's page-padded layout) is never copied whole.
    """
    idx = kwargs["state_indices"]
    live = idx >= 0
    slots = idx[live]
    size = slots.size if size is None else size
    out = dict(kwargs)
    renumbered = np.full_like(idx, -1)
    renumbered[live] = np.arange(slots.size, dtype=idx.dtype)
    out["state_indices"] = renumbered
    for name in pools:
        pool = kwargs[name]
        work = np.zeros((size,) + pool.shape[1:], dtype=pool.dtype)
        work[: slots.size] = pool[slots]
        out[name] = work
    return out


def run(launcher, kwargs: dict, *, pools: tuple, reference, backend):
    """Launch one validated call and commit its pool updates.

    ``launcher``: the op's kernel launcher (``nki_ssm.ops.launch.<family>.prefill``
    / ``decode``), run unless the backend is "reference". ``kwargs``: the
    validated, normalised op arguments (pool arrays are the caller's).
    ``pools``: the names of the pool arguments in ``kwargs``.
    ``reference(**kwargs) -> (outputs, {pool_name: new_pool})`` where
    ``outputs`` is what the op returns, already cast to the output dtypes
    (with ``cast_rne``). The reference sees a compact pool of the named slots
    (``compact``), so its float64 work follows the batch, not the pool.
    """
    kind = resolve(backend)
    if kind != "reference":
        # the LNC every launch on this backend runs at: a bad NEURON_LOGICAL_NC_CONFIG fails
        # here, before any pool is touched, pool without slots included (as on the device path)
        from nki_ssm import backend as nki_backend

        nki_backend.logical_nc_config(kind)
    slots = named_slots(kwargs["state_indices"])
    if kind == "reference" or any(kwargs[name].shape[0] == 0 for name in pools):
        # A pool without slots admits only padding sequences (a shape fact,
        # known before launch): nothing to launch; the reference gives the
        # contract's all-padding result (zero outputs) without touching it.
        outputs, new_pools = reference(**compact(kwargs, pools))
        # Cast everything before the first write so a failing cast cannot
        # leave a pool half-updated.
        staged = {
            name: cast_rne(np.asarray(new_pools[name])[: slots.size], kwargs[name].dtype)
            for name in pools
        }
        for name, values in staged.items():
            kwargs[name][slots] = values
        return outputs
    return _launch(launcher, kind, kwargs, pools, slots)


def _launch(launcher, kind: str, kwargs: dict, pools: tuple, slots: np.ndarray):
    """Run a kernel launcher on C-contiguous arrays; restore named slots on failure.

    Kernels address HBM tensors as dense row-major buffers, so strided
    inputs are made contiguous. A C-contiguous pool is the kernel's own
    (updated in place; its named slots restored from a snapshot if the launch
    fails). A strided pool (e.g. a slot view into a serving engine's
    page-padded cache) is replaced by a compact working pool of its named
    slots (``compact``; slot count rounded up to the launchers' sequence
    bucket, so a device compiles one program per bucket), committed back slot
    by slot only on success: the cost follows the batch, not the pool.
    """
    direct = all(kwargs[n].flags.c_contiguous for n in pools)
    work = kwargs if direct else compact(kwargs, pools, seq_bucket(slots.size))
    args = {n: np.ascontiguousarray(a) if isinstance(a, np.ndarray) and n not in pools else a
            for n, a in work.items()}
    snapshot = {n: kwargs[n][slots].copy() for n in pools} if direct else {}
    try:
        out = launcher(**args, backend=kind)
    except BaseException:
        for n, values in snapshot.items():
            kwargs[n][slots] = values
        raise
    if not direct:
        for n in pools:
            kwargs[n][slots] = args[n][: slots.size]
    return out
