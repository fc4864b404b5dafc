"""The benchmark reads the locks' own counters (bench/contended.py, bench/handoff.py) and
checks them against its harness's count: the check holds for every kind, and fails when
the counters disagree."""

from __future__ import annotations

import os
import sys

import pytest
from support import KINDS

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import adapters  # noqa: E402
import contended  # noqa: E402
import handoff  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def adapter_of():
    made = []

    def make(name):
        a = adapters.make(name, adapters.new_tag())
        made.append(a)
        return a

    yield make
    for a in made:
        a.close()


@pytest.mark.parametrize("kind", KINDS)
def test_contended_counters_match_the_harness(kind, adapter_of):
    a = adapter_of(kind)
    with a.lock:
        pass  # counted before the run: the run zeroes the counters first
    out = contended.measure(a, 2, 0.1)
    assert out["exclusion_ok"] and out["stats_match"] is True
    assert out["lock_stats"]["acquisitions"] == out["ops"] > 0
    assert 0.0 <= out["contended_pct"] <= 100.0 and out["handoffs_per_s"] >= 0


@pytest.mark.parametrize("kind", KINDS)
def test_handoff_counters_follow_the_turns(kind, adapter_of):
    a = adapter_of(kind)
    out = handoff.measure(a, 0.2)
    flips = sum(out["flips"])
    assert out["stats_match"] is True
    assert out["lock_stats"]["handoffs"] >= flips - 1
    assert out["turns_per_s"] == pytest.approx(flips / out["seconds"])


def test_anchors_have_no_counters(adapter_of):
    out = contended.measure(adapter_of("multiprocessing.Lock"), 2, 0.05)
    assert (out["lock_stats"], out["stats_match"], out["handoffs_per_s"]) == (None, None, None)


def test_a_wrong_count_is_caught(adapter_of, monkeypatch):
    a = adapter_of("ticket")
    real = a.stats
    monkeypatch.setattr(a, "stats", lambda: dict(real(), acquisitions=real()["acquisitions"] + 1))
    assert contended.measure(a, 2, 0.05)["stats_match"] is False
