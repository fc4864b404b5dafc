"""Run a scenario whose attack is a file in /dev/shm in a child process with a private,
empty tmpfs mounted on /dev/shm (``unshare -m``): the hostile FIFO, symlink or shrinking
segment is never seen by anyone else's /dev/shm, nor by the other tests of the run.

Needs root and unshare(1); ``requires_private_shm`` skips a test, with the reason, where
that is not available.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

__all__ = ["requires_private_shm", "run_private", "PRIVATE_SHM_SIZE"]

PRIVATE_SHM_SIZE = "64m"

_MOUNT = 'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"'


def _argv(argv: list[str], size: str) -> list[str]:
    return [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        _MOUNT.format(size=size),
        "sh",
        *argv,
    ]


@functools.cache
def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (unshare -m and a tmpfs mount on /dev/shm)"
    if shutil.which("unshare") is None:
        return "needs unshare(1) (util-linux)"
    try:
        p = subprocess.run(_argv(["true"], "1m"), capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare -m does not work here: {e}"
    if p.returncode != 0:
        return f"unshare -m does not work here: {p.stderr.decode(errors='replace').strip()}"
    return None


#: skips a test (with the reason) unless a private tmpfs on /dev/shm can be made
requires_private_shm = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


def run_private(
    code: str, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code args`` in a private mount namespace with an empty tmpfs on
    /dev/shm; returns the finished process (stdout, stderr as text)."""
    argv = [sys.executable, "-c", textwrap.dedent(code), *args]
    return subprocess.run(
        _argv(argv, PRIVATE_SHM_SIZE),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )
