"""The Hypothesis profiles of the suite (loaded by tests/conftest.py; README, "Testing").

- ``ci`` (the default; what ``make test`` and ``.ci/run`` use): deterministic.
  ``derandomize=True`` seeds each test's example stream from the test itself,
  so every run draws the same examples; no example database is read or
  written (``database=None``); no deadline (the simulator's first call of a
  kernel is slow). Each test keeps the ``max_examples`` its ``@settings``
  gives it (``CI_MAX_EXAMPLES`` otherwise, Hypothesis's own default).
- ``fuzz`` (``HYPOTHESIS_PROFILE=fuzz make test``, or ``pytest
  --hypothesis-profile=fuzz``): fresh random examples on every run,
  ``FUZZ_FACTOR`` times each test's ``max_examples``, failing examples kept
  in the local database ``.hypothesis/`` (gitignored) and printed with a
  reproduction blob. A failure found this way is fixed and then pinned as an
  explicit ``@example(...)`` on the test, so the deterministic profile
  checks it from then on.
"""
from __future__ import annotations

import os

from hypothesis import settings

CI_MAX_EXAMPLES = 100
FUZZ_FACTOR = 10
ENV_VAR = "HYPOTHESIS_PROFILE"


def register_and_load() -> str:
    """Register both profiles and load the one ``$HYPOTHESIS_PROFILE`` names ("ci" if unset).

    Called from tests/conftest.py, before any test module builds its
    ``@settings`` objects: those inherit what they do not set (derandomize,
    database, deadline) from the loaded profile.
    """
    settings.register_profile("ci", max_examples=CI_MAX_EXAMPLES, derandomize=True,
                              database=None, deadline=None, print_blob=False)
    settings.register_profile("fuzz", max_examples=CI_MAX_EXAMPLES * FUZZ_FACTOR,
                              derandomize=False, deadline=None, print_blob=True)
    name = os.environ.get(ENV_VAR, "ci")
    settings.load_profile(name)
    return name


def examples_factor() -> int:
    """How many times each test's own ``max_examples`` the loaded profile asks for."""
    return max(1, settings.default.max_examples // CI_MAX_EXAMPLES)


def scale_examples(test, factor: int) -> None:
    """Multiply the ``max_examples`` of a ``@given`` test by ``factor`` (fuzz profile).

    A test's ``@settings(max_examples=...)`` overrides the profile's budget,
    and Hypothesis has no per-profile multiplier, so the settings object the
    ``@given`` wrapper reads at call time is replaced by a child with the
    scaled budget (tests/test_hypothesis_profiles.py checks that this still
    takes effect with the installed Hypothesis).
    """
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if factor > 1 and current is not None:
        test._hypothesis_internal_use_settings = settings(
            current, max_examples=current.max_examples * factor)


def scale_collected(items) -> None:
    """Apply ``examples_factor()`` to every collected ``@given`` test, once each."""
    factor = examples_factor()
    if factor == 1:
        return
    seen = set()
    for item in items:
        obj = getattr(item, "obj", None)
        test = getattr(obj, "__func__", obj)   # methods: the function underneath
        if getattr(test, "is_hypothesis_test", False) and id(test) not in seen:
            seen.add(id(test))
            scale_examples(test, factor)
