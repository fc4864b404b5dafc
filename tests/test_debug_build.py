"""The assertion build is opt-in (docs/design.md §8): a normal build checks no invariant
and records no trace; only a build made with SHMLOCKS_DEBUG=1 in the environment does."""

import os

import pytest

from shmlocks import _core


@pytest.mark.timeout(30)
def test_debug_says_which_build_this_is():
    expected = bool(os.environ.get("SHMLOCKS_DEBUG"))  # .ci/run's debug step sets it
    assert _core.DEBUG is expected
    if not expected:
        # the trace is part of the assertion build: a normal build has none to open
        assert _core._trace_open(16) is False
