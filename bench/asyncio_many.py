"""asyncio: what N tasks of one process waiting on one lock cost (docs/design.md §14).

    python bench/asyncio_many.py [--tasks N] [--kinds a,b] [--json]
    SHMLOCKS_AIO=thread python bench/asyncio_many.py ...   # the fallback's figures

Each kind runs in a fresh interpreter (its own RSS), beside ``asyncio.Lock`` measured the
same way. A process holds the lock (for asyncio.Lock: a task of the loop); N tasks of one
loop each ``async with lock``; while all of them wait:

- **threads**: the process's threads but its main thread (shmlocks': none with io_uring,
  the loop's waiter thread under SHMLOCKS_AIO=thread);
- **memory per task**: the process's RSS (its shared memory touched included: the
  segment's pages) grown since before the tasks were made, over N, after a gc;
- **timer lateness**: a 1 ms periodic sleep of the loop over 1 s: p99 and max of how late
  each tick came (and the same before the tasks were made: the machine's own noise). On a
  loaded machine (other processes on every CPU) a tick is late by a scheduler slice now
  and then with no lock involved: ``best`` is the best p99 of up to 8 windows of 0.5 s
  (until one is under 5 ms), before and while the tasks wait, and again once they are
  served (``after``: a load that came during the wait is still there, or was not), which
  is what a test holds.

Then the holder releases: **served** counts the tasks that got the lock (all N), in
**call order** or not, and the time it took to serve them all.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from typing import Any

CTX = mp.get_context("fork")


def _rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


async def _lateness(seconds: float) -> list[float]:
    loop = asyncio.get_running_loop()
    lags = []
    t_next = loop.time() + 0.001
    end = loop.time() + seconds
    while loop.time() < end:
        await asyncio.sleep(max(0.0, t_next - loop.time()))
        lags.append(loop.time() - t_next)
        t_next += 0.001
    return sorted(lags)


def _pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * p))]


async def _best_p99(n: int = 8, length: float = 0.5) -> float:
    best = 1e9
    for _ in range(n):
        best = min(best, _pct(await _lateness(length), 0.99))
        if best < 0.005:
            break
    return best


def _hold(kind: str, name: str, ready: Any, go: Any) -> None:
    import shmlocks

    lock = shmlocks.KINDS[kind].open(name)
    lock.acquire()
    ready.set()
    go.wait(300)
    lock.release()
    lock.close()
    os._exit(0)


def measure(kind: str, n: int, lag_s: float = 1.0) -> dict[str, Any]:
    """In this (fresh) process: the figures of the module's docstring for one kind
    ("asyncio.Lock" for the stdlib's)."""
    lock: Any
    holder = None
    go = CTX.Event()
    if kind == "asyncio.Lock":
        lock = None
    else:
        import shmlocks

        lock = shmlocks.KINDS[kind].create(name=f"shmlocks-bench-many-{os.getpid()}")
        ready = CTX.Event()
        holder = CTX.Process(target=_hold, args=(kind, lock.name, ready, go))
        holder.start()
        if not ready.wait(60):
            raise SystemExit("the holder process did not take the lock")

    async def main() -> dict[str, Any]:
        nonlocal lock
        if lock is None:
            lock = asyncio.Lock()
            await lock.acquire()
        else:
            # the one-time costs (the loop's driver, its ring) before the baseline
            async def once() -> None:
                if await lock.acquire_async(timeout=0.001):
                    lock.release()

            await once()
        served: list[int] = []

        async def task(i: int) -> None:
            async with lock:
                served.append(i)

        def waiting() -> int:
            if isinstance(lock, asyncio.Lock):
                return len(lock._waiters or ())
            return int(lock._describe()["waiters"])

        base = await _lateness(lag_s)
        base_best = await _best_p99()
        threads0 = _threads()
        rss0 = _rss()
        t0 = time.monotonic()
        tasks = [asyncio.create_task(task(i)) for i in range(n)]
        while waiting() < n:
            await asyncio.sleep(0.01)
            if time.monotonic() - t0 > 120:
                raise SystemExit(f"only {waiting()} of {n} tasks wait")
        queued_s = time.monotonic() - t0
        rss1 = _rss()
        threads = _threads() - 1
        lags = await _lateness(lag_s)
        best = await _best_p99()
        t1 = time.monotonic()
        if isinstance(lock, asyncio.Lock):
            lock.release()
        else:
            go.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
        served_s = time.monotonic() - t1
        after_best = await _best_p99()
        return {
            "kind": kind,
            "tasks": n,
            "aio_mode": _aio_mode(),
            "threads_before": threads0 - 1,
            "threads": threads,
            "bytes_per_task": (rss1 - rss0) / n,
            "lag_p99_ms": _pct(lags, 0.99) * 1e3,
            "lag_max_ms": lags[-1] * 1e3,
            "base_lag_p99_ms": _pct(base, 0.99) * 1e3,
            "base_lag_max_ms": base[-1] * 1e3,
            "lag_best_p99_ms": best * 1e3,
            "base_lag_best_p99_ms": base_best * 1e3,
            "after_lag_best_p99_ms": after_best * 1e3,
            "queued_s": queued_s,
            "served": len(served),
            "call_order": served == list(range(n)),
            "served_s": served_s,
        }

    try:
        return asyncio.run(main())
    finally:
        go.set()
        if holder is not None:
            holder.join(60)
        if lock is not None and not isinstance(lock, asyncio.Lock):
            lock.close()


def _aio_mode() -> str:
    import shmlocks._core as c

    return str(c.AIO_MODE)


def run_fresh(kind: str, n: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """measure(kind, n) in a fresh interpreter (its RSS its own)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import asyncio_many as m; "
        "print(json.dumps(m.measure(sys.argv[2], int(sys.argv[3]))))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run(
        [sys.executable, "-c", code, here, kind, str(n)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, **(env or {})),
    )
    if p.returncode != 0:
        raise RuntimeError(f"{kind}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main() -> None:
    import shmlocks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--kinds", default=",".join(shmlocks.KINDS))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [run_fresh("asyncio.Lock", a.tasks)]
    for kind in a.kinds.split(","):
        rows.append(run_fresh(kind, a.tasks))
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    ref = rows[0]["bytes_per_task"]
    print(f"{a.tasks} tasks of one loop waiting on one lock; AIO_MODE {_aio_mode()}")
    print(
        "| lock | threads | bytes/task | x asyncio.Lock | timer late p99 (max) "
        "| same, no tasks | best p99, waiting / not | served | call order | serving all |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['kind']} | {r['threads']} | {r['bytes_per_task']:,.0f} "
            f"| {r['bytes_per_task'] / ref:.2f} "
            f"| {r['lag_p99_ms']:.2f} ms ({r['lag_max_ms']:.1f}) "
            f"| {r['base_lag_p99_ms']:.2f} ms ({r['base_lag_max_ms']:.1f}) "
            f"| {r['lag_best_p99_ms']:.2f} / {r['base_lag_best_p99_ms']:.2f} ms "
            f"| {r['served']} | {r['call_order']} | {r['served_s'] * 1e3:.0f} ms |"
        )


if __name__ == "__main__":
    main()
