"""One case on the Neuron SDK, in its own process: compile, run, check.

    NKI_ARTIFACTS_DIR=<out>/artifacts NKI_SSM_BACKEND=neuron NEURON_PLATFORM_TARGET_OVERRIDE=trn2 \\
      python -m deploy.bench.worker --case '<case id>' --out <out> [--compile-only]

The op runs through the host API, ``nki_ssm.ops.<op>(..., backend="neuron")``,
exactly as a user calls it; the bench never calls a kernel itself, so kernel
signatures can change freely. ``nki_ssm.backend.run`` is wrapped while the op
runs, to keep each launch's array arguments (named by the kernel's parameters)
for the profiler.

Compile: the SDK's standalone path (call the ``@nki.jit`` kernel with NumPy
arrays) compiles, writes the NEFF, then executes. The NEFF is looked for where
the documented variables put it (:func:`neff_dirs`): NKI_ARTIFACTS_DIR and the
working directory. On a host without a Neuron device the execution fails after
the NEFF is written (nrtpy tutorial "Test and debug a NKI kernel end-to-end",
step 2): with ``--compile-only`` a NEFF on disk is the compile's success.
Compile time = the NEFF's modification time - the launch time (execution comes
after it); each launch's NEFF is copied next to its inputs (a later launch may
overwrite it). A launch whose arguments cannot be named by the kernel's
parameters is recorded with ``inputs_error``: the bench does not time it.

Writes ``<out>/worker.json``; exit 0 when the case passed (compiled, and on a
device: within tolerance with every other pool slot bit-identical).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np


def neff_dirs(out: Path) -> list[Path]:
    """Where the SDK writes a NEFF: NKI_ARTIFACTS_DIR (SDK 2.32 nrtpy tutorial "Test and debug
    a NKI kernel end-to-end": set before importing nki, NEFF at ``<dir>/kernel.neff``), and
    the working directory (2.31 docs: NEURON_FRAMEWORK_DEBUG=1 keeps the artifacts there)."""
    dirs = [Path(os.environ.get("NKI_ARTIFACTS_DIR") or out / "artifacts"), Path.cwd()]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def _newest_neff(roots, since: float, skip: Path | None = None) -> Path | None:
    """The newest NEFF under any of ``roots`` written at or after ``since`` (None: none);
    files under ``skip`` (the worker's own copies) do not count."""
    if isinstance(roots, (str, Path)):
        roots = [roots]
    fresh = []
    for root in map(Path, roots):
        if root.is_dir():
            fresh += [p for p in root.rglob("*.neff") if p.stat().st_mtime >= since - 1.0
                      and not (skip is not None and p.resolve().is_relative_to(skip.resolve()))]
    return max(fresh, key=lambda p: p.stat().st_mtime) if fresh else None


@contextlib.contextmanager
def capture_launches(out_dir: Path, artifacts):
    """Wrap ``nki_ssm.backend.run`` while the op runs. Per launch: the kernel's name, its
    array arguments by parameter name (raw C-order ``.bin`` files, saved before the launch
    can modify a pool; ``inputs_error`` when they cannot be named: such a launch is not
    timed), and a copy of the NEFF it produced (``launch_<k>/kernel.neff``: a later launch
    may overwrite the SDK's file), with its compile time. ``artifacts``: the folder, or
    folders, the NEFF may land in (:func:`neff_dirs`)."""
    from nki_ssm import backend
    from nki_ssm import backend as backend_mod   # the wrapper's keyword shadows the name

    launches = []
    original = backend.run

    def run(kernel, *args, backend=None, lnc=None, **kwargs):  # noqa: A002 - the original's keywords
        k = len(launches)
        here = out_dir / f"launch_{k}"
        here.mkdir(parents=True, exist_ok=True)
        fn = getattr(kernel, "func", None) or getattr(kernel, "fn", None) or kernel
        entry = {"index": k, "kernel": getattr(fn, "__name__", type(kernel).__name__),
                 "module": getattr(fn, "__module__", None), "inputs": [], "neff": None,
                 "lnc": backend_mod.logical_nc_config(backend) if lnc is None else lnc}
        try:
            named = list(inspect.signature(fn).bind(*args, **kwargs).arguments.items())
        except (TypeError, ValueError) as exc:   # the NEFF's inputs are named by parameter
            named = []
            entry["inputs_error"] = (f"the arguments of {entry['kernel']} could not be named by "
                                     f"its parameters ({type(exc).__name__}: {exc})")
        for name, value in named:
            if isinstance(value, np.ndarray):
                path = here / f"{name}.bin"
                np.ascontiguousarray(value).tofile(path)
                entry["inputs"].append({"name": name, "shape": list(value.shape),
                                        "dtype": str(value.dtype), "file": str(path)})
        launches.append(entry)
        t0 = entry["t_launch"] = time.time()
        try:
            return original(kernel, *args, backend=backend, lnc=lnc, **kwargs)
        finally:   # compiled even when the execution then fails (no device)
            neff = _newest_neff(artifacts, t0, skip=out_dir)
            if neff is not None:
                copy = here / "kernel.neff"
                shutil.copy2(neff, copy)
                entry["neff"] = {"path": str(copy), "bytes": copy.stat().st_size,
                                 "compile_s": max(0.0, neff.stat().st_mtime - t0)}

    backend.run = run
    try:
        yield launches
    finally:
        backend.run = original


def run_case(case, out: Path, *, compile_only: bool, seed: int = 0) -> dict:
    from nki_ssm import ops
    from nki_ssm.reference.testing import padding_rows, unnamed_slots
    from simulate.run import _reference_errors

    from deploy.bench.cases import tolerance

    artifacts = neff_dirs(out)
    kw = case.make_inputs(seed)
    pool = case.pool_name
    args = dict(kw)
    args[pool] = kw[pool].copy()
    res = {"case_id": case.id, "op": case.op, "compile_only": compile_only, "status": None,
           "error": None, "tol": tolerance(case), "neffs": [], "warnings": []}
    t0 = time.time()
    out_arr = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture_launches(out / "inputs", artifacts) as launches:
            try:
                out_arr = getattr(ops, case.op)(**args, backend="neuron")
            except Exception as exc:   # compile error, or (compile-only) no device to run on
                res["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                res["traceback"] = traceback.format_exc(limit=8)
    res["call_s"] = time.time() - t0
    res["launches"] = launches
    res["neffs"] = [ln["neff"] for ln in launches if ln["neff"]]
    if res["neffs"]:
        res["compile_s"] = sum(n["compile_s"] for n in res["neffs"])
    # the compiler's own output goes to the process's stdout / stderr: the bench reads it
    res["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught][:50]
    if not launches and res["error"] and res["error"].startswith("NotImplementedError"):
        res["status"] = "no_kernel"        # the op has no launcher yet: nothing to compile
        return res
    if not launches or len(res["neffs"]) < len(launches):
        res["status"] = "compile_error"
        res["error"] = res["error"] or ("the op launched no kernel" if not launches else
                                        f"{len(launches) - len(res['neffs'])} of {len(launches)} "
                                        "launches wrote no NEFF")
        return res
    if compile_only:
        res["status"] = "compiled"
        # without a device the SDK's execution after the compile fails: expected, kept apart
        res["execution_error"], res["error"] = res["error"], None
        return res
    if out_arr is None:
        res["status"] = "run_error"
        return res
    if isinstance(out_arr, tuple):
        out_arr = out_arr[0]
    idx = np.asarray(kw["state_indices"])
    live = idx[idx >= 0]
    err_out, err_state = _reference_errors(case, kw, np.asarray(out_arr), args[pool][live])
    res["err_out"], res["err_state"] = err_out.value(), err_state.value()
    res["max_abs_out"] = err_out.max_scaled()
    others = unnamed_slots(idx, kw[pool].shape[0])
    res["pool_untouched"] = bool(args[pool][others].tobytes() == kw[pool][others].tobytes())
    out64 = np.asarray(out_arr, dtype=np.float64)
    res["padding_zero"] = all(not out64[r].any() for r in padding_rows(kw))   # contracts: zeros
    ok = (res["err_out"] <= res["tol"] and res["err_state"] <= res["tol"] and res["pool_untouched"]
          and res["padding_zero"])
    res["status"] = "passed" if ok else "failed"
    if not ok and live.size and args[pool][live].tobytes() == kw[pool][live].tobytes():
        res["hint"] = ("the named pool slots are unchanged after the call: the kernel's in-place "
                       "writes to its pool input did not come back to the host array (standalone "
                       "mode may copy inputs to the device without copying them back)")
    if not ok:
        res["error"] = (f"rel err out {res['err_out']:.3g}, state {res['err_state']:.3g} (tol "
                        f"{res['tol']:g}); other pool slots untouched: {res['pool_untouched']}; "
                        f"padding outputs zero: {res['padding_zero']}")
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.bench.worker", description=__doc__.splitlines()[0])
    p.add_argument("--case", required=True, help="case id (simulate/cases.py)")
    p.add_argument("--out", required=True)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from deploy.bench.cases import find

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        res = run_case(find(a.case), out, compile_only=a.compile_only, seed=a.seed)
    except Exception as exc:   # a broken case setup is reported like a failed compile
        res = {"case_id": a.case, "status": "error", "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc(limit=8)}
    (out / "worker.json").write_text(json.dumps(res, indent=1, default=str))
    return 0 if res["status"] in ("compiled", "passed", "no_kernel") else 1


if __name__ == "__main__":
    sys.exit(main())
