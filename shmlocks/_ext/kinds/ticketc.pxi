# ticketc.pxi -- the compact ticket stripe: a LockTable(kind="ticket") stripe in one line.
#
# The same kind as ticket.pxi (FIFO tickets, abandonable at a timeout or a signal, every
# death recovered, waiters that step aside past the CPUs), on one 128-byte line per
# stripe instead of a whole lock body: no ticket slot lines, no prec line per participant
# per stripe. The line's waiters' half holds the aside words too, past the words below
# (shm_layout.h SHM_STRIPE_ASIDE_OFF: 4 seats; docs/design.md §7.0). What a participant
# keeps is in its
# ONE line for the table (the table entry's prec: shm_stripe_at aims every stripe's precs
# there), which serves all the stripes because a participant WAITS for one lock at a time
# (it may HOLD several: hold()). docs/design.md §15 "Compact ticket stripes".
#
# Invariant: the holder owns ticket `serving`; tickets in [serving, next) are outstanding,
# and each is accounted for by exactly one of: the holder record (ctl.holder, while held,
# set after the grant and cleared before the release), a published ticket (some prec's
# `ticket` names it: a waiter's, a granted waiter's until its next ticket operation, a
# releaser's until its release is over), an abandon marker (some prec's `omark` names
# it), or a participant between taking it and publishing it (op TAKING/WAITING on the
# stripe, [T4]). A participant has at most one marker (one omark) for the whole table.
#
# A tagged ticket names a stripe and a ticket in one u64, so that one load or CAS decides:
#     tag(j, t) = (lock number of stripe j + 1) << 40 | (t mod 2**40)      (bit 63: SKIP)
# Outstanding tickets lie within P + 1 of serving, so t mod 2**40 names one of them without
# doubt; the full ticket is serving + ((tag - serving) mod 2**40).
#
#   stripe line 0 (shm_layout.h; ctl's repair slot, ticketc.pxd; line 1: aside words)
#     word A   u64 next      fetch_add takes a ticket (as ticket.pxd ticket_next)
#     word B   u64 serving   moved only from s - 1 to s, by CAS; its low half is the futex
#                            word every waiter of the stripe parks on (a herd: a stripe has
#                            no line per ticket to wake one waiter on)
#              u32 parked    waiters announced as parking on serving
#              u32 marks     abandon markers of this stripe's tickets (in precs' omark)
#   table prec[p] (one line per participant for the whole table)
#     ticket        tag(j, t) of p's last ticket: the one it waits for, was granted, or is
#                   releasing; 0 after a release or an abandon. A holder's is overwritten
#                   by its next ticket: the holder record accounts for a held stripe
#     omark         p's abandon marker, tag(j, t) (| SKIP once a grant passing it claimed
#                   it), 0 = none
#     abandoned_gen the participant generation (the thread) that abandoned it
#     abandoned     lock number + 1 of the stripe p takes WITHOUT a ticket, around the CAS
#                   of next that does it (below): a [T4] settle waits for it then
#
# Abandonment is the overflow path of ticket.pxi, for every marker (a Dekker pair, the
# CAS on the marker deciding):
#     waiter    marks += 1 (SC) ; omark := tag(j,t) ; if serving == t: CAS(omark, tag, 0) ?
#               holds : left
#     releaser  serving := s (CAS) ; if marks != 0 (SC): scan precs[0, hwm) for omark ==
#               tag(j,s) and CAS it to tag|SKIP ; pass s (serving s -> s+1) ; clear the claim
# A grant that finds a claimed marker at serving (its claimer died or runs beside it)
# passes it itself; the CAS of serving decides which of two grants moves it. Whoever
# clears a marker (the waiter taking its ticket back, the grant after its pass, anyone
# who finds it stale: its ticket below serving) decrements marks (never below 0).
#
# One marker per participant per table. A participant whose omark is still in use (it
# abandoned ticket t of stripe i, not yet passed; or inherited the slot of a dead thread
# whose ticket was abandoned on its behalf) cannot take a ticket: a second abandon would
# have nowhere to go. On stripe i, the thread that abandoned takes its ticket back (CAS
# omark -> 0: it arrived then). Anywhere else it waits WITHOUT a ticket ("ticketless"):
# it takes the stripe when it is free (CAS next: serving -> serving + 1, as _try) and
# sleeps on the stripe's serving and on its own omark (which the grant that passes it
# clears and wakes), until its marker is gone; then it takes a ticket. So it is never
# refused a free stripe, but while its old marker is queued it does not queue FIFO on a
# busy one: a busy stripe that never empties can keep it waiting until stripe i reaches
# its old ticket (the price of one marker per participant; rare: an abandon, then a wait
# for another stripe of the same table while the first stripe's queue still holds it).
#
# Death. Participant q is dead; for stripe j (the table's repair mutex held):
#   [C1] q holds j (the holder record names q, or q's ticket is tag(j, serving) and is
#        not claimed as skipped): clear its own marker of serving if any (it was granted
#        as it left), publish tag(j, serving) as q's ticket (the verdict clears the
#        holder record, maybe all that names the hold: a recovery cut short after it is
#        redone by the ticket; a ticket of a later stripe named there is recovered as
#        [C4]/[T4]), the verdict ([V]: owner_died if it had returned from acquire),
#        grant serving + 1 on its behalf, clear q's ticket.
#   [C2] q's ticket names j below serving: it died releasing, after its grant (or as its
#        abandoned ticket was passed): redo the rest of the grant from serving (finish a
#        claimed skip, wake).
#   [C3] q's ticket names j above serving: it was waiting: abandon it on q's behalf (its
#        omark); granted meanwhile: pass it on (it never entered).
#   [C4] q was releasing j (op RELEASING) and its ticket does not name j: it died between
#        the base's clearing of the holder record and publishing its ticket, or after its
#        release was over. Once the live takers have published (settle) and the live
#        releasers of j are done, serving accounted for by nobody is q's: verdict, grant.
#   [T4] q was taking or waiting for j (op TAKING/WAITING) and published no ticket of j:
#        it may have taken one (fetch_add, or a ticketless CAS of next) and died before
#        publishing it. Once the live takers have published, every ticket in [serving,
#        next) accounted for by nobody is a dead taker's: at serving, granted on (never
#        entered); above, abandoned with q's omark (if free; else the next dead taker's
#        recovery marks it).
#   A marker of j in q's omark stays (a grant passes it); one found stale is cleared, and
#   so is q's ticketless mark of j (else a settle would skip the slot's next occupant).
# A waiter sleeps on serving and on the liveness token of whoever accounts for serving
# (the holder, or the published owner of serving); when serving is abandoned or
# unpublished it sleeps a slice and recovers the dead that were acting on the stripe.


cdef inline uint64_t _tc_mask() noexcept nogil:
    return (<uint64_t>1 << TC_TBITS) - 1


cdef inline uint64_t _tc_tag(shm_body* b, uint64_t t) noexcept nogil:
    """tag(j, t): stripe b's lock number + 1 and ticket t mod 2**40, in one u64."""
    return ((<uint64_t>b.index + 1) << TC_TBITS) | (t & _tc_mask())


cdef inline uint32_t _tc_lock1(uint64_t m) noexcept nogil:
    """The lock number + 1 a tagged ticket or marker names."""
    return <uint32_t>((m & ~SHM_TICKET_SKIP) >> TC_TBITS)


cdef inline uint64_t _tc_full(uint64_t m, uint64_t s) noexcept nogil:
    """The full ticket a tagged ticket m names, relative to serving s."""
    return s + (((m & ~SHM_TICKET_SKIP) - s) & _tc_mask())


cdef inline bint _tc_outstanding(shm_body* b, uint64_t m) noexcept nogil:
    """Does m (a tagged ticket or marker) name an outstanding ticket of stripe b?"""
    cdef uint64_t s, n
    if m == 0 or _tc_lock1(m) != b.index + 1:
        return 0
    s = ld64_seq(ticket_serving(b))
    n = ld64_seq(ticket_next(b))
    return (((m & ~SHM_TICKET_SKIP) - s) & _tc_mask()) < n - s


cdef inline void _tc_uncount(shm_body* b) noexcept nogil:
    """marks -= 1, never below 0 (a count read from shared memory)."""
    cdef uint32_t c
    while True:
        c = ld32_seq(tc_marks(b))
        if c == 0 or cas32(tc_marks(b), c, c - 1):
            return


cdef inline void _tc_omark_wake(shm_prec* r) noexcept nogil:
    """A marker was cleared: its owner may be waiting ticketless for that (its omark's low
    half is its futex word, as ticket.pxi _omark_word)."""
    shm_futex_wake(<uint32_t*>&r.omark, 0x7fffffff)


cdef bint _tc_clear(shm_body* b, shm_prec* r, uint64_t m) noexcept nogil:
    """Clear marker m (of stripe b) from r's omark, if it is still there (1 if this call
    did): the count with it, and wake its owner."""
    if cas64(&r.omark, m, 0):
        _tc_uncount(b)
        _tc_omark_wake(r)
        return 1
    return 0


cdef bint _tc_stripe_of(rmap_t* rm, uint64_t m, shm_body* out) noexcept nogil:
    """The stripe a marker names (bounds-checked against the validated table header)."""
    cdef uint32_t l1 = _tc_lock1(m)
    if rm.tbl.size == 0 or l1 <= rm.tbl.first or l1 - 1 - rm.tbl.first >= rm.tbl.size:
        return 0
    out[0] = table_stripe(rm, l1 - 1 - rm.tbl.first)
    return 1


cdef int _tc_claim(shm_body* b, uint64_t s, bint armed) noexcept nogil:
    """Serving is s and the stripe has markers: the prec whose omark marks s, claimed
    (tag -> tag|SKIP, or found claimed by another grant); -1 if none does (s is live).
    Stale markers of this stripe met on the way (a passed ticket's claim whose clear was
    not reached: its claimer died) are cleared."""
    cdef uint64_t m0 = _tc_tag(b, s)
    cdef uint64_t m
    cdef uint32_t x
    for x in range(body_hwm(b)):
        m = ld64_seq(&b.precs[x].omark)
        if m == m0:
            if cas64(&b.precs[x].omark, m0, m0 | SHM_TICKET_SKIP):
                crashpoint_at(armed, "ticketc.release.claimed")
                return <int>x
            m = ld64_seq(&b.precs[x].omark)          # taken back, or claimed beside us
        if m == (m0 | SHM_TICKET_SKIP):
            return <int>x
        if m != 0 and _tc_lock1(m) == b.index + 1 and not _tc_outstanding(b, m):
            _tc_clear(b, &b.precs[x], m)
    return -1


cdef void _tc_served(shm_body* b, uint64_t s, bint armed, bint force=0) noexcept nogil:
    """The rest of the grant of s, once serving is s: pass s if it is abandoned (claim its
    marker, move serving, clear the claim), and so on; wake the stripe's waiters. A
    recoverer redoes a dead releaser's grant with this alone ([C2]); a waiter that finds
    serving abandoned with nobody passing it (a grant cut short by a death whose recovery
    cannot tell: a recoverer killed inside another's recovery) helps with `force` (the
    table lines scanned whatever the count says). Safe beside any other grant: the claim
    and each move of serving are CASes."""
    cdef uint32_t guard = 0
    cdef uint64_t m
    cdef int x
    while force or ld32_seq(tc_marks(b)) != 0:
        x = _tc_claim(b, s, armed)
        if x < 0:
            break                                    # s is live: granted
        m = _tc_tag(b, s) | SHM_TICKET_SKIP
        guard += 1
        if guard > b.P + 1:
            break
        if not cas64(ticket_serving(b), s, s + 1):
            _tc_clear(b, &b.precs[x], m)             # another grant passed it
            break
        crashpoint_at(armed, "ticketc.release.skipped")
        _tc_clear(b, &b.precs[x], m)
        s += 1
    wake_if_parked(tc_serving_word(b), tc_parked(b))


cdef void _tc_grant(shm_body* b, uint64_t s, bint armed) noexcept nogil:
    """Serve ticket s (the release step): serving s - 1 -> s by CAS (a second granter of the
    same ticket, a recoverer beside a releaser, loses and stops), then _tc_served. Never
    past next: a grant of a ticket nobody took would leave its taker unserved for good."""
    if s - 1 == ld64_seq(ticket_next(b)) or not cas64(ticket_serving(b), s - 1, s):
        return
    crashpoint_at(armed, "ticketc.release.served")
    _tc_served(b, s, armed)


cdef bint _tc_mark(shm_body* b, uint32_t p, uint64_t t) noexcept nogil:
    """Mark ticket t of stripe b (participant p's) abandoned in p's omark: 1 (or it was
    already), 0 if the omark holds another marker."""
    cdef shm_prec* r = &b.precs[p]
    cdef uint64_t m = _tc_tag(b, t)
    cdef uint64_t cur = ld64_seq(&r.omark)
    if cur == m or cur == (m | SHM_TICKET_SKIP):
        return 1                                     # (a redo of a recovery)
    if cur != 0:
        return 0
    fadd32(tc_marks(b), 1)
    crashpoint("ticketc.abandon.counted")
    if not cas64(&r.omark, 0, m):
        _tc_uncount(b)
        return 0
    crashpoint("ticketc.abandon.marked")
    return 1


cdef bint _tc_unpublished(shm_body* b, uint32_t x) noexcept nogil:
    """x (taking or waiting for stripe b) may hold a ticket of b it has not published: while
    it takes one without a ticket (its mark says so around that CAS); not while it has a
    marker queued (it waits ticketless, or aside: it takes a ticket only by that CAS), nor
    once its published ticket names an outstanding ticket of b. (A waiter aside was taken
    for a taker mid-step once: a recoverer that was that waiter then waited for itself.)"""
    cdef shm_prec* r = &b.precs[x]
    if ld64_seq(&r.abandoned) == <uint64_t>b.index + 1:
        return 1
    if ld64_seq(&r.omark) != 0:
        return 0
    return not _tc_outstanding(b, ld64_acq(&r.ticket))


cdef bint _tc_accounted(shm_body* b, uint64_t u) noexcept nogil:
    """Is ticket u of stripe b published by someone (its ticket or a marker names it), or,
    if it is serving, held (a holder record)?"""
    cdef uint64_t m = _tc_tag(b, u)
    cdef uint32_t x
    if u == ld64_seq(ticket_serving(b)) and ld32_seq(&b.ctl.holder) != 0:
        return 1
    for x in range(body_hwm(b)):
        if (ld64_acq(&b.precs[x].ticket) == m
                or (ld64_seq(&b.precs[x].omark) & ~SHM_TICKET_SKIP) == m):
            return 1
    return 0


cdef bint _tc_orphan(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec,
                     uint64_t* out) noexcept nogil:
    """After the live takers published: is serving accounted for by nobody but the dead
    (1, *out = serving)? A live releaser of the stripe may be between the base's clearing
    of its holder record and publishing its ticket: wait for the live releasers to finish
    first, and look again; serving moved meanwhile: look again."""
    cdef uint32_t lock1 = b.index + 1
    cdef uint64_t s
    cdef uint32_t x, looks
    cdef bint busy
    for looks in range(64):
        s = ld64_seq(ticket_serving(b))
        if ld64_seq(ticket_next(b)) == s or _tc_accounted(b, s):
            return 0
        busy = 0
        for x in range(body_hwm(b)):
            if (x != q and participant_op(rm, x, lock1) == SHM_OP_RELEASING
                    and not participant_dead(rm, x)):
                busy = 1
        if busy:
            if not participants_settle(rm, b, q, SHM_OP_RELEASING, settle_any, rec):
                return 0
            continue
        if ld64_seq(ticket_serving(b)) == s:
            out[0] = s
            return 1
    return 0


cdef void _tc_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Participant q is dead and ours to recover, on compact ticket stripe b (the table's
    repair mutex held): the death table at the top of this file."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t op = participant_op(rm, q, lock1)
    cdef uint64_t pt = ld64_acq(&r.ticket)
    cdef uint64_t om = ld64_seq(&r.omark)
    cdef uint64_t s = ld64_seq(ticket_serving(b))
    cdef uint64_t t, n0, u
    cdef bint mine = pt != 0 and _tc_lock1(pt) == lock1
    if ld64_seq(&r.abandoned) == <uint64_t>lock1:
        st64_seq(&r.abandoned, 0)                    # its ticketless mark: not the next
                                                     # occupant's (a settle would skip it)
    if om != 0 and _tc_lock1(om) == lock1 and not _tc_outstanding(b, om):
        _tc_clear(b, r, om)                          # a passed ticket's marker: stale
        om = ld64_seq(&r.omark)
    if ((mine and _tc_full(pt, s) == s and ld64_seq(ticket_next(b)) != s
            and om != (_tc_tag(b, s) | SHM_TICKET_SKIP))
            or ld32_acq(&b.ctl.holder) == participant_hid(rm, q)):
        # [C1] it holds the stripe (or was just granted, or died releasing before its grant)
        if om == _tc_tag(b, s):
            _tc_clear(b, r, om)                      # granted as it left: its mark is void
        # its line names serving first, as its own release does: the verdict clears the
        # holder record, which may be all that says q holds it (it took a ticket of another
        # stripe since), and a recovery cut short after it is redone as [C1]/[C2] by the
        # ticket. Another stripe's ticket named there is that stripe's to recover: a later
        # one (in this pass) finds it as [C4]/[T4] by q's step, as if never published
        st64_rel(&r.ticket, _tc_tag(b, s))
        recover_verdict(rm, b, q, op)                # [V]
        crashpoint("ticketc.recover.flagged")
        _tc_grant(b, s + 1, shm_crash_armed)
        st64_rel(&r.ticket, 0)
        return
    if mine:
        if _tc_outstanding(b, pt):                   # [C3] it was waiting
            t = _tc_full(pt, s)
            if not _tc_mark(b, q, t):
                return                               # its omark is taken: corrupt, left
            r.abandoned_gen = ld64_rlx(&rm.part[q].generation)
            if ld64_seq(ticket_serving(b)) == t and _tc_clear(b, r, _tc_tag(b, t)):
                _tc_grant(b, t + 1, shm_crash_armed)     # granted meanwhile: pass it on
        else:                                        # [C2] it died releasing, after its grant
            _tc_served(b, s, shm_crash_armed)
        st64_rel(&r.ticket, 0)
        return
    if op == SHM_OP_RELEASING:                       # [C4]
        if not participants_settle(rm, b, q, SHM_OP_WAITING, _tc_unpublished, rec):
            return
        if _tc_orphan(rm, b, q, rec, &s):
            recover_verdict(rm, b, q, op)
            _tc_grant(b, s + 1, shm_crash_armed)
        else:
            _tc_served(b, ld64_seq(ticket_serving(b)), shm_crash_armed)
        return
    if op != SHM_OP_TAKING and op != SHM_OP_WAITING:
        return
    # [T4] it may have taken a ticket and died before publishing it
    n0 = ld64_seq(ticket_next(b))
    if not participants_settle(rm, b, q, SHM_OP_WAITING, _tc_unpublished, rec):
        return
    s = ld64_seq(ticket_serving(b))
    if n0 - s > <uint64_t>b.P + 1:
        return                                       # more outstanding than possible: corrupt
    u = s
    while u < n0:
        s = ld64_seq(ticket_serving(b))
        if u < s:
            u = s                                    # served or passed meanwhile
            continue
        if not _tc_accounted(b, u):
            if u == s:
                if _tc_orphan(rm, b, q, rec, &s) and s == u:
                    _tc_grant(b, u + 1, shm_crash_armed)     # taken, never entered
            elif _tc_mark(b, q, u):
                r.abandoned_gen = ld64_rlx(&rm.part[q].generation)
                if ld64_seq(ticket_serving(b)) == u and _tc_clear(b, r, _tc_tag(b, u)):
                    _tc_grant(b, u + 1, shm_crash_armed)
        u += 1
    # a grant q made as a recoverer (in another's recovery) may have claimed the marker
    # at serving and died before passing it: nobody's record says so; finish it
    _tc_served(b, ld64_seq(ticket_serving(b)), shm_crash_armed, 1)


cdef bint _tc_recover_dead(rmap_t* rm, shm_body* b, recov_t* rec) noexcept nogil:
    """Recover every dead participant that was acting on stripe b (taking, waiting,
    releasing): whatever step it died at, its recovery finishes it. 1 if there was one."""
    cdef uint32_t x
    cdef bint any = 0
    for x in range(body_hwm(b)):
        if participant_dead(rm, x) and participant_op(rm, x, b.index + 1) != 0:
            participant_try_recover(rm, x, rec)
            any = 1
    return any


cdef int _tc_watch_serving(rmap_t* rm, shm_body* b, uint64_t s, watch_t* ws) noexcept nogil:
    """Whom the ticket being served depends on: the holder (its record), else the
    participant that published it (a granted waiter not yet back), watched (and recovered
    here if dead); else (abandoned, being passed, or not yet published) nobody to watch:
    the dead acting on the stripe are recovered, and the sleep is a slice."""
    cdef uint32_t x1 = holder_slot(rm, ld32_seq(&b.ctl.holder))
    cdef uint64_t m = _tc_tag(b, s)
    cdef uint32_t x
    cdef bint marked = 0
    if x1 != 0:
        return watch_participant(rm, x1 - 1, ws)
    for x in range(body_hwm(b)):
        if (ld64_seq(&b.precs[x].omark) & ~SHM_TICKET_SKIP) == m:
            marked = 1                               # abandoned: a grant passes it
        elif ld64_acq(&b.precs[x].ticket) == m:
            return watch_participant(rm, x, ws)
    if ld64_seq(ticket_next(b)) == s:
        return DEP_CHANGED                           # nobody holds it
    if _tc_recover_dead(rm, b, ws.rec):
        return DEP_CHANGED
    if marked:
        _tc_served(b, s, shm_crash_armed, 1)         # nobody passing it: help
        if ld64_seq(ticket_serving(b)) != s:
            return DEP_CHANGED
    return DEP_UNKNOWN


cdef int _tc_ready(void* c) noexcept nogil:
    cdef _tc_ctx* x = <_tc_ctx*>c
    cdef uint64_t ahead = x.t - ld64_seq(ticket_serving(x.b))
    if ahead == 0:
        return Q_READY
    if ahead >= 2 and ahead <= <uint64_t>SHM_MAX_PARTICIPANTS:
        return Q_FAR
    return Q_NEAR


cdef int _tc_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency for a queued ticket: whoever accounts for serving."""
    cdef _tc_ctx* c = <_tc_ctx*>pk.ctx
    cdef uint64_t s = ld64_seq(ticket_serving(pk.b))
    if c.t - s == 0 or c.t - s > <uint64_t>pk.b.P + 1:
        return DEP_CHANGED                           # served (or a corrupt distance)
    return _tc_watch_serving(pk.rm, pk.b, s, ws)


cdef int _tc_free_ready(void* c) noexcept nogil:
    """A ticketless wait is over when the stripe is free or our marker is gone."""
    cdef _tc_ctx* x = <_tc_ctx*>c
    if ld64_seq(&x.r.omark) == 0:
        return Q_READY
    if ld64_seq(ticket_next(x.b)) == ld64_seq(ticket_serving(x.b)):
        return Q_READY
    return Q_NEAR


cdef int _tc_free_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """A ticketless wait's dependency: our own marker (its clearer wakes it), the stripe's
    holder; a stale marker (its ticket passed, the clear not reached) is cleared here."""
    cdef _tc_ctx* c = <_tc_ctx*>pk.ctx
    cdef uint64_t m = ld64_seq(&c.r.omark)
    cdef shm_body ob
    cdef uint64_t s
    if m == 0:
        return DEP_CHANGED
    if not _tc_stripe_of(pk.rm, m, &ob):
        return DEP_CHANGED                           # the caller clears a marker of nothing
    if not _tc_outstanding(&ob, m):
        _tc_clear(&ob, c.r, m)
        return DEP_CHANGED
    if not watch_word(ws, <uint32_t*>&c.r.omark, <uint32_t>m):
        return DEP_UNKNOWN
    s = ld64_seq(ticket_serving(pk.b))
    if ld64_seq(ticket_next(pk.b)) == s:
        return DEP_CHANGED
    return _tc_watch_serving(pk.rm, pk.b, s, ws)


cdef class TicketStripe(TicketLock):
    """A ticket lock that is a stripe of a LockTable (one line: ticketc.pxi)."""

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t pt = r.ticket
        cdef uint64_t t
        if r.omark != 0:
            return R_BUSY                            # a marker queued: _wait decides
        if pt != 0 and _tc_lock1(pt) == self.b.index + 1 and _tc_outstanding(&self.b, pt):
            return R_BUSY                            # held (or queued) already
        t = fadd64(ticket_next(&self.b), 1)          # take a ticket
        crashpoint_at(armed, "ticketc.acquire.took")
        st64_rel(&r.ticket, _tc_tag(&self.b, t))     # publish it
        if ld64_acq(ticket_serving(&self.b)) == t:
            return R_ACQ
        return R_PENDING

    cdef int _try(self, uint32_t me) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t s
        if _tc_outstanding(&self.b, ld64_rlx(&r.ticket)):
            return R_BUSY
        s = ld64_acq(ticket_serving(&self.b))
        if cas64(ticket_next(&self.b), s, s + 1):    # next == serving: free, and now ours
            crashpoint("ticketc.try.took")
            st64_rel(&r.ticket, _tc_tag(&self.b, s))
            return R_ACQ
        return R_BUSY

    cdef int _tc_abandon(self, uint32_t me, uint64_t t) noexcept nogil:
        """Leave the queue: R_TIMEOUT if left, R_ACQ if the stripe was granted meanwhile."""
        cdef shm_prec* r = &self.b.precs[me]
        if not _tc_mark(&self.b, me, t):
            return R_CORRUPT                         # one marker per participant broke
        if ld64_seq(ticket_serving(&self.b)) == t:   # granted while we were leaving?
            if _tc_clear(&self.b, r, _tc_tag(&self.b, t)):
                return R_ACQ                         # we won the marker: we hold it
        r.abandoned_gen = ld64_rlx(&self.rm.part[me].generation)
        st64_rel(&r.ticket, 0)
        return R_TIMEOUT

    cdef int _tc_ticketless(self, uint32_t me, wait_t* w) noexcept nogil:
        """Our omark holds a marker still queued on another stripe (or inherited): take
        this stripe when it is free, without a ticket, until the marker is gone. R_CONT
        once it is (take a ticket), R_ACQ once taken, else the wait's end (R_WOULDBLOCK:
        re-entered with R_BUSY)."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t lock1 = <uint64_t>self.b.index + 1
        cdef uint64_t m, s
        cdef shm_body ob
        cdef _tc_ctx ctx
        cdef park_t pk
        cdef int res
        while True:
            m = ld64_seq(&r.omark)
            if m == 0:
                st64_seq(&r.abandoned, 0)
                return R_CONT
            if not _tc_stripe_of(self.rm, m, &ob):
                cas64(&r.omark, m, 0)                # a marker of no stripe: corrupt, ours
                continue
            if not _tc_outstanding(&ob, m):
                _tc_clear(&ob, r, m)                 # passed, not yet cleared: stale
                continue
            st64_seq(&r.abandoned, lock1)            # a take: [T4]'s settle waits for us
            s = ld64_acq(ticket_serving(&self.b))
            if cas64(ticket_next(&self.b), s, s + 1):
                crashpoint("ticketc.ticketless.took")
                st64_rel(&r.ticket, _tc_tag(&self.b, s))
                st64_seq(&r.abandoned, 0)
                return R_ACQ
            st64_seq(&r.abandoned, 0)
            ctx.b = &self.b
            ctx.t = 0
            ctx.r = r
            pk.ready = _tc_free_ready
            pk.ctx = &ctx
            pk.word = tc_serving_word(&self.b)
            pk.parked = tc_parked(&self.b)
            pk.dep = _tc_free_dep
            pk.rm = self.rm
            pk.b = &self.b
            pk.arg = 0
            res = park(&pk, w)
            if res == R_ACQ:
                continue                             # free, or our marker gone: look
            st64_seq(&r.abandoned, 0)
            if res == R_WOULDBLOCK:
                w.resume_rc = R_BUSY
            return res

    cdef int _tc_queued(self, uint32_t me, wait_t* w) noexcept nogil:
        """Wait for our published ticket's turn; leave (abandon) at the deadline."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef _tc_ctx ctx
        cdef park_t pk
        cdef int res, rc
        ctx.b = &self.b
        ctx.t = _tc_full(ld64_rlx(&r.ticket), ld64_seq(ticket_serving(&self.b)))
        ctx.r = r
        pk.ready = _tc_ready
        pk.ctx = &ctx
        pk.word = tc_serving_word(&self.b)
        pk.parked = tc_parked(&self.b)
        pk.dep = _tc_dep
        pk.rm = self.rm
        pk.b = &self.b
        pk.arg = 0
        w.aside_ok = 1                               # queued: may step aside (§7.0)
        res = park(&pk, w)
        w.aside_ok = 0
        if res == R_ACQ:
            return R_ACQ
        if res == R_WOULDBLOCK:
            w.resume_rc = R_PENDING                  # the ticket stays ours
            return res
        rc = self._tc_abandon(me, ctx.t)            # (stepping aside, R_ASIDE, too: the
        if rc == R_TIMEOUT:                          # rejoin takes the ticket back)
            return res                               # R_TIMEOUT, R_SIGNAL or R_ASIDE
        return rc

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t m, t
        if rc == R_BUSY:
            if _tc_outstanding(&self.b, ld64_rlx(&r.ticket)):
                return R_CORRUPT                     # held or queued here already
            while True:
                m = ld64_seq(&r.omark)
                if m == 0:
                    t = fadd64(ticket_next(&self.b), 1)
                    crashpoint("ticketc.acquire.took")
                    st64_rel(&r.ticket, _tc_tag(&self.b, t))
                    break
                if (not (m & SHM_TICKET_SKIP) and _tc_outstanding(&self.b, m)
                        and r.abandoned_gen == ld64_rlx(&self.rm.part[me].generation)):
                    # our own abandoned ticket of this stripe, still queued: take it back
                    # (we arrived then), by the CAS a grant passing it would win instead
                    if _tc_clear(&self.b, r, m):
                        st64_rel(&r.ticket, m)
                        break
                    continue
                rc = self._tc_ticketless(me, w)
                if rc != R_CONT:
                    return rc
        return self._tc_queued(me, w)

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t s = ld64_acq(ticket_serving(&self.b))     # our ticket: we hold it
        st64_rel(&r.ticket, _tc_tag(&self.b, s))    # a death from here is [C1] or [C2]
        _tc_grant(&self.b, s + 1, armed)
        crashpoint_at(armed, "ticketc.release.granted")
        st64_rel(&r.ticket, 0)                       # last: a death before it is redone
        return 0


_register_stripe(TicketStripe, _tc_recover)
