"""mamba_ssm drop-ins against transformers' pure-torch Mamba-2 paths and the peer's semantics."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch_cases import rel  # noqa: E402

from nki_ssm.torch import mamba_ssm as ms  # noqa: E402
from nki_ssm.torch import use_backend  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def hf():
    return pytest.importorskip("transformers.models.mamba2.modeling_mamba2")


def _inputs(b=2, L=21, H=4, P=8, G=2, N=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(x=r(b, L, H, P), dt=r(b, L, H), A=-(torch.rand(H, generator=gen) * 15 + 1),
                B=r(b, L, G, N), C=r(b, L, G, N), D=r(H), dt_bias=r(H), h0=r(b, H, P, N) * 0.5,
                z=r(b, L, H, P))


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("chunk_size", [8, 100, 256])
def test_any_chunk_size_matches_transformers(hf, chunk_size, backend):
    a = _inputs()
    with use_backend(backend):
        y, final = ms.mamba_chunk_scan_combined(
            a["x"], a["dt"], a["A"], a["B"], a["C"], chunk_size, D=a["D"], dt_bias=a["dt_bias"],
            initial_states=a["h0"], dt_softplus=True, dt_limit=(0.0, 0.5),
            return_final_states=True)
    y_ref, f_ref = hf.mamba2_chunk_scan(
        a["x"], a["dt"], a["A"], a["B"], a["C"], 8, D=a["D"], dt_bias=a["dt_bias"],
        initial_states=a["h0"], dt_softplus=True, dt_limit=(0.0, 0.5), return_final_states=True)
    assert rel(y, y_ref) < TOL and rel(final, f_ref) < TOL
    assert final.dtype == a["C"].dtype


def test_kernel_chunk_size_mapping():
    assert [ms.kernel_chunk_size(c) for c in (1, 8, 16, 40, 64, 128, 256)] == \
        [16, 16, 16, 32, 64, 128, 128]
    with pytest.raises(ValueError, match="chunk_size"):
        ms.kernel_chunk_size(0)


def test_z_gate_and_per_channel_D(hf):
    a = _inputs(b=1, L=9)
    D2 = torch.randn(4, 8)
    with use_backend("reference"):
        y = ms.mamba_chunk_scan_combined(a["x"], a["dt"], a["A"], a["B"], a["C"], 256, D=D2,
                                         z=a["z"], dt_bias=a["dt_bias"], dt_softplus=True)
    y_ref = hf.mamba2_chunk_scan(a["x"], a["dt"], a["A"], a["B"], a["C"], 8,
                                 dt_bias=a["dt_bias"], dt_softplus=True)
    y_ref = (y_ref + a["x"] * D2) * F.silu(a["z"])
    assert rel(y, y_ref) < TOL


def test_seq_idx_and_varlen_states_equal_per_sequence_calls(hf):
    lengths = [6, 1, 10]
    a = _inputs(b=1, L=sum(lengths))
    seq_idx = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))[None].int()
    cu = torch.tensor([0, 6, 7, 17])
    with use_backend("reference"):
        y, final, varlen = ms.mamba_chunk_scan_combined(
            a["x"], a["dt"], a["A"], a["B"], a["C"], 256, D=a["D"], dt_bias=a["dt_bias"],
            initial_states=a["h0"][:1], seq_idx=seq_idx, cu_seqlens=cu, dt_softplus=True,
            return_final_states=True, return_varlen_states=True)
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        sl = slice(s, e)
        y_ref, f_ref = hf.mamba2_chunk_scan(
            a["x"][:, sl], a["dt"][:, sl], a["A"], a["B"][:, sl], a["C"][:, sl], 8, D=a["D"],
            dt_bias=a["dt_bias"], initial_states=a["h0"][:1] if i == 0 else None,
            dt_softplus=True, return_final_states=True)
        assert rel(y[:, sl], y_ref) < TOL and rel(varlen[i:i + 1], f_ref) < TOL
    assert torch.equal(final, varlen[-1:])
    with pytest.raises(AssertionError, match="cu_seqlens"):
        ms.mamba_chunk_scan_combined(a["x"], a["dt"], a["A"], a["B"], a["C"], 256,
                                     seq_idx=seq_idx, cu_seqlens=torch.tensor([0, 3, 17]),
                                     return_varlen_states=True)


def _decode_inputs(b=3, H=4, P=8, G=2, N=16, seed=1):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    A = -(torch.rand(H, generator=gen) * 15 + 1)
    return dict(state=r(b, H, P, N), x=r(b, H, P), dt=r(b, H)[..., None].expand(-1, -1, P),
                A=A[:, None, None].expand(-1, P, N), B=r(b, G, N), C=r(b, G, N),
                D=r(H)[:, None].expand(-1, P), dt_bias=r(H)[:, None].expand(-1, P), z=r(b, H, P))


@pytest.mark.parametrize("backend", ["reference", "sim"])
def test_selective_state_update_strided_forms_match_transformers(hf, backend):
    a = _decode_inputs()
    s_ref = a["state"].clone()
    with use_backend(backend):
        out = ms.selective_state_update(a["state"], a["x"], a["dt"], a["A"], a["B"], a["C"],
                                        a["D"], z=a["z"], dt_bias=a["dt_bias"], dt_softplus=True)
    out_ref = hf.mamba2_selective_state_update(s_ref, a["x"], a["dt"], a["A"], a["B"], a["C"],
                                               a["D"], z=a["z"], dt_bias=a["dt_bias"],
                                               dt_softplus=True)
    assert rel(out, out_ref) < TOL and rel(a["state"], s_ref) < TOL


def test_selective_state_update_negative_dt_is_not_clamped(hf):
    a = _decode_inputs()
    s_ref = a["state"].clone()
    dt = -a["dt"].abs() * 0.1                     # no softplus, no dt_limit: negative dt stays
    with use_backend("sim"):
        out = ms.selective_state_update(a["state"], a["x"], dt, a["A"], a["B"], a["C"])
    out_ref = hf.mamba2_selective_state_update(s_ref, a["x"], dt, a["A"], a["B"], a["C"])
    assert rel(out, out_ref) < TOL and rel(a["state"], s_ref) < TOL


def test_selective_state_update_batch_indices_and_padding(hf):
    a = _decode_inputs()
    pool = torch.randn(6, 4, 8, 16)
    before = pool.clone()
    idx = torch.tensor([5, -3, 1], dtype=torch.int32)
    with use_backend("reference"):
        out = ms.selective_state_update(pool, a["x"], a["dt"], a["A"], a["B"], a["C"], a["D"],
                                        dt_bias=a["dt_bias"], dt_softplus=True,
                                        state_batch_indices=idx)
    live = [0, 2]
    s_ref = before[idx[live].long()].clone()
    sel = lambda t: t[live]  # noqa: E731
    out_ref = hf.mamba2_selective_state_update(s_ref, sel(a["x"]), sel(a["dt"]), a["A"],
                                               sel(a["B"]), sel(a["C"]), a["D"],
                                               dt_bias=a["dt_bias"], dt_softplus=True)
    assert rel(out[live], out_ref) < TOL and torch.equal(out[1], torch.zeros(4, 8))
    assert rel(pool[idx[live].long()], s_ref) < TOL
    for untouched in (0, 2, 3, 4):
        assert torch.equal(pool[untouched], before[untouched])


def test_selective_state_update_rejects_per_dim_A_and_leaves_state_untouched():
    a = _decode_inputs()
    before = a["state"].clone()
    A = a["A"].contiguous().clone()
    A[0, 1, 0] += 1.0
    with pytest.raises(ValueError, match="A must be constant"):
        ms.selective_state_update(a["state"], a["x"], a["dt"], A, a["B"], a["C"])
    with pytest.raises(AssertionError, match="dt_bias"):
        ms.selective_state_update(a["state"], a["x"], a["dt"], a["A"], a["B"], a["C"],
                                  dt_bias=torch.zeros(4, 7))
    assert torch.equal(a["state"], before)


def test_selective_state_update_without_heads_dim(hf):
    a = _decode_inputs(H=1)
    s = a["state"][:, 0].clone()
    s_ref = a["state"].clone()
    with use_backend("reference"):
        out = ms.selective_state_update(s, a["x"][:, 0], a["dt"][:, 0], a["A"][0], a["B"][:, 0],
                                        a["C"][:, 0])
    out_ref = hf.mamba2_selective_state_update(s_ref, a["x"], a["dt"], a["A"], a["B"][:, :1],
                                               a["C"][:, :1])
    assert out.shape == (3, 8)
    assert rel(out, out_ref[:, 0]) < TOL and rel(s, s_ref[:, 0]) < TOL
