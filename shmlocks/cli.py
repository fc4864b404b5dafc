"""The ``shmlocks`` command line: ``ls``, ``inspect``, ``deadlocks``, ``stat``, ``top``,
``prune``, ``unlink``, ``demo``, ``lockdep``, ``bench`` and ``torture``.

Every command reads /dev/shm as untrusted input (shmlocks/_shmread.py: no symlink, no FIFO,
only files of trusted owners) and the read-only ones work from a validated private copy of
each segment read with pread (shmlocks/_segment.py), never a mapping. An expected failure (a missing or invalid name, a segment
that is not a shmlocks region, a permission problem) is reported as one line,
``shmlocks: error: ...``, with exit status 1, never as a traceback.

Each command prints through shmlocks/_table.py: a table for people, ``--json`` for scripts.
The demo is shmlocks/demo.py, the torture shmlocks/torture.py, ``deadlocks`` (and what
``inspect`` shows of waits) shmlocks/deadlocks.py.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import shmlocks
from shmlocks import _segment, _shmread
from shmlocks._core import _check_name, _pid_alive
from shmlocks._table import emit, human_size, table
from shmlocks.deadlocks import annotate
from shmlocks.deadlocks import register as register_deadlocks
from shmlocks.lockdep import register as register_lockdep
from shmlocks.stats_cli import register as register_stat
from shmlocks.top import register as register_top

SHM_DIR = Path(shmlocks._core.SHM_DIR)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An expected failure: printed as one ``shmlocks: error:`` line, exit status 1."""


# --------------------------------------------------------------------------------------------
# names and segments


def segment_name(raw: str) -> str:
    """Normalise a user-given segment name with the package's own check (Region.create and
    Region.open use it): one leading ``/`` is accepted and stripped."""
    try:
        return str(_check_name(raw))
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from None


def _require_region(name: str) -> Path:
    """The /dev/shm path of a shmlocks region called ``name``, or a CliError saying why not.
    Read the safe way (shmlocks/_shmread.py): a FIFO, a symlink, a directory or a file of
    an untrusted user is an error at once, never a hang."""
    path = SHM_DIR / name
    try:
        head = _shmread.read_head(str(path), len(_shmread.MAGIC))
    except FileNotFoundError:
        raise CliError(f"no shared-memory segment named {name!r}") from None
    except _shmread.Refused as e:
        raise CliError(f"{name!r}: refused, {e.why}") from None
    except PermissionError:
        raise CliError(f"{name!r}: permission denied") from None
    except OSError as e:
        raise CliError(f"{name!r}: {e.strerror or e}") from None
    if head != _shmread.MAGIC:
        raise CliError(f"{name!r} is not a shmlocks segment (no shmlocks magic at its start)")
    return path


def _describe(name: str) -> dict[str, Any]:
    """``Region._describe()``'s snapshot, from a validated private copy of the segment
    read with pread (shmlocks/_segment.py), never a mapping: a segment that shrinks
    meanwhile is an error, not SIGBUS, and nothing is attached or written."""
    return _segment.describe(_segment.read(name))


# --------------------------------------------------------------------------------------------
# formatting


def _who(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"
    where = " (other namespace)" if p.get("other_namespace") else ""
    return f"pid {p['pid']} tid {p['tid']}{where} {'alive' if p['alive'] else 'DEAD'}"


def _creator(d: dict[str, Any]) -> tuple[str, bool | None]:
    """The creator's state for people, and for --json (None: its pid is another PID
    namespace's, not ours to look up)."""
    if d.get("creator_other_namespace"):
        return "other namespace", None
    alive = _pid_alive(int(d["creator_pid"]))
    return ("alive" if alive else "gone"), alive


def _flags(lock: dict[str, Any]) -> str:
    names = {
        "owner_died": "owner_died",
        "not_recoverable": "NOT-RECOVERABLE",
        "stale_step": "stale-step",
    }
    return ",".join(text for f, text in names.items() if lock.get(f)) or "-"


# --------------------------------------------------------------------------------------------
# ls, inspect, unlink


def cmd_ls(args: argparse.Namespace) -> int:
    found, notes = _shmread.scan(str(SHM_DIR))
    names = sorted(found)
    records: list[dict[str, Any]] = []
    for name in names:
        rec: dict[str, Any] = {"name": name}
        try:
            d = _describe(name)
        except FileNotFoundError:
            continue  # removed since the listing
        except (shmlocks.ShmLockError, OSError, ValueError) as e:
            rec["error"] = _error_text(e)
        else:
            parts = d.get("participants", [])
            rec.update(
                size=d["size"],
                locks=len(d.get("locks", [])),
                max_locks=d.get("max_locks"),
                alive=sum(1 for p in parts if p["alive"]),
                dead=sum(1 for p in parts if not p["alive"]),
                max_participants=d.get("max_participants"),
                creator_pid=d["creator_pid"],
                creator_state=_creator(d)[0],
                creator_alive=_creator(d)[1],
            )
        records.append(rec)
    emit(records, args.json, _render_ls)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return EXIT_OK


def _render_ls(records: list[dict[str, Any]]) -> str:
    if not records:
        return f"no shmlocks segments in {SHM_DIR}"
    rows: list[list[object]] = []
    for r in records:
        if "error" in r:
            rows.append([r["name"], "?", "?", "?", "?", f"unreadable: {r['error']}"])
            continue
        rows.append(
            [
                r["name"],
                human_size(r["size"]),
                f"{r['locks']}/{r['max_locks']}",
                f"{r['alive']} alive, {r['dead']} dead",
                r["max_participants"],
                f"{r['creator_pid']} ({r['creator_state']})",
            ]
        )
    out = table(["NAME", "SIZE", "LOCKS", "PARTICIPANTS", "SLOTS", "CREATOR"], rows)
    stale = sum(1 for r in records if r.get("creator_alive") is False and r.get("alive") == 0)
    if stale:
        out += (
            f"\nnote: {stale} segment{'s' if stale != 1 else ''} with the creator gone and no "
            "live participant: `shmlocks prune` removes what nobody has open (--dry-run: "
            "which)"
        )
    return out


def cmd_inspect(args: argparse.Namespace) -> int:
    name = segment_name(args.name)
    _require_region(name)
    d = annotate(_describe(name))
    state, alive = _creator(d)
    emit(dict(d, creator_alive=alive, creator_state=state), args.json, _render_inspect)
    return EXIT_OK


def _render_inspect(d: dict[str, Any]) -> str:
    out = [
        f"segment {d['name']}: {human_size(d['size'])} ({d['size']} bytes), "
        f"layout version {d['version']}, created by pid {d['creator_pid']} ({d['creator_state']})"
    ]
    locks = d.get("locks", [])
    out.append(f"locks: {len(locks)} of {d['max_locks']}")
    if locks:
        rows = [
            [
                lk["name"],
                lk["kind"],
                "held" if lk["locked"] else "free",
                _who(lk.get("holder")) if lk["locked"] else "-",
                lk["waiters"],
                _flags(lk),
            ]
            for lk in locks
        ]
        out.append(table(["NAME", "KIND", "STATE", "HOLDER", "WAITERS", "FLAGS"], rows, "  "))
    parts = d.get("participants", [])
    alive = sum(1 for p in parts if p["alive"])
    out.append(
        f"participants: {len(parts)} of {d['max_participants']} slots in use "
        f"({alive} alive, {len(parts) - alive} dead)"
    )
    if parts:
        rows = [
            [
                p["slot"],
                p["pid"],
                p["tid"],
                ("alive" if p["alive"] else "DEAD")
                + (", other namespace" if p.get("other_namespace") else ""),
                ",".join(p["holds"]) or "-",
                p["waits_for"] or "-",
                "-" if p["waiting_s"] is None else f"{p['waiting_s']:.3f} s",
            ]
            for p in parts
        ]
        out.append(
            table(["SLOT", "PID", "TID", "STATE", "HOLDS", "WAITS FOR", "WAITING"], rows, "  ")
        )
    dead_holders = [
        lk["name"]
        for lk in locks
        if lk["locked"] and lk.get("holder") and not lk["holder"]["alive"]
    ]
    if dead_holders:
        out.append(
            "note: held by a dead thread: "
            + ", ".join(dead_holders)
            + " (the next acquire recovers it and sees owner_died=True)"
        )
    stale = [lk["name"] for lk in locks if lk.get("stale_step")]
    if stale:
        out.append(
            "note: free, with a dead thread's unfinished acquire or release step: "
            + ", ".join(stale)
            + " (the next acquire completes it and gets the lock, owner_died=False)"
        )
    return "\n".join(out)


def cmd_unlink(args: argparse.Namespace) -> int:
    import posix_ipc  # type: ignore[import-not-found, unused-ignore]

    name = segment_name(args.name)
    if not args.force:
        _require_region(name)
    elif not os.path.lexists(SHM_DIR / name):
        raise CliError(f"no shared-memory segment named {name!r}")
    try:
        posix_ipc.unlink_shared_memory("/" + name)
    except posix_ipc.ExistentialError as e:
        raise CliError(f"no shared-memory segment named {name!r}") from e
    except posix_ipc.PermissionsError as e:
        raise CliError(f"{name!r}: permission denied") from e
    emit(
        {"unlinked": name},
        args.json,
        lambda _: f"unlinked {name} (processes that have it mapped keep working)",
    )
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# prune


def _prune_verdict(name: str) -> tuple[str | None, dict[str, Any]]:
    """Why segment ``name`` must be kept (None: it is stale, nobody can be using it), and
    what was seen of it."""
    try:
        d = _describe(name)
    except FileNotFoundError:
        return "gone", {}
    except (shmlocks.ShmLockError, OSError, ValueError) as e:
        return f"unreadable ({_error_text(e)})", {}
    seen: dict[str, Any] = {"size": d["size"], "creator_pid": d["creator_pid"]}
    state, alive = _creator(d)
    seen["creator_state"] = state
    live = sum(1 for p in d.get("participants", []) if p["alive"])
    seen["live_participants"] = live
    if live:
        return f"{live} live participant{'s' if live != 1 else ''}", seen
    if alive is None:
        return "its creator is in another PID namespace", seen
    if alive:
        return f"its creator (pid {d['creator_pid']}) is alive", seen
    return None, seen


def _prune_one(name: str, dry_run: bool) -> dict[str, Any]:
    path = SHM_DIR / name
    rec: dict[str, Any] = {"name": name}
    try:
        # our own descriptor, taken first: a process that has the segment open holds a
        # shared flock on it (Region.open), so a non-blocking exclusive one fails; held
        # across the unlink, it keeps an opener from attaching between our look and it
        # (opened the one safe way: no symlink, no FIFO, a regular file of a trusted user)
        fd, st = _shmread.open_file(str(path))
    except FileNotFoundError:
        return dict(rec, action="kept", reason="gone")
    except _shmread.Refused as e:
        return dict(rec, action="kept", reason=e.why)
    except OSError as e:
        return dict(rec, action="kept", reason=f"unreadable ({_error_text(e)})")
    try:
        reason, seen = _prune_verdict(name)
        rec.update(seen)
        if reason is not None:
            return dict(rec, action="kept", reason=reason)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return dict(rec, action="kept", reason="open in a process")
        if os.stat(path, follow_symlinks=False).st_ino != st.st_ino:
            return dict(rec, action="kept", reason="replaced while looked at")
        if dry_run:
            return dict(rec, action="would remove", reason="creator gone, nobody alive")
        os.unlink(path)
        return dict(rec, action="removed", reason="creator gone, nobody alive")
    except FileNotFoundError:
        return dict(rec, action="kept", reason="gone")
    except PermissionError:
        return dict(rec, action="kept", reason="permission denied")
    finally:
        os.close(fd)  # (drops the flock)


def cmd_prune(args: argparse.Namespace) -> int:
    if args.names:
        names = []
        for raw in args.names:
            n = segment_name(raw)
            _require_region(n)
            names.append(n)
    else:
        names = shmlocks.list_regions()
    records = [_prune_one(n, args.dry_run) for n in names]
    emit(records, args.json, _render_prune)
    return EXIT_OK


def _render_prune(records: list[dict[str, Any]]) -> str:
    if not records:
        return f"no shmlocks segments in {SHM_DIR}"
    rows = [
        [
            r["name"],
            human_size(r["size"]) if "size" in r else "?",
            f"{r['creator_pid']} ({r['creator_state']})" if "creator_pid" in r else "?",
            r.get("live_participants", "?"),
            r["action"],
            r["reason"],
        ]
        for r in records
    ]
    return table(["NAME", "SIZE", "CREATOR", "ALIVE", "ACTION", "WHY"], rows)


# --------------------------------------------------------------------------------------------
# bench


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


# --------------------------------------------------------------------------------------------
# demo (shmlocks/demo.py)


def cmd_demo(args: argparse.Namespace) -> int:
    from shmlocks import demo

    try:
        ok = demo.run(args.start_method, args.workers, args.iterations, args.handoff, args.json)
    except demo.DemoError as e:
        raise CliError(str(e)) from e
    return EXIT_OK if ok else EXIT_ERROR


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


# --------------------------------------------------------------------------------------------
# torture


def cmd_torture(args: argparse.Namespace) -> int:
    from shmlocks import torture

    if args.workers > torture.MAX_WORKERS:
        raise CliError(f"--workers: at most {torture.MAX_WORKERS}")
    kinds = list(shmlocks.KINDS) if args.kind == "all" else [args.kind]
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        out = sys.stderr if args.json else sys.stdout
        results = torture.main(
            kinds, args.seconds, args.workers, seed=args.seed, out=out, load=args.load
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


# --------------------------------------------------------------------------------------------
# entry point


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _add_demo(sub: Any) -> None:
    """The demo command's arguments."""
    p = sub.add_parser(
        "demo", help="workers under each lock kind, a SIGKILLed holder recovered, a hand-off table"
    )
    p.add_argument(
        "--workers", type=_positive_int, default=4, help="processes per lock kind (default 4)"
    )
    p.add_argument(
        "--iterations",
        type=_positive_int,
        default=20000,
        help="increments per worker (default 20000)",
    )
    p.add_argument(
        "--handoff",
        type=_positive_float,
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


def _add_bench(sub: Any) -> None:
    """The bench command's arguments."""
    p = sub.add_parser("bench", help="the cross-process benchmark suite (bench/run.py)")
    p.add_argument("--full", action="store_true", help="the full suite rather than the quick one")
    p.add_argument("--smoke", action="store_true", help="a few seconds, every code path (CI)")
    p.add_argument("--out", metavar="DIR", help="where to write the JSON and plots")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)


def _add_torture(sub: Any) -> None:
    """The torture command's arguments."""
    p = sub.add_parser(
        "torture",
        help="SIGKILL random holders and waiters of each lock kind; check exact recovery",
        description=(
            "Workers increment a shared counter under the lock while a killer SIGKILLs "
            "random workers (holders and waiters) and restarts them. Reports kills, "
            "recoveries (owner_died seen), the worst time from a death to the next "
            "acquisition, mutual-exclusion violations, wedges and leaked slots; exits 1 if "
            "any occurred."
        ),
    )
    p.add_argument(
        "--kind",
        choices=["all", *shmlocks.KINDS],
        default="all",
        help="the lock kind, or all (default all)",
    )
    p.add_argument(
        "--seconds",
        type=_positive_float,
        default=10.0,
        help="how long to torture each kind (default 10)",
    )
    p.add_argument("--workers", type=_positive_int, default=4, help="worker processes (default 4)")
    p.add_argument("--seed", type=int, help="seed the random kills (default: random)")
    p.add_argument(
        "--load",
        action="store_true",
        help="load the machine on purpose: a CPU hog pinned to each CPU, workers at mixed "
        "nice levels and policies, so preemption lands inside protocol steps",
    )
    p.add_argument(
        "--json", action="store_true", help="print the results as JSON (the lines go to stderr)"
    )
    p.set_defaults(func=cmd_torture)


def _add_ls_inspect(sub: Any) -> None:
    """The ls and inspect commands' arguments."""
    p = sub.add_parser("ls", help="the shmlocks segments on this machine")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser(
        "inspect", help="each lock in a segment: kind, holder (alive or dead), waiters"
    )
    p.add_argument("name", metavar="NAME", help="segment name (a leading / is optional)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)


def _add_prune(sub: Any) -> None:
    """The prune command's arguments."""
    p = sub.add_parser(
        "prune",
        help="remove stale segments: creator gone, no live participant, not open anywhere",
        description="Remove the name of every shmlocks segment (or of the NAMEs given) "
        "that nobody can be using: its creator has exited, no participant is alive, and "
        "no process has it open. Anything else is kept, with the reason.",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="segments to consider (default: all)")
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be removed, remove nothing"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_prune)


def _add_unlink(sub: Any) -> None:
    """The unlink command's arguments."""
    p = sub.add_parser("unlink", help="remove a segment's name")
    p.add_argument("name", metavar="NAME", help="segment name (a leading / is optional)")
    p.add_argument(
        "--force", action="store_true", help="unlink even if it is not a shmlocks segment"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_unlink)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shmlocks",
        description="Interprocess locks in POSIX shared memory: inspect, clean up, demonstrate.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {shmlocks.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_demo(sub)
    _add_bench(sub)
    _add_torture(sub)
    _add_ls_inspect(sub)
    register_deadlocks(sub)
    register_lockdep(sub)
    register_stat(sub)
    register_top(sub)
    _add_prune(sub)
    _add_unlink(sub)
    return parser


def _error_text(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError):
        return f"no such segment: {e.filename}" if e.filename else "no such segment"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = str(e) or type(e).__name__
    return text.splitlines()[0]


def _fail(args: argparse.Namespace, text: str) -> int:
    """Every command's error, in one form: the ``shmlocks: error: ...`` line on stderr,
    and with ``--json`` also ``{"error": ...}`` on stdout (what a script parses)."""
    print(f"shmlocks: error: {text}", file=sys.stderr)
    if getattr(args, "json", False):
        emit({"error": text}, True, str)
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        return _fail(args, str(e))
    except (shmlocks.ShmLockError, OSError, ValueError) as e:
        return _fail(args, _error_text(e))


if __name__ == "__main__":
    raise SystemExit(main())
