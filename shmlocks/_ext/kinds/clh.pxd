# clh.pxd -- CLH queue lock: the interface of clh.pxi (the kind contract it implements:
# base/kind.pxd; its word table: the top of clh.pxi).

# The node states (clh.pxi's word table) and what a look at the queue ahead finds
# (_clh_look), shared with the compact stripe (clhc.pxi).
cdef enum:
    C_FREE = 0
    C_BUSY = 1
    C_ABANDONED = 2
    C_RECLAIMING = 3
    C_RECLAIMED = 4
    C_ASIDE = 0x40000000      # | round & C_ASIDE_MASK: its owner waits aside (§7.0)
    C_ASIDE_MASK = 0x3fffffff
    C_UNKNOWN = SHM_ID_UNKNOWN
    # still in the queue (every state from 30 up is bit 30: queue.pxd queue_state_in)
    C_QUEUED = (1 << C_BUSY) | (1 << C_ABANDONED) | (1 << C_RECLAIMING) | (1 << 30)


cdef inline uint32_t _clh_aside_st(uint32_t rnd) noexcept nogil:
    """The state of a node whose owner waits aside in the passage of round rnd."""
    return C_ASIDE | (rnd & C_ASIDE_MASK)


cdef inline bint _clh_is_aside(uint32_t st) noexcept nogil:
    return (st >> 30) == 1


cdef enum:
    LOOK_FREE = 0         # its pred is FREE: it holds the lock
    LOOK_ABANDONED = 1    # its pred is abandoned: reclaim it
    LOOK_WAIT = 2         # wait on what the context says
    LOOK_CORRUPT = 3


cdef void _clh_grow(shm_body* b, uint32_t lo, uint32_t hi) noexcept nogil


cdef class CLHLock(_Lock):
    # overrides _fast, _try, _wait, _unlock, _is_locked, _aside_end (base/kind.pxd); adds:
    cdef inline int _enqueue(self, uint32_t me, uint32_t X, bint armed) noexcept nogil
