"""``shmlocks demo``: the demonstration (the work is shmlocks/demo.py)."""

from __future__ import annotations

import argparse
import multiprocessing

from shmlocks.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    CliError,
    positive_float,
    positive_int,
)


def cmd_demo(args: argparse.Namespace) -> int:
    from shmlocks import demo

    try:
        ok = demo.run(args.start_method, args.workers, args.iterations, args.handoff, args.json)
    except demo.DemoError as e:
        raise CliError(str(e)) from e
    return EXIT_OK if ok else EXIT_ERROR


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers", type=positive_int, default=4, help="processes per lock kind (default 4)"
    )
    p.add_argument(
        "--iterations",
        type=positive_int,
        default=20000,
        help="increments per worker (default 20000)",
    )
    p.add_argument(
        "--handoff",
        type=positive_float,
        default=0.3,
        metavar="SECONDS",
        help="hand-off time per lock (default 0.3)",
    )
    p.add_argument(
        "--start-method",
        choices=multiprocessing.get_all_start_methods(),
        default="spawn",
        help="multiprocessing start method (default spawn: the locks travel by pickling)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as one JSON object (the tables go to stderr)",
    )
    p.set_defaults(func=cmd_demo)
