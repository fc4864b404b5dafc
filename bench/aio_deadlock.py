"""Deadlock cycles through asyncio tasks (issue 38 item 4): how fast a cycle of tasks,
threads and processes is refused, under each asyncio wait driver.

    python bench/aio_deadlock.py [--kinds futex,mcs,robust,pi] [--modes io_uring,thread]
                                 [--runs 20] [--json FILE]

Each member is a process of its own, started fresh (spawn) with SHMLOCKS_AIO set for the
mode ("io_uring": the default driver; "thread": SHMLOCKS_AIO=thread, the waiter thread),
and plays one role for `--runs` rounds: "task" (an asyncio task holds its first lock with
acquire_async, then awaits the second), "thread" (a thread other than the main one does
it with acquire) or "process" (the main thread does). Member i holds lock i and waits for
lock i + 1 (the last for lock 0), each beginning `delay` after the round's barrier; the
one that begins last closes the cycle and is its victim: from its call to its
DeadlockError, median and max over the rounds. Default deadlock detection throughout,
but for the "poked" shapes, where the closer's process does not detect
(set_deadlock_timeout(None)): the victim is then the other member, told by the closer's
poke, and the figure is from the cycle's closing (the closer's call) to the victim's
DeadlockError. Before issue 38 item 4 a cycle through a task was refused by its loop's
scan of every segment, no sooner than 1 s into the task's wait.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import threading
import time
from typing import Any

import shmlocks

#: shape -> (roles, delays, detects): the member with the largest delay closes the cycle
#: (on a loaded machine, the one that calls last does)
SHAPES: dict[str, tuple[tuple[str, ...], tuple[float, ...], tuple[bool, ...]]] = {
    "thread-task": (("thread", "task"), (0.0, 0.1), (True, True)),
    "task-thread": (("task", "thread"), (0.0, 0.1), (True, True)),
    "task-task": (("task", "task"), (0.0, 0.1), (True, True)),
    "task-thread-process": (("thread", "process", "task"), (0.0, 0.05, 0.1), (True,) * 3),
    "process-task-thread": (("task", "thread", "process"), (0.0, 0.05, 0.1), (True,) * 3),
    "poked-task": (("task", "thread"), (0.0, 0.1), (True, False)),
    "poked-thread": (("thread", "task"), (0.0, 0.1), (True, False)),
}


def _one(i, role, first, second, delay, bar, out, rounds):
    """One member's rounds, in the role's way of holding and waiting."""

    def sync_round(r):
        first.acquire()
        bar.wait(60)
        time.sleep(delay)
        t0 = time.monotonic()
        try:
            got = second.acquire(timeout=20)
        except shmlocks.DeadlockError as e:
            out.put((r, i, "deadlock", t0, time.monotonic(), str(e)))
            time.sleep(0.02)  # the others are still blocked: keep `first` a little
            first.release()
            bar.wait(60)
            return
        out.put((r, i, "got" if got else "timeout", t0, time.monotonic(), ""))
        if got:
            second.release()
        first.release()
        bar.wait(60)

    if role == "task":
        import asyncio

        async def main():
            for r in range(rounds):
                await first.acquire_async()
                bar.wait(60)
                await asyncio.sleep(delay)
                t0 = time.monotonic()
                try:
                    got = await second.acquire_async(timeout=20)
                except shmlocks.DeadlockError as e:
                    out.put((r, i, "deadlock", t0, time.monotonic(), str(e)))
                    await asyncio.sleep(0.02)
                    first.release()
                    bar.wait(60)
                    continue
                out.put((r, i, "got" if got else "timeout", t0, time.monotonic(), ""))
                if got:
                    second.release()
                first.release()
                bar.wait(60)

        asyncio.run(main())
        return

    def rounds_of():
        for r in range(rounds):
            sync_round(r)

    if role == "thread":
        t = threading.Thread(target=rounds_of)
        t.start()
        t.join()
    else:
        rounds_of()


def member(i, role, first, second, delay, detects, bar, out, rounds):
    if not detects:
        shmlocks.set_deadlock_timeout(None)
    _one(i, role, first, second, delay, bar, out, rounds)


Round = dict[int, tuple[str, float, float, str]]

#: members that began to wait within this of each other may be either one the victim (the
#: records' since is taken inside the call, the figures here just before it)
TIE_S = 0.02


def run(kind: str, mode: str, shape: str, rounds: int) -> list[Round]:
    """`rounds` rounds of `shape` on locks of `kind` under AIO mode `mode`: per round,
    {member: (outcome, its call's CLOCK_MONOTONIC, its return's, message)}."""
    roles, delays, detects = SHAPES[shape]
    n = len(roles)
    ctx = mp.get_context("spawn")
    tag = f"{os.getpid()}-{time.monotonic_ns() % 10**9}"
    locks = [shmlocks.KINDS[kind](name=f"shmlb-aiodl-{tag}-{j}") for j in range(n)]
    bar, out = ctx.Barrier(n), ctx.Queue()
    old = os.environ.get("SHMLOCKS_AIO")
    here = os.path.dirname(os.path.abspath(__file__))
    added = here not in sys.path
    if added:  # (a spawned member imports this module: from the path it is given)
        sys.path.insert(0, here)
    if mode == "thread":
        os.environ["SHMLOCKS_AIO"] = "thread"
    else:
        os.environ.pop("SHMLOCKS_AIO", None)
    try:
        ps = [
            ctx.Process(
                target=member,
                args=(
                    j,
                    roles[j],
                    locks[j],
                    locks[(j + 1) % n],
                    delays[j],
                    detects[j],
                    bar,
                    out,
                    rounds,
                ),
                daemon=True,
            )
            for j in range(n)
        ]
        for p in ps:
            p.start()
    finally:
        if added:
            sys.path.remove(here)
        if old is None:
            os.environ.pop("SHMLOCKS_AIO", None)
        else:
            os.environ["SHMLOCKS_AIO"] = old
    try:
        res: list[Round] = [{} for _ in range(rounds)]
        deadline = time.monotonic() + 60 + 10 * rounds
        got = 0
        while got < rounds * n:
            try:
                r, j, what, t0, t1, msg = out.get(timeout=1)
            except queue.Empty:
                dead = [p.exitcode for p in ps if p.exitcode is not None and p.exitcode != 0]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"members failed ({dead}) or hung: {res}") from None
                continue
            res[r][j] = (what, t0, t1, msg)
            got += 1
        for p in ps:
            p.join(60)
            if p.exitcode != 0:
                raise RuntimeError(f"member exited with {p.exitcode}")
        return res
    finally:
        for p in ps:
            if p.is_alive():
                p.kill()
                p.join(10)
        for lk in locks:
            name = lk.name
            lk.close()
            try:
                os.unlink(f"/dev/shm/{name}")
            except FileNotFoundError:
                pass


def latency(shape: str, res: list[Round]) -> list[float]:
    """Per round, from the cycle's closing (the last member's call) to the victim's
    DeadlockError, s. Raises unless each round had exactly one victim, the member that
    began to wait last among those whose process detects (or one within TIE_S of it), and
    every other member got its lock."""
    _roles, _delays, detects = SHAPES[shape]
    out = []
    for r, rr in enumerate(res):
        v = [j for j, x in rr.items() if x[0] == "deadlock"]
        last = max(x[1] for j, x in rr.items() if detects[j])
        if (
            len(v) != 1
            or not detects[v[0]]
            or rr[v[0]][1] < last - TIE_S
            or any(x[0] != "got" for j, x in rr.items() if j != v[0])
        ):
            raise AssertionError(f"round {r} of {shape}: {rr}")
        closed = max(x[1] for x in rr.values())
        out.append(max(0.0, rr[v[0]][2] - closed))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="futex,mcs,robust,pi")
    ap.add_argument("--modes", default="io_uring,thread")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    print(f"{'mode':9} {'kind':7} {'shape':20} {'median ms':>10} {'max ms':>8}")
    for mode in a.modes.split(","):
        for kind in a.kinds.split(","):
            for shape in a.shapes.split(","):
                lat = latency(shape, run(kind, mode, shape, a.runs))
                row = {
                    "mode": mode,
                    "kind": kind,
                    "shape": shape,
                    "runs": a.runs,
                    "median_ms": statistics.median(lat) * 1e3,
                    "max_ms": max(lat) * 1e3,
                }
                rows.append(row)
                print(
                    f"{mode:9} {kind:7} {shape:20} {row['median_ms']:10.2f} {row['max_ms']:8.2f}",
                    flush=True,
                )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
