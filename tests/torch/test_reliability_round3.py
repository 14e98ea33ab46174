"""Regression tests for issue 26 (reliability round 3), rows 2-6 and 8, torch side.

Each row's reproducer as the issue writes it, then the row's rule on every
entry point it concerns (host API ``nki_ssm.ops``, the wrappers of
``nki_ssm.torch.ops``, ``torch.ops.nki_ssm.*``, the drop-ins, ``hf.patch``) and
on the "reference" and "sim" backends: the same verdict, a message naming the
argument, and every pool as it was after a rejected call.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_cases import OPS, numpy_case, op_args, pool_name, to_torch  # noqa: E402

from nki_ssm import ops as host  # noqa: E402
from nki_ssm.ops.launch import gated_delta as launch_gdn  # noqa: E402
from nki_ssm.reference import inputs as gen  # noqa: E402
from nki_ssm.torch import causal_conv1d as cc  # noqa: E402
from nki_ssm.torch import fla, hf, use_backend  # noqa: E402
from nki_ssm.torch import mamba_ssm as ms  # noqa: E402
from nki_ssm.torch import ops as T  # noqa: E402
from nki_ssm.torch._convert import to_numpy  # noqa: E402

BACKENDS = ("reference", "sim")
LEAD = {op: "q" if op.startswith("gated_delta") else "x" for op in OPS}


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a non-contiguous layout (every other element of a wider buffer)."""
    wide = torch.zeros(tuple(t.shape[:-1]) + (2 * t.shape[-1],), dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def _gdn_dense(T_=30, H=1, HV=1, K=16, V=16, seed=0):
    """FLA-layout inputs [1, T, H, K] (L2-normalised keys, decaying gates)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T_, H, K, generator=g)
    k = torch.nn.functional.normalize(torch.randn(1, T_, H, K, generator=g), dim=-1)
    v = torch.randn(1, T_, HV, V, generator=g)
    return q, k, v, -torch.rand(1, T_, HV, generator=g), torch.rand(1, T_, HV, generator=g)


# ----------------------------------------------------------------------------- row 2

def test_row2_reproducer_opcheck_transposed_x():
    x = torch.randn(8, 16).t()
    torch.library.opcheck(torch.ops.nki_ssm.short_conv_prefill.default,
                          (x, torch.randn(8, 4), None, "silu",
                           torch.tensor([0, 16], dtype=torch.int32), torch.zeros(1, 8, 3),
                           torch.tensor([0], dtype=torch.int32), torch.tensor([False]),
                           "reference"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_row2_opcheck_with_non_contiguous_inputs(op, backend):
    tkw = {n: _strided(t) if isinstance(t, torch.Tensor) and t.dim() else t
           for n, t in to_torch(numpy_case(op)).items()}
    assert not tkw[LEAD[op]].is_contiguous() and not tkw[pool_name(tkw)].is_contiguous()
    torch.library.opcheck(getattr(torch.ops.nki_ssm, op).default, op_args(op, tkw, backend))


@pytest.mark.parametrize("op", OPS)
def test_row2_outputs_are_c_contiguous_like_the_fake_kernels(op):
    tkw = {n: _strided(t) if isinstance(t, torch.Tensor) and t.dim() else t
           for n, t in to_torch(numpy_case(op)).items()}
    real = _first(getattr(T, op)(**tkw, backend="reference"))
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake_args = {n: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                     for n, t in tkw.items()}
        fake = _first(getattr(T, op)(**fake_args, backend="reference"))
    assert real.is_contiguous() and fake.stride() == real.stride()


# ----------------------------------------------------------------------------- row 3

def test_row3_reproducer_meta_cu_seqlens():
    pool = torch.zeros(2, 4, 3)
    with pytest.raises(ValueError, match=r"^cu_seqlens must be on the device of x \(cpu\), "
                                         r"got a tensor on meta"):
        T.short_conv_prefill(torch.randn(8, 4), torch.randn(4, 4),
                             cu_seqlens=torch.tensor([0, 8], device="meta"), conv_states=pool,
                             state_indices=torch.tensor([0]),
                             has_initial_state=torch.tensor([False]), backend="reference")
    assert not pool.any()


@pytest.mark.parametrize("entry", ["wrapper", "torch.ops"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_row3_every_tensor_argument_on_the_ops_device(op, backend, entry):
    tkw = to_torch(numpy_case(op))
    pool = tkw[pool_name(tkw)]
    before = pool.clone()
    lead = LEAD[op]
    names = [n for n, t in tkw.items() if isinstance(t, torch.Tensor)]
    assert lead in names and len(names) >= 5
    for name in names:
        call = dict(tkw, **{name: tkw[name].to("meta")})
        if name == lead:
            match = rf"^{lead} must be on the CPU or a Neuron device \(xla / neuron\), got a " \
                    rf"tensor on meta"
        else:
            match = rf"^{name} must be on the device of {lead} \(cpu\), got a tensor on meta"
        with pytest.raises(ValueError, match=match):
            if entry == "wrapper":
                getattr(T, op)(**call, backend=backend)
            else:
                getattr(torch.ops.nki_ssm, op)(*op_args(op, call, backend))
        assert torch.equal(pool, before), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_row3_drop_ins_name_the_argument_on_another_device(backend):
    q, k, v, g, beta = _gdn_dense()
    meta = torch.tensor([0, 30], dtype=torch.int32, device="meta")
    with use_backend(backend):
        with pytest.raises(ValueError, match=r"^cu_seqlens must be on the device of q"):
            fla.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=meta)
        with pytest.raises(ValueError, match=r"^initial_state must be on the device of q"):
            fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta,
                                                 initial_state=torch.zeros(1, 1, 16, 16,
                                                                           device="meta"))
        state = torch.randn(5, 8, 3)
        before = state.clone()
        with pytest.raises(ValueError, match=r"^conv_state_indices must be on the device of x"):
            cc.causal_conv1d_update(torch.randn(2, 8), state, torch.randn(8, 4),
                                    conv_state_indices=torch.tensor([1, 2], device="meta"))
        assert torch.equal(state, before)
        with pytest.raises(ValueError, match=r"^weight must be on the device of x"):
            cc.causal_conv1d_fn(torch.randn(1, 8, 5), torch.randn(8, 4, device="meta"))
        x = torch.randn(1, 16, 2, 4)
        with pytest.raises(ValueError, match=r"^seq_idx must be on the device of x"):
            ms.mamba_chunk_scan_combined(x, torch.rand(1, 16, 2), -torch.ones(2),
                                         torch.randn(1, 16, 1, 8), torch.randn(1, 16, 1, 8), 16,
                                         seq_idx=torch.zeros(1, 16, dtype=torch.int32,
                                                             device="meta"))


# ----------------------------------------------------------------------------- row 4

FLOAT_CU = r"^cu_seqlens must have an integer dtype \(int32\), got "


@pytest.mark.parametrize("backend", BACKENDS)
def test_row4_reproducer_float_cu_seqlens_is_rejected_everywhere(backend):
    q, k, v, g, b = _gdn_dense()
    cu = torch.tensor([0., 7.9, 30.])
    with use_backend(backend):
        with pytest.raises(TypeError, match=FLOAT_CU + "torch.float32"):
            fla.chunk_gated_delta_rule(q, k, v, g, b, cu_seqlens=cu)
        with pytest.raises(TypeError, match=FLOAT_CU + "torch.float32"):
            fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=b, cu_seqlens=cu)
    kw = gen.make_gated_delta_inputs(np.random.default_rng(0), seqlens=[7, 23], H=1, HV=1,
                                     K=16, V=16)
    kw["cu_seqlens"] = np.array([0., 7.9, 30.])
    before = kw["ssm_states"].copy()
    with pytest.raises(TypeError, match=FLOAT_CU + "float64"):
        host.gated_delta_prefill(**kw, backend=backend)
    with pytest.raises(TypeError, match=FLOAT_CU + "float64"):
        T.gated_delta_prefill(**to_torch(kw), backend=backend)
    assert kw["ssm_states"].tobytes() == before.tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_row4_other_drop_ins_name_their_float_index_arguments(backend):
    pool = torch.randn(3, 8, 3)
    before = pool.clone()
    with use_backend(backend):
        with pytest.raises(TypeError, match=r"^query_start_loc must have an integer dtype"):
            cc.causal_conv1d_fn(torch.randn(8, 6), torch.randn(8, 4), conv_states=pool,
                                query_start_loc=torch.tensor([0., 2., 6.]),
                                has_initial_state=torch.tensor([True, False]))
        with pytest.raises(TypeError, match=r"^has_initial_state must have dtype bool"):
            cc.causal_conv1d_fn(torch.randn(8, 6), torch.randn(8, 4), conv_states=pool,
                                query_start_loc=torch.tensor([0, 2, 6]),
                                has_initial_state=torch.tensor([1, 0]))
        with pytest.raises(TypeError, match=r"^cache_seqlens must have an integer dtype"):
            cc.causal_conv1d_update(torch.randn(3, 8), pool, torch.randn(8, 4),
                                    cache_seqlens=torch.tensor([1.5, 2., 0.]))
        x = torch.randn(1, 16, 2, 4)
        with pytest.raises(TypeError, match=FLOAT_CU + "torch.float32"):
            ms.mamba_chunk_scan_combined(x, torch.rand(1, 16, 2), -torch.ones(2),
                                         torch.randn(1, 16, 1, 8), torch.randn(1, 16, 1, 8), 16,
                                         cu_seqlens=torch.tensor([0., 7.5, 16.]),
                                         return_varlen_states=True)
    assert torch.equal(pool, before)


# ----------------------------------------------------------------------------- row 5

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["wide", "circular", "plain"])
def test_row5_out_of_range_conv_state_indices(form, backend):
    width = 6 if form != "plain" else 3
    state = torch.randn(5, 8, width)
    before = state.clone()
    extra = {"cache_seqlens": torch.tensor([3, 1], dtype=torch.int32)} if form == "circular" \
        else {}
    with use_backend(backend), pytest.raises(
            ValueError, match=r"^conv_state_indices\[1\] must be negative \(padding\) or in "
                              r"\[0, slots\) = \[0, 5\) \(slots = conv_state.shape\[0\]\), got 9"):
        cc.causal_conv1d_update(torch.randn(2, 8), state, torch.randn(8, 4),
                                conv_state_indices=torch.tensor([1, 9]), **extra)
    assert torch.equal(state, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row5_repeated_slot_is_rejected_before_the_scatter(backend):
    state = torch.randn(5, 8, 6)
    before = state.clone()
    with use_backend(backend), pytest.raises(
            ValueError, match=r"^conv_state_indices must not repeat a slot within a call, "
                              r"got slot 2 at positions \[0, 1\]"):
        cc.causal_conv1d_update(torch.randn(2, 8), state, torch.randn(8, 4),
                                cache_seqlens=torch.tensor([3, 1], dtype=torch.int32),
                                conv_state_indices=torch.tensor([2, 2]))
    assert torch.equal(state, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row5_state_batch_indices_out_of_range(backend):
    state = torch.zeros(3, 2, 4, 8)
    with use_backend(backend), pytest.raises(
            ValueError, match=r"^state_batch_indices\[0\] must be negative \(padding\) or in "
                              r"\[0, slots\) = \[0, 3\)"):
        ms.selective_state_update(state, torch.randn(2, 2, 4),
                                  torch.rand(2, 2, 1).expand(2, 2, 4),
                                  -torch.ones(2, 1, 1).expand(2, 4, 8), torch.randn(2, 1, 8),
                                  torch.randn(2, 1, 8), state_batch_indices=torch.tensor([3, 0]))
    assert not state.any()


# ----------------------------------------------------------------------------- row 6

def _host_and_wrapper(op: str, backend: str, **override):
    """(host API error or output, torch wrapper error or output) of one call."""
    kw = dict(numpy_case(op), **override)
    results = []
    for call, args in ((getattr(host, op), kw), (getattr(T, op), to_torch(kw))):
        try:
            results.append(_first(call(**args, backend=backend)))
        except (TypeError, ValueError) as exc:
            results.append(exc)
    return results


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op,override,exc,message", [
    ("gated_delta_prefill", {"use_qk_l2norm": 1}, TypeError,
     "use_qk_l2norm must be a bool, got int 1"),
    ("gated_delta_decode", {"return_intermediate_states": 0}, TypeError,
     "return_intermediate_states must be a bool, got int 0"),
    ("ssd_prefill", {"dt_limit": ("a", 1)}, TypeError,
     "dt_limit[0] must be a real number, got str 'a'"),
    ("ssd_decode", {"dt_softplus": 1}, TypeError, "dt_softplus must be a bool, got int 1"),
    ("ssd_prefill", {"chunk_size": None}, TypeError,
     "chunk_size must be an int, got NoneType None"),
    ("ssd_prefill", {"chunk_size": "64"}, TypeError, "chunk_size must be an int, got str '64'"),
    ("ssd_prefill", {"chunk_size": 40}, ValueError,
     "chunk_size must be a multiple of 16 in 16..128, got 40"),
    ("ssd_prefill", {"precision": "fp16"}, ValueError,
     "precision must be one of 'bf16', 'fp32', got 'fp16'"),
    ("gated_delta_prefill", {"scale": "x"}, TypeError, "scale must be a real number, got str"),
    ("short_conv_decode", {"activation": "gelu"}, ValueError,
     "activation must be one of None, 'silu', got 'gelu'"),
])
def test_row6_host_and_wrapper_give_one_verdict_and_message(op, override, exc, message,
                                                             backend):
    got_host, got_torch = _host_and_wrapper(op, backend, **override)
    assert type(got_host) is exc and str(got_host).startswith(message), got_host
    assert type(got_torch) is exc and str(got_torch) == str(got_host)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row6_bad_backend_names_backend(backend):
    got_host, got_torch = _host_and_wrapper("short_conv_prefill", backend="gpu")
    assert isinstance(got_host, ValueError) and str(got_torch) == str(got_host)
    assert str(got_host).startswith("backend must be one of None, 'reference', 'sim', 'neuron'")


@pytest.mark.parametrize("chunk_size", [None, np.int64(32)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_row6_gdn_chunk_size_none_and_numpy_int_on_every_entry_point(chunk_size, backend):
    kw = dict(numpy_case("gated_delta_prefill"), chunk_size=chunk_size)
    pool = pool_name(kw)
    want = host.gated_delta_prefill(**{**kw, pool: kw[pool].copy()}, backend=backend)
    tkw = to_torch(kw)
    np.testing.assert_array_equal(to_numpy(T.gated_delta_prefill(**tkw, backend=backend)), want)
    tkw = to_torch(kw)
    direct = torch.ops.nki_ssm.gated_delta_prefill(
        *op_args("gated_delta_prefill", dict(tkw, chunk_size=chunk_size), backend))
    np.testing.assert_array_equal(to_numpy(direct), want)


def test_row6_gdn_wrapper_default_chunk_is_the_host_apis(monkeypatch):
    kw = numpy_case("gated_delta_prefill")
    del kw["chunk_size"]                       # both defaults: the kernel's chunk for the shape
    want = host.gated_delta_prefill(**{**kw, "ssm_states": kw["ssm_states"].copy()},
                                    backend="sim")
    got = T.gated_delta_prefill(**to_torch(kw), backend="sim")
    np.testing.assert_array_equal(to_numpy(got), want)
    # what reaches the launcher: None (its default for the layer shape) from both
    seen = []
    real = launch_gdn.prefill

    def recording(**call):
        seen.append(call["chunk_size"])
        return real(**call)

    monkeypatch.setattr(launch_gdn, "prefill", recording)
    host.gated_delta_prefill(**{**kw, "ssm_states": kw["ssm_states"].copy()}, backend="sim")
    T.gated_delta_prefill(**to_torch(kw), backend="sim")
    assert seen == [None, None]


def test_row6_wrapper_rejects_arrays_for_tensors_naming_them():
    kw = numpy_case("short_conv_decode")
    tkw = dict(to_torch(kw), state_indices=kw["state_indices"])
    with pytest.raises(TypeError, match=r"^state_indices must be a torch.Tensor, got ndarray"):
        T.short_conv_decode(**tkw, backend="reference")


def test_row6_drop_ins_reject_non_tensors_naming_them():
    q, k, v, g, beta = _gdn_dense()
    with pytest.raises(TypeError, match=r"^cu_seqlens must be a torch.Tensor, got list"):
        fla.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=[0, 30])
    with pytest.raises(TypeError, match=r"^conv_state_indices must be a torch.Tensor, got list"):
        cc.causal_conv1d_update(torch.randn(2, 8), torch.randn(5, 8, 3), torch.randn(8, 4),
                                conv_state_indices=[1, 2])


def test_row6_hf_patch_of_none_names_model():
    for fn in (hf.patch, hf.unpatch):
        with pytest.raises(TypeError, match=r"^model must be a torch.nn.Module, got NoneType"):
            fn(None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row6_drop_ins_take_numpy_int_chunk_sizes(backend):
    x = torch.randn(1, 40, 2, 8)
    dt, A = torch.rand(1, 40, 2), -torch.rand(2) - 0.5
    B, C = torch.randn(1, 40, 1, 8), torch.randn(1, 40, 1, 8)
    q, k, v, g, beta = _gdn_dense()
    with use_backend(backend):
        assert torch.equal(ms.mamba_chunk_scan_combined(x, dt, A, B, C, np.int64(32)),
                           ms.mamba_chunk_scan_combined(x, dt, A, B, C, 32))
        assert torch.equal(fla.chunk_gated_delta_rule(q, k, v, g, beta,
                                                      chunk_size=np.int64(32))[0],
                           fla.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=32)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_row6_batch_zero_names_the_callers_argument(backend):
    no_cu = r"^(?!.*cu_seqlens)"
    q, k, v, g, beta = (t[:0] for t in _gdn_dense())
    with use_backend(backend):
        for call in (lambda: fla.chunk_gated_delta_rule(q, k, v, g, beta),
                     lambda: fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta)):
            with pytest.raises(ValueError, match=no_cu + r"q.shape\[0\] \(batch\) must be >= 1"):
                call()
        with pytest.raises(ValueError, match=no_cu + r"x.shape\[0\] \(batch\) must be >= 1"):
            cc.causal_conv1d_fn(torch.randn(0, 8, 5), torch.randn(8, 4))
        with pytest.raises(ValueError, match=no_cu + r"x.shape\[0\] \(batch\) must be >= 1"):
            cc.causal_conv1d_update(torch.randn(0, 8), torch.randn(0, 8, 3), torch.randn(8, 4))
        with pytest.raises(ValueError, match=no_cu + r"x.shape\[0\] \(batch\) must be >= 1"):
            ms.mamba_chunk_scan_combined(torch.randn(0, 16, 2, 4), torch.rand(0, 16, 2),
                                         -torch.ones(2), torch.randn(0, 16, 1, 8),
                                         torch.randn(0, 16, 1, 8), 16)


# ----------------------------------------------------------------------------- row 8

@pytest.mark.parametrize("backend", BACKENDS)
def test_row8_reproducer_final_states_are_float32(backend):
    x = torch.randn(1, 64, 2, 16).bfloat16()
    dt = torch.randn(1, 64, 2).bfloat16()
    A = -torch.rand(2) - .5
    B = C = torch.randn(1, 64, 1, 16).bfloat16()
    with use_backend(backend):
        out, final = ms.mamba_chunk_scan_combined(x, dt, A, B, C, 256, return_final_states=True)
        _, final2, varlen = ms.mamba_chunk_scan_combined(
            x, dt, A, B, C, 256, return_final_states=True, return_varlen_states=True,
            cu_seqlens=torch.tensor([0, 64], dtype=torch.int32))
        _, varlen32 = ms.mamba_chunk_scan_combined(
            x, dt, A, B, C, 256, return_varlen_states=True, state_dtype=torch.float32,
            cu_seqlens=torch.tensor([0, 64], dtype=torch.int32))
    assert out.dtype == torch.bfloat16
    assert final.dtype == final2.dtype == torch.float32      # mamba_ssm 2.3.2
    assert varlen.dtype == torch.bfloat16 and varlen32.dtype == torch.float32
    assert torch.equal(final, final2) and torch.equal(varlen32, final)
    assert math.isfinite(float(final.abs().sum()))


# ----------------------------------------------------------------------------- compile

@pytest.mark.slow
def test_drop_ins_compile_fullgraph_with_inductor():
    """Every drop-in in one graph under the default (inductor) backend, equal to eager;
    causal_conv1d_fn at batch 1 is the call that failed inductor's stride assertion."""
    def f(x, w, b, conv_state, q, k, v, g, beta, xs, dt, A, B, C, ssm_state, xd, dtd, Bd, Cd):
        y = cc.causal_conv1d_fn(x, w, b, activation="silu")
        yu = cc.causal_conv1d_update(x[:, :, -1], conv_state, w, b, "silu")
        o, final = fla.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
        o2, _ = fla.fused_recurrent_gated_delta_rule(q[:, :2], k[:, :2], v[:, :2], g=g[:, :2],
                                                     beta=beta[:, :2], initial_state=final)
        ys, fin = ms.mamba_chunk_scan_combined(xs, dt, A, B, C, 16, return_final_states=True)
        yd = ms.selective_state_update(ssm_state, xd, dtd.expand(-1, -1, 8),
                                       A[:, None, None].expand(-1, 8, 16), Bd, Cd)
        return y, yu, o, o2, ys, fin, yd, conv_state, ssm_state

    gen_ = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen_)  # noqa: E731
    q, k, v, g, beta = _gdn_dense(T_=12, HV=2, V=8)
    args = (r(1, 8, 12), r(8, 4), r(8), r(1, 8, 3), q, k, v, g, beta,
            r(1, 20, 2, 8), torch.rand(1, 20, 2, generator=gen_), -torch.rand(2) - 0.5,
            r(1, 20, 1, 16), r(1, 20, 1, 16), torch.zeros(1, 2, 8, 16), r(1, 2, 8),
            torch.rand(1, 2, 1, generator=gen_), r(1, 1, 16), r(1, 1, 16))
    with use_backend("reference"):
        eager = f(*[a.clone() for a in args])
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True)(*[a.clone() for a in args])
    for e, c in zip(eager, got):
        assert torch.equal(e, c)


def test_row3_device_rule_on_a_neuron_device():
    """A Neuron lead (``xla`` here: no Neuron device exists on this machine, so the lead is
    a stand-in with its device) takes tensors on that device only, index tensors included."""
    import types

    from nki_ssm.torch._devices import check_devices

    lead = types.SimpleNamespace(device=torch.device("xla", 0))
    assert check_devices({"x": lead, "chunk_size": 64}, "x") == torch.device("xla", 0)
    with pytest.raises(ValueError, match=r"^cu_seqlens must be on the device of x \(xla:0\), "
                                         r"got a tensor on cpu"):
        check_devices({"x": lead, "cu_seqlens": torch.tensor([0, 4])}, "x")
    with pytest.raises(ValueError, match=r"^q must be on the CPU or a Neuron device"):
        check_devices({"q": types.SimpleNamespace(device=torch.device("cuda", 0))}, "q")
