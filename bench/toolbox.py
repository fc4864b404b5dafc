"""The synchronization toolbox beside multiprocessing's primitives (README "The
synchronization toolbox"; docs/design.md §12):

  semaphore pair     one process: acquire() + release() of a free semaphore (mean)
  condition ping     two processes hand a turn back and forth under a Condition: one
                     round trip = two notify/wait hand-offs (mean)
  barrier cycle      4 processes pass a Barrier together (mean time per cycle)

    python bench/toolbox.py [--rounds N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import shmlocks

CTX = mp.get_context("fork")


def _impls():
    return {
        "shmlocks": {
            "sem": lambda: shmlocks.Semaphore(1),
            "cond": lambda: shmlocks.Condition(shmlocks.FutexMutex.create()),
            "value": lambda: CTX.RawValue("q", 0),
            "barrier": lambda n: shmlocks.Barrier(n),
        },
        "multiprocessing": {
            "sem": lambda: CTX.Semaphore(1),
            "cond": lambda: CTX.Condition(CTX.Lock()),
            "value": lambda: CTX.RawValue("q", 0),
            "barrier": lambda n: CTX.Barrier(n),
        },
    }


def bench_sem(make, rounds):
    s = make()
    acq, rel = s.acquire, s.release
    t0 = time.perf_counter()
    for _ in range(rounds):
        acq()
        rel()
    return (time.perf_counter() - t0) / rounds


def _pong(cond, turn, rounds):
    with cond:
        for _ in range(rounds):
            while turn.value != 1:
                cond.wait()
            turn.value = 0
            cond.notify()


def bench_cond(make, make_value, rounds):
    cond, turn = make(), make_value()
    p = CTX.Process(target=_pong, args=(cond, turn, rounds))
    p.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    with cond:
        for _ in range(rounds):
            turn.value = 1
            cond.notify()
            while turn.value != 0:
                cond.wait()
    dt = time.perf_counter() - t0
    p.join(30)
    return dt / rounds


def _party(bar, rounds):
    for _ in range(rounds):
        bar.wait()


def bench_barrier(make, rounds, n=4):
    bar = make(n)
    ps = [CTX.Process(target=_party, args=(bar, rounds + 1)) for _ in range(n - 1)]
    for p in ps:
        p.start()
    bar.wait()
    t0 = time.perf_counter()
    for _ in range(rounds):
        bar.wait()
    dt = time.perf_counter() - t0
    for p in ps:
        p.join(30)
    return dt / rounds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args(argv)
    rows = []
    for name, mk in _impls().items():
        rows.append(
            (
                name,
                bench_sem(mk["sem"], args.rounds * 50),
                bench_cond(mk["cond"], mk["value"], args.rounds),
                bench_barrier(mk["barrier"], args.rounds // 4),
            )
        )
    print(f"{'':16} {'semaphore pair':>15} {'condition ping':>15} {'barrier cycle (4)':>18}")
    for name, s, c, b in rows:
        print(f"{name:16} {s * 1e9:12.0f} ns {c * 1e6:12.1f} us {b * 1e6:15.1f} us")


if __name__ == "__main__":
    main()
