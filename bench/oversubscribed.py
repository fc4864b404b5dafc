"""Oversubscription: contended throughput and fairness as the workers outnumber the CPUs.

    python bench/oversubscribed.py                      P = 1,2,3,4,8, 2 s a cell, every lock
    python bench/oversubscribed.py --seconds 0.3 --procs 2,4 --locks ticket,futex
    python -m shmlocks bench [--out DIR] -- --oversubscribed [--seconds S] [--procs ...]

P workers (processes) loop {acquire; counter += 1; release} for ``--seconds`` (the loop of
contended.py, with its exclusion check), for P = 1, 2, 3, 4, 8 by default, every kind
beside multiprocessing.Lock and posix_ipc.Semaphore, in one run: cells interleaved (all the
locks at one P, then the next P, each round of ``--repeats`` starting at another lock), so
the machine's drift spreads over every lock. Reports, per lock and P: ops/s (median of the
repeats), the ratio to the lock's own P=2 and to multiprocessing.Lock at the same P, and
Jain's fairness index over the per-worker counts (the lowest of the repeats). ``--plot F``
writes ops/s against P (needs matplotlib); ``--json F`` the raw figures; ``--out DIR`` all
three (oversubscribed.md, .json, .png).

On a shared machine the absolute figures move with the neighbours' load; the ratios within
one run are the figures to read (issue 40's bars: ticket, mcs and clh at P=4 and P=8 at
least 0.8x their own P=2 and 1.5x multiprocessing.Lock, Jain at least 0.95). Exit status:
0, or 1 if a measurement or an exclusion check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence

import adapters
import contended
from common import AUTOGROUP_HELP, BenchError, own_autogroup

PROCS = (1, 2, 3, 4, 8)
ANCHORS = ("multiprocessing.Lock", "posix_ipc.Semaphore")
FIFO = ("ticket", "mcs", "clh")


def log(msg: str) -> None:
    print(f"[oversubscribed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(
    locks: Sequence[str], procs: Sequence[int], seconds: float, repeats: int
) -> tuple[dict[str, dict[int, list[dict]]], list[str], list[str]]:
    """Every (lock, P) cell ``repeats`` times, interleaved: the raw results, the problems
    (a failed measurement or exclusion check, a leftover) and notes (a lock skipped)."""
    tag = adapters.new_tag()
    raw: dict[str, dict[int, list[dict]]] = {n: {p: [] for p in procs} for n in locks}
    problems: list[str] = []
    notes: set[str] = set()
    k = 0
    for r in range(repeats):
        for p in procs:
            order = list(locks[k % len(locks) :]) + list(locks[: k % len(locks)])
            k += 1
            for name in order:
                log(f"round {r + 1}/{repeats}: {name} x{p}")
                try:
                    a = adapters.make(name, tag)
                except Exception as e:  # not installed (posix_ipc): a note, not a failure
                    notes.add(f"{name} skipped: {type(e).__name__}: {e}")
                    continue
                try:
                    res = contended.measure(a, p, seconds)
                except BenchError as e:
                    problems.append(f"{name} x{p}: {e}")
                    continue
                finally:
                    a.close()
                if not res["exclusion_ok"]:
                    problems.append(f"{name} x{p}: the exclusion check failed")
                raw[name][p].append(res)
    left = adapters.leftovers(tag)
    if left:
        problems.append(f"left behind: {left}")
    return raw, problems, sorted(notes)


def summarize(raw: dict[str, dict[int, list[dict]]]) -> dict[str, dict[int, dict[str, float]]]:
    s: dict[str, dict[int, dict[str, float]]] = {}
    for name, cells in raw.items():
        for p, rs in cells.items():
            if not rs:
                continue
            s.setdefault(name, {})[p] = {
                "ops_per_s": statistics.median(r["ops_per_s"] for r in rs),
                "jain": min(r["jain"] for r in rs),
                "max_min": max(r["max_min"] for r in rs),
                "runs": len(rs),
            }
    ref = s.get(adapters.REFERENCE, {})
    for cells in s.values():
        base = cells.get(2, {}).get("ops_per_s")
        for p, c in cells.items():
            c["vs_p2"] = c["ops_per_s"] / base if base else float("nan")
            r = ref.get(p, {}).get("ops_per_s")
            c["vs_mp"] = c["ops_per_s"] / r if r else float("nan")
    return s


def markdown(s: dict[str, dict[int, dict[str, float]]], procs: Sequence[int], head: str) -> str:
    lines = [head, ""]
    cols = " | ".join(f"P={p}" for p in procs)
    lines.append(f"| lock | {cols} |")
    lines.append("|---|" + "---|" * len(procs))
    for name, cells in s.items():
        row = []
        for p in procs:
            c = cells.get(p)
            if c is None:
                row.append("-")
                continue
            row.append(
                f"{c['ops_per_s'] / 1e3:.0f}k ({c['vs_p2']:.2f} / {c['vs_mp']:.2f}x, "
                f"J {c['jain']:.3f})"
            )
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        "Each cell: ops/s (median of the repeats) (ratio to the lock's own P=2 / to "
        "multiprocessing.Lock at that P, J: Jain's index over the per-worker counts, the "
        "lowest of the repeats)."
    )
    return "\n".join(lines)


def bars(s: dict[str, dict[int, dict[str, float]]]) -> list[str]:
    """Issue 40's bars for the FIFO kinds, met or not."""
    out = []
    for name in FIFO:
        cells = s.get(name, {})
        for p in (4, 8):
            c = cells.get(p)
            if c is None:
                continue
            ok = c["vs_p2"] >= 0.8 and c["vs_mp"] >= 1.5 and c["jain"] >= 0.95
            out.append(
                f"- {name} P={p}: {c['vs_p2']:.2f}x its P=2 (>= 0.8), {c['vs_mp']:.2f}x "
                f"multiprocessing.Lock (>= 1.5), Jain {c['jain']:.3f} (>= 0.95): "
                + ("met" if ok else "NOT met")
            )
    return out


def plot(s: dict[str, dict[int, dict[str, float]]], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not importable (pip install 'shmlocks[bench]')"
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, cells in s.items():
        ps = sorted(cells)
        kind = name in adapters.KINDS
        ax.plot(
            ps,
            [cells[p]["ops_per_s"] for p in ps],
            ("-" if kind else "--") + "o",
            label=name,
            linewidth=2 if kind else 1,
        )
    cores = os.cpu_count() or 1
    ax.axvline(cores, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("worker processes (P)")
    ax.set_ylabel("sections / s")
    ax.set_title(f"contended throughput as P outnumbers the {cores} CPUs")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/oversubscribed.py", description=__doc__.split("\n")[0])
    p.add_argument("--procs", default=",".join(map(str, PROCS)), help="worker counts")
    p.add_argument("--seconds", type=float, default=2.0, help="each cell's run (default 2)")
    p.add_argument("--repeats", type=int, default=1, help="runs per cell (default 1)")
    p.add_argument(
        "--locks",
        help="only these locks (multiprocessing.Lock is always added); default: every kind "
        f"and {', '.join(ANCHORS)}",
    )
    p.add_argument("--plot", metavar="FILE", help="write ops/s against P (a PNG)")
    p.add_argument("--json", metavar="FILE", help="write the raw figures")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write oversubscribed.md, oversubscribed.json and oversubscribed.png there",
    )
    p.add_argument("--autogroup-nice", type=int, metavar="N", help=AUTOGROUP_HELP)
    p.add_argument("--smoke", action="store_true", help="P = 1, 2, 3 for 0.05 s: every path")
    return p.parse_args([a for a in (sys.argv[1:] if argv is None else argv) if a != "--"])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.procs, args.seconds, args.repeats = "1,2,3", 0.05, 1
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        args.json = args.json or os.path.join(args.out, "oversubscribed.json")
        args.plot = args.plot or os.path.join(args.out, "oversubscribed.png")
    procs = sorted({int(x) for x in args.procs.split(",") if x.strip()})
    if not procs or procs[0] < 1 or args.repeats < 1 or args.seconds <= 0:
        print(
            "bench/oversubscribed.py: error: bad --procs, --repeats or --seconds", file=sys.stderr
        )
        return 2
    locks = list(adapters.KINDS) + list(ANCHORS)
    if args.locks:
        want = [x.strip() for x in args.locks.split(",") if x.strip()]
        bad = [x for x in want if x not in adapters.NAMES]
        if bad:
            print(f"bench/oversubscribed.py: error: unknown lock(s) {bad}", file=sys.stderr)
            return 2
        locks = [n for n in adapters.NAMES if n in want or n == adapters.REFERENCE]
    if args.autogroup_nice is not None:
        own_autogroup(args.autogroup_nice, log)
    raw, problems, notes = run(locks, procs, args.seconds, args.repeats)
    s = summarize(raw)
    head = (
        f"## Oversubscribed: {os.cpu_count()} CPUs, {args.seconds:g} s a cell, "
        f"{args.repeats} run(s), load average {os.getloadavg()[0]:.1f}"
        + (f", autogroup nice {args.autogroup_nice}" if args.autogroup_nice is not None else "")
    )
    md = markdown(s, procs, head)
    b = bars(s)
    if b:
        md += "\n\nIssue 40's bars (FIFO kinds):\n\n" + "\n".join(b)
    if args.plot:
        note = plot(s, args.plot)
        if note:
            md += "\n\n" + note
    if notes:
        md += "\n\n" + "\n".join(notes)
    if problems:
        md += "\n\nProblems:\n\n" + "\n".join(f"- {x}" for x in problems)
    print(md)
    if args.out:
        with open(os.path.join(args.out, "oversubscribed.md"), "w") as f:
            f.write(md + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "raw": raw, "problems": problems}, f, indent=1, default=str)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
