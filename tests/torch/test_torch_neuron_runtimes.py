"""The Neuron device path on each runtime, offline, with FAKES of the runtimes
(tests/torch/neuron_runtimes.py): TorchNeuron eager, TorchNeuron under
``torch.compile(backend="neuron")``, and vLLM Neuron's ``wrap_nki``; the six serving ops
(pools updated in the caller's tensors) and the training ops' backward
(``register_autograd``). The device is FAKE (CPU tensors typed ``neuron``), the kernels
run on the simulator; every result must equal the host API's simulator path, and each
runtime must have been reached the way it is documented to be called."""
from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from neuron_runtimes import (  # noqa: E402,F401  (fixtures)
    install_vllm_neuron,
    neuron_backend,
    neuron_device,
    op_nodes,
    torchneuron,
    unload_vllm,
    vllm_neuron,
)
from torch_cases import OPS, numpy_case, pool_name, to_torch  # noqa: E402

from nki_ssm import backend as nki_backend  # noqa: E402
from nki_ssm import ops as host  # noqa: E402
from nki_ssm.reference import inputs as gen  # noqa: E402
from nki_ssm.torch import neuron, training  # noqa: E402
from nki_ssm.torch import ops as tops  # noqa: E402
from nki_ssm.torch._convert import from_numpy, to_numpy  # noqa: E402


@pytest.fixture(autouse=True)
def _simulator(monkeypatch):
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")      # kernels built against the simulator


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _serve(op, monkeypatch, lnc, log) -> dict:
    """One call of ``op`` through ``nki_ssm.torch.ops`` on (FAKE) device tensors: output and
    pool bit for bit the host API's simulator path, one kernel launch whose pool argument is
    a view of the caller's pool (written in place) -> that launch."""
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, str(lnc))
    kw = numpy_case(op)
    tkw = to_torch(kw)
    expected = getattr(host, op)(**kw, backend="sim")
    got = getattr(tops, op)(**tkw)
    name = pool_name(kw)
    np.testing.assert_array_equal(to_numpy(_first(got)), _first(expected))
    np.testing.assert_array_equal(to_numpy(tkw[name]), kw[name])
    (launch,) = log
    ptr = tkw[name].untyped_storage().data_ptr()
    assert [t.untyped_storage().data_ptr() for t in launch["tensors"]].count(ptr) == 1
    return launch


def _kernel_params(kernel) -> list:
    fn = getattr(kernel, "func", None) or getattr(kernel, "fn", None) or kernel
    return list(inspect.signature(fn).parameters)


# ------------------------------------------------------------------ devices and launch paths


def test_devices_and_launch_paths(monkeypatch, tmp_path):
    assert neuron.DEVICE_TYPES == ("xla", "neuron")
    for dev in ("xla", "xla:0", "neuron", "neuron:3", torch.device("xla")):
        assert neuron.is_neuron_device(dev), dev
    for dev in ("cpu", "meta", torch.device("cpu"), torch.zeros(1), "cuda:0"):
        assert not neuron.is_neuron_device(dev), dev
    with pytest.raises(ValueError, match="device must be a Neuron device"):
        neuron.launch_path("cpu")
    unload_vllm(monkeypatch)
    # TorchNeuron (and XLA): the @nki.jit kernel itself
    assert neuron.launch_path("neuron") == "jit" and neuron.launch_path("xla") == "jit"
    # vLLM Neuron installed but not running in this process: still TorchNeuron's call
    pkg = tmp_path / "vllm_neuron" / "nki"
    pkg.mkdir(parents=True)
    (tmp_path / "vllm_neuron" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "nki_hop.py").write_text("def wrap_nki(kernel):\n    return kernel\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert neuron.wrap_nki() is None and neuron.launch_path("neuron") == "jit"
    # ... and once the plugin runs (its package imported): its wrap_nki HOP
    import vllm_neuron  # noqa: F401

    assert neuron.wrap_nki() is sys.modules["vllm_neuron.nki.nki_hop"].wrap_nki
    assert neuron.launch_path("neuron") == "wrap_nki" and neuron.launch_path("xla") == "jit"


def test_torchneuron_calls_the_jit_kernel_itself(neuron_device, monkeypatch):
    """``kernel(*args)`` for one program, ``kernel[lnc](*args)`` for more: positional
    device tensors and the kernel's Python values, as the SDK's native-PyTorch docs call
    ``@nki.jit`` kernels inside a custom op."""
    seen = []

    class Kernel:
        def __init__(self, grid=None):
            self.grid = grid

        def __getitem__(self, grid):
            return Kernel(grid)

        def __call__(self, *args):
            seen.append((self.grid, args))
            return args[0]

    unload_vllm(monkeypatch)
    x = torch.ones(2)
    assert neuron.device_call(Kernel(), x, 3, lnc=1) is x
    assert neuron.device_call(Kernel(), x, 3, lnc=2) is x
    assert seen == [(None, (x, 3)), (2, (x, 3))]


# ------------------------------------------------------------------ TorchNeuron: serving ops


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("op", OPS)
def test_torchneuron_eager(op, lnc, torchneuron, monkeypatch):
    """``torch.ops.nki_ssm.<op>`` on ``neuron`` tensors: one kernel launch, the @nki.jit
    kernel called with device tensors as a grid of NEURON_LOGICAL_NC_CONFIG programs, the
    pool argument a view of the caller's pool; the host simulator path's bytes."""
    launch = _serve(op, monkeypatch, lnc, torchneuron)
    assert launch["path"] == "jit" and launch["grid"] == lnc and launch["args"] > 0


@pytest.mark.parametrize("op", OPS)
def test_torchneuron_under_torch_compile(op, torchneuron, neuron_backend, monkeypatch):
    """``torch.compile(backend="neuron", fullgraph=True)`` of a function around the op: the
    graph Dynamo captures holds the custom op as one node (and so does AOTAutograd's
    forward graph), the compiled function launches the same kernel on the device tensors,
    and output and pool equal eager's bit for bit."""
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "2")
    kw = numpy_case(op)
    eager, compiled = to_torch(kw), to_torch(kw)
    name = pool_name(kw)

    def f(**call):
        return _first(getattr(tops, op)(**call)) * 2.0 + 1.0

    want = f(**eager)
    got = torch.compile(f, backend="neuron", fullgraph=True)(**compiled)
    assert torch.equal(got, want) and torch.equal(compiled[name], eager[name])
    (dynamo,) = neuron_backend["dynamo"]
    assert len(op_nodes(dynamo, op)) == 1
    assert len(op_nodes(neuron_backend["forward"][0], op)) == 1
    assert [(e["path"], e["grid"]) for e in torchneuron] == [("jit", 2), ("jit", 2)]


# ------------------------------------------------------------------ training (register_autograd)

SEQLENS = [5, 0, 19]
TRAIN = ("short_conv", "ssd", "gated_delta")
GRADS = {"short_conv": training._CONV_GRADS, "ssd": training._SSD_GRADS,
         "gated_delta": training._GDN_GRADS}


def _train_case(family: str) -> dict:
    """Keywords of ``nki_ssm.ops.<family>_forward`` (float32, initial states given)."""
    rng = np.random.default_rng(7)
    n = len(SEQLENS)
    if family == "short_conv":
        kw = gen.make_short_conv_inputs(rng, seqlens=SEQLENS, dim=8, W=4, dtype=np.float32)
        return dict(x=kw["x"], weight=kw["weight"], bias=kw["bias"], activation="silu",
                    cu_seqlens=kw["cu_seqlens"],
                    initial_states=rng.standard_normal((n, 8, 3)).astype(np.float32))
    if family == "ssd":
        kw = gen.make_ssd_inputs(rng, seqlens=SEQLENS, H=4, P=8, N=16, G=2, z=True, D="H",
                                 dtype=np.float32, gate_pattern="strong_then_weak")
        out = {k: kw[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus",
                                  "dt_limit", "cu_seqlens")}
        return dict(out, chunk_size=16, initial_states=(
            0.5 * rng.standard_normal((n, 4, 8, 16))).astype(np.float32))
    kw = gen.make_gated_delta_inputs(rng, seqlens=SEQLENS, H=2, HV=4, K=16, V=8, raw_gates=True,
                                     use_qk_l2norm=True, dtype=np.float32,
                                     gate_pattern="strong_then_weak")
    out = {k: kw[k] for k in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "cu_seqlens")}
    return dict(out, use_qk_l2norm=True, chunk_size=16, initial_states=(
        0.3 * rng.standard_normal((n, 4, 16, 8))).astype(np.float32))


def _host_grads(family: str, kw: dict, wo: np.ndarray, wf: np.ndarray) -> dict:
    """The host API's gradients of sum(out * wo) + sum(final * wf) (simulator kernels)."""
    grad = "do" if family == "gated_delta" else "dy"
    return getattr(host, f"{family}_backward")(**kw, **{grad: wo}, d_final_states=wf,
                                               backend="sim")


def _train(family: str, tkw: dict):
    fn = getattr(training, f"{family}_train")
    lead = {"short_conv": ("x", "weight"), "ssd": ("x", "dt", "A", "B", "C"),
            "gated_delta": ("q", "k", "v")}[family]
    return fn(*(tkw[n] for n in lead), **{k: v for k, v in tkw.items() if k not in lead})


def _check_training(family: str, log: list, compiled_with=None):
    """Forward and backward of the training op on device tensors against the host API;
    -> (launches in the forward, launches in the backward)."""
    kw = _train_case(family)
    tkw = {k: (from_numpy(v).clone().requires_grad_(v.dtype.kind == "f" and k != "cu_seqlens")
               if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    out_np, final_np = host.__dict__[f"{family}_forward"](**kw, backend="sim")
    rng = np.random.default_rng(11)
    wo = rng.standard_normal(out_np.shape).astype(np.float32)
    wf = rng.standard_normal(final_np.shape).astype(np.float32)

    wo_t, wf_t = from_numpy(wo), from_numpy(wf)

    def loss_of(**call):
        out, final = _train(family, call)
        return (out * wo_t).sum() + (final * wf_t).sum()

    loss_fn = loss_of if compiled_with is None else torch.compile(loss_of, backend=compiled_with,
                                                                    fullgraph=True)
    loss = loss_fn(**tkw)
    forward = len(log)
    loss.backward()
    want = _host_grads(family, kw, wo, wf)
    for name, key in GRADS[family].items():
        if name not in tkw:
            continue
        assert tkw[name].grad is not None, name
        torch.testing.assert_close(tkw[name].grad, from_numpy(want[key]), rtol=2e-5, atol=2e-6,
                                   msg=f"{family}: {key}")
    expected_loss = float((out_np * wo).sum() + (final_np * wf).sum())
    assert abs(float(loss.detach()) - expected_loss) <= 1e-4 * max(1.0, abs(expected_loss))
    return forward, len(log) - forward


@pytest.mark.parametrize("runtime, path", [("torchneuron", "jit"), ("vllm_neuron", "wrap_nki")])
@pytest.mark.parametrize("family", TRAIN)
def test_training_backward_eager(family, runtime, path, request, monkeypatch):
    """The training op and its registered backward on device tensors, on TorchNeuron and
    through vLLM Neuron's wrap_nki: the host API's loss and gradients."""
    log = request.getfixturevalue(runtime)
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "2")
    forward, backward = _check_training(family, log)
    assert forward >= 1 and backward >= 1
    assert {(e["path"], e["grid"]) for e in log} == {(path, 2)}


@pytest.mark.parametrize("family", TRAIN)
def test_torchneuron_training_backward_under_torch_compile(family, torchneuron, neuron_backend,
                                                           monkeypatch):
    """Dynamo and AOTAutograd keep the training op as one node of the forward graph and its
    registered backward as one node of the backward graph; both run on the device path."""
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "1")
    forward, backward = _check_training(family, torchneuron, compiled_with="neuron")
    assert forward >= 1 and backward >= 1
    (dynamo,) = neuron_backend["dynamo"]
    assert len(op_nodes(dynamo, f"{family}_train")) == 1
    (fw,), (bw,) = neuron_backend["forward"], neuron_backend["backward"]
    assert len(op_nodes(fw, f"{family}_train")) == 1
    assert len(op_nodes(bw, f"{family}_train_backward")) == 1
    assert {e["path"] for e in torchneuron} == {"jit"}


# ------------------------------------------------------------------ vLLM Neuron: wrap_nki


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("op", OPS)
def test_vllm_neuron_through_wrap_nki(op, lnc, vllm_neuron, monkeypatch):
    """vLLM Neuron running: every op reaches its kernel through the plugin's wrap_nki HOP,
    each argument under the kernel's parameter name, the caller itself for one program and
    indexed by the grid for two; the host simulator path's bytes, the pool in place."""
    launch = _serve(op, monkeypatch, lnc, vllm_neuron)
    assert launch["path"] == "wrap_nki" and launch["grid"] == lnc
    assert launch["indexed"] == (lnc != 1)
    params = _kernel_params(launch["kernel_object"])
    assert launch["kwargs"] == params[:len(launch["kwargs"])] and launch["args"] == 0


def test_vllm_neuron_0_24_runtime_too(monkeypatch, neuron_device):
    """0.24's runtime package (libtorch_neuronx_lite) serves the HOP the same way."""
    unload_vllm(monkeypatch)
    log = []
    install_vllm_neuron(monkeypatch, log, package="libtorch_neuronx_lite")
    launch = _serve("gated_delta_decode", monkeypatch, 2, log)
    assert (launch["path"], launch["grid"], launch["indexed"]) == ("wrap_nki", 2, True)
