"""Sharding: one lock against lock tables of 4 .. 4,096 stripes, chosen by a stable hash.

    python bench/sharding.py                            P = 2,4,8, 1 s a cell
    python bench/sharding.py --seconds 0.3 --procs 4 --sizes 1,64
    python -m shmlocks bench [--out DIR] -- --sharding [--seconds S] [--procs ...]

P worker processes each loop {key := a random one of 10,000; take the key's lock;
counters[key] += 1 (a plain read-modify-write of a shared array, nothing atomic); release}
for ``--seconds``, with:

- one lock (a FutexMutex: every key on it; the size 1 column);
- ``LockTable(N, kind)`` for N = 4, 16, 64, 256, 4096 and kind futex and mcs
  (``with table.lock_for(key):``);
- a list of N ``multiprocessing.Lock`` chosen by the same stable hash
  (``locks[shmlocks.index_of(key, N)]``), what a user builds by hand.

Every cell checks exclusion: the counters' sum equals the sections counted. Reports
ops/s (median of the repeats), Jain's fairness index over the per-worker counts (the lowest)
and the shared memory a stripe costs (the table segment's resident bytes over its stripes,
after the run: tmpfs's st_blocks, so what was given pages; a multiprocessing.Lock is a
32-byte sem_t in multiprocessing's heap arena). Beside it, in one process: the ns of
``table.index_of`` for a 32-byte str, and ``with table.lock_for(key):`` against a plain
``with lock:`` (issue 39's bars: index_of <= 100 ns, lock_for + with within 1.3x, 64
stripes >= 1.5x one lock at P=4). ``--work-us U`` spins U µs inside every section (a
longer critical section, where a lock's serialization shows). ``--plot F`` writes ops/s against the number of stripes
(needs matplotlib); ``--json F`` the raw figures; ``--out DIR`` all three.

Cells are interleaved (every configuration at one P, then the next P; each round starting
at another configuration), so a loaded machine's drift spreads over all of them. On a
shared machine the absolute figures move with the neighbours; read the ratios of one run.
Exit status: 0, or 1 if an exclusion check failed or a segment was left behind.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import timeit
from multiprocessing import shared_memory
from typing import Any

from common import AUTOGROUP_HELP, own_autogroup

import shmlocks

KEYS = 10_000
PROCS = (2, 4, 8)
SIZES = (4, 16, 64, 256, 4096)
KINDS = ("futex", "mcs")
SEM_T = 32  # sizeof(sem_t) on Linux: what one multiprocessing.Lock takes in the heap arena
STOP = KEYS  # word index of the stop flag, then one count per worker
#: ns of work inside each section (--work-us; forked workers inherit it)
WORK_NS = 0
#: a cell whose workers got fewer CPUs than this cannot show sections run in parallel
CPUS_FOR_BAR = 1.5


def log(msg: str) -> None:
    print(f"[sharding {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def jain(xs: list[int]) -> float:
    s = sum(xs)
    q = sum(x * x for x in xs)
    return s * s / (len(xs) * q) if q else 1.0


def _worker(
    cfg: tuple, obj: Any, shm_name: str, idx: int, seed: int, start: Any, procs: int
) -> None:
    shm = shared_memory.SharedMemory(shm_name)
    w = shm.buf.cast("Q")
    rng = random.Random(seed)
    keys = [rng.randrange(KEYS) for _ in range(1 << 14)]
    mask = (1 << 14) - 1
    what = cfg[0]
    n = 0
    work = WORK_NS
    clock = time.perf_counter_ns
    if what == "table":
        t = shmlocks.LockTable.open(obj.name)  # attached as a user's worker would
        lock_for = t.lock_for
        start.wait()
        cpu0 = time.process_time_ns()
        while not w[STOP]:
            k = keys[n & mask]
            with lock_for(k):
                w[k] = w[k] + 1
                if work:
                    end = clock() + work
                    while clock() < end:
                        pass
            n += 1
    elif what == "mp":
        locks, size = obj, cfg[1]
        index_of = shmlocks.index_of
        start.wait()
        cpu0 = time.process_time_ns()
        while not w[STOP]:
            k = keys[n & mask]
            with locks[index_of(k, size)]:
                w[k] = w[k] + 1
                if work:
                    end = clock() + work
                    while clock() < end:
                        pass
            n += 1
    else:
        lk = shmlocks.FutexMutex.open(obj.name)
        start.wait()
        cpu0 = time.process_time_ns()
        while not w[STOP]:
            k = keys[n & mask]
            with lk:
                w[k] = w[k] + 1
                if work:
                    end = clock() + work
                    while clock() < end:
                        pass
            n += 1
    w[STOP + 1 + procs + idx] = time.process_time_ns() - cpu0  # its CPU time in the loop
    w[STOP + 1 + idx] = n
    del w
    shm.close()
    if what != "mp":
        (t if what == "table" else lk).close()


#: the segments this run made (each must be gone at its end)
MADE: list[str] = []


def _make(cfg: tuple) -> tuple[Any, int | None, Any]:
    """(the lock object the workers share, the segment's size in stripes, its closer)."""
    if cfg[0] == "one":
        lk = shmlocks.FutexMutex()
        MADE.append(lk.name)
        return lk, None, lk.close
    if cfg[0] == "table":
        t = shmlocks.LockTable(cfg[2], cfg[1])
        MADE.append(t.name)
        return t, cfg[2], t.close
    ctx = mp.get_context("fork")
    return [ctx.Lock() for _ in range(cfg[1])], None, lambda: None


def _resident(name: str) -> int:
    try:
        return os.stat(os.path.join("/dev/shm", name)).st_blocks * 512
    except OSError:
        return 0


def measure(cfg: tuple, procs: int, seconds: float) -> dict[str, Any]:
    """One cell: ``procs`` forked workers for ``seconds``."""
    ctx = mp.get_context("fork")
    obj, stripes, close = _make(cfg)
    shm = shared_memory.SharedMemory(create=True, size=8 * (KEYS + 1 + 2 * procs))
    w = shm.buf.cast("Q")
    try:
        for i in range(KEYS + 1 + 2 * procs):
            w[i] = 0
        start = ctx.Barrier(procs + 1)
        ps = [
            ctx.Process(
                target=_worker, args=(cfg, obj, shm.name, i, 1000 * procs + i, start, procs)
            )
            for i in range(procs)
        ]
        for p in ps:
            p.start()
        start.wait(60)
        t0 = time.perf_counter()
        time.sleep(seconds)
        w[STOP] = 1
        t1 = time.perf_counter()
        for p in ps:
            p.join(60)
            if p.exitcode != 0:
                raise RuntimeError(f"{label(cfg)} x{procs}: a worker failed ({p.exitcode})")
        counts = [w[STOP + 1 + i] for i in range(procs)]
        cpu_s = sum(w[STOP + 1 + procs + i] for i in range(procs)) / 1e9
        total = sum(counts)
        exact = sum(w[:KEYS]) == total
        per_stripe = None
        if cfg[0] == "table":
            per_stripe = _resident(obj.name) / stripes
        elif cfg[0] == "one":
            per_stripe = _resident(obj.name)
        else:
            per_stripe = SEM_T
    finally:
        del w
        shm.close()
        shm.unlink()
        close()
    el = t1 - t0
    return {
        "ops_per_s": total / el,
        # the CPUs the machine gave the workers (their CPU time over the cell's time): with
        # less than one, sections never run in parallel, and one lock serializes nothing
        "cpus": cpu_s / el,
        "cpu_ns_per_op": cpu_s * 1e9 / total if total else 0.0,
        "jain": jain(counts),
        "exact": exact,
        "counts": counts,
        "bytes_per_stripe": per_stripe,
    }


def label(cfg: tuple) -> str:
    if cfg[0] == "one":
        return "one lock (futex)"
    if cfg[0] == "table":
        return f"table {cfg[1]}"
    return "multiprocessing.Lock list"


def configs(sizes: list[int], kinds: list[str]) -> list[tuple]:
    out: list[tuple] = [("one",)]
    for k in kinds:
        out += [("table", k, n) for n in sizes]
    out += [("mp", n) for n in sizes]
    return out


def micro(reps: int = 100, number: int = 20_000) -> dict[str, float]:
    """In one process: index_of of a 32-byte str, and with lock_for(key) vs with lock (ns).

    Each statement's best of ``reps`` short runs of ``number`` calls, the statements taking
    turns run by run, timed in the process's CPU time: on a shared machine a run in which
    another process took the CPU then counts only what this one ran (the cache it found
    cold included), and a long run of one statement cannot meet the quiet spell that a
    run of the other had."""
    t = shmlocks.LockTable(64, "futex")
    lk = shmlocks.FutexMutex()
    MADE.extend((t.name, lk.name))
    try:
        key = "k" * 32
        t.lock_for(key)  # its stripe object made
        g = {"t": t, "lk": lk, "key": key, "index_of": t.index_of, "lock_for": t.lock_for}

        stmts = {
            "index_of_ns": "index_of(key)",
            "call_floor_ns": "len(key)",
            "with_lock_ns": "with lk: pass",
            "with_lock_for_ns": "with lock_for(key): pass",
        }
        timers = {k: timeit.Timer(v, globals=g, timer=time.process_time) for k, v in stmts.items()}
        out = dict.fromkeys(stmts, float("inf"))
        for _ in range(reps):
            for k, t_ in timers.items():
                out[k] = min(out[k], t_.timeit(number) / number * 1e9)
        out["lock_for_ratio"] = out["with_lock_for_ns"] / out["with_lock_ns"]
        return out
    finally:
        t.close()
        lk.close()


def run(
    cfgs: list[tuple], procs: list[int], seconds: float, repeats: int
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    raw: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for cfg in cfgs:  # the rows in the order of cfgs, whatever order the cells ran in
        raw.setdefault(label(cfg), {}).setdefault(str(1 if cfg[0] == "one" else cfg[-1]), {})
    k = 0
    for r in range(repeats):
        for p in procs:
            # a fresh order each round (seeded: the same on every run), so that the drift of
            # a shared machine's load falls on every configuration alike, not always on the
            # ones that come late in a fixed order
            order = list(cfgs)
            random.Random(k).shuffle(order)
            k += 1
            for cfg in order:
                name = label(cfg)
                size = 1 if cfg[0] == "one" else cfg[-1]
                log(f"round {r + 1}/{repeats}: {name} N={size} P={p}")
                try:
                    res = measure(cfg, p, seconds)
                except Exception as e:  # report, go on, exit 1
                    problems.append(f"{name} N={size} P={p}: {type(e).__name__}: {e}")
                    continue
                if not res["exact"]:
                    problems.append(f"{name} N={size} P={p}: the counters do not add up")
                cell = raw.setdefault(name, {}).setdefault(str(size), {}).setdefault(str(p), [])
                cell.append(res)
    return raw, problems


def summarize(raw: dict[str, dict[str, Any]]) -> dict[str, dict[int, dict[int, dict]]]:
    s: dict[str, dict[int, dict[int, dict]]] = {}
    for name, sizes in raw.items():
        for size, ps in sizes.items():
            for p, rs in ps.items():
                s.setdefault(name, {}).setdefault(int(size), {})[int(p)] = {
                    "ops_per_s": statistics.median(r["ops_per_s"] for r in rs),
                    "cpus": statistics.median(r["cpus"] for r in rs),
                    "cpu_ns_per_op": statistics.median(r["cpu_ns_per_op"] for r in rs),
                    "jain": min(r["jain"] for r in rs),
                    "bytes_per_stripe": max(r["bytes_per_stripe"] or 0 for r in rs),
                }
    return s


def markdown(s: dict, procs: list[int], mic: dict[str, float] | None, head: str) -> str:
    one = s.get("one lock (futex)", {}).get(1, {})
    lines = [head, ""]
    cols = " | ".join(f"P={p}" for p in procs)
    lines.append(f"| locks | N | bytes/stripe | {cols} |")
    lines.append("|---|---|---|" + "---|" * len(procs))
    for name, sizes in s.items():
        for size in sorted(sizes):
            cells = sizes[size]
            bps = max(c["bytes_per_stripe"] for c in cells.values())
            row = []
            for p in procs:
                c = cells.get(p)
                if c is None:
                    row.append("-")
                    continue
                base = one.get(p, {}).get("ops_per_s")
                ratio = f" {c['ops_per_s'] / base:.2f}x" if base else ""
                row.append(
                    f"{c['ops_per_s'] / 1e3:.0f}k{ratio} J {c['jain']:.3f} ({c['cpus']:.1f} CPUs)"
                )
            lines.append(f"| {name} | {size} | {bps:,.0f} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        "Each cell: sections/s (median of the repeats), its ratio to one lock at that P, J: "
        "Jain's index over the per-worker counts (the lowest of the repeats), and the CPUs "
        "the machine gave the workers (their CPU time over the cell's time, median). With "
        "fewer than 2 CPUs given, sections rarely run in parallel: one lock then serializes "
        "little, and no number of stripes can beat it by much. bytes/stripe: the segment's "
        "resident bytes over its stripes after the run (one lock: its segment; "
        "multiprocessing.Lock: a sem_t)."
    )
    if mic:
        lines += [
            "",
            f"- index_of of a 32-byte str: {mic['index_of_ns']:.0f} ns (a call to len(): "
            f"{mic['call_floor_ns']:.0f} ns; bar <= 100 ns)",
            f"- `with table.lock_for(key):` {mic['with_lock_for_ns']:.0f} ns against "
            f"`with lock:` {mic['with_lock_ns']:.0f} ns: {mic['lock_for_ratio']:.2f}x "
            "(bar <= 1.3x)",
        ]
    for name, sizes in s.items():
        if name.startswith("table") and len(sizes) >= 2:
            lo, hi = min(sizes), max(sizes)
            b_lo = max(c["bytes_per_stripe"] for c in sizes[lo].values()) * lo
            b_hi = max(c["bytes_per_stripe"] for c in sizes[hi].values()) * hi
            lines.append(
                f"- {name}: {(b_hi - b_lo) / (hi - lo):,.0f} bytes per added stripe "
                f"(N={lo} to N={hi}, resident)"
            )
    for kind in KINDS:
        c64 = s.get(f"table {kind}", {}).get(64, {}).get(4)
        base = one.get(4, {}).get("ops_per_s")
        if c64 and base:
            r = c64["ops_per_s"] / base
            cpus = min(c64["cpus"], one[4]["cpus"])
            verdict = "met" if r >= 1.5 else "NOT met"
            if cpus < CPUS_FOR_BAR:
                verdict += (
                    f", but not a measure of sharding: the workers got {cpus:.1f} CPUs "
                    f"(fewer than {CPUS_FOR_BAR:g}; see --autogroup-nice)"
                )
            lines.append(
                f"- {kind} table of 64 stripes at P=4: {r:.2f}x one lock (bar >= 1.5x): " + verdict
            )
    return "\n".join(lines)


def plot(s: dict, procs: list[int], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not importable (pip install 'shmlocks[bench]')"
    fig, axes = plt.subplots(1, len(procs), figsize=(5 * len(procs), 4), squeeze=False)
    one = s.get("one lock (futex)", {}).get(1, {})
    for ax, p in zip(axes[0], procs, strict=True):
        for name, sizes in s.items():
            if name.startswith("one"):
                continue
            xs = [n for n in sorted(sizes) if p in sizes[n]]
            ax.plot(xs, [sizes[n][p]["ops_per_s"] for n in xs], "-o", label=name)
        if p in one:
            ax.axhline(one[p]["ops_per_s"], color="grey", linestyle=":", label="one lock")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("stripes (N)")
        ax.set_ylabel("sections / s")
        ax.set_title(f"P={p}")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.suptitle(f"random-key read-modify-writes over {KEYS:,} keys, {os.cpu_count()} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/sharding.py", description=__doc__.split("\n")[0])
    p.add_argument("--procs", default=",".join(map(str, PROCS)), help="worker counts")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="stripes of the tables")
    p.add_argument("--kinds", default=",".join(KINDS), help="the tables' kinds")
    p.add_argument("--seconds", type=float, default=1.0, help="each cell's run (default 1)")
    p.add_argument("--repeats", type=int, default=1, help="runs per cell (default 1)")
    p.add_argument("--plot", metavar="FILE", help="write ops/s against N (a PNG)")
    p.add_argument("--json", metavar="FILE", help="write the raw figures")
    p.add_argument("--out", metavar="DIR", help="sharding.md, .json and .png there")
    p.add_argument(
        "--work-us",
        type=float,
        default=0.0,
        help="µs of work (a spin) inside each section (default 0: the increment only)",
    )
    p.add_argument("--autogroup-nice", type=int, metavar="N", help=AUTOGROUP_HELP)
    p.add_argument("--smoke", action="store_true", help="P = 2, N = 4, 64, 0.05 s: every path")
    return p.parse_args([a for a in (sys.argv[1:] if argv is None else argv) if a != "--"])


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    procs = [int(x) for x in a.procs.split(",") if x.strip()]
    sizes = [int(x) for x in a.sizes.split(",") if x.strip()]
    kinds = [x.strip() for x in a.kinds.split(",") if x.strip()]
    seconds, reps = a.seconds, a.repeats
    if a.autogroup_nice is not None:
        own_autogroup(a.autogroup_nice, log)
    global WORK_NS
    WORK_NS = int(a.work_us * 1000)
    if a.smoke:
        procs, sizes, seconds, reps = [2], [4, 64], 0.05, 1
    raw, problems = run(configs(sizes, kinds), procs, seconds, reps)
    mic = micro(reps=5 if a.smoke else 100)
    left = [n for n in MADE if os.path.exists(os.path.join("/dev/shm", n))]
    if left:
        problems.append(f"left behind: {left}")
    s = summarize(raw)
    head = (
        f"## Sharding: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
        f"{seconds} s a cell, {reps} repeat(s), {KEYS:,} keys, "
        f"{a.work_us:g} µs of work in a section"
        + (f", autogroup nice {a.autogroup_nice}" if a.autogroup_nice is not None else "")
    )
    md = markdown(s, procs, mic, head)
    if problems:
        md += "\n\nProblems:\n" + "\n".join(f"- {p}" for p in problems)
    plot_path, json_path = a.plot, a.json
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        plot_path = plot_path or os.path.join(a.out, "sharding.png")
        json_path = json_path or os.path.join(a.out, "sharding.json")
        with open(os.path.join(a.out, "sharding.md"), "w") as f:
            f.write(md + "\n")
    if plot_path:
        note = plot(s, procs, plot_path)
        if note:
            md += "\n\n" + note
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"raw": raw, "micro": mic, "problems": problems}, f, indent=1)
    print(md)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
