"""The shmlocks pytest plugin (registered through the ``pytest11`` entry point).

- fixture ``shmlock``: a factory, ``shmlock("mcs")`` (any kind, the create() keywords
  too), whose locks are closed, and their segments unlinked, after the test;
- ``--shmlocks-check-leaks``: the session fails if its tests left shmlocks segments in
  /dev/shm: the listing of our user's segments at the end is compared with the one at the
  start, so segments made by the processes the tests start count too; under pytest-xdist
  the controller checks, once, for every worker;
- ``--shmlocks-lockdep``: lock-order validation (SHMLOCKS_LOCKDEP=1) for the session and
  every process it starts: an acquire that inverts a recorded order raises LockOrderError.

Nothing of shmlocks is imported until a test uses the fixture or an option is given, so a
suite that does not use it is not slowed down.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shmlocks")
    group.addoption(
        "--shmlocks-check-leaks",
        action="store_true",
        help="fail the session if its tests leave shmlocks segments in /dev/shm",
    )
    group.addoption(
        "--shmlocks-lockdep",
        action="store_true",
        help="lock-order validation across processes (SHMLOCKS_LOCKDEP=1) for the session "
        "and the processes it starts",
    )


def _shmlocks_segments() -> dict[str, tuple[int, int, int]]:
    """{name: (inode, creator pid, creator pid namespace)} of the shmlocks segments in
    /dev/shm that belong to our user. Each entry is hostile input, read the one safe way
    (shmlocks/_shmread.py): opened without following links or blocking (a FIFO), skipped
    unless a regular file, its header read with pread (never a mapping a truncation could
    turn into SIGBUS)."""
    from shmlocks import _core, _shmread

    lay = _core.LAYOUT  # shm_header's offsets (shmlocks/_ext/sys/shm_layout.h)
    n = lay["header_fields"]
    uid = os.getuid()
    found: dict[str, tuple[int, int, int]] = {}
    for name, (head, st) in _shmread.entries(_core.SHM_DIR, n)[0].items():
        if st.st_uid == uid and len(head) == n:
            pid = struct.unpack_from("<I", head, lay["creator_pid_off"])[0]
            ns = struct.unpack_from("<Q", head, lay["creator_pidns_off"])[0]
            found[name] = (st.st_ino, pid, ns)
    return found


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _whose(pid: int, ns: int, root: int) -> str | None:
    """Why a new segment made by ``pid`` counts as the session's: None if it does not (its
    creator is alive and not the session process or one of its descendants: another
    program on the machine)."""
    if ns and ns != _our_pidns():
        return f"created in another PID namespace (pid {pid} there)"
    if not os.path.exists(f"/proc/{pid}"):
        return f"created by pid {pid}, which has exited"
    p, steps = pid, 0
    while p > 1 and steps < 256:
        if p == root:
            what = "the test session" if pid == root else "a process the tests started"
            return f"created by pid {pid} ({what}), still running"
        p, steps = _parent(p), steps + 1
    return None


def _our_pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _leaks(config: pytest.Config) -> list[tuple[str, str]]:
    """(name, why) of each shmlocks segment that appeared during the session and is still
    there: made by this process, its children (multiprocessing, subprocesses, pytest-xdist
    workers) or their children, whether or not they are still alive."""
    import gc

    gc.collect()  # creator objects the tests dropped are finalised (and unlink) here
    before = config.stash.get(_BEFORE, {})
    root = os.getpid()
    out = []
    for name, (ino, pid, ns) in sorted(_shmlocks_segments().items()):
        if before.get(name, (None,))[0] == ino:
            continue  # there before the session began
        why = _whose(pid, ns, root)
        if why is not None:
            out.append((name, why))
    return out


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--shmlocks-lockdep"):
        os.environ["SHMLOCKS_LOCKDEP"] = "1"  # read by every process the tests start
        from shmlocks import lockdep

        lockdep.enable("error")  # this one, if shmlocks was imported already
    if config.getoption("--shmlocks-check-leaks") and not _is_xdist_worker(config):
        # the controller alone checks, over the whole session: its listing is taken before
        # any worker starts and after every worker has exited
        config.stash[_BEFORE] = _shmlocks_segments()


_BEFORE = pytest.StashKey[dict[str, tuple[int, int, int]]]()
_LEFT = pytest.StashKey[list[tuple[str, str]]]()
_STAT_KEY = "shmlocks leak check failed"


@pytest.hookimpl(trylast=True)  # after pytest-xdist has shut its workers down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _BEFORE not in config.stash:
        return
    left = _leaks(config)
    config.stash[_LEFT] = left
    if not left:
        return
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.stats.setdefault(_STAT_KEY, []).append(left)  # on the "N passed" line
    else:
        print(_leak_text(left))


def _shm_dir() -> str:
    from shmlocks import _core

    return _core.SHM_DIR


def _leak_text(left: list[tuple[str, str]]) -> str:
    names = ", ".join(n for n, _ in left)
    lines = [f"shmlocks: the tests left {len(left)} segment(s) in {_shm_dir()}: {names}"]
    lines += [f"  {n}: {why}" for n, why in left]
    lines.append("(--shmlocks-check-leaks: close every lock and region a test creates)")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    left = config.stash.get(_LEFT, None)
    if left:
        terminalreporter.write_sep("=", "shmlocks leak check", red=True)
        for line in _leak_text(left).splitlines():
            terminalreporter.write_line(line, red=True)


@pytest.fixture
def shmlock():
    """Factory: ``shmlock(kind, **create_kwargs)`` makes a lock (a fresh segment with a
    generated name unless ``name=`` is given), closed and unlinked after the test."""
    import shmlocks

    made = []

    def make(kind: str = "mcs", **kwargs):
        if kind not in shmlocks.KINDS:
            raise ValueError(f"unknown lock kind {kind!r}: expected one of {list(shmlocks.KINDS)}")
        lock = shmlocks.KINDS[kind].create(**kwargs)
        path = os.path.join(shmlocks._core.SHM_DIR, lock.name)
        made.append((lock, path, os.stat(path).st_ino))
        return lock

    yield make
    for lock, path, ino in reversed(made):
        try:
            lock.close()  # the creator's close unlinks its segment (not a persist=True one)
        except Exception:  # noqa: BLE001 - teardown goes on
            pass
        try:  # what is left, if the name still names this lock's segment, not a newer one
            if os.stat(path).st_ino == ino:
                os.unlink(path)
        except OSError:
            pass
