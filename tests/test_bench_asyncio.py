"""bench/asyncio_handoff.py measures the floor of an async hand-off (two loop wake-ups
through a shared futex word, an io_uring FUTEX_WAITV and the ring's eventfd) in the same
run as the locks' round trips, so that its "x floor" column compares like with like; the
floor's protocol passes every turn (the two loops alternate, none is lost)."""

from __future__ import annotations

import os
import sys

import pytest

from shmlocks import _core

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import asyncio_handoff  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.mark.skipif(_core.AIO_MODE != "io_uring", reason="no io_uring FUTEX_WAITV here")
def test_the_floor_round_trip_passes_every_turn():
    shared = asyncio_handoff.CTX.Array("i", [0], lock=False)
    out = asyncio_handoff.CTX.Queue()
    ps = [
        asyncio_handoff.CTX.Process(
            target=asyncio_handoff._turns_floor, args=(None, me, shared, 200, out)
        )
        for me in (0, 1)
    ]
    for p in ps:
        p.start()
    gaps = out.get(timeout=30)
    for p in ps:
        p.join(30)
        assert p.exitcode == 0
    assert len(gaps) == 199 and all(g > 0 for g in gaps)
    assert shared[0] == 400  # every turn passed: 200 flips of each loop
