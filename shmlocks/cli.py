"""The ``shmlocks`` command line: ``ls``, ``inspect``, ``unlink``, ``demo``, ``bench`` and
``torture``.

Every command reads or changes POSIX shared-memory segments through the public API (plus
``Region._describe`` for triage). An expected failure (a missing or invalid name, a segment
that is not a shmlocks region, a permission problem) is reported as one line,
``shmlocks: error: ...``, with exit status 1, never as a traceback.

The demo's worker functions live at module level so that ``spawn`` and ``forkserver``
children can import them; the locks reach the children by pickling (by name).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import shmlocks
from shmlocks._core import _pid_alive

SHM_DIR = Path("/dev/shm")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An expected failure: printed as one ``shmlocks: error:`` line, exit status 1."""


# --------------------------------------------------------------------------------------------
# names and segments


def segment_name(raw: str) -> str:
    """Normalise a user-given segment name: one leading ``/`` is accepted and stripped."""
    name = raw[1:] if raw.startswith("/") else raw
    shown = repr(raw if len(raw) <= 60 else raw[:57] + "...")
    if not name:
        raise CliError(f"invalid segment name {shown}: empty")
    if "/" in name or "\0" in name or name in (".", ".."):
        raise CliError(f"invalid segment name {shown}: a name is one path component")
    if len(name.encode("utf-8", "surrogateescape")) > 255:
        raise CliError(f"invalid segment name {shown}: longer than 255 bytes")
    return name


def _require_region(name: str) -> Path:
    """The /dev/shm path of a shmlocks region called ``name``, or a CliError saying why not."""
    path = SHM_DIR / name
    if not path.exists():
        raise CliError(f"no shared-memory segment named {name!r}")
    if not os.access(path, os.R_OK):
        raise CliError(f"{name!r}: permission denied")
    if not shmlocks.is_region_file(str(path)):
        raise CliError(f"{name!r} is not a shmlocks segment (no shmlocks magic at its start)")
    return path


def _describe(name: str) -> dict[str, Any]:
    region = shmlocks.Region.open(name)
    try:
        return dict(region._describe())
    finally:
        region.close()


# --------------------------------------------------------------------------------------------
# formatting


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in cells
    ]
    return "\n".join(lines)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def _who(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"
    where = " (other namespace)" if p.get("other_namespace") else ""
    return f"pid {p['pid']} tid {p['tid']}{where} {'alive' if p['alive'] else 'DEAD'}"


def _creator(d: dict[str, Any]) -> tuple[str, bool | None]:
    """The creator's state for people, and for --json (None: its pid is another PID
    namespace's, not ours to look up)."""
    if d.get("creator_other_namespace"):
        return "other namespace", None
    alive = _pid_alive(int(d["creator_pid"]))
    return ("alive" if alive else "gone"), alive


def _flags(lock: dict[str, Any]) -> str:
    flags = [f for f in ("owner_died", "not_recoverable") if lock.get(f)]
    return ",".join(flags).replace("not_recoverable", "NOT-RECOVERABLE") or "-"


# --------------------------------------------------------------------------------------------
# ls, inspect, unlink


def cmd_ls(args: argparse.Namespace) -> int:
    names = shmlocks.list_regions()
    records: list[dict[str, Any]] = []
    for name in names:
        rec: dict[str, Any] = {"name": name}
        try:
            d = _describe(name)
        except FileNotFoundError:
            continue  # removed since the listing
        except (shmlocks.ShmLockError, OSError, ValueError) as e:
            rec["error"] = _error_text(e)
        else:
            parts = d.get("participants", [])
            rec.update(
                size=d["size"],
                locks=len(d.get("locks", [])),
                max_locks=d.get("max_locks"),
                alive=sum(1 for p in parts if p["alive"]),
                dead=sum(1 for p in parts if not p["alive"]),
                max_participants=d.get("max_participants"),
                creator_pid=d["creator_pid"],
                creator_state=_creator(d)[0],
                creator_alive=_creator(d)[1],
            )
        records.append(rec)
    if args.json:
        print(json.dumps(records, indent=2))
        return EXIT_OK
    if not records:
        print(f"no shmlocks segments in {SHM_DIR}")
        return EXIT_OK
    rows: list[list[object]] = []
    for r in records:
        if "error" in r:
            rows.append([r["name"], "?", "?", "?", "?", f"unreadable: {r['error']}"])
            continue
        rows.append(
            [
                r["name"],
                _size(r["size"]),
                f"{r['locks']}/{r['max_locks']}",
                f"{r['alive']} alive, {r['dead']} dead",
                r["max_participants"],
                f"{r['creator_pid']} ({r['creator_state']})",
            ]
        )
    print(_table(["NAME", "SIZE", "LOCKS", "PARTICIPANTS", "SLOTS", "CREATOR"], rows))
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    name = segment_name(args.name)
    _require_region(name)
    d = _describe(name)
    state, alive = _creator(d)
    if args.json:
        d = dict(d, creator_alive=alive)
        print(json.dumps(d, indent=2))
        return EXIT_OK
    print(
        f"segment {d['name']}: {_size(d['size'])} ({d['size']} bytes), layout version {d['version']}, "
        f"created by pid {d['creator_pid']} ({state})"
    )
    locks = d.get("locks", [])
    print(f"locks: {len(locks)} of {d['max_locks']}")
    if locks:
        rows = [
            [
                lk["name"],
                lk["kind"],
                "held" if lk["locked"] else "free",
                _who(lk.get("holder")) if lk["locked"] else "-",
                lk["waiters"],
                _flags(lk),
            ]
            for lk in locks
        ]
        print(_table(["NAME", "KIND", "STATE", "HOLDER", "WAITERS", "FLAGS"], rows, indent="  "))
    parts = d.get("participants", [])
    alive = sum(1 for p in parts if p["alive"])
    print(
        f"participants: {len(parts)} of {d['max_participants']} slots in use "
        f"({alive} alive, {len(parts) - alive} dead)"
    )
    if parts:
        rows = [
            [
                p["slot"],
                p["pid"],
                p["tid"],
                ("alive" if p["alive"] else "DEAD")
                + (", other namespace" if p.get("other_namespace") else ""),
            ]
            for p in parts
        ]
        print(_table(["SLOT", "PID", "TID", "STATE"], rows, indent="  "))
    dead_holders = [
        lk["name"]
        for lk in locks
        if lk["locked"] and lk.get("holder") and not lk["holder"]["alive"]
    ]
    if dead_holders:
        print(
            "note: held by a dead thread: "
            + ", ".join(dead_holders)
            + " (the next acquire recovers it and sees owner_died=True)"
        )
    return EXIT_OK


def cmd_unlink(args: argparse.Namespace) -> int:
    import posix_ipc  # type: ignore[import-not-found, unused-ignore]

    name = segment_name(args.name)
    if not args.force:
        _require_region(name)
    elif not (SHM_DIR / name).exists():
        raise CliError(f"no shared-memory segment named {name!r}")
    try:
        posix_ipc.unlink_shared_memory("/" + name)
    except posix_ipc.ExistentialError as e:
        raise CliError(f"no shared-memory segment named {name!r}") from e
    except posix_ipc.PermissionsError as e:
        raise CliError(f"{name!r}: permission denied") from e
    print(f"unlinked {name} (processes that have it mapped keep working)")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# bench


def _find_bench() -> Path | None:
    candidates = [
        Path(__file__).resolve().parent.parent / "bench" / "run.py",
        Path.cwd() / "bench" / "run.py",
    ]
    for c in candidates:
        if c.is_file():
            return c
    return None


def cmd_bench(args: argparse.Namespace) -> int:
    script = _find_bench()
    if script is None:
        print(
            "shmlocks: error: bench suite not found (expected bench/run.py in a source checkout)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    cmd = [sys.executable, str(script)]
    if args.full:
        cmd.append("--full")
    if args.smoke:
        cmd.append("--smoke")
    if args.out:
        cmd += ["--out", os.path.abspath(args.out)]  # relative to the caller, not the repo
    cmd += args.bench_args
    return subprocess.call(cmd, cwd=script.parent.parent)


# --------------------------------------------------------------------------------------------
# demo: worker functions (module level, so spawned children can import them)


def _worker_setup() -> None:
    # The parent handles Ctrl-C and kills its workers; a worker just goes quietly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _count_worker(
    lock: Any, shared: Any, iterations: int, barrier: Any, times: Any, index: int
) -> None:
    """shared = [count, last writer + 1, hand-overs]: all updated together under the lock."""
    _worker_setup()
    me = index + 1
    barrier.wait(30)
    t0 = time.monotonic()
    for _ in range(iterations):
        with lock:
            shared[0] += 1  # a read-modify-write: exact only if the lock excludes
            if shared[1] != me:  # the lock came from another process
                shared[1] = me
                shared[2] += 1
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
    """Take turns with the other worker through `lock`.

    shared = [whose turn, stop flag, work]; clock = [when the last holder released].
    A worker waits for its turn outside the lock, then takes the lock, passes the turn and
    does a little work before it releases, while the other worker calls acquire(). So every
    turn hands the lock from one process to the other, and barging locks cannot starve
    anybody. Records the round trip (from one of my turns to the next) and the hand-off
    (from the other's release to my acquire returning; CLOCK_MONOTONIC is system-wide).
    """
    _worker_setup()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:  # one CPU each: a hand-off between CPUs, not a context switch
        os.sched_setaffinity(0, {cpus[me % len(cpus)]})
    stamps: list[float] = []
    handoffs: list[float] = []
    barrier.wait(30)
    now = time.monotonic
    end = now() + duration
    hard_end = end + 10  # if the other side is gone, never wait for it longer than this
    spins = 0
    while True:
        while shared[0] != me and not shared[1]:
            spins += 1
            if not spins & 0x3F:
                if now() > hard_end:
                    shared[1] = 1
                os.sched_yield()  # be kind to a machine with fewer CPUs than workers
        if shared[1]:
            break
        lock.acquire()
        t = now()
        if clock[0]:
            handoffs.append(t - clock[0])
        stamps.append(t)
        shared[0] = 1 - me  # the other worker now calls acquire() and waits for us
        for _ in range(4):
            shared[2] += 1  # the critical section's work
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
    def __init__(self, ctx: Any, workers: int, iterations: int, handoff: float) -> None:
        self.ctx = ctx
        self.workers = workers
        self.iterations = iterations
        self.handoff = handoff
        self.locks: list[Any] = []
        self.procs: list[Any] = []
        self.ok = True

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
            raise CliError(
                f"{len(stuck)} worker(s) did not finish within {timeout:.0f} s and were killed"
            )
        if failed:
            raise CliError(
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
                lock.close()  # the creator's close() unlinks the name
            path = SHM_DIR / name
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
        print(
            f"1. Counting: {n} processes x {it:,} increments of one shared counter, under each lock"
        )
        row = "   {:<22}{:>10}  {:<7}{:>8}{:>15}{:>12}"
        print(row.format("lock", "total", "", "time", "per increment", "hand-overs"), flush=True)
        for label, make in self._entries():
            lock = make()
            shared = self.ctx.RawArray("q", 3)
            times = self.ctx.RawArray("d", 2 * n)
            barrier = self.ctx.Barrier(n)
            for i in range(n):
                self.start(_count_worker, lock, shared, it, barrier, times, i)
            self.reap(timeout=60)
            elapsed = max(times[1::2]) - min(times[0::2])
            total = int(shared[0])
            exact = total == expected
            self.ok &= exact
            verdict = "exact" if exact else f"WRONG, expected {expected:,}"
            print(
                row.format(
                    label,
                    f"{total:,}",
                    verdict,
                    f"{elapsed:.2f} s",
                    f"{elapsed / expected * 1e6:.2f} µs",
                    f"{int(shared[2]) - 1:,}",
                ),
                flush=True,
            )
        print(
            "   (hand-overs: how often the lock passed to another process. FIFO locks take turns, so\n"
            "   with more processes than CPUs a turn may wait for a descheduled process; barging\n"
            "   locks let the running process keep the lock.)"
        )
        print()

    def _entries(self) -> list[tuple[str, Callable[[], Any]]]:
        """Each lock kind (a fresh standalone lock), then multiprocessing.Lock as the reference."""
        entries: list[tuple[str, Callable[[], Any]]] = [
            (kind, functools.partial(self.new_lock, cls)) for kind, cls in shmlocks.KINDS.items()
        ]
        entries.append(("multiprocessing.Lock", self.ctx.Lock))
        return entries

    # -- part 2

    def owner_death(self) -> None:
        print(
            "2. Owner death: a holder is SIGKILLed inside its critical section (invariant a + b == 0)"
        )
        print(
            "   Each holder took the lock, did a += 1 (not yet b -= 1) and was killed with SIGKILL.\n"
            "   The next acquire(timeout=5) sees owner_died, repairs (b = -a), calls\n"
            "   mark_consistent() and releases; the hold after that is clean."
        )
        rows = [self._kill_and_recover(cls) for cls in shmlocks.KINDS.values()]
        print(
            _table(
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
        print()

    def _kill_holder(self, lock: Any, data: Any) -> tuple[int, float]:
        """Start a worker that dies holding `lock`; its pid and the time of the SIGKILL."""
        held = self.ctx.Event()
        p = self.start(_die_holding, lock, data, held)
        if not held.wait(30):
            raise CliError("the worker never took the lock")
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
        if not got:
            self.ok = False
            return [lock.kind, f"pid {pid}", "UNEXPECTED: no lock in 5 s", "-", "-", "-", "-"]
        died = lock.owner_died
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
        print(
            f"{tag} holder pid {pid} killed the same way; acquire(timeout=0.5) -> {got}:\n"
            f"{' ' * len(tag)} {verdict}"
        )

    # -- part 3

    def handoff_table(self) -> None:
        d = self.handoff
        print(
            f"3. Hand-off: two processes take turns through one lock for {d:.1f} s each "
            "(each waits in acquire() while the other finishes its turn)"
        )
        results: list[tuple[str, float, float, int]] = []
        for label, make in self._entries():
            lock = make()
            shared = self.ctx.RawArray("q", 3)
            clock = self.ctx.RawArray("d", 1)
            result = self.ctx.RawArray("d", 6)
            barrier = self.ctx.Barrier(2)
            for me in (0, 1):
                self.start(_pingpong_worker, lock, shared, clock, me, d, barrier, result)
            self.reap(timeout=30)
            trip = _nanmean(result[0], result[3])
            handoff = _nanmean(result[2], result[5])
            results.append((label, handoff, trip, int(result[1] + result[4])))
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
        print(_table(headers, rows, indent="   "))
        print("   (medians; hand-off: one process's release() to the other's acquire() returning)")
        load = os.getloadavg()[0]
        cpus = os.cpu_count() or 1
        if load > cpus - 0.5:
            print(
                f"   note: this machine is busy (load average {load:.1f} on {cpus} CPUs): "
                "round trips need both processes on a CPU at once, so they are noisy now"
            )
        print()


def _nanmean(a: float, b: float) -> float:
    vals = [v for v in (a, b) if v == v]
    return sum(vals) / len(vals) if vals else float("nan")


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


def cmd_demo(args: argparse.Namespace) -> int:
    ctx = multiprocessing.get_context(args.start_method)
    demo = _Demo(ctx, workers=args.workers, iterations=args.iterations, handoff=args.handoff)
    t0 = time.monotonic()
    print(
        f"shmlocks demo: {len(shmlocks.KINDS)} lock kinds, {os.cpu_count()} CPUs, "
        f"start method {args.start_method!r}\n",
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
        return EXIT_ERROR
    print(f"all segments removed; done in {time.monotonic() - t0:.1f} s")
    if not demo.ok:
        print("shmlocks: error: the demo saw unexpected results (marked above)", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# torture


def cmd_torture(args: argparse.Namespace) -> int:
    from shmlocks import torture

    if args.workers > torture.MAX_WORKERS:
        raise CliError(f"--workers: at most {torture.MAX_WORKERS}")
    kinds = list(shmlocks.KINDS) if args.kind == "all" else [args.kind]
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        out = sys.stderr if args.json else sys.stdout
        results = torture.main(
            kinds, args.seconds, args.workers, seed=args.seed, out=out, load=args.load
        )
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    failed = [r.kind for r in results if not r.ok]
    if failed:
        print(
            f"shmlocks: error: torture failed for {', '.join(failed)} (see above)", file=sys.stderr
        )
        return EXIT_ERROR
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# entry point


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shmlocks",
        description="Interprocess locks in POSIX shared memory: inspect, clean up, demonstrate.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "demo", help="workers under each lock kind, a SIGKILLed holder recovered, a hand-off table"
    )
    p.add_argument(
        "--workers", type=_positive_int, default=4, help="processes per lock kind (default 4)"
    )
    p.add_argument(
        "--iterations",
        type=_positive_int,
        default=20000,
        help="increments per worker (default 20000)",
    )
    p.add_argument(
        "--handoff",
        type=_positive_float,
        default=0.3,
        metavar="SECONDS",
        help="hand-off time per lock (default 0.3)",
    )
    p.add_argument(
        "--start-method",
        choices=multiprocessing.get_all_start_methods(),
        default="spawn",
        help="multiprocessing start method (default spawn: the locks travel by pickling)",
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="the cross-process benchmark suite (bench/run.py)")
    p.add_argument("--full", action="store_true", help="the full suite rather than the quick one")
    p.add_argument("--smoke", action="store_true", help="a few seconds, every code path (CI)")
    p.add_argument("--out", metavar="DIR", help="where to write the JSON and plots")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "torture",
        help="SIGKILL random holders and waiters of each lock kind; check exact recovery",
        description=(
            "Workers increment a shared counter under the lock while a killer SIGKILLs "
            "random workers (holders and waiters) and restarts them. Reports kills, "
            "recoveries (owner_died seen), the worst time from a death to the next "
            "acquisition, mutual-exclusion violations, wedges and leaked slots; exits 1 if "
            "any occurred. Kinds whose recovery is not built are skipped."
        ),
    )
    p.add_argument(
        "--kind",
        choices=["all", *shmlocks.KINDS],
        default="all",
        help="the lock kind, or all (default all)",
    )
    p.add_argument(
        "--seconds",
        type=_positive_float,
        default=10.0,
        help="how long to torture each kind (default 10)",
    )
    p.add_argument("--workers", type=_positive_int, default=4, help="worker processes (default 4)")
    p.add_argument("--seed", type=int, help="seed the random kills (default: random)")
    p.add_argument(
        "--load",
        action="store_true",
        help="load the machine on purpose: a CPU hog pinned to each CPU, workers at mixed "
        "nice levels and policies, so preemption lands inside protocol steps",
    )
    p.add_argument(
        "--json", action="store_true", help="print the results as JSON (the lines go to stderr)"
    )
    p.set_defaults(func=cmd_torture)

    p = sub.add_parser("ls", help="the shmlocks segments on this machine")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser(
        "inspect", help="each lock in a segment: kind, holder (alive or dead), waiters"
    )
    p.add_argument("name", metavar="NAME", help="segment name (a leading / is optional)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("unlink", help="remove a segment's name")
    p.add_argument("name", metavar="NAME", help="segment name (a leading / is optional)")
    p.add_argument(
        "--force", action="store_true", help="unlink even if it is not a shmlocks segment"
    )
    p.set_defaults(func=cmd_unlink)
    return parser


def _error_text(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError):
        return f"no such segment: {e.filename}" if e.filename else "no such segment"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = str(e) or type(e).__name__
    return text.splitlines()[0]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("shmlocks: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `shmlocks ls | head`: the reader went away; say nothing more.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return EXIT_ERROR
    except CliError as e:
        print(f"shmlocks: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except (shmlocks.ShmLockError, OSError, ValueError) as e:
        print(f"shmlocks: error: {type(e).__name__}: {_error_text(e)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
