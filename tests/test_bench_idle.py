"""bench/idle_cost.py counts a blocked waiter's wake-ups: none for a waiter that sleeps
until the lock is posted (multiprocessing.Lock), about 200 a second for one that polls
every 5 ms (a lock made here to poll), so its table can tell the two apart."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import adapters  # noqa: E402
import idle_cost  # noqa: E402

pytestmark = pytest.mark.timeout(60)


class PollingAdapter(adapters.Adapter):
    """multiprocessing.Lock behind a bounded acquire that polls every 5 ms, as a
    shmlocks waiter did before issue 27."""

    name = "polling"

    def __init__(self) -> None:
        self.lock = mp.get_context("fork").Lock()

    def attach(self) -> adapters.Handle:
        lk = self.lock

        def timed(t: float) -> bool:
            end = time.monotonic() + t
            while not lk.acquire(False):
                if time.monotonic() >= end:
                    return False
                time.sleep(0.005)
            return True

        return adapters.Handle(lk.acquire, lk.release, lk, timed)


def test_a_sleeping_waiter_makes_no_wakeups():
    a = adapters.make("multiprocessing.Lock", adapters.new_tag())
    try:
        out = idle_cost.measure(a, 0.05, 0.3, 1)
    finally:
        a.close()
    assert out["wakeups"] <= 1 and out["waiter_wakeups_per_s"] <= 1 / 0.3, out
    assert out["look_wakeups_per_s"] is None  # no deadlock detection in an anchor
    assert out["speed_ratio"] > 0


def test_a_polling_waiter_is_counted():
    out = idle_cost.measure(PollingAdapter(), 0.05, 0.3, 1)
    assert out["wakeups_per_s"] > 50, out
    assert out["waiter_wakeups_per_s"] > 50, out
