"""``shmlocks stat NAME [--json]``: the statistics of every lock of one segment
(the counters are read by shmlocks/stats.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from shmlocks._table import emit, table
from shmlocks.cli._common import require_region, segment_name
from shmlocks.stats import duration, holder_text, percent, segment_stats


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
    name = segment_name(args.name)
    require_region(name)
    emit(segment_stats(name), args.json, _render_stat)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "The counters every lock keeps in its segment, summed over every "
        "process that used it: acquisitions, contended ones (% of all) with their mean "
        "and max wait, timeouts, owner deaths, hand-offs between processes; and the "
        "current holder and waiters. Read-only."
    )
    p.add_argument("name", metavar="NAME", help="segment name (a leading / is optional)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_stat)
