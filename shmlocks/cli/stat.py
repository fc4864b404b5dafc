"""``shmlocks stat NAME [--json]``: the statistics of every lock of one segment
(the counters are read by shmlocks/stats.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from shmlocks._table import emit, table
from shmlocks.cli._common import read_region, segment_name
from shmlocks.stats import (
    duration,
    holder_text,
    hottest_text,
    percent,
    readers_text,
    segment_stats,
    table_kind,
)


def _counts(c: dict[str, Any]) -> list[Any]:
    """ACQUIRES .. TIMEOUTS of a row, from a lock's counters or an RWLock's ``reads``."""
    return [
        c["acquisitions"],
        f"{c['contended']} ({percent(c['contended'], c['acquisitions'])})",
        duration(c["wait_total_s"] / c["contended"] if c["contended"] else None),
        duration(c["wait_max_s"] if c["contended"] else None),
        c["timeouts"],
    ]


def _rows(lk: dict[str, Any]) -> list[list[Any]]:
    """A lock's row; an RWLock's two: its write side, then its read side (the readers as
    its holders, the readers waiting as its waiters; no owner deaths or hand-offs)."""
    rd = lk.get("reads")
    kind = f"{lk['kind']} (write)" if rd is not None else lk["kind"]
    if "stripes" in lk:  # a lock table: one row, its stripes summed
        kind = table_kind(lk)
    rows = [
        [
            lk["name"],
            kind,
            *_counts(lk),
            lk["owner_deaths"],
            lk["handoffs"],
            holder_text(lk),
            lk["waiters"],
        ]
    ]
    if rd is not None:
        rows.append(
            [
                lk["name"],
                f"{lk['kind']} (read)",
                *_counts(rd),
                "-",
                "-",
                readers_text(rd),
                rd["waiters"],
            ]
        )
    return rows


def _render_stat(d: dict[str, Any]) -> str:
    locks = d["locks"]
    out = [f"segment {d['name']}: {len(locks)} lock{'s' if len(locks) != 1 else ''}"]
    rows = [row for lk in locks for row in _rows(lk)]
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
    for lk in locks:
        if "stripes" in lk:
            out.append(f"  {lk['name']}: hottest stripes {hottest_text(lk, 5)}")
    return "\n".join(out)


def cmd_stat(args: argparse.Namespace) -> int:
    name = segment_name(args.name)
    emit(segment_stats(name, read_region(name)), args.json, _render_stat)  # one open
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "The counters every lock keeps in its segment, summed over every "
        "process that used it: acquisitions, contended ones (% of all) with their mean "
        "and max wait, timeouts, owner deaths, hand-offs between processes; and the "
        "current holder and waiters. An RWLock has two rows: its writes (the writer "
        "holds it) and its reads (the readers hold it). A lock table is one row, its "
        "stripes' counters summed, with its hottest stripes below. Read-only."
    )
    p.add_argument("name", metavar="NAME", help="segment name (a leading / is optional)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_stat)
