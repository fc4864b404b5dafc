"""A contended hand-off on one stripe of a lock table, against a plain lock of its kind.

    python bench/stripe_handoff.py [--procs 2,4] [--kinds futex,robust,pi] [--seconds 1]
                                   [--rounds 5] [--autogroup-nice N] [--json]

P forked workers each loop {with lock: counter += 1} (a plain read-modify-write of a
shared word) on ONE lock for ``--seconds``: a standalone lock of the kind (its ctl line
and its lock word on lines of their own) or stripe 0 of a ``LockTable(64, kind)`` (a
compact stripe: docs/design.md §15). Cells are interleaved (every configuration of a round,
then the next round, each round starting at another one), so a loaded machine's drift
spreads over all of them; each figure is the median over rounds of ops/s, with the share
of holds that were hand-offs between processes (the lock's own statistics). Every cell
checks exclusion (the counter equals the sections counted). ``--json`` prints the raw
figures as one JSON object (what an A/B of two builds reads: run it under each build's
PYTHONPATH). Exit status 0, or 1 if an exclusion check failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing import shared_memory

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import AUTOGROUP_HELP, own_autogroup  # noqa: E402

import shmlocks  # noqa: E402


def _worker(kind: str, name: str, stripe: bool, shm_name: str, idx: int, start) -> None:
    shm = shared_memory.SharedMemory(shm_name)
    w = shm.buf.cast("Q")
    if stripe:
        t = shmlocks.LockTable.open(name)
        lk = t[0]
    else:
        t = None
        lk = shmlocks.KINDS[kind].open(name)
    n = 0
    start.wait()
    while not w[1]:
        with lk:
            w[0] = w[0] + 1
        n += 1
    w[2 + idx] = n
    del w
    shm.close()
    (t or lk).close()


def measure(kind: str, stripe: bool, procs: int, seconds: float) -> dict:
    ctx = mp.get_context("fork")
    if stripe:
        obj = shmlocks.LockTable(64, kind)
        lk = obj[0]
    else:
        obj = lk = shmlocks.KINDS[kind]()
    shm = shared_memory.SharedMemory(create=True, size=8 * (2 + procs))
    w = shm.buf.cast("Q")
    try:
        for i in range(2 + procs):
            w[i] = 0
        start = ctx.Barrier(procs + 1)
        ps = [
            ctx.Process(target=_worker, args=(kind, obj.name, stripe, shm.name, i, start))
            for i in range(procs)
        ]
        for p in ps:
            p.start()
        start.wait(60)
        t0 = time.perf_counter()
        time.sleep(seconds)
        w[1] = 1
        t1 = time.perf_counter()
        for p in ps:
            p.join(60)
        total = sum(w[2 + i] for i in range(procs))
        exact = w[0] == total
        st = lk.stats()
    finally:
        del w
        shm.close()
        shm.unlink()
        obj.close()
    return {
        "ops_per_s": total / (t1 - t0),
        "handoff_share": st["handoffs"] / st["acquisitions"] if st["acquisitions"] else 0.0,
        "exact": exact,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/stripe_handoff.py", description=__doc__.split("\n")[0])
    p.add_argument("--procs", default="2,4")
    p.add_argument("--kinds", default="futex,robust,pi")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--autogroup-nice", type=int, metavar="N", help=AUTOGROUP_HELP)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.autogroup_nice is not None:
        print(own_autogroup(a.autogroup_nice), file=sys.stderr)
    procs = [int(x) for x in a.procs.split(",") if x]
    kinds = [x for x in a.kinds.split(",") if x]
    cells = [(k, s, n) for n in procs for k in kinds for s in (False, True)]
    raw: dict[str, list[dict]] = {}
    ok = True
    for r in range(a.rounds):
        for c in cells[r % len(cells) :] + cells[: r % len(cells)]:
            m = measure(c[0], c[1], c[2], a.seconds)
            ok &= m["exact"]
            raw.setdefault(f"{c[0]} {'stripe' if c[1] else 'plain'} P={c[2]}", []).append(m)
    out = {
        k: {
            "ops_per_s": statistics.median(m["ops_per_s"] for m in v),
            "handoff_share": statistics.median(m["handoff_share"] for m in v),
            "all_ops_per_s": [round(m["ops_per_s"]) for m in v],
        }
        for k, v in raw.items()
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{'lock':24s} {'ops/s (median)':>15s} {'hand-offs':>10s}")
        for k, v in out.items():
            print(f"{k:24s} {v['ops_per_s']:15,.0f} {v['handoff_share']:10.1%}")
    if not ok:
        print("an exclusion check failed", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
