"""``python -m shmlocks demo``: workers under every lock kind, a SIGKILLed holder recovered, a
hand-off table beside ``multiprocessing.Lock``.

The worker functions live at module level so that ``spawn`` and ``forkserver`` children can
import them; the locks reach the children by pickling (by name). :func:`run` is the whole
demo; the command line (shmlocks/cli/demo.py) only parses its arguments.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import shmlocks
from shmlocks._harness import Exclusion, words
from shmlocks._table import table


class DemoError(Exception):
    """The demo cannot go on (a worker failed or hung); the command line prints it."""


def _worker_setup() -> None:
    # The parent handles Ctrl-C and kills its workers; a worker just goes quietly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _count_worker(
    lock: Any, ex: Exclusion, iterations: int, barrier: Any, times: Any, index: int
) -> None:
    """``iterations`` sections of the exclusion checker (shmlocks/_harness.py): a non-atomic
    increment of the shared counter, exact only if the lock excludes."""
    _worker_setup()
    barrier.wait(30)
    t0 = time.monotonic()
    ex.loop(lock.acquire, lock.release, index + 1, iterations=iterations)
    times[2 * index] = t0
    times[2 * index + 1] = time.monotonic()


def _die_holding(lock: Any, data: Any, held: Any) -> None:
    """Take the lock, break the invariant a + b == 0 halfway, and wait to be SIGKILLed."""
    _worker_setup()
    lock.acquire()
    data[0] += 1  # a += 1 ... and b -= 1 never happens
    held.set()
    time.sleep(30)  # the parent kills us long before this ends


def _pingpong_worker(
    lock: Any, shared: Any, clock: Any, me: int, duration: float, barrier: Any, result: Any
) -> None:
    """Take turns with the other worker through `lock`: bench/handoff.py's protocol.

    shared = [whose turn, stop flag]; clock = [when the turn was last passed]. Each worker
    loops {acquire; if the turn is mine: pass it; release}. The turn word is only touched
    under the lock, so every turn is a hand-off (README.md, "Hand-off"): the lock passing
    from one process to the other, which waits for it in acquire() (it retries at once when
    it finds the turn is not its own). Records the round trip (from one of my turns to my
    next: two hand-offs) and the hand-off time (from the other's release() that passed me
    the turn to my acquire() returning; CLOCK_MONOTONIC is system-wide).
    """
    _worker_setup()
    stamps: list[float] = []
    handoffs: list[float] = []
    barrier.wait(30)
    now = time.monotonic
    end = now() + duration
    hard_end = end + 10  # if the other side is gone, never wait for it longer than this
    tries = 0
    while not shared[1]:
        lock.acquire()
        t = now()
        if shared[0] != me:
            lock.release()
            tries += 1
            if not tries & 0x3FF and now() > hard_end:
                shared[1] = 1
            continue
        if clock[0]:
            handoffs.append(t - clock[0])
        stamps.append(t)
        shared[0] = 1 - me
        clock[0] = now()
        lock.release()
        if t > end:
            shared[1] = 1  # tell the other side to stop too
    trips = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    nan = float("nan")
    result[3 * me] = statistics.median(trips) if trips else nan
    result[3 * me + 1] = len(trips)
    result[3 * me + 2] = statistics.median(handoffs) if handoffs else nan


# --------------------------------------------------------------------------------------------
# demo: the parent


class _Demo:
    def __init__(
        self, ctx: Any, workers: int, iterations: int, handoff: float, out: TextIO
    ) -> None:
        self.out = out  # the tables for people (stderr under --json)
        self.results: dict[str, Any] = {"counting": [], "owner_death": [], "handoff": []}
        self.ctx = ctx
        self.workers = workers
        self.iterations = iterations
        self.handoff = handoff
        self.locks: list[Any] = []
        self.procs: list[Any] = []
        self.ok = True

    def say(self, *args: Any, **kwargs: Any) -> None:
        print(*args, file=self.out, **kwargs)

    # -- bookkeeping: every segment and child made here is undone in cleanup()

    def new_lock(self, cls: Any) -> Any:
        lock = cls.create()
        self.locks.append(lock)
        return lock

    def start(self, target: Callable[..., None], *args: Any) -> Any:
        p = self.ctx.Process(target=target, args=args, daemon=True)
        with _children_ignore_sigint():
            p.start()
        self.procs.append(p)
        return p

    def reap(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        stuck = [p for p in self.procs if p.is_alive()]
        for p in stuck:
            p.kill()
            p.join(5)
        failed = [p.exitcode for p in self.procs if p not in stuck and p.exitcode != 0]
        self.procs.clear()
        if stuck:
            raise DemoError(
                f"{len(stuck)} worker(s) did not finish within {timeout:.0f} s and were killed"
            )
        if failed:
            raise DemoError(
                f"{len(failed)} worker(s) failed (exit codes {failed}); see their output above"
            )

    def cleanup(self) -> list[str]:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(5)
        self.procs.clear()
        left: list[str] = []
        for lock in self.locks:
            name = str(lock.name).lstrip("/")
            with contextlib.suppress(Exception):
                lock.close()  # the last user's close() unlinks the name
            path = Path(shmlocks._core.SHM_DIR) / name
            if path.exists():
                try:
                    import posix_ipc  # type: ignore[import-not-found, unused-ignore]

                    posix_ipc.unlink_shared_memory("/" + name)
                except Exception:
                    left.append(name)
        self.locks.clear()
        return left

    # -- part 1

    def counting(self) -> None:
        n, it = self.workers, self.iterations
        expected = n * it
        self.say(
            f"1. Counting: {n} processes x {it:,} increments of one shared counter, under each lock"
        )
        row = "   {:<22}{:>10}  {:<7}{:>8}{:>15}{:>11}"
        self.say(row.format("lock", "total", "", "time", "per increment", "hand-offs"), flush=True)
        for label, make in self._entries():
            lock = make()
            ex = Exclusion(self.ctx.RawArray("q", words(n)), participants=n)
            times = self.ctx.RawArray("d", 2 * n)
            barrier = self.ctx.Barrier(n)
            for i in range(n):
                self.start(_count_worker, lock, ex, it, barrier, times, i)
            self.reap(timeout=60)
            elapsed = max(times[1::2]) - min(times[0::2])
            books = ex.report(expected)
            total = books.total
            self.ok &= books.ok
            if books.ok:
                verdict = "exact"
            elif books.violations:
                verdict = f"WRONG, {books.violations:,} overlapping sections"
            else:
                verdict = f"WRONG, expected {expected:,}"
            self.results["counting"].append(
                {
                    "lock": label,
                    "total": total,
                    "expected": expected,
                    "exact": books.ok,
                    "overlaps": books.violations,
                    "seconds": elapsed,
                    "handoffs": books.handoffs - 1,
                }
            )
            self.say(
                row.format(
                    label,
                    f"{total:,}",
                    verdict,
                    f"{elapsed:.2f} s",
                    f"{elapsed / expected * 1e6:.2f} µs",
                    f"{books.handoffs - 1:,}",
                ),
                flush=True,
            )
        self.say(
            "   (hand-offs: how often the lock passed to another process. FIFO locks take turns, so\n"
            "   with more processes than CPUs a turn may wait for a descheduled process; barging\n"
            "   locks let the running process keep the lock.)"
        )
        self.say()

    def _entries(self) -> list[tuple[str, Callable[[], Any]]]:
        """Each lock kind (a fresh standalone lock), then multiprocessing.Lock as the reference."""
        entries: list[tuple[str, Callable[[], Any]]] = [
            (kind, functools.partial(self.new_lock, cls)) for kind, cls in shmlocks.KINDS.items()
        ]
        entries.append(("multiprocessing.Lock", self.ctx.Lock))
        return entries

    # -- part 2

    def owner_death(self) -> None:
        self.say(
            "2. Owner death: a holder is SIGKILLed inside its critical section (invariant a + b == 0)"
        )
        self.say(
            "   Each holder took the lock, did a += 1 (not yet b -= 1) and was killed with SIGKILL.\n"
            "   The next acquire(timeout=5) sees owner_died, repairs (b = -a), calls\n"
            "   mark_consistent() and releases; the hold after that is clean."
        )
        rows = [self._kill_and_recover(cls) for cls in shmlocks.KINDS.values()]
        self.say(
            table(
                [
                    "kind",
                    "holder",
                    "kill -> next acquire",
                    "owner_died",
                    "a, b seen",
                    "repaired",
                    "next hold",
                ],
                rows,
                indent="   ",
            )
        )
        self._kill_mp_lock()
        self.say()

    def _kill_holder(self, lock: Any, data: Any) -> tuple[int, float]:
        """Start a worker that dies holding `lock`; its pid and the time of the SIGKILL."""
        held = self.ctx.Event()
        p = self.start(_die_holding, lock, data, held)
        if not held.wait(30):
            raise DemoError("the worker never took the lock")
        t_kill = time.perf_counter()
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        self.procs.remove(p)
        return int(p.pid), t_kill

    def _kill_and_recover(self, cls: Any) -> list[object]:
        """One kind's row: a holder killed mid-update, the next holder's repair."""
        lock = self.new_lock(cls)
        data = self.ctx.RawArray("q", 2)  # a, b
        pid, t_kill = self._kill_holder(lock, data)
        got = lock.acquire(timeout=5)
        dt = (time.perf_counter() - t_kill) * 1e3
        record: dict[str, Any] = {"kind": lock.kind, "pid": pid, "acquired": got}
        self.results["owner_death"].append(record)
        if not got:
            self.ok = False
            return [lock.kind, f"pid {pid}", "UNEXPECTED: no lock in 5 s", "-", "-", "-", "-"]
        died = lock.owner_died
        seen_ab = [int(data[0]), int(data[1])]  # a, b as the dead holder left them
        seen = f"{data[0]}, {data[1]}"
        if died:
            data[1] = -data[0]
            lock.mark_consistent()
            repaired = f"a + b = {data[0] + data[1]}"
        else:
            self.ok = False
            repaired = "UNEXPECTED: owner_died is False"
        lock.release()
        with lock:
            again = lock.owner_died
        self.ok &= not again
        record.update(
            kill_to_acquire_ms=dt,
            owner_died=died,
            seen=seen_ab,
            repaired=died,
            next_hold_clean=not again,
        )
        return [
            lock.kind,
            f"pid {pid}",
            f"{dt:.1f} ms",
            str(died),
            seen,
            repaired,
            "clean" if not again else "UNEXPECTED: owner_died again",
        ]

    def _kill_mp_lock(self) -> None:
        lock = self.ctx.Lock()
        data = self.ctx.RawArray("q", 2)
        tag = "   multiprocessing.Lock:"
        pid, _ = self._kill_holder(lock, data)
        got = lock.acquire(timeout=0.5)
        if got:
            lock.release()
        verdict = "unexpectedly free" if got else "wedged for good, nothing can ever release it"
        self.results["multiprocessing_lock_after_death"] = {"pid": pid, "acquired": got}
        self.say(
            f"{tag} holder pid {pid} killed the same way; acquire(timeout=0.5) -> {got}:\n"
            f"{' ' * len(tag)} {verdict}"
        )

    # -- part 3

    def handoff_table(self) -> None:
        d = self.handoff
        self.say(
            f"3. Hand-off: two processes pass a turn through one lock for {d:.1f} s each "
            "(each waits in acquire() while the other holds it)"
        )
        results: list[tuple[str, float, float, int]] = []
        for label, make in self._entries():
            lock = make()
            shared = self.ctx.RawArray("q", 2)
            clock = self.ctx.RawArray("d", 1)
            result = self.ctx.RawArray("d", 6)
            barrier = self.ctx.Barrier(2)
            for me in (0, 1):
                self.start(_pingpong_worker, lock, shared, clock, me, d, barrier, result)
            self.reap(timeout=30)
            trip = _nanmean(result[0], result[3])
            handoff = _nanmean(result[2], result[5])
            results.append((label, handoff, trip, int(result[1] + result[4])))
            self.results["handoff"].append(
                {
                    "lock": label,
                    "handoff_s": _or_none(handoff),
                    "round_trip_s": _or_none(trip),
                    "round_trips": int(result[1] + result[4]),
                }
            )
        base = results[-1][2]
        rows: list[list[object]] = []
        for label, handoff, trip, trips in results:
            if label == "multiprocessing.Lock":
                vs = "1.0x (baseline)"
            elif trip > 0 and base > 0:
                r = base / trip
                vs = f"{r:.1f}x faster" if r >= 1 else f"{1 / r:.1f}x slower"
            else:
                vs = "?"
            rows.append([label, _us(handoff), _us(trip), f"{trips:,}", vs])
        headers = ["lock", "hand-off", "round trip", "round trips", "round trip vs mp.Lock"]
        self.say(table(headers, rows, indent="   "))
        self.say(
            "   (medians; hand-off: one process's release() to the waiting one's acquire()\n"
            "   returning; round trip: two hand-offs, as bench/handoff.py measures it)"
        )
        load = os.getloadavg()[0]
        cpus = os.cpu_count() or 1
        if load > cpus - 0.5:
            self.say(
                f"   note: this machine is busy (load average {load:.1f} on {cpus} CPUs): "
                "round trips need both processes on a CPU at once, so they are noisy now"
            )
        self.say()


def _nanmean(a: float, b: float) -> float:
    vals = [v for v in (a, b) if v == v]
    return sum(vals) / len(vals) if vals else float("nan")


def _or_none(x: float) -> float | None:
    """NaN (nothing measured) as JSON's null."""
    return None if x != x else x


def _us(seconds: float) -> str:
    return "?" if seconds != seconds else f"{seconds * 1e6:.1f} µs"


@contextlib.contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """Start children with SIGINT ignored (inherited through fork and exec): Ctrl-C is the parent's."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(
    start_method: str, workers: int, iterations: int, handoff: float, as_json: bool = False
) -> bool:
    """The whole demo, its tables printed to stdout (``as_json``: to stderr, and its results
    as one JSON object to stdout at the end). True if every result was as expected and every
    segment it made is gone; a failure is marked in the output and on stderr."""
    ctx = multiprocessing.get_context(start_method)
    out = sys.stderr if as_json else sys.stdout
    demo = _Demo(ctx, workers, iterations, handoff, out)
    t0 = time.monotonic()
    demo.say(
        f"shmlocks demo: {len(shmlocks.KINDS)} lock kinds, {os.cpu_count()} CPUs, "
        f"start method {start_method!r}\n",
        flush=True,
    )
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        demo.counting()
        demo.owner_death()
        demo.handoff_table()
    finally:
        signal.signal(signal.SIGTERM, old_term)
        left = demo.cleanup()
        if left:
            print(
                f"shmlocks: error: could not remove segment(s): {', '.join(left)}", file=sys.stderr
            )
    if left:
        return False
    seconds = time.monotonic() - t0
    demo.say(f"all segments removed; done in {seconds:.1f} s")
    if as_json:
        print(json.dumps({"ok": demo.ok, "seconds": seconds, **demo.results}, indent=2))
    if not demo.ok:
        print("shmlocks: error: the demo saw unexpected results (marked above)", file=sys.stderr)
        return False
    return True
