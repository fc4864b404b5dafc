# pi.pxi -- priority-inheritance robust mutex.
#
# Invariant: as robust.pxi, plus PTHREAD_PRIO_INHERIT: the futex word holds the owner's
# TID and a contended lock is FUTEX_LOCK_PI, so the kernel boosts the holder to the
# highest waiter's priority (rt_mutex) until it unlocks. It must be robust too: glibc
# aborts a process waiting on a non-robust PI mutex whose owner died.
# A real-time waiter (SCHED_FIFO/RR) blocks in FUTEX_LOCK_PI at once, so the boost applies
# at once. Any other waiter first spins on trylock for the wait policy's adaptive budget
# (at most SPIN_MAX_NS), as the robust kind does: a spinner can only take a mutex with no
# waiter queued in the kernel (the futex word then has FUTEX_WAITERS, and unlock hands it
# to the top waiter), so blocked waiters are still served in priority order, and a
# contended hand-off the spin catches skips two system calls and a cross-CPU wake-up
# (commit 1849df4 has the measurements).

cdef void _pi_init(shm_body* b) noexcept nogil:
    _robust_mutex_init(pm_mutex(b), 1)


cdef class PIMutex(_PthreadMutexLock):
    """Priority-inheritance robust mutex: waiters are served in priority order and the
    holder runs at the highest waiter's priority."""
    kind_name = "pi"
    kind_code = SHM_KIND_PI
    fifo = False
    recovery = "kernel"
    priority_inheritance = True

    cdef _bind(self, object region, uint32_t i, name):
        _Lock._bind(self, region, i, name)
        if other_pidns(self.rm.hdr.creator_pidns):
            raise NamespaceError(
                f"pi lock {name!r} of region {self._region.name!r} belongs to another PID "
                "namespace: the kernel names a "
                "priority-inheritance futex's owner by thread id, and thread ids differ "
                "between namespaces, so it cannot be shared across them (every other kind "
                "can)")

    cdef bint _spins(self) noexcept nogil:
        cdef int pol = sched_getscheduler(0)        # the slow path only
        return pol != SCHED_FIFO and pol != SCHED_RR


_register_kind(PIMutex, _pi_init, _pmutex_recover, 0)
