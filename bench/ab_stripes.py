"""Paired A/B of two shmlocks builds on lock tables, cell by cell (issue 39's layouts).

    python bench/ab_stripes.py OLD_TREE NEW_TREE {shard|handoff} [ROUNDS] [SECONDS] [KINDS]

Each tree is a source checkout with its extension built in place (as for ab_fastpath.py).
Cells: ``shard``, bench/sharding.py ``measure`` (P workers doing random-key
read-modify-writes over 10,000 counters: one futex lock as the control, then tables of 64
and 4,096 stripes of each kind); ``handoff``, bench/stripe_handoff.py ``measure`` (P
workers in a contended ``with lock: counter += 1`` on a plain lock of the kind, or on
stripe 0 of a 64-stripe table); P = 2, 4, 8; KINDS default futex,robust,pi. Each round
runs every cell under OLD and under NEW, each in a fresh process with this checkout's
bench harness (which tree goes first alternates by round, the cells rotate), so a loaded
machine's drift cancels in pairs. Runs in a scheduler autogroup of its own at nice -19
(bench/common.py ``own_autogroup``). Prints one JSON list: per cell the median ops/s of
each build, the median of the per-round NEW/OLD ratios and every ratio; then, on stderr,
the ratios pooled by lock (median, geometric mean, rounds below 1).
"""

import json
import math
import os
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
what = sys.argv[2]
if what == "handoff":
    import stripe_handoff as m
    r = m.measure(sys.argv[3], sys.argv[4] == "stripe", int(sys.argv[5]), float(sys.argv[6]))
    print(json.dumps({"ops_per_s": r["ops_per_s"], "exact": r["exact"],
                      "handoff_share": r["handoff_share"]}))
else:
    import sharding as m
    cfg = ("one",) if sys.argv[3] == "one" else ("table", sys.argv[3], int(sys.argv[4]))
    r = m.measure(cfg, int(sys.argv[5]), float(sys.argv[6]))
    print(json.dumps({"ops_per_s": r["ops_per_s"], "exact": r["exact"], "cpus": r["cpus"],
                      "bytes_per_stripe": r["bytes_per_stripe"]}))
"""


def _run(tree: str, cell: tuple) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, BENCH, *map(str, cell)],
        env=dict(os.environ, PYTHONPATH=tree),
        capture_output=True,
        text=True,
        cwd="/tmp",
        timeout=300,
    )
    if p.returncode:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[2] not in ("shard", "handoff"):
        print(__doc__, file=sys.stderr)
        return 2
    old, new, mode = argv[0], argv[1], argv[2]
    rounds = int(argv[3]) if len(argv) > 3 else 8
    secs = float(argv[4]) if len(argv) > 4 else 0.5
    kinds = argv[5].split(",") if len(argv) > 5 else ["futex", "robust", "pi"]
    sys.path.insert(0, BENCH)
    from common import own_autogroup

    print(own_autogroup(-19), file=sys.stderr)
    if mode == "handoff":
        cells = [
            ("handoff", k, s, p, secs)
            for p in (2, 4, 8)
            for k in kinds
            for s in ("plain", "stripe")
        ]
    else:
        cells = [("shard", "one", 1, p, secs) for p in (2, 4, 8)]
        cells += [("shard", k, n, p, secs) for p in (2, 4, 8) for k in kinds for n in (64, 4096)]
    res: dict[tuple, dict[str, list]] = {c: {"old": [], "new": []} for c in cells}
    for r in range(rounds):
        for c in cells[r % len(cells) :] + cells[: r % len(cells)]:
            for tag in ("old", "new") if r % 2 == 0 else ("new", "old"):
                out = _run(old if tag == "old" else new, c)
                if not out["exact"]:
                    raise RuntimeError(f"{c} under {tag}: the counters are not exact")
                res[c][tag].append(out)
        print(f"round {r} done {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
    rows, pooled = [], {}
    for c, v in res.items():
        o = [x["ops_per_s"] for x in v["old"]]
        n = [x["ops_per_s"] for x in v["new"]]
        ratios = [b / a for a, b in zip(o, n, strict=True)]
        row = {
            "cell": " ".join(map(str, c[1:4])),
            "old": statistics.median(o),
            "new": statistics.median(n),
            "ratio_median": statistics.median(ratios),
            "ratios": [round(x, 3) for x in ratios],
        }
        for tag in ("old", "new"):
            if mode == "handoff":
                row[f"handoff_{tag}"] = statistics.median(x["handoff_share"] for x in v[tag])
            else:
                row[f"cpus_{tag}"] = statistics.median(x["cpus"] for x in v[tag])
                row[f"bps_{tag}"] = max(x["bytes_per_stripe"] or 0 for x in v[tag])
        rows.append(row)
        key = " ".join(row["cell"].split()[:2]) if mode == "handoff" else row["cell"].split()[0]
        pooled.setdefault(key, []).extend(ratios)
    print(json.dumps(rows))
    for key, v in pooled.items():
        gm = math.exp(sum(map(math.log, v)) / len(v))
        below = sum(x < 1 for x in v)
        print(
            f"{key}: {len(v)} rounds, median {statistics.median(v):.3f}, geomean {gm:.3f}, "
            f"{below} below 1",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
