"""causal_conv1d drop-ins against the peer's documented semantics and transformers' torch path."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch_cases import ref_conv as ref_fn  # noqa: E402
from torch_cases import ref_conv_update as ref_update  # noqa: E402
from torch_cases import rel  # noqa: E402

from nki_ssm.torch import causal_conv1d as cc  # noqa: E402
from nki_ssm.torch import use_backend  # noqa: E402

TOL = 1e-5  # float32 I/O target (DESIGN.md, Numerics)


def test_default_activation_is_none_and_swish_is_silu():
    x, w, b = torch.randn(2, 8, 7), torch.randn(8, 4), torch.randn(8)
    with use_backend("reference"):
        plain = cc.causal_conv1d_fn(x, w, b)
        swish = cc.causal_conv1d_fn(x, w, b, activation="swish")
    assert rel(plain, ref_fn(x, w, b)[0]) < TOL
    assert rel(swish, ref_fn(x, w, b, activation="silu")[0]) < TOL
    with pytest.raises(NotImplementedError, match="activation"):
        cc.causal_conv1d_fn(x, w, b, activation="relu")


@pytest.mark.parametrize("backend", ["reference", "sim"])
def test_matches_transformers_torch_path(backend):
    m2 = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")

    x, w, b = torch.randn(3, 16, 5), torch.randn(16, 4), torch.randn(16)
    with use_backend(backend):
        got = cc.causal_conv1d_fn(x, w, b, activation="silu")
    assert rel(got, m2.causal_conv1d_fn(x, w, b, activation="silu")) < TOL


def test_initial_and_final_states_short_sequence():
    x, w = torch.randn(2, 8, 2), torch.randn(8, 4)       # T < W - 1
    h0 = torch.randn(2, 8, 3)
    out_buf = torch.empty(2, 8, 3)
    with use_backend("sim"):
        out, final = cc.causal_conv1d_fn(x, w, None, initial_states=h0, return_final_states=True,
                                          final_states_out=out_buf)
    want, want_final = ref_fn(x, w, initial_states=h0)
    assert rel(out, want) < TOL
    assert final is out_buf and torch.equal(final, want_final)


def test_seq_idx_resets_between_packed_sequences():
    x, w, b = torch.randn(1, 8, 11), torch.randn(8, 3), torch.randn(8)
    seq_idx = torch.tensor([[0] * 4 + [1] * 6 + [2]], dtype=torch.int32)
    with use_backend("reference"):
        got = cc.causal_conv1d_fn(x, w, b, seq_idx=seq_idx, activation="silu")
    pieces = [ref_fn(x[..., s:e], w, b, activation="silu")[0] for s, e in ((0, 4), (4, 10), (10, 11))]
    assert rel(got, torch.cat(pieces, -1)) < TOL
    with pytest.raises(AssertionError, match="initial_states"):
        cc.causal_conv1d_fn(x, w, b, seq_idx=seq_idx, initial_states=torch.zeros(1, 8, 2))


def test_varlen_form_updates_conv_states_pool():
    dim, width = 8, 4
    lengths = [5, 0, 2, 3]
    x = torch.randn(dim, sum(lengths))
    w, b = torch.randn(dim, width), torch.randn(dim)
    qsl = torch.tensor([0, 5, 5, 7, 10], dtype=torch.int32)
    pool = torch.randn(6, dim, width - 1)
    before = pool.clone()
    cache_indices = torch.tensor([4, 0, -1, 2], dtype=torch.int32)     # -1 = pad_slot_id
    has_init = torch.tensor([True, False, True, False])
    with use_backend("sim"):
        got = cc.causal_conv1d_fn(x, w, b, query_start_loc=qsl, cache_indices=cache_indices,
                                  has_initial_state=has_init, conv_states=pool, activation="silu")
    for i, (s, e) in enumerate(zip(qsl[:-1].tolist(), qsl[1:].tolist())):
        slot = int(cache_indices[i])
        if slot < 0:
            assert torch.equal(got[:, s:e], torch.zeros(dim, e - s))
            continue
        h0 = before[slot][None] if has_init[i] else None
        want, final = ref_fn(x[None, :, s:e], w, b, initial_states=h0, activation="silu")
        if e > s:
            assert rel(got[:, s:e], want[0]) < TOL
        assert torch.allclose(pool[slot], final[0])
    for untouched in (1, 3, 5):
        assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("state_len", [3, 4, 6])
def test_update_shifts_states_wider_than_width_minus_one(state_len, backend):
    w, b = torch.randn(8, 4), torch.randn(8)
    x = torch.randn(3, 8, 2)
    state = torch.randn(3, 8, state_len)
    want_state = state.clone()
    want = ref_update(x, want_state, w, b, "silu")
    with use_backend(backend):
        got = cc.causal_conv1d_update(x, state, w, b, "silu")
    assert rel(got, want) < TOL
    assert torch.equal(state, want_state)


def test_update_single_token_2d_and_conv_state_indices():
    w = torch.randn(8, 3)
    x = torch.randn(3, 8)
    pool = torch.randn(5, 8, 4)
    before = pool.clone()
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    with use_backend("reference"):
        got = cc.causal_conv1d_update(x, pool, w, conv_state_indices=idx)
    assert got.shape == (3, 8)
    live = [0, 2]
    ref_states = before[idx[live].long()].clone()
    want = ref_update(x[live].unsqueeze(-1), ref_states, w)[..., 0]
    assert rel(got[live], want) < TOL
    assert torch.equal(got[1], torch.zeros(8))
    assert torch.equal(pool[idx[live].long()], ref_states)
    for untouched in (1, 2, 4):
        assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("backend", ["reference", "sim"])
def test_update_circular_buffer_with_cache_seqlens(backend):
    w, b = torch.randn(8, 4), torch.randn(8)
    x = torch.randn(2, 8, 2)
    state = torch.randn(2, 8, 5)
    cache_seqlens = torch.tensor([7, 2], dtype=torch.int32)
    want_state = state.clone()
    want = ref_update(x, want_state, w, b, "silu", cache_seqlens)
    with use_backend(backend):
        got = cc.causal_conv1d_update(x, state, w, b, "silu", cache_seqlens=cache_seqlens)
    assert rel(got, want) < TOL
    assert torch.equal(state, want_state)


def test_invalid_update_names_argument_and_leaves_state_untouched():
    w = torch.randn(8, 4)
    state = torch.randn(2, 8, 2)              # narrower than W - 1
    before = state.clone()
    with pytest.raises(ValueError, match="conv_state"):
        cc.causal_conv1d_update(torch.randn(2, 8), state, w)
    assert torch.equal(state, before)
    state = torch.randn(2, 8, 3)
    before = state.clone()
    with pytest.raises(ValueError, match="state_indices"):
        cc.causal_conv1d_update(torch.randn(2, 8), state, w,
                                conv_state_indices=torch.tensor([0, 5], dtype=torch.int32))
    assert torch.equal(state, before)


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("seqlen", [2, 9])   # T < W - 1: the final states hold initial states
def test_inference_and_training_give_the_same_forward(backend, seqlen):
    """bf16 x with float32 initial_states: the inference path (no grad) must not round the
    initial states to bf16 before the kernel reads them, as the training path does not."""
    g = torch.Generator().manual_seed(seqlen)
    x = torch.randn(2, 16, seqlen, generator=g).to(torch.bfloat16)
    w = torch.randn(16, 4, generator=g).to(torch.bfloat16)
    h0 = torch.randn(2, 16, 3, generator=g)            # float32, not representable in bf16
    assert not torch.equal(h0, h0.to(torch.bfloat16).float())
    with use_backend(backend):
        out, final = cc.causal_conv1d_fn(x, w, None, initial_states=h0, return_final_states=True,
                                          activation="silu")
        out_t, final_t = cc.causal_conv1d_fn(x, w, None, initial_states=h0.clone().requires_grad_(),
                                              return_final_states=True, activation="silu")
    assert out.dtype == out_t.dtype == final.dtype == final_t.dtype == torch.bfloat16
    assert torch.equal(out, out_t.detach())
    assert torch.equal(final, final_t.detach())
