"""``shmlocks stat NAME [--json]``: the statistics of every lock of one segment (a region
or a standalone lock), from the counters in the segment (docs/design.md §10).

Read-only: the segment is read as ``inspect`` reads it (a validated private copy read with
pread: shmlocks/_segment.py) and its counters are shown as the numbers they hold,
scribbled or not. What ``top`` shows live comes from
:func:`segment_stats` too.
"""

from __future__ import annotations

import argparse
from typing import Any

from shmlocks import _segment
from shmlocks._table import emit, table

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


def _render_stat(d: dict[str, Any]) -> str:
    locks = d["locks"]
    out = [f"segment {d['name']}: {len(locks)} lock{'s' if len(locks) != 1 else ''}"]
    rows = [
        [
            lk["name"],
            lk["kind"],
            lk["acquisitions"],
            f"{lk['contended']} ({percent(lk['contended'], lk['acquisitions'])})",
            duration(lk["wait_total_s"] / lk["contended"] if lk["contended"] else None),
            duration(lk["wait_max_s"] if lk["contended"] else None),
            lk["timeouts"],
            lk["owner_deaths"],
            lk["handoffs"],
            holder_text(lk),
            lk["waiters"],
        ]
        for lk in locks
    ]
    if rows:
        out.append(
            table(
                [
                    "LOCK",
                    "KIND",
                    "ACQUIRES",
                    "CONTENDED",
                    "WAIT MEAN",
                    "WAIT MAX",
                    "TIMEOUTS",
                    "OWNER DEATHS",
                    "HANDOFFS",
                    "HOLDER",
                    "WAITERS",
                ],
                rows,
                "  ",
            )
        )
    return "\n".join(out)


def cmd_stat(args: argparse.Namespace) -> int:
    from shmlocks.cli import _require_region, segment_name

    name = segment_name(args.name)
    _require_region(name)
    emit(segment_stats(name), args.json, _render_stat)
    return 0


def register(sub: Any) -> None:
    """Add the ``stat`` command to the CLI's subparsers."""
    p = sub.add_parser(
        "stat",
        help="per-lock statistics of a segment: acquires, contention, waits, hand-offs",
        description="The counters every lock keeps in its segment, summed over every "
        "process that used it: acquisitions, contended ones (% of all) with their mean "
        "and max wait, timeouts, owner deaths, hand-offs between processes; and the "
        "current holder and waiters. Read-only.",
    )
    p.add_argument("name", metavar="NAME", help="segment name (a leading / is optional)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_stat)
