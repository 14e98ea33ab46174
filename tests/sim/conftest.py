"""Fixtures for the simulator tests."""
from __future__ import annotations

import pytest

from nki_ssm.sim.targets import ENV_VAR


@pytest.fixture(autouse=True)
def _default_target(monkeypatch):
    """Every simulator test starts on the default target (trn2) and NKI version (0.6.0)
    unless it sets one."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", raising=False)
    monkeypatch.delenv("NKI_SSM_NKI_VERSION", raising=False)     # NKI 0.6.0 unless set
    monkeypatch.delenv("NKI_PRECISE_FP", raising=False)


@pytest.fixture
def set_target(monkeypatch):
    """set_target("trn3") switches NEURON_PLATFORM_TARGET_OVERRIDE for this test."""
    def _set(name: str) -> None:
        monkeypatch.setenv(ENV_VAR, name)
    return _set
