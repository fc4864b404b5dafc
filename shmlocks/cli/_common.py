"""What every command of the CLI shares: the exit statuses, the one error form
(``shmlocks: error: ...``), segment names and the safe look at a segment, argument types
and the formatting of holders and creators.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import shmlocks
from shmlocks import _segment, _shmread
from shmlocks._core import _check_name, _pid_alive
from shmlocks._table import emit

SHM_DIR = Path(shmlocks._core.SHM_DIR)
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An expected failure: printed as one ``shmlocks: error:`` line, exit status 1."""


def segment_name(raw: str) -> str:
    """Normalise a user-given segment name with the package's own check (Region.create and
    Region.open use it): one leading ``/`` is accepted and stripped."""
    try:
        return str(_check_name(raw))
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from None


def _open_error(name: str, e: OSError) -> CliError:
    """What the commands say when segment ``name`` cannot be opened or read safely."""
    if isinstance(e, FileNotFoundError):
        return CliError(f"no shared-memory segment named {name!r}")
    if isinstance(e, _shmread.Refused):
        return CliError(f"{name!r}: refused, {e.why}")
    if isinstance(e, PermissionError):
        return CliError(f"{name!r}: permission denied")
    return CliError(f"{name!r}: {e.strerror or e}")


def _not_a_segment(name: str) -> CliError:
    return CliError(f"{name!r} is not a shmlocks segment (no shmlocks magic at its start)")


def require_region(name: str) -> Path:
    """The /dev/shm path of a shmlocks region called ``name``, or a CliError saying why not.
    Read the safe way (shmlocks/_shmread.py): a FIFO, a symlink, a directory or a file of
    an untrusted user is an error at once, never a hang."""
    path = SHM_DIR / name
    try:
        head = _shmread.read_head(str(path), len(_shmread.MAGIC))
    except OSError as e:
        raise _open_error(name, e) from None
    if head != _shmread.MAGIC:
        raise _not_a_segment(name)
    return path


def read_region(name: str) -> _segment.Segment:
    """Segment ``name``, read once (one open): the checks and errors of
    ``require_region``, then the validated private copy ``describe`` reads
    (shmlocks/_segment.py ``read_fd``, through the same open file)."""
    path = SHM_DIR / name
    try:
        fd, st = _shmread.open_file(str(path))
    except OSError as e:
        raise _open_error(name, e) from None
    try:
        try:
            first = os.pread(fd, _segment.HEADER_SIZE, 0)
        except OSError as e:
            raise CliError(f"{name!r}: {e.strerror or e}") from None
        if not first.startswith(_shmread.MAGIC):
            raise _not_a_segment(name)
        return _segment.read_fd(fd, st, name, first)
    finally:
        os.close(fd)


def required_regions(raws: list[str]) -> list[str]:
    """The segment names given on a command line, each normalised and checked to be a
    readable shmlocks region (segment_name, then require_region): the first bad one is a
    CliError."""
    names = []
    for raw in raws:
        name = segment_name(raw)
        require_region(name)
        names.append(name)
    return names


def describe(name: str) -> dict[str, Any]:
    """``Region._describe()``'s snapshot, from a validated private copy of the segment
    read with pread (shmlocks/_segment.py), never a mapping: a segment that shrinks
    meanwhile is an error, not SIGBUS, and nothing is attached or written."""
    return _segment.describe(_segment.read(name))


def who(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"
    where = " (other namespace)" if p.get("other_namespace") else ""
    task = f" (task {p['task']!r})" if p.get("task") is not None else ""
    return f"pid {p['pid']} tid {p['tid']}{task}{where} {'alive' if p['alive'] else 'DEAD'}"


def creator(d: dict[str, Any]) -> tuple[str, bool | None]:
    """The creator's state for people, and for --json (None: its pid is another PID
    namespace's, not ours to look up)."""
    if d.get("creator_other_namespace"):
        return "other namespace", None
    alive = _pid_alive(int(d["creator_pid"]))
    return ("alive" if alive else "gone"), alive


def flags(lock: dict[str, Any]) -> str:
    names = {
        "owner_died": "owner_died",
        "not_recoverable": "NOT-RECOVERABLE",
        "stale_step": "stale-step",
    }
    return ",".join(text for f, text in names.items() if lock.get(f)) or "-"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def error_text(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError):
        return f"no such segment: {e.filename}" if e.filename else "no such segment"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = str(e) or type(e).__name__
    return text.splitlines()[0]


def fail(args: argparse.Namespace, text: str) -> int:
    """Every command's error, in one form: the ``shmlocks: error: ...`` line on stderr,
    and with ``--json`` also ``{"error": ...}`` on stdout (what a script parses)."""
    print(f"shmlocks: error: {text}", file=sys.stderr)
    if getattr(args, "json", False):
        emit({"error": text}, True, str)
    return EXIT_ERROR
