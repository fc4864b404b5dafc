"""The pytest plugin (pytest11 entry point), run in pytester subprocesses as a user's
suite would run it."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.timeout(120)


def test_shmlock_fixture_makes_and_removes_locks(pytester):
    pytester.makepyfile(
        """
        import os
        seen = []
        def test_one(shmlock):
            lock = shmlock("clh")
            seen.append(lock.name)
            with lock:
                assert lock.locked()
            assert os.path.exists("/dev/shm/" + lock.name)
        def test_gone():
            assert not os.path.exists("/dev/shm/" + seen[0])
        """
    )
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--shmlocks-check-leaks")
    res.assert_outcomes(passed=2)


def test_check_leaks_fails_a_leaking_session(pytester):
    pytester.makepyfile(
        """
        import shmlocks
        kept = []
        def test_leaks():
            lock = shmlocks.MCSLock.create(persist=True)
            kept.append(lock)
        def test_after():
            pass
        """
    )
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--shmlocks-check-leaks")
    res.assert_outcomes(passed=2)
    assert res.ret != 0
    res.stdout.fnmatch_lines(["*shmlocks: the tests left 1 segment(s)*"])
    line = next(ln for ln in res.stdout.lines if "left 1 segment" in ln)
    os.unlink("/dev/shm/" + line.rsplit(": ", 1)[1].strip())  # what the leaking suite left


def test_check_leaks_under_xdist(pytester):
    pytester.makepyfile(
        """
        def test_a(shmlock):
            shmlock("ticket").acquire(timeout=1)
        def test_b(shmlock):
            shmlock("futex")
        """
    )
    res = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--shmlocks-check-leaks"
    )
    res.assert_outcomes(passed=2)
    assert res.ret == 0


def test_lockdep_option_validates_lock_order(pytester, monkeypatch):
    graph = f"/dev/shm/shmlt-plugin-lockdep-{os.getpid()}"
    monkeypatch.setenv("SHMLOCKS_LOCKDEP_GRAPH", graph)
    pytester.makepyfile(
        """
        import os, subprocess, sys, pytest, shmlocks
        def test_inverted(shmlock):
            a, b = shmlock("futex"), shmlock("ticket")
            with a:
                with b:
                    pass
            code = ("import shmlocks, sys; a = shmlocks.FutexMutex.open(sys.argv[1]); "
                    "b = shmlocks.TicketLock.open(sys.argv[2])\\n"
                    "with b:\\n"
                    "    try:\\n        a.acquire()\\n"
                    "    except shmlocks.LockOrderError:\\n        sys.exit(7)\\n")
            r = subprocess.run([sys.executable, "-c", code, a.name, b.name])
            assert r.returncode == 7, "a process the tests start validates too"
            with b:
                with pytest.raises(shmlocks.LockOrderError):
                    a.acquire()
        """
    )
    try:
        res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--shmlocks-lockdep")
        res.assert_outcomes(passed=1)
    finally:
        if os.path.exists(graph):
            os.unlink(graph)
