"""Fixtures for the simulator tests."""
from __future__ import annotations

import pytest

from nki_ssm.sim.targets import ENV_VAR


@pytest.fixture(autouse=True)
def _default_target(request, monkeypatch):
    """Every simulator test starts on the default target (trn2) and on NKI 0.8.0, the
    package default, unless it is marked ``@pytest.mark.nki_version("0.6.0")`` (the tests of
    registers, ``nl.dynamic_range`` and other forms of an older release) or sets another
    version (the ``nki07`` / ``nki08`` fixtures)."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", raising=False)
    marker = request.node.get_closest_marker("nki_version")
    monkeypatch.setenv("NKI_SSM_NKI_VERSION", marker.args[0] if marker else "0.8.0")
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
