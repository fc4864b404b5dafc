"""The exceptions of shmlocks (README.md says when each is raised); all subclass
ShmLockError."""

__all__ = [
    "ShmLockError",
    "NotOwnerError",
    "DeadlockError",
    "LockNotRecoverableError",
    "LockKindError",
    "CorruptRegionError",
    "CapacityError",
    "NamespaceError",
]


class ShmLockError(Exception):
    """Base class of every shmlocks error."""


class NotOwnerError(ShmLockError, RuntimeError):
    """release() (or mark_consistent()) by a thread that does not hold the lock."""


class DeadlockError(ShmLockError, RuntimeError):
    """A thread tried to acquire a lock it already holds (the locks are not reentrant)."""


class LockNotRecoverableError(ShmLockError):
    """The lock was released without mark_consistent() after its owner died."""


class LockKindError(ShmLockError, TypeError):
    """A lock was opened as the wrong kind."""


class CorruptRegionError(ShmLockError, ValueError):
    """The segment is not a valid shmlocks region (foreign, truncated or scribbled)."""


class CapacityError(ShmLockError):
    """No free participant slot or lock slot."""


class NamespaceError(ShmLockError):
    """A lock that cannot work across PID namespaces (pi: the kernel names a priority-
    inheritance futex's owner by thread id, which differs between namespaces) was opened
    from a namespace other than its region's creator's."""
