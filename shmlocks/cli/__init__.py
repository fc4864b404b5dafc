"""The ``shmlocks`` command line: ``ls``, ``inspect``, ``deadlocks``, ``stat``, ``top``,
``prune``, ``unlink``, ``demo``, ``lockdep``, ``bench`` and ``torture``.

Every command reads /dev/shm as untrusted input (shmlocks/_shmread.py: no symlink, no FIFO,
only files of trusted owners) and the read-only ones work from a validated private copy of
each segment read with pread (shmlocks/_segment.py), never a mapping. An expected failure (a missing or invalid name, a segment
that is not a shmlocks region, a permission problem) is reported as one line,
``shmlocks: error: ...``, with exit status 1, never as a traceback.

The package: a table of the commands below (name -> module, summary), as pip's
commands/__init__.py has; a command's module (shmlocks/cli/<command>.py: its arguments,
``add_arguments``, and its handler) is imported only when that command runs or its
arguments are needed. What the commands share is shmlocks/cli/_common.py.

Each command prints through shmlocks/_table.py: a table for people, ``--json`` for scripts.
The demo is shmlocks/demo.py, the torture shmlocks/torture.py, ``deadlocks`` (and what
``inspect`` shows of waits) shmlocks/deadlocks.py.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

import shmlocks


class Command(NamedTuple):
    module: str  # defines add_arguments(parser), which sets the handler (func)
    summary: str  # the line ``shmlocks --help`` shows


#: every command, in the order ``shmlocks --help`` lists them
COMMANDS: dict[str, Command] = {
    "demo": Command(
        "shmlocks.cli.demo",
        "workers under each lock kind, a SIGKILLed holder recovered, a hand-off table",
    ),
    "bench": Command(
        "shmlocks.cli.bench",
        "the cross-process benchmark suite (bench/run.py)",
    ),
    "torture": Command(
        "shmlocks.cli.torture",
        "SIGKILL random holders and waiters of each lock kind; check exact recovery",
    ),
    "ls": Command(
        "shmlocks.cli.ls",
        "the shmlocks segments on this machine",
    ),
    "inspect": Command(
        "shmlocks.cli.inspect",
        "each lock in a segment: kind, holder (alive or dead), waiters",
    ),
    "deadlocks": Command(
        "shmlocks.cli.deadlocks",
        "every wait-for cycle across all segments; exit 3 if there is one",
    ),
    "lockdep": Command(
        "shmlocks.cli.lockdep",
        "the lock orders recorded with SHMLOCKS_LOCKDEP=1, and inversions found",
    ),
    "stat": Command(
        "shmlocks.cli.stat",
        "per-lock statistics of a segment: acquires, contention, waits, hand-offs",
    ),
    "top": Command(
        "shmlocks.cli.top",
        "a live view of the busiest locks on the machine (q or Ctrl-C quits)",
    ),
    "prune": Command(
        "shmlocks.cli.prune",
        "remove stale segments: creator gone, no live participant, not open anywhere",
    ),
    "unlink": Command(
        "shmlocks.cli.unlink",
        "remove a segment's name",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: every command's arguments, or only ``command``'s (so that only
    its module is imported; the others are listed with their summary, as before). Each
    command's own parser is in its ``subparsers`` attribute, by name."""
    parser = argparse.ArgumentParser(
        prog="shmlocks",
        description="Interprocess locks in POSIX shared memory: inspect, clean up, demonstrate.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {shmlocks.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    subparsers = {}
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.summary)
        if command is None or command == name:
            importlib.import_module(cmd.module).add_arguments(p)
        subparsers[name] = p
    parser.subparsers = subparsers  # type: ignore[attr-defined]
    return parser


def _parse(args_list: list[str]) -> argparse.Namespace:
    # the command is the first word that is not an option (the top level's take no value)
    i, command = next(
        ((i, a) for i, a in enumerate(args_list) if not a.startswith("-")), (len(args_list), None)
    )
    parser = build_parser(command if command in COMMANDS else None)
    args, extra = parser.parse_known_args(args_list)
    if extra:
        # an argument the command does not know is the command's usage error, with its
        # usage line, unless it came before the command (then it is the top level's)
        own = command in COMMANDS and not any(a in args_list[:i] for a in extra)
        target = parser.subparsers[command] if own else parser  # type: ignore[attr-defined]
        target.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    from shmlocks.cli._common import EXIT_ERROR, EXIT_INTERRUPTED, CliError, error_text, fail

    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("shmlocks: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `shmlocks ls | head`: the reader went away; say nothing more.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return EXIT_ERROR
    except CliError as e:
        return fail(args, str(e))
    except (shmlocks.ShmLockError, OSError, ValueError) as e:
        return fail(args, error_text(e))


if __name__ == "__main__":
    raise SystemExit(main())
