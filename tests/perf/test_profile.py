"""perf.profile runs a kernel in the simulator under the target and times its trace."""
from __future__ import annotations

import os

import numpy as np
import pytest

from nki_ssm import perf


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("nki_ssm.sim.jit")
    from nki_ssm.perf import calibration_kernels

    return calibration_kernels.build()


def test_profile_returns_outputs_and_timing(kernels, monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    x = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
    out, t = perf.profile(kernels["dma_roundtrip"], x, target="trn2")
    np.testing.assert_array_equal(np.asarray(out), x)
    assert t.target == "trn2" and t.dma_transfers == 2 and t.dma_bytes == 2 * x.nbytes
    assert t.binding_engine == "dma"
    # store waits for the load: two fixed latencies plus two transfers
    assert t.time_ns > 2 * perf.get_target("trn2").dma_fixed_ns
    assert "NEURON_PLATFORM_TARGET_OVERRIDE" not in os.environ   # restored


def test_profile_target_changes_timing(kernels):
    x = np.ones((128, 2048), dtype=np.float32)
    _, t2 = perf.profile(kernels["dma_roundtrip"], x, target="trn2")
    _, t3 = perf.profile(kernels["dma_roundtrip"], x, target="trn3")
    _, t1 = perf.profile(kernels["dma_roundtrip"], x, target="trn1")
    assert t1.time_ns > t2.time_ns > t3.time_ns   # 17 / 23 / 33 B/ns per DMA engine


def test_profile_rejects_unknown_target(kernels):
    with pytest.raises(ValueError, match="target must be one of"):
        perf.profile(kernels["dma_roundtrip"], np.ones((4, 4), np.float32), target="trn7")
