"""``shmlocks bench``: the cross-process benchmark suite (bench/run.py).

The suite lives in the source checkout, beside the package (bench/), not in the package:
it is found there (the checkout an editable install runs from, whatever the current
directory), or in the current directory (a checkout whose package was installed
otherwise). Installed without a checkout, the command says so (exit status 1).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from shmlocks.cli._common import CliError


def _find_bench() -> Path | None:
    """bench/run.py of the checkout holding this package (shmlocks/cli/bench.py is three
    levels below its root), else of the current directory."""
    candidates = [
        Path(__file__).resolve().parents[2] / "bench" / "run.py",
        Path.cwd() / "bench" / "run.py",
    ]
    for c in candidates:
        if c.is_file():
            return c
    return None


def cmd_bench(args: argparse.Namespace) -> int:
    script = _find_bench()
    if script is None:
        raise CliError(
            "the benchmark suite (bench/run.py) is in the source checkout, not in the "
            "installed package: run this from a checkout (installed with `python -m pip "
            "install -e .`, or from its root)"
        )
    cmd = [sys.executable, str(script)]
    if args.full:
        cmd.append("--full")
    if args.smoke:
        cmd.append("--smoke")
    if args.out:
        cmd += ["--out", os.path.abspath(args.out)]  # relative to the caller, not the repo
    if args.json:
        cmd.append("--json")
    cmd += args.bench_args
    return subprocess.call(cmd, cwd=script.parent.parent)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--full", action="store_true", help="the full suite rather than the quick one")
    p.add_argument("--smoke", action="store_true", help="a few seconds, every code path (CI)")
    p.add_argument("--out", metavar="DIR", help="where to write the JSON and plots")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as one JSON object (results.json's); the report goes to stderr",
    )
    # bench/run.py's other options (--repeats N, --locks A,B), after a `--`
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)
