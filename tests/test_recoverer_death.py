"""A recoverer killed while it releases a dead holder's lock on its behalf.

Found by a CLH kill torture on a loaded machine (issue 16; its debug trace): participant
H died holding the lock; recoverer R released it for H (freed H's node, so that H's
successor could go) and was itself SIGKILLed before adopting H's predecessor's node. The
next recoverer of H's slot saw the node FREE, took it for "not queued" and stopped, so the
slot's next thread kept a node that H's successor adopted too: two participants owning one
node, then two holders at once. MCS had the same gap one step later: a recoverer killed
while passing the lock on for H left a pass that the next recoverer never finished.

Each case here builds that double death exactly: H holds, W waits behind it (stopped with
SIGSTOP so that it cannot recover H itself), H is SIGKILLed, R (a fresh interpreter with
the crash point armed) recovers H and dies at the point, W is continued. Then W and two
new processes must share the lock with exact counts, and exactly one hold sees
owner_died.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest
from support import USERSPACE_KINDS, recovering_sections, uniq, wait_blocked

import shmlocks
from shmlocks._harness import Exclusion, words

#: (kind, crash point a recoverer passes while it releases a dead holder's lock)
CASES = [
    ("clh", "clh.recover.flagged"),
    ("clh", "clh.release.freed"),
    ("mcs", "mcs.recover.flagged"),
    ("mcs", "mcs.release.idled"),
    ("ticket", "ticket.recover.flagged"),
    ("ticket", "ticket.release.served"),
    ("futex", "futex.recover.flagged"),
    *[(k, p) for k in USERSPACE_KINDS for p in ("recover.locked", "recover.done")],
]

N = 3000  # increments per process after the double death


def _hold(lock, ready) -> None:
    lock.acquire()
    ready.set()
    time.sleep(60)


def _counter_proc(lock, ex, who, n, report, role) -> None:
    try:
        report.put((role, "ok", recovering_sections(lock, ex, who, n)))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        report.put((role, f"{type(e).__name__}: {e}", 0))


def _recover_and_die(lock, point: str) -> subprocess.CompletedProcess:
    code = (
        "import shmlocks, sys\n"
        "l = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])\n"
        "l.acquire(timeout=10)\n"
        "print('not reached')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, lock.kind, lock.name],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SHMLOCKS_CRASHPOINT": point},
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("kind", "point"), CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_recoverer_killed_while_releasing_for_a_dead_holder(procs, kind, point):
    lock = shmlocks.KINDS[kind].create(uniq(f"rdeath-{kind}"), max_participants=6)
    ctx = mp.get_context("fork")
    ex = Exclusion(ctx.RawArray("q", words(3)), participants=3)
    report = ctx.Queue()
    ready = ctx.Event()
    try:
        h = procs.start(_hold, lock, ready)
        assert ready.wait(20), "the holder never got the lock"
        w = procs.start(_counter_proc, lock, ex, 1, N, report, "W")
        wait_blocked(w.pid)
        os.kill(w.pid, signal.SIGSTOP)  # W must not recover H itself
        os.kill(h.pid, signal.SIGKILL)
        h.join(10)
        r = _recover_and_die(lock, point)
        assert r.returncode == -signal.SIGKILL, (
            f"the recoverer did not die at {point}: {r.returncode} {r.stdout} {r.stderr}"
        )
        os.kill(w.pid, signal.SIGCONT)
        others = [procs.start(_counter_proc, lock, ex, 2 + i, N, report, "C") for i in range(2)]
        results = sorted(report.get(timeout=60) for _ in range(3))
        for p in (w, *others):
            p.join(30)
        assert [r[:2] for r in results] == [("C", "ok"), ("C", "ok"), ("W", "ok")], results
        assert sum(r[2] for r in results) == 1, f"owner_died must be seen once: {results}"
        books = ex.report()
        assert books.ok and books.total == 3 * N, (
            f"two holders at once after the double death: {books}"
        )
        assert lock.acquire(timeout=5)
        assert not lock.owner_died
        lock.release()
        lock.region._recover_dead()
        parts = lock.region._describe()["participants"]
        assert [p["pid"] for p in parts] == [os.getpid()], f"slots left behind: {parts}"
    finally:
        for p in list(procs._procs):
            if p.is_alive():
                os.kill(p.pid, signal.SIGCONT)
        lock.close()
