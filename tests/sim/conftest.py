"""Fixtures for the simulator tests."""
from __future__ import annotations

import pytest

from nki_ssm.sim.targets import ENV_VAR


@pytest.fixture(autouse=True)
def _default_target(monkeypatch):
    """Every simulator test starts on the default target (trn2) and on NKI 0.6.0, the release
    the register-era tests were written against, unless it sets another (the tests of the
    NKI 0.7 / 0.8 rules use the ``nki08`` / ``nki07`` fixtures)."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", raising=False)
    monkeypatch.setenv("NKI_SSM_NKI_VERSION", "0.6.0")
    monkeypatch.delenv("NKI_PRECISE_FP", raising=False)


@pytest.fixture
def set_target(monkeypatch):
    """set_target("trn3") switches NEURON_PLATFORM_TARGET_OVERRIDE for this test."""
    def _set(name: str) -> None:
        monkeypatch.setenv(ENV_VAR, name)
    return _set


@pytest.fixture
def nki08(monkeypatch):
    """Target NKI 0.8.0 (Neuron SDK 2.34.0), the package default."""
    monkeypatch.setenv("NKI_SSM_NKI_VERSION", "0.8.0")


@pytest.fixture
def nki07(monkeypatch):
    """Target NKI 0.7.0 (Neuron SDK 2.33.0)."""
    monkeypatch.setenv("NKI_SSM_NKI_VERSION", "0.7.0")
