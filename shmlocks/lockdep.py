"""Lock-order validation across processes ("lockdep"; docs/design.md §11).

Invariant: the recorded orders form an acyclic graph of lock classes (a class is a lock's
name: ``region/lock``, or the region's name for a standalone lock); an acquire that would
add an edge closing a cycle is refused (LockOrderError) or reported (LockOrderWarning)
before it waits, and not recorded.

``SHMLOCKS_LOCKDEP=1`` (error) or ``=warn`` in the environment, read when shmlocks is
imported, turns it on for the process. The graph is shared by every process of the user
on the machine: an append-only file of JSON lines in /dev/shm (tmpfs: shared memory),
``shmlocks-lockdep-<uid>`` unless ``SHMLOCKS_LOCKDEP_GRAPH`` names another path. It
lives until ``shmlocks lockdep --reset`` or a reboot, and exists only once some process
ran with lockdep on. Each process caches the graph and the lock chains it has validated
(the held classes + the class acquired, hashed as a tuple), so a repeated order costs a
set lookup; only a new chain reads the file's new lines and, for a new order, appends one
under an flock.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import sys
import threading
import warnings
from typing import Any

from shmlocks import _core
from shmlocks.errors import LockOrderError, LockOrderWarning

MAX_ORDERS = 4096  # recorded orders; past this, validation turns itself off (one warning)

_mode: str | None = None  # None (off), "error" or "warn"


class _Held(threading.local):
    """Per thread: the classes it holds, in order (the core's diag/lockdep.pxd pushes and
    pops). Thread local, not keyed by thread ident: an ident is reused by the next thread
    once its thread ends, and that thread holds nothing."""

    def __init__(self) -> None:
        self.stack: list[str] = []


_held = _Held()
_validated: set[tuple[tuple[str, ...], str]] = set()  # the chain cache
_orders: dict[tuple[str, str], dict[str, Any]] = {}  # (a, b) -> first call site
_succ: dict[str, set[str]] = {}
_pos = 0  # bytes of the graph file read so far
_ino = 0


def graph_path() -> str:
    return (
        os.environ.get("SHMLOCKS_LOCKDEP_GRAPH")
        or f"{_core.SHM_DIR}/shmlocks-lockdep-{os.getuid()}"
    )


def mode_from_env(value: str | None) -> str | None:
    v = (value or "").strip().lower()
    if v in ("", "0", "off", "no", "false"):
        return None
    return "warn" if v == "warn" else "error"


def enabled() -> str | None:
    return _mode


def enable(mode: str | None) -> None:
    """Turn validation on ("error", "warn") or off (None) for this process."""
    global _mode
    from shmlocks import _core

    if mode not in (None, "error", "warn"):
        raise ValueError(f"lockdep mode must be 'error', 'warn' or None, not {mode!r}")
    _mode = mode
    _core._lockdep_hook(sys.modules[__name__] if mode else None)


def _forget_held() -> None:
    _held.stack = []


# a forked child is one new thread that holds none of its parent's locks
os.register_at_fork(after_in_child=_forget_held)


# ------------------------------------------------------------------------------ the file


_OPEN_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY


def _open(create: bool) -> int:
    """The graph file, for appending (``create``: made if missing) or for reading.

    It sits at a predictable path in world-writable /dev/shm, so it is believed only if it
    is ours: a new file is made with O_EXCL (never one somebody else planted first), and
    whatever is opened must be a regular file owned by our effective uid and writable by
    nobody else (PermissionError otherwise). O_NOFOLLOW|O_NONBLOCK: a symlink fails, a FIFO
    does not block the open."""
    path = graph_path()
    for _ in range(8):  # a --reset between our two opens: make it again
        if create:
            try:
                fd = os.open(
                    path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o600
                )
            except FileExistsError:
                pass
            else:
                break
        try:
            fd = os.open(path, (os.O_RDWR | os.O_APPEND if create else os.O_RDONLY) | _OPEN_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
            continue
        break
    else:
        raise FileNotFoundError(f"lockdep graph {path}: removed as fast as it is made")
    try:
        _check_ours(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_ours(fd: int, path: str) -> None:
    st = os.fstat(fd)
    why = ""
    if not stat.S_ISREG(st.st_mode):
        why = "it is not a regular file"
    elif st.st_uid != os.geteuid():
        why = f"it is owned by uid {st.st_uid}, not by this process's uid {os.geteuid()}"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"it is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if why:
        raise PermissionError(
            f"lockdep graph {path}: refused, {why}; remove it or set "
            "SHMLOCKS_LOCKDEP_GRAPH to a path of your own"
        )


def _read_records(fd: int, start: int) -> tuple[list[dict[str, Any]], int]:
    size = os.fstat(fd).st_size
    data = os.pread(fd, size - start, start) if size > start else b""
    end = data.rfind(b"\n") + 1  # a line still being written is read next time
    out = []
    for line in data[:end].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a scribbled line is ignored
        if isinstance(rec, dict) and isinstance(rec.get("order"), list):
            out.append(rec)
    return out, start + end


def _sync(fd: int) -> None:
    """Take in the lines other processes appended since our last read (all of them if
    the file was reset or replaced)."""
    global _pos, _ino
    st = os.fstat(fd)
    if st.st_ino != _ino or st.st_size < _pos:
        _orders.clear()
        _succ.clear()
        _validated.clear()
        _pos, _ino = 0, st.st_ino
    recs, _pos = _read_records(fd, _pos)
    for rec in recs:
        if rec.get("kind", "order") != "order":
            continue
        a, b = (str(x) for x in rec["order"][:2])
        if (a, b) not in _orders:
            _orders[(a, b)] = rec
            _succ.setdefault(a, set()).add(b)


def _path(src: str, dst: str) -> list[str] | None:
    """A path of recorded orders src -> ... -> dst, or None."""
    prev: dict[str, str] = {src: src}
    todo = [src]
    while todo:
        x = todo.pop()
        for y in _succ.get(x, ()):
            if y not in prev:
                prev[y] = x
                if y == dst:
                    path = [y]
                    while path[-1] != src:
                        path.append(prev[path[-1]])
                    return path[::-1]
                todo.append(y)
    return None


#: frames of these files are not the acquire's call site: this one, and the asyncio side
#: (an awaited acquire_async runs in shmlocks/_aio.py's coroutines)
_INNER = (__file__, os.path.join(os.path.dirname(__file__), "_aio.py"))


def _site() -> dict[str, Any]:
    f: Any = sys._getframe(2)  # 0: here, 1: before(); acquire/__enter__ are C (no frame)
    while f is not None and f.f_code.co_filename in _INNER:
        f = f.f_back
    if f is None:
        return {"file": "?", "line": 0, "function": "?", "pid": os.getpid()}
    return {
        "file": f.f_code.co_filename,
        "line": f.f_lineno,
        "function": f.f_code.co_name,
        "pid": os.getpid(),
    }


def _stacklevel() -> int:
    """warnings.warn's stacklevel for the caller of this function: the first frame outside
    this module, the user's acquire (acquire and __enter__ are C: they have no frame)."""
    f: Any = sys._getframe(1)
    level = 1
    while f is not None and f.f_code.co_filename in _INNER:
        f = f.f_back
        level += 1
    return level


def _where(rec: dict[str, Any]) -> str:
    return f"{rec.get('file')}:{rec.get('line')} in {rec.get('function')}() (pid {rec.get('pid')})"


# ------------------------------------------------------------------ the acquire-side hooks


def before(cls: str, held: list[str]) -> None:
    """A blocking acquire of class `cls`, by a thread that holds `held` in a chain not
    validated yet, is about to wait: validate and record the orders held -> cls. Raises
    LockOrderError (or warns) if one would close a cycle."""
    global _mode
    if not held:
        return
    chain = (tuple(held), cls)
    if chain in _validated:
        return
    site = _site()
    fd = _open(create=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _sync(fd)
        for a in dict.fromkeys(held):
            if a == cls or (a, cls) in _orders:
                continue
            back = _path(cls, a)
            if back is not None:
                _report(fd, a, cls, back, site, chain)
                return
        new = [a for a in dict.fromkeys(held) if a != cls and (a, cls) not in _orders]
        if len(_orders) + len(new) > MAX_ORDERS:
            _mode = None
            enable(None)
            warnings.warn(
                f"shmlocks lockdep: the order graph is full ({len(_orders)} orders in "
                f"{graph_path()}): lock-order validation is off for this process "
                "(`shmlocks lockdep --reset` clears it)",
                RuntimeWarning,
                stacklevel=_stacklevel(),
            )
            return
        lines = b""
        for a in new:
            rec = dict(site, kind="order", order=[a, cls])
            _orders[(a, cls)] = rec
            _succ.setdefault(a, set()).add(cls)
            lines += json.dumps(rec).encode() + b"\n"
        if lines:
            os.write(fd, lines)
    finally:
        os.close(fd)  # also drops the flock
    _validated.add(chain)


def _report(fd: int, a: str, b: str, back: list[str], site: dict[str, Any], chain: Any) -> None:
    cycle = [f"  {a} -> {b}: this acquire, at {_where(site)}"]
    for x, y in zip(back, back[1:], strict=False):
        cycle.append(f"  {x} -> {y}: recorded at {_where(_orders[(x, y)])}")
    msg = (
        f"lock order inversion: acquiring {b!r} while holding {a!r}, but the order "
        f"{b} -> ... -> {a} was recorded before (possible deadlock):\n" + "\n".join(cycle)
    )
    rec = dict(site, kind="inversion", order=[a, b], cycle=back, mode=_mode)
    os.write(fd, json.dumps(rec).encode() + b"\n")
    if _mode == "warn":
        _validated.add(chain)  # warn once per chain
        warnings.warn(msg, LockOrderWarning, stacklevel=_stacklevel())
        return
    raise LockOrderError(msg)


# ------------------------------------------------------------------------ command line


def snapshot() -> dict[str, Any]:
    """The recorded orders and inversions (what `shmlocks lockdep --json` prints)."""
    try:
        fd = _open(create=False)
    except FileNotFoundError:
        return {"graph": graph_path(), "orders": [], "inversions": []}
    try:
        recs, _ = _read_records(fd, 0)
    finally:
        os.close(fd)
    orders, seen, inv = [], set(), []
    for r in recs:
        o = tuple(str(x) for x in r["order"][:2])
        item = {
            "from": o[0],
            "to": o[1],
            "file": r.get("file"),
            "line": r.get("line"),
            "function": r.get("function"),
            "pid": r.get("pid"),
        }
        if r.get("kind") == "inversion":
            inv.append(dict(item, cycle=r.get("cycle", [])))
        elif o not in seen:
            seen.add(o)
            orders.append(item)
    return {"graph": graph_path(), "orders": orders, "inversions": inv}


def reset() -> bool:
    """Clear the graph (every process sees it empty at its next new chain)."""
    try:
        os.unlink(graph_path())
    except FileNotFoundError:
        return False
    return True
