"""bench/sharding.py (issue 39): one lock, lock tables and a list of multiprocessing.Locks
in one run, each cell checked for exclusion (the shared counters add up), with the memory
a stripe costs and the per-call figures the issue's bars are read from."""

from __future__ import annotations

import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import sharding  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_one_run_gives_every_configuration_exactly(tmp_path):
    rc = sharding.main(["--smoke", "--out", str(tmp_path)])
    assert rc == 0
    md = (tmp_path / "sharding.md").read_text()
    for row in ("| one lock (futex) | 1 |", "| table futex | 64 |", "| table mcs | 4 |"):
        assert row in md
    assert "| multiprocessing.Lock list | 64 |" in md and "index_of of a 32-byte str" in md
    doc = json.loads((tmp_path / "sharding.json").read_text())
    assert doc["problems"] == []
    for sizes in doc["raw"].values():
        for ps in sizes.values():
            for rs in ps.values():
                assert all(r["exact"] and r["ops_per_s"] > 0 for r in rs)
    futex64 = doc["raw"]["table futex"]["64"]["2"][0]["bytes_per_stripe"]
    assert 256 <= futex64 < 4096, "2 lines a stripe, plus the region's share"
