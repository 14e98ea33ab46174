"""Drop-ins under autograd: gradients for exactly the inputs the peers differentiate, against
transformers' pure-torch paths (float32, reference backend), and the serving forms unchanged."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch_cases import fla_gdn_inputs, rel  # noqa: E402

import nki_ssm.ops  # noqa: E402
from nki_ssm.torch import causal_conv1d as cc  # noqa: E402
from nki_ssm.torch import fla, use_backend  # noqa: E402
from nki_ssm.torch import mamba_ssm as ms  # noqa: E402

TOL = 1e-4     # float32 through two different algorithms; measured errors are ~1e-6


def _grads(fn, inputs: dict, names):
    leaves = {n: inputs[n].detach().clone().requires_grad_() for n in names}
    outs = fn(**{**inputs, **leaves})
    outs = outs if isinstance(outs, tuple) else (outs,)
    gen = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outs)
    return outs, dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names])))


def _compare(ours, theirs, names):
    (outs, g), (outs_ref, g_ref) = ours, theirs
    for o, o_ref in zip(outs, outs_ref):
        assert rel(o.detach(), o_ref.detach()) < TOL
    for n in names:
        assert rel(g[n], g_ref[n]) < TOL, (n, rel(g[n], g_ref[n]))


@pytest.fixture(scope="module")
def qwen():
    return pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


@pytest.fixture(scope="module")
def mamba2():
    return pytest.importorskip("transformers.models.mamba2.modeling_mamba2")


def test_fla_chunk_gradients_match_transformers(qwen):
    names = ("q", "k", "v", "g", "beta", "initial_state")
    a = fla_gdn_inputs(T=21, decay=2.0)
    common = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    with use_backend("reference"):
        ours = _grads(lambda **kw: fla.chunk_gated_delta_rule(**kw, **common), a, names)
    theirs = _grads(lambda q, k, v, **kw: qwen.torch_chunk_gated_delta_rule(q, k, v, **kw, **common),
                    a, names)
    _compare(ours, theirs, names)


def test_fla_raw_gates_in_kernel_give_A_log_and_dt_bias_gradients(qwen):
    a = fla_gdn_inputs(B=1, T=17, seed=1, decay=2.0)
    gen = torch.Generator().manual_seed(3)
    a.update(g=torch.randn(1, 17, 4, generator=gen), beta=torch.randn(1, 17, 4, generator=gen),
             A_log=torch.rand(4, generator=gen), dt_bias=torch.randn(4, generator=gen))
    names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")

    def ours_fn(A_log, dt_bias, **kw):
        return fla.chunk_gated_delta_rule(**kw, A_log=A_log, dt_bias=dt_bias,
                                          use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                          output_final_state=True)

    def theirs_fn(q, k, v, g, beta, A_log, dt_bias, **kw):
        g = -A_log.exp() * F.softplus(g + dt_bias)
        return qwen.torch_chunk_gated_delta_rule(q, k, v, **kw, g=g, beta=beta.sigmoid(),
                                                 output_final_state=True)

    with use_backend("reference"):
        ours = _grads(ours_fn, a, names)
    _compare(ours, _grads(theirs_fn, a, names), names)


def test_mamba_chunk_scan_gradients_match_transformers(mamba2):
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    b, L, H, P, G, N = 2, 21, 4, 8, 2, 16
    a = dict(x=r(b, L, H, P), dt=r(b, L, H), A=-(torch.rand(H, generator=gen) * 15 + 1),
             B=r(b, L, G, N), C=r(b, L, G, N), D=r(H), dt_bias=r(H),
             initial_states=r(b, H, P, N) * 0.5)
    names = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states")
    common = dict(dt_softplus=True, dt_limit=(0.0, 0.5), return_final_states=True)
    with use_backend("reference"):
        ours = _grads(lambda x, dt, A, B, C, **kw: ms.mamba_chunk_scan_combined(
            x, dt, A, B, C, 16, **kw, **common), a, names)
    theirs = _grads(lambda x, dt, A, B, C, **kw: mamba2.mamba2_chunk_scan(
        x, dt, A, B, C, 8, **kw, **common), a, names)
    _compare(ours, theirs, names)


def test_mamba_z_gate_gradient():
    gen = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    a = dict(x=r(1, 9, 2, 4), dt=r(1, 9, 2), A=-torch.rand(2, generator=gen) - 1,
             B=r(1, 9, 1, 8), C=r(1, 9, 1, 8), z=r(1, 9, 2, 4), D=r(2, 4))
    with use_backend("reference"):
        _, g = _grads(lambda x, dt, A, B, C, **kw: ms.mamba_chunk_scan_combined(
            x, dt, A, B, C, 16, **kw, dt_softplus=True), a, ("z", "D", "x"))

    def torch_ref(x, dt, A, B, C, z, D):
        dtp = F.softplus(dt)
        S = torch.zeros(2, 4, 8)
        ys = []
        for t in range(9):
            S = torch.exp(dtp[0, t] * A)[:, None, None] * S + \
                dtp[0, t][:, None, None] * x[0, t][:, :, None] * B[0, t, 0][None, None, :]
            ys.append((S @ C[0, t, 0] + D * x[0, t]) * F.silu(z[0, t]))
        return torch.stack(ys)[None]

    _, g_ref = _grads(torch_ref, a, ("z", "D", "x"))
    for n in ("z", "D", "x"):
        assert rel(g[n], g_ref[n]) < TOL, n


def _conv_ref(x, weight, bias, initial_states, activation):
    W = weight.shape[1]
    xx = torch.cat([initial_states.to(x.dtype), x], dim=-1)
    out = F.conv1d(xx, weight[:, None, :], bias, groups=x.shape[1])
    final = xx[..., -(W - 1):]
    return (F.silu(out) if activation else out), final


@pytest.mark.skipif(not hasattr(nki_ssm.ops, "short_conv_backward"),
                    reason="nki_ssm.ops.short_conv_backward (the conv backward, built on another "
                           "branch of issue 30) is not merged yet")
def test_causal_conv1d_gradients_match_torch():
    gen = torch.Generator().manual_seed(0)
    a = dict(x=torch.randn(2, 6, 11, generator=gen), weight=torch.randn(6, 4, generator=gen),
             bias=torch.randn(6, generator=gen), initial_states=torch.randn(2, 6, 3, generator=gen))
    names = ("x", "weight", "bias", "initial_states")
    with use_backend("reference"):
        ours = _grads(lambda **kw: cc.causal_conv1d_fn(**kw, return_final_states=True,
                                                       activation="silu"), a, names)
    theirs = _grads(lambda **kw: _conv_ref(**kw, activation="silu"), a, names)
    _compare(ours, theirs, names)


def test_without_grad_the_serving_path_runs(monkeypatch):
    """No tensor requires grad (or grad disabled): the drop-ins call the serving ops."""
    from nki_ssm.torch import training

    def refuse(*args, **kwargs):
        raise AssertionError("training op called without grad")

    for name in ("short_conv_train", "ssd_train", "gated_delta_train"):
        monkeypatch.setattr(training, name, refuse)
    a = fla_gdn_inputs(B=1, T=5, decay=2.0)
    with use_backend("reference"):
        fla.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"])
        with torch.no_grad():
            fla.chunk_gated_delta_rule(a["q"].requires_grad_(), a["k"], a["v"], a["g"], a["beta"])
        cc.causal_conv1d_fn(torch.randn(1, 4, 5), torch.randn(4, 3))
        ms.mamba_chunk_scan_combined(torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2),
                                     -torch.ones(2), torch.randn(1, 5, 1, 8),
                                     torch.randn(1, 5, 1, 8), 16)


def test_decode_forms_stay_inference_only():
    """The recurrent / update forms run the serving ops, which have no autograd formula."""
    a = fla_gdn_inputs(B=1, T=3, decay=2.0)
    q = a["q"].requires_grad_()
    with use_backend("reference"):
        o, _ = fla.fused_recurrent_gated_delta_rule(q, a["k"], a["v"], g=a["g"], beta=a["beta"])
    with pytest.raises(RuntimeError):
        o.sum().backward()
