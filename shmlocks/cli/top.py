"""``shmlocks top [NAME...] [--interval S] [--json]``: the live view of the busiest
locks (the work is shmlocks/top.py).
"""

from __future__ import annotations

import argparse
import sys

from shmlocks.cli._common import required_regions
from shmlocks.top import live, snapshot_once


def cmd_top(args: argparse.Namespace) -> int:
    names = required_regions(args.names) if args.names else None
    if args.json or not sys.stdout.isatty():
        return snapshot_once(names, args.interval, args.json, sys.stdout)
    return live(names, args.interval, sys.stdout)


def _interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.05 <= v <= 3600:
        raise argparse.ArgumentTypeError("the interval is 0.05 to 3600 seconds")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Refreshed every interval: for each lock of every shmlocks segment "
        "(or of the NAMEs given), busiest first, acquires/s, hand-offs/s, %% of acquires "
        "that waited and their mean wait, the max wait, timeouts/s, the holder (pid, alive "
        "or dead) and the waiters. q or Ctrl-C quits. With stdout not a terminal, or with "
        "--json, prints one snapshot (rates over one interval) and exits."
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="segments to watch (default: all)")
    p.add_argument(
        "--interval",
        type=_interval,
        default=1.0,
        metavar="SECONDS",
        help="refresh period, and the span of the rates (default 1)",
    )
    p.add_argument("--json", action="store_true", help="one snapshot, machine-readable")
    p.set_defaults(func=cmd_top)
