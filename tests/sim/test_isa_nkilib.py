"""Fidelity check: AWS's own nki-library kernels, unmodified, on our simulator.

Opt-in: set ``NKI_LIBRARY_SRC`` to the ``src/nkilib_src`` folder of a checkout
of github.com/aws-neuron/nki-library (checked at d2ad3a5). The kernels are
imported from there at run time through ``nki_ssm.sim.install()`` (nothing
of theirs is copied here); inputs and float64 references are ours. Skipped
when the variable is unset, so CI does not depend on the checkout.

Known gaps are marked xfail with the reason (they are simulator or library
issues, not numerics):
- attention_cte: its ``@dataclass`` NKIObject subclasses with un-annotated
  fields are constructed with keyword arguments (NKI generates such an
  __init__; our nl.NKIObject does not), and it places PSUM tiles with
  ``address=`` so that several share a bank, which sim.memory counts as
  separate banks;
- layernorm_tkg: the library passes ``dge_mode=3`` (a raw int), which the
  NKI 0.3.0 migration guide says is rejected; our dma_copy rejects it.
"""
from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np
import pytest

SRC = os.environ.get("NKI_LIBRARY_SRC")
pytestmark = pytest.mark.skipif(not SRC or not os.path.isdir(os.path.join(SRC or "", "nkilib")),
                                reason="set NKI_LIBRARY_SRC to nki-library's src/nkilib_src to run")


@pytest.fixture(scope="module")
def nki():
    import nki_ssm.sim as sim
    if not sim.install():
        pytest.skip("the Neuron SDK is importable; this check is for the simulator")
    sys.path.insert(0, SRC)
    import nki as mod
    yield mod
    # leave no trace for other test modules: drop the nki* registration and nkilib
    sim.uninstall()
    sys.path.remove(SRC)
    for name in [m for m in sys.modules if m == "nkilib" or m.startswith("nkilib.")]:
        del sys.modules[name]


def test_cumsum(nki):
    from nkilib.core.cumsum.cumsum import cumsum
    x = np.random.default_rng(0).standard_normal((200, 3000)).astype(np.float32)
    y = nki.simulate(cumsum)(x)
    np.testing.assert_allclose(y, np.cumsum(x.astype(np.float64), axis=1), rtol=0, atol=1e-3)


@pytest.mark.parametrize("stride,pad,C,dt", [(1, (0, 0), 256, np.float32), (2, (2, 1), 256, np.float32),
                                             (1, (0, 0), 128, ml_dtypes.bfloat16)])
def test_depthwise_conv1d(nki, stride, pad, C, dt):
    from nkilib.experimental.conv.depthwise_conv1d import depthwise_conv1d_implicit_gemm as k
    r = np.random.default_rng(1)
    N, W, S = 1, 300, 4
    img = r.standard_normal((N, C, 1, W)).astype(dt)
    flt = r.standard_normal((C, 1, 1, S)).astype(dt)
    y = nki.simulate(k[2])(img, flt, ((0, 0), pad), (1, stride), (1, 1), (1, 1), C)
    xp = np.pad(img.astype(np.float64), ((0, 0), (0, 0), (0, 0), pad))
    Q = (W + sum(pad) - S) // stride + 1
    w = flt.astype(np.float64)[:, 0, 0, :]
    ref = np.stack([(xp[..., q * stride:q * stride + S] * w[None, :, None, :]).sum(-1) for q in range(Q)], -1)
    tol = 1e-5 if dt == np.float32 else 1e-2
    assert np.abs(y.astype(np.float64) - ref).max() <= tol * np.abs(ref).max()


def test_find_nonzero_indices(nki):
    from nkilib.core.subkernels.find_nonzero_indices import find_nonzero_indices as k
    r = np.random.default_rng(3)
    T, C = 256, 16
    x = (r.random((T, C)) < 0.3) * r.standard_normal((T, C))
    x = x.astype(np.float32)
    out = nki.simulate(k[2])(x)
    idx = out[0] if isinstance(out, tuple) else out
    for c in range(C):
        nz = np.flatnonzero(x[:, c])
        np.testing.assert_array_equal(idx[c, :nz.size], nz)
        assert (idx[c, nz.size:] == -1).all()


def test_cross_entropy_forward(nki):
    import nki.language as nl
    from nkilib.experimental.loss.cross_entropy import cross_entropy_forward as k
    r = np.random.default_rng(4)
    N, V = 64, 4096
    logits = r.standard_normal((N, V)).astype(np.float32)
    tg = r.integers(0, V, N).astype(np.int32)
    out = nki.simulate(k[2])(logits, tg, 32, 4096, nl.float32)
    loss = (out[0] if isinstance(out, tuple) else out).reshape(-1)
    l64 = logits.astype(np.float64)
    m = l64.max(1)
    ref = np.log(np.exp(l64 - m[:, None]).sum(1)) + m - l64[np.arange(N), tg]
    np.testing.assert_allclose(loss, ref, rtol=0, atol=1e-3)


@pytest.mark.xfail(reason="nl.NKIObject lacks NKI's kwargs __init__ for @dataclass subclasses with "
                          "un-annotated fields; PSUM tiles placed with address= are counted separately",
                   strict=False)
def test_attention_cte_causal(nki):
    from nkilib.core.attention.attention_cte import attention_cte
    r = np.random.default_rng(2)
    B, S, d = 2, 1024, 128
    q = r.standard_normal((B, S, d)).astype(ml_dtypes.bfloat16)
    k = r.standard_normal((B, d, S)).astype(ml_dtypes.bfloat16)
    v = r.standard_normal((B, S, d)).astype(ml_dtypes.bfloat16)
    out = nki.simulate(attention_cte[2])(q, k, v, 0.125, True)
    out = out[0] if isinstance(out, tuple) else out
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s = np.einsum("bqd,bdk->bqk", q64, k64) * 0.125
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v64
    assert np.abs(out.astype(np.float64) - ref).max() <= 2e-2 * np.abs(ref).max()


@pytest.mark.xfail(reason="library passes dge_mode=3 (raw int), rejected since NKI 0.3.0 "
                          "(migration guide); nisa.dma_copy raises", strict=True)
def test_layernorm_tkg(nki):
    import nki.language as nl
    from nkilib.core.subkernels.layernorm_tkg import layernorm_tkg
    r = np.random.default_rng(5)
    B, S, H = 2, 4, 1024
    x = r.standard_normal((B, S, H)).astype(np.float32)
    g = r.standard_normal((1, H)).astype(np.float32)
    b = r.standard_normal((1, H)).astype(np.float32)

    @nki.jit
    def k(x, g, b):
        out = nl.ndarray((128, B * S, H // 128), dtype=x.dtype, buffer=nl.shared_hbm)
        layernorm_tkg(x, g, out, b, 1e-6)
        return out

    y = nki.simulate(k)(x, g, b)
    x64 = x.astype(np.float64).reshape(B * S, H)
    ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-6) * g + b
    ref = ref.reshape(B * S, 128, -1).transpose(1, 0, 2)
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()
