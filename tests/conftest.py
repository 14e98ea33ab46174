"""Shared test fixtures (kept small: each area keeps its helpers in its own tests).

Hypothesis runs under the profiles of tests/hypothesis_profiles.py: ``ci``
(deterministic, the default) or ``fuzz`` (``HYPOTHESIS_PROFILE=fuzz``).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import hypothesis_profiles

hypothesis_profiles.register_and_load()


def pytest_collection_modifyitems(config, items):
    hypothesis_profiles.scale_collected(items)


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's node id: deterministic per test, distinct across tests."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(params=[1, 2], ids=["lnc1", "lnc2"])
def lnc(request, monkeypatch) -> int:
    """Run the test at LNC=1 and at LNC=2: ``NEURON_LOGICAL_NC_CONFIG``, which every
    launcher reads (``nki_ssm.backend.logical_nc_config``), is set for its duration."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(request.param))
    return request.param
