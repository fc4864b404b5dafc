"""A/B the uncontended fast path of two shmlocks builds in one run.

    python bench/ab_fastpath.py OLD_TREE NEW_TREE [ROUNDS]

Each tree is a source checkout with its extension built in place (`pip install -e .` or
`python setup.py build_ext --inplace`). The two are imported alternately in fresh
processes, ROUNDS times; each figure is the minimum over rounds of the best of 7 loops of
200k acquire()+release() (and `with lock:`) pairs, raw (the Python loop included).
"""

import json
import subprocess
import sys

CHILD = r"""
import json, sys, time, threading, multiprocessing as mp
sys.path.insert(0, sys.argv[1])
import shmlocks
def run(lock, n=200000):
    a, r = lock.acquire, lock.release
    best = bw = 1e9
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            a(); r()
        best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(n):
            with lock:
                pass
        bw = min(bw, time.perf_counter() - t0)
    return best / n * 1e9, bw / n * 1e9
out = {}
makers = [("threading.Lock", threading.Lock), ("multiprocessing.Lock", mp.Lock)]
for name, make in makers + list(shmlocks.KINDS.items()):
    lock = make()
    out[name] = run(lock)
    if hasattr(lock, "close"):
        lock.close()
print(json.dumps(out))
"""


def main() -> int:
    old, new = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    runs: dict[str, list[dict[str, list[float]]]] = {"old": [], "new": []}
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
    print(
        f"{'lock':22s} {'old a+r':>9s} {'new a+r':>9s} {'ratio':>6s}  "
        f"{'old with':>9s} {'new with':>9s} {'ratio':>6s}   (ns per pair)"
    )
    for name in runs["new"][0]:
        o = min(r[name][0] for r in runs["old"])
        n = min(r[name][0] for r in runs["new"])
        ow = min(r[name][1] for r in runs["old"])
        nw = min(r[name][1] for r in runs["new"])
        print(f"{name:22s} {o:9.1f} {n:9.1f} {n / o:6.2f}  {ow:9.1f} {nw:9.1f} {nw / ow:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
