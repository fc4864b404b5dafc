"""Idle cost: what a waiter blocked behind a live holder costs its process (issue 27).

A holder process takes the lock when the probe asks, and lets it go when asked (the
waiter blocked meanwhile then takes it and leaves). In the probe, a forked process (so the
deadlock timeout it sets stays there):

1. wake-ups: a waiter thread blocks in a bounded acquire; its voluntary context switches
   (each a wake-up from a sleep; ``/proc/self/task/<tid>/status``) are read ``settle``
   seconds after its acquire began and again ``seconds`` later: wake-ups per second with
   deadlock detection off (``shmlocks.set_deadlock_timeout(None)``), and for the shmlocks
   kinds with it on (at the default 1.0 s; 0.1 s in a smoke run), over the same length
   of time from the timeout on (the deadlock looks' rate);
2. neighbour: a CPU-bound Python thread counts for ``seconds`` beside a blocked waiter
   thread, then beside none (the order alternates over repeats): its speed with a waiter
   over its speed without, its voluntary context switches in both (giving up the GIL to
   a thread that wants it costs one whenever the GIL is not free again at once), and the
   waiter's wake-ups during the run.

Locks: the six kinds, multiprocessing.Lock and posix_ipc.Semaphore (their waiters sleep
in sem_timedwait until the lock is posted). Not threading.Lock (its holder would be a
thread of the probe) nor fcntl.flock (its bounded acquire needs SIGALRM, which only the
main thread can set up). Every wait is bounded, and both children are killed by PID in a
``finally``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import adapters
from adapters import Adapter
from common import FORK, BenchError, child_setup, children

import shmlocks

LOCKS = (*adapters.KINDS, "multiprocessing.Lock", "posix_ipc.Semaphore")
#: the bound on a waiter's acquire: the holder lets go long before
WAIT_LIMIT_S = 60.0


def vcs(tid: int) -> int:
    """Voluntary context switches of thread ``tid`` of this process so far."""
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise BenchError(f"no voluntary_ctxt_switches for thread {tid}")


def sleep_until(t: float) -> None:
    """Sleep until monotonic time ``t`` (not at all if it has passed)."""
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


class _Holder:
    """The probe's side of the holder process: ``hold()`` makes it take the lock,
    ``release()`` makes it let go (a waiter blocked meanwhile then gets the lock)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def _ask(self, cmd: str) -> None:
        self.conn.send(cmd)
        if not self.conn.poll(10) or self.conn.recv() != cmd:
            raise BenchError(f"idle cost: the holder did not {cmd}")

    def hold(self) -> None:
        self._ask("hold")

    def release(self) -> None:
        self._ask("release")


def _waiter(h: Any, box: dict) -> threading.Thread:
    """A thread blocked in ``h``'s bounded acquire (the lock is held by the holder
    process); box gets t0, and ok when it returns (it releases at once)."""

    def wait() -> None:
        box["t0"] = time.monotonic()
        box["ok"] = h.acquire_timeout(WAIT_LIMIT_S)
        if box["ok"]:
            h.release()

    started = time.monotonic()
    t = threading.Thread(target=wait, daemon=True)
    t.start()
    while "t0" not in box and time.monotonic() < started + 10:
        time.sleep(0.001)
    if "t0" not in box:
        raise BenchError("idle cost: the waiter thread did not start")
    return t


def _end_wait(t: threading.Thread, box: dict, holder: _Holder, waiting: bool) -> None:
    """The holder lets go: the waiter, which must have been waiting until now, gets the
    lock and leaves."""
    holder.release()
    t.join(30)
    if t.is_alive() or not waiting or box.get("ok") is not True:
        raise BenchError(f"idle cost: the waiter's acquire ended early ({box.get('ok')})")


def _wakeups(h: Any, holder: _Holder, start: float, seconds: float) -> dict:
    """A waiter thread's wake-ups from ``start`` to ``start + seconds`` of its wait."""
    box: dict = {}
    holder.hold()
    t = _waiter(h, box)
    sleep_until(box["t0"] + start)
    a = vcs(t.native_id)
    sleep_until(box["t0"] + start + seconds)
    b = vcs(t.native_id)
    _end_wait(t, box, holder, "ok" not in box)
    return {"wakeups": b - a, "seconds": seconds, "per_s": (b - a) / seconds}


def _count(seconds: float, waiter_tid: int | None, out: dict) -> None:
    """The CPU-bound neighbour: count for ``seconds``; its iterations and voluntary
    switches, and the waiter's (if any) over the same time."""
    tid = threading.get_native_id()
    n = 0
    w0 = vcs(waiter_tid) if waiter_tid else 0
    v0 = vcs(tid)
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        for _ in range(2000):
            n += 1
    out["wall_s"] = time.monotonic() - t0
    out["switches"] = vcs(tid) - v0
    out["waiter_wakeups"] = vcs(waiter_tid) - w0 if waiter_tid else None
    out["n"] = n


def _counting_run(h: Any, holder: _Holder, settle: float, seconds: float, waiter: bool) -> dict:
    out: dict = {}
    box: dict = {}
    t = None
    if waiter:
        holder.hold()
        t = _waiter(h, box)
        time.sleep(settle)
    c = threading.Thread(target=_count, args=(seconds, t and t.native_id, out), daemon=True)
    c.start()
    c.join(seconds + 30)
    if c.is_alive() or "n" not in out:
        raise BenchError("idle cost: the counting thread failed")
    if t is not None:
        _end_wait(t, box, holder, "ok" not in box)
    out["per_s"] = out["n"] / out["wall_s"]
    return out


def _probe(
    adapter: Adapter,
    conn: Any,
    holder_conn: Any,
    settle: float,
    seconds: float,
    runs: int,
    dl_timeout: float,
) -> None:
    child_setup()
    try:
        h = adapter.attach()
        holder = _Holder(holder_conn)
        res: dict[str, Any] = {}
        shmlocks.set_deadlock_timeout(None)
        res["off"] = _wakeups(h, holder, settle, seconds)
        if adapter.family == "shmlocks":
            shmlocks.set_deadlock_timeout(dl_timeout)
            res["look"] = _wakeups(h, holder, dl_timeout, seconds)
            shmlocks.set_deadlock_timeout(None)
        withs, withouts = [], []
        for i in range(runs):
            for w in (True, False) if i % 2 == 0 else (False, True):
                run = _counting_run(h, holder, settle, seconds, w)
                (withs if w else withouts).append(run)
        res["with"] = withs
        res["without"] = withouts
        conn.send(("ok", res))
    except BaseException as e:
        conn.send(("err", f"{type(e).__name__}: {e}"))
    finally:
        holder_conn.send("exit")


def _holder(adapter: Adapter, conn: Any) -> None:
    """Takes the lock on "hold", lets it go on "release" (each answered), until "exit"."""
    child_setup()
    h = adapter.attach()
    while (cmd := conn.recv()) != "exit":
        if cmd == "hold":
            h.acquire()
        elif cmd == "release":
            h.release()
        conn.send(cmd)


def measure(
    adapter: Adapter, settle: float, seconds: float, runs: int, dl_timeout: float = 1.0
) -> dict:
    """One probe of one lock: wake-ups/s of a blocked waiter thread (detection off; on,
    from its timeout ``dl_timeout`` on), and ``runs`` counting runs with a waiter and as
    many without."""
    look = dl_timeout + seconds if adapter.family == "shmlocks" else 0.0
    budget = (settle + seconds) + look + 2 * runs * (settle + seconds + 1.0) + 30
    hp, hc = FORK.Pipe()
    r, w = FORK.Pipe(duplex=False)
    holder = FORK.Process(target=_holder, args=(adapter, hc), daemon=True)
    probe = FORK.Process(
        target=_probe, args=(adapter, w, hp, settle, seconds, runs, dl_timeout), daemon=True
    )
    with children([holder, probe]):
        hc.close()
        hp.close()
        w.close()
        if not r.poll(budget):
            raise BenchError(f"idle cost {adapter.name}: no answer in {budget:.0f} s")
        status, res = r.recv()
        probe.join(10)
        holder.join(10)
    r.close()
    if status != "ok":
        raise BenchError(f"idle cost {adapter.name}: {res}")
    withs, withouts = res["with"], res["without"]
    best_with = max(x["per_s"] for x in withs)
    best_without = max(x["per_s"] for x in withouts)
    return {
        "wakeups_per_s": res["off"]["per_s"],
        "wakeups": res["off"]["wakeups"],
        "look_wakeups_per_s": res["look"]["per_s"] if "look" in res else None,
        "seconds": seconds,
        "deadlock_timeout_s": dl_timeout,
        "speed_ratio": best_with / best_without if best_without else None,
        "neighbour_switches_per_s": min(x["switches"] for x in withs) / seconds,
        "alone_switches_per_s": min(x["switches"] for x in withouts) / seconds,
        "waiter_wakeups_per_s": max(x["waiter_wakeups"] for x in withs) / seconds,
        "runs": res,
    }
