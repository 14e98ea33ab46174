"""FAKE Neuron SDK `nki` package for the deploy tests (not the real SDK).

``nki.language`` / ``nki.isa`` are the bundled simulator's modules, so the
project's kernels import and trace unchanged. Calling a ``@nki.jit`` kernel
with NumPy arrays does what the SDK's standalone mode does, in miniature:
"compiles" (prints a compiler warning, writes ``kernel.neff`` under
NKI_ARTIFACTS_DIR), then executes: on the simulator when FAKE_NEURON_DEVICE=1,
else fails like a host without a Neuron device. FAKE_NKI_COMPILE_ERROR=<text>
makes kernels whose name contains <text> fail to compile (no NEFF);
FAKE_NKI_NO_WRITEBACK=1 runs on copies of the inputs (in-place writes are lost);
FAKE_NKI_NEFF_IN_CWD=1 ignores NKI_ARTIFACTS_DIR and writes the NEFF under the
working directory (``neuronxcc-<name>/graph.neff``, as a framework debug run keeps
it); FAKE_NKI_HANG=<text> makes kernels whose name contains <text> compile forever.
``kernel[lnc](...)`` launches a grid of ``lnc`` programs, as the SDK does; like the
Neuron runtime, the execution fails when the grid differs from NEURON_LOGICAL_NC_CONFIG
(unset: 2, the trn2 default), and the NEFF records the grid (``lnc=<n>``).
"""
import os
import sys
import time

from nki_ssm.sim import isa, language
from nki_ssm.sim import jit as _sim_jit

sys.modules[__name__ + ".language"] = language
sys.modules[__name__ + ".isa"] = isa


class Kernel:
    def __init__(self, func, grid=1, **options):
        self.func = func
        self.grid = grid
        self._sim = _sim_jit.jit(func)

    def __getitem__(self, grid):
        launch = Kernel(self.func, grid=grid)
        launch._sim = self._sim
        return launch

    def __call__(self, *args, **kwargs):
        name = self.func.__name__
        bad = os.environ.get("FAKE_NKI_COMPILE_ERROR")
        if bad and bad in name:
            raise RuntimeError(f"[fake neuronx-cc] ERROR: {name}: PSUM allocation failed")
        hang = os.environ.get("FAKE_NKI_HANG")
        if hang and hang in name:
            print(f"[fake neuronx-cc] {name}: compiling ...", file=sys.stderr, flush=True)
            time.sleep(3600)
        print(f"[fake neuronx-cc] WARNING: {name}: fake compile of a fake NEFF", file=sys.stderr)
        if os.environ.get("FAKE_NKI_NEFF_IN_CWD") == "1":
            art, neff = os.path.join(os.getcwd(), f"neuronxcc-{name}"), "graph.neff"
        else:
            art, neff = os.environ.get("NKI_ARTIFACTS_DIR", "."), "kernel.neff"
        os.makedirs(art, exist_ok=True)
        with open(os.path.join(art, neff), "wb") as fh:
            target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "?")
            fh.write(f"FAKE-NEFF {name} target={target} lnc={self.grid}".encode() + b"\0" * 4096)
        if os.environ.get("FAKE_NEURON_DEVICE") != "1":
            raise RuntimeError("NRT Error NRT_FAILURE(1): no Neuron device (fake)")
        runtime_lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG") or 2)
        if runtime_lnc != self.grid:
            raise RuntimeError(f"NRT Error: the NEFF was compiled for LNC={self.grid}, the runtime runs "
                               f"LNC={runtime_lnc} (fake)")
        if os.environ.get("FAKE_NKI_NO_WRITEBACK") == "1":
            args = [a.copy() if hasattr(a, "copy") and hasattr(a, "dtype") else a for a in args]
        return _sim_jit.simulate(self._sim[self.grid])(*args, **kwargs)


def jit(func=None, **options):
    if func is None:
        return lambda f: Kernel(f, **options)
    return Kernel(func, **options)
