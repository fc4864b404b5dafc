# deadlock.pxd -- a blocked acquire that is part of a wait-for cycle gives up with
# DeadlockError (docs/design.md §9): the interface of deadlock.pxi. The look is given the
# waiting participant (w.rm, w.dl_slot), never a lock object; the caller names
# what it waited for in the error (dl_raise).

cdef int64_t g_dl_timeout_ns                # the deadlock timeout, ns; -1: off
cdef object dl_raise(str what)


cdef inline void dl_arm(wait_t* w, rmap_t* rm, uint32_t me, int64_t now) noexcept nogil:
    """Slow path, before op_step = WAITING: publish in participant `me` of region rm (the
    wait's w.rm) since when (`now`) it waits and whether it looks for deadlocks, and
    schedule the first look."""
    cdef shm_participant* p = &rm.part[me]
    st64_rlx(&p.wait_since, <uint64_t>now)
    st32_rlx(&p.detects, g_dl_timeout_ns >= 0)
    if g_dl_timeout_ns >= 0:
        w.dl_next = now + g_dl_timeout_ns
        w.dl_slot = me
