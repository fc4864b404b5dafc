"""The CLI and the wait-for graph read segments from a private copy (shmlocks/_segment.py,
pread, never a mapping): what they show must be what the compiled core shows through a
mapping (``Region._describe``, ``Region.stats``), for every kind, free, held and waited
for; and a segment that is shorter than its header says is an error, not a crash."""

from __future__ import annotations

import os
import threading
import time

import pytest
from support import KINDS, SHM_DIR

import shmlocks
from shmlocks import _segment

pytestmark = pytest.mark.timeout(60)


def _same(region: shmlocks.Region) -> None:
    seg = _segment.read(region.name)
    assert _segment.describe(seg) == region._describe()
    assert _segment.stats(seg) == region.stats()


@pytest.mark.parametrize("kind", KINDS)
def test_the_copy_describes_a_region_as_the_core_does(kind, new_region):
    region = new_region(max_locks=4, max_participants=8)
    a = region.create_lock("a", kind)
    region.create_lock("b", kind)
    _same(region)  # free
    a.acquire()
    _same(region)  # held by this thread
    started = threading.Event()
    waiter = threading.Thread(target=lambda: (started.set(), a.acquire(timeout=5) and a.release()))
    waiter.start()
    started.wait()
    deadline = time.monotonic() + 5
    while region._describe()["locks"][0]["waiters"] < 1:
        assert time.monotonic() < deadline, "the waiter never published its wait"
        time.sleep(0.01)
    _same(region)  # held, one waiter
    a.release()
    waiter.join()
    # the waiter's slot is given back as its thread ends, after join() may return
    while len(region._describe()["participants"]) > 1:
        assert time.monotonic() < deadline + 5, "the waiter's slot was never given back"
        time.sleep(0.01)
    _same(region)  # free again, counters moved


def test_a_segment_shorter_than_its_header_says_is_an_error(new_region):
    region = new_region(max_locks=2, max_participants=4)
    region.create_lock("a", "mcs")
    path = os.path.join(SHM_DIR, region.name)
    with open(path, "rb") as f:
        data = f.read()
    short = region.name + "-short"
    with open(os.path.join(SHM_DIR, short), "wb") as f:
        f.write(data[:4096])
    try:
        with pytest.raises(shmlocks.CorruptRegionError, match="does not match its layout"):
            _segment.read(short)
    finally:
        os.unlink(os.path.join(SHM_DIR, short))
