"""The test suite's harness: what tests import (tests/conftest.py holds only fixtures).

- common: segment names and /dev/shm clean-up, child processes killed by PID, a holder
  child, small probes;
- exclusion: the exclusion checker (shmlocks/_harness.py) run by N processes x M
  acquisitions, the abort stress, and the broken locks it must catch;
- crashcase: the crash-point ``Case`` (a child dies at a named protocol step among survivors).
"""

from support.common import *  # noqa: F403
from support.common import __all__ as _common_all
from support.exclusion import *  # noqa: F403
from support.exclusion import __all__ as _exclusion_all

__all__ = [*_common_all, *_exclusion_all]
