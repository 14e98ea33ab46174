"""Cross-checks of the short-conv and Mamba-2 SSD references against independent
implementations: torch.nn.functional.conv1d and Hugging Face transformers' torch
paths (modeling_mamba2: mamba2_chunk_scan, mamba2_selective_state_update,
causal_conv1d_fn/update; modeling_qwen3_next: causal_conv1d_fn/update).

Bars, by the oracle's own arithmetic:
  * conv (F.conv1d and both transformers conv functions) compute in the weight's
    dtype, so with float64 tensors they run in float64: bar 1e-10.
  * mamba2_chunk_scan casts x, B, C, dt*A to float32 inside (`.float()`), whatever
    the input dtype: bar 1e-5 relative Frobenius.
  * mamba2_selective_state_update computes exp(dt*A) in float32 (`dt.float() *
    A.float()`), the rest in the input dtype: bar 1e-5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
mamba2 = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from nki_ssm.reference.inputs import make_short_conv_decode_inputs, make_short_conv_inputs  # noqa: E402
from nki_ssm.reference.inputs import make_ssd_decode_inputs, make_ssd_inputs  # noqa: E402
from nki_ssm.reference.mamba2_ssd import ssd_chunked, ssd_decode, ssd_recurrent  # noqa: E402
from nki_ssm.reference.metrics import rel_fro  # noqa: E402
from nki_ssm.reference.short_conv import short_conv_decode, short_conv_prefill  # noqa: E402

pytestmark = pytest.mark.oracles

F64_BAR = 1e-10   # oracle computes in float64
F32_BAR = 1e-5    # oracle computes in float32 internally


def _t(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64).copy())


# ----------------------------------------------------------------------------- SSD prefill

@pytest.mark.parametrize(
    "L, chunk, H, G, initial, dt_limit",
    [(21, 8, 4, 2, True, (0.0, math.inf)),     # length not a multiple of the chunk
     (16, 4, 4, 1, False, (0.0, math.inf)),
     (1, 8, 2, 2, True, (0.0, math.inf)),      # T = 1
     (13, 16, 6, 3, True, (0.01, 2.0))],       # dt_limit clip active, one short chunk
)
def test_ssd_matches_transformers_mamba2_chunk_scan(rng, L, chunk, H, G, initial, dt_limit):
    b, P, N = 3, 4, 8
    inp = make_ssd_inputs(rng, seqlens=[L] * b, H=H, P=P, N=N, G=G, D="H", z=False,
                          dtype=np.float64, has_initial_state=initial, dt_limit=dt_limit)
    y_ref, pool_ref = ssd_recurrent(**inp)
    y_chk, pool_chk = ssd_chunked(**inp, chunk_size=chunk)
    idx = inp["state_indices"]
    dense = lambda k: _t(inp[k].reshape((b, L) + inp[k].shape[1:]))
    y, final = mamba2.mamba2_chunk_scan(
        dense("x"), dense("dt"), _t(inp["A"]), dense("B"), dense("C"), chunk_size=chunk,
        D=_t(inp["D"]), dt_bias=_t(inp["dt_bias"]), dt_softplus=True, dt_limit=dt_limit,
        initial_states=_t(inp["ssm_states"][idx]) if initial else None,
        return_final_states=True)
    # y comes back float64 (the D residual promotes it) but the scan itself ran in float32
    y = y.double().numpy().reshape(y_ref.shape)
    final = final.double().numpy()
    for ours_y, ours_pool in ((y_ref, pool_ref), (y_chk, pool_chk)):
        assert rel_fro(y, ours_y) <= F32_BAR
        assert rel_fro(final, ours_pool[idx]) <= F32_BAR


# ----------------------------------------------------------------------------- SSD decode

@pytest.mark.parametrize("G, with_z", [(1, True), (2, False)])
def test_ssd_decode_matches_transformers_selective_state_update(rng, G, with_z):
    H, P, N = 4, 4, 8
    inp = make_ssd_decode_inputs(rng, num_seqs=4, T=None, H=H, P=P, N=N, G=G, padding=1,
                                 D="HP", z=with_z, dtype=np.float64)
    y_ref, pool_ref = ssd_decode(**inp)
    live = np.nonzero(inp["state_indices"] >= 0)[0]
    slots = inp["state_indices"][live]
    state = _t(inp["ssm_states"][slots])
    # the Mixer's calling convention: per-head scalars broadcast over P (and N for A)
    y = mamba2.mamba2_selective_state_update(
        state, _t(inp["x"][live]), _t(inp["dt"][live])[..., None].expand(-1, -1, P),
        _t(inp["A"])[:, None, None].expand(-1, P, N), _t(inp["B"][live]), _t(inp["C"][live]),
        D=_t(inp["D"]), dt_bias=_t(inp["dt_bias"])[:, None].expand(-1, P), dt_softplus=True,
        z=_t(inp["z"][live]) if with_z else None)
    assert rel_fro(y.numpy(), y_ref[live]) <= F32_BAR
    assert rel_fro(state.numpy(), pool_ref[slots]) <= F32_BAR    # updated in place by the oracle


# ----------------------------------------------------------------------------- short conv

@pytest.mark.parametrize("W, activation", [(2, None), (4, "silu"), (5, "silu")])
def test_conv_prefill_matches_torch_conv1d_causal_padding(rng, W, activation):
    b, L, dim = 3, 9, 6
    inp = make_short_conv_inputs(rng, seqlens=[L] * b, dim=dim, W=W, dtype=np.float64,
                                 activation=activation, has_initial_state=False)
    y_ref, pool_ref = short_conv_prefill(**inp)
    x = _t(inp["x"].reshape(b, L, dim)).transpose(1, 2)                  # [b, dim, L]
    y = torch.nn.functional.conv1d(x, _t(inp["weight"])[:, None, :], _t(inp["bias"]),
                                   padding=W - 1, groups=dim)[..., :L]
    if activation == "silu":
        y = torch.nn.functional.silu(y)
    assert rel_fro(y.transpose(1, 2).reshape(b * L, dim).numpy(), y_ref) <= F64_BAR
    # final state = last W-1 inputs
    expect = x[..., -(W - 1):].numpy()
    assert rel_fro(expect, pool_ref[inp["state_indices"]]) == 0.0


@pytest.mark.parametrize("module", [mamba2, qwen3_next], ids=["mamba2", "qwen3_next"])
def test_conv_prefill_matches_transformers_causal_conv1d_fn(rng, module):
    b, L, dim, W = 2, 7, 5, 4
    inp = make_short_conv_inputs(rng, seqlens=[L] * b, dim=dim, W=W, dtype=np.float64,
                                 has_initial_state=False)
    y_ref, _ = short_conv_prefill(**inp)
    x = _t(inp["x"].reshape(b, L, dim)).transpose(1, 2)
    y = module.causal_conv1d_fn(x, _t(inp["weight"]), _t(inp["bias"]), activation="silu")
    assert y.dtype == torch.float64
    assert rel_fro(y.transpose(1, 2).reshape(b * L, dim).numpy(), y_ref) <= F64_BAR


@pytest.mark.parametrize("module", [mamba2, qwen3_next], ids=["mamba2", "qwen3_next"])
@pytest.mark.parametrize("T", [1, 3])
def test_conv_decode_matches_transformers_causal_conv1d_update(rng, module, T):
    dim, W = 6, 4
    inp = make_short_conv_decode_inputs(rng, num_seqs=4, T=T, dim=dim, W=W, padding=1,
                                        dtype=np.float64)
    y_ref, pool_ref = short_conv_decode(**inp)
    live = np.nonzero(inp["state_indices"] >= 0)[0]
    slots = inp["state_indices"][live]
    state = _t(inp["conv_states"][slots])                              # [n, dim, W-1]
    y = module.causal_conv1d_update(_t(inp["x"][live]).transpose(1, 2), state,
                                    _t(inp["weight"]), _t(inp["bias"]), activation="silu")
    assert rel_fro(y.transpose(1, 2).numpy(), y_ref[live]) <= F64_BAR
    assert rel_fro(state.numpy(), pool_ref[slots]) <= F64_BAR          # shifted in place


# ----------------------------------------------------------------------------- whole mixer

def test_conv_then_ssd_reproduce_transformers_mamba2_mixer_prefill():
    """Mamba2Mixer's torch path (in_proj -> causal conv + SiLU -> chunk scan ->
    gated RMSNorm -> out_proj) with our conv and SSD references substituted for
    its middle two stages. The mixer's scan runs in float32 inside: bar 1e-5."""
    cfg = mamba2.Mamba2Config(num_heads=4, head_dim=4, n_groups=2, state_size=8, hidden_size=8,
                              expand=2, conv_kernel=4, chunk_size=8, num_hidden_layers=1,
                              vocab_size=16)
    torch.manual_seed(0)
    mixer = mamba2.Mamba2Mixer(cfg, layer_idx=0).double().eval()
    H, P, G, N = 4, 4, 2, 8
    with torch.no_grad():
        # realistic A in [-16, -1] (the default init is 1..H) and random dt_bias, D
        mixer.A_log.copy_(torch.log(torch.empty(H).uniform_(1.0, 16.0)))
        mixer.dt_bias.copy_(torch.empty(H).uniform_(-4.0, 1.0))
        mixer.D.copy_(torch.empty(H).uniform_(0.5, 1.5))
    b, L = 2, 13                                                       # 13: not a multiple of 8
    hidden = torch.randn(b, L, cfg.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        expect = mixer(hidden).numpy()
        proj = mixer.in_proj(hidden)
    inter, conv_dim = H * P, H * P + 2 * G * N
    gate, xbc, dt = torch.split(proj, [inter, conv_dim, H], dim=-1)
    flat = lambda t: t.reshape(b * L, -1).numpy()
    cu = np.array([0, L, 2 * L], np.int32)
    pools = dict(state_indices=np.array([0, 1], np.int32), has_initial_state=np.zeros(2, bool),
                 cu_seqlens=cu)
    xbc_c, _ = short_conv_prefill(flat(xbc), mixer.conv1d.weight.detach().squeeze(1).numpy(),
                                  mixer.conv1d.bias.detach().numpy(), activation="silu",
                                  conv_states=np.zeros((2, conv_dim, 3)), **pools)
    x, B, C = np.split(xbc_c, [inter, inter + G * N], axis=1)
    y, _ = ssd_chunked(x.reshape(-1, H, P), flat(dt), -np.exp(mixer.A_log.detach().numpy()),
                       B.reshape(-1, G, N), C.reshape(-1, G, N), D=mixer.D.detach().numpy(),
                       dt_bias=mixer.dt_bias.detach().numpy(), dt_softplus=True,
                       dt_limit=tuple(cfg.time_step_limit), ssm_states=np.zeros((2, H, P, N)),
                       chunk_size=8, **pools)
    with torch.no_grad():
        ours = mixer.out_proj(mixer.norm(torch.from_numpy(y.reshape(b, L, inter)), gate)).numpy()
    assert rel_fro(ours, expect) <= F32_BAR
