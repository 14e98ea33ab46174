"""FAKES of the Neuron torch runtimes for the device path's CPU tests (not the real ones).

Each fake stands in for what its runtime does at the one boundary the device path
has (``nki_ssm.torch.neuron.device_call``); the device path itself runs unchanged.

* ``neuron_device``: CPU tensors count as tensors of the native ``neuron`` device
  (``nki_ssm.torch.neuron.device_type``, where the custom ops and the training ops
  ask which device a call runs on).
* ``torchneuron``: TorchNeuron alone (no vLLM Neuron runtime loaded). An ``@nki.jit``
  kernel called with ``neuron`` tensors (``TorchNeuronKernel``) runs on the simulator
  through NumPy views of the very tensors passed, so in-place writes land in them; it
  refuses NumPy arguments (the device path hands the kernel device tensors only) and a
  grid other than ``NEURON_LOGICAL_NC_CONFIG``, which the Neuron compiler and runtime
  reject.
* ``vllm_neuron``: vLLM Neuron's plugin loaded, with a ``wrap_nki`` HOP whose caller
  runs the simulator: ``wrap_nki(kernel)(*args / **kwargs)`` for one program,
  ``wrap_nki(kernel)[grid](...)`` for more (grid checked as above).
* ``neuron_backend``: ``torch.compile(backend="neuron")`` built as TorchNeuron's backend
  is (Dynamo, then AOTAutograd, no Inductor): it records the graph Dynamo captured and
  AOTAutograd's forward and backward graphs, and runs them as they are.

Every launch is appended to the fixture's log: {"path", "grid" (programs), "indexed" (the
caller was indexed by a grid), "kernel_object", "args" (how many positional), "kwargs"
(names), "tensors"}.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from nki_ssm import backend as nki_backend
from nki_ssm.torch import neuron
from nki_ssm.torch._convert import from_numpy, to_numpy


def simulate(kernel, values: list, grid: int):
    """``kernel`` as ``grid`` programs on the simulator, on NumPy views of the tensors in
    ``values`` -> torch outputs (a tuple for several)."""
    arrays = [to_numpy(v) if isinstance(v, torch.Tensor) else v for v in values]
    out = nki_backend.run(kernel, *arrays, backend="sim", lnc=grid)
    if isinstance(out, (tuple, list)):
        return tuple(from_numpy(np.asarray(o)) for o in out)
    return from_numpy(np.asarray(out))


def _launch(log: list, path: str, kernel, grid, args: tuple, kwargs: dict):
    """Check and record one launch (``grid`` None: the caller was not indexed, one
    program), then run it."""
    programs = grid or 1
    runtime_lnc = nki_backend.logical_nc_config("neuron")
    if programs != runtime_lnc:
        raise RuntimeError(f"FAKE Neuron runtime: kernel compiled for LNC={programs}, the "
                           f"runtime runs LNC={runtime_lnc}")
    values = list(args) + list(kwargs.values())
    bad = [type(v).__name__ for v in values if isinstance(v, np.ndarray)]
    if bad:
        raise TypeError(f"FAKE {path}: host arrays passed to a device kernel: {bad}")
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    assert all(neuron.is_neuron_device(t) for t in tensors)
    log.append({"path": path, "grid": programs, "indexed": grid is not None,
                "kernel_object": kernel, "args": len(args), "kwargs": list(kwargs),
                "tensors": tensors})
    return simulate(kernel, values, programs)


@pytest.fixture
def neuron_device(monkeypatch):
    """CPU tensors are ``neuron`` tensors for nki_ssm.torch (nothing else changes)."""
    real = neuron.device_type
    monkeypatch.setattr(neuron, "device_type",
                        lambda d: "neuron" if real(d) == "cpu" else real(d))


def unload_vllm(monkeypatch):
    """No vLLM Neuron runtime in the process (for this test)."""
    for name in list(sys.modules):
        if name.split(".")[0] in neuron.WRAP_NKI_RUNTIMES:
            monkeypatch.delitem(sys.modules, name)


class TorchNeuronKernel:
    """An ``@nki.jit`` kernel as TorchNeuron runs it when called with ``neuron`` tensors."""

    def __init__(self, kernel, log: list, grid=None):
        self.kernel, self.log, self.grid = kernel, log, grid

    def __getitem__(self, grid):
        return TorchNeuronKernel(self.kernel, self.log, grid)

    def __call__(self, *args):
        return _launch(self.log, "jit", self.kernel, self.grid, args, {})


@pytest.fixture
def torchneuron(monkeypatch, neuron_device):
    """TorchNeuron without vLLM: the device path's kernels run as ``TorchNeuronKernel``.
    -> the launch log."""
    unload_vllm(monkeypatch)
    log = []
    real = neuron.device_call
    monkeypatch.setattr(neuron, "device_call",
                        lambda kernel, *args, lnc=1: real(TorchNeuronKernel(kernel, log), *args,
                                                          lnc=lnc))
    return log


def install_vllm_neuron(monkeypatch, log: list, package: str = "vllm_neuron") -> None:
    """``package`` (``vllm_neuron``, or 0.24's ``libtorch_neuronx_lite``) loaded, with a
    FAKE ``<package>.nki.nki_hop.wrap_nki``."""
    class Caller:
        def __init__(self, kernel, grid=None):
            self.kernel, self.grid = kernel, grid

        def __getitem__(self, grid):
            return Caller(self.kernel, grid)

        def __call__(self, *args, **kwargs):
            return _launch(log, "wrap_nki", self.kernel, self.grid, args, kwargs)

    hop = types.ModuleType(f"{package}.nki.nki_hop")
    hop.wrap_nki = Caller
    for name, mod in ((package, types.ModuleType(package)),
                      (f"{package}.nki", types.ModuleType(f"{package}.nki")),
                      (hop.__name__, hop)):
        monkeypatch.setitem(sys.modules, name, mod)
    sys.modules[f"{package}.nki"].nki_hop = hop
    sys.modules[package].nki = sys.modules[f"{package}.nki"]


@pytest.fixture
def vllm_neuron(monkeypatch, neuron_device):
    """vLLM Neuron's plugin running: kernels go through its (FAKE) wrap_nki. -> the log."""
    unload_vllm(monkeypatch)
    log = []
    install_vllm_neuron(monkeypatch, log)
    return log


@pytest.fixture
def neuron_backend(monkeypatch):
    """``torch.compile(backend="neuron")``: Dynamo, then AOTAutograd, graphs run as captured.
    -> {"dynamo": [...], "forward": [...], "backward": [...]} (FX graph modules)."""
    from torch._dynamo.backends import registry
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    registry._lazy_import()
    if "neuron" in registry._BACKENDS:
        pytest.skip("a real 'neuron' torch.compile backend is installed (trn tests cover it)")
    graphs = {"dynamo": [], "forward": [], "backward": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm)
            return boxed_nop(gm, example_inputs)
        return compiler

    aot = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))

    def backend(gm, example_inputs):
        graphs["dynamo"].append(gm)
        return aot(gm, example_inputs)

    monkeypatch.setitem(registry._BACKENDS, "neuron", None)
    monkeypatch.setitem(registry._COMPILER_FNS, "neuron", backend)
    torch._dynamo.reset()
    yield graphs
    torch._dynamo.reset()


def op_nodes(gm, name: str) -> list:
    """The nodes of graph ``gm`` that call custom op ``nki_ssm::<name>``, directly or
    through a functionalization wrapper (``auto_functionalized``, whose first argument is
    the op)."""
    want = f"nki_ssm.{name}"

    def calls(target) -> bool:
        text = str(target)
        return text == want or text.startswith(want + ".")

    return [n for n in gm.graph.nodes if n.op == "call_function"
            and (calls(n.target) or (n.args and calls(n.args[0])))]
