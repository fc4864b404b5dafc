"""SHMLOCKS_LOCKDEP=warn: the LockOrderWarning (and the one a full graph gives) points at
the user's own line, the acquire or ``with`` that showed the inversion, not at its
caller's caller, so that ``python -W error`` tracebacks and warning filters by module
name the right code."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from support import SHM_DIR, uniq

pytestmark = pytest.mark.timeout(60)

SCRIPT = """\
import sys, warnings
import shmlocks
import shmlocks.lockdep as ld
a = shmlocks.TicketLock.open(sys.argv[1])
b = shmlocks.FutexMutex.open(sys.argv[2])
def first():
    with a:
        with b:
            pass
def inverted_with():
    with b:
        with a:  # LINE-WITH
            pass
def inverted_acquire():
    with b:
        a.acquire()  # LINE-ACQUIRE
        a.release()
def full():
    ld.MAX_ORDERS = 0
    c = shmlocks.TicketLock.open(sys.argv[3])
    with c:
        with b:  # LINE-FULL
            pass
first()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    inverted_with()
    ld._validated.clear()  # warned once per chain: forget it, to warn again
    inverted_acquire()
    full()
for x in w:
    print(x.category.__name__, x.filename, x.lineno)
"""


def test_the_warnings_point_at_the_users_line(tmp_path, new_lock):
    a, b, c = new_lock("ticket"), new_lock("futex"), new_lock("ticket")
    script = tmp_path / "user_code.py"
    script.write_text(SCRIPT)
    line = {
        tag: n
        for n, text in enumerate(SCRIPT.splitlines(), 1)
        for tag in ("LINE-WITH", "LINE-ACQUIRE", "LINE-FULL")
        if tag in text
    }
    graph = os.path.join(SHM_DIR, uniq("lockdep-warn"))
    env = dict(os.environ, SHMLOCKS_LOCKDEP="warn", SHMLOCKS_LOCKDEP_GRAPH=graph)
    try:
        r = subprocess.run(
            [sys.executable, str(script), a.name, b.name, c.name],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        if os.path.exists(graph):
            os.unlink(graph)
    assert r.returncode == 0, r.stderr
    got = [ln.split() for ln in r.stdout.splitlines()]
    want = [
        ["LockOrderWarning", str(script), str(line["LINE-WITH"])],
        ["LockOrderWarning", str(script), str(line["LINE-ACQUIRE"])],
        ["RuntimeWarning", str(script), str(line["LINE-FULL"])],
    ]
    assert got == want, textwrap.indent(r.stdout + r.stderr, "  ")
