"""Deadlock detection with many segments on the machine (issue 38): what waiting costs,
and how fast a cycle is refused, with 0, 1,500 and 10,000 unrelated segments.

    python bench/deadlock_scale.py [--segments 0,1500,10000] [--runs 20] [--seconds 6]
                                   [--json FILE]
    python -m shmlocks bench -- --deadlock-scale [...]

Run it in a private tmpfs on /dev/shm, so that the unrelated segments are the only ones
there (10,000 default locks take some 360 MB):

    SHMSIZE=2g unshare -m --propagation private sh -c \\
        'mount -t tmpfs -o size=$SHMSIZE tmpfs /dev/shm && exec "$@"' sh \\
        python bench/deadlock_scale.py

The unrelated segments are default futex locks, made and closed with persist=True (they
stay, as another program's would). Default deadlock detection throughout.

1. Idle CPU: a process whose W threads (1 and 16) wait `--seconds` behind a live holder
   (another process), each acquire timed out at the end: its CPU time (getrusage) over
   the wall time, in % of a core. Before issue 38 (the hidden scan): 0 / 1,500 / 10,000
   segments, 1 waiter: 0% / 12% / 76%; 16 waiters: 1% / 108% / -.
2. The GIL: a CPU-bound thread counts for 1.5 s beside one waiter thread (behind a live
   holder), then beside none, three times: its best speed beside the waiter over its best
   beside none, its voluntary context switches per second (a GIL it had to give up is
   one; as tests/test_wait_cost.py counts them), and the waiter's.
3. Detection latency: k processes (k = 2, 4) each hold lock i and then wait for lock
   i + 1 (the last for lock 0), each beginning 0.1 s after the one before: the last one
   closes the cycle and is its victim; from its acquire() call to its DeadlockError,
   median and max over `--runs`. "poked": a 2-cycle whose closer's process does not
   detect, so the victim is the first member, told by the closer's poke (futex, and pi,
   whose FUTEX_LOCK_PI sleep cannot watch the poke word). Before issue 38: an AB/BA cycle was refused 1.07 s after
   it closed with no other segment, 1.81 s with 10,000.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from idle_cost import vcs  # noqa: E402

import shmlocks  # noqa: E402


def make_segments(first: int, n: int) -> list[str]:
    names = []
    for i in range(first, first + n):
        name = f"shmlb-dlscale-{os.getpid()}-{i}"
        shmlocks.FutexMutex(name=name, persist=True).close()
        names.append(name)
    return names


def drop_segments(names: list[str]) -> None:
    for name in names:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass


def _hold(lock, ready, stop) -> None:
    lock.acquire()
    ready.set()
    stop.wait(600)
    lock.release()


class Holder:
    """A process that holds `lock` (and waits for nothing) until release()."""

    def __init__(self, lock) -> None:
        ctx = mp.get_context("fork")
        self.ready, self.stop = ctx.Event(), ctx.Event()
        self.p = ctx.Process(target=_hold, args=(lock, self.ready, self.stop), daemon=True)
        self.p.start()
        if not self.ready.wait(60):
            raise RuntimeError("the holder never held the lock")

    def release(self) -> None:
        self.stop.set()
        self.p.join(60)


def idle_cpu(waiters: int, seconds: float) -> float:
    """% of a core the process spends while `waiters` threads wait behind a live holder."""
    lock = shmlocks.MCSLock()
    holder = Holder(lock)
    try:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        ts = [
            threading.Thread(target=lock.acquire, kwargs={"timeout": seconds})
            for _ in range(waiters)
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        el = time.monotonic() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        holder.release()
        lock.close()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return 100.0 * cpu / el


def _count(seconds: float, waiter_tid: int | None, out: dict) -> None:
    tid = threading.get_native_id()
    n = 0
    w0 = vcs(waiter_tid) if waiter_tid else 0
    v0 = vcs(tid)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(2000):
            n += 1
    out.update(n=n, switches=vcs(tid) - v0, waiter=vcs(waiter_tid) - w0 if waiter_tid else 0)


def _gil_round(seconds: float) -> tuple[dict, dict]:
    """One count beside a waiter thread (behind a live holder), then one beside none."""
    lock = shmlocks.MCSLock()
    holder = Holder(lock)
    beside: dict = {}
    try:

        def wait() -> None:
            if lock.acquire(timeout=seconds + 30):
                lock.release()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)  # its first walk made, asleep
        c = threading.Thread(target=_count, args=(seconds, waiter.native_id, beside))
        c.start()
        c.join()
    finally:
        holder.release()
        waiter.join(60)
        lock.close()
    alone: dict = {}
    c = threading.Thread(target=_count, args=(seconds, None, alone))
    c.start()
    c.join()
    return beside, alone


def gil(seconds: float = 1.5, rounds: int = 3) -> dict:
    """A CPU-bound thread beside one waiter, then beside none, `rounds` times interleaved:
    the best count of each (the machine's noise only slows a count down), and the
    switches summed over the rounds."""
    rs = [_gil_round(seconds) for _ in range(rounds)]
    t = seconds * rounds
    return {
        "speed": max(b["n"] for b, _ in rs) / max(a["n"] for _, a in rs),
        "counter_switches_per_s": sum(b["switches"] for b, _ in rs) / t,
        "counter_switches_alone_per_s": sum(a["switches"] for _, a in rs) / t,
        "waiter_switches_per_s": sum(b["waiter"] for b, _ in rs) / t,
    }


def _member(i, first, second, bar, out, delay, detect) -> None:
    if not detect:
        shmlocks.set_deadlock_timeout(None)
    first.acquire()
    bar.wait(60)
    time.sleep(delay)
    t0 = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
    try:
        got = second.acquire(timeout=30)
        out.put((i, "got" if got else "timeout", t0, time.monotonic()))
        if got:
            second.release()
    except shmlocks.DeadlockError:
        out.put((i, "deadlock", t0, time.monotonic()))
        time.sleep(0.05)
    first.release()


def cycle_once(k: int, kind: str = "futex", poked: bool = False) -> float:
    """One k-cycle across k processes, member i beginning to wait 0.1 s after member
    i - 1: the time from the last one's acquire() call (the cycle closes) to the victim's
    DeadlockError, in s. The victim is the last member (it sees the cycle itself), or
    with `poked` the first (the last one's process does not detect: it finds the cycle
    and pokes the first, which walks again). Raises unless exactly that member is the
    victim and the others got their locks."""
    ctx = mp.get_context("fork")
    locks = [shmlocks.KINDS[kind]() for _ in range(k)]
    bar, out = ctx.Barrier(k), ctx.Queue()
    ps = [
        ctx.Process(
            target=_member,
            args=(i, locks[i], locks[(i + 1) % k], bar, out, 0.1 * i, not (poked and i == k - 1)),
            daemon=True,
        )
        for i in range(k)
    ]
    for p in ps:
        p.start()
    try:
        res = {}
        for _ in range(k):
            i, what, t0, t1 = out.get(timeout=120)
            res[i] = (what, t0, t1)
        for p in ps:
            p.join(30)
    finally:
        for p in ps:
            if p.is_alive():
                p.kill()
                p.join(10)
        for lk in locks:
            lk.close()
    v = 0 if poked else k - 1
    victims = [i for i, r in res.items() if r[0] == "deadlock"]
    if victims != [v] or any(r[0] != "got" for i, r in res.items() if i != v):
        raise RuntimeError(f"not one victim, member {v}: {res}")
    return res[v][2] - max(r[1] for r in res.values())


def latency(k: int, runs: int, kind: str = "futex", poked: bool = False) -> dict:
    xs = [cycle_once(k, kind, poked) for _ in range(runs)]
    return {"median_ms": 1e3 * statistics.median(xs), "max_ms": 1e3 * max(xs), "runs": runs}


#: the latency rows: (key, k, kind, poked)
CYCLES = [
    ("cycle2", 2, "futex", False),
    ("cycle4", 4, "futex", False),
    ("cycle2_poked_futex", 2, "futex", True),
    ("cycle2_poked_pi", 2, "pi", True),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segments", default="0,1500,10000")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.segments.split(",")]
    res: dict = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "by_segments": {}}
    have: list[str] = []
    try:
        for n in sorted(counts):
            have += make_segments(len(have), n - len(have))
            r: dict = {}
            for w in (1, 16):
                r[f"idle_cpu_pct_{w}"] = idle_cpu(w, a.seconds)
            if n <= 1500:
                r["gil"] = gil()
            if n in (0, max(counts)):
                for key, k, kind, poked in CYCLES:
                    r[key] = latency(k, a.runs, kind, poked)
            res["by_segments"][n] = r
            print(f"segments={n}: {json.dumps(r)}", flush=True)
    finally:
        drop_segments(have)
    res["load_after"] = os.getloadavg()
    print(
        "\n| segments | 1 waiter: CPU | 16 waiters: CPU | beside a waiter: speed, GIL "
        "give-ups/s (alone) | " + " | ".join(f"{key}: median / max" for key, *_ in CYCLES) + " |"
    )
    print("|---" * (4 + len(CYCLES)) + "|")
    for n, r in res["by_segments"].items():
        g = r.get("gil")
        gs = (
            f"{100 * g['speed']:.0f}%, {g['counter_switches_per_s']:.1f} "
            f"({g['counter_switches_alone_per_s']:.1f})"
            if g
            else "-"
        )
        cyc = [
            f"{r[c]['median_ms']:.1f} / {r[c]['max_ms']:.1f} ms" if c in r else "-"
            for c, *_ in CYCLES
        ]
        print(
            f"| {n:,} | {r['idle_cpu_pct_1']:.1f}% | {r['idle_cpu_pct_16']:.1f}% | {gs} | "
            + " | ".join(cyc)
            + " |"
        )
    print(f"\nload average before / after: {res['load_before']} / {res['load_after']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
