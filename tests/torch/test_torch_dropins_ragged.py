"""Ragged batches drawn at random (deterministic Hypothesis runs): every drop-in against its
peer's semantics, per sequence (reference backend: the kernels are covered elsewhere)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torch_cases import ref_conv_update as ref_update  # noqa: E402
from torch_cases import rel  # noqa: E402

from nki_ssm.torch import causal_conv1d as cc  # noqa: E402
from nki_ssm.torch import fla, use_backend  # noqa: E402
from nki_ssm.torch import mamba_ssm as ms  # noqa: E402

TOL = 1e-5
SETTINGS = settings(derandomize=True, max_examples=15, deadline=None, database=None)
lengths = st.lists(st.integers(1, 9), min_size=1, max_size=4)


@SETTINGS
@given(width=st.integers(2, 4), extra=st.integers(0, 3), T=st.integers(1, 3),
       circular=st.booleans(), padding=st.lists(st.booleans(), min_size=1, max_size=3),
       seed=st.integers(0, 2**16))
def test_conv_update_any_state_width_circular_and_padding(width, extra, T, circular, padding,
                                                          seed):
    gen = torch.Generator().manual_seed(seed)
    batch, dim, state_len = len(padding), 8, width - 1 + extra
    slots = batch + 2
    w = torch.randn(dim, width, generator=gen)
    x = torch.randn(batch, dim, T, generator=gen)
    pool = torch.randn(slots, dim, state_len, generator=gen)
    perm = torch.randperm(slots, generator=gen)[:batch].int()
    idx = torch.where(torch.tensor(padding), torch.full_like(perm, -1), perm)
    seqlens = torch.randint(0, 20, (batch,), generator=gen, dtype=torch.int32) if circular else None
    before = pool.clone()
    with use_backend("reference"):
        got = cc.causal_conv1d_update(x, pool, w, None, "silu", cache_seqlens=seqlens,
                                      conv_state_indices=idx)
    for i in range(batch):
        slot = int(idx[i])
        if slot < 0:
            assert torch.equal(got[i], torch.zeros(dim, T))
            continue
        state = before[slot:slot + 1].clone()
        want = ref_update(x[i:i + 1], state, w, None, "silu",
                          None if seqlens is None else seqlens[i:i + 1])
        assert rel(got[i:i + 1], want) < TOL and torch.equal(pool[slot], state[0])
    named = {int(s) for s in idx if s >= 0}
    for s in set(range(slots)) - named:
        assert torch.equal(pool[s], before[s])


@SETTINGS
@given(lens=lengths, recurrent=st.booleans(), seed=st.integers(0, 2**16))
def test_fla_cu_seqlens_any_lengths(lens, recurrent, seed):
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = torch.Generator().manual_seed(seed)
    T, H, HV, K, V = sum(lens), 1, 2, 8, 8
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = -torch.rand(1, T, HV, generator=gen)
    beta = torch.rand(1, T, HV, generator=gen)
    h0 = 0.1 * torch.randn(len(lens), HV, K, V, generator=gen)
    cu = torch.tensor([0] + lens).cumsum(0)
    fn = fla.fused_recurrent_gated_delta_rule if recurrent else fla.chunk_gated_delta_rule
    with use_backend("reference"):
        o, s = fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        o_ref, s_ref = hf.torch_recurrent_gated_delta_rule(
            q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b],
            initial_state=h0[i:i + 1], output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert rel(o[:, a:b], o_ref) < TOL and rel(s[i:i + 1], s_ref) < TOL


@SETTINGS
@given(lens=lengths, chunk_size=st.sampled_from([8, 64, 256]), seed=st.integers(0, 2**16))
def test_mamba_seq_idx_any_lengths(lens, chunk_size, seed):
    hf = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
    gen = torch.Generator().manual_seed(seed)
    L, H, P, G, N = sum(lens), 2, 4, 1, 8
    x, dt = torch.randn(1, L, H, P, generator=gen), torch.randn(1, L, H, generator=gen)
    A = -(torch.rand(H, generator=gen) * 15 + 1)
    B, C = torch.randn(1, L, G, N, generator=gen), torch.randn(1, L, G, N, generator=gen)
    D, dt_bias = torch.randn(H, generator=gen), torch.randn(H, generator=gen)
    seq_idx = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))[None].int()
    cu = torch.tensor([0] + lens).cumsum(0)
    with use_backend("reference"):
        y, varlen = ms.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=D,
                                                 dt_bias=dt_bias, seq_idx=seq_idx, cu_seqlens=cu,
                                                 dt_softplus=True, return_varlen_states=True)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        y_ref, f_ref = hf.mamba2_chunk_scan(x[:, a:b], dt[:, a:b], A, B[:, a:b], C[:, a:b], 4,
                                            D=D, dt_bias=dt_bias, dt_softplus=True,
                                            return_final_states=True)
        assert rel(y[:, a:b], y_ref) < TOL and rel(varlen[i:i + 1], f_ref) < TOL
