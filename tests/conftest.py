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
