# clh.pxi -- CLH queue lock with abandonable nodes and recoverable participants
# (indices, not pointers).
#
# Invariant: tail.last is the last node (never empty: a free lock's last node is FREE).
# A waiter spins (then parks) on its predecessor's node; a node's owner holds the lock once
# that node is FREE. Nodes travel: at release a participant adopts its predecessor's node
# (prec.mine := pred) and leaves its own in the queue for its successor. The pool has
# P + 1 nodes: one per participant plus the lock's; each is some participant's `mine`, or
# the one floating FREE node at the head that the holder will adopt. Node ids (in the tail,
# pred, guess, mine, prec.pred, op_value) are index + 1, as every id in the segment
# (shm_layout.h): 1..part_hwm (the participants provisioned) and P+1, the lock's own node;
# _clh_ok() checks one before use. A region that grows adds participants each with its own
# node (_clh_grow): the pool gains a participant and a node, and stays one node larger.
#
#   word A    u64 tail      (queue.pxd: queue_tail, tail_last, tail_prev)
#                           last | prev << 32: the last node and ITS predecessor (UNKNOWN
#                           after an abort stepped out), taken by CAS, so a joiner's
#                           predecessor is known the instant it joins
#   qnode[i]  state  FREE 0 (released) | BUSY 1 (owner waiting or holding)
#                    | ABANDONED 2 (owner left; its successor must wait on node.pred)
#                    | RECLAIMING 3 -> RECLAIMED 4 (the successor took note, gave it back)
#                    | ASIDE | round (owner waits aside, docs/design.md §7.0: its place
#                    stays queued; below)
#             pred   predecessor node, UNKNOWN until published (by its owner, or by the
#                    next joiner from the tail word it replaced)
#             left_gen  generation of the participant (thread) that abandoned it: only that
#                    thread rejoins in place; a new thread inheriting the slot waits
#             guess  the tail's last as its owner CASed the tail: its pred once joined
#                    (queue.pxi), when the owners of several joiners in a row died
#                    before publishing or helping
#             round  bumped by whoever enqueues the node: (node, round) names one passage
#                    of a node through the queue. Nodes travel, so "node X is BUSY" alone
#                    cannot tell a recoverer whether X is still the dead participant's or
#                    already the next owner's; the round can.
#   prec[p]   mine   the node p owns;  pred: the node p waits on and adopts at release
#             round  the round of `mine` as p enqueued it
#
# Stepping aside (docs/design.md §7.0): a queued waiter that steps aside publishes its pred
# and sets its node ASIDE | round (C_ASIDE with the low 30 bits of its round, so that a CAS
# from it names one passage of the node: nodes travel). Its place stays queued. A waiter
# behind looks through waiters aside to the first node that is not aside (_clh_look):
# when that one is FREE, the turn of the node aside right above it has come, and it passes
# it, ASIDE -> FREE: a hand-off on its owner's behalf, as an acquire and a release at once.
# The owner, back from aside, finds its node passed (FREE, or a later round) and adopts its
# own pred's node, which that pass left FREE for it alone, as a release adopts it; or finds
# it still ASIDE and takes it back, ASIDE -> BUSY: in its old place (its VIP turn), or to
# leave it (a timeout aside: then abandoned as below). One CAS decides between the pass and
# the taking back. An abandoned node under a node aside is handed back only by the owner
# of the one aside (its successor) when it comes back: a waiter behind waits for that.
#
# Abandonment (Scott & Scherer, PPoPP 2001, "CLH-try"): if p is last, CAS the tail back to
# its predecessor and keep its node; else publish pred, then ABANDONED. The successor that
# sees ABANDONED takes it (ABANDONED -> RECLAIMING, so its owner cannot rejoin with a stale
# pred), reads pred, hands the node back (RECLAIMED) and waits on pred. A thread waiting
# for its node to come back checks on the successor that owes it, or steps the node out of
# the tail itself if nothing is queued behind it. Death: a parked waiter sleeps on the
# node it waits on and on its owner's liveness token (_clh_dep), and is woken by that
# death; a dead holder is released on its behalf (owner_died if it had returned from acquire), a dead waiter abandoned on its
# behalf, a dead releaser's adoption or a dead reclaimer's hand-back finished.

cdef struct clh_wait_t:   # a CLH waiter's ready context: what its last look saw (_clh_look)
    shm_qnode* n          # the node it waits on: its pred, or the first one not aside below
    uint32_t n_st         # the waiters aside ahead; n's state then (BUSY; under a node aside
                          # also ABANDONED or RECLAIMING: that one's owner hands it back)
    shm_qnode* top        # the node aside right above n (NULL: n is its pred)
    uint32_t top_st       # its state then (an aside state)
    uint32_t dep          # the node whose owner it depends on: n if BUSY, else top
    shm_body* b
    uint32_t own          # the lock's own node id (P + 1)


cdef int _clh_ready(void* c) noexcept nogil:
    """READY once what the last look saw changed (look again); FAR while someone else is
    ahead: the node we wait on waits itself (its pred BUSY or aside), or it is an abandoned
    node under a node aside (whose owner must come back to hand it back)."""
    cdef clh_wait_t* x = <clh_wait_t*>c
    cdef uint32_t pp, st
    if ld32_seq(&x.n.state) != x.n_st:
        return Q_READY
    if x.top != NULL and ld32_seq(&x.top.state) != x.top_st:
        return Q_READY
    if x.n_st != C_BUSY:
        return Q_FAR
    pp = ld32_rlx(&x.n.pred)                        # a hint: bounds-checked, never trusted
    if queue_node_ok(x.b, pp, x.own):
        st = ld32_rlx(&x.b.qnodes[pp - 1].state)
        if st == C_BUSY or _clh_is_aside(st):
            return Q_FAR
    return Q_NEAR


cdef int _clh_not_reclaiming(void* c) noexcept nogil:
    cdef uint32_t st = ld32_seq(&(<shm_qnode*>c).state)
    return st != C_RECLAIMING and st != C_ABANDONED


cdef inline bint _clh_ok(uint32_t X, shm_body* b) noexcept nogil:
    """Does node id X (index + 1, read from shared memory) name a node in the pool: one of
    a participant provisioned (1..part_hwm) or the lock's own (P + 1)? Unsigned: 0 (none)
    and C_UNKNOWN wrap round and fail (queue.pxd queue_node_ok)."""
    return queue_node_ok(b, X, b.P + 1)


cdef void _clh_grow(shm_body* b, uint32_t lo, uint32_t hi) noexcept nogil:
    """Participants [lo, hi) join the pool, each with its own node (nobody else's: nodes
    travel only among the participants already in it), idle."""
    cdef uint32_t i
    for i in range(lo, hi):
        b.precs[i].mine = i + 1
        b.precs[i].pred = i + 1                      # idle: mine == pred, as after a release


cdef void _clh_init(shm_body* b) noexcept nogil:
    _clh_grow(b, 0, body_hwm(b))
    queue_tail(b)[0] = tail_encode(b.P + 1, C_UNKNOWN)  # the lock's own node, FREE


cdef void _clh_reclaim(rmap_t* rm, shm_body* b, uint32_t q, uint32_t pn) noexcept nogil:
    """q (live, or dead and being recovered) waits on abandoned node pn: take note of its
    predecessor, hand it back to its owner and wait on that predecessor instead."""
    cdef shm_qnode* n = &b.qnodes[pn - 1]
    cdef uint32_t pp
    if ld32_seq(&n.state) == C_ABANDONED:
        # a recoverer finishes it, for this passage of pn only (_clh_redo_reclaim)
        st64_rel(&rm.part[q].op_value, pass_encode(pn, ld32_acq(&n.round)))
        if not cas32(&n.state, C_ABANDONED, C_RECLAIMING):
            st64_rel(&rm.part[q].op_value, 0)
            return                                   # its thread rejoined: wait on it again
    elif ld32_seq(&n.state) != C_RECLAIMING:
        return
    pp = ld32_acq(&n.pred)
    trace("clh.reclaim", q, pn, pp)
    crashpoint("clh.wait.reclaiming")
    if _clh_ok(pp, b) and _clh_ok(b.precs[q].mine, b):
        st32_rlx(&b.precs[q].pred, pp)
        st32_rel(&b.qnodes[b.precs[q].mine - 1].pred, pp)
    st32_seq(&n.state, C_RECLAIMED)                  # hand the node back to its owner
    wake_if_parked(&n.state, &n.parked)
    st64_rel(&rm.part[q].op_value, 0)


cdef int _clh_abort_as(rmap_t* rm, shm_body* b, uint32_t q, bint dead) noexcept nogil:
    """Leave the queue for q: R_TIMEOUT, or R_ACQ if the lock was granted meanwhile (for a
    dead q the caller then releases it on q's behalf)."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t X = r.mine
    cdef uint32_t p = r.pred
    cdef shm_qnode* x = &b.qnodes[X - 1]
    cdef uint64_t t
    st32_rel(&x.pred, p)
    t = ld64_seq(queue_tail(b))
    if tail_last(t) == X and cas64(queue_tail(b), t, tail_encode(p, C_UNKNOWN)):
        trace("clh.abort.out", q | (<uint64_t>dead << 32), X, p)
        crashpoint("clh.abort.stepped_out")
        st32_rel(&x.state, C_RECLAIMED)              # nobody behind us: our node is ours
        return R_TIMEOUT
    if ld32_seq(&b.qnodes[p - 1].state) == C_FREE:
        trace("clh.abort.granted", q | (<uint64_t>dead << 32), X, p)
        return R_ACQ                                 # granted as we were leaving
    trace("clh.abort.abandon", q | (<uint64_t>dead << 32), X, p)
    st64_rel(&x.left_gen, ld64_rlx(&rm.part[q].generation))
    st32_seq(&x.state, C_ABANDONED)                  # our successor will wait on p instead
    wake_if_parked(&x.state, &x.parked)
    return R_TIMEOUT


cdef inline void _clh_release_as(shm_body* b, uint32_t q, bint armed) noexcept nogil:
    """Release for q: free its node for its successor, then adopt its predecessor's. Its
    callers checked both ids (_clh_ok: a participant provisioned, or the lock's own): this
    checks only that X is inside the body."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t X = r.mine
    trace("clh.release", q, X, r.pred)
    if X != r.pred and X - 1 <= b.P:
        st32_seq(&b.qnodes[X - 1].state, C_FREE)          # our successor may go
        wake_if_parked(&b.qnodes[X - 1].state, &b.qnodes[X - 1].parked)
        crashpoint_at(armed, "clh.release.freed")
        st32_rel(&r.mine, r.pred)                    # adopt the predecessor's node


cdef int _clh_look(shm_body* b, uint32_t p, clh_wait_t* c, bint armed) noexcept nogil:
    """Where a waiter behind node p (its pred) stands, looking through the waiters aside
    ahead of it (docs/design.md §7.0) down to the first node that is not aside. A FREE one
    there is the turn of the node aside right above it: pass that one (ASIDE -> FREE, a
    hand-off on its owner's behalf, who adopts its own pred as after a release) and look
    again. LOOK_FREE: p is FREE; LOOK_ABANDONED: p is abandoned; LOOK_WAIT: c says on what
    to wait; LOOK_CORRUPT. A pass is decided by one CAS from the state the look read: the
    round in it names the passage, whose pred cannot change, and that pred, FREE, stays so
    until the owner of the node aside adopts it."""
    cdef uint32_t n, nx, st, steps, looks = 0
    cdef uint32_t top_st = 0, top_id = 0
    cdef uint32_t lim = body_hwm(b) + 2
    cdef shm_qnode* top
    cdef bint broken
    while True:
        looks += 1
        if looks > 8 * lim + 64:                     # a node ahead changes only so often
            return LOOK_CORRUPT
        n = p
        top = NULL
        broken = 0
        steps = 0
        st = ld32_seq(&b.qnodes[n - 1].state)
        while _clh_is_aside(st):
            top = &b.qnodes[n - 1]
            top_st = st
            top_id = n
            nx = ld32_acq(&top.pred)                 # published before it went aside
            steps += 1
            if not _clh_ok(nx, b) or nx == n or steps > lim:
                broken = 1
                break
            n = nx
            st = ld32_seq(&b.qnodes[n - 1].state)
        c.n = &b.qnodes[n - 1]
        c.n_st = st
        c.top = top
        c.top_st = top_st
        c.dep = n
        if top == NULL:
            if st == C_FREE:
                return LOOK_FREE
            if st == C_ABANDONED:
                return LOOK_ABANDONED
            return LOOK_WAIT if st == C_BUSY else LOOK_CORRUPT
        if not broken:
            if st == C_FREE:
                if cas32(&top.state, top_st, C_FREE):    # its turn: pass it
                    trace("clh.aside.pass", top_id, n, top_st)
                    crashpoint_at(armed, "clh.aside.passed")
                    # a waiter parked on it itself; one that looks through it (_clh_dep
                    # watches its state uncounted) was woken by n's release already
                    wake_if_parked(&top.state, &top.parked)
                continue
            if st == C_BUSY:
                return LOOK_WAIT
            if st == C_ABANDONED or st == C_RECLAIMING:
                c.dep = top_id                       # its owner hands it back, once back
                return LOOK_WAIT
        if ld32_seq(&top.state) != top_st:
            continue                                 # it moved while we looked: again
        return LOOK_CORRUPT


cdef int _clh_step_aside(shm_body* b, uint32_t q, bint armed) noexcept nogil:
    """Queued participant q steps aside (docs/design.md §7.0): its node says ASIDE with its
    round, its place stays queued (R_ASIDE). R_ACQ if it was granted as it left (the node
    taken back, unless a waiter behind passed it first: then it is aside, passed)."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t X = r.mine
    cdef uint32_t p = r.pred
    cdef shm_qnode* x = &b.qnodes[X - 1]
    cdef uint32_t v = _clh_aside_st(r.round)
    if ld32_seq(&b.qnodes[p - 1].state) == C_FREE:
        return R_ACQ
    st32_rel(&x.pred, p)
    st32_seq(&x.state, v)                            # a waiter behind looks through us now
    trace("clh.aside", q, X, p)
    crashpoint_at(armed, "clh.aside.left")
    wake_if_parked(&x.state, &x.parked)
    if ld32_seq(&b.qnodes[p - 1].state) == C_FREE and cas32(&x.state, v, C_BUSY):
        wake_if_parked(&x.state, &x.parked)         # (one looking through us: p woke it)
        return R_ACQ
    return R_ASIDE


cdef uint32_t _clh_succ_of(shm_body* b, uint32_t X) noexcept nogil:
    """The queued node waiting on node X (QUEUE_NONE if none): one naming X as its pred,
    else found by the walk back from the tail (the successor's pred is not published)."""
    cdef uint32_t y = queue_named_succ(b, b.P + 1, X, C_QUEUED)
    if y != QUEUE_NONE:
        return y
    return queue_succ_of(queue_tail(b), b, b.P + 1, X, C_QUEUED)


cdef bint _clh_in_queue(shm_body* b, uint32_t X) noexcept nogil:
    """Is node X in the queue: last, or some queued node's predecessor? A recoverer's
    question about a dead participant's node X, which cannot move meanwhile; the nodes
    behind it can. The scan and the walk each read one node at a time, so a hand-off
    behind X while they read (S abandons, T takes over S's pred X, S becomes RECLAIMED)
    can hide X's successor from one look: only a "no" seen three times, with a yield
    between (this path is rare), is believed."""
    cdef uint64_t t
    cdef int look
    for look in range(3):
        if look:
            sched_yield()
        t = ld64_seq(queue_tail(b))
        if tail_last(t) == X or tail_prev(t) == X:
            return 1
        if _clh_succ_of(b, X) != QUEUE_NONE:
            return 1
    return 0


cdef bint _clh_pred_unknown(shm_body* b, uint32_t x) noexcept nogil:
    cdef uint32_t m = ld32_acq(&b.precs[x].mine)
    return _clh_ok(m, b) and ld32_acq(&b.qnodes[m - 1].pred) == C_UNKNOWN


cdef inline bint _clh_settle_joiners(rmap_t* rm, shm_body* b, uint32_t q,
                                     recov_t* rec) noexcept nogil:
    """Let live joiners (tail taken, pred not yet published) finish those two steps. 0 if
    time ran out first: decide nothing then."""
    return participants_settle(rm, b, q, SHM_OP_TAKING, _clh_pred_unknown, rec)


cdef bint _clh_still_queued_as(shm_body* b, uint32_t X, uint32_t rnd) noexcept nogil:
    """Is node X still in the passage (round rnd) that its dead owner enqueued, and not yet
    freed? State first, round second: a node enqueued anew stores its round before it
    publishes BUSY, so a BUSY of a later passage is never read with an older round."""
    return ld32_seq(&b.qnodes[X - 1].state) == C_BUSY and ld32_acq(&b.qnodes[X - 1].round) == rnd


cdef void _clh_redo_reclaim(rmap_t* rm, shm_body* b, uint32_t q, uint64_t v) noexcept nogil:
    """q died reclaiming an abandoned node (op_value v = node id | round << 32): finish it
    if that node is still in the same passage; a later passage is someone else's."""
    cdef pass_t p = pass_decode(v)
    if not _clh_ok(p.node, b):
        return
    if ld32_acq(&b.qnodes[p.node - 1].round) == p.round:
        _clh_reclaim(rm, b, q, p.node)


cdef void _clh_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Participant q is dead and ours to recover (repair mutex held)."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t op = participant_op(rm, q, lock1)
    cdef uint32_t X = ld32_acq(&r.mine)
    cdef uint32_t p, guard, st, av
    cdef uint64_t t, v
    cdef shm_qnode* xn
    trace("clh.recover", q | (<uint64_t>op << 32), X | (<uint64_t>r.pred << 32),
          ld32_rlx(&b.qnodes[X - 1].state) | (<uint64_t>ld32_rlx(&b.qnodes[X - 1].pred) << 32)
          if _clh_ok(X, b) else 0)
    if not _clh_ok(X, b):
        return
    xn = &b.qnodes[X - 1]
    if op == SHM_OP_RELEASING:  # [C1] [C2] (docs/design.md §7.3)
        if X != r.pred and _clh_ok(r.pred, b):
            # Free its node only if it had not yet: once freed, the node passes to its
            # successor, who may already have adopted and enqueued it again (a later
            # round), and may do so while we look: only the round tells them apart.
            if _clh_still_queued_as(b, X, ld32_acq(&r.round)):   # [C1] it still held
                recover_verdict(rm, b, q, op)        # [V] the lock: its release decides
                st32_seq(&xn.state, C_FREE)
                wake_if_parked(&xn.state, &xn.parked)
            st32_rel(&r.mine, r.pred)                # [C1] [C2] adopt the predecessor's node
        holder_forget(rm, b, q)
        return
    st = ld32_seq(&xn.state)
    av = _clh_aside_st(ld32_acq(&r.round))
    if st == av and ld32_acq(&xn.round) == ld32_acq(&r.round):   # [C9]
        # it waited aside, its place queued: take it back for it (unless a waiter behind
        # passes it first: then [C3]), then decide as for a waiter in its place
        if cas32(&xn.state, av, C_BUSY):
            trace("clh.recover.unaside", q, X, r.pred)
            shm_futex_wake(&xn.state, 0x7fffffff)
            st = C_BUSY
        else:
            st = ld32_seq(&xn.state)
    if st == C_FREE or ld32_acq(&xn.round) != ld32_acq(&r.round):  # [C3]
        # X left its passage: freed by a release made on q's behalf (a recoverer's, who
        # died before adopting the predecessor's node: finish it, or q would keep a node
        # that its successor adopts too), or idle since q's own release (mine == pred).
        if X != r.pred and _clh_ok(r.pred, b):
            st32_rel(&r.mine, r.pred)
        return
    if st != C_BUSY:
        return                                       # not queued
    v = ld64_acq(&rm.part[q].op_value)
    if v != 0:
        _clh_redo_reclaim(rm, b, q, v)               # [C4] finish the hand-back it was making
    p = ld32_acq(&xn.pred)
    if p == C_UNKNOWN:  # [C5]
        t = ld64_seq(queue_tail(b))
        if tail_last(t) == X:
            p = tail_prev(t)
        else:
            # Did it join? If so, whoever joined after it publishes its pred: let the live
            # joiners finish their two steps, then decide.
            if not _clh_settle_joiners(rm, b, q, rec):
                return
            p = ld32_acq(&xn.pred)
            if p == C_UNKNOWN:
                if tail_last(ld64_seq(queue_tail(b))) == X:
                    p = tail_prev(ld64_seq(queue_tail(b)))
                elif _clh_in_queue(b, X):
                    p = ld32_acq(&xn.guess)          # it joined: its guess was right
                else:
                    trace("clh.recover.nojoin", q, X, 0)
                    st32_rel(&xn.state, C_RECLAIMED)     # it never joined the queue
                    return
        if not _clh_ok(p, b):
            return
        st32_rel(&xn.pred, p)
    if not _clh_ok(p, b):
        return
    if not _clh_in_queue(b, X):
        if not _clh_settle_joiners(rm, b, q, rec):
            return
        if not _clh_in_queue(b, X):                  # [C6] it had stepped out (abort) already
            trace("clh.recover.notinq", q, X, p)
            st32_rel(&xn.state, C_RECLAIMED)
            return
    st32_rlx(&r.pred, p)
    guard = 0
    while ld32_seq(&b.qnodes[p - 1].state) == C_ABANDONED and guard <= b.P:
        _clh_reclaim(rm, b, q, p)                    # as it would have: pass over its
        p = ld32_acq(&r.pred)                        # abandoned predecessors first
        if not _clh_ok(p, b):
            return
        guard += 1
    if ld32_seq(&b.qnodes[p - 1].state) != C_FREE:
        if _clh_abort_as(rm, b, q, 1) == R_TIMEOUT:  # [C7] it waits: abandon its place for it
            return
        _clh_release_as(b, q, shm_crash_armed)       # granted meanwhile: pass it on
        return
    trace("clh.recover.holds", q | (<uint64_t>op << 32), X, p)
    recover_verdict(rm, b, q, op)                    # [C8] it holds the lock: [V]
    crashpoint("clh.recover.flagged")
    _clh_release_as(b, q, shm_crash_armed)


cdef int _clh_check_owner(rmap_t* rm, shm_body* b, uint32_t pn, watch_t* ws,
                          bint arm) noexcept nogil:
    """The owner of node pn, which we wait on: recovered if dead (DEP_CHANGED, by ws.rec),
    else its token armed (arm: DEP_ARMED). DEP_UNKNOWN if no participant owns pn now. Two
    may name pn as theirs for a while: a node passed over aside travels on before its
    owner, asleep aside, adopts its pred (§7.0); the owner of its passage is the one whose
    round is the node's."""
    cdef uint32_t y, h = body_hwm(b)
    cdef uint32_t rnd = ld32_acq(&b.qnodes[pn - 1].round)
    cdef int found = -1
    for y in range(h):
        if ld32_acq(&b.precs[y].mine) == pn:
            if ld32_acq(&b.precs[y].round) == rnd:
                found = <int>y
                break
            if found < 0:
                found = <int>y
    if found < 0:
        return DEP_UNKNOWN
    y = <uint32_t>found
    if participant_dead(rm, y):
        participant_try_recover(rm, y, ws.rec)
        return DEP_CHANGED
    return watch_participant(rm, y, ws) if arm else DEP_UNKNOWN


cdef int _clh_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency: the owner of the node we depend on (pk.arg: the one we wait on,
    whose state is the word we sleep on, its owner leaving changes it and wakes us:
    _clh_abort_as, _clh_step_aside; or, for an abandoned node under a node aside, the node
    aside), and the state of the node aside right above the one we wait on (pk.ctx: its
    pass, its owner's return or leaving wake us: _clh_look, CLHLock._aside_end)."""
    cdef clh_wait_t* c = <clh_wait_t*>pk.ctx
    if c.top != NULL and not watch_word(ws, &c.top.state, c.top_st):
        return DEP_UNKNOWN
    return _clh_check_owner(pk.rm, pk.b, pk.arg, ws, 1)


cdef int _clh_tend_abandoned(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency while our node X (pk.arg), abandoned by the thread that had our
    slot before us, waits to be handed back (rare: looked at each slice, DEP_UNKNOWN):
    check the owner of the node it waited on; if nothing is
    queued behind X, step it out of the tail ourselves (as its abort would have); else
    recover the one who owes us the hand-back if it is dead: the first waiter behind us,
    past the nodes behind us that were abandoned too (that waiter reclaims them first)."""
    cdef rmap_t* rm = pk.rm
    cdef shm_body* b = pk.b
    cdef uint32_t X = pk.arg
    cdef shm_qnode* x = &b.qnodes[X - 1]
    cdef uint64_t t
    cdef uint32_t p
    cdef uint32_t s = X, st, guard
    if _clh_check_owner(rm, b, ld32_acq(&x.pred), ws, 0) == DEP_CHANGED:
        return DEP_CHANGED
    t = ld64_seq(queue_tail(b))
    p = ld32_acq(&x.pred)
    if tail_last(t) == X:
        if (_clh_ok(p, b) and ld32_seq(&x.state) == C_ABANDONED
                and cas64(queue_tail(b), t, tail_encode(p, C_UNKNOWN))):
            trace("clh.tend.out", X, p, t)
            st32_seq(&x.state, C_RECLAIMED)          # out of the queue: ours again
            return DEP_CHANGED
        return DEP_UNKNOWN
    for guard in range(body_hwm(b) + 1):
        s = _clh_succ_of(b, s)
        if s == QUEUE_NONE or not _clh_ok(s, b):
            return DEP_UNKNOWN
        if _clh_check_owner(rm, b, s, ws, 0) == DEP_CHANGED:    # its owner: recovered if dead
            return DEP_CHANGED
        st = ld32_acq(&b.qnodes[s - 1].state)
        if st != C_ABANDONED and st != C_RECLAIMING:
            return DEP_UNKNOWN
    return DEP_UNKNOWN


cdef class CLHLock(_Lock):
    """FIFO CLH queue lock: each waiter spins on its predecessor's cache line."""
    kind_name = "clh"
    kind_code = SHM_KIND_CLH
    fifo = True
    recovery = "user"
    priority_inheritance = False

    cdef inline int _enqueue(self, uint32_t me, uint32_t X, bint armed) noexcept nogil:
        """Join the queue with our node X (r.mine, which the caller checked: _clh_ok)."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint32_t p, rnd
        cdef uint64_t old
        rnd = ld32_rlx(&self.b.qnodes[X - 1].round) + 1       # a new passage of X
        st32_rlx(&self.b.qnodes[X - 1].round, rnd)
        st32_rlx(&r.round, rnd)
        st32_rlx(&self.b.qnodes[X - 1].pred, C_UNKNOWN)
        st32_rel(&self.b.qnodes[X - 1].state, C_BUSY)         # after the round (see above)
        while True:                                  # join: tail := (X, old last)
            old = ld64_seq(queue_tail(&self.b))
            st32_rel(&self.b.qnodes[X - 1].guess, tail_last(old))  # pred if won
            if cas64(queue_tail(&self.b), old, tail_encode(X, tail_last(old))):
                break
        crashpoint_at(armed, "clh.acquire.joined")
        trace("clh.joined", me, X, old)
        p = tail_last(old)
        if not _clh_ok(p, &self.b) or p == X:
            return R_CORRUPT
        if (ld32_acq(&self.b.qnodes[p - 1].pred) == C_UNKNOWN     # p has not published its pred
                and ld32_acq(&self.b.qnodes[p - 1].state) != C_FREE):  # and its round goes on:
            cas32(&self.b.qnodes[p - 1].pred, C_UNKNOWN, tail_prev(old))  # do it for p
        st32_rlx(&r.pred, p)
        st32_rel(&self.b.qnodes[X - 1].pred, p)           # then our own
        crashpoint_at(armed, "clh.acquire.pred")
        if ld32_acq(&self.b.qnodes[p - 1].state) == C_FREE:
            trace("clh.acq.fast", me, X, p)
            return R_ACQ
        return R_PENDING

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        cdef uint32_t X = ld32_rlx(&self.b.precs[me].mine)
        cdef uint32_t st
        if not _clh_ok(X, &self.b):
            return R_CORRUPT
        st = ld32_acq(&self.b.qnodes[X - 1].state)
        if st == C_BUSY or st == C_ABANDONED or st == C_RECLAIMING:
            return R_BUSY
        return self._enqueue(me, X, armed)

    cdef int _try(self, uint32_t me) noexcept nogil:
        cdef int rc = self._fast(me, shm_crash_armed)
        cdef clh_wait_t cw
        cdef uint32_t p
        if rc == R_PENDING:
            # only waiters aside ahead, whose turns have come: pass them (§7.0)
            p = ld32_rlx(&self.b.precs[me].pred)
            cw.b = &self.b
            cw.own = self.b.P + 1
            if (_clh_ok(p, &self.b) and _clh_is_aside(ld32_acq(&self.b.qnodes[p - 1].state))
                    and _clh_look(&self.b, p, &cw, shm_crash_armed) == LOOK_FREE):
                return R_ACQ
            rc = _clh_abort_as(self.rm, &self.b, me, 0)
            return R_ACQ if rc == R_ACQ else R_BUSY
        return rc

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint32_t X = ld32_rlx(&r.mine)
        cdef uint32_t p, st
        cdef shm_qnode* x
        cdef clh_wait_t cw
        cdef park_t pk
        cdef int res, look
        if not _clh_ok(X, &self.b):
            return R_CORRUPT
        cw.b = &self.b
        cw.own = self.b.P + 1
        x = &self.b.qnodes[X - 1]
        pk.rm = self.rm
        pk.b = &self.b
        if rc == R_BUSY:
            st = ld32_acq(&x.state)
            if (st == C_ABANDONED and x.left_gen == ld64_rlx(&self.rm.part[me].generation)
                    and cas32(&x.state, C_ABANDONED, C_BUSY)):
                st32_rlx(&r.pred, ld32_acq(&x.pred))     # back in our old place
                trace("clh.rejoin", me, X, r.pred)
            elif st == C_BUSY or _clh_is_aside(st):
                return R_CORRUPT
            else:
                if st == C_RECLAIMING or st == C_ABANDONED:   # not yet handed back
                    pk.ready = _clh_not_reclaiming
                    pk.ctx = x
                    pk.word = &x.state
                    pk.parked = &x.parked
                    pk.dep = _clh_tend_abandoned
                    pk.arg = X
                    res = park(&pk, w)
                    if res != R_ACQ:
                        if res == R_WOULDBLOCK:
                            w.resume_rc = R_BUSY     # not queued yet: look at the node again
                        return res
                rc = self._enqueue(me, X, shm_crash_armed)
                if rc != R_PENDING:
                    return rc
        pk.ready = _clh_ready
        pk.ctx = &cw
        pk.dep = _clh_dep
        while True:
            p = ld32_rlx(&r.pred)
            if not _clh_ok(p, &self.b):
                return R_CORRUPT
            look = _clh_look(&self.b, p, &cw, shm_crash_armed)
            if look == LOOK_FREE:
                trace("clh.acq", me, X, p)
                return R_ACQ
            if look == LOOK_ABANDONED:
                _clh_reclaim(self.rm, &self.b, me, p)
                continue
            if look != LOOK_WAIT:
                return R_CORRUPT
            pk.word = &cw.n.state                    # we park on our predecessor's node (or
            pk.parked = &cw.n.parked                 # the first below the waiters aside)
            pk.arg = cw.dep
            w.aside_ok = 1                           # queued: may step aside (§7.0)
            res = park(&pk, w)
            w.aside_ok = 0
            if res == R_ACQ:
                continue                             # what we looked at changed: again
            if res == R_WOULDBLOCK:
                w.resume_rc = R_PENDING              # queued: waits on prec.pred again
                return res
            if res == R_ASIDE:
                res = _clh_step_aside(&self.b, me, shm_crash_armed)
                if res == R_ACQ:
                    trace("clh.acq", me, X, p)
                return res                           # R_ASIDE: its place stays queued
            rc = _clh_abort_as(self.rm, &self.b, me, 0)
            if rc == R_TIMEOUT:
                return res                           # R_TIMEOUT or R_SIGNAL
            return rc

    cdef int _aside_end(self, uint32_t me, int rc) noexcept nogil:
        """Back from aside (docs/design.md §7.0): on the VIP turn (rc R_CONT) take our
        place back if it is still queued (R_PENDING: _wait goes on behind prec.pred), or,
        passed over at its turn, adopt our pred's node as after a release and join anew
        (_fast); leaving (R_TIMEOUT, R_SIGNAL) our place is left as at a timeout (R_ACQ if
        granted meanwhile)."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint32_t X = ld32_rlx(&r.mine)
        cdef uint32_t v, st
        cdef shm_qnode* x
        cdef int rc2
        if not _clh_ok(X, &self.b) or not _clh_ok(r.pred, &self.b):
            return R_CORRUPT
        x = &self.b.qnodes[X - 1]
        v = _clh_aside_st(r.round)
        while True:
            st = ld32_seq(&x.state)
            if st == v and ld32_acq(&x.round) == r.round:
                if not cas32(&x.state, v, C_BUSY):
                    continue                         # passed as we came back
                trace("clh.aside.back", me, X, r.pred)
                crashpoint("clh.aside.back")
                if rc == R_CONT:
                    wake_if_parked(&x.state, &x.parked)
                    return R_PENDING                 # in our old place
                # leaving: a waiter behind that waits (through us) for an abandoned node
                # under us to be handed back must look again (it watches us uncounted)
                shm_futex_wake(&x.state, 0x7fffffff)
                rc2 = _clh_abort_as(self.rm, &self.b, me, 0)
                return rc if rc2 == R_TIMEOUT else rc2
            if X != r.pred and (st == C_FREE or ld32_acq(&x.round) != r.round):
                # passed over at our turn: the node we waited on is ours, FREE (nobody
                # else adopts it), as after a release; ours travelled on
                dassert(ld32_acq(&self.b.qnodes[r.pred - 1].state) == C_FREE,
                        "clh: a waiter passed over aside adopts a FREE node")
                trace("clh.aside.adopt", me, X, r.pred)
                crashpoint("clh.aside.adopt")
                st32_rel(&r.mine, r.pred)
                if rc != R_CONT:
                    return rc
                return self._fast(me, shm_crash_armed)
            return R_CORRUPT

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        if not _clh_ok(r.mine, &self.b) or not _clh_ok(r.pred, &self.b):
            return R_CORRUPT
        dassert(r.mine != r.pred, "clh: the holder waited on another node than its own")
        dassert(ld32_acq(&self.b.qnodes[r.mine - 1].state) == C_BUSY, "clh: the holder's node is BUSY")
        dassert(ld32_acq(&self.b.qnodes[r.pred - 1].state) == C_FREE, "clh: the holder's pred is FREE")
        dassert(_clh_ok(tail_last(ld64_acq(queue_tail(&self.b))), &self.b),
                "clh: tail index in range")
        _clh_release_as(&self.b, me, armed)
        return 0

    cdef bint _is_locked(self) noexcept nogil:
        cdef uint32_t t = tail_last(ld64_acq(queue_tail(&self.b)))
        if not _clh_ok(t, &self.b):
            return 1
        return ld32_acq(&self.b.qnodes[t - 1].state) != C_FREE


_register_kind(CLHLock, _clh_init, _clh_recover, 1, _clh_grow)
