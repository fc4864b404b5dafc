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


def test_each_cell_reports_the_cpus_its_workers_got(tmp_path):
    """On a shared machine P workers may get less than one CPU between them: then no
    sections run in parallel and one lock serializes nothing, so a cell's throughput says
    nothing about sharding. Each cell says how many CPUs it got, and the 1.5x verdict
    says when the run could not measure it."""
    rc = sharding.main(["--smoke", "--sizes", "64", "--kinds", "futex", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "sharding.json").read_text())
    for sizes in doc["raw"].values():
        for ps in sizes.values():
            for rs in ps.values():
                for r in rs:
                    assert 0 < r["cpus"] <= (os.cpu_count() or 1) * 1.2
                    assert r["cpu_ns_per_op"] > 0
    md = (tmp_path / "sharding.md").read_text()
    assert "| one lock (futex) | 1 |" in md and " CPUs) |" in md
    s = sharding.summarize(doc["raw"])
    one = s["one lock (futex)"][1]
    for p in (2, 4):
        one[p] = {"ops_per_s": 100.0, "jain": 1.0, "bytes_per_stripe": 1, "cpus": 0.6}
    s["table futex"][64][4] = {"ops_per_s": 90.0, "jain": 1.0, "bytes_per_stripe": 256, "cpus": 0.6}
    text = sharding.markdown(s, [2, 4], None, "##")
    assert "0.90x one lock (bar >= 1.5x): NOT met, but not a measure of sharding" in text


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no autogroup")
def test_autogroup_nice_runs_in_a_session_of_its_own():
    """--autogroup-nice N: the run goes on in a new session (so an autogroup of its own,
    at nice N), leaving the caller's session and autogroup as they were."""
    import subprocess

    with open("/proc/self/autogroup") as f:
        mine = f.read()
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "sharding.py"),
            "--smoke",
            "--kinds",
            "futex",
            "--sizes",
            "4",
            "--autogroup-nice",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr
    assert "autogroup nice 0" in out.stdout and "| table futex | 4 |" in out.stdout
    assert "autogroup: /autogroup-" in out.stderr
    with open("/proc/self/autogroup") as f:
        assert f.read() == mine


def test_stripe_handoff_compares_a_stripe_with_a_plain_lock(capsys):
    """bench/stripe_handoff.py: a contended hand-off on stripe 0 of a table and on a plain
    lock of its kind, each cell checked for exclusion, both reported with their hand-offs."""
    import stripe_handoff

    rc = stripe_handoff.main(
        ["--procs", "2", "--kinds", "futex,robust", "--seconds", "0.05", "--rounds", "2", "--json"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {f"{k} {s} P=2" for k in ("futex", "robust") for s in ("plain", "stripe")}
    for cell in out.values():
        assert cell["ops_per_s"] > 0 and 0 <= cell["handoff_share"] <= 1
        assert len(cell["all_ops_per_s"]) == 2
