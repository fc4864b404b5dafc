# clhc.pxi -- the compact CLH stripe of a lock table (docs/design.md §15): clh.pxi's
# protocol over a node pool that the whole table shares, so that a stripe is one 128-byte
# line and a participant needs one node per table, not one per stripe.
#
# Invariant: as clh.pxi, tail.last is the stripe's last node (a free stripe's is FREE), a
# waiter waits on its pred's node and nodes travel; but a grantee adopts its pred's node AT
# THE GRANT (clh.pxi: at the release) and names its own queued node in the stripe's head
# word, whose node the release frees. So every participant owns a node free to wait with
# (prec.mine) while it holds any number of stripes, and the pool is a node per participant
# plus a node per stripe: each node is some participant's `mine` or some stripe's head node
# (FREE at its tail, or its holder's, BUSY), but for nodes queued by waiters.
#
#   stripe line   the holder's half as every compact stripe's (ctl: holder, statistics);
#                 the waiters' half (shm_layout.h SHM_STRIPE_CLH_*):
#     byte 64  u64 tail   last | prev << 32 (queue.pxd's codec, as clh.pxi)
#     byte 72  u64 head   the holder's queued node | its round << 32: the passage the
#                         release frees (live while that node is BUSY of that round)
#     byte 80  node       the node that starts here (id CH_SNODE | the stripe's lock
#                         number), 28 bytes (shm_cnode); it travels like any
#     byte 116 aside      the waiters' aside words with one seat (docs/design.md §7.0)
#   node (shm_cnode)      state, pred, parked, round, guess as clh.pxi; lock1: the stripe of
#                         its passage (nodes travel between stripes); left_gen: the low 32
#                         bits of the generation that abandoned it
#   prec[p] (the table's line of p)  mine, pred, round as clh.pxi; qd: the node it last
#                         enqueued ((qd, round) names its last passage); hpass: the passage
#                         whose release it is making
#
# Holding: p holds stripe s iff s's head is live (its node BUSY of its round, on s) and
# names p's passage: (p.qd, p.round) == head while p has not enqueued since, else the
# holder record (which the base writes after the grant and clears before the release),
# else p.hpass (its release under way), else p is between clearing the record and naming
# the passage in hpass (op RELEASING on s); or p's node is queued on s with its pred FREE
# (granted, the head not yet written). Death table: docs/design.md §15 "Compact clh
# stripes" ([R] [H] [U] and clh.pxi's [C3]-[C9]).
#
# A node abandoned on stripe i (a timeout) is its participant's again only once its
# successor hands it back (RECLAIMED): until then the participant cannot queue anywhere.
# Its successor must therefore run: a waiter aside (§7.0) behind an abandoned node would
# hand it back only at its VIP turn, which may wait for a holder that waits for the
# abandoner (a deadlock the program does not have). So an abandon calls back the waiter
# aside behind it (_ch_recall: its aside word bumped and woken; aside_sleep then finds the
# node it waits on ABANDONED, wait_t.recall), which comes back to its place, hands the node
# back and may step aside again.


cdef inline bint _ch_stripe_ok(rmap_t* rm, uint32_t lk) noexcept nogil:
    """Is lk (read from shared memory) the lock number of a stripe of the region's table?"""
    return lk - rm.tbl.first < rm.tbl.size


cdef inline bint _ch_ok(rmap_t* rm, shm_body* b, uint32_t X) noexcept nogil:
    """Does node id X (read from shared memory) name a node of the pool: a participant
    provisioned (1..part_hwm), or a stripe's (CH_SNODE | its lock number)? Unsigned: 0,
    SHM_ID_UNKNOWN and QUEUE_NONE fail."""
    if (X >> 30) == 1:
        return _ch_stripe_ok(rm, X & CH_SMASK)
    return queue_node_ok(b, X, 0)


cdef inline uint32_t _ch_pool(rmap_t* rm, shm_body* b, uint32_t i) noexcept nogil:
    """The i-th node of the pool: the participants' (i < hwm), then the stripes'."""
    cdef uint32_t h = body_hwm(b)
    return i + 1 if i < h else CH_SNODE | (rm.tbl.first + (i - h))


cdef inline bint _ch_live(rmap_t* rm, shm_body* b, uint64_t h) noexcept nogil:
    """Is passage h (node | round << 32, a head) still under way on stripe b: its node BUSY
    of that round, on this stripe? State first, round second (clh.pxi
    _clh_still_queued_as: a node enqueued anew stores its round before BUSY)."""
    cdef uint32_t X = pair_lo(h)
    cdef shm_cnode* x
    if not _ch_ok(rm, b, X):
        return 0
    x = ch_node(b, X)
    return (ld32_seq(&x.state) == C_BUSY and ld32_acq(&x.round) == pair_hi(h)
            and ld32_acq(&x.lock1) == b.index + 1)


cdef void _ch_init(shm_body* b) noexcept nogil:
    """A new stripe (its line zeroed; its table's node lines too): its node FREE at its
    tail, no head; the participants' table lines own their nodes (idle: mine == pred)."""
    _clh_grow(b, 0, body_hwm(b))
    ch_tail(b)[0] = tail_encode(CH_SNODE | b.index, C_UNKNOWN)
    ch_head(b)[0] = 0


# -- grant and release ------------------------------------------------------------------

cdef inline void _ch_grant(shm_body* b, uint32_t q, bint armed) noexcept nogil:
    """q's queued node (prec.mine, of round prec.round) found its pred FREE: q holds the
    stripe. The head names its passage, then q adopts its pred's node (FREE: nobody but its
    successor, q, takes it), a node to wait with elsewhere while it holds this stripe."""
    cdef shm_prec* r = &b.precs[q]
    st64_rel(ch_head(b), id_pair(r.mine, r.round))
    # the queued node heads the queue now: its link to the node adopted below would be
    # stale the moment that node travels on (a scan or walk would take the head for a
    # successor of it), so it names none (0: no node; _ch_in_queue, _ch_walk_succ)
    st32_rel(&ch_node(b, r.mine).pred, 0)
    crashpoint_at(armed, "clhc.grant.head")
    trace("clhc.grant", q, r.mine, r.pred)
    st32_rel(&r.mine, r.pred)


cdef inline int _ch_free(rmap_t* rm, shm_body* b, uint32_t q, uint64_t h,
                         bint armed) noexcept nogil:
    """Release passage h (the head) for q: named in q's line first (hpass: a death from
    here on is [R]), then its node FREE for the successor, who adopts it at its grant.
    hpass is left as it is: a passage is live only until its node is freed (a node
    queued anew has a later round), so a stale one never matches a live head."""
    cdef shm_cnode* x = ch_node(b, pair_lo(h))
    st64_rel(&b.precs[q].hpass, h)
    crashpoint_at(armed, "clhc.release.named")
    st32_seq(&x.state, C_FREE)                       # our successor may go
    wake_if_parked(&x.state, &x.parked)
    crashpoint_at(armed, "clhc.release.freed")
    return 0


# -- abandonment, reclaim, stepping aside (clh.pxi's, over the pool) -----------------------

cdef void _ch_reclaim(rmap_t* rm, shm_body* b, uint32_t q, uint32_t pn) noexcept nogil:
    """q (live, or dead and being recovered) waits on abandoned node pn: take note of its
    predecessor, hand it back to its owner and wait on that predecessor instead."""
    cdef shm_cnode* n = ch_node(b, pn)
    cdef uint32_t pp
    if ld32_seq(&n.state) == C_ABANDONED:
        # a recoverer finishes it, for this passage of pn only (_ch_redo_reclaim)
        st64_rel(&rm.part[q].op_value, pass_encode(pn, ld32_acq(&n.round)))
        if not cas32(&n.state, C_ABANDONED, C_RECLAIMING):
            st64_rel(&rm.part[q].op_value, 0)
            return                                   # its thread rejoined: wait on it again
    elif ld32_seq(&n.state) != C_RECLAIMING:
        return
    pp = ld32_acq(&n.pred)
    trace("clhc.reclaim", q, pn, pp)
    crashpoint("clhc.wait.reclaiming")
    if _ch_ok(rm, b, pp) and _ch_ok(rm, b, b.precs[q].mine):
        st32_rlx(&b.precs[q].pred, pp)
        st32_rel(&ch_node(b, b.precs[q].mine).pred, pp)
    st32_seq(&n.state, C_RECLAIMED)                  # hand the node back to its owner
    wake_if_parked(&n.state, &n.parked)
    st64_rel(&rm.part[q].op_value, 0)


cdef int _ch_abort_as(rmap_t* rm, shm_body* b, uint32_t q, bint dead) noexcept nogil:
    """Leave the queue for q: R_TIMEOUT, or R_ACQ if the stripe was granted meanwhile (the
    caller grants it: _ch_grant; for a dead q it then releases it on q's behalf). Its
    abandon wakes whoever waits on its node, and calls a successor aside back (_ch_recall)."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t X = r.mine
    cdef uint32_t p = r.pred
    cdef shm_cnode* x = ch_node(b, X)
    cdef uint64_t t
    st32_rel(&x.pred, p)
    t = ld64_seq(ch_tail(b))
    if tail_last(t) == X and cas64(ch_tail(b), t, tail_encode(p, C_UNKNOWN)):
        trace("clhc.abort.out", q | (<uint64_t>dead << 32), X, p)
        crashpoint("clhc.abort.stepped_out")
        st32_rel(&x.state, C_RECLAIMED)              # nobody behind us: our node is ours
        return R_TIMEOUT
    if ld32_seq(&ch_node(b, p).state) == C_FREE:
        trace("clhc.abort.granted", q | (<uint64_t>dead << 32), X, p)
        return R_ACQ                                 # granted as we were leaving
    trace("clhc.abort.abandon", q | (<uint64_t>dead << 32), X, p)
    st32_rel(&x.left_gen, <uint32_t>ld64_rlx(&rm.part[q].generation))
    st32_seq(&x.state, C_ABANDONED)                  # our successor will wait on p instead
    crashpoint("clhc.abandon.left")
    wake_if_parked(&x.state, &x.parked)
    _ch_recall(rm, b, X)                             # (aside, it comes back to hand it back)
    return R_TIMEOUT


cdef int _ch_look(shm_body* b, uint32_t p, ch_wait_t* c, bint armed) noexcept nogil:
    """Where a waiter behind node p (its pred) stands, looking through the waiters aside
    ahead of it down to the first node that is not aside (clh.pxi _clh_look: a FREE one
    there is the turn of the node aside right above it, which this waiter passes)."""
    cdef rmap_t* rm = c.rm
    cdef uint32_t n, nx, st, steps, looks = 0
    cdef uint32_t top_st = 0, top_id = 0
    cdef uint32_t lim = body_hwm(b) + 2
    cdef shm_cnode* top
    cdef bint broken
    while True:
        looks += 1
        if looks > 8 * lim + 64:                     # a node ahead changes only so often
            return LOOK_CORRUPT
        n = p
        top = NULL
        broken = 0
        steps = 0
        st = ld32_seq(&ch_node(b, n).state)
        while _clh_is_aside(st):
            top = ch_node(b, n)
            top_st = st
            top_id = n
            nx = ld32_acq(&top.pred)                 # published before it went aside
            steps += 1
            if not _ch_ok(rm, b, nx) or nx == n or steps > lim:
                broken = 1
                break
            n = nx
            st = ld32_seq(&ch_node(b, n).state)
        c.n = ch_node(b, n)
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
                    trace("clhc.aside.pass", top_id, n, top_st)
                    crashpoint_at(armed, "clhc.aside.passed")
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


cdef int _ch_ready(void* c) noexcept nogil:
    """READY once what the last look saw changed (look again); FAR while someone else is
    ahead (clh.pxi _clh_ready)."""
    cdef ch_wait_t* x = <ch_wait_t*>c
    cdef uint32_t pp, st
    if ld32_seq(&x.n.state) != x.n_st:
        return Q_READY
    if x.top != NULL and ld32_seq(&x.top.state) != x.top_st:
        return Q_READY
    if x.n_st != C_BUSY:
        return Q_FAR
    pp = ld32_rlx(&x.n.pred)                        # a hint: bounds-checked, never trusted
    if _ch_ok(x.rm, x.b, pp):
        st = ld32_rlx(&ch_node(x.b, pp).state)
        if st == C_BUSY or _clh_is_aside(st):
            return Q_FAR
    return Q_NEAR


cdef int _ch_step_aside(rmap_t* rm, shm_body* b, uint32_t q, wait_t* w,
                        bint armed) noexcept nogil:
    """Queued participant q steps aside (docs/design.md §7.0, as clh.pxi's): its node says
    ASIDE with its round, its place stays queued, and the node it waits on abandoned calls
    it back (w.recall, _ch_recall): R_ASIDE. R_ACQ if it was granted as it
    left (the caller grants: _ch_grant); R_PENDING if the node it waits on is abandoned
    (it stays to hand it back)."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t X = r.mine
    cdef uint32_t p = r.pred
    cdef shm_cnode* x = ch_node(b, X)
    cdef shm_cnode* pn = ch_node(b, p)
    cdef uint32_t v = _clh_aside_st(r.round)
    cdef uint32_t ps = ld32_seq(&pn.state)
    if ps == C_FREE:
        return R_ACQ
    if ps == C_ABANDONED or ps == C_RECLAIMING:
        return R_PENDING
    st32_rel(&x.pred, p)
    st32_seq(&x.state, v)                            # a waiter behind looks through us now
    trace("clhc.aside", q, X, p)
    crashpoint_at(armed, "clhc.aside.left")
    wake_if_parked(&x.state, &x.parked)
    ps = ld32_seq(&pn.state)                         # (after our store: an abandon that
    if ps == C_FREE or ps == C_ABANDONED or ps == C_RECLAIMING:    # missed us is seen)
        if cas32(&x.state, v, C_BUSY):
            wake_if_parked(&x.state, &x.parked)
            return R_ACQ if ps == C_FREE else R_PENDING
    # an abandon calls it back (not its turn: a running waiter behind passes it then, the
    # point of stepping aside; woken at each turn, the hand-offs would go to sleepers)
    w.recall = &pn.state
    w.recall_set = (1 << C_ABANDONED) | (1 << C_RECLAIMING)
    return R_ASIDE


# -- who is where (the recoverer's and the dependency's questions) ------------------------

cdef uint32_t _ch_named_succ(rmap_t* rm, shm_body* b, uint32_t lock1,
                             uint32_t target) noexcept nogil:
    """A node queued on stripe lock1 that names `target` as its published pred, else
    QUEUE_NONE: one pass over the pool (the participants' nodes, then the stripes')."""
    cdef uint32_t i, x, n = body_hwm(b) + rm.tbl.size
    cdef shm_cnode* xn
    for i in range(n):
        x = _ch_pool(rm, b, i)
        if x == target:
            continue
        xn = ch_node(b, x)
        if (ld32_acq(&xn.lock1) == lock1 and queue_state_in(ld32_acq(&xn.state), C_QUEUED)
                and ld32_acq(&xn.pred) == target):
            return x
    return QUEUE_NONE


cdef uint32_t _ch_walk_succ(rmap_t* rm, shm_body* b, uint64_t* tail, uint32_t lock1,
                            uint32_t target) noexcept nogil:
    """The node queued on stripe lock1 (its tail: `tail`) right after `target`, found by
    the walk back from the tail through the links (pred, else guess: queue.pxi's
    invariant), or QUEUE_NONE; every id bounds-checked, a walk that goes round starts over
    a few times."""
    cdef uint32_t id, link, st, steps, attempt
    cdef shm_cnode* n
    for attempt in range(4):
        id = tail_last(ld64_seq(tail))
        steps = 0
        while steps <= body_hwm(b) + 2:
            if id == target or not _ch_ok(rm, b, id):
                return QUEUE_NONE
            n = ch_node(b, id)
            st = ld32_acq(&n.state)
            if ld32_acq(&n.lock1) != lock1 or not queue_state_in(st, C_QUEUED):
                return QUEUE_NONE
            link = ld32_acq(&n.pred)
            if link == QUEUE_UNKNOWN:
                link = ld32_acq(&n.guess)
            if link == target:
                return id
            id = link
            steps += 1
        sched_yield()
    return QUEUE_NONE


cdef uint32_t _ch_succ_of(rmap_t* rm, shm_body* b, uint64_t* tail, uint32_t lock1,
                          uint32_t X) noexcept nogil:
    cdef uint32_t y = _ch_named_succ(rm, b, lock1, X)
    if y != QUEUE_NONE:
        return y
    return _ch_walk_succ(rm, b, tail, lock1, X)


cdef bint _ch_in_queue(rmap_t* rm, shm_body* b, uint32_t X) noexcept nogil:
    """Is node X in stripe b's queue: last, or reached by the walk back from the tail (a
    "no" believed only when seen three times, as clh.pxi's _clh_in_queue)? Not by a node
    that merely names X (_ch_named_succ): a waiter killed as it stepped out of the tail
    (clhc.abort.stepped_out), not yet recovered, still says BUSY and names its pred, out
    of the queue; taking it for X's successor made the recovery of X's owner, killed
    stepping out in turn, grant it the stripe's free node, which the next grantee adopted
    too."""
    cdef uint64_t t
    cdef uint32_t lp
    cdef int look
    for look in range(3):
        if look:
            sched_yield()
        t = ld64_seq(ch_tail(b))
        if tail_last(t) == X:
            return 1
        if tail_prev(t) == X and _ch_ok(rm, b, tail_last(t)):
            # the last node's pred, as it joined: unless that node was granted since (its
            # pred then 0: the prev is stale, X adopted and gone), or named another
            lp = ld32_seq(&ch_node(b, tail_last(t)).pred)
            if lp == C_UNKNOWN or lp == X:
                return 1
        if _ch_walk_succ(rm, b, ch_tail(b), b.index + 1, X) != QUEUE_NONE:
            return 1
    return 0


cdef int _ch_owner(rmap_t* rm, shm_body* b, uint32_t pn) noexcept nogil:
    """The participant whose passage node pn (checked) is in, or -1: its enqueuer while it
    has not enqueued since (qd and round), else, for a holder's node (the head of its
    stripe), the stripe's holder record or the participant releasing it (hpass), else one
    whose step is RELEASING that stripe (between the base's clearing of the record and
    its hpass: the death table's [U], which only its recovery, found here, completes)."""
    cdef shm_cnode* n = ch_node(b, pn)
    cdef uint32_t rnd = ld32_acq(&n.round)
    cdef uint32_t lk1 = ld32_acq(&n.lock1)
    cdef uint64_t h = id_pair(pn, rnd)
    cdef uint32_t y, hid, hw = body_hwm(b)
    cdef char* line
    for y in range(hw):
        if ld32_acq(&b.precs[y].qd) == pn and ld32_acq(&b.precs[y].round) == rnd:
            return <int>y
    for y in range(hw):
        if ld64_acq(&b.precs[y].hpass) == h:
            return <int>y
    if not _ch_stripe_ok(rm, lk1 - 1):
        return -1
    line = ch_line(b, lk1 - 1)
    if ld64_acq(<uint64_t*>(line + SHM_STRIPE_CLH_HEAD_OFF)) != h:
        return -1                                    # not a holder's node
    hid = holder_slot(rm, ld32_acq(&(<shm_lockctl*>line).holder))
    if hid != 0 and hid - 1 < hw:
        return <int>(hid - 1)
    for y in range(hw):
        if participant_op(rm, y, lk1) == SHM_OP_RELEASING:
            return <int>y
    return -1


cdef void _ch_recall(rmap_t* rm, shm_body* b, uint32_t X) noexcept nogil:
    """Node X (checked) is abandoned: if the waiter right behind it is aside, wake it there
    (its prec.aside_wake, bumped, as aside_kick does): it finds X abandoned (wait_t.recall)
    and comes back to hand it back. One that steps aside after this looks finds X
    abandoned itself (_ch_step_aside looks again after its node says aside); a look that
    misses it (a walk cut short) is made again by X's owner at each slice of its wait for
    the node (_ch_tend_abandoned), and by a recovery of the owner."""
    cdef shm_cnode* x = ch_node(b, X)
    cdef uint32_t lk1 = ld32_acq(&x.lock1)
    cdef uint32_t s
    if not _ch_stripe_ok(rm, lk1 - 1):
        return
    s = _ch_succ_of(rm, b, <uint64_t*>(ch_line(b, lk1 - 1) + SHM_STRIPE_WA_OFF), lk1, X)
    if s != QUEUE_NONE and _ch_ok(rm, b, s):
        _ch_recall_succ(rm, b, X, s)


cdef void _ch_recall_succ(rmap_t* rm, shm_body* b, uint32_t X, uint32_t s) noexcept nogil:
    """s (checked) is the node right behind abandoned node X: if it is aside, wake its
    owner there (_ch_recall)."""
    cdef int y
    if not _clh_is_aside(ld32_seq(&ch_node(b, s).state)):
        return
    y = _ch_owner(rm, b, s)
    if y >= 0:
        trace("clhc.recall", X, s, y)
        fadd32(&b.precs[y].aside_wake, 1)
        shm_futex_wake(&b.precs[y].aside_wake, 0x7fffffff)


cdef int _ch_check_owner(rmap_t* rm, shm_body* b, uint32_t pn, watch_t* ws,
                         bint arm) noexcept nogil:
    """The owner of node pn, which we wait on: recovered if dead (DEP_CHANGED, by ws.rec),
    else its token armed (arm: DEP_ARMED). DEP_UNKNOWN if no participant is found."""
    cdef int y
    if not _ch_ok(rm, b, pn):
        return DEP_UNKNOWN
    y = _ch_owner(rm, b, pn)
    if y < 0:
        return DEP_UNKNOWN
    if participant_dead(rm, <uint32_t>y):
        participant_try_recover(rm, <uint32_t>y, ws.rec)
        return DEP_CHANGED
    return watch_participant(rm, <uint32_t>y, ws) if arm else DEP_UNKNOWN


cdef int _ch_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency (clh.pxi _clh_dep): the owner of the node we depend on, and the
    state of the node aside right above the one we wait on."""
    cdef ch_wait_t* c = <ch_wait_t*>pk.ctx
    if c.top != NULL and not watch_word(ws, &c.top.state, c.top_st):
        return DEP_UNKNOWN
    return _ch_check_owner(pk.rm, pk.b, pk.arg, ws, 1)


cdef int _ch_not_reclaiming(void* c) noexcept nogil:
    cdef uint32_t st = ld32_seq(&(<shm_cnode*>c).state)
    return st != C_RECLAIMING and st != C_ABANDONED


cdef int _ch_tend_abandoned(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency while our node X (pk.arg), abandoned on some stripe of the table
    (its lock1: maybe not the one we want now), waits to be handed back: call a successor
    aside back (_ch_recall: the abandon's own call may have been missed, or died with its
    thread), check the owner of the node it waited on; if nothing is queued behind X, step
    it out of that stripe's tail ourselves; else recover the one who owes us the hand-back
    if it is dead (clh.pxi _clh_tend_abandoned)."""
    cdef rmap_t* rm = pk.rm
    cdef shm_body* b = pk.b
    cdef uint32_t X = pk.arg
    cdef shm_cnode* x = ch_node(b, X)
    cdef uint32_t lk1 = ld32_acq(&x.lock1)
    cdef uint64_t* tail
    cdef uint64_t t
    cdef uint32_t p, st, guard
    cdef uint32_t s = X
    if not _ch_stripe_ok(rm, lk1 - 1):
        return DEP_UNKNOWN
    tail = <uint64_t*>(ch_line(b, lk1 - 1) + SHM_STRIPE_WA_OFF)
    p = ld32_acq(&x.pred)
    if _ch_ok(rm, b, p) and _ch_check_owner(rm, b, p, ws, 0) == DEP_CHANGED:
        return DEP_CHANGED
    t = ld64_seq(tail)
    p = ld32_acq(&x.pred)
    if tail_last(t) == X:
        if (_ch_ok(rm, b, p) and ld32_seq(&x.state) == C_ABANDONED
                and cas64(tail, t, tail_encode(p, C_UNKNOWN))):
            trace("clhc.tend.out", X, p, t)
            st32_seq(&x.state, C_RECLAIMED)          # out of the queue: ours again
            return DEP_CHANGED
        return DEP_UNKNOWN
    for guard in range(body_hwm(b) + 1):
        s = _ch_succ_of(rm, b, tail, lk1, s)
        if s == QUEUE_NONE or not _ch_ok(rm, b, s):
            return DEP_UNKNOWN
        if guard == 0 and ld32_seq(&x.state) == C_ABANDONED:
            _ch_recall_succ(rm, b, X, s)             # (the one found for the walk below)
        if _ch_check_owner(rm, b, s, ws, 0) == DEP_CHANGED:
            return DEP_CHANGED
        st = ld32_acq(&ch_node(b, s).state)
        if st != C_ABANDONED and st != C_RECLAIMING:
            return DEP_UNKNOWN
    return DEP_UNKNOWN


# -- recovery (docs/design.md §15, "Compact clh stripes": the death table) ------------------

cdef void _ch_release_for(rmap_t* rm, shm_body* b, uint32_t q, uint64_t h,
                          uint32_t op) noexcept nogil:
    """Dead q holds stripe b by passage h: name it in q's line (a recovery cut short after
    the verdict, which clears the holder record, is redone by [R]), [V], free it."""
    st64_rel(&b.precs[q].hpass, h)
    recover_verdict(rm, b, q, op)
    crashpoint("clhc.recover.flagged")
    _ch_free(rm, b, q, h, shm_crash_armed)


cdef void _ch_redo_reclaim(rmap_t* rm, shm_body* b, uint32_t q, uint64_t v) noexcept nogil:
    """q died reclaiming an abandoned node on this stripe (op_value v = node | round << 32):
    finish it if that node is still in the same passage, here."""
    cdef pass_t p = pass_decode(v)
    cdef shm_cnode* n
    if not _ch_ok(rm, b, p.node):
        return
    n = ch_node(b, p.node)
    if ld32_acq(&n.round) == p.round and ld32_acq(&n.lock1) == b.index + 1:
        _ch_reclaim(rm, b, q, p.node)


cdef bint _ch_accounted(rmap_t* rm, shm_body* b, uint32_t q, uint64_t h) noexcept nogil:
    """Does a participant other than q account for live passage h of stripe b: its last
    passage, the holder record, or a release it names (hpass)?"""
    cdef uint32_t y
    cdef uint32_t hid = ld32_acq(&b.ctl.holder)
    if hid != 0 and hid != participant_hid(rm, q):
        return 1
    for y in range(body_hwm(b)):
        if y == q:
            continue
        if ((ld32_acq(&b.precs[y].qd) == pair_lo(h) and ld32_acq(&b.precs[y].round) == pair_hi(h))
                or ld64_acq(&b.precs[y].hpass) == h):
            return 1
    return 0


cdef void _ch_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Participant q is dead and ours to recover (the table's repair mutex held): its part
    in stripe b. Each step a CAS or a store of the same value: a recovery cut short is
    redone whole (docs/design.md §6.2)."""
    cdef shm_prec* r = &b.precs[q]
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t op = participant_op(rm, q, lock1)
    cdef uint32_t X = ld32_acq(&r.mine)
    cdef uint64_t h = ld64_acq(ch_head(b))
    cdef uint32_t p, guard, st, av
    cdef uint64_t t, v
    cdef shm_cnode* xn
    trace("clhc.recover", q | (<uint64_t>op << 32), X | (<uint64_t>r.pred << 32), h)
    if _ch_live(rm, b, h):
        # [R] it was releasing the head's passage (or a recoverer was, for it)
        # [H] the head is its passage: its last one, or the holder record names it
        if (ld64_acq(&r.hpass) == h
                or (ld32_acq(&r.qd) == pair_lo(h) and ld32_acq(&r.round) == pair_hi(h))
                or ld32_acq(&b.ctl.holder) == participant_hid(rm, q)):
            if X == pair_lo(h) and _ch_ok(rm, b, r.pred) and r.pred != X:
                st32_rel(&r.mine, r.pred)            # it died before adopting its pred's
            trace("clhc.recover.holds", q | (<uint64_t>op << 32), pair_lo(h), h)
            _ch_release_for(rm, b, q, h, op)
            return
        # [U] it died releasing before it named the passage (after the base cleared the
        # holder record): once no other participant accounts for it and the live
        # releasers of this stripe are done, the passage is its
        if op == SHM_OP_RELEASING and not _ch_accounted(rm, b, q, h):
            if not participants_settle(rm, b, q, SHM_OP_RELEASING, settle_any, rec):
                return
            if ld64_acq(ch_head(b)) == h and _ch_live(rm, b, h) and not _ch_accounted(rm, b, q, h):
                trace("clhc.recover.unnamed", q, pair_lo(h), h)
                _ch_release_for(rm, b, q, h, op)
                return
    if not _ch_ok(rm, b, X):
        holder_forget(rm, b, q)
        return
    xn = ch_node(b, X)
    if (X != r.pred and _ch_ok(rm, b, r.pred)
            and (ld32_seq(&xn.state) == C_FREE or ld32_acq(&xn.round) != ld32_acq(&r.round))):
        # [C3] X left the passage q enqueued while q was aside: passed at its turn (the
        # node q waited on is its own, FREE, as _aside_end adopts it), and maybe adopted
        # and queued anew by the waiter that passed it, on any stripe: adopt q's pred
        st32_rel(&r.mine, r.pred)
        holder_forget(rm, b, q)
        return
    if ld32_acq(&xn.lock1) != lock1:
        holder_forget(rm, b, q)                      # its node is not on this stripe
        return
    st = ld32_seq(&xn.state)
    if st == C_ABANDONED:
        _ch_recall(rm, b, X)                         # (its abandon's, if cut short)
    av = _clh_aside_st(ld32_acq(&r.round))
    if st == av and ld32_acq(&xn.round) == ld32_acq(&r.round):   # [C9]
        if cas32(&xn.state, av, C_BUSY):
            trace("clhc.recover.unaside", q, X, r.pred)
            shm_futex_wake(&xn.state, 0x7fffffff)
            st = C_BUSY
        else:
            st = ld32_seq(&xn.state)
    if st == C_FREE or ld32_acq(&xn.round) != ld32_acq(&r.round):  # [C3]
        if X != r.pred and _ch_ok(rm, b, r.pred):
            st32_rel(&r.mine, r.pred)                # (passed as the take-back was tried)
        holder_forget(rm, b, q)
        return
    if st != C_BUSY:
        holder_forget(rm, b, q)
        return                                       # not queued (abandoned: handed back)
    v = ld64_acq(&rm.part[q].op_value)
    if v != 0:
        _ch_redo_reclaim(rm, b, q, v)                # [C4] finish the hand-back it made
    p = ld32_acq(&xn.pred)
    if p == C_UNKNOWN:  # [C5]
        t = ld64_seq(ch_tail(b))
        if tail_last(t) == X:
            p = tail_prev(t)
        else:
            if not participants_settle(rm, b, q, SHM_OP_TAKING, settle_any, rec):
                return
            p = ld32_acq(&xn.pred)
            if p == C_UNKNOWN:
                if tail_last(ld64_seq(ch_tail(b))) == X:
                    p = tail_prev(ld64_seq(ch_tail(b)))
                elif _ch_in_queue(rm, b, X):
                    p = ld32_acq(&xn.guess)          # it joined: its guess was right
                else:
                    trace("clhc.recover.nojoin", q, X, 0)
                    st32_rel(&xn.state, C_RECLAIMED)     # it never joined the queue
                    return
        if not _ch_ok(rm, b, p):
            return
        st32_rel(&xn.pred, p)
    if not _ch_ok(rm, b, p):
        return
    if not _ch_in_queue(rm, b, X):
        if not participants_settle(rm, b, q, SHM_OP_TAKING, settle_any, rec):
            return
        if not _ch_in_queue(rm, b, X):               # [C6] it had stepped out already
            trace("clhc.recover.notinq", q, X, p)
            st32_rel(&xn.state, C_RECLAIMED)
            return
    st32_rlx(&r.pred, p)
    guard = 0
    while ld32_seq(&ch_node(b, p).state) == C_ABANDONED and guard <= body_hwm(b):
        _ch_reclaim(rm, b, q, p)                     # as it would have: pass over its
        p = ld32_acq(&r.pred)                        # abandoned predecessors first
        if not _ch_ok(rm, b, p):
            return
        guard += 1
    if ld32_seq(&ch_node(b, p).state) != C_FREE:
        if _ch_abort_as(rm, b, q, 1) == R_TIMEOUT:   # [C7] it waits: abandon its place
            return
    # [C8] it holds (granted, the head not yet written; or granted as it was abandoned
    # for it): as its grant would, then [V] and the release
    trace("clhc.recover.granted", q | (<uint64_t>op << 32), X, p)
    _ch_grant(b, q, 0)
    _ch_release_for(rm, b, q, ld64_acq(ch_head(b)), op)


# -- the stripe --------------------------------------------------------------------------

cdef class CLHStripe(CLHLock):
    """A stripe of a clh LockTable: one 128-byte line (kinds/clhc.pxi), FIFO."""

    cdef int _ch_enqueue(self, uint32_t me, uint32_t X, bint armed) noexcept nogil:
        """Join the stripe's queue with our node X (r.mine, checked): R_ACQ (granted at
        once: _ch_grant done), R_PENDING, or R_CORRUPT."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef shm_cnode* x = ch_node(&self.b, X)
        cdef shm_cnode* pn
        cdef uint32_t p, rnd
        cdef uint64_t old
        rnd = ld32_rlx(&x.round) + 1                 # a new passage of X
        st32_rlx(&x.round, rnd)
        st32_rlx(&x.lock1, self.b.index + 1)
        st32_rlx(&r.qd, X)
        st32_rlx(&r.round, rnd)
        st32_rlx(&x.pred, C_UNKNOWN)
        st32_rel(&x.state, C_BUSY)                   # after the round and the stripe
        while True:                                  # join: tail := (X, old last)
            old = ld64_seq(ch_tail(&self.b))
            st32_rel(&x.guess, tail_last(old))       # pred if won
            if cas64(ch_tail(&self.b), old, tail_encode(X, tail_last(old))):
                break
        crashpoint_at(armed, "clhc.acquire.joined")
        trace("clhc.joined", me, X, old)
        p = tail_last(old)
        if not _ch_ok(self.rm, &self.b, p) or p == X:
            return R_CORRUPT
        pn = ch_node(&self.b, p)
        if (ld32_acq(&pn.pred) == C_UNKNOWN          # p has not published its pred
                and ld32_acq(&pn.state) != C_FREE):  # and its round goes on: do it for p
            cas32(&pn.pred, C_UNKNOWN, tail_prev(old))
        st32_rlx(&r.pred, p)
        st32_rel(&x.pred, p)                         # then our own
        crashpoint_at(armed, "clhc.acquire.pred")
        if ld32_acq(&pn.state) == C_FREE:
            _ch_grant(&self.b, me, armed)
            return R_ACQ
        return R_PENDING

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        cdef uint32_t X = ld32_rlx(&self.b.precs[me].mine)
        cdef uint32_t st
        if not _ch_ok(self.rm, &self.b, X):
            return R_CORRUPT
        st = ld32_acq(&ch_node(&self.b, X).state)
        if st == C_BUSY or st == C_ABANDONED or st == C_RECLAIMING or _clh_is_aside(st):
            return R_BUSY                            # our node is not back yet: _wait
        return self._ch_enqueue(me, X, armed)

    cdef int _try(self, uint32_t me) noexcept nogil:
        cdef int rc = self._fast(me, shm_crash_armed)
        cdef ch_wait_t cw
        cdef uint32_t p
        if rc == R_PENDING:
            # only waiters aside ahead, whose turns have come: pass them (§7.0)
            p = ld32_rlx(&self.b.precs[me].pred)
            cw.b = &self.b
            cw.rm = self.rm
            if (_ch_ok(self.rm, &self.b, p)
                    and _clh_is_aside(ld32_acq(&ch_node(&self.b, p).state))
                    and _ch_look(&self.b, p, &cw, shm_crash_armed) == LOOK_FREE):
                _ch_grant(&self.b, me, shm_crash_armed)
                return R_ACQ
            rc = _ch_abort_as(self.rm, &self.b, me, 0)
            if rc == R_ACQ:
                _ch_grant(&self.b, me, shm_crash_armed)
                return R_ACQ
            return R_BUSY
        return rc

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint32_t X = ld32_rlx(&r.mine)
        cdef uint32_t lock1 = self.b.index + 1
        cdef uint32_t p, st
        cdef shm_cnode* x
        cdef ch_wait_t cw
        cdef park_t pk
        cdef int res, look
        if not _ch_ok(self.rm, &self.b, X):
            return R_CORRUPT
        cw.b = &self.b
        cw.rm = self.rm
        x = ch_node(&self.b, X)
        pk.rm = self.rm
        pk.b = &self.b
        if rc == R_BUSY:
            st = ld32_acq(&x.state)
            if (st == C_ABANDONED and ld32_acq(&x.lock1) == lock1
                    and ld32_acq(&x.left_gen) == <uint32_t>ld64_rlx(&self.rm.part[me].generation)
                    and cas32(&x.state, C_ABANDONED, C_BUSY)):
                st32_rlx(&r.pred, ld32_acq(&x.pred))     # back in our old place
                st32_rlx(&r.qd, X)
                st32_rlx(&r.round, ld32_acq(&x.round))
                trace("clhc.rejoin", me, X, r.pred)
            elif st == C_BUSY or _clh_is_aside(st):
                return R_CORRUPT
            else:
                if st == C_RECLAIMING or st == C_ABANDONED:   # not yet handed back
                    pk.ready = _ch_not_reclaiming
                    pk.ctx = x
                    pk.word = &x.state
                    pk.parked = &x.parked
                    pk.dep = _ch_tend_abandoned
                    pk.arg = X
                    res = park(&pk, w)
                    if res != R_ACQ:
                        if res == R_WOULDBLOCK:
                            w.resume_rc = R_BUSY     # not queued yet: look at the node again
                        return res
                rc = self._ch_enqueue(me, X, shm_crash_armed)
                if rc != R_PENDING:
                    return rc
        pk.ready = _ch_ready
        pk.ctx = &cw
        pk.dep = _ch_dep
        while True:
            p = ld32_rlx(&r.pred)
            if not _ch_ok(self.rm, &self.b, p):
                return R_CORRUPT
            look = _ch_look(&self.b, p, &cw, shm_crash_armed)
            if look == LOOK_FREE:
                _ch_grant(&self.b, me, shm_crash_armed)
                return R_ACQ
            if look == LOOK_ABANDONED:
                _ch_reclaim(self.rm, &self.b, me, p)
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
                res = _ch_step_aside(self.rm, &self.b, me, w, shm_crash_armed)
                if res == R_ACQ:
                    _ch_grant(&self.b, me, shm_crash_armed)
                    return R_ACQ
                if res == R_PENDING:
                    continue                         # its pred was abandoned: hand it back
                return res                           # R_ASIDE: its place stays queued
            rc = _ch_abort_as(self.rm, &self.b, me, 0)
            if rc == R_TIMEOUT:
                return res                           # R_TIMEOUT or R_SIGNAL
            _ch_grant(&self.b, me, shm_crash_armed)
            return R_ACQ

    cdef int _aside_end(self, uint32_t me, int rc) noexcept nogil:
        """Back from aside (clh.pxi's): on the VIP turn or called back (rc R_CONT) take our
        place back if it is still queued (R_PENDING), or, passed over at its turn, adopt
        our pred's node and join anew (_fast); leaving, our place is left as at a timeout
        (R_ACQ if granted meanwhile: granted here)."""
        cdef shm_prec* r = &self.b.precs[me]
        cdef uint32_t X = ld32_rlx(&r.mine)
        cdef uint32_t v, st
        cdef shm_cnode* x
        cdef int rc2
        if not _ch_ok(self.rm, &self.b, X) or not _ch_ok(self.rm, &self.b, r.pred):
            return R_CORRUPT
        x = ch_node(&self.b, X)
        v = _clh_aside_st(r.round)
        while True:
            st = ld32_seq(&x.state)
            if st == v and ld32_acq(&x.round) == r.round:
                if not cas32(&x.state, v, C_BUSY):
                    continue                         # passed as we came back
                trace("clhc.aside.back", me, X, r.pred)
                crashpoint("clhc.aside.back")
                if rc == R_CONT:
                    wake_if_parked(&x.state, &x.parked)
                    return R_PENDING                 # in our old place
                shm_futex_wake(&x.state, 0x7fffffff)
                rc2 = _ch_abort_as(self.rm, &self.b, me, 0)
                if rc2 == R_TIMEOUT:
                    return rc
                _ch_grant(&self.b, me, shm_crash_armed)
                return R_ACQ
            if X != r.pred and (st == C_FREE or ld32_acq(&x.round) != r.round):
                # passed over at our turn: the node we waited on is ours, FREE
                trace("clhc.aside.adopt", me, X, r.pred)
                crashpoint("clhc.aside.adopt")
                st32_rel(&r.mine, r.pred)
                if rc != R_CONT:
                    return rc
                return self._fast(me, shm_crash_armed)
            return R_CORRUPT

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        cdef uint64_t h = ld64_acq(ch_head(&self.b))
        if not _ch_ok(self.rm, &self.b, pair_lo(h)):
            return R_CORRUPT
        if SHM_DEBUG_BUILT:                          # (a constant: nothing in a normal build)
            dassert(_ch_live(self.rm, &self.b, h), "clhc: the head names the holder's passage")
        return _ch_free(self.rm, &self.b, me, h, armed)

    cdef bint _is_locked(self) noexcept nogil:
        cdef uint32_t t = tail_last(ld64_acq(ch_tail(&self.b)))
        if not _ch_ok(self.rm, &self.b, t):
            return 1
        return ld32_acq(&ch_node(&self.b, t).state) != C_FREE

    def _raw(self):
        """The stripe's words and its table's pool, for tests and debugging: the tail, the
        head, every node of the pool (id, state, lock1, pred, parked, left_gen, round,
        guess) and the participants' table lines (mine, pred, round, qd, hpass)."""
        cdef uint32_t i, X, n
        cdef shm_cnode* x
        cdef shm_prec* r
        self._check()
        out = _Lock._raw(self)
        nodes, precs = [], []
        n = body_hwm(&self.b) + self.rm.tbl.size
        for i in range(n):
            X = _ch_pool(self.rm, &self.b, i)
            x = ch_node(&self.b, X)
            nodes.append((X, ld32_acq(&x.state), ld32_acq(&x.lock1), ld32_acq(&x.pred),
                          ld32_acq(&x.parked), ld32_acq(&x.left_gen), ld32_acq(&x.round),
                          ld32_acq(&x.guess)))
        for i in range(body_hwm(&self.b)):
            r = &self.b.precs[i]
            precs.append((ld32_acq(&r.mine), ld32_acq(&r.pred), ld32_acq(&r.round),
                          ld32_acq(&r.qd), ld64_acq(&r.hpass)))
        del out["nodes (state, next, pred, parked, value, round, guess)"]
        del out["precs (mine, pred, ticket, abandoned, abandoned_gen, round, omark)"]
        out["tail"] = ld64_acq(ch_tail(&self.b))
        out["head"] = ld64_acq(ch_head(&self.b))
        out["pool (id, state, lock1, pred, parked, left_gen, round, guess)"] = nodes
        out["lines (mine, pred, round, qd, hpass)"] = precs
        return out


_register_stripe(CLHStripe, _ch_recover, _ch_init)
