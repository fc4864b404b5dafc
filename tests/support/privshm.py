"""Run a scenario whose attack is a file in /dev/shm in a child process with a private,
empty tmpfs mounted on /dev/shm (``unshare -m``): the hostile FIFO, symlink or shrinking
segment is never seen by anyone else's /dev/shm, nor by the other tests of the run.

Needs root and unshare(1); ``requires_private_shm`` skips a test, with the reason, where
that is not available (``private_shm_unavailable`` says why, for a test that runs without
one instead). ``run_private`` runs ``python -c``; ``private_argv`` wraps any command (an
inner pytest session, say) for a runner of the caller's own.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

__all__ = [
    "PRIVATE_SHM_SIZE",
    "private_argv",
    "private_shm_unavailable",
    "requires_private_shm",
    "run_private",
]

PRIVATE_SHM_SIZE = "64m"

_MOUNT = 'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"'


def private_argv(argv: list[str], size: str = PRIVATE_SHM_SIZE) -> list[str]:
    """``argv`` run in a new private mount namespace, with an empty tmpfs of ``size``
    mounted on /dev/shm first."""
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
def private_shm_unavailable() -> str | None:
    """Why a private tmpfs on /dev/shm cannot be made here, or None where it can."""
    if os.geteuid() != 0:
        return "needs root (unshare -m and a tmpfs mount on /dev/shm)"
    if shutil.which("unshare") is None:
        return "needs unshare(1) (util-linux)"
    try:
        p = subprocess.run(private_argv(["true"], "1m"), capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare -m does not work here: {e}"
    if p.returncode != 0:
        return f"unshare -m does not work here: {p.stderr.decode(errors='replace').strip()}"
    return None


#: skips a test (with the reason) unless a private tmpfs on /dev/shm can be made
requires_private_shm = pytest.mark.skipif(
    private_shm_unavailable() is not None, reason=private_shm_unavailable() or ""
)


def run_private(
    code: str,
    *args: str,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    size: str = PRIVATE_SHM_SIZE,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code args`` in a private mount namespace with an empty tmpfs of
    ``size`` on /dev/shm; returns the finished process (stdout, stderr as text)."""
    argv = [sys.executable, "-c", textwrap.dedent(code), *args]
    return subprocess.run(
        private_argv(argv, size),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )
