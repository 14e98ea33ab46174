"""FLA drop-ins against transformers' pure-torch Gated DeltaNet paths (Qwen3.5: GVA aware)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch_cases import fla_gdn_inputs, rel  # noqa: E402

from nki_ssm.torch import fla, use_backend  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def hf():
    return pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("recurrent", [False, True], ids=["chunk", "recurrent"])
def test_dense_gva_matches_transformers(hf, recurrent, backend):
    a = fla_gdn_inputs()
    ours = fla.fused_recurrent_gated_delta_rule if recurrent else fla.chunk_gated_delta_rule
    theirs = hf.torch_recurrent_gated_delta_rule if recurrent else hf.torch_chunk_gated_delta_rule
    with use_backend(backend):
        o, s = ours(a["q"], a["k"], a["v"], g=a["g"], beta=a["beta"], initial_state=a["initial_state"],
                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_ref, s_ref = theirs(a["q"], a["k"], a["v"], g=a["g"], beta=a["beta"],
                          initial_state=a["initial_state"], output_final_state=True,
                          use_qk_l2norm_in_kernel=True)
    assert o.dtype == a["q"].dtype and s.dtype == torch.float32
    assert rel(o, o_ref) < TOL and rel(s, s_ref) < TOL


@pytest.mark.parametrize("recurrent", [False, True], ids=["chunk", "recurrent"])
def test_cu_seqlens_ragged_batch_equals_per_sequence_calls(hf, recurrent):
    lengths = [5, 1, 9]
    a = fla_gdn_inputs(B=1, T=sum(lengths))
    h0 = torch.randn(len(lengths), 4, 16, 8) * 0.1
    cu = torch.tensor([0, 5, 6, 15])
    ours = fla.fused_recurrent_gated_delta_rule if recurrent else fla.chunk_gated_delta_rule
    with use_backend("reference"):
        o, s = ours(a["q"], a["k"], a["v"], g=a["g"], beta=a["beta"], initial_state=h0,
                    output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    for i, (st, en) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        sl = slice(st, en)
        o_ref, s_ref = hf.torch_chunk_gated_delta_rule(
            a["q"][:, sl], a["k"][:, sl], a["v"][:, sl], g=a["g"][:, sl], beta=a["beta"][:, sl],
            initial_state=h0[i:i + 1], output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert rel(o[:, sl], o_ref) < TOL and rel(s[i:i + 1], s_ref) < TOL


def test_scale_state_v_first_no_final_state(hf):
    a = fla_gdn_inputs(B=1, T=6)
    h0_vk = a["initial_state"][:1].transpose(-1, -2).contiguous()
    with use_backend("reference"):
        o, s = fla.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"], scale=0.3,
                                          initial_state=h0_vk, output_final_state=True,
                                          state_v_first=True, chunk_size=16)
        o2, none = fla.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"])
    assert none is None
    # transformers' torch path always uses K**-0.5: fold 0.3 / K**-0.5 into q
    q = a["q"] * (0.3 / 16 ** -0.5)
    o_ref, s_ref = hf.torch_chunk_gated_delta_rule(q, a["k"], a["v"], g=a["g"], beta=a["beta"],
                                                   initial_state=a["initial_state"][:1],
                                                   output_final_state=True)
    assert rel(o, o_ref) < TOL and rel(s.transpose(-1, -2), s_ref) < TOL
    o2_ref, _ = hf.torch_chunk_gated_delta_rule(a["q"], a["k"], a["v"], g=a["g"], beta=a["beta"])
    assert rel(o2, o2_ref) < TOL


@pytest.mark.parametrize("neg", [False, True])
def test_gates_fused_in_kernel(hf, neg):
    a = fla_gdn_inputs(B=1, T=7)
    raw_a, raw_b = torch.randn(1, 7, 4), torch.randn(1, 7, 4)
    A_log, dt_bias = torch.rand(4).log(), torch.randn(4)
    with use_backend("sim"):
        o, _ = fla.fused_recurrent_gated_delta_rule(
            a["q"], a["k"], a["v"], g=raw_a, beta=raw_b, use_gate_in_kernel=True, A_log=A_log,
            dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg,
            use_qk_l2norm_in_kernel=True)
    g = -A_log.exp() * F.softplus(raw_a + dt_bias)
    beta = raw_b.sigmoid() * (2.0 if neg else 1.0)
    o_ref, _ = hf.torch_recurrent_gated_delta_rule(a["q"], a["k"], a["v"], g=g, beta=beta,
                                                    use_qk_l2norm_in_kernel=True)
    assert rel(o, o_ref) < TOL


def test_peer_errors():
    a = fla_gdn_inputs(B=2, T=4)
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        fla.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"],
                                   cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="chunk_size"):
        fla.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"], chunk_size=128)
    with pytest.raises(ValueError, match="HV"):
        fla.chunk_gated_delta_rule(a["q"], a["k"], a["v"][:, :, :3], a["g"], a["beta"])
    with pytest.raises(ValueError, match="number of initial states"):
        fla.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"],
                                   initial_state=a["initial_state"][:1])
    with pytest.raises(NotImplementedError, match="gk"):
        fla.fused_recurrent_gated_delta_rule(a["q"], a["k"], a["v"], gk=a["q"])
    with pytest.raises(ValueError, match="allow_neg_eigval"):
        fla.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"],
                                   allow_neg_eigval=True)


def test_initial_state_is_not_written():
    a = fla_gdn_inputs()
    h0 = a["initial_state"].clone()
    with use_backend("reference"):
        fla.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"],
                                   initial_state=a["initial_state"], output_final_state=True)
    assert torch.equal(a["initial_state"], h0)


def test_bfloat16_output_dtype_float32_final_state(hf):
    a = fla_gdn_inputs(B=1, T=9)
    q, k, v = (a[n].to(torch.bfloat16) for n in ("q", "k", "v"))
    with use_backend("sim"):
        o, s = fla.chunk_gated_delta_rule(q, k, v, a["g"], a["beta"].to(torch.bfloat16),
                                          initial_state=a["initial_state"][:1].to(torch.bfloat16),
                                          output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    o_ref, s_ref = hf.torch_chunk_gated_delta_rule(
        q.float(), k.float(), v.float(), g=a["g"], beta=a["beta"].to(torch.bfloat16).float(),
        initial_state=a["initial_state"][:1].to(torch.bfloat16).float(), output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    # DESIGN.md, Numerics: bfloat16 I/O target 3e-3 (relative Frobenius)
    assert rel(o, o_ref) < 3e-3 and rel(s, s_ref) < 3e-3


def test_float16_is_refused_naming_the_argument():
    a = fla_gdn_inputs(B=1, T=4)
    with pytest.raises(TypeError, match="q must have dtype"):
        fla.chunk_gated_delta_rule(a["q"].half(), a["k"].half(), a["v"].half(), a["g"],
                                   a["beta"])
