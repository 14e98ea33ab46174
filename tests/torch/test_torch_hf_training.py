"""A training step of tiny transformers models patched by ``hf.patch``: parameter gradients
within 1e-4 (relative Frobenius, per parameter) of the stock model's (float32, random weights),
on the float64 reference and on the NKI kernels (simulator): forward and backward kernels of
the conv, SSD and Gated DeltaNet layers.

The stock Gated DeltaNet core (``torch_chunk_gated_delta_rule``) computes in float32 whatever
its input dtype. For the layer's A_log and dt_bias the net gradient is a small sum of much
larger per-token terms, so that float32 core leaves it about 10 % off: measured 1.1e-1 (A_log)
and 1.0e-1 (dt_bias) relative against the same model with a float64 core, every other parameter
within 2.7e-6, while the patched model is within 4.1e-7 of it on every parameter (run with a
local conv backward before the conv backward was merged). The Qwen3-Next
check therefore takes as its oracle the same unpatched model with only that core evaluated in
float64 (a token-by-token torch recurrence written here, independent of nki_ssm) and asserts
both: every parameter within 1e-4 of that oracle, and within 1e-4 of the plain stock model
wherever the stock model itself is within 1e-5 of the oracle (all but the named ill-conditioned
parameters, which the test lists).
"""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_models import BUILDERS, VOCAB  # noqa: E402
from torch_cases import rel  # noqa: E402

import nki_ssm.ops  # noqa: E402
from nki_ssm.torch import hf, use_backend  # noqa: E402

TOL = 1e-4
WELL_CONDITIONED = 1e-5     # stock float32 within this of the float64-core oracle
pytestmark = pytest.mark.skipif(
    not hasattr(nki_ssm.ops, "short_conv_backward"),
    reason="the patched layers' short conv needs nki_ssm.ops.short_conv_backward (the conv "
           "backward, built on another branch of issue 30), not merged yet")


def _kernels_launched(monkeypatch) -> list:
    """The names of the kernels ``nki_ssm.backend.run`` launches from now on."""
    from nki_ssm import backend as nki_backend

    names, run = [], nki_backend.run

    def spy(kernel, *args, **kwargs):
        names.append(getattr(getattr(kernel, "func", kernel), "__name__", ""))
        return run(kernel, *args, **kwargs)

    monkeypatch.setattr(nki_backend, "run", spy)
    return names


def _train_step(model, input_ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    return loss.detach(), {n: None if p.grad is None else p.grad.clone()
                           for n, p in model.named_parameters()}


def _gated_delta_float64(query, key, value, g, beta, chunk_size=64, initial_state=None,
                         output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    """transformers' chunk_gated_delta_rule contract, token by token in float64 (autograd)."""
    q, k, v, g, beta = (t.double() for t in (query, key, value, g, beta))
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    q = q.repeat_interleave(HV // H, dim=2) * K ** -0.5
    k = k.repeat_interleave(HV // H, dim=2)
    S = (q.new_zeros(B, HV, K, V) if initial_state is None else initial_state.double())
    outs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    o = torch.stack(outs, dim=1).to(query.dtype)
    return o, (S.float() if output_final_state else None)


def _compare(grads, reference, names=None):
    compared = []
    for name, g_ref in reference.items():
        if names is not None and name not in names:
            continue
        g = grads[name]
        assert (g is None) == (g_ref is None), name
        if g_ref is None:
            continue
        assert rel(g, g_ref) < TOL, (name, rel(g, g_ref))
        compared.append(name)
    return compared


def _mixer_has_gradients(layers, grads):
    prefixes = tuple(f"{m}." for m, _ in layers)
    assert any(n.startswith(prefixes) and g is not None and g.abs().max() > 0
               for n, g in grads.items())


def _setup(family):
    torch.manual_seed(0)
    stock = BUILDERS[family]().float().train()
    patched = copy.deepcopy(stock)
    layers = hf.patch(patched)
    input_ids = torch.randint(1, VOCAB, (2, 21), generator=torch.Generator().manual_seed(1))
    return stock, patched, layers, input_ids


@pytest.mark.parametrize("backend", ["reference", "sim"])
def test_patched_mamba2_training_step_matches_stock_gradients(backend, monkeypatch):
    stock, patched, layers, input_ids = _setup("mamba2")
    loss_ref, grads_ref = _train_step(stock, input_ids)
    launched = _kernels_launched(monkeypatch)
    with use_backend(backend):
        loss, grads = _train_step(patched, input_ids)
    assert bool(launched) == (backend == "sim")
    assert backend == "reference" or {"ssd_chunk_backward", "short_conv_backward_kernel"} <= set(launched), set(launched)
    assert abs(float(loss) - float(loss_ref)) <= TOL * abs(float(loss_ref))
    assert len(_compare(grads, grads_ref)) > 10
    _mixer_has_gradients(layers, grads_ref)


@pytest.mark.parametrize("backend", ["reference", "sim"])
def test_patched_qwen3_next_training_step_matches_stock_gradients(backend, monkeypatch):
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    stock, patched, layers, input_ids = _setup("qwen3_next")
    oracle_model = copy.deepcopy(stock)
    loss_stock, grads_stock = _train_step(stock, input_ids)
    with monkeypatch.context() as m:
        m.setattr(qwen3_next, "torch_chunk_gated_delta_rule", _gated_delta_float64)
        _, grads_oracle = _train_step(oracle_model, input_ids)
    launched = _kernels_launched(monkeypatch)
    with use_backend(backend):
        loss, grads = _train_step(patched, input_ids)
    assert bool(launched) == (backend == "sim")
    assert backend == "reference" or {"gdn_chunk_backward", "short_conv_backward_kernel"} <= set(launched), set(launched)
    assert abs(float(loss) - float(loss_stock)) <= TOL * abs(float(loss_stock))
    assert len(_compare(grads, grads_oracle)) > 10
    well = {n for n, g in grads_oracle.items()
            if g is not None and rel(grads_stock[n], g) < WELL_CONDITIONED}
    ill = {n for n, g in grads_oracle.items() if g is not None} - well
    # only the GDN decay parameters are ill-conditioned in float32
    assert all(n.endswith((".A_log", ".dt_bias")) for n in ill), sorted(ill)
    assert len(_compare(grads, grads_stock, well)) > 10
    _mixer_has_gradients(layers, grads_stock)


def test_patched_falcon_h1_dstate_256_trains_on_the_kernels(monkeypatch):
    """A tiny Falcon-H1 with dstate N = 256 (the real models' N: two dstate tiles in the SSD
    backward kernel), three SGD steps on the kernels (simulator) and on the float64
    reference backend from the same weights: each step's loss and every parameter gradient
    within 1e-4, and the SSD backward kernel ran."""
    import transformers as tf
    from hf_models import _DECODER, _MAMBA

    torch.manual_seed(0)
    cfg = dict(_MAMBA, mamba_d_state=256)
    base = tf.FalconH1ForCausalLM(tf.FalconH1Config(
        **_DECODER, **cfg, mamba_d_ssm=32, head_dim=8, mamba_rms_norm=True)).float().train()
    layers = hf.patch(base)
    models = {b: copy.deepcopy(base) for b in ("reference", "sim")}
    opts = {b: torch.optim.SGD(m.parameters(), lr=0.5) for b, m in models.items()}
    input_ids = torch.randint(1, VOCAB, (2, 21), generator=torch.Generator().manual_seed(1))
    launched = _kernels_launched(monkeypatch)
    for _ in range(3):
        out = {}
        for b, m in models.items():
            with use_backend(b):
                out[b] = _train_step(m, input_ids)
            opts[b].step()
        (loss, grads), (loss_ref, grads_ref) = out["sim"], out["reference"]
        assert abs(float(loss) - float(loss_ref)) <= TOL * abs(float(loss_ref))
        assert len(_compare(grads, grads_ref)) > 10
        _mixer_has_gradients(layers, grads_ref)
    assert "ssd_chunk_backward" in set(launched), set(launched)
