"""The Neuron device path (nki_ssm.torch.neuron) on CPU, with the device call replaced
(each runtime's own launch path, with a fake of that runtime: test_torch_neuron_runtimes.py).

The replacement records what the adapter hands the kernel and runs the kernel
on the simulator through NumPy views of exactly those tensors, so: outputs
must equal the host API's sim path bit for bit (same layouts), the pool
argument must be a view of the caller's pool (the kernel's writes land in the
caller's tensor: no write-back), a strided pool is staged and copied back, and
a rejected call never reaches the device. The real run needs a trn instance.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_cases import OPS, numpy_case, pool_name, to_torch  # noqa: E402

from nki_ssm import backend as nki_backend  # noqa: E402
from nki_ssm import ops as host  # noqa: E402
from nki_ssm.reference import inputs as gen  # noqa: E402
from nki_ssm.torch import neuron  # noqa: E402
from nki_ssm.torch._convert import from_numpy, to_numpy  # noqa: E402


@pytest.fixture(autouse=True)
def _same_lnc_as_the_host_path(monkeypatch):
    """Unset, the device path's LNC is the Neuron runtime's (2 on trn2) and the host
    simulator's is 1: these tests compare the two paths at one LNC."""
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "1")

BF16 = dict(dtype=ml_dtypes.bfloat16, pool_dtype=ml_dtypes.bfloat16)
DEFAULTS = {"bias": None, "D": None, "z": None, "dt_bias": None, "g": None, "beta": None,
            "a": None, "b": None, "A_log": None, "scale": None, "dt_softplus": False,
            "dt_limit": (0.0, float("inf")), "use_qk_l2norm": False,
            "return_intermediate_states": False, "activation": "silu"}
# keyword arguments each op's custom-op schema passes to nki_ssm.torch.neuron.<op>
SCHEMA = {op: [a.name for a in getattr(torch.ops.nki_ssm, op).default._schema.arguments]
          for op in OPS}


@pytest.fixture
def device(monkeypatch):
    """Replace the device boundary: record (kernel, args), run the kernel on the simulator."""
    calls = []

    def call(kernel, *args, lnc=1):
        calls.append((kernel, args))
        arrays = [to_numpy(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = nki_backend.run(kernel, *arrays, backend="sim", lnc=lnc)
        if isinstance(out, (tuple, list)):
            return tuple(from_numpy(np.asarray(o)) for o in out)
        return from_numpy(np.asarray(out))

    monkeypatch.setattr(neuron, "device_call", call)
    return calls


def _call(op, tkw):
    args = {n: tkw.get(n, DEFAULTS.get(n)) for n in SCHEMA[op]}
    args["backend"] = None
    return getattr(neuron, op)(**args)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_same_result_as_host_sim_path_and_pool_aliased(op, dtype, device, monkeypatch):
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    kw = numpy_case(op, **BF16) if dtype == "bf16" else numpy_case(op)
    if dtype == "bf16" and "weight" in kw:     # float32 weights: the hi + lo split flags
        kw["weight"] = kw["weight"].astype(np.float32) + np.float32(1e-3)
    tkw = to_torch(kw)
    name = pool_name(kw)
    pool = tkw[name]
    expected = getattr(host, op)(**kw, backend="sim")
    got = _call(op, tkw)
    np.testing.assert_array_equal(to_numpy(_first(got)), expected)
    np.testing.assert_array_equal(to_numpy(pool), kw[name])
    assert len(device) == 1
    kernel, args = device[0]
    views = [a for a in args if isinstance(a, torch.Tensor)
             and a.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()]
    assert len(views) == 1, "exactly one kernel argument aliases the caller's pool"
    assert views[0].dim() == 2 and views[0].numel() == pool.numel()
    for a in args:
        if isinstance(a, torch.Tensor) and a is not views[0]:
            assert a.untyped_storage().data_ptr() != pool.untyped_storage().data_ptr()
            assert a.is_contiguous()


@pytest.mark.parametrize("op", OPS)
def test_device_and_host_paths_agree_at_lnc2(op, monkeypatch):
    """NEURON_LOGICAL_NC_CONFIG=2: the device path launches every kernel as two programs
    (``device_call(..., lnc=2)``) and gives the bytes of the host sim path at LNC=2 (outputs
    and pool)."""
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "2")
    seen = []

    def call(kernel, *args, lnc=1):
        seen.append(lnc)
        out = nki_backend.run(kernel, *[to_numpy(a) if isinstance(a, torch.Tensor) else a
                                        for a in args], backend="sim", lnc=lnc)
        if isinstance(out, (tuple, list)):
            return tuple(from_numpy(np.asarray(o)) for o in out)
        return from_numpy(np.asarray(out))

    monkeypatch.setattr(neuron, "device_call", call)
    kw = numpy_case(op)
    tkw = to_torch(kw)
    name = pool_name(kw)
    expected = getattr(host, op)(**kw, backend="sim")
    got = _call(op, tkw)
    assert seen == [2]
    np.testing.assert_array_equal(to_numpy(_first(got)), _first(expected))
    np.testing.assert_array_equal(to_numpy(tkw[name]), kw[name])


@pytest.mark.parametrize("op", OPS)
def test_bad_lnc_fails_on_every_entry_point_before_the_pool(op, device, monkeypatch):
    """The same bad NEURON_LOGICAL_NC_CONFIG gives the same ValueError from the host API, the
    torch op on CPU tensors and the device path, with every pool as it was and nothing
    launched."""
    from torch_cases import op_args

    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "3")
    kw = numpy_case(op)
    tkw = to_torch(kw)
    name = pool_name(kw)
    before, tbefore = kw[name].copy(), tkw[name].clone()
    match = rf"{nki_backend.LNC_ENV_VAR}: expected 1 or 2, got '3'"
    with pytest.raises(ValueError, match=match):
        getattr(host, op)(**kw)
    with pytest.raises(ValueError, match=match):
        getattr(torch.ops.nki_ssm, op)(*op_args(op, tkw, None))
    with pytest.raises(ValueError, match=match):
        _call(op, tkw)
    assert not device
    assert kw[name].tobytes() == before.tobytes() and torch.equal(tkw[name], tbefore)


def _snapshot(args):
    """Kernel arguments as NumPy copies (tensors through their NumPy views), taken before
    the kernel runs (it updates the pool argument in place)."""
    return [to_numpy(a).copy() if isinstance(a, torch.Tensor)
            else a.copy() if isinstance(a, np.ndarray) else a for a in args]


def _wide_ssd_case(**dtypes):
    """ssd_prefill with P = 512 (the launcher runs it as P/2-channel heads) and D [H, P]."""
    kw = gen.make_ssd_inputs(np.random.default_rng(2), seqlens=[3, 0, 18], H=2, P=512, N=16,
                             padding=1, D="HP", z=True, **dtypes)
    return dict(kw, chunk_size=16, precision="fp32")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("op", OPS + ("ssd_prefill-P512",))
def test_kernel_arguments_equal_the_launchers(op, dtype, monkeypatch):
    """The device path hands the kernel exactly the arguments the NumPy launcher does
    (same kernel, same count, each tensor the same dtype, shape and bytes, each Python
    value equal and of the same type), so a launcher change that neuron.py does not
    follow fails here even when the outputs happen to agree."""
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    dtypes = BF16 if dtype == "bf16" else {}
    kw = _wide_ssd_case(**dtypes) if op.endswith("P512") else numpy_case(op, **dtypes)
    op = op.split("-")[0]
    if dtype == "bf16" and "weight" in kw:
        kw["weight"] = kw["weight"].astype(np.float32) + np.float32(1e-3)
    tkw = to_torch(kw)
    real_run = nki_backend.run
    host_calls, device_calls = [], []

    def host_run(kernel, *args, **options):
        host_calls.append((kernel, _snapshot(args)))
        return real_run(kernel, *args, **options)

    def device(kernel, *args, lnc=1):
        device_calls.append((kernel, _snapshot(args)))
        out = real_run(kernel, *[to_numpy(a) if isinstance(a, torch.Tensor) else a
                                 for a in args], backend="sim", lnc=lnc)
        if isinstance(out, (tuple, list)):
            return tuple(from_numpy(np.asarray(o)) for o in out)
        return from_numpy(np.asarray(out))

    monkeypatch.setattr(nki_backend, "run", host_run)
    expected = getattr(host, op)(**kw, backend="sim")
    monkeypatch.setattr(neuron, "device_call", device)
    np.testing.assert_array_equal(to_numpy(_first(_call(op, tkw))), _first(expected))
    assert len(host_calls) == len(device_calls) == 1
    (h_kernel, h_args), (d_kernel, d_args) = host_calls[0], device_calls[0]
    assert d_kernel is h_kernel
    assert len(d_args) == len(h_args)
    for i, (h, d) in enumerate(zip(h_args, d_args)):
        where = f"{op} kernel argument {i}"
        if isinstance(h, np.ndarray) or isinstance(d, np.ndarray):
            assert isinstance(h, np.ndarray) and isinstance(d, np.ndarray), where
            assert (d.dtype, d.shape) == (h.dtype, h.shape), where
            assert d.tobytes() == h.tobytes(), where
        else:
            assert type(d) is type(h) and d == h, (where, h, d)


def test_layouts_of_gated_delta_decode(device, monkeypatch):
    from nki_ssm.ops.launch import gated_delta as launch
    from nki_ssm.ops.launch.buckets import seq_bucket

    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    tkw = to_torch(numpy_case("gated_delta_decode"))
    _call("gated_delta_decode", tkw)
    _, args = device[0]
    q, k, v, pool = tkw["q"], tkw["k"], tkw["v"], tkw["ssm_states"]
    S, T, H, K = q.shape
    HV, V = v.shape[2:]
    nb = seq_bucket(S)
    idx = np.full(nb, -1)
    idx[:S] = tkw["state_indices"].numpy()
    spi, w, main_rows, tail_rows = launch.decode_plan(nb, T)
    order, _, _, counts = launch.decode_order(idx, nb, T)
    src = torch.as_tensor(np.minimum(order, S - 1))
    kq_m, kx_m, v_m, gate_m, slots_m, kq_t, kx_t, v_t, gate_t, slots_t = args[:10]
    head_params, blk, sel, pool_view, counts_arg = args[10:15]
    n_main = main_rows * spi
    # kernel-position order (live sequences first), k / q interleaved per head, K on
    # partitions, one row per loop iteration, float32
    kq = torch.stack([k[src], q[src]], -1).float()
    want_kq_m = kq[:n_main].reshape(main_rows, spi, T, H, K, 2).permute(0, 4, 1, 2, 3, 5)
    assert torch.equal(kq_m, want_kq_m.reshape(main_rows, K, -1))
    want_kq_t = kq[n_main:].reshape(tail_rows + 1, w, T, H, K, 2).permute(0, 4, 1, 2, 3, 5)
    assert torch.equal(kq_t, want_kq_t.reshape(tail_rows + 1, K, -1))
    # k / q in the state layout: as the host launcher lays them out (its layout is
    # tested on NumPy in tests/kernels/test_gated_delta_decode_kernels.py)
    from nki_ssm.ops.launch._arrays import NUMPY
    gates = (tkw["g"], tkw["beta"]) if tkw.get("g") is not None else (tkw["a"], tkw["b"])
    host = [x[src].numpy() for x in (q, k, v, *gates)]
    want_kx_t = launch.decode_tables(NUMPY, *[x[n_main:] for x in host], tail_rows + 1, w)[1]
    assert torch.equal(kx_t, torch.as_tensor(want_kx_t))
    want_blk, want_sel = launch.layout_tables(K, V, HV)
    assert torch.equal(blk, torch.as_tensor(want_blk)) and torch.equal(sel, torch.as_tensor(want_sel))
    want_v = v[src][n_main:].float().reshape(tail_rows + 1, w, T, HV, V).permute(0, 4, 1, 2, 3)
    assert torch.equal(v_t, want_v.reshape(tail_rows + 1, V, -1))
    assert gate_m.dtype == gate_t.dtype == torch.float32 and head_params is None
    assert pool_view.shape == (pool.shape[0], HV * K * V)
    assert pool_view.data_ptr() == pool.data_ptr()
    assert slots_m.dtype == torch.int32 and slots_m.shape == (main_rows, spi)
    assert slots_t.shape == (tail_rows + 1, w)
    assert torch.equal(counts_arg, torch.as_tensor(counts))


@pytest.mark.parametrize("op", OPS)
def test_strided_pool_is_staged_and_copied_back(op, device, monkeypatch):
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    kw = numpy_case(op)
    tkw = to_torch(kw)
    name = pool_name(kw)
    strided = tkw[name].transpose(0, 1).contiguous().transpose(0, 1)
    assert not strided.is_contiguous()
    tkw[name] = strided
    expected = getattr(host, op)(**kw, backend="sim")
    np.testing.assert_array_equal(to_numpy(_first(_call(op, tkw))), _first(expected))
    np.testing.assert_array_equal(to_numpy(strided), kw[name])


@pytest.mark.parametrize("op", OPS)
def test_rejected_call_never_reaches_the_device(op, device):
    tkw = to_torch(numpy_case(op))
    name = pool_name(tkw)
    before = tkw[name].clone()
    tkw["state_indices"] = tkw["state_indices"].clone()
    tkw["state_indices"][0] = tkw[name].shape[0]
    with pytest.raises(ValueError, match=r"state_indices\[0\] must be -1 or in \[0, slots\)"):
        _call(op, tkw)
    assert not device and torch.equal(tkw[name], before)
    with pytest.raises(ValueError, match="backend"):
        getattr(neuron, op)(**{**{n: tkw.get(n, DEFAULTS.get(n)) for n in SCHEMA[op]},
                               "backend": "reference"})


@pytest.mark.parametrize("op", OPS)
def test_reference_env_is_refused_on_device_tensors(op, device, monkeypatch):
    """NKI_SSM_BACKEND=reference makes backend=None the host's float64 references, which
    device tensors cannot run: refused as backend="reference" is, before the device."""
    monkeypatch.setattr(nki_backend, "_CHOICE", "reference")
    tkw = to_torch(numpy_case(op))
    name = pool_name(tkw)
    before = tkw[name].clone()
    with pytest.raises(ValueError, match=r"^backend must be None or 'neuron' for device "
                                         r"tensors, got 'reference'"):
        _call(op, tkw)
    assert not device and torch.equal(tkw[name], before)


def _device(runtime):
    """The Neuron device of ``runtime`` ("native": the ``neuron`` device of TorchNeuron, SDK
    2.33 / 2.34; "xla": torch-neuronx 2.9, SDK <= 2.31), or a skip."""
    if runtime == "xla":
        return pytest.importorskip("torch_xla").device()
    try:
        dev = torch.device("neuron")
        torch.empty(1, device=dev)
    except (RuntimeError, ValueError):
        pytest.skip("no native 'neuron' device (TorchNeuron: the torch-neuronx 2.14.0 DLAMI's venv)")
    return dev


@pytest.mark.trn
@pytest.mark.parametrize("runtime", ["native", "xla"])
def test_on_a_neuron_device(runtime):
    """The real run: every op on a NeuronCore equals the CPU path (needs the Neuron SDK)."""
    if nki_backend.name() != "neuron":
        pytest.skip("needs the Neuron SDK's nki (trn instance)")
    dev = _device(runtime)
    assert neuron.is_neuron_device(dev)
    for op in OPS:
        kw = numpy_case(op)
        cpu, on_dev = to_torch(kw), {k: v.to(dev) if isinstance(v, torch.Tensor) else v
                                     for k, v in to_torch(kw).items()}
        from nki_ssm.torch import ops as tops

        want = _first(getattr(tops, op)(**cpu, backend="sim"))
        got = _first(getattr(tops, op)(**on_dev))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(on_dev[pool_name(kw)].cpu(), cpu[pool_name(kw)], rtol=1e-4,
                                   atol=1e-5)   # the pool written in place came back


def test_torch_layer_imports_no_kernels_and_namespaces_match():
    """DESIGN.md's layering: nki_ssm/torch reaches kernels only through the launchers
    (``<family>.prefill_kernel()`` ...), and the torch array namespace has exactly the
    launchers' NumPy namespace's methods (a launcher using a new one fails here first)."""
    import ast
    import pathlib

    from nki_ssm.ops.launch._arrays import NumpyArrays
    from nki_ssm.torch._device_arrays import TorchArrays

    root = pathlib.Path(neuron.__file__).parent
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("nki_ssm.kernels") for n in names), path.name
    public = lambda cls: {n for n in vars(cls) if not n.startswith("_")}  # noqa: E731
    assert public(TorchArrays) == public(NumpyArrays)
