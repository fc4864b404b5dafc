# clh.pxi -- CLH queue lock with abandonable nodes (indices, not pointers).
#
# Invariant: tail is the index of the last node (never empty: a free lock's tail is a
# FREE node). A waiter spins (then parks) on its predecessor's node; a node's owner holds
# the lock once that node is FREE. Nodes travel: at release a participant adopts its
# predecessor's node (precs[p].mine := pred) and leaves its own in the queue for its
# successor. The pool has P + 1 nodes: one per participant, plus the lock's.
#
#   word A    u32 tail          node index 0..P
#   node[i]   state  FREE 0 (released) | BUSY 1 (owner waiting or holding)
#                    | ABANDONED 2 (owner left; successor must wait on node.pred instead)
#                    | RECLAIMING 3 -> RECLAIMED 4 (the successor took note and gave it back)
#             pred   predecessor index, published before ABANDONED
#             value  generation of the participant (thread) that abandoned it: only that
#                    thread rejoins in place; a new thread inheriting the slot waits
#   prec[p]   mine   the node p owns;  pred: the node p waits on and adopts at release
#
# Abandonment (Scott & Scherer, PPoPP 2001, "CLH-try"): if p is the tail, CAS the tail
# back to its predecessor and keep its node; else publish pred, then ABANDONED. The
# successor that sees ABANDONED takes it (ABANDONED -> RECLAIMING, so its owner cannot
# rejoin with a stale pred), reads pred, hands the node back (RECLAIMED) and waits on pred.
# An owner that comes back while still ABANDONED rejoins in place (ABANDONED -> BUSY).

cdef enum:
    C_FREE = 0
    C_BUSY = 1
    C_ABANDONED = 2
    C_RECLAIMING = 3
    C_RECLAIMED = 4


cdef bint _clh_not_busy(void* c) noexcept nogil:
    return ld32_seq(&(<shm_node*>c).state) != C_BUSY


cdef bint _clh_not_reclaiming(void* c) noexcept nogil:
    cdef uint32_t st = ld32_seq(&(<shm_node*>c).state)
    return st != C_RECLAIMING and st != C_ABANDONED


cdef void _clh_init(shm_body* b) noexcept nogil:
    cdef uint32_t i
    for i in range(b.P):
        b.precs[i].mine = i
    b.wa.u32[0] = b.P                                # the lock's own node, FREE


cdef class CLHLock(_Lock):
    """FIFO CLH queue lock: each waiter spins on its predecessor's cache line."""
    kind_name = "clh"

    cdef inline uint32_t* _tail(self) noexcept nogil:
        return &self.b.wa.u32[0]

    cdef int _enqueue(self, uint32_t me) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint32_t X = ld32_rlx(&r.mine)
        cdef uint32_t p
        if X > self.b.P:
            return R_CORRUPT
        st32_rlx(&self.b.nodes[X].state, C_BUSY)
        p = xchg32(self._tail(), X)                  # join the queue (SC: publishes BUSY)
        if p > self.b.P or p == X:
            return R_CORRUPT
        st32_rlx(&r.pred, p)
        st32_rlx(&self.b.nodes[X].pred, p)
        if ld32_acq(&self.b.nodes[p].state) == C_FREE:
            return R_ACQ
        return R_PENDING

    cdef int _fast(self, uint32_t me) noexcept nogil:
        cdef uint32_t X = ld32_rlx(&self.b.precs[me].mine)
        cdef uint32_t st
        if X > self.b.P:
            return R_CORRUPT
        st = ld32_acq(&self.b.nodes[X].state)
        if st == C_BUSY or st == C_ABANDONED or st == C_RECLAIMING:
            return R_BUSY
        return self._enqueue(me)

    cdef int _try(self, uint32_t me) noexcept nogil:
        cdef int rc = self._fast(me)
        if rc == R_PENDING:
            rc = self._abort(me)
            return R_ACQ if rc == R_ACQ else R_BUSY
        return rc

    cdef int _abort(self, uint32_t me) noexcept nogil:
        """Leave the queue: R_TIMEOUT, or R_ACQ if the lock was granted meanwhile."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint32_t X = r.mine
        cdef uint32_t p = r.pred
        cdef shm_node* x = &self.b.nodes[X]
        st32_rel(&x.pred, p)
        if cas32(self._tail(), X, p):                # nobody behind us: step out
            st32_rel(&x.state, C_RECLAIMED)
            return R_TIMEOUT
        if ld32_seq(&self.b.nodes[p].state) == C_FREE:
            return R_ACQ                             # granted as we were leaving
        st64_rel(&x.value, ld64_rlx(&self.rm.part[me].generation))
        st32_seq(&x.state, C_ABANDONED)              # our successor will wait on p instead
        wake_if_parked(&x.state, &x.parked)
        return R_TIMEOUT

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint32_t X = ld32_rlx(&r.mine)
        cdef uint32_t p, pp, st
        cdef shm_node* x
        cdef shm_node* pn
        cdef int res
        if X > self.b.P:
            return R_CORRUPT
        x = &self.b.nodes[X]
        if rc == R_BUSY:
            st = ld32_acq(&x.state)
            if (st == C_ABANDONED and x.value == ld64_rlx(&self.rm.part[me].generation)
                    and cas32(&x.state, C_ABANDONED, C_BUSY)):
                st32_rlx(&r.pred, ld32_acq(&x.pred))     # back in our old place
            elif st == C_BUSY:
                return R_CORRUPT
            else:
                if st == C_RECLAIMING or st == C_ABANDONED:   # not yet handed back
                    res = wait_for(_clh_not_reclaiming, x, &x.state, &x.parked, w)
                    if res != W_READY:
                        return R_SIGNAL if res == W_SIGNAL else R_TIMEOUT
                rc = self._enqueue(me)
                if rc != R_PENDING:
                    return rc
        while True:
            p = ld32_rlx(&r.pred)
            if p > self.b.P:
                return R_CORRUPT
            pn = &self.b.nodes[p]
            res = wait_for(_clh_not_busy, pn, &pn.state, &pn.parked, w)
            if res != W_READY:
                rc = self._abort(me)
                if rc == R_TIMEOUT and res == W_SIGNAL:
                    return R_SIGNAL
                return rc
            st = ld32_acq(&pn.state)
            if st == C_FREE:
                return R_ACQ
            if st == C_ABANDONED:
                if cas32(&pn.state, C_ABANDONED, C_RECLAIMING):
                    pp = ld32_acq(&pn.pred)
                    st32_seq(&pn.state, C_RECLAIMED)     # hand the node back to its owner
                    wake_if_parked(&pn.state, &pn.parked)
                    if pp > self.b.P:
                        return R_CORRUPT
                    st32_rlx(&r.pred, pp)
                    st32_rel(&x.pred, pp)
                continue                             # else its owner rejoined: wait again
            if st != C_BUSY:
                return R_CORRUPT

    cdef int _unlock(self, uint32_t me) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint32_t X = r.mine
        cdef uint32_t p = r.pred
        if X > self.b.P or p > self.b.P:
            return R_CORRUPT
        st32_seq(&self.b.nodes[X].state, C_FREE)     # our successor may go
        wake_if_parked(&self.b.nodes[X].state, &self.b.nodes[X].parked)
        st32_rlx(&r.mine, p)                         # adopt the predecessor's node
        return 0

    cdef bint _is_locked(self) noexcept nogil:
        cdef uint32_t t = ld32_acq(self._tail())
        if t > self.b.P:
            return 1
        return ld32_acq(&self.b.nodes[t].state) != C_FREE
