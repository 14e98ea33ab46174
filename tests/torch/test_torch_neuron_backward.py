"""The training backwards' Neuron device path (``nki_ssm.torch.neuron.<family>_backward``) on
CPU, with the device call replaced by the simulator (as tests/torch/test_torch_neuron.py does
for the forwards): the kernel gets exactly the host launcher's arguments, the gradients equal
the host API's "sim" path, at LNC=1 and LNC=2; a rejected call gives the host API's error and
never reaches the device; the training ops route Neuron tensors to this path."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nki_ssm import backend as nki_backend  # noqa: E402
from nki_ssm import ops as host  # noqa: E402
from nki_ssm.reference import inputs as gen  # noqa: E402
from nki_ssm.torch import neuron  # noqa: E402
from nki_ssm.torch._convert import from_numpy, to_numpy  # noqa: E402

FAMILIES = ("short_conv_backward", "ssd_backward", "gated_delta_backward")
SEQLENS = [5, 0, 19]       # an empty sequence, one longer than a chunk (16)
GDN_GATES = dict(g=None, beta=None, a=None, b=None, A_log=None, dt_bias=None)


def _case(family: str, dtype=np.float32, variant: str = "") -> dict:
    """Every keyword of the host backward (the training op passes them all): inputs, the
    output's gradient and d_final_states, initial states for some sequences' worth."""
    rng = np.random.default_rng(3)
    n = len(SEQLENS)

    def grad(shape, dt=dtype):
        return rng.standard_normal(shape).astype(dt)

    if family == "short_conv_backward":
        kw = gen.make_short_conv_inputs(rng, seqlens=SEQLENS, dim=8, W=4, dtype=dtype)
        out = dict(x=kw["x"], weight=kw["weight"], bias=kw["bias"], dy=grad(kw["x"].shape),
                   activation="silu", cu_seqlens=kw["cu_seqlens"],
                   initial_states=grad((n, 8, 3)), d_final_states=grad((n, 8, 3), np.float32))
    elif family == "ssd_backward":
        kw = gen.make_ssd_inputs(rng, seqlens=SEQLENS, H=4, P=8, N=16, G=2, z=True, D="H",
                                 dtype=dtype, gate_pattern="strong_then_weak")
        out = {k: kw[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus",
                                  "dt_limit", "cu_seqlens")}
        out.update(dy=grad(kw["x"].shape), initial_states=0.5 * grad((n, 4, 8, 16), np.float32),
                   d_final_states=grad((n, 4, 8, 16), np.float32), chunk_size=16,
                   precision=None)
    else:
        raw = variant == "raw"
        kw = gen.make_gated_delta_inputs(rng, seqlens=SEQLENS, H=2, HV=4, K=16, V=8,
                                         raw_gates=raw, use_qk_l2norm=raw, dtype=dtype,
                                         gate_pattern="strong_then_weak")
        out = dict(GDN_GATES, **{k: kw.get(k) for k in ("q", "k", "v", *GDN_GATES)})
        out.update(do=grad(kw["v"].shape), scale=None, use_qk_l2norm=raw,
                   cu_seqlens=kw["cu_seqlens"], initial_states=0.3 * grad((n, 4, 16, 8),
                                                                          np.float32),
                   d_final_states=grad((n, 4, 16, 8), np.float32), chunk_size=16)
    return out


def _tensors(kw: dict) -> dict:
    return {k: from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}


def _snapshot(args):
    return [to_numpy(a).copy() if isinstance(a, torch.Tensor)
            else a.copy() if isinstance(a, np.ndarray) else a for a in args]


def _on_sim(record):
    """A ``device_call`` that records (kernel, arguments, lnc) and runs the simulator."""
    def call(kernel, *args, lnc=1):
        record.append((kernel, _snapshot(args), lnc))
        out = nki_backend.run(kernel, *[to_numpy(a) if isinstance(a, torch.Tensor) else a
                                        for a in args], backend="sim", lnc=lnc)
        return tuple(from_numpy(np.asarray(o)) for o in out)

    return call


# the arguments the host path computes in float32 before the launch (GDN raw gates and the
# q/k L2 norm: exp, softplus, sigmoid, sqrt and sums), where torch and NumPy may round one
# ulp apart; every other argument is compared byte for byte
_F32_PREP = {"gated_delta_backward-raw": (0, 1, 4, 5)}
# gradients the launcher reduces after the kernel (SSD dD of a per-head D: a sum over P),
# which torch and NumPy add in different orders; the others are compared bit for bit
_SUMMED = {"ssd_backward": {"dD"}}


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("case", ["short_conv_backward", "short_conv_backward-bf16",
                                  "ssd_backward", "ssd_backward-bf16", "gated_delta_backward",
                                  "gated_delta_backward-raw"])
def test_device_path_equals_the_host_sim_path(case, lnc, monkeypatch):
    """Same kernel, same arguments (dtype, shape, bytes; Python values equal and of the same
    type), the LNC of NEURON_LOGICAL_NC_CONFIG, and the host API's gradients (dtype, shape;
    bit for bit where the arguments are)."""
    family, _, variant = case.partition("-")
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, str(lnc))
    kw = _case(family, ml_dtypes.bfloat16 if variant == "bf16" else np.float32, variant)
    host_calls, device_calls = [], []
    real_run = nki_backend.run

    def host_run(kernel, *args, **options):
        host_calls.append((kernel, _snapshot(args), options["lnc"]))
        return real_run(kernel, *args, **options)

    monkeypatch.setattr(nki_backend, "run", host_run)
    expected = getattr(host, family)(**kw, backend="sim")
    monkeypatch.setattr(nki_backend, "run", real_run)
    monkeypatch.setattr(neuron, "device_call", _on_sim(device_calls))
    got = getattr(neuron, family)(**_tensors(kw), backend=None)

    assert len(host_calls) == len(device_calls) == 1
    (h_kernel, h_args, h_lnc), (d_kernel, d_args, d_lnc) = host_calls[0], device_calls[0]
    assert d_kernel is h_kernel and h_lnc == d_lnc == lnc
    assert len(d_args) == len(h_args)
    rounded = _F32_PREP.get(case, ())
    for i, (h, d) in enumerate(zip(h_args, d_args)):
        where = f"{case} kernel argument {i}"
        if isinstance(h, np.ndarray) or isinstance(d, np.ndarray):
            assert isinstance(h, np.ndarray) and isinstance(d, np.ndarray), where
            assert (d.dtype, d.shape) == (h.dtype, h.shape), where
            if i in rounded:
                np.testing.assert_allclose(d, h, rtol=2e-6, atol=1e-7, err_msg=where)
            else:
                assert d.tobytes() == h.tobytes(), where
        else:
            assert type(d) is type(h) and d == h, (where, h, d)

    assert set(got) == set(expected)
    for key, want in expected.items():
        if want is None:
            assert got[key] is None, key
            continue
        have = to_numpy(got[key])
        assert (have.dtype, have.shape) == (want.dtype, want.shape), key
        if rounded or key in _SUMMED.get(family, ()):
            np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6, err_msg=key)
        else:
            np.testing.assert_array_equal(have, want, err_msg=key)


def _bad(family: str, kind: str) -> dict:
    """A rejected backward call: the output's gradient one token short, or in another dtype."""
    kw = _case(family)
    grad = "do" if family == "gated_delta_backward" else "dy"
    kw[grad] = kw[grad][:-1] if kind == "shape" else kw[grad].astype(np.float16)
    return kw


@pytest.mark.parametrize("kind", ["shape", "dtype"])
@pytest.mark.parametrize("family", FAMILIES)
def test_rejected_call_same_error_and_never_reaches_the_device(family, kind, monkeypatch):
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    calls = []
    monkeypatch.setattr(neuron, "device_call", _on_sim(calls))
    kw = _bad(family, kind)
    with pytest.raises((TypeError, ValueError)) as on_host:
        getattr(host, family)(**kw, backend="sim")
    with pytest.raises(on_host.type) as on_device:
        getattr(neuron, family)(**_tensors(kw), backend=None)
    assert str(on_device.value) == str(on_host.value)
    assert "dy" in str(on_host.value) or "do" in str(on_host.value)
    # a backend the device tensors cannot run on: the device path's own ValueError
    with pytest.raises(ValueError, match="backend must be None or 'neuron'"):
        getattr(neuron, family)(**_tensors(_case(family)), backend="reference")
    assert not calls


def test_bad_d_final_states_same_error_on_both_paths(monkeypatch):
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    calls = []
    monkeypatch.setattr(neuron, "device_call", _on_sim(calls))
    kw = _case("ssd_backward")
    kw["d_final_states"] = kw["d_final_states"][:, :, :, :-1]
    with pytest.raises(ValueError) as on_host:
        host.ssd_backward(**kw, backend="sim")
    with pytest.raises(ValueError) as on_device:
        neuron.ssd_backward(**_tensors(kw), backend=None)
    assert str(on_device.value) == str(on_host.value) and "d_final_states" in str(on_host.value)
    assert not calls


def test_training_backward_routes_neuron_tensors_to_the_device_path(monkeypatch):
    """torch.ops.nki_ssm.short_conv_train_backward on (faked) Neuron tensors runs
    ``neuron.short_conv_backward`` (one device call) and returns the CPU op's gradients."""
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "1")
    kw = _tensors(_case("short_conv_backward"))
    args = [kw[n] for n in ("x", "weight", "bias", "activation", "cu_seqlens",
                            "initial_states", "dy", "d_final_states")]
    on_cpu = torch.ops.nki_ssm.short_conv_train_backward(*args, None)
    calls = []
    monkeypatch.setattr(neuron, "device_call", _on_sim(calls))
    real = neuron.device_type                  # from here on the CPU tensors are "neuron" ones
    monkeypatch.setattr(neuron, "device_type",
                        lambda d: "neuron" if real(d) == "cpu" else real(d))
    on_device = torch.ops.nki_ssm.short_conv_train_backward(*args, None)
    assert len(calls) == 1
    for want, have in zip(on_cpu, on_device):
        assert have.dtype == want.dtype
        torch.testing.assert_close(have, want, rtol=0, atol=0)
