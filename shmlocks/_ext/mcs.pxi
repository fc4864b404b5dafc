# mcs.pxi -- MCS queue lock with abandonable nodes (indices, not pointers).
#
# Invariant: tail = index + 1 of the last node in the queue (0 = free); the head of the
# queue holds the lock; each waiter spins (then parks) on its own node's state, and the
# release writes its successor's state once. Participant p's node is node[p].
#
#   word A   u32 tail
#   node[p]  state   IDLE 0 -> WAIT 1 -> GRANT 2 ; WAIT -> ABANDONED 3 (timeout/signal)
#                    ABANDONED -> WAIT (the thread that left comes back) | -> PASSING 4
#                    -> IDLE (a releaser passes the lock through it)
#            value   generation of the participant (thread) that abandoned it: a new thread
#                    inheriting the slot waits for IDLE instead of jumping the queue
#            next    successor index + 1, linked by the successor after its swap of tail
#            parked  the owner announced it parks on state
#
# Release vs. abandonment: the releaser CASes the successor WAIT -> GRANT; the waiter
# leaving CASes WAIT -> ABANDONED. Exactly one wins. A releaser that finds ABANDONED takes
# it (ABANDONED -> PASSING), so its owner cannot rejoin, reads its next, frees it (IDLE)
# and moves on to the next node, or empties the queue if the abandoned node was the tail.
# (Mellor-Crummey & Scott, TOCS 1991; timeouts after Scott & Scherer, PPoPP 2001.)

cdef enum:
    M_IDLE = 0
    M_WAIT = 1
    M_GRANT = 2
    M_ABANDONED = 3
    M_PASSING = 4


cdef bint _mcs_not_waiting(void* c) noexcept nogil:
    return ld32_seq(&(<shm_node*>c).state) != M_WAIT


cdef bint _mcs_not_passing(void* c) noexcept nogil:
    cdef uint32_t st = ld32_seq(&(<shm_node*>c).state)
    return st != M_PASSING and st != M_ABANDONED


cdef uint32_t _await_link(uint32_t* link) noexcept nogil:
    """Wait for a successor that has swapped the tail to link itself (a few instructions
    away, unless it was descheduled)."""
    cdef uint32_t v
    cdef int i = 0
    while True:
        v = ld32_acq(link)
        if v != 0:
            return v
        i += 1
        if i < 256:
            cpu_relax()
        else:
            sched_yield()


cdef class MCSLock(_Lock):
    """FIFO MCS queue lock: each waiter spins on its own cache line."""
    kind_name = "mcs"

    cdef inline uint32_t* _tail(self) noexcept nogil:
        return &self.b.wa.u32[0]

    cdef int _enqueue(self, uint32_t me) noexcept nogil:
        cdef shm_node* n = &self.b.nodes[me]
        cdef uint32_t pred
        st32_rlx(&n.next, 0)
        st32_rlx(&n.state, M_WAIT)
        pred = xchg32(self._tail(), me + 1)          # join the queue (SC: publishes n)
        if pred == 0:
            st32_rlx(&n.state, M_GRANT)
            return R_ACQ
        if pred > self.b.P or pred == me + 1:
            return R_CORRUPT
        st32_seq(&self.b.nodes[pred - 1].next, me + 1)    # link behind the predecessor
        return R_PENDING

    cdef int _fast(self, uint32_t me) noexcept nogil:
        if ld32_acq(&self.b.nodes[me].state) != M_IDLE:
            return R_BUSY
        return self._enqueue(me)

    cdef int _try(self, uint32_t me) noexcept nogil:
        cdef shm_node* n = &self.b.nodes[me]
        if ld32_acq(&n.state) != M_IDLE:
            return R_BUSY
        st32_rlx(&n.next, 0)
        st32_rlx(&n.state, M_GRANT)
        if cas32(self._tail(), 0, me + 1):
            return R_ACQ
        st32_rlx(&n.state, M_IDLE)
        return R_BUSY

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef shm_node* n = &self.b.nodes[me]
        cdef uint32_t st
        cdef int res
        if rc == R_BUSY:
            st = ld32_acq(&n.state)
            if (st == M_ABANDONED and n.value == ld64_rlx(&self.rm.part[me].generation)
                    and cas32(&n.state, M_ABANDONED, M_WAIT)):
                pass                                 # back in our old place in the queue
            elif st == M_WAIT or st == M_GRANT:
                return R_CORRUPT
            else:
                if st == M_PASSING or st == M_ABANDONED:   # a releaser has yet to pass it
                    res = wait_for(_mcs_not_passing, n, &n.state, &n.parked, w)
                    if res != W_READY:
                        return R_SIGNAL if res == W_SIGNAL else R_TIMEOUT
                if ld32_acq(&n.state) != M_IDLE:
                    return R_CORRUPT
                rc = self._enqueue(me)
                if rc != R_PENDING:
                    return rc
        res = wait_for(_mcs_not_waiting, n, &n.state, &n.parked, w)
        if res == W_READY:
            return R_ACQ if ld32_acq(&n.state) == M_GRANT else R_CORRUPT
        st64_rel(&n.value, ld64_rlx(&self.rm.part[me].generation))
        if cas32(&n.state, M_WAIT, M_ABANDONED):     # leave; a releaser will pass through
            return R_SIGNAL if res == W_SIGNAL else R_TIMEOUT
        return R_ACQ                                 # granted as we were leaving

    cdef int _pass(self, uint32_t s) noexcept nogil:
        """Hand the lock to node s-1, passing through abandoned nodes."""
        cdef shm_node* m
        cdef uint32_t nx, guard = 0
        while True:
            if s == 0 or s > self.b.P:
                return R_CORRUPT
            m = &self.b.nodes[s - 1]
            if cas32(&m.state, M_WAIT, M_GRANT):
                wake_if_parked(&m.state, &m.parked)
                return 0
            if cas32(&m.state, M_ABANDONED, M_PASSING):
                nx = ld32_acq(&m.next)
                if nx == 0:
                    if cas32(self._tail(), s, 0):    # the abandoned node was last: now free
                        st32_seq(&m.state, M_IDLE)
                        wake_if_parked(&m.state, &m.parked)
                        return 0
                    nx = _await_link(&m.next)
                st32_seq(&m.state, M_IDLE)           # its owner may reuse it now
                wake_if_parked(&m.state, &m.parked)
                s = nx
            # else its owner rejoined (ABANDONED -> WAIT) between our two CASes: retry
            guard += 1
            if guard > 4 * self.b.P + 64:
                return R_CORRUPT

    cdef int _unlock(self, uint32_t me) noexcept nogil:
        cdef shm_node* n = &self.b.nodes[me]
        cdef uint32_t succ = ld32_acq(&n.next)
        if succ == 0:
            if cas32(self._tail(), me + 1, 0):       # no one behind us: free
                st32_rel(&n.state, M_IDLE)
                return 0
            succ = _await_link(&n.next)
        st32_rel(&n.state, M_IDLE)
        return self._pass(succ)

    cdef bint _is_locked(self) noexcept nogil:
        return ld32_acq(self._tail()) != 0
