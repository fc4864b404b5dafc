"""The asyncio side of LockTable.hold and hold_all (docs/design.md §15): the same global
order and all-or-nothing rule as the synchronous ``Held.__enter__`` (shmlocks/_ext/table/
table.pxi), over the public ``acquire_async`` of each lock, so the owner of every hold is
the task. Imported at the first ``async with``.

A cancellation (or any exception, or the deadline: TimeoutError) while the locks are
being taken releases those taken, last first, before it leaves; a lock granted at the
moment of cancellation is passed on by ``acquire_async`` itself. Between an ``await``
that returned True and the record that the lock is held there is no await, so no
cancellation can fall in between.
"""

from __future__ import annotations

import time
from typing import Any

from shmlocks import _core


async def take(
    held: Any, locks: list[Any], taken: list[Any], died: list[int], timeout: Any
) -> None:
    """Take every lock of ``locks`` (already in the global order) into ``taken``; the
    indices of those whose owner had died into ``died``."""
    if taken:
        raise RuntimeError("this hold is held already: leave its with block first")
    died.clear()
    deadline = None if timeout is None or timeout == float("inf") else time.monotonic() + timeout
    try:
        for i, lk in enumerate(locks):
            if deadline is None:
                ok = await lk.acquire_async()
            else:
                ok = await lk.acquire_async(True, max(0.0, deadline - time.monotonic()))
            if not ok:
                raise TimeoutError(
                    f"hold: {len(taken)} of {len(locks)} locks taken by the deadline "
                    f"({timeout} s); released again"
                )
            taken.append(lk)
            if lk.owner_died:
                died.append(i)
            _core._hold_took()
    except BaseException as e:
        await let_go(taken, type(e), e, e.__traceback__)
        raise


async def let_go(taken: list[Any], t: Any, v: Any, tb: Any) -> None:
    """Release every lock of ``taken``, last first, as its ``async with`` exit would; the
    first error is raised once all are released."""
    first: BaseException | None = None
    while taken:
        lk = taken.pop()
        try:
            await lk.__aexit__(t, v, tb)
        except BaseException as e:  # noqa: BLE001 - every lock is released, then it raises
            if first is None:
                first = e
    if first is not None:
        raise first
