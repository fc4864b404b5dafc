"""``shmlocks bench``: the cross-process benchmark suite (bench/run.py)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from shmlocks.cli._common import (
    EXIT_USAGE,
)


def _find_bench() -> Path | None:
    candidates = [
        Path(__file__).resolve().parent.parent / "bench" / "run.py",
        Path.cwd() / "bench" / "run.py",
    ]
    for c in candidates:
        if c.is_file():
            return c
    return None


def cmd_bench(args: argparse.Namespace) -> int:
    script = _find_bench()
    if script is None:
        print(
            "shmlocks: error: bench suite not found (expected bench/run.py in a source checkout)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    cmd = [sys.executable, str(script)]
    if args.full:
        cmd.append("--full")
    if args.smoke:
        cmd.append("--smoke")
    if args.out:
        cmd += ["--out", os.path.abspath(args.out)]  # relative to the caller, not the repo
    cmd += args.bench_args
    return subprocess.call(cmd, cwd=script.parent.parent)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--full", action="store_true", help="the full suite rather than the quick one")
    p.add_argument("--smoke", action="store_true", help="a few seconds, every code path (CI)")
    p.add_argument("--out", metavar="DIR", help="where to write the JSON and plots")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)
