"""The statistics of every lock of one segment (a region or a standalone lock), from the
counters in the segment (docs/design.md §10), for ``shmlocks stat`` (shmlocks/cli/stat.py)
and ``shmlocks top``.

Read-only: the segment is read as ``inspect`` reads it (a validated private copy read with
pread: shmlocks/_segment.py) and its counters are shown as the numbers they hold,
scribbled or not. What ``top`` shows live comes from
:func:`segment_stats` too.
"""

from __future__ import annotations

from typing import Any

from shmlocks import _segment

STAT_KEYS = (
    "acquisitions",
    "contended",
    "wait_total_s",
    "wait_max_s",
    "timeouts",
    "owner_deaths",
    "handoffs",
)


def segment_stats(name: str) -> dict[str, Any]:
    """Every lock of segment ``name``: its kind, holder (pid, tid, alive), waiters and
    counters, as plain data (what ``stat --json`` prints)."""
    seg = _segment.read(name)  # a private copy read with pread, never a mapping
    d = _segment.describe(seg)
    locks = []
    for lk, body in zip(d["locks"], seg.locks, strict=True):
        c = _segment.lock_stats(body)
        locks.append(
            {
                "name": lk["name"],
                "kind": lk["kind"],
                "locked": lk["locked"],
                "holder": lk["holder"] if lk["locked"] else None,
                "waiters": lk["waiters"],
                **{k: c[k] for k in STAT_KEYS},  # type: ignore[literal-required]
            }
        )
    return {"name": name, "locks": locks}


def duration(seconds: float | None) -> str:
    """A wait for people: ``-``, ``850 ns``, ``12.5 us``, ``3.20 ms``, ``1.50 s``."""
    if seconds is None:
        return "-"
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def holder_text(lk: dict[str, Any]) -> str:
    h = lk.get("holder")
    if not lk.get("locked"):
        return "-"
    if not h:
        return "held"
    if h.get("other_namespace"):
        return "other namespace"
    return f"pid {h['pid']} {'alive' if h['alive'] else 'DEAD'}"
