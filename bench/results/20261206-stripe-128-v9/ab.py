"""(AB_OLD, AB_NEW: the two trees; AB_BENCH: the bench directory.) Paired A/B of two shmlocks builds, cell by cell: for each round, each cell runs under
OLD then NEW (order alternating by round) in fresh processes; report per cell the median
ops/s of each and the median of the per-round ratios NEW/OLD."""

import json
import os
import statistics
import subprocess
import sys
import time

BENCH = os.environ.get("AB_BENCH", "/work/wt-lead/bench")
OLD, NEW = os.environ.get("AB_OLD", "/work/wt-40"), os.environ.get("AB_NEW", "/work/wt-lead")
CHILD = r"""
import json, sys
sys.path.insert(0, BENCH_DIR)
what = sys.argv[1]
if what == "handoff":
    import stripe_handoff as m
    r = m.measure(sys.argv[2], sys.argv[3] == "stripe", int(sys.argv[4]), float(sys.argv[5]))
    print(json.dumps({"ops_per_s": r["ops_per_s"], "exact": r["exact"], "handoff_share": r["handoff_share"]}))
else:
    import sharding as m
    cfg = ("one",) if sys.argv[2] == "one" else ("table", sys.argv[2], int(sys.argv[3]))
    r = m.measure(cfg, int(sys.argv[4]), float(sys.argv[5]))
    print(json.dumps({"ops_per_s": r["ops_per_s"], "exact": r["exact"], "cpus": r["cpus"], "bytes_per_stripe": r["bytes_per_stripe"]}))
"""


def run(tree, args):
    env = dict(os.environ, PYTHONPATH=tree)
    child = f"BENCH_DIR = {BENCH!r}\n" + CHILD
    p = subprocess.run(
        [sys.executable, "-c", child, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        cwd="/tmp",
        timeout=300,
    )
    if p.returncode:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout)


def main():
    mode, rounds, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    kinds = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else ("futex", "robust", "pi")
    sys.path.insert(0, BENCH)
    from common import own_autogroup

    own_autogroup(-19)
    if mode == "handoff":
        cells = [
            ("handoff", k, s, p, secs)
            for p in (2, 4, 8)
            for k in kinds
            for s in ("plain", "stripe")
        ]
    else:
        cells = [("shard", "one", 1, p, secs) for p in (2, 4, 8)] + [
            ("shard", k, n, p, secs) for p in (2, 4, 8) for k in kinds for n in (64, 4096)
        ]
    res = {c: {"old": [], "new": []} for c in cells}
    for r in range(rounds):
        order = cells[r % len(cells) :] + cells[: r % len(cells)]
        for c in order:
            tags = ("old", "new") if r % 2 == 0 else ("new", "old")
            for tag in tags:
                out = run(OLD if tag == "old" else NEW, c)
                assert out["exact"], (c, tag)
                res[c][tag].append(out)
        print(f"round {r} done {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
    rows = []
    for c, v in res.items():
        o = [x["ops_per_s"] for x in v["old"]]
        n = [x["ops_per_s"] for x in v["new"]]
        ratios = [b / a for a, b in zip(o, n, strict=True)]
        row = {
            "cell": " ".join(map(str, c[1:4])),
            "old": statistics.median(o),
            "new": statistics.median(n),
            "ratio_median": statistics.median(ratios),
            "ratios": [round(x, 2) for x in ratios],
        }
        if mode == "handoff":
            row["handoff_old"] = statistics.median(x["handoff_share"] for x in v["old"])
            row["handoff_new"] = statistics.median(x["handoff_share"] for x in v["new"])
        else:
            row["cpus_old"] = statistics.median(x["cpus"] for x in v["old"])
            row["cpus_new"] = statistics.median(x["cpus"] for x in v["new"])
            row["bps_old"] = max(x["bytes_per_stripe"] or 0 for x in v["old"])
            row["bps_new"] = max(x["bytes_per_stripe"] or 0 for x in v["new"])
        rows.append(row)
    print(json.dumps(rows))


main()
