"""Cross-checks of the float64 references against transformers' Qwen3-Next torch paths.

Oracles (transformers.models.qwen3_next.modeling_qwen3_next, pure torch):
  * torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule: dense
    [B, T, H, D] layout, GQA by repeat_interleave, scale always K**-0.5, all
    math in float32 whatever the input dtype -> bar 1e-5 relative Frobenius.
  * causal_conv1d_update: the conv decode fallback. transformers has no
    function named ``torch_causal_conv1d_update``; this is the nearest
    equivalent (its torch body is the fallback of causal-conv1d's op).

These functions are wrapped by ``use_kernel_func_from_hub_with_fallback``,
which dispatches to FLA / causal-conv1d when those are installed; we unwrap
them so that the pure-torch implementations are what is compared.
"""

from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from nki_ssm.reference.gated_delta import (  # noqa: E402
    gated_delta_chunked,
    gated_delta_decode,
    gated_delta_recurrent,
)
from nki_ssm.reference.inputs import make_gated_delta_inputs, make_slots  # noqa: E402
from nki_ssm.reference.metrics import rel_fro  # noqa: E402
from nki_ssm.reference.short_conv import short_conv_decode  # noqa: E402
from nki_ssm.reference.testing import FORMS_TOL  # noqa: E402

pytestmark = pytest.mark.oracles

FP32_BAR = 1e-5  # the oracles compute in float32
torch_chunk = inspect.unwrap(qwen3_next.torch_chunk_gated_delta_rule)
torch_recurrent = inspect.unwrap(qwen3_next.torch_recurrent_gated_delta_rule)
torch_conv_update = inspect.unwrap(qwen3_next.causal_conv1d_update)


def _dense_inputs(seed, B, T, H, HV, K, V, dtype=np.float32, gates="qwen", with_state=True):
    """Equal-length batch from the shared generator, raw q/k (the oracle normalises them
    with use_qk_l2norm_in_kernel=True). gates "qwen": realistic, exp(A_log) in [1, 16]
    (state memory of a few tokens); "mild": g = -U(0, 0.05), so the initial state and
    long-range terms of the chunk matter (as in transformers' own test, g = -rand).
    with_state: every sequence starts from its pool slot (True) or from zeros (False)."""
    rng = np.random.default_rng(seed)
    inp = make_gated_delta_inputs(rng, seqlens=[T] * B, H=H, HV=HV, K=K, V=V,
                                  use_qk_l2norm=True, slots=B, has_initial_state=with_state,
                                  dtype=dtype)
    if gates == "mild":
        inp["g"] = (-0.05 * rng.random(inp["g"].shape)).astype(np.float32)
    # dense order: sequence n in slot n, so the oracle's initial_state is the pool itself
    inp["state_indices"] = np.arange(B, dtype=np.int32)
    return inp


def _to_torch(x, lead):
    """[B*T, ...] numpy (float32 or bfloat16) -> [B, T, ...] torch in the same dtype."""
    x = np.asarray(x)
    if x.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(x.view(np.uint16).astype(np.int32) << 16).view(torch.float32)
        t = t.to(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(x))
    return t.reshape(lead + x.shape[1:])


def _run_oracle(fn, inp, B, T, with_state, **kw):
    args = {n: _to_torch(inp[n], (B, T)) for n in ("q", "k", "v", "g", "beta")}
    init = torch.from_numpy(np.asarray(inp["ssm_states"], np.float32)) if with_state else None
    o, s = fn(args["q"], args["k"], args["v"], g=args["g"], beta=args["beta"],
              initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=True, **kw)
    return o.to(torch.float64).numpy().reshape((B * T,) + o.shape[2:]), s.double().numpy()


CASES = [  # (B, T, H, HV, K, V, chunk_size)
    (2, 100, 2, 2, 16, 8, 64),    # T not a multiple of the chunk
    (1, 130, 2, 4, 32, 32, 64),   # GQA (Qwen3-Next ratio 2), K = V = 32, three chunks
    (3, 37, 1, 3, 8, 16, 16),     # GQA ratio 3, small chunk
    (2, 1, 2, 4, 16, 16, 64),     # T = 1
]


def _over_prefill_cases(test):
    """Run ``test`` over CASES x initial state (h0 / zero) x gate regime (qwen / mild)."""
    test = pytest.mark.parametrize("B,T,H,HV,K,V,cs", CASES)(test)
    test = pytest.mark.parametrize("with_state", [True, False], ids=["h0", "zero"])(test)
    return pytest.mark.parametrize("gates", ["qwen", "mild"])(test)


@_over_prefill_cases
def test_chunk_oracle(B, T, H, HV, K, V, cs, with_state, gates):
    inp = _dense_inputs(100 + T, B, T, H, HV, K, V, gates=gates, with_state=with_state)
    o_ref, p_ref = gated_delta_chunked(**inp, chunk_size=cs)
    o_t, s_t = _run_oracle(torch_chunk, inp, B, T, with_state, chunk_size=cs)
    assert rel_fro(o_t, o_ref) <= FP32_BAR
    assert rel_fro(s_t, p_ref) <= FP32_BAR
    # and the recurrent reference agrees with the chunked one to float64 precision
    o_rec, p_rec = gated_delta_recurrent(**inp)
    assert rel_fro(o_rec, o_ref) <= FORMS_TOL and rel_fro(p_rec, p_ref) <= FORMS_TOL


@_over_prefill_cases
def test_recurrent_oracle(B, T, H, HV, K, V, cs, with_state, gates):
    inp = _dense_inputs(200 + T, B, T, H, HV, K, V, gates=gates, with_state=with_state)
    o_ref, p_ref = gated_delta_recurrent(**inp)
    o_t, s_t = _run_oracle(torch_recurrent, inp, B, T, with_state)
    assert rel_fro(o_t, o_ref) <= FP32_BAR
    assert rel_fro(s_t, p_ref) <= FP32_BAR


@pytest.mark.parametrize("gates", ["qwen", "mild"])
@pytest.mark.parametrize("T", [1, 3])
def test_decode_oracle(T, gates):
    """Multi-token decode from the pool == the oracle's recurrent path from that state
    (HF's decode path calls torch_recurrent_gated_delta_rule with the cached state)."""
    B, H, HV, K, V = 3, 2, 4, 16, 8
    inp = _dense_inputs(300 + T, B, T, H, HV, K, V, gates=gates)
    dec = {n: inp[n].reshape((B, T) + inp[n].shape[1:]) for n in ("q", "k", "v", "g", "beta")}
    o_ref, p_ref = gated_delta_decode(**dec, use_qk_l2norm=True,
                                      ssm_states=inp["ssm_states"],
                                      state_indices=inp["state_indices"])
    o_t, s_t = _run_oracle(torch_recurrent, inp, B, T, True)
    assert rel_fro(o_t.reshape(o_ref.shape), o_ref) <= FP32_BAR
    assert rel_fro(s_t, p_ref) <= FP32_BAR


def test_chunk_oracle_bfloat16_inputs():
    """bf16 inputs: the oracle upcasts to float32 and returns the state in float32 (bar 1e-5)
    and the output in bf16 (bar: bf16 rounding, unit roundoff 2**-9, plus the float32 bar)."""
    B, T, H, HV, K, V = 2, 70, 2, 4, 16, 16
    inp = _dense_inputs(400, B, T, H, HV, K, V, dtype=ml_dtypes.bfloat16)
    assert inp["q"].dtype == ml_dtypes.bfloat16
    o_ref, p_ref = gated_delta_chunked(**inp)
    o_t, s_t = _run_oracle(torch_chunk, inp, B, T, True)
    assert rel_fro(s_t, p_ref) <= FP32_BAR
    assert rel_fro(o_t, o_ref) <= 2.0 ** -9 + FP32_BAR


def test_oracle_sees_a_real_difference():
    """The comparison is not vacuous: a 1 % change of beta moves the oracle output
    far beyond the bar."""
    B, T, H, HV, K, V = 1, 40, 1, 2, 8, 8
    inp = _dense_inputs(500, B, T, H, HV, K, V)  # realistic gates: the harder case to see
    o_ref, _ = gated_delta_chunked(**inp)
    bumped = dict(inp, beta=inp["beta"] * np.float32(1.01))
    o_t, _ = _run_oracle(torch_chunk, bumped, B, T, True)
    assert rel_fro(o_t, o_ref) > 100 * FP32_BAR


def test_initial_state_matters_with_mild_gates():
    """With the "mild" gates the h0 cases above really test the initial-state path: the
    output with h0 differs from the zero-state output by far more than the bar."""
    B, T, H, HV, K, V, cs = CASES[0]
    inp = _dense_inputs(100 + T, B, T, H, HV, K, V, gates="mild")
    o_h0, _ = gated_delta_chunked(**inp, chunk_size=cs)
    o_zero, _ = gated_delta_chunked(**dict(inp, has_initial_state=np.zeros(B, bool)),
                                    chunk_size=cs)
    assert rel_fro(o_zero, o_h0) > 1e3 * FP32_BAR


# ----------------------------------------------------------------------------- conv update

@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("state_cols", ["W-1", "W"])
def test_conv_update_oracle(W, T, activation, state_cols):
    """short_conv_decode vs transformers' causal_conv1d_update, [B, D, T] layout.

    Our pool keeps the last W-1 inputs (oldest first); transformers' cache keeps W
    columns, of which the update reads the last W-1 -- both layouts are checked.
    Inputs and weights are float64 so the oracle's conv1d runs in float64: bar 1e-10.
    """
    rng = np.random.default_rng(600 + 10 * W + T)
    B, dim = 3, 24
    slots, idx, _ = make_slots(rng, B, slots=B + 2)
    x = rng.standard_normal((B, T, dim))
    weight = rng.uniform(-1, 1, (dim, W)) / np.sqrt(W)
    bias = rng.uniform(-1, 1, dim) / np.sqrt(W)
    pool = rng.standard_normal((slots, dim, W - 1))
    y_ref, pool_ref = short_conv_decode(x, weight, bias, activation=activation,
                                        conv_states=pool, state_indices=idx)

    extra = rng.standard_normal((B, dim, 1)) if state_cols == "W" else np.zeros((B, dim, 0))
    conv_state = torch.from_numpy(np.concatenate([extra, pool[idx]], axis=2))
    y_t = torch_conv_update(torch.from_numpy(x.transpose(0, 2, 1).copy()), conv_state,
                            torch.from_numpy(weight), torch.from_numpy(bias),
                            activation=activation)
    assert rel_fro(y_t.numpy().transpose(0, 2, 1), y_ref) <= 1e-10
    # the oracle updated its state in place: its last W-1 columns are our new slots
    np.testing.assert_allclose(conv_state.numpy()[:, :, -(W - 1):], pool_ref[idx], rtol=0,
                               atol=0)
