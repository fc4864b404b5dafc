"""Uncontended cost of one acquire()+release() pair and of one ``with lock:`` block, by pyperf.

This file is two things:

* run as a script, it is the pyperf benchmark program (pyperf re-runs it in worker
  processes): one benchmark per lock and form, plus ``loop overhead`` (the same loop with
  an empty body), so that a reader can see what the loop itself costs;
* imported, ``measure()`` runs that program in subprocesses (in rounds; bounded in time,
  killed with its process group on timeout), keeps pyperf's JSON (``pyperf.json``, all
  rounds appended), and returns the values in ns.

The figures are raw: each pyperf value is the time of the whole loop divided by the loop
count, loop overhead included. The report shows loop-corrected figures (raw minus
``loop overhead``) in separate, labelled columns; the ratios and targets use the raw ones.

Each timed call creates its lock in the worker and closes it in a ``finally``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import adapters

HERE = Path(__file__).resolve()
FORMS = ("acquire+release", "with")
LOOP = "loop overhead"

# pyperf options per mode, and how many times to run the whole pyperf program. Each round
# runs every benchmark once (one worker process each) and appends to the same JSON file,
# so the rounds interleave the locks in time, as the other measurements do, and a burst of
# load from elsewhere lands on every lock rather than on one. Loops are fixed (no
# calibration): identical in every round, and starting processes is most of the time here.
# smoke only exercises the code, in pyperf's own process.
PYPERF = {
    "smoke": (1, ["--in-process", "-p", "1", "-n", "1", "-w", "0", "-l", "2000"]),
    "quick": (3, ["-p", "1", "-n", "3", "-w", "1", "-l", "65536"]),
    "full": (10, ["-p", "1", "-n", "3", "-w", "1", "-l", "262144"]),
}


def bench_name(lock: str, form: str) -> str:
    return f"{lock}: {form}"


# -- the timed functions (run inside pyperf workers) ----------------------------------------


def time_loop(loops: int) -> float:
    it = itertools.repeat(None, loops)
    t0 = time.perf_counter()
    for _ in it:
        pass
    return time.perf_counter() - t0


def time_pair(loops: int, name: str, tag: str) -> float:
    a = adapters.make(name, tag)
    try:
        h = a.attach()
        try:
            acquire, release = h.acquire, h.release
            it = itertools.repeat(None, loops)
            t0 = time.perf_counter()
            for _ in it:
                acquire()
                release()
            return time.perf_counter() - t0
        finally:
            h.detach()
    finally:
        a.close()


def time_with(loops: int, name: str, tag: str) -> float:
    a = adapters.make(name, tag)
    try:
        h = a.attach()
        try:
            cm = h.cm
            it = itertools.repeat(None, loops)
            t0 = time.perf_counter()
            for _ in it:
                with cm:
                    pass
            return time.perf_counter() - t0
        finally:
            h.detach()
    finally:
        a.close()


def _pyperf_main() -> None:
    import pyperf

    def pass_on(cmd: list[str], args: Any) -> None:
        cmd.extend(["--locks", args.locks, "--tag", args.tag])

    runner = pyperf.Runner(add_cmdline_args=pass_on)
    runner.argparser.add_argument("--locks", default=",".join(adapters.NAMES))
    runner.argparser.add_argument("--tag", required=True)
    args = runner.parse_args()
    runner.metadata["description"] = "shmlocks bench: uncontended lock pairs"
    runner.bench_time_func(LOOP, time_loop)
    for name in args.locks.split(","):
        runner.bench_time_func(bench_name(name, "acquire+release"), time_pair, name, args.tag)
        runner.bench_time_func(bench_name(name, "with"), time_with, name, args.tag)


# -- the parent side --------------------------------------------------------------------------


def measure(
    mode: str,
    locks: list[str],
    tag: str,
    out_json: Path,
    log: Path,
    timeout: float,
    progress: Any = None,
) -> dict[str, Any]:
    """Run the pyperf program (its rounds); {bench name: {"values_ns", "median_ns", ...}}."""
    rounds, args = PYPERF[mode]
    with contextlib.suppress(FileNotFoundError):
        out_json.unlink()
    deadline = time.monotonic() + timeout
    with open(log, "w") as logf:
        for r in range(rounds):
            if progress:
                progress(
                    f"uncontended: pyperf round {r + 1}/{rounds}, {len(locks)} locks x 2 forms"
                )
            cmd = [
                sys.executable,
                str(HERE),
                "--quiet",
                "--append",
                str(out_json),
                *args,
                "--locks",
                ",".join(locks[r % len(locks) :] + locks[: r % len(locks)]),
                "--tag",
                tag,
            ]
            logf.write(f"$ {' '.join(cmd)}\n")
            logf.flush()
            _run(cmd, logf, max(1.0, deadline - time.monotonic()), log)
    return load(out_json)


def _run(cmd: list[str], logf: Any, timeout: float, log: Path) -> None:
    proc = subprocess.Popen(
        cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    rc = None
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"pyperf still running at the {timeout:.0f} s deadline") from None
    finally:
        if rc is None:
            # pyperf's workers share its process group: end them with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    if rc != 0:
        logf.flush()
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"pyperf exited with {rc}:\n" + "\n".join(tail))


def load(path: Path) -> dict[str, Any]:
    import pyperf

    suite = pyperf.BenchmarkSuite.load(str(path))
    out: dict[str, Any] = {}
    for b in suite.get_benchmarks():
        vals = [v * 1e9 for v in b.get_values()]
        out[b.get_name()] = {
            "values_ns": vals,
            "median_ns": b.median() * 1e9,
            "min_ns": min(vals),
            "max_ns": max(vals),
            "loops": b.get_loops(),
        }
    return out


if __name__ == "__main__":
    _pyperf_main()
