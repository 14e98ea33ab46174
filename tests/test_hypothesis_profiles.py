"""The Hypothesis profiles of tests/hypothesis_profiles.py: ``ci`` is deterministic, ``fuzz`` scales budgets."""
from __future__ import annotations

import hypothesis_profiles as profiles
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def _probe(max_examples: int):
    """A fresh @given test recording what it draws (not collected: built inside a test)."""
    drawn = []

    @settings(max_examples=max_examples)
    @given(st.integers(-10**9, 10**9), st.lists(st.floats(allow_nan=False), max_size=4))
    def probe(n, xs):
        drawn.append((n, tuple(xs)))

    return probe, drawn


@pytest.mark.skipif(not settings.default.derandomize, reason="checks the default (CI) profile")
def test_ci_profile_is_derandomized_without_database_or_deadline():
    s = settings.default
    assert s.derandomize is True
    assert s.database is None
    assert s.deadline is None
    assert s.max_examples == profiles.CI_MAX_EXAMPLES
    assert profiles.examples_factor() == 1


@pytest.mark.skipif(not settings.default.derandomize, reason="checks the default (CI) profile")
def test_ci_profile_draws_the_same_examples_every_run():
    first, drawn_first = _probe(30)
    first()
    second, drawn_second = _probe(30)
    second()
    assert len(drawn_first) == 30
    assert drawn_first == drawn_second


def test_fuzz_profile_draws_fresh_examples_with_ten_times_the_budget():
    fuzz = settings.get_profile("fuzz")
    assert fuzz.derandomize is False
    assert fuzz.max_examples == profiles.FUZZ_FACTOR * profiles.CI_MAX_EXAMPLES
    assert fuzz.deadline is None


def test_scale_examples_multiplies_a_tests_own_budget():
    probe, drawn = _probe(7)
    profiles.scale_examples(probe, 3)
    probe()
    assert len(drawn) == 21


@pytest.mark.skipif(settings.default.derandomize, reason="checks the fuzz profile")
def test_fuzz_profile_is_loaded_with_its_factor():
    assert profiles.examples_factor() == profiles.FUZZ_FACTOR
    assert settings.default.database is not None
