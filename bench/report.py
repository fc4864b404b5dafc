"""Reporting: summaries of the raw figures (medians of repeats with min-max), ratios to
multiprocessing.Lock from the same run, the issue's targets (met / not met), the machine
description, the markdown tables, the PNG plots (matplotlib, optional) and the JSON.

run.py measures and calls these; nothing here measures anything.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import adapters
import uncontended
from common import Mode, percentile, spread

import shmlocks

HERE = Path(__file__).resolve().parent
CORES = os.cpu_count() or 1
REF = adapters.REFERENCE
FIFO = tuple(k for k, c in shmlocks.KINDS.items() if c.fifo)
KERNEL_RECOVERED = tuple(
    k for k, c in shmlocks.KINDS.items() if c.recovery == "kernel"
)  # the registry's


# ==========================================================================================
# summaries: medians of repeats, with min-max, and ratios to multiprocessing.Lock


def summarize(raw: dict[str, Any], mode: Mode) -> dict[str, Any]:
    s: dict[str, Any] = {
        "uncontended": {},
        "contended": {},
        "handoff": {},
        "owner_death": {},
        "idle_cost": {},
    }
    fl = [r for r in raw.get("handoff_floor", []) if r["round_trips"] and r["had_two_cpus"]]
    s["handoff_floor_ns"] = spread([r["median_ns"] for r in fl]) if fl else None
    un = raw["uncontended"]
    loop = un.get(uncontended.LOOP, {}).get("median_ns")
    s["loop_overhead_ns"] = loop
    rounds = uncontended.PYPERF[mode.name][0]
    for name in adapters.NAMES:
        for form in uncontended.FORMS:
            b = un.get(uncontended.bench_name(name, form))
            if b:
                ref = un.get(uncontended.bench_name(REF, form))
                s["uncontended"].setdefault(name, {})[form] = {
                    "median": b["median_ns"],
                    "min": b["min_ns"],
                    "max": b["max_ns"],
                    "n": len(b["values_ns"]),
                    "corrected": (b["median_ns"] - loop) if loop is not None else None,
                    "paired": paired_ratio(b["values_ns"], ref and ref["values_ns"], rounds),
                }
    for name, byp in raw["contended"].items():
        for p, runs in byp.items():
            s["contended"].setdefault(name, {})[p] = {
                "ops_per_s": spread([r["ops_per_s"] for r in runs]),
                "jain": spread([r["jain"] for r in runs]),
                "max_min": spread([r["max_min"] for r in runs]),
                "exclusion_ok": all(r["exclusion_ok"] for r in runs),
                "cpus": spread([_cpus(r["usage"]) for r in runs]),
                "workers": runs[0]["workers"],
                **_counters(runs),
            }
    for name, bycs in raw["handoff"].items():
        for cs, all_runs in bycs.items():
            runs = [r for r in all_runs if r["round_trips"]]
            starved = [r for r in all_runs if not r["round_trips"]]
            two = [r for r in runs if r["had_two_cpus"]]
            s["handoff"].setdefault(name, {})[cs] = {
                # every run that completed a round trip, as measured
                "median_ns": spread([r["median_ns"] for r in runs]) if runs else None,
                "p99_ns": spread([r["p99_ns"] for r in runs]) if runs else None,
                "runs": len(all_runs),
                "one_cpu_runs": sum(1 for r in runs if not r["had_two_cpus"]),
                # runs in which the turn never came back: a round trip longer than the run
                "starved_runs": len(starved),
                # only the runs in which each worker had a CPU of its own: the hand-off proper
                "two_cpu": {
                    "median_ns": spread([r["median_ns"] for r in two]),
                    "p99_ns": spread([r["p99_ns"] for r in two]),
                    "runs": len(two),
                }
                if two
                else None,
                "round_trips": sum(r["round_trips"] for r in runs),
                "workers": all_runs[0]["workers"],
                **_counters(all_runs),
                "turns_per_s": spread([r["turns_per_s"] for r in all_runs if r.get("turns_per_s")])
                if any(r.get("turns_per_s") for r in all_runs)
                else None,
            }
    for name, runs in raw["owner_death"].items():
        rec = [r["recovery_ms"] for r in runs if r["outcome"] == "recovered"]
        s["owner_death"][name] = {
            "outcome": runs[-1]["outcome"],
            "recovery_ms": spread(rec) if rec else None,
            "recovery_p90_ms": percentile(sorted(rec), 90) if rec else None,
            "owner_died": any(r.get("owner_died") for r in runs),
            "timed_out_after_s": runs[-1].get("timed_out_after_s"),
        }
    for name, out in raw.get("idle_cost", {}).items():
        s["idle_cost"][name] = {k: v for k, v in out.items() if k != "runs"}
    return s


def _counters(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the runs' lock counters say (lock.stats(); None for locks that keep none):
    the % of acquisitions that waited, hand-offs/s, and whether every run's counters
    agreed with the harness's own count (``stats_match``)."""

    def sp(key: str) -> dict[str, float] | None:
        xs = [r[key] for r in runs if r.get(key) is not None]
        return spread(xs) if xs else None

    checked = [r["stats_match"] for r in runs if r.get("stats_match") is not None]
    return {
        "contended_pct": sp("contended_pct"),
        "handoffs_per_s": sp("handoffs_per_s"),
        "stats_match": all(checked) if checked else None,
    }


def _cpus(use: list[dict[str, int]]) -> float:
    """CPUs the workers kept busy: their CPU time over the run's wall time."""
    wall = max(u["wall_ns"] for u in use)
    return sum(u["cpu_ns"] for u in use) / wall if wall > 0 else math.nan


def ratio(x: float | None, ref: float | None) -> float | None:
    if x is None or ref is None or not ref or math.isnan(x) or math.isnan(ref):
        return None
    return x / ref


# ==========================================================================================
# targets (issue 4), each checked per lock against multiprocessing.Lock from the same run


def paired_ratio(vals: list[float], ref: list[float] | None, rounds: int) -> float | None:
    """The median over pyperf rounds of (this lock's median / mp.Lock's median) within the
    same round. The rounds interleave the locks in time, so a change in the machine's speed
    (the host's other load: threading.Lock's values span 2x in one run) cancels out."""
    if not ref or rounds < 1 or len(vals) != len(ref) or len(vals) % rounds:
        return None
    k = len(vals) // rounds
    return statistics.median(
        statistics.median(vals[i * k : (i + 1) * k]) / statistics.median(ref[i * k : (i + 1) * k])
        for i in range(rounds)
    )


def uncontended_ratio(f: dict[str, Any] | None, ref: dict[str, Any] | None) -> float | None:
    """The paired ratio when the rounds allow it, else the ratio of the medians."""
    if not f:
        return None
    if f.get("paired") is not None:
        return f["paired"]
    return ratio(f["median"], ref and ref.get("median"))


def check_targets(s: dict[str, Any], mode: Mode) -> list[dict[str, Any]]:
    """One entry per (target, kind): what was measured, what was wanted, met or not
    (None: not measured in this run)."""
    out: list[dict[str, Any]] = []

    def add(target: str, lock: str, value: str, want: str, met: bool | None) -> None:
        out.append({"target": target, "lock": lock, "value": value, "want": want, "met": met})

    un = s["uncontended"]
    for form, limit in (("acquire+release", 1.0), ("with", 0.6)):
        ref = un.get(REF, {}).get(form)
        t = (
            f"uncontended {'`with lock:`' if form == 'with' else 'acquire()+release()'}, "
            "time vs mp.Lock (paired by round)"
        )
        for k in adapters.KINDS:
            r = uncontended_ratio(un.get(k, {}).get(form), ref)
            add(t, k, _x(r), f"≤ {limit}×", None if r is None else r <= limit)

    def thr(p: int, k: str) -> tuple[float | None, float | None]:
        c = s["contended"].get(k, {}).get(str(p))
        ref = s["contended"].get(REF, {}).get(str(p))
        if not c or not ref:
            return None, None
        return ratio(c["ops_per_s"]["median"], ref["ops_per_s"]["median"]), c["jain"]["median"]

    def jtxt(j: float | None) -> str:
        return "" if j is None else f", Jain {j:.3f}"

    want2 = {"futex": (2.0, None), "robust": (2.0, None), "pi": (0.5, None)}
    for k in adapters.KINDS:
        limit, jl = want2.get(k, (1.5, 0.99))
        r, j = thr(2, k)
        met = None if r is None else (r >= limit and (jl is None or j >= jl))
        add(
            "contended, 2 processes: ops/s vs mp.Lock",
            k,
            _x(r) + (jtxt(j) if jl else ""),
            f"≥ {limit}×" + (f", Jain ≥ {jl}" if jl else ""),
            met,
        )

    over = 2 * CORES
    for k in adapters.KINDS:
        jl = 0.95 if k in FIFO else None
        r, j = thr(over, k)
        met = None if r is None else (r >= 0.25 and (jl is None or j >= jl))
        add(
            f"oversubscribed, {over} processes on {CORES} cores: ops/s vs mp.Lock",
            k,
            _x(r) + (jtxt(j) if jl else ""),
            "≥ 0.25×" + (f", Jain ≥ {jl}" if jl else ""),
            met,
        )

    def two_cpu(k: str) -> float | None:
        e = s["handoff"].get(k, {}).get("0")
        return e["two_cpu"]["median_ns"]["median"] if e and e["two_cpu"] else None

    ref = two_cpu(REF)
    fl = s.get("handoff_floor_ns")
    for k in adapters.KINDS:
        if k == "pi":
            continue
        r = ratio(two_cpu(k), ref)
        txt = _x(r)
        mine = two_cpu(k)
        if fl and mine is not None and ref is not None and ref > fl["median"]:
            # what the lock adds above the harness floor, against what mp.Lock adds
            txt += f" ({_x((mine - fl['median']) / (ref - fl['median']))} above the floor)"
        add(
            "hand-off round trip, no critical section, vs mp.Lock (runs not on one CPU)",
            k,
            txt,
            "≤ 0.3×",
            None if r is None else r <= 0.3,
        )

    for k in KERNEL_RECOVERED:  # issue 4's target was for the kernel-recovered kinds
        d = s["owner_death"].get(k)
        rec = d["recovery_ms"] if d else None
        t = "owner death: SIGKILL to the blocked waiter's acquisition"
        if rec is None:
            add(t, k, d["outcome"] if d else "not measured", "≤ 5 ms", None if not d else False)
        else:
            add(
                t,
                k,
                f"{rec['median']:.2f} ms (max {rec['max']:.2f})",
                "≤ 5 ms",
                rec["median"] <= 5.0,
            )

    # issue 27: waiting costs nothing (SPEC "Waiting costs nothing")
    for k in adapters.KINDS:
        d = s["owner_death"].get(k)
        rec = d["recovery_ms"] if d else None
        add(
            "owner death (issue 27): SIGKILL to the waiter's acquisition, median / max",
            k,
            f"{rec['median']:.2f} / {rec['max']:.2f} ms" if rec else "not measured",
            "≤ 0.3 / 2 ms",
            None if rec is None else rec["median"] <= 0.3 and rec["max"] <= 2.0,
        )
    for k in adapters.KINDS:
        e = s["idle_cost"].get(k)
        add(
            "a waiter blocked behind a live holder (issue 27): wake-ups, detection off",
            k,
            f"{e['wakeups']} in {e['seconds']:g} s" if e else "not measured",
            "≤ 1",
            None if e is None else e["wakeups"] <= 1,
        )
    for k in adapters.KINDS:
        e = s["idle_cost"].get(k)
        v = e and e.get("look_wakeups_per_s")
        add(
            "… after its deadlock timeout (issue 27): wake-ups/s",
            k,
            f"{v:.1f}/s" if v is not None else "not measured",
            "≤ 2.5/s",
            None if v is None else v <= 2.5,
        )
    for k in adapters.KINDS:
        e = s["idle_cost"].get(k)
        r = e and e.get("speed_ratio")
        add(
            "a CPU-bound thread beside a blocked waiter (issue 27): speed vs beside none",
            k,
            _x(r) if r else "not measured",
            "≥ 0.95×",
            None if not r else r >= 0.95,
        )
    return out


# ==========================================================================================
# the machine


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "Hardware", "Processor", "cpu model"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION") or "unknown"
    except (ValueError, OSError):
        glibc = " ".join(platform.libc_ver()) or "unknown"

    def version(mod: str) -> str | None:
        try:
            from importlib.metadata import version as v

            return v(mod)
        except Exception:
            return None

    try:
        commit = (
            subprocess.run(
                ["git", "-C", str(HERE.parent), "describe", "--always", "--dirty"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
            or None
        )
    except Exception:
        commit = None
    return {
        "cpu": cpu,
        "cores": CORES,
        "usable_cores": len(os.sched_getaffinity(0)),
        "machine": platform.machine(),
        "kernel": f"{platform.system()} {platform.release()} {platform.version()}",
        "glibc": glibc,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "shmlocks": shmlocks.__version__,
        "git": commit,
        "pyperf": version("pyperf"),
        "posix_ipc": version("posix_ipc"),
        "matplotlib": version("matplotlib"),
        "load_average": list(os.getloadavg()),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


# ==========================================================================================
# markdown


def _x(r: float | None) -> str:
    if r is None:
        return "–"
    if r < 0.1:
        return f"{r:.2g}×"
    return f"{r:,.0f}×" if r >= 100 else f"{r:.2f}×"


def _num(v: float, digits: int) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return f"{v:,.{digits}f}"


def _cell(sp: dict | None, scale: float = 1.0, digits: int = 1) -> str:
    if not sp or sp.get("n", 1) == 0 or sp["median"] is None:
        return "–"
    med, lo, hi = sp["median"] / scale, sp["min"] / scale, sp["max"] / scale
    if lo == hi:
        return _num(med, digits)
    return f"{_num(med, digits)} ({_num(lo, digits)}–{_num(hi, digits)})"


def _label(name: str, workers: str | None = None) -> str:
    return f"{name} (threads)" if name == "threading.Lock" and workers != "n/a" else name


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _measured(section: dict) -> Iterator[tuple[str, Any]]:
    """(name, figures) for each lock a section has figures for, in adapters.NAMES order."""
    for name in adapters.NAMES:
        figures = section.get(name)
        if figures:
            yield name, figures


def markdown(
    mode: Mode,
    mach: dict,
    s: dict,
    targets: list[dict],
    problems: list[str],
    notes: list[str],
    seconds: float,
    self_check: dict | None,
) -> str:
    """results.md: one function per section, in this order."""
    L = _header(mode, mach, seconds)
    L += _uncontended(mode, s)
    L += _contended(mode, s, self_check)
    L += _handoff(mode, s)
    L += _owner_death(mode, s)
    L += _idle_cost(mode, s)
    L += _targets(mode, targets)
    L += _notes(notes, problems)
    return "\n".join(L)


def _header(mode: Mode, mach: dict, seconds: float) -> list[str]:
    """The title, the machine, the noise and how to read the figures."""
    L: list[str] = []
    L.append(f"# shmlocks benchmarks ({mode.name} run)")
    L.append("")
    L.append(
        f"- **CPU**: {mach['cpu']}, {mach['cores']} cores ({mach['usable_cores']} usable), "
        f"{mach['machine']}"
    )
    L.append(f"- **kernel**: {mach['kernel']}")
    L.append(f"- **glibc**: {mach['glibc']}; **Python**: {mach['python']}")
    L.append(
        f"- **shmlocks** {mach['shmlocks']} (git {mach['git'] or '?'}); pyperf "
        f"{mach['pyperf']}, posix_ipc {mach['posix_ipc']}, matplotlib "
        f"{mach['matplotlib'] or 'not installed'}"
    )
    la = ", ".join(f"{x:.2f}" for x in mach["load_average"])
    le = ", ".join(f"{x:.2f}" for x in mach.get("load_average_end", []))
    L.append(
        f"- **when**: {mach['date']}; load average (1, 5, 15 min) at start {la}, at end "
        f"{le or '?'}; the run took {seconds:.0f} s"
    )
    if mach.get("cpus_busy_others") is not None:
        L.append(
            f"- **noise**: during the run, other programs kept "
            f"{mach['cpus_busy_others']:.2f} of the {mach['cores']} CPUs busy on average "
            f"(this run: {mach['cpus_busy_ours']:.2f}), from /proc/stat and getrusage"
        )
    L.append("")
    L.append(
        "Figures are medians over repeats with (min–max) beside them; ×mp is the ratio "
        "to multiprocessing.Lock's median in this same run. threading.Lock is not "
        "cross-process: its contended and hand-off rows use threads of one process "
        "(so they measure the GIL as much as the lock)."
    )
    L.append("")
    return L


def _uncontended(mode: Mode, s: dict) -> list[str]:
    """The uncontended table: ns per acquire/release pair, pyperf."""
    L: list[str] = []
    un = s["uncontended"]
    ref = un.get(REF, {})
    loop = s.get("loop_overhead_ns")
    L += ["## Uncontended: ns per pair (pyperf)", ""]
    rows = []
    for name, u in _measured(un):
        row = [name]
        for form in uncontended.FORMS:
            f = u.get(form)
            row += [_cell(f), _x(uncontended_ratio(f, ref.get(form)))]
        for form in uncontended.FORMS:
            f = u.get(form)
            row.append(_num(f["corrected"], 1) if f and f["corrected"] is not None else "–")
        rows.append(row)
    L += _table(
        ["lock", "acquire()+release()", "×mp", "`with lock:`", "×mp", "a+r − loop", "with − loop"],
        rows,
    )
    L.append("")
    n_vals = next((f["n"] for u in un.values() for f in u.values()), 0)
    rounds = uncontended.PYPERF[mode.name][0]
    L.append(
        f"Raw figures: the whole timed loop divided by its count ({n_vals} pyperf "
        f"value(s) per cell, from {rounds} round(s) of pyperf interleaving the locks; "
        "min–max over values). ×mp: the median over rounds of the ratio of this lock's "
        "median to multiprocessing.Lock's in the same round (paired, so that the "
        "machine's speed changing during the run cancels out). The last two columns "
        "are the same "
        "medians minus the empty loop's "
        f"({_num(loop, 1) if loop is not None else '–'} ns, pyperf `loop overhead`): "
        "loop-corrected, for reading only; ratios and targets use the raw figures."
    )
    L.append("")
    return L


def _contended(mode: Mode, s: dict, self_check: dict | None) -> list[str]:
    """Contended throughput, then fairness and exclusion."""
    L: list[str] = []
    co = s["contended"]
    ps = [str(p) for p in mode.procs]
    if self_check and self_check.get("caught"):
        check = (
            f"Self-check: the same harness with a lock that does not lock lost updates "
            f"(counter {self_check['counter']:,} vs {self_check['sum']:,} increments), "
            "so the exclusion check below can fail."
        )
    else:
        check = "Self-check: **the exclusion check was not shown to catch a broken lock.**"
    L += ["## Contended throughput: thousands of acquire/increment/release per second", ""]
    L.append(
        f"P workers for {mode.contended_s} s each, {mode.repeats} run(s) per cell; "
        f"{CORES} cores, so P > {CORES} is oversubscribed."
    )
    L.append("")
    rows = []
    for name, c in _measured(co):
        row = [_label(name)]
        for p in ps:
            e = c.get(p)
            refe = co.get(REF, {}).get(p)
            row += [
                _cell(e and e["ops_per_s"], 1e3, 0),
                _x(ratio(e and e["ops_per_s"]["median"], refe and refe["ops_per_s"]["median"])),
            ]
        rows.append(row)
    hdr = ["lock"]
    for p in ps:
        hdr += [f"P={p}", "×mp"]
    L += _table(hdr, rows)
    L.append("")
    L += ["### Fairness and exclusion", ""]
    L.append(
        "Jain's index over per-worker counts (1 = equal shares, 1/P = one worker got "
        "all), the max/min share, and whether the shared counter (a plain "
        "read-modify-write under the lock) equals the sum of the per-worker counts in "
        "every run. CPUs: the workers' CPU time over wall time (how many CPUs they kept "
        f"busy, spinning or working; {CORES} at most), a trace of what the machine left "
        f"them. {check}"
    )
    L.append("")
    rows = []
    multi = [p for p in ps if int(p) > 1]
    for name, c in _measured(co):
        row = [_label(name)]
        ok = True
        for p in multi:
            e = c.get(p)
            row += [
                _cell(e and e["jain"], 1, 3),
                _cell(e and e["max_min"], 1, 2),
                _num(e["cpus"]["median"], 2) if e else "–",
            ]
            ok = ok and (e is None or e["exclusion_ok"])
        row.append("yes" if ok else "**NO**")
        rows.append(row)
    hdr = ["lock"]
    for p in multi:
        hdr += [f"Jain P={p}", f"max/min P={p}", f"CPUs P={p}"]
    hdr.append("counter = sum")
    L += _table(hdr, rows)
    L.append("")
    L += _contended_counters(co, multi)
    return L


def _counter_rows(
    section: dict, keys: Sequence[str], fields: Sequence[tuple[str, float]]
) -> list[list[str]]:
    """A row per lock with its own counters (lock.stats()) in ``section``: for each key (a P,
    a critical section) the ``fields`` (name, scale), then whether in every run the counters
    matched what the harness counted."""
    rows = []
    for name, c in _measured(section):
        if not any(c.get(k) and c[k].get("handoffs_per_s") for k in keys):
            continue
        row = [_label(name)]
        ok = True
        for k in keys:
            e = c.get(k)
            row += [_cell(e and e.get(f), scale, 1) for f, scale in fields]
            if e and e.get("stats_match") is False:
                ok = False
        row.append("yes" if ok else "**NO**")
        rows.append(row)
    return rows


def _contended_counters(co: dict, ps: list[str]) -> list[str]:
    """The shmlocks kinds' own counters (lock.stats()) over the same runs."""
    rows = _counter_rows(co, ps, [("contended_pct", 1), ("handoffs_per_s", 1e3)])
    if not rows:
        return []
    L = ["### From the locks' own counters", ""]
    L.append(
        "What each lock counted itself (`lock.stats()`, zeroed before each run; "
        'README.md, "Lock statistics"): the % of acquisitions that had to wait, and '
        "thousands of hand-offs (a hold begun by another process than the previous one) "
        "per second. Last column: in every run the counters' acquisitions equal the "
        "harness's count of sections."
    )
    L.append("")
    hdr = ["lock"]
    for p in ps:
        hdr += [f"% waited P={p}", f"k hand-offs/s P={p}"]
    hdr.append("acquisitions = sections")
    L += _table(hdr, rows)
    L.append("")
    return L


def _handoff(mode: Mode, s: dict) -> list[str]:
    """Hand-off round trips (README.md, "Hand-off"): two tables and the harness floor."""
    L: list[str] = []
    ho = s["handoff"]
    L += ["## Hand-off latency: µs per round trip (two hand-offs)", ""]
    L.append(
        f"Two workers pass a turn through the lock; up to {mode.handoff_s} s per run, "
        f"{mode.handoff_repeats} run(s) per cell. Median: the median of the runs' "
        "medians (min–max over runs); p99: the median of the runs' 99th percentiles. "
        "With a critical section (a busy-wait inside the lock by the worker whose turn "
        "it is) a round trip includes two of them: nothing is subtracted."
    )
    L.append("")
    L.append(
        "A hand-off between two running CPUs and a hand-off between two processes "
        "taking turns on one CPU are different figures (about a µs against a context "
        "switch or a whole time slice), and on a busy 2-core machine the scheduler "
        "gives either; nothing is pinned. A run counts as *one CPU* when each worker "
        "was switched out involuntarily (preempted, or by its own sched_yield) at least "
        "once every two round trips: then the round trips needed context switches. "
        "The first table keeps the other runs [k/n: how many of the n runs]; the "
        "second has every run, as measured (†k: k runs on one CPU). ‡k: k runs "
        "completed no round trip (the turn did not come back within the run), so "
        "they have no figure. The targets use the first table; results.json has every "
        "run with its context switches, CPU time and run-queue wait."
    )
    L.append("")

    L += ["### Runs that did not take turns on one CPU", ""]
    L += _handoff_table(mode, ho, True)
    L.append("")
    fl = s.get("handoff_floor_ns")
    if fl:
        L.append(
            f"Harness floor: the same two workers with a lock that does nothing (the turn "
            f"word alone) take {_cell(fl, 1e3, 2)} µs per round trip: the Python loop, "
            "its clock reads and the turn word's two cache-line transfers. What a lock "
            "adds is the figure above minus this one:"
        )
        L.append("")
        rows = []
        for name in adapters.NAMES:
            e = ho.get(name, {}).get("0")
            if e and e["two_cpu"]:
                med = e["two_cpu"]["median_ns"]["median"]
                rows.append([_label(name), _num((med - fl["median"]) / 1e3, 2)])
        L += _table(["lock", "round trip − floor (µs)"], rows)
        L.append("")
    L += ["### Every run, as measured", ""]
    L += _handoff_table(mode, ho, False)
    L.append("")
    L += _handoff_counters(mode, ho)
    return L


def _handoff_counters(mode: Mode, ho: dict) -> list[str]:
    """The shmlocks kinds' own counters over the hand-off runs, beside the harness's turns."""
    keys = [str(cs) for cs in mode.cs_ns]
    fields = [("handoffs_per_s", 1e3), ("turns_per_s", 1e3), ("contended_pct", 1)]
    rows = _counter_rows(ho, keys, fields)
    if not rows:
        return []
    L = ["### From the locks' own counters", ""]
    L.append(
        "Thousands of hand-offs per second as each lock counted them (`lock.stats()`, "
        "zeroed before each run), beside the harness's own count of turns passed (each "
        "a hand-off; a worker that finds it is not its turn makes holds, and hand-offs, "
        "that pass nothing), and the % of acquisitions that waited. Last column: in "
        "every run hand-offs >= turns - 1 and acquisitions >= turns."
    )
    L.append("")
    hdr = ["lock"]
    for cs in mode.cs_ns:
        lab = "no CS" if cs == 0 else f"CS {cs / 1000:g} µs"
        hdr += [f"{lab}: k hand-offs/s", "k turns/s", "% waited"]
    hdr.append("counters ≥ turns")
    L += _table(hdr, rows)
    L.append("")
    return L


def _handoff_table(mode: Mode, ho: dict, two: bool) -> list[str]:
    """One hand-off table: the runs not on one CPU (``two``), or every run."""
    rows = []
    for name, h in _measured(ho):
        row = [_label(name)]
        for cs in mode.cs_ns:
            e = h.get(str(cs))
            refe = ho.get(REF, {}).get(str(cs))
            if e is None:
                row += ["–", "–", "–"]
                continue
            if two:
                n_all = e["runs"]
                starved = e["starved_runs"]
                e, refe = e["two_cpu"], refe and refe["two_cpu"]
                mark = f" [{e['runs'] if e else 0}/{n_all}]"
            else:
                starved = e["starved_runs"]
                mark = f" †{e['one_cpu_runs']}" if e["one_cpu_runs"] else ""
                if e["median_ns"] is None:
                    e = None
            mark += f" ‡{starved}" if starved else ""
            if not e:
                row += ["–" + mark, "–", "–"]
                continue
            row += [
                _cell(e["median_ns"], 1e3, 2) + mark,
                _x(
                    ratio(
                        e["median_ns"]["median"],
                        refe and refe["median_ns"] and refe["median_ns"]["median"],
                    )
                ),
                _num(e["p99_ns"]["median"] / 1e3, 1),
            ]
        rows.append(row)
    hdr = ["lock"]
    for cs in mode.cs_ns:
        lab = "no CS" if cs == 0 else f"CS {cs / 1000:g} µs"
        hdr += [f"{lab}: median", "×mp", "p99"]
    return _table(hdr, rows)


def _owner_death(mode: Mode, s: dict) -> list[str]:
    """Owner death: SIGKILL to the blocked waiter's acquisition."""
    L: list[str] = []
    od = s["owner_death"]
    L += ["## Owner death: holder SIGKILLed, waiter blocked", ""]
    L.append(
        f"Time from the SIGKILL to the blocked waiter's acquisition (CLOCK_MONOTONIC in "
        f"both processes), {mode.death_repeats} death(s) per lock that recovers, the "
        f"waiter left blocked {mode.settle_s} s before each. A lock that cannot recover "
        f"is shown by a bounded acquire that times out {mode.wedge_s} s after the kill."
    )
    L.append("")
    rows = []
    for name, d in _measured(od):
        rec = d["recovery_ms"]
        if rec:
            figs = [_num(rec["median"], 3), _num(d["recovery_p90_ms"], 3), _num(rec["max"], 3)]
        elif d["timed_out_after_s"] is not None:
            figs = [
                f"never (a bounded acquire timed out {d['timed_out_after_s']:.2f} s after "
                "the kill)",
                "",
                "",
            ]
        else:
            figs = ["–", "–", "–"]
        died = "yes" if d["owner_died"] else ("no" if d["outcome"] == "recovered" else "–")
        n = str(rec["n"]) if rec else "–"
        rows.append([name, d["outcome"], *figs, n, died])
    L += _table(
        ["lock", "outcome", "median (ms)", "p90 (ms)", "max (ms)", "deaths", "owner_died seen"],
        rows,
    )
    L.append("")
    return L


def _idle_cost(mode: Mode, s: dict) -> list[str]:
    """Idle cost: a waiter blocked behind a live holder (bench/idle_cost.py)."""
    ic = s["idle_cost"]
    if not ic:
        return []
    L: list[str] = ["## Idle cost: a waiter blocked behind a live holder", ""]
    dl = next(iter(ic.values())).get("deadlock_timeout_s", 1.0)
    L.append(
        f"A holder process keeps the lock; a waiter thread blocks in a bounded acquire. "
        f"Wake-ups/s: the waiter's voluntary context switches over {mode.idle_s} s, with "
        f"deadlock detection off, and (shmlocks kinds) from its deadlock timeout "
        f"({dl:g} s) on. Neighbour: a CPU-bound Python thread counting for {mode.idle_s} s "
        f"beside a blocked waiter and beside none ({mode.idle_runs} run(s) each way, "
        "alternated; best against best): its speed with a waiter over its speed without, "
        "its voluntary context switches per second in both (a GIL it had to give up and "
        "wait for costs one, unless the GIL was free again at once), and the waiter's "
        "wake-ups per second during the runs (the most of any run). The speed is as "
        "noisy as the machine: read it beside the switches."
    )
    L.append("")
    rows = []
    for name, e in _measured(ic):
        look = e.get("look_wakeups_per_s")
        rows.append(
            [
                name,
                _num(e["wakeups_per_s"], 1),
                _num(look, 1) if look is not None else "–",
                _x(e["speed_ratio"]),
                f"{_num(e['neighbour_switches_per_s'], 1)} / {_num(e['alone_switches_per_s'], 1)}",
                _num(e["waiter_wakeups_per_s"], 1),
            ]
        )
    L += _table(
        [
            "lock",
            "waiter wake-ups/s, detection off",
            "after the deadlock timeout",
            "neighbour speed",
            "neighbour switches/s, with / without a waiter",
            "waiter wake-ups/s beside it",
        ],
        rows,
    )
    L.append("")
    return L


def _targets(mode: Mode, targets: list[dict]) -> list[str]:
    """The issue's targets, met or not."""
    L: list[str] = []
    L += ["## Targets (issues 4 and 27)", ""]
    L.append("Each cell: the ratio (or time) measured in this run, the target, and the verdict.")
    L.append("")
    groups: dict[str, dict[str, dict]] = {}
    for t in targets:
        groups.setdefault(t["target"], {})[t["lock"]] = t
    rows = []
    for target, by in groups.items():
        row = [target]
        for k in adapters.KINDS:
            t = by.get(k)
            if t is None:
                row.append("")
                continue
            verdict = "**met**" if t["met"] else "not met" if t["met"] is False else "not measured"
            row.append(f"{t['value']} ({t['want']}): {verdict}")
        rows.append(row)
    L += _table(["target", *adapters.KINDS], rows)
    n_met = sum(1 for t in targets if t["met"])
    L.append("")
    L.append(f"{n_met} of {len(targets)} met.")
    if mode.name == "smoke":
        L.append("")
        L.append(
            "(A smoke run: its figures only show that every path works; they are too "
            "short to judge targets by.)"
        )
    L.append("")
    return L


def _notes(notes: list[str], problems: list[str]) -> list[str]:
    """Notes and problems, if any."""
    L: list[str] = []
    if notes:
        L += ["## Notes", ""]
        L += [f"- {n}" for n in notes]
        L.append("")
    if problems:
        L += ["## Problems", ""]
        L += [f"- {p}" for p in problems]
        L.append("")
    return L


# ==========================================================================================
# plots (matplotlib is an optional extra)


def plots(s: dict, mode: Mode, out: Path) -> list[str]:
    """Write throughput.png and handoff.png; returns notes (why plots were skipped)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["plots skipped: matplotlib is not importable (pip install 'shmlocks[bench]')"]

    _plot_throughput(plt, s, mode, out)
    return _plot_handoff(plt, s, mode, out)


def _plot_throughput(plt: Any, s: dict, mode: Mode, out: Path) -> None:
    """throughput.png: contended throughput per worker count, one line per lock."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, c in _measured(s["contended"]):
        ps = sorted(int(p) for p in c)
        med = [c[str(p)]["ops_per_s"]["median"] for p in ps]
        lo = [m - c[str(p)]["ops_per_s"]["min"] for m, p in zip(med, ps, strict=True)]
        hi = [c[str(p)]["ops_per_s"]["max"] - m for m, p in zip(med, ps, strict=True)]
        style = "-" if name in adapters.KINDS else "--"
        ax.errorbar(
            ps,
            med,
            yerr=[lo, hi],
            fmt=style + "o",
            capsize=3,
            label=_label(name),
            linewidth=2 if name in adapters.KINDS else 1,
        )
    ax.axvline(CORES, color="grey", linewidth=0.8, linestyle=":")
    ax.text(
        CORES,
        0.01,
        f" {CORES} cores",
        color="grey",
        va="bottom",
        transform=ax.get_xaxis_transform(),
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(mode.procs), [str(p) for p in mode.procs])
    ax.set_yscale("log")
    ax.set_xlabel("workers (processes; threads for threading.Lock)")
    ax.set_ylabel("acquire/increment/release per second")
    ax.set_title("Contended throughput (median, min–max bars)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)


def _plot_handoff(plt: Any, s: dict, mode: Mode, out: Path) -> list[str]:
    """handoff.png: the hand-off round trip per lock and critical section; notes."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    names = [n for n in adapters.NAMES if n in s["handoff"]]
    if not any(e["median_ns"] for n in names for e in s["handoff"][n].values()):
        return ["hand-off plot skipped: no run completed a round trip"]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(names) + 2.2))
    ncs = max(1, len(mode.cs_ns))
    height = 0.8 / ncs
    any_fallback = False
    handles: list[Any] = []
    for j, cs in enumerate(mode.cs_ns):
        color = f"C{j}"
        for i, name in enumerate(names):
            e = s["handoff"][name].get(str(cs))
            if not e or not e["median_ns"]:
                continue
            # the runs not on one CPU where there are some; else every run, hatched
            fallback = e["two_cpu"] is None
            any_fallback |= fallback
            f = e if fallback else e["two_cpu"]
            y = i + (j - (ncs - 1) / 2) * height
            ax.barh(
                [y],
                [f["median_ns"]["median"] / 1e3],
                height=height * 0.9,
                color=color,
                hatch="///" if fallback else None,
                edgecolor="white" if fallback else None,
            )
            ax.plot(
                [f["p99_ns"]["median"] / 1e3],
                [y],
                "d",
                markersize=5,
                color=color,
                markeredgecolor="black",
                markeredgewidth=0.6,
            )
        lab = "no critical section" if cs == 0 else f"{cs / 1000:g} µs critical section"
        handles.append(Patch(facecolor=color, label=f"{lab}: median"))
    handles.append(
        Line2D(
            [],
            [],
            marker="d",
            linestyle="",
            color="white",
            markeredgecolor="black",
            label="p99 (same colour)",
        )
    )
    if any_fallback:
        handles.append(
            Patch(
                facecolor="grey",
                hatch="///",
                edgecolor="white",
                label="every run on one CPU: all runs",
            )
        )
    ax.set_yticks(range(len(names)), [_label(n) for n in names])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("µs per round trip (two hand-offs), log scale")
    ax.set_title(
        "Hand-off latency through the lock\n(runs that did not take turns on one "
        "CPU: median of runs, p99 markers)",
        fontsize=10,
    )
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.tight_layout()
    fig.savefig(out / "handoff.png", dpi=120)
    plt.close(fig)
    return []


# ==========================================================================================
# output files


def jsonable(x: Any) -> Any:
    if isinstance(x, float):
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return x
