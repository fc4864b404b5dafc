"""A/B the contended hand-off of two shmlocks builds in one run.

    python bench/ab_handoff.py OLD_TREE NEW_TREE [ROUNDS] [CS_NS] [KINDS]

Each tree is a source checkout with its extension built in place (as for ab_fastpath.py).
Each round runs handoff.measure (two processes passing a turn through the lock, 0.5 s per
kind) for every kind (or the comma-separated KINDS) in a fresh process of each tree in
turn, with this checkout's bench harness. Reported per kind: the median over rounds of
each run's median round trip, the median of the faster half of the runs (a busy machine
puts some runs' workers on one CPU: those are the slow half), and the fastest run.
"""

import json
import os
import statistics
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
import shmlocks, adapters, handoff
kinds = sys.argv[4].split(",") if sys.argv[4] else list(shmlocks.KINDS)
out = {}
for k in kinds:
    a = adapters.make(k, adapters.new_tag())
    try:
        out[k] = handoff.measure(a, 0.5, int(sys.argv[3])).get("median_ns")
    finally:
        a.close()
print(json.dumps(out))
"""


def main() -> int:
    old, new = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
    cs = sys.argv[4] if len(sys.argv) > 4 else "0"
    kinds = sys.argv[5] if len(sys.argv) > 5 else ""
    runs: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    for _ in range(rounds):
        for tag, tree in (("old", old), ("new", new)):
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, tree, BENCH, cs, kinds],
                capture_output=True,
                text=True,
                check=True,
                cwd="/",
            )
            for k, ns in json.loads(proc.stdout).items():
                if ns:
                    runs[tag].setdefault(k, []).append(ns / 1e3)
    print(
        f"{'kind':8s} {'old':>7s} {'new':>7s} {'ratio':>6s}  {'old fast':>8s} {'new fast':>8s} "
        f"{'ratio':>6s}  {'old min':>7s} {'new min':>7s}   (us per round trip, "
        f"{rounds} runs each, cs={cs} ns)"
    )
    for k in runs["old"]:
        ov, nv = sorted(runs["old"][k]), sorted(runs["new"].get(k, [])) or [float("nan")]
        o, n = statistics.median(ov), statistics.median(nv)
        of = statistics.median(ov[: max(1, len(ov) // 2)])
        nf = statistics.median(nv[: max(1, len(nv) // 2)])
        print(
            f"{k:8s} {o:7.2f} {n:7.2f} {n / o:6.2f}  {of:8.2f} {nf:8.2f} {nf / of:6.2f}  "
            f"{ov[0]:7.2f} {nv[0]:7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
