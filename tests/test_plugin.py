"""The pytest plugin (pytest11 entry point), run in pytester subprocesses as a user's
suite would run it."""

from __future__ import annotations

import os
import sys

import pytest
from support.privshm import private_argv, private_shm_unavailable

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


PRIVATE_SHM = private_shm_unavailable() is None


def run_inner(pytester, *args):
    """An inner pytest session, in a private tmpfs on /dev/shm when we can (root): the
    leak check compares listings of /dev/shm, which other tests of this suite change as it
    runs; and what a leaking session leaves stays out of everyone else's /dev/shm."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    if PRIVATE_SHM:
        argv = private_argv(argv, size="256m")
    return pytester.run(*argv, timeout=100)


LEAKY = """
    import multiprocessing as mp, subprocess, sys
    import shmlocks

    def _child():
        shmlocks.MCSLock.create(persist=True)

    def test_in_the_test_process():
        shmlocks.FutexMutex.create(persist=True)

    def test_in_a_multiprocessing_child():
        p = mp.get_context("fork").Process(target=_child)
        p.start()
        p.join()
        assert p.exitcode == 0

    def test_in_a_subprocess():
        code = "import shmlocks; shmlocks.TicketLock.create(persist=True)"
        subprocess.run([sys.executable, "-c", code], check=True)
    """


def _leaked(res) -> list[str]:
    """The names the leak check reported, each removed (without a private /dev/shm)."""
    line = next(ln for ln in res.outlines if ln.startswith("shmlocks: the tests left "))
    names = line.rsplit(": ", 1)[1].split(", ")
    if not PRIVATE_SHM:
        for n in names:
            if os.path.exists("/dev/shm/" + n):
                os.unlink("/dev/shm/" + n)
    return names


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_check_leaks_sees_segments_of_children_and_fails_the_session(pytester, workers):
    pytester.makepyfile(LEAKY)
    res = run_inner(pytester, "--shmlocks-check-leaks", *workers)
    names = _leaked(res)
    assert len(names) == 3, res.outlines
    res.assert_outcomes(passed=3)
    assert res.ret == pytest.ExitCode.TESTS_FAILED, "a failing check fails the session"
    res.stdout.fnmatch_lines(
        [
            "*= shmlocks leak check =*",
            "shmlocks: the tests left 3 segment(s) in /dev/shm: *",
            "*: created by pid *, which has exited",
            "*3 passed, 1 shmlocks leak check failed in *",
        ]
    )
    text = "\n".join(res.outlines)
    # the test process itself is still running at the check, unless it was an xdist worker
    assert text.count("which has exited") == (3 if workers else 2), text


def test_check_leaks_passes_a_clean_session_under_xdist(pytester):
    pytester.makepyfile(
        """
        import multiprocessing as mp
        import shmlocks
        def _child(name):
            lock = shmlocks.MCSLock.open(name)
            with lock:
                pass
        def test_a(shmlock):
            shmlock("ticket").acquire(timeout=1)
        def test_b(shmlock):
            lock = shmlock("mcs")
            p = mp.get_context("fork").Process(target=_child, args=(lock.name,))
            p.start()
            p.join()
            assert p.exitcode == 0
        def test_c():
            with shmlocks.Region.create(max_locks=2) as r:
                r.create_lock("x", "clh")
        """
    )
    res = run_inner(pytester, "-n", "2", "--shmlocks-check-leaks")
    res.assert_outcomes(passed=3)
    assert res.ret == 0, res.outlines
    assert not any("shmlocks leak check" in ln for ln in res.outlines)


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
