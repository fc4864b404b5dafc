"""The machine-wide commands with many segments on the machine (issue 38, item 5): what
``shmlocks ls``, ``deadlocks``, ``inspect`` and ``top`` cost with N (10,000) segments.

    python bench/cli_scale.py [--segments 10000] [--repeats 3] [--top-seconds 10]
                              [--json FILE]
    python -m shmlocks bench -- --cli-scale [...]

Run it in a private tmpfs on /dev/shm, as bench/deadlock_scale.py (whose segments it
makes: default futex locks, made and closed with persist=True, as another program's
would stay):

    SHMSIZE=2g unshare -m --propagation private sh -c \\
        'mount -t tmpfs -o size=$SHMSIZE tmpfs /dev/shm && exec "$@"' sh \\
        python bench/cli_scale.py

Beside them, two processes in an AB/BA cycle with deadlock detection off (so that it
stays, and ``deadlocks`` must find it among the N: exit status 3) and a third that waits
behind one of them.

Each command runs as ``python -m shmlocks ...`` in a child: its wall time and its CPU
time (getrusage of the children, user + system), best and median of ``--repeats``, and
the load average when it ran (the machine is shared: read the CPU beside it). ``top
--json`` takes two samples an interval (1 s) apart, so its wall is a second more than its
work. ``top`` live: the command on a pseudo-terminal, refreshing every second; its CPU
(from /proc/PID/stat) over ``--top-seconds`` after its first two refreshes, per second and
per refresh (a refresh waits its interval after its sample: on a loaded machine there
are fewer than one a second).
The floor: ``python -m shmlocks --version`` (the interpreter and the CLI's import).
Issue 38's bars: ls, deadlocks, inspect <= 0.5 s; top's refresh <= 0.2 s of CPU per
second.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing as mp
import os
import pty
import resource
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from deadlock_scale import drop_segments, make_segments  # noqa: E402

import shmlocks  # noqa: E402


def _cycle_member(first, second, ready, stop) -> None:
    shmlocks.set_deadlock_timeout(None)  # the cycle stays: `deadlocks` must find it
    first.acquire()
    ready.wait()
    try:
        second.acquire(timeout=600)
    except shmlocks.ShmLockError:
        pass
    stop.wait(600)


def _waiter(lock, ready, stop) -> None:
    shmlocks.set_deadlock_timeout(None)
    ready.wait()  # once the members hold their first locks: it waits, never takes it first
    lock.acquire(timeout=600)
    stop.wait(600)


class Cycle:
    """Two processes in an AB/BA cycle (detection off) and one waiting behind it."""

    def __init__(self) -> None:
        ctx = mp.get_context("fork")
        self.a, self.b = shmlocks.FutexMutex(), shmlocks.FutexMutex()
        ready, self.stop = ctx.Barrier(3), ctx.Event()
        self.ps = [
            ctx.Process(target=_cycle_member, args=(x, y, ready, self.stop), daemon=True)
            for x, y in ((self.a, self.b), (self.b, self.a))
        ]
        self.ps.append(ctx.Process(target=_waiter, args=(self.a, ready, self.stop), daemon=True))
        for p in self.ps:
            p.start()
        time.sleep(1.0)  # each waits

    def close(self) -> None:
        self.stop.set()
        for p in self.ps:
            p.kill()
            p.join(30)
        self.a.close()
        self.b.close()


def run_once(cmd: list[str]) -> dict:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "shmlocks", *cmd], capture_output=True, text=True, timeout=600
    )
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    return {
        "rc": p.returncode,
        "wall_s": wall,
        "cpu_s": cpu,
        "load": os.getloadavg()[0],
        "out_bytes": len(p.stdout),
    }


def command(cmd: list[str], repeats: int) -> dict:
    runs = [run_once(cmd) for _ in range(repeats)]
    return {
        "cmd": "shmlocks " + " ".join(cmd),
        "rc": sorted({r["rc"] for r in runs}),
        "wall_best_s": min(r["wall_s"] for r in runs),
        "wall_median_s": statistics.median(r["wall_s"] for r in runs),
        "cpu_best_s": min(r["cpu_s"] for r in runs),
        "cpu_median_s": statistics.median(r["cpu_s"] for r in runs),
        "load": [round(r["load"], 2) for r in runs],
        "runs": runs,
    }


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks


def top_live(seconds: float, interval: float = 1.0) -> dict:
    """``shmlocks top`` on a pseudo-terminal (50 x 200): its CPU per second over
    ``seconds``, after its first two refreshes (the start-up and the first samples)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    p = subprocess.Popen(
        [sys.executable, "-m", "shmlocks", "top", "--interval", str(interval)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    got = bytearray()

    def drain() -> None:
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                return
            if not b:
                return
            got.extend(b)

    th = threading.Thread(target=drain, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 120
        while got.count(b"\x1b[2J") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        redraws0 = got.count(b"\x1b[2J")
        c0, t0 = _ticks(p.pid), time.monotonic()
        load0 = os.getloadavg()[0]
        time.sleep(seconds)
        c1, t1 = _ticks(p.pid), time.monotonic()
        redraws = got.count(b"\x1b[2J") - redraws0
        os.write(master, b"q")
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        os.close(master)
        th.join(10)
    hz = os.sysconf("SC_CLK_TCK")
    cpu = (c1 - c0) / hz
    return {
        "cmd": f"shmlocks top --interval {interval:g} (on a pty)",
        "rc": p.returncode,
        "seconds": t1 - t0,
        "cpu_s": cpu,
        "cpu_per_s": cpu / (t1 - t0),
        "redraws": redraws,
        "cpu_per_refresh_s": cpu / redraws if redraws else None,
        "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segments", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top-seconds", type=float, default=10.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    res: dict = {"segments": a.segments, "cpus": os.cpu_count(), "commands": []}
    have = make_segments(0, a.segments)
    cyc = Cycle()
    try:
        cmds = [
            ["--version"],
            ["ls"],
            ["ls", "--json"],
            ["deadlocks"],
            ["deadlocks", "--json"],
            ["inspect", have[0]],
            ["inspect", cyc.a.name],
            ["top", "--json"],
        ]
        for cmd in cmds:
            r = command(cmd, a.repeats)
            res["commands"].append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "runs"}), flush=True)
        if a.top_seconds > 0:
            r = top_live(a.top_seconds)
            res["commands"].append(r)
            print(json.dumps(r), flush=True)
    finally:
        cyc.close()
        drop_segments(have)
    print(f"\n{a.segments:,} segments (and 2 in a cycle), {os.cpu_count()} CPUs\n")
    print("| command | exit | wall: best / median | CPU: best / median | load average |")
    print("|---|---|---|---|---|")
    for r in res["commands"]:
        if "cpu_per_s" in r:
            print(
                f"| `{r['cmd']}` | {r['rc']} | {r['redraws']} refreshes in "
                f"{r['seconds']:.1f} s | {r['cpu_per_s']:.3f} s of CPU per second, "
                f"{r['cpu_per_refresh_s'] or 0:.3f} s per refresh | "
                f"{r['load'][0]} - {r['load'][1]} |"
            )
            continue
        print(
            f"| `{r['cmd']}` | {','.join(map(str, r['rc']))} | {r['wall_best_s']:.2f} / "
            f"{r['wall_median_s']:.2f} s | {r['cpu_best_s']:.2f} / {r['cpu_median_s']:.2f} s"
            f" | {', '.join(map(str, r['load']))} |"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
