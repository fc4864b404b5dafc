# ticket.pxi -- FIFO ticket lock with abandonable tickets.
#
# Invariant: the holder owns ticket `serving`; tickets in [serving, next) are outstanding,
# and each participant owns at most one outstanding ticket per lock (active or abandoned),
# so at most P are outstanding and t % P names a per-ticket slot node[t % P] unambiguously.
#
#   word A   u64 next       fetch_add takes a ticket
#   word B   u64 serving    written by the holder only, when it releases
#   node[i]  state          grant counter: bumped (then FUTEX_WAKE) when serving reaches a
#                           parked ticket = i (mod P), so a release wakes one waiter, not a herd
#            parked         waiters of that ticket announced as parking
#            value          abandon marker: t + 1 while ticket t = i (mod P) is abandoned
#   prec[p]  ticket         p's active ticket + 1;  abandoned: the ticket + 1 p abandoned,
#            abandoned_gen  and the participant generation (the thread) that abandoned it
#
# A timed-out or interrupted waiter abandons its ticket; the release that reaches it skips
# it. The two race, and each side writes, then checks the other (SC), a CAS deciding:
#     waiter    CAS(value, 0, t+1) ; if serving == t: CAS(value, t+1, 0) ? holds : left
#     releaser  serving := s       ; if value == s+1: CAS(value, s+1, 0) ? skip s : granted
# Whoever's CAS on the marker wins decides whether ticket s is held or skipped. A thread
# that comes back while its abandoned ticket is still queued takes it back (CAS t+1 -> 0):
# it arrived then. A new thread that inherits the slot must not (it would jump the queue):
# it waits until the releases pass the old ticket, then takes a new one. Both keep the
# one-ticket-per-participant bound. (Mellor-Crummey & Scott, TOCS 1991; abandonment after
# Scott & Scherer, PPoPP 2001.)

cdef struct _ticket_ctx:
    uint64_t* serving
    uint64_t t


cdef bint _ticket_ready(void* c) noexcept nogil:
    cdef _ticket_ctx* x = <_ticket_ctx*>c
    return ld64_seq(x.serving) == x.t


cdef bint _ticket_marker_gone(void* c) noexcept nogil:
    cdef _ticket_ctx* x = <_ticket_ctx*>c      # serving points at the marker here
    return ld64_seq(x.serving) != x.t


cdef class TicketLock(_Lock):
    """FIFO ticket lock: waiters are served strictly in arrival order."""
    kind_name = "ticket"

    cdef inline uint64_t* _next(self) noexcept nogil:
        return &self.b.wa.u64[0]

    cdef inline uint64_t* _serving(self) noexcept nogil:
        return &self.b.wb.u64[0]

    cdef int _fast(self, uint32_t me) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t t
        if r.ticket != 0 or r.abandoned != 0:
            return R_BUSY                            # holding, or a ticket to take back
        t = fadd64(self._next(), 1)                  # take a ticket
        st64_rlx(&r.ticket, t + 1)
        if ld64_acq(self._serving()) == t:
            return R_ACQ
        return R_PENDING

    cdef bint _take_back(self, uint32_t me) noexcept nogil:
        """The thread that abandoned a still-queued ticket rejoins with it (1); else 0."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t a = r.abandoned
        if r.abandoned_gen != ld64_rlx(&self.rm.part[me].generation):
            return 0                                 # inherited: see _settle_inherited
        r.abandoned = 0
        if cas64(&self.b.nodes[(a - 1) % self.b.P].value, a, 0):
            st64_rlx(&r.ticket, a)
            return 1
        return 0

    cdef int _settle_inherited(self, uint32_t me, wait_t* w) noexcept nogil:
        """An abandoned ticket inherited with the slot: wait until it is passed."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t a = r.abandoned
        cdef shm_node* nd = &self.b.nodes[(a - 1) % self.b.P]
        cdef _ticket_ctx ctx
        cdef int res
        ctx.serving = &nd.value
        ctx.t = a
        res = wait_for(_ticket_marker_gone, &ctx, &nd.state, &nd.parked, w)
        if res != W_READY:
            return R_SIGNAL if res == W_SIGNAL else R_TIMEOUT
        r.abandoned = 0
        return 0

    cdef int _abandon(self, uint32_t me, uint64_t t) noexcept nogil:
        """Leave the queue: R_TIMEOUT if left, R_ACQ if the lock was granted meanwhile."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef shm_node* nd = &self.b.nodes[t % self.b.P]
        if not cas64(&nd.value, 0, t + 1):
            return R_CORRUPT                         # the one-ticket-per-participant bound broke
        if ld64_seq(self._serving()) == t:           # granted while we were leaving?
            if cas64(&nd.value, t + 1, 0):
                return R_ACQ                         # we won the marker: we hold it
        st64_rlx(&r.ticket, 0)
        r.abandoned_gen = ld64_rlx(&self.rm.part[me].generation)
        r.abandoned = t + 1                          # may already be consumed: _take_back knows
        return R_TIMEOUT

    cdef int _try(self, uint32_t me) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t s, t
        if r.ticket != 0:
            return R_BUSY
        if r.abandoned != 0:
            if r.abandoned_gen != ld64_rlx(&self.rm.part[me].generation):
                if ld64_seq(&self.b.nodes[(r.abandoned - 1) % self.b.P].value) == r.abandoned:
                    return R_BUSY                    # inherited and still queued: not free
                r.abandoned = 0
            elif not self._take_back(me):
                pass
            else:
                t = r.ticket - 1
                if ld64_seq(self._serving()) == t:
                    return R_ACQ
                return R_ACQ if self._abandon(me, t) == R_ACQ else R_BUSY
        s = ld64_acq(self._serving())
        if cas64(self._next(), s, s + 1):            # next == serving: free, and now ours
            st64_rlx(&r.ticket, s + 1)
            return R_ACQ
        return R_BUSY

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef _ticket_ctx ctx
        cdef shm_node* nd
        cdef uint64_t t
        cdef int res
        if rc == R_BUSY:
            if r.ticket != 0:
                return R_CORRUPT
            if r.abandoned != 0 and r.abandoned_gen != ld64_rlx(&self.rm.part[me].generation):
                rc = self._settle_inherited(me, w)
                if rc != 0:
                    return rc
            if r.abandoned == 0 or not self._take_back(me):
                t = fadd64(self._next(), 1)
                st64_rlx(&r.ticket, t + 1)
        t = r.ticket - 1
        nd = &self.b.nodes[t % self.b.P]
        ctx.serving = self._serving()
        ctx.t = t
        res = wait_for(_ticket_ready, &ctx, &nd.state, &nd.parked, w)
        if res == W_READY:
            return R_ACQ
        rc = self._abandon(me, t)
        if rc == R_TIMEOUT and res == W_SIGNAL:
            return R_SIGNAL
        return rc

    cdef int _unlock(self, uint32_t me) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t s = r.ticket
        cdef shm_node* nd
        cdef uint32_t guard = 0
        if s == 0:
            return R_CORRUPT
        st64_rlx(&r.ticket, 0)
        while True:
            st64_seq(self._serving(), s)             # grant ticket s ...
            nd = &self.b.nodes[s % self.b.P]
            if ld64_seq(&nd.value) == s + 1 and cas64(&nd.value, s + 1, 0):
                if ld32_seq(&nd.parked) != 0:        # a slot's new owner waits for this
                    fadd32(&nd.state, 1)
                    shm_futex_wake(&nd.state, 0x7fffffff)
                s += 1                               # ... unless it was abandoned: skip it
                guard += 1
                if guard > self.b.P:
                    return R_CORRUPT
                continue
            if ld32_seq(&nd.parked) != 0:
                fadd32(&nd.state, 1)
                shm_futex_wake(&nd.state, 0x7fffffff)
            return 0

    cdef bint _is_locked(self) noexcept nogil:
        return ld64_acq(self._next()) != ld64_acq(self._serving())
