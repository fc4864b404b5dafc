"""shmlocks: interprocess locks in POSIX shared memory.

Six kinds behind one API (see KINDS): FIFO ticket, MCS and CLH queue locks, a futex mutex,
and robust and priority-inheritance pthread mutexes. Every lock lives in a Region (a named
segment in /dev/shm); locks pickle by name, survive their holder's death (owner_died), and
release the GIL while they wait.
"""

import os as _os
import sys as _sys

if not _sys.platform.startswith("linux"):
    raise ImportError(
        "shmlocks runs on Linux only: it is built on futex(2) and glibc's "
        f"robust process-shared mutexes (this is {_sys.platform})"
    )

try:
    from shmlocks._core import (
        CACHE_LINE,
        KINDS,
        LAYOUT_VERSION,
        CLHLock,
        FutexMutex,
        MCSLock,
        PIMutex,
        Region,
        RobustMutex,
        TicketLock,
        _crashpoints,
        get_deadlock_timeout,
        set_deadlock_timeout,
    )
    from shmlocks._core import _user_crashpoint as crashpoint
except ModuleNotFoundError as _e:  # pragma: no cover - depends on the install
    if _e.name == "shmlocks._core":
        raise ImportError(
            "shmlocks' compiled core is missing: this looks like the uncompiled source tree. "
            "Install it with `python -m pip install -e .` (or `pip install .`) first."
        ) from None
    raise

from shmlocks.errors import (
    CapacityError,
    CorruptRegionError,
    DeadlockError,
    LockKindError,
    LockNotRecoverableError,
    LockOrderError,
    LockOrderWarning,
    NamespaceError,
    NotOwnerError,
    ShmLockError,
)

__version__ = "0.1.0"

if _os.environ.get("SHMLOCKS_LOCKDEP"):  # lock-order validation: 1 (error) or warn
    from shmlocks import lockdep as _lockdep

    _lockdep.enable(_lockdep.mode_from_env(_os.environ["SHMLOCKS_LOCKDEP"]))

_MAGIC_BYTES = (0x314B434F4C4D4853).to_bytes(8, "little")  # b"SHMLOCK1"
_SHM_DIR = "/dev/shm"


def is_region_file(path: str) -> bool:
    """True if the file at ``path`` starts with the shmlocks region magic."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == _MAGIC_BYTES
    except OSError:
        return False


def list_regions() -> list[str]:
    """Names of the shmlocks regions in /dev/shm, sorted."""
    import os

    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return []
    return sorted(n for n in names if is_region_file(os.path.join(_SHM_DIR, n)))


__all__ = [
    "CACHE_LINE",
    "KINDS",
    "LAYOUT_VERSION",
    "CLHLock",
    "CapacityError",
    "CorruptRegionError",
    "DeadlockError",
    "FutexMutex",
    "LockKindError",
    "LockNotRecoverableError",
    "LockOrderError",
    "LockOrderWarning",
    "MCSLock",
    "NamespaceError",
    "NotOwnerError",
    "PIMutex",
    "Region",
    "RobustMutex",
    "ShmLockError",
    "TicketLock",
    "_crashpoints",
    "crashpoint",
    "get_deadlock_timeout",
    "is_region_file",
    "list_regions",
    "set_deadlock_timeout",
]
