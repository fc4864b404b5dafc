"""The shmlocks pytest plugin (registered through the ``pytest11`` entry point).

- fixture ``shmlock``: a factory, ``shmlock("mcs")`` (any kind, the create() keywords
  too), whose locks are closed, and their segments unlinked, after the test;
- ``--shmlocks-check-leaks``: the session fails if its tests left shmlocks segments that
  this process created in /dev/shm (each pytest-xdist worker checks its own);
- ``--shmlocks-lockdep``: lock-order validation (SHMLOCKS_LOCKDEP=1) for the session and
  every process it starts: an acquire that inverts a recorded order raises LockOrderError.

Nothing of shmlocks is imported until a test uses the fixture or an option is given, so a
suite that does not use it is not slowed down.
"""

from __future__ import annotations

import os
import struct

import pytest

_SHM = "/dev/shm"
_MAGIC = b"SHMLOCK1"
_CREATOR_OFF = 68  # shm_header.creator_pid


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


def _ours() -> set[str]:
    """The shmlocks segments in /dev/shm that this process created."""
    me = os.getpid()
    found: set[str] = set()
    try:
        names = os.listdir(_SHM)
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(_SHM, name), "rb") as f:
                head = f.read(_CREATOR_OFF + 4)
        except OSError:
            continue
        if head[:8] == _MAGIC and len(head) == _CREATOR_OFF + 4:
            if struct.unpack_from("<I", head, _CREATOR_OFF)[0] == me:
                found.add(name)
    return found


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--shmlocks-lockdep"):
        os.environ["SHMLOCKS_LOCKDEP"] = "1"  # read by every process the tests start
        from shmlocks import lockdep

        lockdep.enable("error")  # this one, if shmlocks was imported already
    if config.getoption("--shmlocks-check-leaks"):
        config.stash[_BEFORE] = _ours()


_BEFORE = pytest.StashKey[set[str]]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not config.getoption("--shmlocks-check-leaks"):
        return
    before: set[str] = config.stash[_BEFORE] if _BEFORE in config.stash else set()
    left = sorted(_ours() - before)
    if left:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        text = f"shmlocks: the tests left {len(left)} segment(s) in {_SHM}: {', '.join(left)}"
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def shmlock():
    """Factory: ``shmlock(kind, **create_kwargs)`` makes a lock (a fresh segment with a
    generated name unless ``name=`` is given), closed and unlinked after the test."""
    import shmlocks

    made = []

    def make(kind: str = "mcs", **kwargs):
        lock = shmlocks.KINDS[kind].create(**kwargs)
        made.append(lock)
        return lock

    yield make
    for lock in reversed(made):
        try:
            lock.close()
        except Exception:  # noqa: BLE001 - teardown goes on
            pass
