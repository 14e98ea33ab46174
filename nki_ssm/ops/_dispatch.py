"""Backend resolution and the launch/commit step shared by every op.

``backend=None`` runs the kernel launcher of the op (module
``nki_ssm.ops.launch.<family>``, function ``prefill`` / ``decode``) on the NKI
implementation that ``nki_ssm.backend.name()`` picks ("sim" or "neuron"), or
the float64 reference where no launcher (or no ``nki_ssm.backend``) exists
yet. ``"sim"`` / ``"neuron"`` require a launcher (NotImplementedError
otherwise). ``"reference"`` always works.

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

import importlib

import ml_dtypes
import numpy as np

BACKENDS = (None, "reference", "sim", "neuron")
_LAUNCH_PACKAGE = "nki_ssm.ops.launch"
# Op names are <prefix>_<entry>; the launch module is named by family.
_OP_PREFIX = {"short_conv": "short_conv", "mamba2_ssd": "ssd", "gated_delta": "gated_delta"}


def _import(name: str):
    """The one import point of this module (tests monkeypatch it with fake modules)."""
    return importlib.import_module(name)


def find_launcher(family: str, entry: str):
    """``nki_ssm.ops.launch.<family>.<entry>`` or None when it does not exist.

    Only a missing launch module or function means "no launcher"; any other
    import error inside an existing launcher propagates.
    """
    module_name = f"{_LAUNCH_PACKAGE}.{family}"
    try:
        module = _import(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in (_LAUNCH_PACKAGE, module_name):
            return None
        raise
    launcher = getattr(module, entry, None)
    return launcher if callable(launcher) else None


def _default_nki_backend():
    """``nki_ssm.backend.name()``, or None while that module does not exist yet."""
    try:
        module = _import("nki_ssm.backend")
    except ModuleNotFoundError as exc:
        if exc.name == "nki_ssm.backend":
            return None
        raise
    return module.name()


def resolve(family: str, entry: str, backend) -> tuple:
    """-> ``("reference", None)`` or ``(nki_backend_name, launcher)``."""
    op = f"{_OP_PREFIX[family]}_{entry}"
    if not (backend is None or (isinstance(backend, str) and backend in BACKENDS)):
        raise ValueError(
            f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}"
        )
    if backend == "reference":
        return "reference", None
    launcher = find_launcher(family, entry)
    if backend is None:
        nki_backend = None if launcher is None else _default_nki_backend()
        return ("reference", None) if nki_backend is None else (nki_backend, launcher)
    if launcher is None:
        raise NotImplementedError(
            f"{op} has no NKI kernel launcher yet (nki_ssm.ops.launch.{family}.{entry}), "
            f"so backend={backend!r} is unavailable; backends that work: None, 'reference'"
        )
    return backend, launcher


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


def run(family: str, entry: str, kwargs: dict, *, pools: tuple, reference, backend):
    """Launch one validated call and commit its pool updates.

    ``kwargs``: the validated, normalised op arguments (pool arrays are the
    caller's). ``pools``: the names of the pool arguments in ``kwargs``.
    ``reference(**kwargs) -> (outputs, {pool_name: new_pool})`` where
    ``outputs`` is what the op returns, already cast to the output dtypes
    (with ``cast_rne``).
    """
    kind, launcher = resolve(family, entry, backend)
    slots = named_slots(kwargs["state_indices"])
    if any(kwargs[name].shape[0] == 0 for name in pools):
        # A pool without slots admits only padding sequences (a shape fact,
        # known before launch): nothing to launch; the reference gives the
        # contract's all-padding result (zero outputs) without touching it.
        launcher = None
    if launcher is None:
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
