"""``shmlocks deadlocks [--json]``: every cycle of the machine-wide wait-for graph
(the work is shmlocks/deadlocks.py); exit status 3 with a cycle, 0 without.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shmlocks import waitgraph
from shmlocks._table import emit, table
from shmlocks.deadlocks import EXIT_CYCLE, EXIT_NONE, cycles_report


def _lock(label: str, kind: str, side: str | None) -> str:
    """``table/x (futex)``; an RWLock's with its side: ``rw (rwlock, read)``."""
    return f"{label} ({kind}, {side})" if side else f"{label} ({kind})"


def _render(rep: dict[str, Any]) -> str:
    if not rep["cycles"]:
        return f"no deadlock ({rep['waiting_threads']} threads waiting for a lock)"
    out = []
    for i, c in enumerate(rep["cycles"], 1):
        out.append(f"deadlock {i}: a cycle of {len(c)} threads")
        rows = [
            [
                m["pid"],
                m["tid"],
                _lock(m["holds"], m["holds_kind"], m.get("holds_as")),
                _lock(m["waits_for"], m["waits_for_kind"], m.get("waits_as")),
                f"{m['waited_s']:.3f} s",
            ]
            for m in c
        ]
        out.append(table(["PID", "TID", "HOLDS", "WAITS FOR", "WAITING"], rows, "  "))
    return "\n".join(out)


def cmd_deadlocks(args: argparse.Namespace) -> int:
    rep = cycles_report(waitgraph.snapshot(waits_only=True))
    emit(rep, args.json, _render)
    if not args.json:
        for note in rep["skipped"]:
            print(f"note: {note}", file=sys.stderr)
    return EXIT_CYCLE if rep["cycles"] else EXIT_NONE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Scan every shmlocks segment in /dev/shm (read-only) and print each "
        "cycle of the wait-for graph: for each thread in it, pid, tid, the lock it holds, "
        "the lock it waits for and for how long. Exit status 3 with a cycle, 0 without."
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_deadlocks)
