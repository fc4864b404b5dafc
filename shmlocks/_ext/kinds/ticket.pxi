# ticket.pxi -- FIFO ticket lock with abandonable tickets.
#
# Invariant: the holder owns ticket `serving`; tickets in [serving, next) are outstanding,
# and each participant owns at most one outstanding ticket per lock (active or abandoned),
# so at most P are outstanding and t % P names a per-ticket slot tslot[t % P] unambiguously.
#
#   word A    u64 next       fetch_add takes a ticket                  (ticket.pxd: ticket_next)
#   word B    u64 serving    moved by the releaser only, by CAS        (ticket_serving)
#   tslot[i]  grants         grant counter: bumped (then FUTEX_WAKE) when serving reaches a
#                            parked ticket = i (mod P), so a release wakes one waiter, not a herd
#             parked         waiters of that ticket announced as parking
#             abandoned      abandon marker: t + 1 while ticket t = i (mod P) is abandoned
#   (tslot: the ticket kind's view of the body's nodes, shm_layout.h)
#   prec[p]  ticket         p's active ticket + 1;  abandoned: the ticket + 1 p abandoned,
#            abandoned_gen  and the participant generation (the thread) that abandoned it
#
# A timed-out or interrupted waiter abandons its ticket; the release that reaches it skips
# it. The two race, and each side writes, then checks the other (SC), a CAS deciding:
#     waiter    CAS(abandoned, 0, t+1) ; if serving == t: CAS(abandoned, t+1, 0) ? holds : left
#     releaser  serving := s   ; if abandoned == s+1: CAS(abandoned, s+1, 0) ? skip s : granted
# Whoever's CAS on the marker wins decides whether ticket s is held or skipped. A thread
# that comes back while its abandoned ticket is still queued takes it back (CAS t+1 -> 0):
# it arrived then. A new thread that inherits the slot must not (it would jump the queue):
# it waits until the releases pass the old ticket, then takes a new one. Both keep the
# one-ticket-per-participant bound. (Mellor-Crummey & Scott, TOCS 1991; abandonment after
# Scott & Scherer, PPoPP 2001.)
#
# Death. Every ticket in [serving, next) is attributable: published in prec[p].ticket, or an
# abandon marker, or taken by a participant that died between fetch_add and publishing it
# (op TAKING/WAITING, ticket 0): once the live participants in that window have published,
# whatever is left over belongs to the dead. A parked waiter sleeps on the liveness token
# of the owner of the nearest live ticket ahead of its own (_ticket_dep); woken by that
# death, it recovers it (_ticket_recover): a dead holder's ticket is released on its
# behalf (owner_died if it had returned from acquire), a dead waiter's ticket is abandoned
# on its behalf, so no one behind it waits for it.


cdef int _ticket_ready(void* c) noexcept nogil:
    cdef _ticket_ctx* x = <_ticket_ctx*>c
    cdef uint64_t ahead = x.t - ld64_seq(x.serving)   # tickets still to be served first
    if ahead == 0:
        return Q_READY
    if ahead >= 2 and ahead <= <uint64_t>SHM_MAX_PARTICIPANTS:
        return Q_FAR
    return Q_NEAR


cdef int _ticket_marker_gone(void* c) noexcept nogil:
    cdef _ticket_ctx* x = <_ticket_ctx*>c      # serving points at the marker here
    return ld64_seq(x.serving) != x.t


cdef inline bint _taking(uint32_t op) noexcept nogil:
    return op == SHM_OP_TAKING or op == SHM_OP_WAITING


cdef bint _ticket_unpublished(shm_body* b, uint32_t x) noexcept nogil:
    """x may be between fetch_add and publishing its ticket. Not if it still has an
    abandoned ticket: then it is waiting for an inherited one to pass (_settle_inherited)
    or taking one back, and takes no new ticket before clearing `abandoned`."""
    return ld64_acq(&b.precs[x].ticket) == 0 and ld64_acq(&b.precs[x].abandoned) == 0


cdef void _ticket_grant(shm_body* b, uint64_t s, bint armed) noexcept nogil:
    """Serve ticket s, skipping abandoned tickets, and wake its waiter. The release step.
    `serving` only ever moves from s - 1 to s, by CAS: two granters of one ticket (a
    releaser skipping an abandoned ticket, whose marker it has just cleared, and a
    recoverer that took that ticket for an unpublished one, [T4]) may race; the one that
    loses stops there, so a late store can never move `serving` back."""
    dassert(s <= ld64_seq(ticket_next(b)), "ticket: serving <= next")
    if not cas64(ticket_serving(b), s - 1, s):            # grant ticket s ...
        return                                       # (someone else did: it goes on)
    crashpoint_at(armed, "ticket.release.served")
    _ticket_served(b, s, armed)


cdef void _ticket_served(shm_body* b, uint64_t s, bint armed) noexcept nogil:
    """The rest of the grant of s, once `serving` is s: skip s if abandoned, wake its
    waiter. A recoverer redoes a dead releaser's grant with this alone ([T2]): storing
    `serving` again would write back a value a live holder may have moved past since."""
    cdef shm_tslot* nd
    cdef uint32_t guard = 0
    while True:
        nd = &b.tslots[s % b.P]
        if ld64_seq(&nd.abandoned) == s + 1 and cas64(&nd.abandoned, s + 1, 0):
            if ld32_seq(&nd.parked) != 0:            # a slot's new owner waits for this
                fadd32(&nd.grants, 1)
                shm_futex_wake(&nd.grants, 0x7fffffff)
            s += 1                                   # ... unless it was abandoned: skip it
            guard += 1                               # (winning the marker, we alone pass s)
            if guard > b.P:
                return
            dassert(s <= ld64_seq(ticket_next(b)), "ticket: serving <= next")
            if not cas64(ticket_serving(b), s - 1, s):
                return                               # another granter passed it (above)
            crashpoint_at(armed, "ticket.release.served")
            continue
        if ld32_seq(&nd.parked) != 0:
            fadd32(&nd.grants, 1)
            shm_futex_wake(&nd.grants, 0x7fffffff)
        return


cdef void _ticket_abandon_for(rmap_t* rm, shm_body* b, uint32_t q, uint64_t t) noexcept nogil:
    """Abandon dead participant q's waiting ticket t; if the lock reaches t meanwhile,
    pass it on (q never entered its critical section: no owner_died)."""
    cdef shm_tslot* nd = &b.tslots[t % b.P]
    cdef shm_prec* r = &b.precs[q]
    if not cas64(&nd.abandoned, 0, t + 1) and ld64_seq(&nd.abandoned) != t + 1:
        return                                       # marker slot taken: corrupt; leave it
    if ld64_seq(ticket_serving(b)) == t and cas64(&nd.abandoned, t + 1, 0):
        _ticket_grant(b, t + 1, shm_crash_armed)                      # it had just been granted: pass it on
        return
    r.abandoned_gen = ld64_rlx(&rm.part[q].generation)   # the slot's next owner waits for it
    st64_rel(&r.abandoned, t + 1)
    _marker_wake(nd)


cdef void _ticket_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Participant q is dead and ours to recover (repair mutex held)."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t op = participant_op(rm, q, lock1)
    cdef uint64_t t, s, n0, u
    cdef bint seen
    if r.ticket != 0:
        t = r.ticket - 1
        s = ld64_seq(ticket_serving(b))
        if s == t:                                   # [T1] it holds the lock (or was just granted)
            # Granted just before it marked t abandoned (it died between the mark and its
            # serving check): the mark is its own and means nothing now. Left, it would
            # block the abandon of ticket t + P one lap later (R_CORRUPT).
            cas64(&b.tslots[t % b.P].abandoned, t + 1, 0)
            recover_verdict(rm, b, q, op)            # [V]
            crashpoint("ticket.recover.flagged")
            _ticket_grant(b, t + 1, shm_crash_armed)
        elif s > t:                                  # [T2] it died releasing: redo the grant
            _ticket_served(b, s, shm_crash_armed)    # (not the store: s may be stale now)
        else:                                        # [T3] it was waiting
            _ticket_abandon_for(rm, b, q, t)
        st64_rel(&r.ticket, 0)
        return
    if op != SHM_OP_TAKING and op != SHM_OP_WAITING:  # [T4] (docs/design.md §7.1)
        return
    # It may have died between fetch_add and publishing its ticket. Let the live ones in
    # that same window publish theirs, then serve or abandon whatever is unaccounted for.
    n0 = ld64_seq(ticket_next(b))
    if not participants_settle(rm, b, q, SHM_OP_WAITING, _ticket_unpublished, rec):
        return                                       # out of time: decide nothing
    s = ld64_seq(ticket_serving(b))
    if n0 - s > b.P + 1:
        return                                       # more outstanding than possible: corrupt
    u = s
    while u < n0:
        s = ld64_seq(ticket_serving(b))
        if u < s:                                    # served or skipped meanwhile (a grant
            u = s                                    # below passes abandoned ones too):
            continue                                 # never mark a passed ticket again
        seen = (ld64_seq(&b.tslots[u % b.P].abandoned) == u + 1
                or _ticket_owner(b, u) >= 0)
        if not seen:
            s = ld64_seq(ticket_serving(b))
            if u < s:                                # its live holder released it while we
                u = s                                # looked (serving moves before the
                continue                             # ticket is cleared): not the dead's
            if u == s:
                _ticket_grant(b, u + 1, shm_crash_armed)     # taken, never entered: pass it on
            else:
                _ticket_abandon_for(rm, b, q, u)
        u += 1


cdef inline uint32_t* _marker_word(shm_tslot* nd) noexcept nogil:
    """The abandon marker's low half, as the futex word its watchers sleep on (x86-64 and
    arm64 are little-endian; a marker t + 1 whose low half is 0 changes unseen, once in 2**32
    tickets, and only within the instant between a watcher's read and its sleep)."""
    return <uint32_t*>&nd.abandoned


cdef inline void _marker_wake(shm_tslot* nd) noexcept nogil:
    """A marker was set or cleared: the waiter behind that ticket depends on someone else
    now (_ticket_dep); wake it to look. Only on leaving and rejoining, never a release."""
    shm_futex_wake(_marker_word(nd), 0x7fffffff)


cdef int _ticket_owner(shm_body* b, uint64_t u) noexcept nogil:
    """The participant that published ticket u (its record's ticket is u + 1), or -1."""
    cdef uint32_t x
    for x in range(b.P):
        if ld64_acq(&b.precs[x].ticket) == u + 1:
            return <int>x
    return -1


cdef bint _recover_dead_takers(rmap_t* rm, shm_body* b, recov_t* rec) noexcept nogil:
    """A ticket nobody published may be a dead taker's, killed between fetch_add and
    publishing: recover every dead participant that was taking this lock ([T4]). 1 if
    there was one."""
    cdef uint32_t x
    cdef bint any = 0
    for x in range(b.P):
        if participant_dead(rm, x) and _taking(participant_op(rm, x, b.index + 1)):
            participant_try_recover(rm, x, rec)
            any = 1
    return any


cdef int _ticket_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency: the owner of the nearest ticket ahead of ours that is not
    abandoned (the holder, for the next in line), watched with the abandon markers of the
    tickets in between and of its own, so that a ticket ahead leaving or coming back wakes
    us to look again. A dead owner is recovered here. An unpublished ticket ahead (a taker
    between fetch_add and publishing) is not watchable: a taker that died there is recovered
    (as _ticket_recover's [T4]), else DEP_UNKNOWN."""
    cdef _ticket_ctx* c = <_ticket_ctx*>pk.ctx
    cdef shm_body* b = pk.b
    cdef rmap_t* rm = pk.rm
    cdef uint64_t s = ld64_seq(c.serving)
    cdef uint64_t u = c.t - 1
    cdef uint32_t mark
    cdef int x
    cdef shm_tslot* nd
    if c.t - s == 0 or c.t - s > b.P:
        return DEP_CHANGED                           # served (or a corrupt distance)
    while True:
        nd = &b.tslots[u % b.P]
        mark = ld32_seq(_marker_word(nd))            # before what it is read to mean
        x = _ticket_owner(b, u)
        if x >= 0:
            if not watch_word(ws, _marker_word(nd), mark):
                return DEP_UNKNOWN
            return watch_participant(rm, <uint32_t>x, ws)
        if ld64_seq(&nd.abandoned) != u + 1:
            break                                    # unpublished
        if not watch_word(ws, _marker_word(nd), mark) or u == s:
            return DEP_UNKNOWN                       # (serving abandoned: a release skips it)
        u -= 1
    if ld64_seq(ticket_next(b)) == s:
        return DEP_CHANGED                           # nobody holds it
    return DEP_CHANGED if _recover_dead_takers(rm, b, ws.rec) else DEP_UNKNOWN


cdef int _ticket_dep_serving(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency while an inherited abandoned ticket waits to be passed (rare):
    the owner of `serving`, looked at each slice (DEP_UNKNOWN) and recovered if dead."""
    cdef shm_body* b = pk.b
    cdef rmap_t* rm = pk.rm
    cdef uint64_t s = ld64_seq(ticket_serving(b))
    cdef int x = _ticket_owner(b, s)
    if x >= 0:
        if participant_dead(rm, <uint32_t>x):
            participant_try_recover(rm, <uint32_t>x, ws.rec)
            return DEP_CHANGED
        return DEP_UNKNOWN
    if ld64_seq(&b.tslots[s % b.P].abandoned) == s + 1:
        return DEP_UNKNOWN                           # abandoned: a release will skip it
    if ld64_seq(ticket_next(b)) == s:
        return DEP_UNKNOWN                           # nobody holds it
    _recover_dead_takers(rm, b, ws.rec)              # unpublished: a taker died mid-step?
    return DEP_UNKNOWN


cdef class TicketLock(_Lock):
    """FIFO ticket lock: waiters are served strictly in arrival order."""
    kind_name = "ticket"
    kind_code = SHM_KIND_TICKET
    fifo = True
    recovery = "user"
    priority_inheritance = False

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t t
        if r.ticket != 0 or r.abandoned != 0:
            return R_BUSY                            # holding, or a ticket to take back
        t = fadd64(ticket_next(&self.b), 1)                  # take a ticket
        crashpoint_at(armed, "ticket.acquire.took")
        st64_rel(&r.ticket, t + 1)                   # publish it
        if ld64_acq(ticket_serving(&self.b)) == t:
            return R_ACQ
        return R_PENDING

    cdef bint _take_back(self, uint32_t me) noexcept nogil:
        """The thread that abandoned a still-queued ticket rejoins with it (1); else 0."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t a = r.abandoned
        if r.abandoned_gen != ld64_rlx(&self.rm.part[me].generation):
            return 0                                 # inherited: see _settle_inherited
        r.abandoned = 0
        if cas64(&self.b.tslots[(a - 1) % self.b.P].abandoned, a, 0):
            st64_rlx(&r.ticket, a)
            _marker_wake(&self.b.tslots[(a - 1) % self.b.P])
            return 1
        return 0

    cdef int _park(self, ready_fn ready, dep_fn dep, _ticket_ctx* ctx, shm_tslot* nd,
                   wait_t* w) noexcept nogil:
        """park() on node nd's grant counter."""
        cdef park_t pk
        pk.ready = ready
        pk.ctx = ctx
        pk.word = &nd.grants
        pk.parked = &nd.parked
        pk.dep = dep
        pk.rm = self.rm
        pk.b = &self.b
        pk.arg = 0
        return park(&pk, w)

    cdef int _settle_inherited(self, uint32_t me, wait_t* w) noexcept nogil:
        """An abandoned ticket inherited with the slot: wait until it is passed."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t a = r.abandoned
        cdef shm_tslot* nd = &self.b.tslots[(a - 1) % self.b.P]
        cdef _ticket_ctx ctx
        cdef int res
        ctx.serving = &nd.abandoned
        ctx.t = a
        res = self._park(_ticket_marker_gone, _ticket_dep_serving, &ctx, nd, w)
        if res != R_ACQ:
            return res
        r.abandoned = 0
        return 0

    cdef int _abandon(self, uint32_t me, uint64_t t) noexcept nogil:
        """Leave the queue: R_TIMEOUT if left, R_ACQ if the lock was granted meanwhile."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef shm_tslot* nd = &self.b.tslots[t % self.b.P]
        if not cas64(&nd.abandoned, 0, t + 1):
            return R_CORRUPT                         # the one-ticket-per-participant bound broke
        crashpoint("ticket.abandon.marked")
        if ld64_seq(ticket_serving(&self.b)) == t:           # granted while we were leaving?
            if cas64(&nd.abandoned, t + 1, 0):
                return R_ACQ                         # we won the marker: we hold it
        st64_rlx(&r.ticket, 0)
        r.abandoned_gen = ld64_rlx(&self.rm.part[me].generation)
        r.abandoned = t + 1                          # may already be consumed: _take_back knows
        _marker_wake(nd)
        return R_TIMEOUT

    cdef int _try(self, uint32_t me) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t s, t
        if r.ticket != 0:
            return R_BUSY
        if r.abandoned != 0:
            if r.abandoned_gen != ld64_rlx(&self.rm.part[me].generation):
                if ld64_seq(&self.b.tslots[(r.abandoned - 1) % self.b.P].abandoned) == r.abandoned:
                    return R_BUSY                    # inherited and still queued: not free
                r.abandoned = 0
            elif not self._take_back(me):
                pass
            else:
                t = r.ticket - 1
                if ld64_seq(ticket_serving(&self.b)) == t:
                    return R_ACQ
                return R_ACQ if self._abandon(me, t) == R_ACQ else R_BUSY
        s = ld64_acq(ticket_serving(&self.b))
        if cas64(ticket_next(&self.b), s, s + 1):            # next == serving: free, and now ours
            st64_rlx(&r.ticket, s + 1)
            return R_ACQ
        return R_BUSY

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef _ticket_ctx ctx
        cdef shm_tslot* nd
        cdef uint64_t t
        cdef int res
        if rc == R_BUSY:
            if r.ticket != 0:
                return R_CORRUPT
            if r.abandoned != 0 and r.abandoned_gen != ld64_rlx(&self.rm.part[me].generation):
                rc = self._settle_inherited(me, w)
                if rc != 0:
                    if rc == R_WOULDBLOCK:
                        w.resume_rc = R_BUSY         # no ticket yet: settle again first
                    return rc
            if r.abandoned == 0 or not self._take_back(me):
                t = fadd64(ticket_next(&self.b), 1)
                crashpoint("ticket.acquire.took")
                st64_rel(&r.ticket, t + 1)
        t = r.ticket - 1
        nd = &self.b.tslots[t % self.b.P]
        ctx.serving = ticket_serving(&self.b)
        ctx.t = t
        res = self._park(_ticket_ready, _ticket_dep, &ctx, nd, w)
        if res == R_ACQ:
            return R_ACQ
        if res == R_WOULDBLOCK:
            w.resume_rc = R_PENDING                  # the ticket stays ours: parks on it again
            return res
        rc = self._abandon(me, t)
        if rc == R_TIMEOUT:
            return res                               # R_TIMEOUT or R_SIGNAL
        return rc

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t s = r.ticket                   # = our ticket + 1: the next to serve
        if s == 0:
            return R_CORRUPT
        dassert(ld64_acq(ticket_serving(&self.b)) + 1 == s, "ticket: the holder owns ticket serving")
        _ticket_grant(&self.b, s, armed)
        crashpoint_at(armed, "ticket.release.granted")
        st64_rel(&r.ticket, 0)                       # last: a death before it is redone
        return 0

    cdef bint _is_locked(self) noexcept nogil:
        return ld64_acq(ticket_next(&self.b)) != ld64_acq(ticket_serving(&self.b))


_register_kind(TicketLock, NULL, _ticket_recover, 1)
