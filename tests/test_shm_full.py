"""A full /dev/shm is an error at create time, never a SIGBUS later.

tmpfs files are sparse: sizing a segment with ftruncate succeeds whatever the free space,
and the first store into a page tmpfs cannot supply kills the process with SIGBUS. The
space is reserved when a region (its header, directory and participant table) or a lock
(its body) is created, so a full /dev/shm is OSError(ENOSPC) there, and a failed create
leaves no name behind. Each case runs in a private 1 MiB tmpfs mounted on /dev/shm in a
new mount namespace (`unshare -m`), so nobody else's /dev/shm fills up.
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from support.privshm import requires_private_shm, run_private

pytestmark = [pytest.mark.timeout(60), requires_private_shm]


def run_in_private_shm(code: str, size: str = "1m") -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that sees an empty private tmpfs of ``size`` on
    /dev/shm; its last line of output lists what is left there as the process ends: an
    atexit handler registered before shmlocks is imported runs after shmlocks's own (a
    close() while a joined thread's exit clean-up is still to run leaves the unlink to
    that clean-up or the exit: a listing right after close() raced it)."""
    code = (
        "import atexit, os\n"
        "atexit.register(lambda: print('left', sorted(os.listdir('/dev/shm')), flush=True))\n"
        + textwrap.dedent(code)
    )
    return run_private(code, size=size, timeout=50, env={"PYTHONFAULTHANDLER": "1"})


def check(proc: subprocess.CompletedProcess[str], *expect: str) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode} (-7 is SIGBUS): {proc.stderr[-800:]}"
    lines = proc.stdout.split("\n")
    for line in expect:
        assert line in lines, proc.stdout


def test_region_larger_than_the_tmpfs():
    """A region's file is sized for its cap and sparse (docs/design.md §2): one capped at
    4096 participants fits a 1 MiB tmpfs as long as few use it; its first 32 participants
    are provisioned at creation, so one that cannot have them is ENOSPC there."""
    proc = run_in_private_shm(
        """
        import errno, shmlocks
        r = shmlocks.Region.create("full-a", max_locks=1, max_participants=4096)
        print("created", r.max_participants, r._provisioned)
        r.close()
        with open("/dev/shm/filler", "wb") as f:   # 12 KiB left: 32 participants need 16
            f.write(b"x" * (1024 * 1024 - 12 * 1024))
        try:
            shmlocks.Region.create("full-a2", max_locks=1)
        except OSError as e:
            print("ENOSPC" if e.errno == errno.ENOSPC else f"errno {e.errno}")
        import os; os.unlink("/dev/shm/filler")
        """
    )
    check(proc, "created 4096 32", "ENOSPC", "left []")


def test_growth_in_a_full_tmpfs():
    """Participants past the first 32 are provisioned when they come: a growth that the
    tmpfs cannot supply is OSError(ENOSPC) naming the region, for the registration that
    needed it, and nothing of it is published: the participants and locks already there
    go on working, and so does the growth once there is space."""
    proc = run_in_private_shm(
        """
        import errno, os, threading, shmlocks
        r = shmlocks.Region.create("full-g", max_locks=2)
        locks = [r.create_lock("a", "clh"), r.create_lock("b", "ticket")]
        for lk in locks:                          # this thread: a slot of the first 32
            with lk:
                pass
        v = os.statvfs("/dev/shm")
        with open("/dev/shm/filler", "wb") as f:  # 8 KiB left: growing needs 32 KiB
            f.write(b"x" * (v.f_bavail * v.f_frsize - 8 * 1024))
        stop, errors, held = threading.Event(), [], []
        def member():
            try:
                for lk in locks:
                    with lk:
                        pass
                held.append(1)
            except OSError as e:
                errors.append(e)
            stop.wait(30)
        ts = []
        for i in range(70):
            t = threading.Thread(target=member)
            t.start()
            ts.append(t)
            while len(held) + len(errors) < i + 1:
                pass
        e = errors[0]
        print("ENOSPC" if e.errno == errno.ENOSPC else f"errno {e.errno}")
        print("names region", "full-g" in str(e))
        print("held", len(held), "provisioned", r._provisioned)
        for lk in locks:                          # those registered go on working
            with lk:
                pass
        os.unlink("/dev/shm/filler")
        t = threading.Thread(target=member)       # and the growth once there is space
        t.start(); ts.append(t)
        while len(held) + len(errors) < 71:
            pass
        print("then", len(held), r._provisioned)
        stop.set()
        for t in ts:
            t.join()
        r.close()
        """
    )
    check(proc, "ENOSPC", "names region True", "held 31 provisioned 32", "then 32 64", "left []")


def test_create_lock_in_a_full_tmpfs():
    proc = run_in_private_shm(
        """
        import errno, shmlocks
        with open("/dev/shm/filler", "wb") as f:
            f.write(b"x" * (1024 * 1024 - 200 * 1024))
        r = shmlocks.Region.create("full-b", max_locks=64, max_participants=64)
        made = 0
        try:
            for i in range(64):
                r.create_lock(f"l{i}", "mcs")
                made += 1
        except OSError as e:
            print("ENOSPC" if e.errno == errno.ENOSPC else f"errno {e.errno}")
        assert 0 < made < 64, made
        assert r.lock_names() == [f"l{i}" for i in range(made)]   # no half-made entry
        lk = r.open_lock("l0")
        with lk:                                 # the locks made before go on working
            pass
        r.close()
        import os; os.unlink("/dev/shm/filler")
        """
    )
    check(proc, "ENOSPC", "left []")


@pytest.mark.parametrize("kind", ["ticket", "mcs", "clh", "futex", "robust", "pi"])
def test_standalone_lock_in_a_full_tmpfs(kind):
    proc = run_in_private_shm(
        f"""
        import errno, shmlocks
        with open("/dev/shm/filler", "wb") as f:
            f.write(b"x" * (1024 * 1024 - 8 * 1024))
        try:
            shmlocks.KINDS[{kind!r}].create("full-c")
        except OSError as e:
            print("ENOSPC" if e.errno == errno.ENOSPC else f"errno {{e.errno}}")
        import os; os.unlink("/dev/shm/filler")
        """
    )
    check(proc, "ENOSPC", "left []")
