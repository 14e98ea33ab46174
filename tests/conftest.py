"""Shared test fixtures (kept small: each area keeps its helpers in its own tests)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's node id: deterministic per test, distinct across tests."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
