"""Real wait-for cycles for the deadlock tests (tests/test_deadlock_detect.py,
tests/test_chain_walk.py): member i, a thread or a process, holds ``locks[i]`` and then
waits for the next member's lock; what each saw comes back as
``{i: (outcome, seconds waited, message, still held its first lock)}``."""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from typing import Any

import shmlocks

__all__ = ["Never", "member", "one_victim", "run_cycle"]


class Never:
    """A 'second lock' that is never contended: the member waits 1.8 s for nothing (the
    end of an open chain, a holder that waits for no lock)."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        time.sleep(1.8)
        return True

    def release(self) -> None:
        pass


def member(i, first, second, ready, go, out, delay, dl_timeout):
    """Hold `first`, then (after `delay`) wait for `second` (20 s at most); report how it
    ended. dl_timeout "default" leaves the process's deadlock timeout as it is."""
    if dl_timeout != "default":
        shmlocks.set_deadlock_timeout(dl_timeout)
    first.acquire()
    ready.set()
    go.wait(30)
    if delay:
        time.sleep(delay)
    t0 = time.monotonic()
    try:
        got = second.acquire(timeout=20)
    except shmlocks.DeadlockError as e:
        out.put((i, "deadlock", time.monotonic() - t0, str(e), first.locked()))
        time.sleep(0.3)  # the others are still blocked: keep `first` a little
        first.release()
        return
    out.put((i, "got" if got else "timeout", time.monotonic() - t0, "", True))
    if got:
        second.release()
    first.release()


def run_cycle(
    locks: list[Any],
    *,
    threads: bool = False,
    delays: list[float] | None = None,
    dl_timeout: Any = "default",
    close: bool = True,
    seconds: list[Any] | None = None,
    targets: list[Any] | None = None,
) -> dict[int, tuple[str, float, str, bool]]:
    """Member i holds locks[i] and, after delays[i], waits for locks[i + 1] (the last for
    locks[0] if ``close``, else for nothing: ``Never``), or for seconds[i] if given (None
    there: Never). Members are processes (fork), or threads of this process.
    ``dl_timeout``: the deadlock timeout the members set ("default": none set; None:
    detection off), one for all or a list, one per member. ``targets``: what member i runs
    (``member`` by default; another with its arguments and reports, e.g. an asyncio
    task's)."""
    n = len(locks)
    delays = delays or [0.0] * n
    dls = dl_timeout if isinstance(dl_timeout, list) else [dl_timeout] * n
    if threads:
        ev, out, mk = threading.Event, queue.Queue(), threading.Thread
    else:
        ctx = mp.get_context("fork")
        ev, out, mk = ctx.Event, ctx.Queue(), ctx.Process
    go = ev()
    readies = [ev() for _ in range(n)]
    workers = []
    saved = shmlocks.get_deadlock_timeout()
    try:
        for i in range(n):
            if seconds is not None:
                second = seconds[i] if seconds[i] is not None else Never()
            else:
                second = locks[(i + 1) % n] if (close or i + 1 < n) else Never()
            w = mk(
                target=targets[i] if targets else member,
                args=(i, locks[i], second, readies[i], go, out, delays[i], dls[i]),
                daemon=True,
            )
            w.start()
            workers.append(w)
        for r in readies:
            assert r.wait(20), "a member never took its first lock"
        go.set()
        res = {}
        for _ in range(n):
            i, what, took, msg, held = out.get(timeout=60)
            res[i] = (what, took, msg, held)
        for w in workers:
            w.join(20)
            assert not w.is_alive()
            assert threads or w.exitcode == 0, w.exitcode
        return res
    finally:
        shmlocks.set_deadlock_timeout(saved)  # threads set it for this process
        for w in workers:
            if isinstance(w, mp.process.BaseProcess) and w.is_alive():
                w.kill()
                w.join(10)


def one_victim(res: dict[int, tuple[str, float, str, bool]], within: float | None = None) -> int:
    """The one member that got DeadlockError (within `within` seconds of beginning to
    wait, if given), which kept the locks it held, while every other got its lock."""
    victims = [i for i, r in res.items() if r[0] == "deadlock"]
    assert len(victims) == 1, res
    v = victims[0]
    if within is not None:
        assert res[v][1] < within, res[v]
    assert res[v][3], "the victim keeps the locks it holds"
    assert all(r[0] == "got" for i, r in res.items() if i != v), res
    return v
