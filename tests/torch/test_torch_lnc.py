"""NEURON_LOGICAL_NC_CONFIG through the drop-ins: they reach the kernels through the torch ops,
so a bad value is the host API's ValueError naming it, and the caller's states (updated in
place by the decode drop-ins) are as they were."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nki_ssm import backend as nki_backend  # noqa: E402
from nki_ssm.torch import causal_conv1d as cc  # noqa: E402
from nki_ssm.torch import fla  # noqa: E402
from nki_ssm.torch import mamba_ssm as ms  # noqa: E402
from nki_ssm.torch._convert import use_backend  # noqa: E402

MATCH = rf"{nki_backend.LNC_ENV_VAR}: expected 1 or 2, got '0'"


def _calls(gen):
    """(name, call, state updated in place or None) of each drop-in, small shapes."""
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    conv_state, ssm_state = r(3, 8, 3), r(3, 2, 4, 16)
    idx = torch.tensor([2, -1], dtype=torch.int32)
    q, k = torch.nn.functional.normalize(r(2, 3, 2, 16), dim=-1), r(2, 3, 2, 16)
    return [
        ("causal_conv1d_update", lambda: cc.causal_conv1d_update(
            r(2, 8), conv_state, r(8, 4), None, "silu", conv_state_indices=idx), conv_state),
        ("causal_conv1d_fn", lambda: cc.causal_conv1d_fn(r(2, 8, 5), r(8, 4)), None),
        ("selective_state_update", lambda: ms.selective_state_update(
            ssm_state, r(2, 2, 4), r(2, 2, 1).abs().expand(2, 2, 4),
            -r(2, 1, 1).abs().expand(2, 4, 16), r(2, 1, 16), r(2, 1, 16),
            state_batch_indices=idx), ssm_state),
        ("fused_recurrent_gated_delta_rule", lambda: fla.fused_recurrent_gated_delta_rule(
            q, k, r(2, 3, 2, 16), g=-r(2, 3, 2).abs(), beta=r(2, 3, 2).sigmoid()), None),
        ("chunk_gated_delta_rule", lambda: fla.chunk_gated_delta_rule(
            q, k, r(2, 3, 2, 16), -r(2, 3, 2).abs(), r(2, 3, 2).sigmoid()), None),
    ]


@pytest.mark.parametrize("backend", [None, "sim"])
def test_bad_lnc_from_every_drop_in_leaves_the_states(backend, monkeypatch):
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "0")
    for name, call, state in _calls(torch.Generator().manual_seed(0)):
        before = None if state is None else state.clone()
        with use_backend(backend), pytest.raises(ValueError, match=MATCH):
            call()
        if state is not None:
            assert torch.equal(state, before), name
    if backend is None:
        return
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "1")
    with use_backend(backend):
        for name, call, _ in _calls(torch.Generator().manual_seed(0)):
            call()                      # the same calls run once the value is good
