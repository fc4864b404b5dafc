"""close() of a toolbox object (or its Region) while, or before, the process uses it
(docs/design.md §2 "Closing under other threads", §12).

- A Condition opened by name and closed answers every later call with ValueError, never
  by reading its unmapped body (its lock's name is read from there).

Each case runs in a child interpreter: a SIGSEGV is its exit status, not a dead test run.
"""

from __future__ import annotations

import pytest
from support.common import run_python, shm_remove, uniq

pytestmark = pytest.mark.timeout(120)

CONDITION_CLOSED = r"""
import faulthandler, sys
faulthandler.enable()
import shmlocks

name = sys.argv[1]
lock = shmlocks.FutexMutex()
c = shmlocks.Condition(lock, name)
calls = {
    "acquire(False)": lambda o: o.acquire(False),
    "acquire()": lambda o: o.acquire(),
    "with": lambda o: o.__enter__(),
    "release()": lambda o: o.release(),
    "wait(0)": lambda o: o.wait(0),
    "notify()": lambda o: o.notify(),
    "notify_all()": lambda o: o.notify_all(),
    "lock": lambda o: o.lock,
}
for label, f in calls.items():
    c2 = shmlocks.Condition.open(name)
    c2.close()
    try:
        f(c2)
        print(label, "returned")
    except ValueError:
        print(label, "ValueError")
# the creator's own object, closed with its lock given: the same
c.close()
try:
    c.acquire(False)
    print("creator returned")
except ValueError:
    print("creator ValueError")
assert lock.acquire(False)                    # nobody took the user's lock
lock.release()
lock.close()
print("ok")
"""


def test_calls_on_a_closed_condition_raise_valueerror():
    """A Condition opened by name (its lock opened on first use) and closed: acquire,
    with, release, wait, notify and lock raise ValueError (acquire(False) used to read the
    lock's name from the unmapped body: SIGSEGV)."""
    name = uniq("tbc-cv")
    try:
        p = run_python(CONDITION_CLOSED, name)
    finally:
        shm_remove(name)
    assert p.returncode == 0, (p.returncode, p.stderr[-800:])
    lines = p.stdout.strip().split("\n")
    assert lines[-1] == "ok", p.stdout
    assert all(line.endswith(" ValueError") for line in lines[:-1]), p.stdout
