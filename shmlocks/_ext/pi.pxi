# pi.pxi -- priority-inheritance robust mutex.
#
# Invariant: as robust.pxi, plus PTHREAD_PRIO_INHERIT: the futex word holds the owner's
# TID and a contended lock is FUTEX_LOCK_PI, so the kernel boosts the holder to the
# highest waiter's priority (rt_mutex) until it unlocks. It must be robust too: glibc
# aborts a process waiting on a non-robust PI mutex whose owner died. No user-space
# spinning: a waiter goes to the kernel at once so the boost applies at once.

cdef class PIMutex(_PthreadMutexLock):
    """Priority-inheritance robust mutex: waiters are served in priority order and the
    holder runs at the highest waiter's priority."""
    kind_name = "pi"

    cdef bint _spin(self) noexcept nogil:
        return 0
