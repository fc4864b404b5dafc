# ticket.pxi -- FIFO ticket lock with abandonable tickets.
#
# Invariant: the holder owns ticket `serving`; tickets in [serving, next) are outstanding,
# and each participant owns at most one outstanding ticket per lock (active or abandoned),
# so at most part_hwm are outstanding. Ticket t uses the slot line tslot[t % TS], TS =
# min(P, SHM_TICKET_SLOTS) (64): with up to TS outstanding no two share a slot; beyond
# (a region grown past 64 participants, docs/design.md §2) tickets t and t + k*TS do.
#
#   word A    u64 next       fetch_add takes a ticket                  (ticket.pxd: ticket_next)
#   word B    u64 serving    moved only from s - 1 to s, by CAS        (ticket_serving)
#   tslot[i]  grants         grant counter: bumped (then FUTEX_WAKE) when serving reaches a
#                            parked ticket = i (mod TS), so a release wakes its slot's
#                            waiters, not a herd (more than TS outstanding: the others
#                            of the slot wake, find they are not served, sleep again)
#             parked         waiters of the slot's tickets announced as parking
#             abandoned      the slot's abandon marker: t + 1 while ticket t = i (mod TS) is
#                            abandoned; | SKIP once a grant that passes it has claimed it
#             overflow       markers of the slot's tickets kept in precs (omark, below)
#   (tslot: the ticket kind's view of the body's first TS node lines, shm_layout.h)
#   prec[p]  ticket         p's active ticket + 1;  abandoned: the ticket + 1 p abandoned,
#            abandoned_gen  and the participant generation (the thread) that abandoned it
#            omark          p's own abandon marker, used when its ticket's slot marker
#                           is another ticket's: t + 1 (| SKIP), as the slot's
#
# A timed-out or interrupted waiter abandons its ticket; the release that reaches it skips
# it. The two race, and each side writes, then checks the other (SC), a CAS deciding:
#     waiter    mark := t+1 (CAS 0 -> t+1) ; if serving == t: CAS(mark, t+1, 0) ? holds : left
#     releaser  serving := s ; if mark == s+1: CAS(mark, s+1, s+1|SKIP) ? skip s : granted
# Whoever's CAS on the marker wins decides whether ticket s is held or skipped. A skip is
# three steps, each redone from what the words say: claim the marker (s+1|SKIP), move
# serving from s to s+1, clear the marker. A grant that finds a claimed marker at serving
# (its claimer died, or runs beside it) moves serving on itself; a marker whose ticket is
# below serving (a claim whose clear was not reached, or a mark left by a waiter that died
# granted, [T1]) is stale, and anyone may clear it. (Before the claim, a releaser cleared
# the marker to 0 and then moved serving: one that died between the two left a ticket
# nobody owned and nothing said was abandoned, and the queue wedged.)
#
# Markers that overflow (only with more than TS outstanding). The slot marker of ticket t
# may hold the marker of another outstanding ticket t' = t (mod TS). The waiter then keeps
# its marker in its own prec instead:
#     waiter    overflow += 1 (SC) ; omark := t+1 ; if serving == t: CAS(omark, t+1, 0) ...
#     releaser  serving := s ; mark != s+1 and overflow != 0 (SC): scan precs[0, hwm) for
#               omark == s+1, and CAS it to s+1|SKIP (then as above; overflow -= 1 once
#               the claim is cleared)
# The two are the same Dekker pair as above: the waiter's increment and store precede its
# load of serving, the releaser's store of serving precedes its loads of the count and the
# markers, so one of them sees the other and the CAS on the omark decides. Whoever clears
# an omark (the waiter taking its ticket back or found granted, the releaser after its
# skip, a stale-clearer) decrements the count. A participant killed between the increment
# and the store leaves the count one too high: every later grant of that slot's tickets
# then scans the precs (a cost, never a wrong decision). A thread that comes back while
# its abandoned ticket is still queued takes it back (CAS t+1 -> 0, where its marker is):
# it arrived then. A new thread that inherits the slot must not (it would jump the queue):
# it waits until the releases pass the old ticket and its marker is cleared, then takes a
# new one. Both keep the one-ticket-per-participant bound. (Mellor-Crummey & Scott, TOCS
# 1991; abandonment after Scott & Scherer, PPoPP 2001.)
#
# The race table (W a waiter abandoning t, R a grant passing s = t, T W taking t back):
#   W marks first, R's claim wins          t skipped; W's own CAS back fails: it left
#   W marks first, W's CAS back wins       W holds t; R finds no marker: grants t (W's)
#   R moves serving first, W then marks    W sees serving == t: its CAS back wins: holds
#   W overflows, R read the count first    R's load of the count follows its serving store,
#                                          W's load of serving follows its increment: W
#                                          sees serving == t and takes its omark back
#   T takes back, R claims                 one CAS on the marker wins (the marker is one
#                                          word, wherever it is kept)
#   R dies after its claim                 [T2] redoes the grant of serving: the claimed
#                                          marker is at serving, it is passed on
#   R dies after moving serving            the claimed marker is stale: cleared by the
#                                          next that looks (a grant, an abandon, a settle)
#
# Death. Every ticket in [serving, next) is attributable: published in prec[p].ticket, or an
# abandon marker, or taken by a participant that died between fetch_add and publishing it
# (op TAKING/WAITING, ticket 0): once the live participants in that window have published,
# whatever is left over belongs to the dead. A parked waiter sleeps on the liveness token
# of the owner of the nearest live ticket ahead of its own (_ticket_dep); if every ticket
# from there to serving is abandoned, on the token of the grant passing them (the last
# holder, whose prec names its ticket until its release is over); woken by that death, it
# recovers it (_ticket_recover): a dead holder's ticket is released on its behalf
# (owner_died if it had returned from acquire), a dead waiter's ticket is abandoned on its
# behalf, a dead releaser's grant redone, so no one behind it waits for it.


cdef inline shm_tslot* _tslot(shm_body* b, uint64_t t) noexcept nogil:
    """Ticket t's slot line: tslot[t % TS], TS = min(P, SHM_TICKET_SLOTS)."""
    if b.P >= SHM_TICKET_SLOTS:
        return &shm_tslots(b)[t & (SHM_TICKET_SLOTS - 1)]
    return &shm_tslots(b)[t % b.P]


cdef inline bint _marks(uint64_t m, uint64_t t) noexcept nogil:
    """Does marker value m say that ticket t is abandoned (claimed by a grant, or not)?"""
    return m == t + 1 or m == ((t + 1) | SHM_TICKET_SKIP)


cdef inline bint _stale(uint64_t m, uint64_t s) noexcept nogil:
    """Is marker value m (not 0) one of a ticket that serving `s` has passed? Nobody will
    pass that ticket again: anyone may clear it."""
    return m != 0 and (m & ~SHM_TICKET_SKIP) <= s


cdef int _ticket_ready(void* c) noexcept nogil:
    cdef _ticket_ctx* x = <_ticket_ctx*>c
    cdef uint64_t ahead = x.t - ld64_seq(x.serving)   # tickets still to be served first
    if ahead == 0:
        return Q_READY
    if ahead >= 2 and ahead <= <uint64_t>SHM_MAX_PARTICIPANTS:
        return Q_FAR
    return Q_NEAR


cdef int _ticket_marker_gone(void* c) noexcept nogil:
    """An inherited ticket (x.t - 1) is passed and its marker (at x.serving) cleared."""
    cdef _ticket_ctx* x = <_ticket_ctx*>c
    return not _marks(ld64_seq(x.serving), x.t - 1)


cdef inline bint _taking(uint32_t op) noexcept nogil:
    return op == SHM_OP_TAKING or op == SHM_OP_WAITING


cdef bint _ticket_unpublished(shm_body* b, uint32_t x) noexcept nogil:
    """x may be between fetch_add and publishing its ticket. Not if it still has an
    abandoned ticket: then it is waiting for an inherited one to pass (_settle_inherited)
    or taking one back, and takes no new ticket before clearing `abandoned`."""
    return ld64_acq(&b.precs[x].ticket) == 0 and ld64_acq(&b.precs[x].abandoned) == 0


cdef inline uint32_t* _omark_word(shm_prec* r) noexcept nogil:
    """An omark's low half, as a futex word (as _marker_word)."""
    return <uint32_t*>&r.omark


cdef void _unclaim(shm_body* b, shm_tslot* nd, int x, uint64_t s) noexcept nogil:
    """Ticket s's claimed marker, at its slot (x < 0) or in prec x, is stale: clear it (the
    omark's count with it), and wake who watches the word (a settle waits for it)."""
    cdef uint64_t m = (s + 1) | SHM_TICKET_SKIP
    if x < 0:
        if cas64(&nd.abandoned, m, 0):
            _marker_wake(nd)
    elif cas64(&b.precs[x].omark, m, 0):
        fsub32(&nd.overflow, 1)
        shm_futex_wake(_omark_word(&b.precs[x]), 0x7fffffff)


cdef bint _clear_stale_omark(shm_body* b, uint32_t x, uint64_t m) noexcept nogil:
    """Prec x's omark holds m, a stale marker: clear it (1 if this call did)."""
    if cas64(&b.precs[x].omark, m, 0):
        fsub32(&_tslot(b, (m & ~SHM_TICKET_SKIP) - 1).overflow, 1)
        shm_futex_wake(_omark_word(&b.precs[x]), 0x7fffffff)
        return 1
    return 0


cdef int _omark_claim(shm_body* b, uint64_t s, bint armed) noexcept nogil:
    """Serving is s and s's slot holds no marker of s, but the slot's markers overflowed:
    the prec whose omark marks s, claimed (s+1 -> s+1|SKIP, or found claimed by another
    grant); -1 if none does (s is live). Stale omarks met on the way are cleared."""
    cdef uint32_t x
    cdef uint64_t m
    for x in range(body_hwm(b)):
        m = ld64_seq(&b.precs[x].omark)
        if m == s + 1:
            if cas64(&b.precs[x].omark, s + 1, (s + 1) | SHM_TICKET_SKIP):
                crashpoint_at(armed, "ticket.overflow.claimed")
                return <int>x
            m = ld64_seq(&b.precs[x].omark)    # taken back, or claimed by another grant
        if m == ((s + 1) | SHM_TICKET_SKIP):
            return <int>x
        if _stale(m, s):
            _clear_stale_omark(b, x, m)
    return -1


cdef void _ticket_grant(shm_body* b, uint64_t s, bint armed) noexcept nogil:
    """Serve ticket s, skipping abandoned tickets, and wake its waiter. The release step.
    `serving` only ever moves from s - 1 to s, by CAS: two granters of one ticket (a
    releaser passing an abandoned ticket it claimed, and a recoverer redoing a dead
    releaser's grant, [T2], or taking that ticket for an unpublished one, [T4]) may race;
    the one that loses stops there, so a late store can never move `serving` back."""
    dassert(s <= ld64_seq(ticket_next(b)), "ticket: serving <= next")
    if not cas64(ticket_serving(b), s - 1, s):            # grant ticket s ...
        return                                       # (someone else did: it goes on)
    crashpoint_at(armed, "ticket.release.served")
    _ticket_served(b, s, armed)


cdef void _ticket_served(shm_body* b, uint64_t s, bint armed) noexcept nogil:
    """The rest of the grant of s, once `serving` is s: pass s if abandoned (claim its
    marker, move serving, clear the claim: ticket.pxi's top), wake its waiter. A recoverer
    redoes a dead releaser's grant with this alone ([T2]): storing `serving` again would
    write back a value a live holder may have moved past since; a claim the dead one made
    is found at serving and finished here."""
    cdef shm_tslot* nd
    cdef uint64_t m
    cdef uint32_t guard = 0
    cdef uint32_t looks = 0
    cdef int x
    while True:
        nd = _tslot(b, s)
        x = -1
        m = ld64_seq(&nd.abandoned)
        if m == s + 1:
            if not cas64(&nd.abandoned, s + 1, (s + 1) | SHM_TICKET_SKIP):
                looks += 1
                if looks < 64:
                    continue                         # taken back or claimed: look again
                return
            m = (s + 1) | SHM_TICKET_SKIP
            crashpoint_at(armed, "ticket.release.skipping")
        elif _stale(m, s) and looks < 64:
            looks += 1
            if cas64(&nd.abandoned, m, 0):           # a passed ticket's: clear it
                _marker_wake(nd)
            continue
        if m != ((s + 1) | SHM_TICKET_SKIP):
            if ld32_seq(&nd.overflow) != 0:          # its marker may be in a prec
                x = _omark_claim(b, s, armed)
            if x < 0:
                break                                # s is live: grant it
        # s is abandoned and claimed (by us, or by a grant that died or runs beside us)
        if ld32_seq(&nd.parked) != 0:                # a slot's new owner waits for this
            fadd32(&nd.grants, 1)
            shm_futex_wake(&nd.grants, 0x7fffffff)
        guard += 1
        if guard > b.P + 1:
            return
        dassert(s + 1 <= ld64_seq(ticket_next(b)), "ticket: serving <= next")
        if not cas64(ticket_serving(b), s, s + 1):
            _unclaim(b, nd, x, s)                    # another grant passed it (above)
            return
        crashpoint_at(armed, "ticket.release.served")
        _unclaim(b, nd, x, s)
        s += 1
        looks = 0
    if ld32_seq(&nd.parked) != 0:
        fadd32(&nd.grants, 1)
        shm_futex_wake(&nd.grants, 0x7fffffff)


cdef int _ticket_mark(shm_body* b, uint32_t p, uint64_t t) noexcept nogil:
    """Mark ticket t (participant p's) abandoned: its slot's marker if that is free (or
    already t's: a redo), else p's own omark (the overflow path, ticket.pxi's top).
    MARK_SLOT, MARK_PREC, or R_CORRUPT (p's omark holds an outstanding ticket's marker:
    the one-ticket-per-participant bound broke). Stale markers met are cleared."""
    cdef shm_prec* r = &b.precs[p]
    cdef shm_tslot* nd = _tslot(b, t)
    cdef uint64_t m
    cdef int looks
    for looks in range(64):
        m = ld64_seq(&nd.abandoned)
        if m == 0:
            if cas64(&nd.abandoned, 0, t + 1):
                return MARK_SLOT
            continue
        if _marks(m, t):
            return MARK_SLOT                         # (a redo of a recovery)
        if not _stale(m, ld64_seq(ticket_serving(b))):
            break                                    # another outstanding ticket's
        if cas64(&nd.abandoned, m, 0):
            _marker_wake(nd)
    for looks in range(64):
        m = ld64_seq(&r.omark)
        if m == 0:
            break
        if _marks(m, t):
            return MARK_PREC                         # (a redo of a recovery)
        if _stale(m, ld64_seq(ticket_serving(b))):
            _clear_stale_omark(b, p, m)              # (or another clears it: look again)
        elif m & SHM_TICKET_SKIP:
            # our previous ticket's skip is under way: finish it with its claimer
            _ticket_served(b, (m & ~SHM_TICKET_SKIP) - 1, shm_crash_armed)
        else:
            return R_CORRUPT                         # an outstanding ticket's, unclaimed
    if m != 0:
        return R_CORRUPT
    fadd32(&nd.overflow, 1)
    crashpoint("ticket.overflow.counted")
    if not cas64(&r.omark, 0, t + 1):
        fsub32(&nd.overflow, 1)
        return R_CORRUPT
    crashpoint("ticket.overflow.marked")
    return MARK_PREC


cdef bint _ticket_unmark(shm_body* b, uint32_t p, uint64_t t, int where) noexcept nogil:
    """Take ticket t's marker back (1: t is its owner p's again), from where _ticket_mark
    put it; 0 if a grant claimed it first."""
    cdef shm_tslot* nd = _tslot(b, t)
    if where == MARK_SLOT:
        return cas64(&nd.abandoned, t + 1, 0)
    if cas64(&b.precs[p].omark, t + 1, 0):
        fsub32(&nd.overflow, 1)
        return 1
    return 0


cdef inline void _marked_wake(shm_body* b, uint32_t p, uint64_t t, int where) noexcept nogil:
    """Ticket t (participant p's) left or came back: wake who watches its owner
    (_ticket_dep: the slot's marker, and the owner's omark)."""
    _marker_wake(_tslot(b, t))
    if where == MARK_PREC:
        shm_futex_wake(_omark_word(&b.precs[p]), 0x7fffffff)


cdef void _ticket_abandon_for(rmap_t* rm, shm_body* b, uint32_t q, uint64_t t) noexcept nogil:
    """Abandon dead participant q's waiting ticket t; if the lock reaches t meanwhile,
    pass it on (q never entered its critical section: no owner_died)."""
    cdef shm_prec* r = &b.precs[q]
    cdef int where = _ticket_mark(b, q, t)
    cdef uint64_t a
    if where < 0:
        return                                       # no marker free: left to the next
                                                     # recovery ([T4]), or corrupt
    if ld64_seq(ticket_serving(b)) == t and _ticket_unmark(b, q, t, where):
        _ticket_grant(b, t + 1, shm_crash_armed)     # it had just been granted: pass it on
        return
    # the slot's next owner waits for it; a marker kept in this prec first of all (an
    # omark is this prec's: the next owner must find it cleared before it overflows)
    a = ld64_seq(&r.abandoned)
    if where == MARK_SLOT and a != 0 and _marks(ld64_seq(&r.omark), a - 1):
        _marked_wake(b, q, t, where)
        return
    r.abandoned_gen = ld64_rlx(&rm.part[q].generation)
    st64_rel(&r.abandoned, t + 1)
    _marked_wake(b, q, t, where)


cdef void _ticket_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Participant q is dead and ours to recover (repair mutex held)."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t op = participant_op(rm, q, lock1)
    cdef uint64_t t, s, n0, u
    cdef bint seen
    cdef int om
    if r.ticket != 0:
        t = r.ticket - 1
        s = ld64_seq(ticket_serving(b))
        if s == t:                                   # [T1] it holds the lock (or was just granted)
            # Granted just before it marked t abandoned (it died between the mark and its
            # serving check): the mark is its own and means nothing now. Left, it would
            # block the abandon of ticket t + TS one lap later.
            cas64(&_tslot(b, t).abandoned, t + 1, 0)
            if cas64(&r.omark, t + 1, 0):
                fsub32(&_tslot(b, t).overflow, 1)
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
        seen = (_marks(ld64_seq(&_tslot(b, u).abandoned), u)
                or _ticket_find(b, u, &om) >= 0 or om >= 0)
        if not seen:
            s = ld64_seq(ticket_serving(b))
            if u < s:                                # its live holder released it while we
                u = s                                # looked (serving moves before the
                continue                             # ticket is cleared): not the dead's
            if u == s:
                _ticket_grant(b, u + 1, shm_crash_armed)     # taken, never entered: pass it on
            else:
                _ticket_abandon_for(rm, b, q, u)     # (no marker free: the next dead
                                                     # taker's recovery marks it)
        u += 1


cdef inline uint32_t* _marker_word(shm_tslot* nd) noexcept nogil:
    """The abandon marker's low half, as the futex word its watchers sleep on (x86-64 and
    arm64 are little-endian; a marker t + 1 whose low half is 0 changes unseen, once in 2**32
    tickets, and only within the instant between a watcher's read and its sleep). A claim
    (| SKIP, the high bit) leaves it as it was: whom a waiter depends on does not change."""
    return <uint32_t*>&nd.abandoned


cdef inline void _marker_wake(shm_tslot* nd) noexcept nogil:
    """A marker was set or cleared: the waiter behind that ticket depends on someone else
    now (_ticket_dep); wake it to look. Only on leaving, rejoining and the end of a skip,
    never on a plain release."""
    shm_futex_wake(_marker_word(nd), 0x7fffffff)


cdef int _ticket_find(shm_body* b, uint64_t u, int* marked) noexcept nogil:
    """The participant that published ticket u (its record's ticket is u + 1), or -1; and
    in *marked, if none, the one whose omark marks u (abandoned, its marker overflowed), or
    -1. Each record's ticket is read before its omark: an abandoner stores its omark before
    it clears its ticket, so it is seen in one or the other."""
    cdef uint32_t x
    marked[0] = -1
    for x in range(body_hwm(b)):
        if ld64_acq(&b.precs[x].ticket) == u + 1:
            if _marks(ld64_seq(&b.precs[x].omark), u):
                marked[0] = <int>x               # abandoning it right now: marked
                return -1
            return <int>x
        if marked[0] < 0 and _marks(ld64_seq(&b.precs[x].omark), u):
            marked[0] = <int>x
    return -1


cdef int _ticket_owner(shm_body* b, uint64_t u) noexcept nogil:
    """The participant that published ticket u (its record's ticket is u + 1), or -1."""
    cdef int om
    return _ticket_find(b, u, &om)


cdef bint _recover_dead_takers(rmap_t* rm, shm_body* b, recov_t* rec) noexcept nogil:
    """A ticket nobody published may be a dead taker's, killed between fetch_add and
    publishing: recover every dead participant that was taking this lock ([T4]). 1 if
    there was one."""
    cdef uint32_t x
    cdef bint any = 0
    for x in range(body_hwm(b)):
        if participant_dead(rm, x) and _taking(participant_op(rm, x, b.index + 1)):
            participant_try_recover(rm, x, rec)
            any = 1
    return any


cdef int _ticket_passer(rmap_t* rm, shm_body* b, uint64_t s, watch_t* ws) noexcept nogil:
    """Ticket s, being served, is abandoned: the grant that passes it is the last holder's
    (whose record names ticket s - 1 until its release is over), or a recoverer's. Watch the
    last holder (recovered here if dead: its grant is redone); DEP_UNKNOWN if it is done."""
    cdef int x = _ticket_owner(b, s - 1) if s != 0 else -1
    if x >= 0:
        return watch_participant(rm, <uint32_t>x, ws)
    return DEP_UNKNOWN


cdef int _ticket_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency: the owner of the nearest ticket ahead of ours that is not
    abandoned (the holder, for the next in line), watched with the abandon markers of the
    tickets in between and of its own (in its slot and in its owner's omark), so that a
    ticket ahead leaving or coming back wakes us to look again; if all of them are
    abandoned down to serving, the last holder, whose release passes them
    (_ticket_passer). A dead owner is recovered here. An unpublished ticket ahead (a taker
    between fetch_add and publishing) is not watchable: a taker that died there is
    recovered (as _ticket_recover's [T4]), else DEP_UNKNOWN."""
    cdef _ticket_ctx* c = <_ticket_ctx*>pk.ctx
    cdef shm_body* b = pk.b
    cdef rmap_t* rm = pk.rm
    cdef uint64_t s = ld64_seq(c.serving)
    cdef uint64_t u = c.t - 1
    cdef uint64_t m
    cdef uint32_t mark, looks = 0
    cdef int x, om
    cdef shm_tslot* nd
    if c.t - s == 0 or c.t - s > b.P:
        return DEP_CHANGED                           # served (or a corrupt distance)
    while True:
        nd = _tslot(b, u)
        mark = ld32_seq(_marker_word(nd))            # before what it is read to mean
        x = _ticket_find(b, u, &om)
        if x >= 0:
            m = ld64_seq(&b.precs[x].omark)          # (after the ticket: see _ticket_find)
            if not watch_word(ws, _marker_word(nd), mark):
                return DEP_UNKNOWN
            if not watch_word(ws, _omark_word(&b.precs[x]), <uint32_t>m):
                return DEP_UNKNOWN
            return watch_participant(rm, <uint32_t>x, ws)
        if _marks(ld64_seq(&nd.abandoned), u):
            if not watch_word(ws, _marker_word(nd), mark):
                return DEP_UNKNOWN
        elif om >= 0:
            m = ld64_seq(&b.precs[om].omark)
            if not _marks(m, u):
                looks += 1
                if looks < 8:
                    continue                         # taken back meanwhile: look again
                return DEP_UNKNOWN
            if not watch_word(ws, _omark_word(&b.precs[om]), <uint32_t>m):
                return DEP_UNKNOWN
        else:
            break                                    # unpublished
        if u == s:
            return _ticket_passer(rm, b, s, ws)      # (serving abandoned: a release skips it)
        u -= 1
    if ld64_seq(ticket_next(b)) == s:
        return DEP_CHANGED                           # nobody holds it
    return DEP_CHANGED if _recover_dead_takers(rm, b, ws.rec) else DEP_UNKNOWN


cdef int _ticket_dep_serving(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency while an inherited abandoned ticket waits to be passed and its
    marker cleared (rare): a stale marker is cleared here; else the owner of `serving`,
    looked at each slice (DEP_UNKNOWN) and recovered if dead, or if serving is abandoned
    the last holder passing it."""
    cdef _ticket_ctx* c = <_ticket_ctx*>pk.ctx
    cdef shm_body* b = pk.b
    cdef rmap_t* rm = pk.rm
    cdef uint64_t s = ld64_seq(ticket_serving(b))
    cdef uint64_t m = ld64_seq(c.serving)            # the inherited ticket's marker
    cdef int x, om
    if _marks(m, c.t - 1) and _stale(m, s):
        if pk.arg:                                   # kept in our own prec's omark
            _clear_stale_omark(b, pk.arg - 1, m)
        elif cas64(c.serving, m, 0):
            _marker_wake(_tslot(b, c.t - 1))
        return DEP_CHANGED
    if not watch_word(ws, <uint32_t*>c.serving, <uint32_t>m):
        return DEP_UNKNOWN
    x = _ticket_find(b, s, &om)
    if x >= 0:
        if participant_dead(rm, <uint32_t>x):
            participant_try_recover(rm, <uint32_t>x, ws.rec)
            return DEP_CHANGED
        return DEP_UNKNOWN
    if om >= 0 or _marks(ld64_seq(&_tslot(b, s).abandoned), s):
        x = _ticket_owner(b, s - 1) if s != 0 else -1   # abandoned: a release passes it
        if x >= 0 and participant_dead(rm, <uint32_t>x):
            participant_try_recover(rm, <uint32_t>x, ws.rec)
            return DEP_CHANGED
        return DEP_UNKNOWN
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
        cdef int where
        if r.abandoned_gen != ld64_rlx(&self.rm.part[me].generation):
            return 0                                 # inherited: see _settle_inherited
        r.abandoned = 0
        where = MARK_PREC if ld64_seq(&r.omark) == a else MARK_SLOT
        if _ticket_unmark(&self.b, me, a - 1, where):
            st64_rlx(&r.ticket, a)
            _marked_wake(&self.b, me, a - 1, where)
            return 1
        return 0

    cdef int _park(self, ready_fn ready, dep_fn dep, _ticket_ctx* ctx, shm_tslot* nd,
                   wait_t* w, uint32_t arg=0) noexcept nogil:
        """park() on node nd's grant counter."""
        cdef park_t pk
        pk.ready = ready
        pk.ctx = ctx
        pk.word = &nd.grants
        pk.parked = &nd.parked
        pk.dep = dep
        pk.rm = self.rm
        pk.b = &self.b
        pk.arg = arg
        return park(&pk, w)

    cdef int _settle_inherited(self, uint32_t me, wait_t* w) noexcept nogil:
        """An abandoned ticket inherited with the slot: wait until it is passed and its
        marker (in its slot, or in our own prec's omark) cleared."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t a = r.abandoned
        cdef shm_tslot* nd = _tslot(&self.b, a - 1)
        cdef _ticket_ctx ctx
        cdef bint own = _marks(ld64_seq(&r.omark), a - 1)
        cdef int res
        ctx.serving = &r.omark if own else &nd.abandoned
        ctx.t = a
        res = self._park(_ticket_marker_gone, _ticket_dep_serving, &ctx, nd, w,
                         me + 1 if own else 0)
        if res != R_ACQ:
            return res
        r.abandoned = 0
        return 0

    cdef int _abandon(self, uint32_t me, uint64_t t) noexcept nogil:
        """Leave the queue: R_TIMEOUT if left, R_ACQ if the lock was granted meanwhile."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef int where = _ticket_mark(&self.b, me, t)
        if where < 0:
            return R_CORRUPT                         # the one-ticket-per-participant bound broke
        crashpoint("ticket.abandon.marked")
        if ld64_seq(ticket_serving(&self.b)) == t:           # granted while we were leaving?
            if _ticket_unmark(&self.b, me, t, where):
                return R_ACQ                         # we won the marker: we hold it
        st64_rlx(&r.ticket, 0)
        r.abandoned_gen = ld64_rlx(&self.rm.part[me].generation)
        r.abandoned = t + 1                          # may already be consumed: _take_back knows
        _marked_wake(&self.b, me, t, where)
        return R_TIMEOUT

    cdef int _try(self, uint32_t me) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint64_t s, t
        if r.ticket != 0:
            return R_BUSY
        if r.abandoned != 0:
            if r.abandoned_gen != ld64_rlx(&self.rm.part[me].generation):
                if (_marks(ld64_seq(&_tslot(&self.b, r.abandoned - 1).abandoned),
                           r.abandoned - 1)
                        or _marks(ld64_seq(&r.omark), r.abandoned - 1)):
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
        nd = _tslot(&self.b, t)
        ctx.serving = ticket_serving(&self.b)
        ctx.t = t
        w.aside_ok = 1                               # queued: may step aside (§7.0)
        res = self._park(_ticket_ready, _ticket_dep, &ctx, nd, w)
        w.aside_ok = 0
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


_register_kind(TicketLock, NULL, _ticket_recover, 1, NULL, SHM_TICKET_SLOTS)   # its slots
