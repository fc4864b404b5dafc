"""``shmlocks torture``: SIGKILL holders and waiters (shmlocks/torture.py)."""

from __future__ import annotations

import argparse
import signal
import sys

import shmlocks
from shmlocks._table import emit
from shmlocks.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    CliError,
    positive_float,
    positive_int,
)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cmd_torture(args: argparse.Namespace) -> int:
    from shmlocks import torture

    if args.workers > torture.MAX_WORKERS:
        raise CliError(f"--workers: at most {torture.MAX_WORKERS}")
    kinds = list(shmlocks.KINDS) if args.kind == "all" else [args.kind]
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        out = sys.stderr if args.json else sys.stdout
        results = torture.main(
            kinds,
            args.seconds,
            args.workers,
            seed=args.seed,
            out=out,
            load=args.load,
            aio=args.asyncio,
        )
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if args.json:
        emit([r.as_dict() for r in results], True, str)
    failed = [r.kind for r in results if not r.ok]
    if failed:
        print(
            f"shmlocks: error: torture failed for {', '.join(failed)} (see above)", file=sys.stderr
        )
        return EXIT_ERROR
    return EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Workers increment a shared counter under the lock while a killer SIGKILLs "
        "random workers (holders and waiters) and restarts them. Reports kills, "
        "recoveries (owner_died seen), the worst time from a death to the next "
        "acquisition, mutual-exclusion violations, wedges and leaked slots; exits 1 if "
        "any occurred."
    )
    p.add_argument(
        "--kind",
        choices=["all", *shmlocks.KINDS, "rwlock"],
        default="all",
        help="the lock kind, or all (default all: the kinds of KINDS); rwlock: an RWLock "
        "with workers that read (70%%) and write",
    )
    p.add_argument(
        "--seconds",
        type=positive_float,
        default=10.0,
        help="how long to torture each kind (default 10)",
    )
    p.add_argument("--workers", type=positive_int, default=4, help="worker processes (default 4)")
    p.add_argument("--seed", type=int, help="seed the random kills (default: random)")
    p.add_argument(
        "--load",
        action="store_true",
        help="load the machine on purpose: a CPU hog pinned to each CPU, workers at mixed "
        "nice levels and policies, so preemption lands inside protocol steps",
    )
    p.add_argument(
        "--asyncio",
        action="store_true",
        help="every other worker is an event loop whose tasks use acquire_async (their "
        "waits given up by timeouts and cancellations too)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the results as JSON (the lines go to stderr)"
    )
    p.set_defaults(func=cmd_torture)
