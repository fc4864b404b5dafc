"""What a lock made with the defaults costs to create, to open, and to hold in memory, in
two shmlocks builds measured in one run (issue 37: participants that grow).

    python bench/create_cost.py OLD_TREE NEW_TREE [ROUNDS]

Each tree is a source checkout with its extension built in place (`pip install -e .` or
`python setup.py build_ext --inplace`). The two are imported alternately in fresh
processes, ROUNDS times (default 3); each time figure is the minimum over rounds of the
median of batches, in CPU time (this process's, user and system: what the calls cost,
whatever else runs on the machine; wall time beside it):

- create: `Kind()` (a new segment with one lock, the defaults) then `close()` (which
  unlinks it), per pair;
- open: `Kind.open(name)` then `close()` of a lock another object keeps open, per pair;
- memory: the segment's pages in tmpfs (`st_blocks`) of a fresh lock, and of one that N
  threads (each alive, keeping its slot) have used, N = 64 and 1,000, with this process's
  resident pages of its mapping (`/proc/self/smaps` Rss). A build whose default caps a lock
  at 64 participants is given `max_participants=N` for N past 64: the only way it serves
  them.

Kinds: futex (the simplest body) and clh (the one with per-participant set-up).
"""

import json
import subprocess
import sys

CHILD = r"""
import json, os, re, statistics, sys, threading, time
sys.path.insert(0, sys.argv[1])
import shmlocks

def per_pair(fn, n=400, batches=7):
    cpu, wall = [], []
    for _ in range(batches):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            fn()
        cpu.append((time.process_time() - c0) / n * 1e6)
        wall.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(cpu), statistics.median(wall)

def blocks(lock):
    return os.stat("/dev/shm/" + lock.name).st_blocks * 512

def rss(name):
    ino = str(os.stat("/dev/shm/" + name).st_ino)
    tot, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):  # a mapping's first line
                inside = len(fields) > 4 and fields[4] == ino
            elif inside and line.startswith("Rss:"):
                tot += int(fields[1]) * 1024
    return tot

def used_by(cls, n):
    try:
        lock = cls()
        if n > 64 and lock.region.max_participants < n:
            lock.close()
            raise ValueError
    except ValueError:
        lock = cls(max_participants=n)
    stop, done = threading.Event(), threading.Semaphore(0)
    def work():
        with lock:
            pass
        done.release()
        stop.wait(60)
    old = threading.stack_size(256 * 1024)
    ts = [threading.Thread(target=work) for _ in range(n)]
    for t in ts:
        t.start()
    threading.stack_size(old)
    for _ in ts:
        done.acquire()
    b, r = blocks(lock), rss(lock.name)
    stop.set()
    for t in ts:
        t.join()
    lock.close()
    return b, r

out = {}
for kind in ("futex", "clh"):
    cls = shmlocks.KINDS[kind]
    def create():
        cls().close()
    keep = cls()
    def reopen():
        cls.open(keep.name).close()
    r = {"fresh_bytes": blocks(keep), "fresh_rss": rss(keep.name)}
    r["create_cpu_us"], r["create_wall_us"] = per_pair(create)
    r["open_cpu_us"], r["open_wall_us"] = per_pair(reopen)
    keep.close()
    for n in (64, 1000):
        r[f"used_{n}_bytes"], r[f"used_{n}_rss"] = used_by(cls, n)
    out[kind] = r
print(json.dumps(out))
"""


def main() -> int:
    old, new = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for _ in range(rounds):
        for tag, tree in (("old", old), ("new", new)):
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, tree],
                capture_output=True,
                text=True,
                check=True,
                cwd="/",
            )
            runs[tag].append(json.loads(proc.stdout))
    keys = ("create_cpu_us", "create_wall_us", "open_cpu_us", "open_wall_us")
    mem = (
        "fresh_bytes",
        "fresh_rss",
        "used_64_bytes",
        "used_64_rss",
        "used_1000_bytes",
        "used_1000_rss",
    )
    for kind in runs["old"][0]:
        print(f"{kind}:")
        for k in keys:
            o = min(r[kind][k] for r in runs["old"])
            n = min(r[kind][k] for r in runs["new"])
            print(f"  {k:18s} old {o:8.1f}  new {n:8.1f}  ratio {n / o:5.2f}")
        for k in mem:
            o = runs["old"][-1][kind][k]
            n = runs["new"][-1][kind][k]
            print(f"  {k:18s} old {o:9d}  new {n:9d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
