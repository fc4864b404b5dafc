"""shmlocks benchmark suite: every kind beside the locks a user would otherwise pick.

    python bench/run.py            quick run (about a minute)
    python bench/run.py --full     the complete run (several minutes)
    python bench/run.py --smoke    a few seconds: every code path, for CI
    python -m shmlocks bench [--full] [--out DIR] [--json]
    python bench/run.py --oversubscribed [...]   bench/oversubscribed.py (P = 1, 2, 3, 4, 8)
    python bench/run.py --sharding [...]         bench/sharding.py (one lock vs lock tables)
    python bench/run.py --deadlock-scale [...]   bench/deadlock_scale.py (detection at scale)
    python bench/run.py --cli-scale [...]        bench/cli_scale.py (ls, top ... at scale)

Measures, in one run, for the six shmlocks kinds and the anchors threading.Lock (the
in-process floor, measured with threads), multiprocessing.Lock, posix_ipc.Semaphore and
fcntl.flock:

  1. uncontended acquire()+release() and ``with lock:`` (pyperf)      uncontended.py
  2. contended throughput, fairness and exclusion, P workers          contended.py
  3. hand-off latency through the lock, with 0, ~1 and ~10 us inside  handoff.py
  4. owner death: SIGKILL of the holder to a waiter's acquisition,     owner_death.py
     20 deaths per lock in quick and full runs (median, p90, max)
  5. idle cost: a blocked waiter's wake-ups/s, and the speed of a       idle_cost.py
     CPU-bound thread beside it

(the locks come from adapters.py, one factory per name; report.py turns the raw figures
into tables, targets, plots and JSON) and writes, to bench/results/<YYYYmmdd-HHMMSS>/ (or --out DIR): results.md (the machine,
tables of medians with min-max and ratios to multiprocessing.Lock from the same run, the
issue's targets, met or not), results.json (every raw figure), pyperf.json (pyperf's own
output), and throughput.png / handoff.png when matplotlib is importable. The markdown is
printed to stdout (with --json: results.json's object is, and the markdown goes to stderr);
progress goes to stderr.

Repeats are interleaved (round r of every lock, then round r+1, each round starting at
the next lock), so slow drift on a busy machine spreads over all locks rather than landing
on one. Nothing is pinned.

Exit status: 0, or 1 if any measurement failed, any exclusion check failed, or the run
left a segment, semaphore or file behind (2 for a usage error). Targets not met do not
change the exit status: they are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import adapters
import contended
import handoff
import idle_cost
import owner_death
import report
import uncontended
from common import BenchError, Mode, cpu_snapshot

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CORES = os.cpu_count() or 1
REF = adapters.REFERENCE
#: how long a waiter is left to block before its wake-ups are counted (past its spin and
#: yield phases, with room for a loaded machine)
IDLE_SETTLE_S = 0.2


def _procs(*ps: int) -> tuple[int, ...]:
    return tuple(sorted(set(ps)))


CS = (0, 1000, 10000)
MODES = {
    "smoke": Mode(
        "smoke", _procs(1, 2, 2 * CORES), 0.03, 0.03, CS, 1, 1, 2, 0.02, 0.05, 120, 0.1, 1
    ),
    "quick": Mode(
        "quick", _procs(1, 2, 2 * CORES), 0.2, 0.1, CS, 3, 5, 20, 0.05, 0.25, 300, 1.0, 1
    ),
    "full": Mode(
        "full",
        _procs(1, 2, CORES, CORES + 1, 2 * CORES, 4 * CORES),
        0.5,
        0.4,
        CS,
        5,
        9,
        20,
        0.1,
        1.0,
        3600,
        2.0,
        3,
    ),
}


def rotated(xs: Sequence[str], r: int) -> list[str]:
    """Round r starts at a different lock, so no lock always follows the same neighbour."""
    k = r % len(xs) if xs else 0
    return list(xs[k:]) + list(xs[:k])


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ==========================================================================================
# orchestration


class Run:
    def __init__(self, mode: Mode, locks: Sequence[str], out: Path) -> None:
        self.mode = mode
        self.locks = list(locks)
        self.out = out
        self.tag = adapters.new_tag()
        self.problems: list[str] = []
        self.raw: dict[str, Any] = {
            "uncontended": {},
            "contended": {},
            "handoff": {},
            "owner_death": {},
            "idle_cost": {},
        }

    def problem(self, msg: str) -> None:
        self.problems.append(msg)
        log("PROBLEM: " + msg)

    def attempt(self, what: str, name: str, fn: Callable[[adapters.Adapter], Any]) -> Any:
        """fn(a fresh lock called name); the lock is closed whatever happens."""
        a = None
        try:
            a = adapters.make(name, self.tag)
            return fn(a)
        except BenchError as e:
            self.problem(f"{what}: {e}")
        except Exception as e:  # a bench bug or a lock raising: report, go on, exit 1
            self.problem(f"{what}: {type(e).__name__}: {e}")
            traceback.print_exc(file=sys.stderr)
        finally:
            if a is not None:
                try:
                    a.close()
                except Exception as e:
                    self.problem(f"{what}: close failed: {type(e).__name__}: {e}")
        return None

    def all(self) -> None:
        t0 = time.monotonic()
        self.self_check()
        self.uncontended()
        self.contended()
        self.handoff()
        self.owner_death()
        self.idle_cost()
        self.raw["seconds"] = time.monotonic() - t0

    def self_check(self) -> None:
        """The exclusion check must be able to fail: run a lock that does not lock (two
        processes, short runs, at most ~2 s) until the check catches it."""
        log("self-check: the exclusion check must catch a lock that does not lock")
        deadline = time.monotonic() + 2.0
        runs = 0
        while time.monotonic() < deadline:
            out = self.attempt(
                "self-check", adapters.BROKEN, lambda a: contended.measure(a, 2, 0.05)
            )
            if out is None:
                return
            runs += 1
            if not out["exclusion_ok"]:
                self.raw["self_check"] = {
                    "caught": True,
                    "runs": runs,
                    "counter": out["counter"],
                    "sum": out["ops"],
                }
                return
        self.raw["self_check"] = {"caught": False, "runs": runs}
        self.problem(
            f"self-check: {runs} runs of a no-op lock never broke the counter: the "
            "exclusion check cannot be trusted"
        )

    def uncontended(self) -> None:
        try:
            self.raw["uncontended"] = uncontended.measure(
                self.mode.name,
                self.locks,
                self.tag,
                self.out / "pyperf.json",
                self.out / "pyperf.log",
                self.mode.pyperf_timeout_s,
                progress=log,
            )
        except Exception as e:
            self.problem(f"uncontended (pyperf): {e}")

    def contended(self) -> None:
        m = self.mode
        res = self.raw["contended"]
        for r in range(m.repeats):
            for p in m.procs:
                log(f"contended: round {r + 1}/{m.repeats}, {p} worker(s), {m.contended_s} s each")
                for name in rotated(self.locks, r):
                    self.record(
                        res,
                        name,
                        str(p),
                        f"contended {name} x{p}",
                        lambda a, p=p: contended.measure(a, p, m.contended_s),
                        lambda out, name=name, p=p: (
                            f"{name} x{p}: counter {out['counter']} != sum of counts {out['ops']}"
                        ),
                        lambda out, name=name, p=p: (
                            f"{name} x{p}: stats() acquisitions "
                            f"{out['lock_stats']['acquisitions']} != {out['ops']} sections"
                        ),
                    )

    def record(
        self,
        res: dict,
        name: str,
        key: str,
        what: str,
        measure: Callable[[Any], dict],
        violation: Callable[[dict], str],
        miscount: Callable[[dict], str],
    ) -> None:
        """One measurement of one lock, kept under res[name][key]. A run whose own
        exclusion check failed (``violation(out)`` says how), or whose lock counters do not
        follow what it did (``miscount(out)``), is a problem."""
        out = self.attempt(what, name, measure)
        if out is None:
            return
        res.setdefault(name, {}).setdefault(key, []).append(out)
        if not out["exclusion_ok"]:
            self.problem(f"EXCLUSION VIOLATED: {violation(out)}")
        if out["stats_match"] is False:
            self.problem(f"LOCK COUNTERS WRONG: {miscount(out)}")

    def handoff(self) -> None:
        m = self.mode
        res = self.raw["handoff"]
        floor = self.raw.setdefault("handoff_floor", [])
        for r in range(m.handoff_repeats):
            # The harness floor: the same loop with a lock that does nothing. The turn word
            # has one writer at a time (whoever holds the turn), so it still ping-pongs.
            out = self.attempt(
                "hand-off floor", adapters.BROKEN, lambda a: handoff.measure(a, m.handoff_s, 0)
            )
            if out is not None:
                floor.append(out)
            for cs in m.cs_ns:
                log(f"hand-off: round {r + 1}/{m.handoff_repeats}, critical section {cs} ns")
                for name in rotated(self.locks, r):
                    self.record(
                        res,
                        name,
                        str(cs),
                        f"hand-off {name} cs={cs}ns",
                        lambda a, cs=cs: handoff.measure(a, m.handoff_s, cs),
                        lambda out, name=name, cs=cs: (
                            f"{name} hand-off cs={cs}: turn flips {out['flips']} differ by "
                            "more than one"
                        ),
                        lambda out, name=name, cs=cs: (
                            f"{name} hand-off cs={cs}: stats() {out['lock_stats']} cannot "
                            f"follow flips {out['flips']}"
                        ),
                    )

    def owner_death(self) -> None:
        m = self.mode
        log("owner death: SIGKILL the holder, time the blocked waiter's acquisition")
        res = self.raw["owner_death"]
        for name in self.locks:
            for _ in range(m.death_repeats):
                out = self.attempt(
                    f"owner death {name}",
                    name,
                    lambda a: owner_death.measure(a, m.settle_s, m.wedge_s),
                )
                if out is None:
                    break
                res.setdefault(name, []).append(out)
                if (
                    out["outcome"] == "recovered"
                    and name in adapters.KINDS
                    and not out["owner_died"]
                ):
                    self.problem(f"owner death {name}: recovered but owner_died was False")
                if out["outcome"] != "recovered":
                    break  # a wedge (or n/a) is the same every time: once is enough

    def idle_cost(self) -> None:
        m = self.mode
        log(
            f"idle cost: a waiter blocked behind a live holder, {m.idle_s} s per count, "
            f"{m.idle_runs} counting run(s) each way"
        )
        res = self.raw["idle_cost"]
        smoke = m.name == "smoke"
        # a smoke run: a short settle, and a deadlock timeout of 0.1 s (not the default)
        args = (0.05 if smoke else IDLE_SETTLE_S, m.idle_s, m.idle_runs, 0.1 if smoke else 1.0)
        for name in self.locks:
            if name not in idle_cost.LOCKS:
                continue
            out = self.attempt(
                f"idle cost {name}",
                name,
                lambda a: idle_cost.measure(a, *args),
            )
            if out is not None:
                res[name] = out

    def check_leftovers(self) -> None:
        left = adapters.leftovers(self.tag)
        if left:
            self.problem(f"the run left {len(left)} name(s) behind: {left}")
            for path in left:
                try:
                    os.unlink(path)
                except OSError as e:
                    self.problem(f"could not remove {path}: {e}")


def default_out(mode: Mode) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if mode.name == "smoke":
        return RESULTS / "tmp" / f"smoke-{stamp}"  # git-ignored: CI runs leave no record
    return RESULTS / stamp


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/run.py", description="shmlocks benchmarks beside the usual anchors"
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--full", action="store_true", help="the complete run (several minutes)")
    g.add_argument("--smoke", action="store_true", help="a few seconds: every path, for CI")
    p.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        help="output directory (default bench/results/<YYYYmmdd-HHMMSS>/)",
    )
    p.add_argument(
        "--repeats",
        metavar="N",
        type=int,
        help="runs per contended and hand-off cell (default: by mode)",
    )
    p.add_argument(
        "--locks",
        metavar="A,B",
        help=f"only these locks (multiprocessing.Lock is always added); from "
        f"{', '.join(adapters.NAMES)}",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results (results.json's object) to stdout, the markdown to stderr",
    )
    # no positional arguments here, so a "--" (`shmlocks bench --out D -- --smoke` passes
    # its separator through) means nothing: drop it
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--"]
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--oversubscribed" in argv:
        # oversubscribed.py's own run (P = 1, 2, 3, 4, 8): its options follow; a --json
        # without a file, from `shmlocks bench --json`, means nothing there
        import oversubscribed

        rest = [a for a in argv if a not in ("--oversubscribed", "--", "--full")]
        return oversubscribed.main(
            [
                a
                for i, a in enumerate(rest)
                if a != "--json" or i + 1 < len(rest) and not rest[i + 1].startswith("-")
            ]
        )
    if "--sharding" in argv:
        # sharding.py's own run (one lock against lock tables, issue 39): its options follow
        import sharding

        rest = [a for a in argv if a not in ("--sharding", "--", "--full")]
        return sharding.main(
            [
                a
                for i, a in enumerate(rest)
                if a != "--json" or i + 1 < len(rest) and not rest[i + 1].startswith("-")
            ]
        )
    if "--cli-scale" in argv:
        # cli_scale.py's own run (issue 38: ls, deadlocks, inspect, top at 10,000 segments)
        import cli_scale

        return cli_scale.main([a for a in argv if a not in ("--cli-scale", "--")])
    if "--deadlock-scale" in argv:
        # deadlock_scale.py's own run (issue 38: waiting and detecting with many segments)
        import deadlock_scale

        return deadlock_scale.main([a for a in argv if a not in ("--deadlock-scale", "--")])
    args = parse_args(argv)
    mode = MODES["full" if args.full else "smoke" if args.smoke else "quick"]
    if args.repeats is not None:
        if args.repeats < 1:
            print("bench/run.py: error: --repeats must be at least 1", file=sys.stderr)
            return 2
        mode = replace(mode, repeats=args.repeats, handoff_repeats=args.repeats)
    locks = list(adapters.NAMES)
    if args.locks:
        want = [x.strip() for x in args.locks.split(",") if x.strip()]
        bad = [x for x in want if x not in adapters.NAMES]
        if bad:
            print(
                f"bench/run.py: error: unknown lock(s) {bad}; choose from "
                f"{', '.join(adapters.NAMES)}",
                file=sys.stderr,
            )
            return 2
        locks = [n for n in adapters.NAMES if n in want or n == REF]
    out = (args.out or default_out(mode)).resolve()
    out.mkdir(parents=True, exist_ok=True)

    mach = report.machine()
    snap = cpu_snapshot()
    run = Run(mode, locks, out)
    log(f"{mode.name} run, {len(locks)} locks, output in {out}")
    interrupted = False
    try:
        run.all()
    except KeyboardInterrupt:
        interrupted = True
        run.problem("interrupted (Ctrl-C): partial results")
    finally:
        run.check_leftovers()
        mach["load_average_end"] = list(os.getloadavg())
        end = cpu_snapshot()
        wall = end[2] - snap[2]
        if wall > 0:
            # CPUs kept busy, on average, by this run and by everything else on the machine
            mach["cpus_busy_ours"] = (end[1] - snap[1]) / wall
            mach["cpus_busy_others"] = max(0.0, (end[0] - snap[0]) / wall - mach["cpus_busy_ours"])

    s = report.summarize(run.raw, mode)
    targets = report.check_targets(s, mode)
    notes: list[str] = []
    try:
        notes += report.plots(s, mode, out)
    except Exception as e:
        run.problem(f"plots: {type(e).__name__}: {e}")
    md = report.markdown(
        mode,
        mach,
        s,
        targets,
        run.problems,
        notes,
        run.raw.get("seconds", 0.0),
        run.raw.get("self_check"),
    )
    (out / "results.md").write_text(md + "\n")
    doc = {
        "mode": asdict(mode),
        "machine": mach,
        "locks": locks,
        "reference": REF,
        "raw": run.raw,
        "summary": s,
        "targets": targets,
        "problems": run.problems,
        "notes": notes,
        "files": sorted({p.name for p in out.iterdir()} | {"results.json"}),
    }
    text = json.dumps(report.jsonable(doc), indent=1)
    (out / "results.json").write_text(text + "\n")
    if args.json:  # one JSON object for scripts on stdout; the report for people on stderr
        print(md, file=sys.stderr)
        print(text, flush=True)
    else:
        print(md)
    log(f"wrote {out}")
    if interrupted:
        return 130
    return 1 if run.problems else 0


if __name__ == "__main__":
    sys.exit(main())
