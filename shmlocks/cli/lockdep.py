"""``shmlocks lockdep [--json] [--reset]``: the lock orders recorded with
SHMLOCKS_LOCKDEP=1, and the inversions found (the runtime is shmlocks/lockdep.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from shmlocks.lockdep import graph_path, reset, snapshot


def _render(rep: dict[str, Any]) -> str:
    from shmlocks._table import table

    out = [f"lock orders recorded: {len(rep['orders'])} ({rep['graph']})"]
    if rep["orders"]:
        rows = [
            [o["from"], o["to"], f"{o['file']}:{o['line']}", o["function"], o["pid"]]
            for o in rep["orders"]
        ]
        out.append(table(["FIRST", "THEN", "SITE", "FUNCTION", "PID"], rows, "  "))
    out.append(f"inversions found: {len(rep['inversions'])}")
    if rep["inversions"]:
        rows = [
            [f"{o['from']} -> {o['to']}", f"{o['file']}:{o['line']}", o["function"], o["pid"]]
            for o in rep["inversions"]
        ]
        out.append(table(["INVERTED ORDER", "SITE", "FUNCTION", "PID"], rows, "  "))
    return "\n".join(out)


def cmd_lockdep(args: argparse.Namespace) -> int:
    from shmlocks._table import emit

    if args.reset:
        gone = reset()
        emit(
            {"graph": graph_path(), "reset": gone},
            args.json,
            lambda d: f"cleared {d['graph']}" if d["reset"] else "no lock orders recorded",
        )
        return 0
    emit(snapshot(), args.json, _render)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--reset", action="store_true", help="clear the recorded orders")
    p.set_defaults(func=cmd_lockdep)
