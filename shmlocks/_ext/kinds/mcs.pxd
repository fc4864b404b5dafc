# mcs.pxd -- MCS queue lock: the interface of mcs.pxi (the kind contract it implements:
# base/kind.pxd; its word table: the top of mcs.pxi).

# a node's states (the word table: mcs.pxi); mcsc.pxi's compact stripe shares them
cdef enum:
    M_IDLE = 0
    M_WAIT = 1
    M_GRANT = 2
    M_ABANDONED = 3
    M_PASSING = 4
    M_UNKNOWN = SHM_ID_UNKNOWN


# park()'s ready for a waiter on its own node (READY once granted; FAR while the node
# ahead waits or left): mcsc.pxi's too
cdef int _mcs_not_waiting(void* c) noexcept nogil


cdef inline void _mcs_left(shm_qnode* n) noexcept nogil:
    """Node n left the queue or came back to it: its successor depends on someone else now
    (_mcs_dep watches n's state without counting in n.parked); wake it to look. Only on
    leaving and rejoining, never on a release."""
    shm_futex_wake(&n.state, 0x7fffffff)


cdef class MCSLock(_Lock):
    # overrides _fast, _try, _wait, _unlock, _is_locked (base/kind.pxd); adds:
    cdef inline int _enqueue(self, uint32_t me, bint armed) noexcept nogil
