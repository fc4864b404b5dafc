# mcsc.pxi -- the compact MCS stripe of a lock table (docs/design.md §15): MCS in its K42
# form, in which the holder needs no queue node, so that a stripe is one 128-byte line and
# a participant needs one wait node per table, not one per stripe. The lock-body mcs kind
# (mcs.pxi) is unchanged; this one shares its node states and abandonment rule.
#
# Invariant: stripe s's queue runs from its head to tail.last through the nodes' pred
# links, and its head names the holder: the tail (H(h), 0) while nobody waits, else the
# first waiter's pred H(h), where H(h) = MC_HELD | (h + 1) is the holder mark of
# participant h. The one exception is a grant: the granted node g (GRANT) heads the queue,
# its pred still the old holder's mark, until g's owner moves its successor link into the
# stripe (the K42 step, _mc_k42: its successor's pred becomes H(g), or the tail (g, ..)
# becomes (H(g), 0)) and frees its node (IDLE). So a holder has no node: it may wait for
# another stripe of the table while it holds this one (LockTable.hold), and a participant
# waits for one lock at a time, so one node each, the table entry's node line of the
# participant, is enough. A node is queued on one stripe at a time: node.lock1 says which.
#
#   stripe line   a shm_lockctl: the holder's statistics in its first 64-byte half, and
#                 the view's word A (wa) aimed at its repair slot (byte 64, as a compact
#                 futex stripe's), which a stripe never uses (its table's mutex serves it):
#     wa.u64[0] tail   0 free | (H(h), 0): held by h, nobody waits | (last, prev): the
#                      last waiter's node and its pred (a node, or H(h): it is first)
#     wa.u32[2] first  the first waiter's node (K42's lock->next): a hint, verified
#   node p (the table entry's qnode[p], participant p's) as mcs.pxi's word table says,
#     lock1            the stripe (lock number + 1) it is queued on, written before it joins
#     pred             a node, or a holder mark (it is first); UNKNOWN until published, and
#                      published by CAS from UNKNOWN only (by its owner, or a redirect, which
#                      may come first); nobody else writes another's pred, since a node
#                      freed by its K42 step may be queued elsewhere the next instant
#     guess            as mcs.pxi (queue.pxi), and reset to 0 each time the node is armed
#
# Grant vs abandonment, as mcs.pxi: the holder CASes the first waiter WAIT -> GRANT, a
# waiter leaving CASes WAIT -> ABANDONED: one wins. A holder passing through an abandoned
# node x (ABANDONED -> PASSING) redirects x's successor y to itself (_mc_redirect: y.pred
# := H(h), the tail (y, x) := (y, H(h)), first := y) before it frees x, and records
# (node, round) in its op_value before each step, so that a recoverer finishes the pass.
#
# Holding, as a recoverer decides it (_mc_holds): h holds stripe s iff the tail is
# (H(h), 0), or the chain walked back from the tail ends at H(h) and its first node is not
# GRANT, or h's node is GRANT on s (granted, its K42 step not over). Death table: docs/
# design.md §15 ([K1]-[K5]).
#
# One node per table: a node left ABANDONED on stripe i stays queued there until a release
# passes it. If its owner then waits for stripe j (i != j, or its thread is not the one
# that left): j free, it takes it at once (the CAS 0 -> (H(me), 0), as the fast path);
# j held, it cannot queue until its node is passed, and polls j meanwhile (a park slice at
# a time, woken early when its node is passed): that wait has no FIFO place (_mc_poll_*).
# Only the thread that left rejoins its node in place (left_gen), as mcs.pxi.
# Stepping aside (docs/design.md §7.0): the stripe's line holds its aside words past its
# words (shm_layout.h SHM_STRIPE_ASIDE_OFF: 4 seats, participants.pxd aside_words;
# the marks are the participant's table line's aside_since, read per stripe through
# op_lock). A waiter that steps aside leaves its node ABANDONED on this stripe, as at a
# timeout, and its acquire of this very stripe goes on (lockbase _wait_aside): back on its
# VIP turn it takes the stripe free, or rejoins its node in place (same thread: left_gen,
# lock1 this stripe), or polls while a release passes it. The node never moves to another
# stripe meanwhile, so one node per table still holds.

cdef inline bint mc_node_on(shm_body* b, uint32_t v, uint32_t lock1) noexcept nogil:
    """Is v (an id read from shared memory) a node in range, queued on stripe lock1?"""
    return queue_node_ok(b, v, 0) and ld32_acq(&b.qnodes[v - 1].lock1) == lock1


cdef inline bint _mc_is_succ(shm_body* b, uint32_t lock1, uint32_t v,
                             uint32_t target) noexcept nogil:
    """Is node v a waiter on stripe lock1 whose published pred is `target`?"""
    cdef uint32_t st
    if not queue_node_ok(b, v, 0):
        return 0
    st = ld32_acq(&b.qnodes[v - 1].state)
    return ((st == M_WAIT or st == M_ABANDONED)
            and ld32_acq(&b.qnodes[v - 1].lock1) == lock1
            and ld32_acq(&b.qnodes[v - 1].pred) == target)


cdef uint32_t _mc_named_succ(shm_body* b, uint32_t lock1, uint32_t target) noexcept nogil:
    """A waiter on stripe lock1 that names `target` as its published pred, else
    QUEUE_NONE: one pass over the table's nodes in use."""
    cdef uint32_t x
    for x in range(body_hwm(b)):
        if x + 1 != target and _mc_is_succ(b, lock1, x + 1, target):
            return x + 1
    return QUEUE_NONE


cdef uint32_t _mc_walk(shm_body* b, uint32_t lock1, uint32_t target,
                       uint32_t* end) noexcept nogil:
    """Walk back from the tail through the links (pred, else guess: queue.pxd queue_link)
    of the nodes queued on stripe lock1 (every id bounds-checked). target != 0: the node
    whose link is `target`, or QUEUE_NONE. target 0: to the chain's end; *end gets the
    link it ends at (a holder mark, or anything that is not a node queued here) and the
    result is the node before it, the first (QUEUE_NONE: nobody waits). A walk that goes
    round (a node left and joined again meanwhile) starts over, a few times."""
    cdef uint32_t id, link, st, steps, attempt, last
    for attempt in range(4):
        id = tail_last(ld64_seq(mc_tail(b)))
        last = QUEUE_NONE
        steps = 0
        while steps <= body_hwm(b) + 1:
            if target != 0 and id == target:
                return QUEUE_NONE                    # reached target: it is last
            if not mc_node_on(b, id, lock1):
                if target != 0:
                    return QUEUE_NONE
                end[0] = id
                return last
            st = ld32_acq(&b.qnodes[id - 1].state)
            if st == M_IDLE:
                if target != 0:
                    return QUEUE_NONE
                break                                # a node just left: look again
            link = queue_link(&b.qnodes[id - 1])
            if target != 0 and link == target:
                return id
            last = id
            id = link
            steps += 1
        sched_yield()
    if end != NULL:
        end[0] = 0
    return QUEUE_NONE


cdef uint32_t _mc_scan_succ(shm_body* b, uint32_t lock1, uint32_t target) noexcept nogil:
    """One look for the waiter right after `target` (a node, or a holder mark: the first
    waiter) on stripe lock1, 0 if none is visible: the hint link (the node's next, or the
    stripe's first), the tail word (it is last and has not published its pred), a
    published pred, or the walk back from the tail."""
    cdef uint32_t v
    cdef uint64_t t
    if mc_is_mark(target):
        v = ld32_acq(mc_first(b))
    else:
        v = ld32_acq(&b.qnodes[target - 1].next)
    if _mc_is_succ(b, lock1, v, target):
        return v
    t = ld64_seq(mc_tail(b))
    if (tail_prev(t) == target and tail_last(t) != target
            and mc_node_on(b, tail_last(t), lock1)):
        return tail_last(t)
    v = _mc_named_succ(b, lock1, target)
    if v != QUEUE_NONE:
        return v
    v = _mc_walk(b, lock1, target, NULL)
    return 0 if v == QUEUE_NONE else v


cdef uint32_t _mc_find_succ(rmap_t* rm, shm_body* b, uint32_t lock1, uint32_t target,
                            recov_t* rec) noexcept nogil:
    """`target` heads or is in the queue and is not last, so it has a successor: wait for
    it to become visible (a joiner between two instructions). Bounded as mcs.pxi's
    _mcs_find_succ: 0 after 5 s (corrupt), or inside a recovery (rec) by its deadline
    and signals, with rec.cut set."""
    cdef uint32_t v
    cdef int i = 0
    cdef int64_t until = 0
    cdef int64_t nsig = 0
    while True:
        v = _mc_scan_succ(b, lock1, target)
        if v != 0:
            return v
        i += 1
        if i < 64:
            cpu_relax()
            continue
        if until == 0:
            until = shm_now_ns() + 5 * <int64_t>1000000000
            if rec != NULL:
                until = recover_until(rec, 5 * <int64_t>1000000000)
                nsig = shm_now_ns() + RECOVER_CHECK_NS
        if rec != NULL:
            if recover_wait_check(rm, rec, until, &nsig):
                return 0
        elif shm_now_ns() > until:
            return 0
        sched_yield()


cdef void _mc_redirect(shm_body* b, uint32_t x, uint32_t old, uint32_t mark,
                       bint armed) noexcept nogil:
    """Node x, the successor of node `old` (leaving the queue: granted, or passed through),
    becomes the first waiter: its pred, the tail's prev if it is last, and the stripe's
    first link name the holder mark. Each step a CAS or a store of the same value:
    redone harmlessly."""
    cdef shm_qnode* m = &b.qnodes[x - 1]
    cdef uint32_t p
    cdef uint64_t t
    while True:
        p = ld32_acq(&m.pred)
        if p == mark or (p != QUEUE_UNKNOWN and p != old):
            break
        if cas32(&m.pred, p, mark):
            break
    crashpoint_at(armed, "mcsc.redirect.pred")
    t = ld64_seq(mc_tail(b))
    if t == tail_encode(x, old):
        cas64(mc_tail(b), t, tail_encode(x, mark))   # (a joiner behind x: it names x)
    st32_rel(mc_first(b), x)


cdef int _mc_k42(rmap_t* rm, shm_body* b, uint32_t q, bint armed,
                 recov_t* rec) noexcept nogil:
    """Node q+1 was granted stripe b (GRANT): move its successor link into the stripe and
    free the node (the K42 step). By its owner (rec NULL), or for dead q by its recoverer
    (a redo: the step may be half done)."""
    cdef shm_qnode* n = &b.qnodes[q]
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t mark = mc_mark(q)
    cdef uint32_t x
    cdef uint64_t t
    while True:
        t = ld64_seq(mc_tail(b))
        if t == tail_encode(mark, 0):
            break                                    # done already (a redo)
        if tail_last(t) == q + 1:
            if cas64(mc_tail(b), t, tail_encode(mark, 0)):
                break                                # nobody behind: the tail names us
            continue
        if rec != NULL and _mc_scan_succ(b, lock1, q + 1) == 0 \
                and _mc_scan_succ(b, lock1, mark) != 0:
            break                                    # redirected already (a redo)
        x = _mc_find_succ(rm, b, lock1, q + 1, rec)
        if x == 0:
            return 0 if rec != NULL and rec.cut else R_CORRUPT
        _mc_redirect(b, x, q + 1, mark, armed)
        break
    crashpoint_at(armed, "mcsc.grant.moved")
    st32_rel(&n.state, M_IDLE)                       # free: it may wait elsewhere now
    wake_if_parked(&n.state, &n.parked)
    return 0


cdef int _mc_pass(rmap_t* rm, shm_body* b, uint32_t s, uint32_t q, bint armed,
                  recov_t* rec) noexcept nogil:
    """Holder q hands stripe b to its first waiter s, passing through abandoned nodes; q
    is live, or dead and being recovered; progress is recorded in q's op_value."""
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t mark = mc_mark(q)
    cdef shm_qnode* m
    cdef uint32_t nx, st, guard = 0
    cdef uint64_t t
    while True:
        if not mc_node_on(b, s, lock1):
            return R_CORRUPT
        m = &b.qnodes[s - 1]
        st64_rel(&rm.part[q].op_value, pass_encode(s, ld32_acq(&m.round)))
        st = ld32_seq(&m.state)
        if st == M_GRANT:
            return 0                                 # already passed (a redo)
        if st == M_WAIT:
            if cas32(&m.state, M_WAIT, M_GRANT):
                wake_if_parked(&m.state, &m.parked)
                return 0
            continue
        if st == M_ABANDONED:
            if not cas32(&m.state, M_ABANDONED, M_PASSING):
                continue                             # its thread rejoined: grant it
        elif st != M_PASSING:
            return R_CORRUPT
        t = ld64_seq(mc_tail(b))                     # m is ours to pass through
        if tail_last(t) == s:
            if cas64(mc_tail(b), t, 0):              # it was last: the stripe is free
                crashpoint_at(armed, "mcsc.pass.emptied")
                st32_seq(&m.state, M_IDLE)
                wake_if_parked(&m.state, &m.parked)
                return 0
            continue
        nx = _mc_find_succ(rm, b, lock1, s, rec)
        if nx == 0:
            return 0 if rec != NULL and rec.cut else R_CORRUPT
        _mc_redirect(b, nx, s, mark, armed)
        crashpoint_at(armed, "mcsc.release.passing")
        st32_seq(&m.state, M_IDLE)                   # out of the queue: its owner's again
        wake_if_parked(&m.state, &m.parked)
        s = nx
        guard += 1
        if guard > 4 * body_hwm(b) + 64:
            return R_CORRUPT


cdef int _mc_release_as(rmap_t* rm, shm_body* b, uint32_t q, bint armed,
                        recov_t* rec) noexcept nogil:
    """Release stripe b, held by participant q (by q: rec NULL; or for dead q by its
    recoverer, which found that q holds it): free it, or hand it to the first waiter."""
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t mark = mc_mark(q)
    cdef uint32_t s
    cdef uint64_t t
    cdef int r
    while True:
        t = ld64_seq(mc_tail(b))
        if t == tail_encode(mark, 0):
            if cas64(mc_tail(b), t, 0):
                crashpoint_at(armed, "mcsc.release.emptied")
                return 0
            continue
        s = _mc_find_succ(rm, b, lock1, mark, rec)
        if s == 0:
            return 0 if rec != NULL and rec.cut else R_CORRUPT
        break
    r = _mc_pass(rm, b, s, q, armed, rec)
    if rec != NULL and rec.cut:
        return r                                     # cut short: the record is the redo's
    st64_rel(&rm.part[q].op_value, 0)                # the pass is over
    return r


cdef bint _mc_holds(shm_body* b, uint32_t q) noexcept nogil:
    """Does participant q hold stripe b as its words say (the tail, or the head of its
    chain; a node granted and not yet through its K42 step is not asked here)? Asked of a
    dead q by its recoverer: nobody else changes the head of a dead holder's queue."""
    cdef uint32_t mark = mc_mark(q)
    cdef uint32_t end = 0, first
    cdef uint64_t t = ld64_seq(mc_tail(b))
    if t == tail_encode(mark, 0):
        return 1
    if t == 0 or mc_is_mark(tail_last(t)):
        return 0
    first = _mc_walk(b, b.index + 1, 0, &end)
    return (end == mark and first != QUEUE_NONE
            and ld32_acq(&b.qnodes[first - 1].state) != M_GRANT)


cdef bint _mc_in_chain(shm_body* b, uint32_t lock1, uint32_t s) noexcept nogil:
    """Is node s still in stripe lock1's queue: last in the tail, or the link (published
    pred, else guess) of a waiter? (Not the tail's prev: a redirect changes the pred
    before the tail.)"""
    cdef uint64_t t = ld64_seq(mc_tail(b))
    if tail_last(t) == s:
        return 1
    return _mc_named_succ(b, lock1, s) != QUEUE_NONE or \
        _mc_walk(b, lock1, s, NULL) != QUEUE_NONE


cdef void _mc_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Participant q is dead and ours to recover (the table's repair mutex held): its
    part in stripe b (the death table: docs/design.md §15)."""
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t op = participant_op(rm, q, lock1)
    cdef shm_qnode* n = &b.qnodes[q]
    cdef shm_qnode* m
    cdef pass_t v = pass_decode(ld64_acq(&rm.part[q].op_value))
    cdef uint32_t st, pred, x
    cdef uint64_t t
    # [K1] a pass it made (or a recoverer made for it) on this stripe: a node it had taken
    # to pass through (PASSING, of the recorded round) and already taken out of the queue
    # (its successor redirected to the holder: the tail's prev fixed first if it was not
    # yet) is freed; one still in it heads the queue, and the release below passes it
    if mc_node_on(b, v.node, lock1):
        m = &b.qnodes[v.node - 1]
        if ld32_acq(&m.state) == M_PASSING and ld32_acq(&m.round) == v.round:
            t = ld64_seq(mc_tail(b))
            x = tail_last(t)
            if (tail_prev(t) == v.node and mc_node_on(b, x, lock1)
                    and ld32_acq(&b.qnodes[x - 1].pred) == mc_mark(q)):
                cas64(mc_tail(b), t, tail_encode(x, mc_mark(q)))
            if not _mc_in_chain(b, lock1, v.node):
                st32_seq(&m.state, M_IDLE)
                wake_if_parked(&m.state, &m.parked)
    st = ld32_seq(&n.state) if ld32_acq(&n.lock1) == lock1 else M_IDLE
    if st == M_GRANT:                                # [K2] granted, its K42 step not over
        recover_verdict(rm, b, q, op)                # [V] (it never returned: nothing)
        crashpoint("mcsc.recover.flagged")
        if _mc_k42(rm, b, q, shm_crash_armed, rec) != 0 or (rec != NULL and rec.cut):
            return
        _mc_release_as(rm, b, q, shm_crash_armed, rec)
        return
    if _mc_holds(b, q):                              # [K3] it holds: [V], release for it
        recover_verdict(rm, b, q, op)
        crashpoint("mcsc.recover.flagged")
        _mc_release_as(rm, b, q, shm_crash_armed, rec)
        return
    holder_forget(rm, b, q)                          # (a CAS: only if it names q)
    if st != M_WAIT:
        return                                       # not queued here, or abandoned:
                                                     # a release passes it
    pred = ld32_acq(&n.pred)                         # [K4] joined, pred not published?
    if pred == QUEUE_UNKNOWN:
        t = ld64_seq(mc_tail(b))
        if tail_last(t) == q + 1:
            cas32(&n.pred, QUEUE_UNKNOWN, tail_prev(t))
        elif _mc_walk(b, lock1, q + 1, NULL) == QUEUE_NONE:
            # neither last nor anyone's pred or guess: it never joined (its CAS failed,
            # or was never made)
            if cas32(&n.state, M_WAIT, M_IDLE):
                wake_if_parked(&n.state, &n.parked)
            return
        else:
            cas32(&n.pred, QUEUE_UNKNOWN, ld32_acq(&n.guess))   # it joined: its guess
    st64_rel(&n.left_gen, ld64_rlx(&rm.part[q].generation))
    if cas32(&n.state, M_WAIT, M_ABANDONED):         # [K5] it waits: abandon its place
        _mcs_left(n)
        return
    if ld32_acq(&n.state) == M_GRANT:                # granted meanwhile: [K2]
        recover_verdict(rm, b, q, op)
        if _mc_k42(rm, b, q, shm_crash_armed, rec) != 0 or (rec != NULL and rec.cut):
            return
        _mc_release_as(rm, b, q, shm_crash_armed, rec)


cdef int _mc_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency: the first live participant ahead of our node (walking back
    past abandoned nodes), watched through its token and the states of the nodes on the
    way, as mcs.pxi's _mcs_dep; the walk ends at a node that waits or was granted, or at
    the holder mark: then the holder itself is watched. A dead one is recovered here."""
    cdef shm_body* b = pk.b
    cdef rmap_t* rm = pk.rm
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t p = queue_link(&b.qnodes[pk.arg])      # a hint
    cdef uint32_t st, h, guard = 0
    while guard <= body_hwm(b):
        if mc_is_mark(p):
            h = (p & ~(<uint32_t>MC_HELD)) - 1
            if h >= body_hwm(b):
                return DEP_UNKNOWN
            if participant_dead(rm, h):
                participant_try_recover(rm, h, ws.rec)
                return DEP_CHANGED
            return watch_participant(rm, h, ws)
        if not mc_node_on(b, p, lock1):
            return DEP_UNKNOWN                           # a stale link: look again later
        st = ld32_seq(&b.qnodes[p - 1].state)            # before what it is read to mean
        if participant_dead(rm, p - 1):
            participant_try_recover(rm, p - 1, ws.rec)
            return DEP_CHANGED
        if not watch_word(ws, &b.qnodes[p - 1].state, st):
            return DEP_UNKNOWN
        if st == M_WAIT or st == M_GRANT:
            return watch_participant(rm, p - 1, ws)
        if st != M_ABANDONED and st != M_PASSING:
            return DEP_UNKNOWN
        p = queue_link(&b.qnodes[p - 1])
        guard += 1
    return DEP_UNKNOWN


cdef struct mc_poll_t:
    shm_qnode* n          # our node, queued elsewhere (or abandoned here by another thread)
    uint64_t* tail        # the stripe we want


cdef int _mc_poll_ready(void* c) noexcept nogil:
    """READY once our node is free (we can queue) or the stripe is (we can take it)."""
    cdef mc_poll_t* x = <mc_poll_t*>c
    if ld32_acq(&x.n.state) == M_IDLE or ld64_acq(x.tail) == 0:
        return Q_READY
    return Q_FAR


cdef int _mc_poll_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """The stripe's release wakes nobody polling it: sleep a slice at a time (the pass of
    our node wakes us sooner: its passer wakes its parked count). Before each sleep, look
    whether whoever our node waits for is dead, and recover it: the passer of our node
    (PASSING: the participant whose pass record names it), or the holder of the stripe it
    was left on (ABANDONED), which nobody else may be watching."""
    cdef rmap_t* rm = pk.rm
    cdef shm_qnode* n = &pk.b.qnodes[pk.arg]
    cdef uint32_t lock1 = ld32_acq(&n.lock1)
    cdef uint32_t st = ld32_acq(&n.state)
    cdef uint32_t x, end = 0, first
    cdef shm_body sb
    if st == M_PASSING:
        for x in range(body_hwm(pk.b)):
            if (pass_decode(ld64_acq(&rm.part[x].op_value)).node == pk.arg + 1
                    and participant_dead(rm, x)):
                participant_try_recover(rm, x, ws.rec)
                return DEP_CHANGED
    elif st == M_ABANDONED and lock_at(rm, lock1, &sb) == LOCK_STRIPE:
        first = _mc_walk(&sb, lock1, 0, &end)
        if first != QUEUE_NONE and ld32_acq(&sb.qnodes[first - 1].state) == M_GRANT:
            x = first - 1
        elif mc_is_mark(end):
            x = (end & ~(<uint32_t>MC_HELD)) - 1
        else:
            return DEP_UNKNOWN
        if x < body_hwm(pk.b) and participant_dead(rm, x):
            participant_try_recover(rm, x, ws.rec)
            return DEP_CHANGED
    return DEP_UNKNOWN


cdef class MCSStripe(MCSLock):
    """A stripe of an mcs LockTable: one 128-byte line (kinds/mcsc.pxi), FIFO."""

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        return R_ACQ if cas64(mc_tail(&self.b), 0, tail_encode(mc_mark(me), 0)) else R_BUSY

    cdef int _try(self, uint32_t me) noexcept nogil:
        return R_ACQ if cas64(mc_tail(&self.b), 0, tail_encode(mc_mark(me), 0)) else R_BUSY

    cdef int _mc_join(self, uint32_t me, bint armed) noexcept nogil:
        """Queue our (idle) node on this stripe, or take the stripe if it is free: R_ACQ
        or R_PENDING."""
        cdef shm_qnode* n = &self.b.qnodes[me]
        cdef uint64_t* tail = mc_tail(&self.b)
        cdef uint32_t lock1 = self.b.index + 1
        cdef uint64_t old, seen
        cdef uint32_t p
        cdef bint armed_node = 0
        old = ld64_seq(tail)
        while True:
            if old == 0:
                if armed_node:
                    st32_seq(&n.state, M_IDLE)       # (not joined: a death reads right)
                    armed_node = 0
                seen = cmpxchg64(tail, 0, tail_encode(mc_mark(me), 0))
                if seen == 0:
                    return R_ACQ
                old = seen
                continue
            if not armed_node:
                st32_rlx(&n.next, 0)
                st32_rlx(&n.pred, QUEUE_UNKNOWN)
                st32_rlx(&n.guess, 0)
                st32_rlx(&n.round, n.round + 1)
                st32_rlx(&n.lock1, lock1)
                st32_seq(&n.state, M_WAIT)
                armed_node = 1
            st32_rel(&n.guess, tail_last(old))       # our pred, if this CAS wins
            seen = cmpxchg64(tail, old, tail_encode(me + 1, tail_last(old)))
            if seen == old:
                break
            old = seen
        crashpoint_at(armed, "mcsc.acquire.joined")
        p = tail_last(old)
        if p == me + 1 or not (mc_is_mark(p) or queue_node_ok(&self.b, p, 0)):
            return R_CORRUPT
        # (No help publishing p's pred, as mcs.pxi gives: p's node may be granted, freed
        # by its K42 step and armed for another stripe before the help lands. The walk
        # from the tail finds a node whose owner died before publishing by its guess.)
        cas32(&n.pred, QUEUE_UNKNOWN, p)             # ours, unless redirected already
        crashpoint_at(armed, "mcsc.acquire.pred")
        if ld32_acq(&n.state) == M_WAIT:
            if mc_is_mark(p):
                st32_rel(mc_first(&self.b), me + 1)  # the hint links
            else:
                st32_rel(&self.b.qnodes[p - 1].next, me + 1)
        return R_PENDING

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef shm_qnode* n = &self.b.qnodes[me]
        cdef uint32_t lock1 = self.b.index + 1
        cdef node_wait_t ctx
        cdef mc_poll_t pc
        cdef park_t pk
        cdef uint32_t st
        cdef int res
        pk.word = &n.state                           # we park on our own node
        pk.parked = &n.parked
        pk.rm = self.rm
        pk.b = &self.b
        pk.arg = me
        if rc == R_BUSY and w.deadline == 0:         # leave at once (lockbase _withdraw):
            if cas64(mc_tail(&self.b), 0, tail_encode(mc_mark(me), 0)):
                return R_ACQ                         # nothing to leave, no node to abandon
            return R_TIMEOUT
        while rc == R_BUSY:
            st = ld32_acq(&n.state)
            if st == M_IDLE:
                rc = self._mc_join(me, shm_crash_armed)
                if rc != R_PENDING:
                    return rc                        # R_ACQ (taken free), R_CORRUPT
                break
            if (st == M_ABANDONED and ld32_acq(&n.lock1) == lock1
                    and n.left_gen == ld64_rlx(&self.rm.part[me].generation)
                    and cas32(&n.state, M_ABANDONED, M_WAIT)):
                _mcs_left(n)                         # back in our old place in the queue
                rc = R_PENDING
                break
            if st == M_WAIT or st == M_GRANT:
                return R_CORRUPT                     # (we wait for one lock at a time)
            # ABANDONED or PASSING: left behind on another stripe (or here by another
            # thread of ours) and not passed yet: poll this stripe until it is free or
            # our node is
            pc.n = n
            pc.tail = mc_tail(&self.b)
            pk.ready = _mc_poll_ready
            pk.ctx = &pc
            pk.dep = _mc_poll_dep
            res = park(&pk, w)
            if res != R_ACQ:
                if res == R_WOULDBLOCK:
                    w.resume_rc = R_BUSY
                return res
            if cas64(mc_tail(&self.b), 0, tail_encode(mc_mark(me), 0)):
                return R_ACQ
        ctx.n = n
        ctx.b = &self.b
        ctx.own = 0
        pk.ready = _mcs_not_waiting
        pk.ctx = &ctx
        pk.dep = _mc_dep
        w.aside_ok = 1                               # queued: may step aside (§7.0)
        res = park(&pk, w)
        w.aside_ok = 0
        if res == R_ACQ:
            if ld32_acq(&n.state) != M_GRANT:
                return R_CORRUPT
            return R_ACQ if _mc_k42(self.rm, &self.b, me, shm_crash_armed, NULL) == 0 \
                else R_CORRUPT
        if res == R_WOULDBLOCK:
            w.resume_rc = R_PENDING                  # queued (WAIT): parks on the node again
            return res
        st64_rel(&n.left_gen, ld64_rlx(&self.rm.part[me].generation))
        if cas32(&n.state, M_WAIT, M_ABANDONED):     # leave; a release will pass through
            _mcs_left(n)
            return res                               # R_TIMEOUT, R_SIGNAL or R_ASIDE
        return R_ACQ if _mc_k42(self.rm, &self.b, me, shm_crash_armed, NULL) == 0 \
            else R_CORRUPT                           # granted as we were leaving

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        cdef uint64_t t = tail_encode(mc_mark(me), 0)
        # nobody waits: one CAS frees it (a plain load first: a CAS bound to fail would
        # still take a joiner's line)
        if ld64_seq(mc_tail(&self.b)) == t and cas64(mc_tail(&self.b), t, 0):
            crashpoint_at(armed, "mcsc.release.emptied")
            return 0
        return _mc_release_as(self.rm, &self.b, me, armed, NULL)


_register_stripe(MCSStripe, _mc_recover)
