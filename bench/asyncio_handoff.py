"""asyncio: hand-off round trip and throughput of ``async with lock`` (docs/design.md §14),
beside the sync API and beside what asyncio programs use today across processes:
``asyncio.Lock`` in front of ``run_in_executor(None, multiprocessing.Lock.acquire)``.

    python bench/asyncio_handoff.py [--seconds S] [--kinds a,b] [--tasks T]

- **round trip**: two processes, each an event loop with one task, pass a turn through the
  lock (bench/handoff.py's protocol: {acquire; if the turn is mine, flip it; release});
  the time per turn that comes back is one round trip (two hand-offs). Median and p99.
  So that each turn is a hand-off to a waiter, as the floor's is a wake-up of a sleeper,
  a worker that flips the turn keeps the lock until the other one says it is about to
  wait for it (or has made its turns), and a worker that took the lock when the turn was
  not its own yields before it takes it again (``_not_my_turn``).
- **throughput**: 2 processes x T tasks (T threads for the sync API) loop
  {acquire; counter += 1; release} for S seconds: sections/s, and the counter must equal
  the sections counted (the exclusion held).

"sync" is the same protocol with ``with lock:`` in plain threads (one per task).
**floor** (issue 37: an async hand-off costs at least one wake-up of a loop asleep in
epoll) is the same round trip with no lock: the two loops pass the turn through a shared
futex word, each asleep on it in an io_uring FUTEX_WAITV of its thread's ring whose
eventfd the loop watches (what a cohort's wait is), woken by the other's FUTEX_WAKE: two
such wake-ups per round trip, measured in the same run; "x floor" is each round trip over
it (with io_uring only: AIO_MODE "thread" adds its waiter thread's hop). "waited/turn":
the round trip's holds that had to wait (the lock's statistics, ``contended``) per turn
passed: near 1, each turn was a hand-off to a waiting loop (or thread), as meant; below
1, some turns were taken free (the other worker's release raced its announced wait).
"mp+executor" serializes the tasks of a process with an asyncio.Lock and waits for a
multiprocessing.Lock in the loop's default executor (one thread blocked at a time per
process).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import threading
import time
from typing import Any

import shmlocks

CTX = mp.get_context("fork")


class MpExecutorLock:
    """What an asyncio program does today: asyncio.Lock + run_in_executor(mp.Lock)."""

    def __init__(self) -> None:
        self.mp = CTX.Lock()
        self.local: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        if self.local is None:
            self.local = asyncio.Lock()
        await self.local.acquire()
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.mp.acquire)
        except BaseException:
            self.local.release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.mp.release()
        assert self.local is not None
        self.local.release()

    def __enter__(self) -> None:
        self.mp.acquire()

    def __exit__(self, *exc: object) -> None:
        self.mp.release()

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- round trip


TURN, WANT, DONE = 0, 1, 3  # the shared words: the turn; WANT + w: worker w is about to
# wait for the lock; DONE + w: worker w made its turns


def _hand_off(shared: Any, me: int) -> None:
    """The worker that flipped the turn keeps the lock until the other one is about to
    wait for it (or has made its turns): its release is then a hand-off to a waiter (the
    waiter asleep in its loop, or its thread), what the round trip measures; without
    this the other one may be elsewhere, and take the lock free later."""
    other = 1 - me
    while not shared[WANT + other] and not shared[DONE + other]:
        os.sched_yield()


async def _not_my_turn() -> None:
    """A worker that took the lock when the turn was not its own lets the other one go on.
    An acquire_async of a free lock completes without yielding, so without this a loop
    woken by the other's release (on the same CPU, it preempts the releaser inside its
    FUTEX_WAKE) would take and release the free lock alone until a scheduler tick gives
    the CPU back (4 ms at 250 Hz): the median would count ticks, not hand-offs. The
    loop runs its callbacks (asyncio.sleep(0)) and the CPU goes to the other worker if it
    is runnable here (sched_yield), as a task with nothing to do would await something."""
    os.sched_yield()
    await asyncio.sleep(0)


def _turns_async(lock: Any, me: int, shared: Any, n: int, out: Any) -> None:
    async def main() -> None:
        stamps = []
        flips = 0
        while flips < n:
            shared[WANT + me] = 1
            async with lock:
                shared[WANT + me] = 0
                mine = shared[TURN] == me
                if mine:
                    shared[TURN] = 1 - me
                    flips += 1
                    if me == 0:
                        stamps.append(time.perf_counter_ns())
                    _hand_off(shared, me)
            if not mine:
                await _not_my_turn()
        shared[DONE + me] = 1
        if me == 0:
            out.put([b - a for a, b in zip(stamps, stamps[1:], strict=False)])

    asyncio.run(main())


def _turns_floor(_lock: Any, me: int, shared: Any, n: int, out: Any) -> None:
    import ctypes

    from shmlocks import _core

    libc = ctypes.CDLL(None, use_errno=True)
    addr = ctypes.addressof(shared)
    word = ctypes.c_uint32.from_address(addr)  # the turn: even is 0's, odd is 1's

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ring = _core._Ring(8)
        waiting: list[asyncio.Future[None]] = []

        drain = getattr(ring, "drain", None)

        def ready() -> None:
            if drain is not None:
                drain()
            else:  # (a build before the cohorts: reset the eventfd, then reap)
                try:
                    os.read(ring.fileno(), 8)
                except BlockingIOError:
                    pass
                ring.completions(0)
            while waiting:
                f = waiting.pop()
                if not f.done():
                    f.set_result(None)

        loop.add_reader(ring.fileno(), ready)
        stamps = []
        flips = ud = 0
        while flips < n:
            v = word.value
            if v % 2 == me:
                word.value = v + 1
                libc.syscall(202, ctypes.c_void_p(addr), 1, 1)  # SYS_futex, FUTEX_WAKE
                flips += 1
                if me == 0:
                    stamps.append(time.perf_counter_ns())
                continue
            ud += 1
            f = loop.create_future()
            waiting.append(f)
            ring.waitv([(addr, v)], ud)
            await f
        loop.remove_reader(ring.fileno())
        ring.close()
        if me == 0:
            out.put([b - a for a, b in zip(stamps, stamps[1:], strict=False)])

    asyncio.run(main())


def _turns_sync(lock: Any, me: int, shared: Any, n: int, out: Any) -> None:
    stamps = []
    flips = 0
    while flips < n:
        shared[WANT + me] = 1
        with lock:
            shared[WANT + me] = 0
            mine = shared[TURN] == me
            if mine:
                shared[TURN] = 1 - me
                flips += 1
                if me == 0:
                    stamps.append(time.perf_counter_ns())
                _hand_off(shared, me)
        if not mine:
            os.sched_yield()  # (as _not_my_turn: the other worker may be on this CPU)
    shared[DONE + me] = 1
    if me == 0:
        out.put([b - a for a, b in zip(stamps, stamps[1:], strict=False)])


def round_trip(lock: Any, body: Any, n: int) -> tuple[float, float]:
    shared = CTX.Array("i", [0] * 5, lock=False)  # TURN, WANT x 2, DONE x 2
    out = CTX.Queue()
    ps = [CTX.Process(target=body, args=(lock, me, shared, n, out)) for me in (0, 1)]
    for p in ps:
        p.start()
    gaps = sorted(out.get(timeout=120))
    for p in ps:
        p.join(60)
    return statistics.median(gaps) / 1e3, gaps[int(len(gaps) * 0.99)] / 1e3


# --------------------------------------------------------------------------- throughput


def _count_async(lock: Any, shared: Any, tasks: int, seconds: float, out: Any) -> None:
    async def main() -> int:
        end = time.monotonic() + seconds
        done = 0

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < end:
                async with lock:
                    shared[0] += 1
                done += 1

        await asyncio.gather(*(worker() for _ in range(tasks)))
        return done

    out.put(asyncio.run(main()))


def _count_sync(lock: Any, shared: Any, tasks: int, seconds: float, out: Any) -> None:
    end = time.monotonic() + seconds
    counts = [0] * tasks

    def worker(i: int) -> None:
        while time.monotonic() < end:
            with lock:
                shared[0] += 1
            counts[i] += 1

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(tasks)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put(sum(counts))


def throughput(lock: Any, body: Any, tasks: int, seconds: float) -> float:
    shared = CTX.Array("q", [0], lock=False)
    out = CTX.Queue()
    ps = [CTX.Process(target=body, args=(lock, shared, tasks, seconds, out)) for _ in range(2)]
    for p in ps:
        p.start()
    total = sum(out.get(timeout=120) for _ in ps)
    for p in ps:
        p.join(60)
    if total != shared[0]:
        raise SystemExit(f"exclusion failed: {shared[0]} increments, {total} sections")
    return total / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--kinds", default=",".join(shmlocks.KINDS))
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--turns", type=int, default=2000)
    a = ap.parse_args()
    print(
        f"round trip: {a.turns} turns; throughput: 2 processes x {a.tasks} tasks, {a.seconds:g} s"
    )
    floor = None
    if _uring():
        floor, fp99 = round_trip(None, _turns_floor, a.turns)
        print(
            f"floor (two loop wake-ups, io_uring + eventfd): {floor:.1f} µs median, p99 {fp99:.1f}"
        )
    print(f"AIO_MODE {shmlocks._core.AIO_MODE}")
    print("| lock | API | round trip median | x floor | p99 | waited/turn | sections/s |")
    print("|---|---|---|---|---|---|---|")
    rows: list[tuple[str, Any, list[tuple[str, Any, Any]]]] = []
    for kind in a.kinds.split(","):
        rows.append(
            (
                kind,
                lambda k=kind: shmlocks.KINDS[k].create(max_participants=64),
                [
                    ("async with", _turns_async, _count_async),
                    ("with (threads)", _turns_sync, _count_sync),
                ],
            )
        )
    rows.append(
        (
            "multiprocessing.Lock",
            MpExecutorLock,
            [
                ("asyncio.Lock + run_in_executor", _turns_async, _count_async),
                ("with (threads)", _turns_sync, _count_sync),
            ],
        )
    )
    for name, make, apis in rows:
        for api, turns, count in apis:
            lock = make()
            try:
                if hasattr(lock, "reset_stats"):
                    lock.reset_stats()
                med, p99 = round_trip(lock, turns, a.turns)
                waited = "-"
                if hasattr(lock, "stats"):  # the holds that waited, per turn passed
                    waited = f"{lock.stats()['contended'] / (2 * a.turns):.2f}"
                tput = throughput(lock, count, a.tasks, a.seconds)
            finally:
                lock.close()
            x = f"{med / floor:.2f}" if floor and api == "async with" else "-"
            print(
                f"| {name} | {api} | {med:.1f} µs | {x} | {p99:.1f} µs | {waited} | {tput:,.0f} |",
                flush=True,
            )


def _uring() -> bool:
    try:
        from shmlocks import _core

        _core._Ring(8).close()
        return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
