"""bench/oversubscribed.py (issue 40): every (lock, P) cell is measured with the exclusion
check, and the summary gives each lock's ratio to its own P=2 and to multiprocessing.Lock
at the same P, with Jain's index, so the issue's bars can be read from one run."""

from __future__ import annotations

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import oversubscribed  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_one_run_gives_the_ratios_and_fairness(tmp_path):
    rc = oversubscribed.main(
        ["--procs", "1,2,3", "--seconds", "0.05", "--locks", "ticket", "--out", str(tmp_path)]
    )
    assert rc == 0
    md = (tmp_path / "oversubscribed.md").read_text()
    assert "| ticket |" in md and "| multiprocessing.Lock |" in md
    import json

    doc = json.loads((tmp_path / "oversubscribed.json").read_text())
    s = doc["summary"]
    for name in ("ticket", "multiprocessing.Lock"):
        for p in ("1", "2", "3"):
            c = s[name][p]
            assert c["ops_per_s"] > 0 and 0 < c["jain"] <= 1.0
        assert s[name]["2"]["vs_p2"] == 1.0
    assert s["multiprocessing.Lock"]["3"]["vs_mp"] == 1.0
    for rs in doc["raw"]["ticket"].values():
        assert all(r["exclusion_ok"] for r in rs)
