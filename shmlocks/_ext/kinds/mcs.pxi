# mcs.pxi -- MCS queue lock with abandonable nodes and recoverable participants
# (indices, not pointers: each process maps the region at its own address).
#
# Invariant: the queue runs from the holder's node to tail.last through `next` links; each
# waiter spins (then parks) on its own node's state and the release writes its successor's
# state once. Participant p's node is qnode[p]; node ids are index + 1, 0 = none (as every
# id in the segment: shm_layout.h), and only those of participants provisioned are in
# range (queue.pxd queue_node_ok: 1..part_hwm; a region that grows adds idle nodes).
#
#   word A   u64 tail    (queue.pxd: queue_tail, tail_last, tail_prev)
#                        last | prev << 32: the last node, and ITS predecessor. Taking the
#                        tail by CAS records who came before, so a node's predecessor is
#                        known the instant it joins: from the tail word while it is last,
#                        after that from its own `pred` (it publishes it, and the next
#                        joiner publishes it for it from the tail word it replaced).
#   qnode[p] state   IDLE 0 -> WAIT 1 -> GRANT 2 ; WAIT -> ABANDONED 3 (timeout, signal, death)
#                    ABANDONED -> WAIT (the thread that left comes back) | -> PASSING 4
#                    -> IDLE (a releaser passes the lock through it)
#            pred    predecessor (0: it was first: it holds the lock); UNKNOWN until published
#            next    successor, linked by the successor: only a hint. A successor that was
#                    slow to link may write it after the releaser found it by other means
#                    and the releaser's node began a new round, so a releaser trusts the
#                    hint only if that node names it as pred and still waits (_mcs_is_succ);
#                    it can always find its successor from the tail word or the pred fields
#            round   bumped at each enqueue, so a recorded pass names one round of a node
#            guess   the tail's last as its owner CASed the tail: its pred once joined, so
#                    a successor is found from the tail (queue.pxi) even when the owners
#                    of several joiners in a row died before publishing or helping
#            left_gen  generation of the participant (thread) that abandoned it: only that
#                    thread rejoins in place; a new thread inheriting the slot waits for IDLE
#
# Release vs. abandonment: the releaser CASes the successor WAIT -> GRANT; the waiter
# leaving CASes WAIT -> ABANDONED. Exactly one wins. A releaser that finds ABANDONED takes
# it (ABANDONED -> PASSING), finds its successor, frees it (IDLE) and moves on, recording
# (node, round) in its participant slot first so that a recoverer can finish the pass.
# Death: a parked waiter sleeps on the liveness token of the first live node ahead of it
# (_mcs_dep), and is woken by its death; a dead holder is released on its
# behalf (owner_died if it had returned from acquire), a dead waiter abandoned on its
# behalf, a dead releaser's pass finished. (Mellor-Crummey & Scott, TOCS 1991; timeouts
# after Scott & Scherer, PPoPP 2001.)

cdef int _mcs_not_waiting(void* c) noexcept nogil:
    """READY once granted (or abandoned under us); FAR while the predecessor waits too, or
    left its place (abandoned: a waiter that stepped aside, docs/design.md §7.0, has
    others ahead of it)."""
    cdef node_wait_t* x = <node_wait_t*>c        # x.n: the waiter's own node
    cdef uint32_t p, st
    if ld32_seq(&x.n.state) != M_WAIT:
        return Q_READY
    p = ld32_rlx(&x.n.pred)                          # a hint: bounds-checked, never trusted
    if queue_node_ok(x.b, p, 0):
        st = ld32_rlx(&x.b.qnodes[p - 1].state)
        if st == M_WAIT or st == M_ABANDONED:
            return Q_FAR
    return Q_NEAR


cdef int _mcs_not_passing(void* c) noexcept nogil:
    cdef uint32_t st = ld32_seq(&(<shm_qnode*>c).state)
    return st != M_PASSING and st != M_ABANDONED


cdef inline bint _mcs_is_succ(shm_body* b, uint32_t v, uint32_t q) noexcept nogil:
    """Is node v-1 the current successor of node q (it names q as pred and still waits)?"""
    cdef uint32_t st
    if not queue_node_ok(b, v, 0):
        return 0
    st = ld32_acq(&b.qnodes[v - 1].state)
    return (st == M_WAIT or st == M_ABANDONED) and ld32_acq(&b.qnodes[v - 1].pred) == q + 1


cdef enum:
    M_QUEUED = (1 << M_WAIT) | (1 << M_ABANDONED)    # states of a node still in the queue


cdef inline uint32_t _mcs_walk_succ(shm_body* b, uint32_t s) noexcept nogil:
    """The node (index + 1) that joined right after node s-1, from the tail back."""
    return queue_succ_of(queue_tail(b), b, 0, s, M_QUEUED)


cdef uint32_t _mcs_scan_succ(shm_body* b, uint32_t q) noexcept nogil:
    """One look for node q's successor (index + 1), 0 if none is visible: its link, the
    tail word (it is last and has not published its pred), its published pred, or the
    walk back from the tail."""
    cdef uint32_t v
    cdef uint64_t t
    v = ld32_acq(&b.qnodes[q].next)
    if _mcs_is_succ(b, v, q):
        return v
    t = ld64_seq(queue_tail(b))
    if tail_prev(t) == q + 1 and tail_last(t) != 0 and tail_last(t) != q + 1:
        return tail_last(t)
    v = queue_named_succ(b, 0, q + 1, M_QUEUED)
    if v != QUEUE_NONE:
        return v
    v = _mcs_walk_succ(b, q + 1)                     # it joined, and so did the next ones,
    return 0 if v == QUEUE_NONE else v               # none of them lived to publish


cdef uint32_t _mcs_find_succ(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Node q is in the queue and not last, so it has a successor: wait for it to become
    visible (a joiner between two instructions). Bounded: 0 after 5 s (corrupt). Inside a
    recovery (rec not NULL) also by the recoverer's deadline and signals
    (recover_wait_check): then 0 with rec.cut set, and the caller decides nothing more
    (docs/design.md §6.3)."""
    cdef uint32_t v
    cdef int i = 0
    cdef int64_t until = 0
    cdef int64_t nsig = 0
    while True:
        v = _mcs_scan_succ(b, q)
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


cdef bint _mcs_pred_unknown(shm_body* b, uint32_t x) noexcept nogil:
    return ld32_acq(&b.qnodes[x].pred) == M_UNKNOWN


cdef inline bint _mcs_settle_joiners(rmap_t* rm, shm_body* b, uint32_t q,
                                     recov_t* rec) noexcept nogil:
    """Let live joiners (tail taken, pred not yet published) finish those two steps. 0 if
    time ran out first: decide nothing then."""
    return participants_settle(rm, b, q, SHM_OP_TAKING, _mcs_pred_unknown, rec)


cdef int _mcs_pass(rmap_t* rm, shm_body* b, uint32_t s, uint32_t q,
                   recov_t* rec) noexcept nogil:
    """Hand the lock to node s-1, passing through abandoned nodes; q is the releaser (live,
    or dead and being recovered), in whose slot progress is recorded."""
    cdef shm_qnode* m
    cdef uint32_t nx, st, guard = 0
    cdef uint64_t t
    while True:
        if not queue_node_ok(b, s, 0):
            return R_CORRUPT
        m = &b.qnodes[s - 1]
        dassert(tail_last(ld64_acq(queue_tail(b))) <= body_hwm(b), "mcs: tail index in range")
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
        nx = ld32_acq(&m.next)                       # m is ours to pass through
        if not _mcs_is_succ(b, nx, s - 1):
            t = ld64_seq(queue_tail(b))
            if tail_last(t) == s:
                if cas64(queue_tail(b), t, 0):        # the abandoned node was last: now free
                    st32_seq(&m.state, M_IDLE)
                    wake_if_parked(&m.state, &m.parked)
                    return 0
                continue
            nx = _mcs_find_succ(rm, b, s - 1, rec)
            if nx == 0 and rec != NULL and rec.cut:
                return 0                             # cut short: the pass record stays,
                                                     # the next recoverer goes on ([M2])
        if not queue_node_ok(b, nx, 0):
            return R_CORRUPT
        st64_rel(&rm.part[q].op_value,
                 pass_encode(nx, ld32_acq(&b.qnodes[nx - 1].round)))
        crashpoint("mcs.release.passing")
        st32_seq(&m.state, M_IDLE)                   # its owner may reuse it now
        wake_if_parked(&m.state, &m.parked)
        s = nx
        guard += 1
        if guard > 4 * body_hwm(b) + 64:
            return R_CORRUPT


cdef int _mcs_release_as(rmap_t* rm, shm_body* b, uint32_t q, bint releasing_dead,
                         bint armed, recov_t* rec) noexcept nogil:
    """Release the lock held by node q (by q itself: rec NULL; or on behalf of dead q,
    in a recovery with context rec). For a dead q that was releasing, it may already have
    emptied the queue: then nothing is left."""
    cdef shm_qnode* n = &b.qnodes[q]
    cdef uint32_t succ
    cdef uint64_t t
    cdef int r
    st64_rel(&rm.part[q].op_value, 0)
    while True:
        succ = ld32_acq(&n.next)
        if _mcs_is_succ(b, succ, q):
            break
        t = ld64_seq(queue_tail(b))
        if tail_last(t) == q + 1:
            if cas64(queue_tail(b), t, 0):            # no one behind: free
                crashpoint_at(armed, "mcs.release.emptied")
                st32_rel(&n.state, M_IDLE)
                return 0
            continue
        if releasing_dead:
            if not _mcs_settle_joiners(rm, b, q, rec):
                return 0                             # out of time: decide nothing
            succ = _mcs_scan_succ(b, q)
            if succ == 0:                            # it had emptied the queue itself
                st32_rel(&n.state, M_IDLE)
                return 0
        else:
            succ = _mcs_find_succ(rm, b, q, rec)
            if succ == 0 and rec != NULL and rec.cut:
                return 0                             # cut short before any change
        break
    if not queue_node_ok(b, succ, 0):
        return R_CORRUPT
    st64_rel(&rm.part[q].op_value,
             pass_encode(succ, ld32_acq(&b.qnodes[succ - 1].round)))
    st32_rel(&n.state, M_IDLE)
    wake_if_parked(&n.state, &n.parked)
    crashpoint_at(armed, "mcs.release.idled")
    r = _mcs_pass(rm, b, succ, q, rec)
    if rec != NULL and rec.cut:
        return r                                     # cut short: the record is the redo's
    st64_rel(&rm.part[q].op_value, 0)                # the pass is over: no record is left
    return r


cdef void _mcs_finish_pass(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """A release of q's (by q, or on its behalf) died passing the lock on: op_value names
    the node it was at. Nodes it had already passed through and not yet freed are still
    PASSING (it was the only releaser): free them, then go on from where it was."""
    cdef pass_t v = pass_decode(ld64_acq(&rm.part[q].op_value))
    cdef uint32_t s = v.node
    cdef uint32_t x
    for x in range(body_hwm(b)):
        if x + 1 != s and ld32_acq(&b.qnodes[x].state) == M_PASSING:
            st32_seq(&b.qnodes[x].state, M_IDLE)
            wake_if_parked(&b.qnodes[x].state, &b.qnodes[x].parked)
    if queue_node_ok(b, s, 0) and ld32_acq(&b.qnodes[s - 1].round) == v.round:
        _mcs_pass(rm, b, s, q, rec)


cdef void _mcs_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Participant q is dead and ours to recover (repair mutex held)."""
    cdef shm_qnode* n = &b.qnodes[q]
    cdef uint32_t lock1 = b.index + 1
    cdef uint32_t op = participant_op(rm, q, lock1)
    cdef uint32_t st = ld32_seq(&n.state)
    cdef uint32_t pred
    cdef uint64_t t, v
    if op == SHM_OP_RELEASING:
        if st == M_GRANT:                            # [M1] it still held the lock:
            recover_verdict(rm, b, q, op)            # [V] its release decides recoverability
            _mcs_release_as(rm, b, q, 1, shm_crash_armed, rec)
            return
        holder_forget(rm, b, q)
        if st == M_IDLE:                             # [M2] (docs/design.md §7.2)
            _mcs_finish_pass(rm, b, q, rec)               # it died passing the lock on
        return
    if st == M_IDLE and ld64_acq(&rm.part[q].op_value) != 0:  # [M2]
        # A recoverer releasing the lock on q's behalf died passing it on (q's own op is
        # not RELEASING then: q died holding or waiting): finish that pass.
        _mcs_finish_pass(rm, b, q, rec)
        return
    if st != M_WAIT and st != M_GRANT:
        return                                       # not queued (an abandoned place is
                                                     # passed by releases; the slot's next
                                                     # owner waits for it)
    pred = ld32_acq(&n.pred)
    if st == M_WAIT and pred == M_UNKNOWN:  # [M3]
        t = ld64_seq(queue_tail(b))
        if tail_last(t) == q + 1:
            pred = tail_prev(t)
            cas32(&n.pred, M_UNKNOWN, pred)
        else:
            # Did it join? If so, whoever joined after it publishes its pred: let the live
            # joiners finish their two steps, then decide.
            if not _mcs_settle_joiners(rm, b, q, rec):
                return
            pred = ld32_acq(&n.pred)
            if pred == M_UNKNOWN and tail_last(ld64_seq(queue_tail(b))) != q + 1:
                if _mcs_walk_succ(b, q + 1) == QUEUE_NONE:
                    st32_rel(&n.state, M_IDLE)       # it never joined the queue
                    return
                pred = ld32_acq(&n.guess)            # it joined: its guess was right
                cas32(&n.pred, M_UNKNOWN, pred)
            if pred == M_UNKNOWN:
                pred = tail_prev(ld64_seq(queue_tail(b)))
    if st == M_GRANT or pred == 0:                   # [M4] it holds the lock
        recover_verdict(rm, b, q, op)                # [V] (op is not RELEASING here)
        crashpoint("mcs.recover.flagged")
        st32_rel(&n.state, M_GRANT)
        _mcs_release_as(rm, b, q, 0, shm_crash_armed, rec)
        return
    st64_rel(&n.left_gen, ld64_rlx(&rm.part[q].generation))
    if not cas32(&n.state, M_WAIT, M_ABANDONED):     # [M5] it waits: abandon its place for it
        _mcs_release_as(rm, b, q, 0, shm_crash_armed, rec)     # granted meanwhile: pass it on
    else:
        _mcs_left(n)


cdef int _mcs_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency: the first live node ahead of ours (walking back past abandoned
    nodes, whose threads left), watched through its owner's token and its state word, and
    the state words of the abandoned nodes in between: a node ahead leaving (WAIT ->
    ABANDONED) or coming back (ABANDONED -> WAIT) wakes us to look again (_mcs_left). A
    dead owner on the way is recovered here."""
    cdef shm_body* b = pk.b
    cdef rmap_t* rm = pk.rm
    cdef uint32_t p = queue_link(&b.qnodes[pk.arg])      # a hint
    cdef uint32_t st, guard = 0
    while queue_node_ok(b, p, 0) and guard <= body_hwm(b):
        st = ld32_seq(&b.qnodes[p - 1].state)            # before what it is read to mean
        if participant_dead(rm, p - 1):
            participant_try_recover(rm, p - 1, ws.rec)
            return DEP_CHANGED
        if not watch_word(ws, &b.qnodes[p - 1].state, st):
            return DEP_UNKNOWN
        if st == M_WAIT or st == M_GRANT:
            return watch_participant(rm, p - 1, ws)
        if st != M_ABANDONED and st != M_PASSING:
            return DEP_UNKNOWN                           # a stale link: look again later
        p = queue_link(&b.qnodes[p - 1])
        guard += 1
    return DEP_UNKNOWN


cdef class MCSLock(_Lock):
    """FIFO MCS queue lock: each waiter spins on its own cache line."""
    kind_name = "mcs"
    kind_code = SHM_KIND_MCS
    fifo = True
    recovery = "user"
    priority_inheritance = False

    cdef inline int _enqueue(self, uint32_t me, bint armed) noexcept nogil:
        cdef shm_qnode* n = &self.b.qnodes[me]
        cdef uint64_t old = 0, seen
        cdef uint32_t p
        st32_rlx(&n.next, 0)
        st32_rlx(&n.pred, M_UNKNOWN)
        st32_rlx(&n.round, n.round + 1)
        st32_rlx(&n.state, M_WAIT)
        while True:                                  # join: tail := (me, old last)
            st32_rel(&n.guess, tail_last(old))         # our pred, if this CAS wins
            seen = cmpxchg64(queue_tail(&self.b), old, tail_encode(me + 1, tail_last(old)))
            if seen == old:                          # (first guess: an empty queue)
                break
            old = seen
        crashpoint_at(armed, "mcs.acquire.joined")
        p = tail_last(old)
        if (p != 0 and not queue_node_ok(&self.b, p, 0)) or p == me + 1:
            return R_CORRUPT
        if (p != 0 and ld32_acq(&self.b.qnodes[p - 1].pred) == M_UNKNOWN
                and ld32_acq(&n.state) == M_WAIT):
            cas32(&self.b.qnodes[p - 1].pred, M_UNKNOWN, tail_prev(old))  # publish it for p
        st32_rel(&n.pred, p)                         # then our own
        crashpoint_at(armed, "mcs.acquire.pred")
        if p == 0:
            st32_rlx(&n.state, M_GRANT)
            return R_ACQ
        if ld32_acq(&n.state) == M_WAIT:             # (once granted, p's round may be over)
            st32_rel(&self.b.qnodes[p - 1].next, me + 1)  # the hint link
        return R_PENDING

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        if ld32_acq(&self.b.qnodes[me].state) != M_IDLE:
            return R_BUSY
        return self._enqueue(me, armed)

    cdef int _try(self, uint32_t me) noexcept nogil:
        cdef shm_qnode* n = &self.b.qnodes[me]
        if ld32_acq(&n.state) != M_IDLE:
            return R_BUSY
        # Armed like a joiner (WAIT, pred unknown), so that a death before or after the
        # CAS reads right to recovery: not in the tail word and pred unknown = never joined;
        # last in the tail word with prev 0 = it holds the lock.
        st32_rlx(&n.next, 0)
        st32_rlx(&n.pred, M_UNKNOWN)
        st32_rlx(&n.round, n.round + 1)
        st32_rlx(&n.guess, 0)
        st32_seq(&n.state, M_WAIT)
        crashpoint("mcs.try.armed")
        if cas64(queue_tail(&self.b), 0, me + 1):
            st32_rel(&n.pred, 0)
            st32_rlx(&n.state, M_GRANT)
            return R_ACQ
        st32_rel(&n.state, M_IDLE)
        return R_BUSY

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef shm_qnode* n = &self.b.qnodes[me]
        cdef node_wait_t ctx
        cdef park_t pk
        cdef uint32_t st
        cdef int res
        pk.word = &n.state                           # we park on our own node
        pk.parked = &n.parked
        pk.dep = _mcs_dep
        pk.rm = self.rm
        pk.b = &self.b
        pk.arg = me
        if rc == R_BUSY:
            st = ld32_acq(&n.state)
            if (st == M_ABANDONED and n.left_gen == ld64_rlx(&self.rm.part[me].generation)
                    and cas32(&n.state, M_ABANDONED, M_WAIT)):
                _mcs_left(n)                         # back in our old place in the queue
            elif st == M_WAIT or st == M_GRANT:
                return R_CORRUPT
            else:
                if st == M_PASSING or st == M_ABANDONED:   # a releaser has yet to pass it
                    pk.ready = _mcs_not_passing
                    pk.ctx = n
                    res = park(&pk, w)
                    if res != R_ACQ:
                        if res == R_WOULDBLOCK:
                            w.resume_rc = R_BUSY     # not queued yet: look at the node again
                        return res
                if ld32_acq(&n.state) != M_IDLE:
                    return R_CORRUPT
                rc = self._enqueue(me, shm_crash_armed)
                if rc != R_PENDING:
                    return rc
        ctx.n = n
        ctx.b = &self.b
        ctx.own = 0
        pk.ready = _mcs_not_waiting
        pk.ctx = &ctx
        w.aside_ok = 1                               # queued: may step aside (§7.0)
        res = park(&pk, w)
        w.aside_ok = 0
        if res == R_ACQ:
            return R_ACQ if ld32_acq(&n.state) == M_GRANT else R_CORRUPT
        if res == R_WOULDBLOCK:
            w.resume_rc = R_PENDING                  # queued (WAIT): parks on the node again
            return res
        st64_rel(&n.left_gen, ld64_rlx(&self.rm.part[me].generation))
        if cas32(&n.state, M_WAIT, M_ABANDONED):     # leave; a releaser will pass through
            _mcs_left(n)
            return res                               # R_TIMEOUT or R_SIGNAL
        return R_ACQ                                 # granted as we were leaving

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        cdef shm_qnode* n = &self.b.qnodes[me]
        cdef uint64_t t = tail_encode(me + 1, ld32_rlx(&n.pred))
        dassert(ld32_acq(&n.state) == M_GRANT, "mcs: the holder's node is GRANT")
        dassert(tail_last(ld64_acq(queue_tail(&self.b))) != 0, "mcs: a held lock's queue is not empty")
        if ld32_acq(&n.next) == 0 and ld64_seq(queue_tail(&self.b)) == t:
            # No successor linked and we are still last (the tail word is (us, our pred)):
            # one CAS empties the queue (the first step of _mcs_release_as, inline). A
            # plain load first: a CAS bound to fail would still steal the joiner's line.
            # op_value (a pass record) is 0 here: every release, and the recovery of a
            # participant, clears it when done.
            if cas64(queue_tail(&self.b), t, 0):
                crashpoint_at(armed, "mcs.release.emptied")
                st32_rel(&n.state, M_IDLE)
                return 0
        return _mcs_release_as(self.rm, &self.b, me, 0, armed, NULL)

    cdef bint _is_locked(self) noexcept nogil:
        return ld64_acq(queue_tail(&self.b)) != 0


_register_kind(MCSLock, NULL, _mcs_recover, 1)
