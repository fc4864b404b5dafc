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
    "ReentryError",
    "LockOrderError",
    "LockOrderWarning",
]


class ShmLockError(Exception):
    """Base class of every shmlocks error."""


class NotOwnerError(ShmLockError, RuntimeError):
    """release() (or mark_consistent()) by a thread that does not hold the lock."""


class DeadlockError(ShmLockError, RuntimeError):
    """A thread tried to acquire a lock it already holds (the locks are not reentrant), or
    its blocked acquire was the one member of a wait-for cycle to give up."""


class LockOrderError(DeadlockError):
    """Lock-order validation (SHMLOCKS_LOCKDEP=1): this acquire would invert an order of
    locks recorded before, by this process or another; raised before it waits."""


class LockOrderWarning(ShmLockError, RuntimeWarning):
    """As LockOrderError, with SHMLOCKS_LOCKDEP=warn: the acquire goes on. A shmlocks
    error as every other (an ``except ShmLockError`` catches it where warnings are turned
    into errors, ``-W error``), and a RuntimeWarning for warning filters."""


class LockNotRecoverableError(ShmLockError):
    """The lock was released without mark_consistent() after its owner died: every acquire
    raises this until ``clear_not_recoverable()`` (then the next holder gets owner_died)."""


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


class ReentryError(ShmLockError, RuntimeError):
    """A lock call (acquire, release, a with block) made inside a signal handler, or a
    finalizer, that runs while the same thread waits in acquire() of a lock of the same
    region (or recovers a dead participant there): refused, because the thread's one
    participant there is in the middle of a protocol step. Take locks of that region
    outside the handler (set a flag in the handler), or use another region."""
