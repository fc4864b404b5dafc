"""Kill random participants of the synchronization toolbox's primitives for a while, and
check the counts exactly (docs/design.md §12):

  semaphore  workers hold units with `with`; random SIGKILLs inside the block; never more
             than `units` workers inside at once (seen in snapshots: below), at the end
             every unit is back (0 lost, 0 extra) and the holds never stopped progressing
  condition  a producer notifies one waiting consumer per job; random SIGKILLs of
             consumers (waiting, notified, or holding the lock); every job is taken within
             the deadline (0 swallowed notifications, 0 hangs)
  barrier    parties cycle; once each has waited once (a party the barrier knows), a
             random one is SIGKILLed; every survivor gets BrokenBarrierError within the
             deadline (0 hangs), then it is reset

    python bench/toolbox_torture.py [--seconds S] [--only semaphore|condition|barrier]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import threading
import time

import shmlocks

CTX = mp.get_context("fork")
DEADLINE = 5.0  # a wait that must end (a unit, a job, a break) gets this long


def _kill(p):
    try:
        os.kill(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.join(10)


# ------------------------------------------------------------------------ semaphore


def _snapshot(marks):
    """The workers' marks as they all stood at one instant, or None (they kept changing).
    Each write of a mark is a value never written before (pid, generation), so two
    collects that read the same values saw no write in between: at the instant between
    them every mark held what was read (a double collect). One pass alone is no snapshot:
    a reader preempted mid-pass sees one holder's mark before it leaves and the next
    holder's after it enters, and counts both."""
    a = marks[:]
    for _ in range(100):
        b = marks[:]
        if a == b:
            return b
        a = b
    return None


def _sem_worker(sem, units, holds, marks, seen, i, stop):
    rnd = random.Random(os.getpid())
    me = os.getpid() << 32
    gen = 0
    while not stop.is_set():
        with sem:
            gen += 1
            marks[i] = me | gen << 1 | 1  # inside (odd), cleared before the exit
            holds[i] += 1
            snap = _snapshot(marks)
            if snap is not None:
                n = sum(m & 1 for m in snap)
                seen[2 * i] += 1  # snapshots taken
                if n > units:
                    seen[2 * i + 1] += 1  # over-grants seen
            if rnd.random() < 0.3:
                time.sleep(rnd.random() * 0.002)
            gen += 1
            marks[i] = me | gen << 1


def _stop_clear_kill(p, marks, i, clear):
    """Kill worker i, first forgetting its mark: stopped, it cannot change it again, and
    its unit comes back only after its death, so the snapshots never count it with its
    unit's next holder."""
    try:
        os.kill(p.pid, signal.SIGSTOP)
        os.waitid(os.P_PID, p.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
    except (ProcessLookupError, ChildProcessError):
        pass
    marks[i] = clear  # (negative and even: never a worker's value, never inside)
    _kill(p)


def torture_semaphore(seconds, workers=6, units=3):
    sem = shmlocks.BoundedSemaphore(units)
    stop = shmlocks.Event()
    try:
        return _torture_semaphore(sem, stop, seconds, workers, units)
    finally:  # closed last by us, not left to a killed worker (its name would stay)
        stop.close()
        sem.close()


def _torture_semaphore(sem, stop, seconds, workers, units):
    holds = CTX.RawArray("q", workers)
    marks = CTX.RawArray("q", workers)
    seen = CTX.RawArray("q", 2 * workers)  # per worker: snapshots, over-grants seen

    def start(i):
        p = CTX.Process(target=_sem_worker, args=(sem, units, holds, marks, seen, i, stop))
        p.start()
        return p

    ps = [start(i) for i in range(workers)]
    kills = 0
    end = time.monotonic() + seconds
    rnd = random.Random(1)
    last, last_t = 0, time.monotonic()
    while time.monotonic() < end:
        time.sleep(rnd.random() * 0.05)
        i = rnd.randrange(workers)
        kills += 1
        _stop_clear_kill(ps[i], marks, i, -2 * kills)
        ps[i] = start(i)
        total = sum(holds)
        if total > last:
            last, last_t = total, time.monotonic()
        elif time.monotonic() - last_t > DEADLINE:
            return f"semaphore: no progress for {DEADLINE} s (wedged), value {sem.value}"
    stop.set()
    for p in ps:
        p.join(DEADLINE)
        if p.is_alive():
            _kill(p)
            return "semaphore: a worker hung at the end"
    back = sum(sem.acquire(timeout=DEADLINE) for _ in range(units))
    extra = sem.acquire(False)
    lost = units - back
    snaps, over = sum(seen[0::2]), sum(seen[1::2])
    ok = lost == 0 and not extra and over == 0 and snaps > 0
    return (
        f"semaphore: {kills} kills, {sum(holds)} holds, {over} over-grants in {snaps} "
        f"snapshots, {lost} units lost, {int(extra)} extra: {'ok' if ok else 'FAILED'}"
    )


# ------------------------------------------------------------------------ condition


def _consumer(cond, jobs, taken):
    lock = cond.lock
    while True:
        with cond:
            if lock.owner_died:
                lock.mark_consistent()
            while jobs.value == 0:
                cond.wait()
                if lock.owner_died:
                    lock.mark_consistent()
            jobs.value -= 1
            taken.value += 1


def torture_condition(seconds, consumers=4):
    lock = shmlocks.FutexMutex.create()
    cond = shmlocks.Condition(lock)
    try:
        return _torture_condition(lock, cond, seconds, consumers)
    finally:  # closed last by us, not left to a killed consumer (its name would stay)
        cond.close()
        lock.close()


def _torture_condition(lock, cond, seconds, consumers):
    jobs = CTX.RawValue("q", 0)
    taken = CTX.RawValue("q", 0)
    ps = [CTX.Process(target=_consumer, args=(cond, jobs, taken)) for _ in range(consumers)]
    for p in ps:
        p.start()
    rnd = random.Random(2)
    produced = kills = worst = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with cond:
            if lock.owner_died:
                lock.mark_consistent()
            jobs.value += 1
            produced += 1
            cond.notify()
            if rnd.random() < 0.2:  # kill one, maybe the one just notified
                i = rnd.randrange(consumers)
                _kill(ps[i])
                kills += 1
                ps[i] = CTX.Process(target=_consumer, args=(cond, jobs, taken))
                ps[i].start()
        t0 = time.monotonic()
        while True:  # the job must be taken: a live consumer was notified for it
            with cond:
                if lock.owner_died:
                    lock.mark_consistent()
                if jobs.value == 0:
                    break
            if time.monotonic() - t0 > DEADLINE:
                for p in ps:
                    _kill(p)
                return f"condition: job {produced} not taken in {DEADLINE} s: swallowed (FAILED)"
            time.sleep(0.0005)
        worst = max(worst, time.monotonic() - t0)
    for p in ps:
        _kill(p)
    ok = jobs.value == 0
    return (
        f"condition: {produced} jobs, {kills} kills, 0 swallowed, slowest take "
        f"{worst * 1e3:.1f} ms: {'ok' if ok else 'FAILED'}"
    )


# -------------------------------------------------------------------------- barrier


def _party(bar, out):
    try:
        while True:
            bar.wait()
    except threading.BrokenBarrierError:
        out.put("broken")


def torture_barrier(seconds, parties=4):
    bar = shmlocks.Barrier(parties)
    try:
        return _torture_barrier(bar, seconds, parties)
    finally:  # closed last by us, not left to a killed party (its name would stay)
        bar.close()


def _torture_barrier(bar, seconds, parties):
    out = CTX.Queue()
    rnd = random.Random(3)
    kills = rounds = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        bar.reset()
        c0 = bar._raw()["cycle"]
        ps = [CTX.Process(target=_party, args=(bar, out)) for _ in range(parties)]
        for p in ps:
            p.start()
        # every one a party the barrier knows (it waited once: docs/design.md §12); a
        # process killed before its first wait is unknown to it, and the others would wait
        t0 = time.monotonic()
        while bar._raw()["cycle"] <= c0:
            if time.monotonic() - t0 > DEADLINE:
                return f"barrier: no first cycle in {DEADLINE} s (FAILED)"
            time.sleep(0.001)
        time.sleep(rnd.random() * 0.1)
        victim = ps.pop(rnd.randrange(parties))
        _kill(victim)
        kills += 1
        try:
            got = [out.get(timeout=DEADLINE) for _ in ps]
        except Exception:
            raw = bar._raw()
            parts = bar.region._describe()["participants"]
            for p in ps:
                _kill(p)
            return (
                f"barrier: survivors not broken in {DEADLINE} s after a kill (FAILED): "
                f"{raw} {parts}"
            )
        for p in ps:
            p.join(DEADLINE)
        assert got == ["broken"] * len(ps)
        rounds += bar._raw()["cycle"] - c0
    return f"barrier: {kills} kills, {rounds} cycles before them, 0 hangs: ok"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="per primitive")
    ap.add_argument("--only", choices=["semaphore", "condition", "barrier"])
    args = ap.parse_args(argv)
    fns = {
        "semaphore": torture_semaphore,
        "condition": torture_condition,
        "barrier": torture_barrier,
    }
    failed = False
    for name, fn in fns.items():
        if args.only and name != args.only:
            continue
        line = fn(args.seconds)
        print(line, flush=True)
        failed |= "FAILED" in line or "wedged" in line or "hung" in line
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
