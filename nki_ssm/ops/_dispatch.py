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
bug this cannot undo). Launchers see C-contiguous arrays only.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from .launch import gated_delta as _gated_delta_launch
from .launch import mamba2_ssd as _ssd_launch
from .launch import short_conv as _conv_launch

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


def cast_rne(values, dtype) -> np.ndarray:
    """``values`` cast to ``dtype`` with one round-to-nearest-even.

    ml_dtypes casts float64 -> bfloat16 through float32, rounding twice
    (1 + 2**-8 + 2**-40 becomes 1.0 instead of 1 + 2**-7). Rounding float64
    to float32 *to odd* first makes the second RNE step exact, because
    float32 keeps more than bfloat16's 8 significant bits + 2.
    """
    dtype = np.dtype(dtype)
    a = np.asarray(values)
    if dtype != np.dtype(ml_dtypes.bfloat16) or a.dtype != np.float64:
        return a.astype(dtype)
    with np.errstate(over="ignore"):  # beyond float32 range is inf in bfloat16 too
        f = a.astype(np.float32)
    back = f.astype(np.float64)
    fix = (back != a) & np.isfinite(f) & ((f.view(np.uint32) & 1) == 0)
    if fix.any():
        toward = np.where(a[fix] > back[fix], np.float32(np.inf), np.float32(-np.inf))
        f[fix] = np.nextafter(f[fix], toward)
    return f.astype(dtype)


def named_slots(state_indices: np.ndarray) -> np.ndarray:
    """Pool slots this call may write: the non-padding state_indices."""
    return state_indices[state_indices >= 0]


def run(launcher, kwargs: dict, *, pools: tuple, reference, backend):
    """Launch one validated call and commit its pool updates.

    ``launcher``: the op's kernel launcher (``nki_ssm.ops.launch.<family>.prefill``
    / ``decode``), run unless the backend is "reference". ``kwargs``: the
    validated, normalised op arguments (pool arrays are the caller's).
    ``pools``: the names of the pool arguments in ``kwargs``.
    ``reference(**kwargs) -> (outputs, {pool_name: new_pool})`` where
    ``outputs`` is what the op returns, already cast to the output dtypes
    (with ``cast_rne``).
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
        outputs, new_pools = reference(**kwargs)
        # Cast everything before the first write so a failing cast cannot
        # leave a pool half-updated.
        staged = {
            name: cast_rne(np.asarray(new_pools[name])[slots], kwargs[name].dtype)
            for name in pools
        }
        for name, values in staged.items():
            kwargs[name][slots] = values
        return outputs
    return _launch(launcher, kind, kwargs, pools, slots)


def _launch(launcher, kind: str, kwargs: dict, pools: tuple, slots: np.ndarray):
    """Run a kernel launcher on C-contiguous arrays; restore named slots on failure.

    Kernels address HBM tensors as dense row-major buffers, so strided
    inputs are made contiguous. A strided pool (e.g. a view into a larger
    cache) is replaced by a contiguous working copy whose named slots are
    committed back only on success.
    """
    args = {n: np.ascontiguousarray(a) if isinstance(a, np.ndarray) and n not in pools else a
            for n, a in kwargs.items()}
    direct = [n for n in pools if kwargs[n].flags.c_contiguous]
    for n in pools:
        if n not in direct:
            args[n] = np.ascontiguousarray(kwargs[n])
    snapshot = {n: kwargs[n][slots].copy() for n in direct}
    try:
        out = launcher(**args, backend=kind)
    except BaseException:
        for n, values in snapshot.items():
            kwargs[n][slots] = values
        raise
    for n in pools:
        if n not in direct:
            kwargs[n][slots] = args[n][slots]
    return out
