# deadlock.pxd -- a blocked acquire that is part of a wait-for cycle gives up with
# DeadlockError (docs/design.md §9): the interface of deadlock.pxi. The walk is given the
# waiting participant (w.rm, w.dl_slot), never a lock object; the caller names what it
# waited for in the error (dl_raise).

cdef int64_t g_dl_timeout_ns                # the deadlock timeout, ns; -1: off
cdef int64_t DL_RECHECK_NS                  # a waiter past its timeout walks this often
cdef void dl_end(wait_t* w) noexcept nogil
cdef object dl_found(wait_t* w)
cdef object dl_raise(str what, found)
# the chain walk for a waiter that is not a blocked thread (an asyncio cohort's driver,
# docs/design.md §9 "The walk's entry point")
cdef int dl_chain_walk(rmap_t* rm, uint32_t slot, uint32_t lock, uint64_t task,
                       int64_t since, int detects, char** text, int* members) noexcept nogil


cdef inline void dl_arm(wait_t* w, rmap_t* rm, uint32_t me, int64_t now) noexcept nogil:
    """Slow path, before op_step = WAITING: publish in participant `me` of region rm (the
    wait's w.rm) since when (`now`) it waits and whether it looks for deadlocks, and arm
    the chain walk: at the wait's first sleep (never before: a wait that ends spinning
    costs nothing more), then at its deadlock timeout and every DL_RECHECK_NS, and when
    poked. Every waiter walks (and pokes a victim it finds), whether its process detects
    or not; only one that detects gives up, once its timeout has passed."""
    cdef shm_participant* p = &rm.part[me]
    st64_rlx(&p.wait_since, <uint64_t>now)
    st32_rlx(&p.detects, g_dl_timeout_ns >= 0)
    w.dl_state = 1
    w.dl_slot = me
    w.dl_next = -1
    w.dl_from = now + g_dl_timeout_ns if g_dl_timeout_ns >= 0 else -1
    w.dl_last = 0
    w.dl_poke = ld32_rlx(&p.poke)
    w.dl_hit = 0
    w.dl_members = 0
    w.dl_text = NULL
    w.dl_linked = 0
    w.dl_outer = NULL
