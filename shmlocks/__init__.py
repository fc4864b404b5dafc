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
    ReentryError,
    ShmLockError,
)


def _installed_elsewhere() -> str | None:
    """The folder of a shmlocks package that the import system would find if this source
    tree were not on sys.path (an installed copy this tree shadows), or None."""
    import importlib.machinery

    here = _os.path.dirname(_os.path.dirname(_os.path.realpath(__file__)))
    path = [p for p in _sys.path if _os.path.realpath(p or _os.curdir) != here]
    for finder in _sys.meta_path:
        try:
            if finder is importlib.machinery.PathFinder:
                spec = finder.find_spec("shmlocks", path)
            else:
                spec = finder.find_spec("shmlocks", None)
        except Exception:  # noqa: BLE001 - a third-party finder's trouble is not ours
            continue
        origin = spec.origin if spec is not None else None
        if origin and _os.path.dirname(_os.path.dirname(_os.path.realpath(origin))) != here:
            return _os.path.dirname(origin)
    return None


def _core_elsewhere() -> str | None:
    """Where the import system finds ``shmlocks._core`` when it is not beside this file
    (another tree's, through an editable install's finder), or None."""
    here = _os.path.dirname(_os.path.realpath(__file__))
    for finder in _sys.meta_path:
        try:
            spec = finder.find_spec("shmlocks._core", [here])
        except Exception:  # noqa: BLE001 - a third-party finder's trouble is not ours
            continue
        if spec is not None and spec.origin:
            origin = _os.path.realpath(spec.origin)
            return None if _os.path.dirname(origin) == here else origin
    return None


try:
    from shmlocks._core import (
        CACHE_LINE,
        KINDS,
        LAYOUT_VERSION,
        OBJECTS,
        Barrier,
        BoundedSemaphore,
        CLHLock,
        Condition,
        Event,
        FutexMutex,
        Held,
        Lock,
        LockTable,
        MCSLock,
        PIMutex,
        Region,
        RobustMutex,
        RWLock,
        Semaphore,
        TicketLock,
        _crashpoints,  # noqa: F401 - importable (tests, README), not in __all__
        get_deadlock_timeout,
        hold_all,
        hold_all_async,
        index_of,
        set_deadlock_timeout,
        stable_hash,
    )
    from shmlocks._core import SHM_DIR as _SHM_DIR
    from shmlocks._core import _user_crashpoint as crashpoint
    from shmlocks.rlock import RLock
except ModuleNotFoundError as _e:  # pragma: no cover - depends on the install
    if _e.name == "shmlocks._core":
        _other = _installed_elsewhere()
        if _other is not None:
            raise ImportError(
                f"shmlocks' compiled core is missing from {_os.path.dirname(__file__)}: this "
                f"is the uncompiled source tree, and it shadows the shmlocks installed in "
                f"{_other}, because Python puts the current directory (or the script's) first "
                "on sys.path. Run from another directory, or build this tree in place with "
                "`python -m pip install -e .`."
            ) from None
        raise ImportError(
            "shmlocks' compiled core is missing: this looks like the uncompiled source tree. "
            "Install it with `python -m pip install -e .` (or `pip install .`) first."
        ) from None
    raise
except ImportError as _e:  # pragma: no cover - depends on the install
    _foreign = _core_elsewhere()
    if _foreign is None:
        raise
    raise ImportError(
        f"{_e}: this shmlocks ({_os.path.dirname(__file__)}) has no compiled core of its "
        f"own, and the one found, {_foreign}, belongs to another shmlocks tree (an editable "
        "install), which this one shadows because Python puts the current directory (or "
        "the script's) first on sys.path. Run from another directory, or build this tree "
        "in place with `python -m pip install -e .`."
    ) from None

__version__ = "0.1.0"

if _os.environ.get("SHMLOCKS_LOCKDEP"):  # lock-order validation: 1 (error) or warn
    from shmlocks import lockdep as _lockdep

    _lockdep.enable(_lockdep.mode_from_env(_os.environ["SHMLOCKS_LOCKDEP"]))


def is_region_file(path: str) -> bool:
    """True if the file at ``path`` starts with the shmlocks region magic. Read the safe
    way (shmlocks/_shmread.py): a symlink, a FIFO or anything else that is not a regular
    file, or a file of a user not trusted (``SHMLOCKS_TRUST_UIDS``), is False, at once."""
    from shmlocks import _shmread

    try:
        return _shmread.read_head(path, len(_shmread.MAGIC)) == _shmread.MAGIC
    except OSError:
        return False


def list_regions() -> list[str]:
    """Names of the shmlocks regions in /dev/shm, sorted: regular files owned by a trusted
    user (this process's, root, or one listed in ``SHMLOCKS_TRUST_UIDS``) that start with
    the shmlocks magic. Nothing else in /dev/shm is opened (shmlocks/_shmread.py)."""
    from shmlocks import _shmread

    return sorted(_shmread.scan(_SHM_DIR)[0])


__all__ = [
    "CACHE_LINE",
    "KINDS",
    "LAYOUT_VERSION",
    "OBJECTS",
    "Lock",
    "Barrier",
    "BoundedSemaphore",
    "CLHLock",
    "Condition",
    "Event",
    "CapacityError",
    "CorruptRegionError",
    "DeadlockError",
    "FutexMutex",
    "Held",
    "LockKindError",
    "LockNotRecoverableError",
    "LockTable",
    "LockOrderError",
    "LockOrderWarning",
    "MCSLock",
    "NamespaceError",
    "NotOwnerError",
    "PIMutex",
    "RLock",
    "ReentryError",
    "Region",
    "RobustMutex",
    "RWLock",
    "Semaphore",
    "ShmLockError",
    "TicketLock",
    "crashpoint",
    "get_deadlock_timeout",
    "hold_all",
    "hold_all_async",
    "index_of",
    "is_region_file",
    "list_regions",
    "set_deadlock_timeout",
    "stable_hash",
]
