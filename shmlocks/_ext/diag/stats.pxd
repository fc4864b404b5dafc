# stats.pxd -- per-lock statistics, kept in the lock's ctl line (docs/design.md §10).
# Invariant: the holder alone writes acquisitions, handoffs, contended, wait_*_ns,
# last_pid and owner_deaths, with plain (relaxed, untorn) stores while it holds the lock;
# timeouts are added atomically by the waiter that gave up; a reset stores zeros
# atomically. Every field is a number shown as read, never used as an index. owner_deaths
# and timeouts are 32 bits and wrap (the room lets a table's stripe be one line,
# docs/design.md §15); the others are 64.

cdef dict stats_read(shm_lockctl* c)
cdef void stats_reset(shm_lockctl* c) noexcept nogil


cdef inline void stats_hold(shm_lockctl* c, uint32_t pid) noexcept nogil:
    """A hold begins (the caller holds the lock). `pid`: the holder's process."""
    cdef uint32_t last = ld32_rlx(&c.last_pid)
    st64_rlx(&c.acquisitions, ld64_rlx(&c.acquisitions) + 1)
    if last != pid:
        if last != 0:
            st64_rlx(&c.handoffs, ld64_rlx(&c.handoffs) + 1)
        st32_rlx(&c.last_pid, pid)


cdef inline void stats_waited(shm_lockctl* c, int64_t ns) noexcept nogil:
    """The coming hold went through the slow path for `ns` (the caller holds the lock)."""
    cdef uint64_t t = <uint64_t>ns if ns > 0 else 0
    st64_rlx(&c.contended, ld64_rlx(&c.contended) + 1)
    st64_rlx(&c.wait_total_ns, ld64_rlx(&c.wait_total_ns) + t)
    if t > ld64_rlx(&c.wait_max_ns):
        st64_rlx(&c.wait_max_ns, t)


cdef inline void stats_owner_death(shm_lockctl* c) noexcept nogil:
    """The hold that just began follows an owner death (the caller holds the lock)."""
    st32_rlx(&c.owner_deaths, ld32_rlx(&c.owner_deaths) + 1)


cdef inline void stats_timeout(shm_lockctl* c) noexcept nogil:
    """A timed acquire gave up: the caller does not hold the lock, so an atomic add."""
    fadd32(&c.timeouts, 1)
