# barrier.pxi -- threading.Barrier in shared memory, broken by a party's death
# (docs/design.md §12).
#
# Invariant (under the guard, toolbox.pxi): the state machine is threading.Barrier's:
#   value  state: FILLING, DRAINING (released, the waiters leaving), RESETTING, BROKEN
#   count  threads inside wait(): exactly the participants whose record has `inside`
#          (arrival sets both in one journaled change, leaving clears both)
#   limit  parties;  cycle: bumped each time the barrier releases its waiters
# and every participant that ever waited on it is a member (rec.member = its holder id, so
# a later occupant of its slot is not), as is, from the moment it has the barrier, a
# process that made, opened, unpickled it or was forked with it in its multiprocessing
# arguments (enrolled: Barrier._enroll, _bar_after_fork), so a party is known before it
# first arrives. A waiter sleeps on seq (bumped by every change of
# state) and on the tokens of the other members (up to SHM_WAITV_MAX - 1, else in slices).
# The action runs in the last arriving thread with the guard let go; arrivals wait for it
# as they wait for a drain (count stays at parties until it ends).
# A member's death, seen by its recoverer (under the guard), breaks the barrier: it is a
# party that will not arrive again, so the others would wait for it forever:
#   [B1] inside, state FILLING: it died in the barrier: BROKEN, and it leaves (count - 1);
#   [B2] inside, DRAINING or RESETTING: it leaves, and the drain ends in BROKEN instead of
#        FILLING (TB_F_BREAK): the round it was released from stays passed for the others;
#   [B3] not inside, state FILLING (others waiting or not): BROKEN, at once for waiters,
#        and the next wait() gets BrokenBarrierError instead of a hang;
#   [B4] not inside, DRAINING or RESETTING: as [B2], the drain ends in BROKEN;
#   [B5] it died holding the guard: its change is undone (tb_undo), then [B1]-[B4].
#   [B6] (not a death) a thread inside whose wait ended (deadline, signal) while another
#        held the guard leaves without it (_bar_depart: rec.gone); the next guard holder
#        finishes (_bar_reap): a round still filling breaks, a released one counts it out.
# reset() brings it back (and clears TB_F_BREAK): a process replacing a dead one resets.
# A member that leaves alive stops being one (not a death): its thread ends (its token is
# given back, so its record names a free slot), or its process ends or closes the object
# (_bar_forget_mine clears its records, run at exit as the names' leaving is).
# An end that runs no code (os._exit(), the usual end of a plain os.fork child) cannot be
# told from a kill: it is a death unless the process closed the object first
# (docs/design.md §12 says why this is the rule).

import threading as _threading

cdef bint _bar_member(rmap_t* rm, shm_body* b, uint32_t x) noexcept nogil:
    """Is x a member now (a live or dead occupant of its slot that waited here)?"""
    cdef uint32_t m = ld32_acq(&shm_tb_rec(b, x).member)
    return m != 0 and m == participant_hid(rm, x) and participant_state(rm, x) != 0


cdef inline void _bar_set_state(shm_body* b, uint32_t st) noexcept nogil:
    tb_set(b, &shm_tb_word(b).value, st)


cdef void _bar_leave(shm_body* b, uint32_t x) noexcept nogil:
    """threading's _exit for participant x (guard held): leave, and end a drain or a reset
    if it was the last one in."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* r = shm_tb_rec(b, x)
    if not r.inside:
        return
    tb_set(b, &r.inside, 0)
    if w.count > 0:
        tb_set(b, &w.count, w.count - 1)
    if w.count == 0 and (w.value == TB_B_RESETTING or w.value == TB_B_DRAINING):
        if w.flags & TB_F_BREAK:                 # [B2] [B4] a party died meanwhile
            _bar_set_state(b, TB_B_BROKEN)
            tb_set(b, &w.flags, w.flags & ~(<uint32_t>TB_F_BREAK))
        else:
            _bar_set_state(b, TB_B_FILLING)
    tb_bump(b, 0)


cdef bint _bar_sane(rmap_t* rm, shm_body* b) noexcept nogil:
    """Guard held, departures reaped: is this a state a barrier can be in? `count` is
    exactly the records inside (the invariant above), each of a participant alive or
    dead (never a free slot: a recovery takes it out first), at most `parties`; a drain
    or a reset has someone inside (the last one out ends it). Bytes that say otherwise
    would keep an arrival waiting, without a timeout as threading's _enter waits, for a
    drain or an action that no thread runs (the segment fuzzer found a count of 21801)."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef uint32_t x
    cdef uint32_t n = 0
    for x in range(body_hwm(b)):
        if shm_tb_rec(b, x).inside:
            if participant_state(rm, x) == 0:
                return 0
            n += 1
    if w.count != n or w.count > w.limit:
        return 0
    return n != 0 or (w.value != TB_B_DRAINING and w.value != TB_B_RESETTING)


cdef void _bar_reap(shm_body* b) noexcept nogil:
    """Guard held: finish the leaving of the threads that left without the guard ([B6],
    _bar_depart): one that left a round still filling breaks it, one released just
    leaves. A claim (TB_GONE_HELD) seen here is stale (its releaser died mid-release:
    only the guard's holder claims), and is dropped."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* r
    cdef uint32_t x, g
    cdef bint any = 0
    if not tb_gone_any(b):
        return
    for x in range(body_hwm(b)):
        r = shm_tb_rec(b, x)
        g = ld32_acq(&r.gone)
        if g == TB_GONE_HELD:
            g = cmpxchg32(&r.gone, TB_GONE_HELD, 0)
            if g == TB_GONE_HELD:
                continue
        if g != TB_GONE_BREAK and g != TB_GONE_LEAVE:
            continue
        if (g == TB_GONE_BREAK and r.inside and w.value == TB_B_FILLING
                and w.cycle == ld32_acq(&r.gone_cycle)):
            _bar_set_state(b, TB_B_BROKEN)      # threading: its timeout breaks the barrier
        _bar_leave(b, x)
        tb_set(b, &r.gone, 0)
        any = 1
    if any:
        shm_futex_wake(&w.seq, 0x7fffffff)      # (under the guard: this rare path only)


cdef bint _bar_hold(shm_body* b, uint32_t me) noexcept nogil:
    """Guard held, about to release the round: claim the record of every other thread
    inside (gone 0 -> TB_GONE_HELD), so one leaving without the guard meanwhile knows it
    was released. 0 if one had already left breaking it: the claims are given back and
    _bar_reap breaks the round instead."""
    cdef uint32_t x, v
    for x in range(body_hwm(b)):
        if x == me or not shm_tb_rec(b, x).inside:
            continue
        v = cmpxchg32(&shm_tb_rec(b, x).gone, 0, TB_GONE_HELD)
        if v != 0 and v != TB_GONE_HELD:
            _bar_unhold(b)
            fadd32(&shm_tb_word(b).gone, 1)
            _bar_reap(b)
            return 0
    return 1


cdef void _bar_unhold(shm_body* b) noexcept nogil:
    """After the release: give the claims back; a thread that left meanwhile (it turned
    its claim into TB_GONE_LEAVE) is made to leave here."""
    cdef uint32_t x
    cdef shm_tbrec* r
    for x in range(body_hwm(b)):
        r = shm_tb_rec(b, x)
        if ld32_acq(&r.gone) == TB_GONE_HELD:
            if cmpxchg32(&r.gone, TB_GONE_HELD, 0) == TB_GONE_LEAVE:
                _bar_leave(b, x)
                tb_set(b, &r.gone, 0)


cdef int _bar_depart(shm_body* b, uint32_t me, uint32_t cyc, bint sig) noexcept nogil:
    """[B6] A thread inside the barrier whose wait ended (its deadline, or a signal
    handler raised: `sig`) and that could not have the guard by then leaves without it:
    its record says how, and the next guard holder finishes (_bar_reap). Released already
    (the cycle moved, or a releaser claimed its record): BAR_PASSED; else it breaks the
    round: BAR_BROKEN. R_SIGNAL if `sig` (the handler's exception)."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* r = shm_tb_rec(b, me)
    cdef uint32_t v
    cdef int res = BAR_BROKEN
    st32_seq(&r.gone_cycle, cyc)
    v = cmpxchg32(&r.gone, 0, TB_GONE_BREAK)
    if v == 0:
        if ld32_seq(&w.cycle) != cyc:            # released before the mark: passed
            cmpxchg32(&r.gone, TB_GONE_BREAK, TB_GONE_LEAVE)
            res = BAR_PASSED
    elif v == TB_GONE_HELD:                      # its releaser is releasing it: passed
        if cmpxchg32(&r.gone, TB_GONE_HELD, TB_GONE_LEAVE) != TB_GONE_HELD:
            cmpxchg32(&r.gone, 0, TB_GONE_LEAVE)     # (the claim was given back meanwhile)
        res = BAR_PASSED
    fadd32(&w.gone, 1)
    fadd32(&w.seq, 1)                            # the waiters look: one that has the guard
    shm_futex_wake(&w.seq, 0x7fffffff)           # finishes this leaving (_bar_reap)
    return R_SIGNAL if sig else res


cdef int _bar_sleep(rmap_t* rm, shm_body* b, uint32_t me, uint32_t s,
                    int64_t deadline, int64_t* slept) noexcept nogil:
    """One sleep on seq (value s) and the other members' tokens: R_CONT, R_TIMEOUT,
    R_SIGNAL."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef tb_watch_t t
    cdef uint32_t x
    cdef int r
    tb_watch_init(&t, &w.seq, s, deadline)
    for x in range(body_hwm(b)):
        if x != me and _bar_member(rm, b, x):
            if tb_watch(rm, &t, x) == DEP_CHANGED:
                return R_CONT                   # recovered ([B1]-[B4]): look again
    st32_rlx(&shm_tb_rec(b, me).waiting, 1)
    r = tb_asleep(rm, &t, &w.parked, deadline, slept)
    st32_rlx(&shm_tb_rec(b, me).waiting, 0)
    return r


cdef inline void _bar_unlock(shm_body* b, bint* joined) noexcept nogil:
    """Let go of the guard in _bar_wait; if this thread became a member meanwhile (its
    change bumped seq), wake the waiters, whatever it does next, so they look again and
    watch its token too: its death, even in the action it runs as the last arrival of
    its first round, then breaks the barrier for them at once ([B1] [B3])."""
    tb_unlock(b)
    if joined[0]:
        tb_wake(b, 0x7fffffff)
        joined[0] = 0


cdef enum:
    BAR_PASSED = 1      # released: the index is in *index
    BAR_BROKEN = 2      # BrokenBarrierError
    BAR_ACTION = 3      # the last arrival: run the action, then _bar_release
    BAR_ERR = -3
    BAR_STATE = -4      # its words are not a state a barrier can be in (_bar_sane)


cdef int _bar_wait(rmap_t* rm, shm_body* b, uint32_t me, uint32_t hid, int64_t deadline,
                   bint has_action, uint32_t* index, int64_t* slept) noexcept nogil:
    """threading.Barrier.wait up to the action. BAR_PASSED (index set; the thread has left),
    BAR_ACTION (the last to arrive: inside, the state still FILLING; the caller runs the
    action then _bar_release), BAR_BROKEN (left), R_SIGNAL (left), BAR_ERR, BAR_STATE."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* mine = shm_tb_rec(b, me)
    cdef uint32_t s, cyc
    cdef int r, g
    cdef bint joined = 0
    r = BAR_ERR
    while True:                                   # _enter: wait for a drain or reset to end
        g = tb_guard(rm, b, deadline, 1)          # (nothing of ours in the state yet)
        if g != R_ACQ:
            if g == R_TIMEOUT:
                r = BAR_BROKEN                    # threading's timeout result; unchanged
            elif g == R_SIGNAL:
                r = R_SIGNAL
            break
        _bar_reap(b)
        if not _bar_sane(rm, b):
            tb_unlock(b)
            r = BAR_STATE
            break
        if mine.member != hid:
            # a new party: the waiters look again at whom they watch (its token too)
            tb_set(b, &mine.member, hid)
            tb_bump(b, 0)
            joined = 1
        if w.value == TB_B_DRAINING or w.value == TB_B_RESETTING:
            s = w.seq
            _bar_unlock(b, &joined)
            r = _bar_sleep(rm, b, me, s, -1, slept)      # threading's _enter waits without timeout
            if r == R_SIGNAL:
                break
            continue
        if w.value == TB_B_BROKEN:
            _bar_unlock(b, &joined)
            r = BAR_BROKEN
            break
        if w.count >= w.limit:                    # the action runs: wait for it as a drain
            s = w.seq
            _bar_unlock(b, &joined)
            r = _bar_sleep(rm, b, me, s, -1, slept)
            if r == R_SIGNAL:
                break
            continue
        index[0] = w.count
        tb_set(b, &w.count, w.count + 1)
        tb_set(b, &mine.inside, 1)
        if w.count == w.limit:
            if has_action:
                _bar_unlock(b, &joined)           # (its death in the action is seen)
                r = BAR_ACTION
                break
            r = BAR_BROKEN
            if _bar_hold(b, me):                  # (0: one left breaking it meanwhile)
                _bar_set_state(b, TB_B_DRAINING)  # _release
                fadd32(&w.cycle, 1)
                _bar_unhold(b)
                r = BAR_PASSED
            _bar_leave(b, me)
            tb_bump(b, 0)
            tb_unlock(b)
            tb_wake(b, 0x7fffffff)
            break
        cyc = w.cycle
        r = R_CONT
        while True:                               # _wait: until released, reset or broken
            if w.value != TB_B_FILLING or w.cycle != cyc:
                break
            s = w.seq
            _bar_unlock(b, &joined)
            r = _bar_sleep(rm, b, me, s, deadline, slept)
            # inside the barrier: leaving needs the guard (as threading's wait takes its
            # lock back to leave), by the wait's deadline; past it (or a handler raised),
            # it leaves without it ([B6])
            # (leaving by a handler's exception: at once, the guard's grace only)
            g = tb_guard(rm, b, shm_now_ns() if r == R_SIGNAL else deadline, 1)
            if g != R_ACQ:
                if g == R_CORRUPT:
                    r = BAR_ERR
                else:
                    r = _bar_depart(b, me, cyc, r == R_SIGNAL or g == R_SIGNAL)
                return r                          # (the guard not held)
            _bar_reap(b)
            if r == R_CONT:
                continue
            if w.value == TB_B_FILLING and w.cycle == cyc:
                if r == R_TIMEOUT:                # threading: a timeout breaks the barrier
                    _bar_set_state(b, TB_B_BROKEN)
                # (R_SIGNAL: the wait ends with the handler's exception; the barrier is
                # broken too, as threading's is when its wait is interrupted)
                else:
                    _bar_set_state(b, TB_B_BROKEN)
            break
        if r == BAR_ERR:
            break
        if w.value == TB_B_BROKEN or w.value == TB_B_RESETTING:
            _bar_leave(b, me)
            tb_unlock(b)
            tb_wake(b, 0x7fffffff)
            r = R_SIGNAL if r == R_SIGNAL else BAR_BROKEN
            break
        _bar_leave(b, me)
        tb_unlock(b)
        tb_wake(b, 0x7fffffff)
        r = R_SIGNAL if r == R_SIGNAL else BAR_PASSED
        break
    return r


cdef int _bar_release(rmap_t* rm, shm_body* b, uint32_t me, bint ok,
                      int64_t deadline) noexcept nogil:
    """After the action (ok: it returned): release the waiters, or break the barrier (it
    raised). BAR_PASSED, BAR_BROKEN (reset or aborted while it ran), R_SIGNAL, BAR_ERR.
    Inside, it must leave: the guard by the wait's deadline, else it leaves without it,
    breaking the round ([B6])."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef int r = BAR_PASSED
    cdef int g = tb_guard(rm, b, deadline, 1)
    if g != R_ACQ:
        if g == R_CORRUPT:
            return BAR_ERR
        return _bar_depart(b, me, ld32_seq(&w.cycle), g == R_SIGNAL)
    _bar_reap(b)
    if not ok:
        _bar_set_state(b, TB_B_BROKEN)
        r = BAR_BROKEN
    elif w.value == TB_B_FILLING and _bar_hold(b, me):
        _bar_set_state(b, TB_B_DRAINING)
        fadd32(&w.cycle, 1)
        _bar_unhold(b)
    else:
        r = BAR_BROKEN
    _bar_leave(b, me)
    tb_bump(b, 0)
    tb_unlock(b)
    tb_wake(b, 0x7fffffff)
    return r


cdef void _bar_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Dead participant q ([B1]-[B4]; repair mutex held)."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* r = shm_tb_rec(b, q)
    cdef uint32_t hid = participant_hid(rm, q)
    st32_rlx(&r.waiting, 0)
    if ld32_acq(&r.member) == 0 and ld32_acq(&r.inside) == 0:
        return
    if tb_recover_lock(rm, b, rec) != 0:
        return                                   # cut short: left pending
    _bar_reap(b)
    if r.inside or r.member == hid:
        if w.value == TB_B_FILLING:
            _bar_set_state(b, TB_B_BROKEN)       # [B1] [B3]
        elif w.value == TB_B_DRAINING or w.value == TB_B_RESETTING:
            tb_set(b, &w.flags, w.flags | TB_F_BREAK)   # [B2] [B4]: broken once drained
        _bar_leave(b, q)                         # (if inside)
    if r.member != 0:
        tb_set(b, &r.member, 0)
    tb_bump(b, 0)
    tb_unlock(b)
    tb_wake(b, 0x7fffffff)


def _bar_setup(parties, timeout):
    if isinstance(parties, bool) or not isinstance(parties, int):
        raise TypeError(f"parties must be an int, not {type(parties).__name__}")
    if parties < 1:
        raise ValueError("parties must be >= 1")
    if parties > 0x7fffffff:
        raise OverflowError("parties is too large")
    cdef uint64_t tns = 0
    if timeout is not None:
        t = float(timeout)
        if t != t:
            raise ValueError("timeout must not be NaN")
        tns = <uint64_t>(max(t, 0.0) * 1e9) + 1 if t < _FOREVER_S else 0

    def setup(Region region, uint32_t i):
        cdef shm_body b = shm_body_at(region.rm.base, region.rm.locks_off + i * region.rm.stride,
                                      region.rm.P, i)
        cdef shm_tbword* w = shm_tb_word(&b)
        w.limit = parties
        w.value = TB_B_FILLING
        w.timeout_ns = tns
    return setup


cdef int64_t BAR_GUARD_NS = 2000000000    # _enroll's and _forget_mine's wait for the guard


cdef int _bar_guard(Barrier bar) except -1:
    """The guard for a Python-level call (Ctrl-C, no deadline: _TbObject._guard), and the
    leaving of those that left without it finished first."""
    bar._guard()
    _bar_reap(&bar.b)
    return 0


cdef class Barrier(_TbObject):
    """Barrier(parties, action=None, timeout=None) -> a shared-memory ``threading.Barrier``.

    ``wait(timeout=None)`` returns this thread's arrival index (0 .. parties - 1) once
    ``parties`` threads, of any processes, wait; ``reset()``, ``abort()``, ``parties``,
    ``n_waiting``, ``broken`` are threading's. A party (a thread that has waited on it,
    or a process that made, opened, unpickled it or was started by multiprocessing with
    it in its arguments) that dies while others wait, or before it arrives once others
    wait, breaks it: they get ``threading.BrokenBarrierError`` at once. A party leaves
    alive by ``close()`` or an end that runs the exit handlers; ``os._exit()`` runs none
    (a plain ``os.fork()`` child: close it first), so that end is a death too. ``action`` runs in the last thread
    to arrive; it is this object's (each process gives its own; a pickled Barrier carries
    a picklable one). ``timeout`` (the default for wait) is the barrier's, shared.
    ``create(parties, action=None, timeout=None, name=None, *, max_participants=None,
    mode=0o600, persist=False)``, ``open(name)``, ``close()``, ``unlink()`` as for locks."""
    kind_name = "barrier"
    kind_code = SHM_KIND_BARRIER

    def __init__(self, parties, action=None, timeout=None, name=None, *,
                 max_participants=None, mode=0o600, persist=False):
        self._init_standalone(name, max_participants, mode, persist,
                              _bar_setup(parties, timeout))
        self._action = action
        self._enroll()

    @classmethod
    def create(cls, parties, action=None, timeout=None, name=None, *, max_participants=None,
               mode=0o600, persist=False):
        """A new barrier for ``parties`` threads in a segment of its own."""
        return cls(parties, action, timeout, name, max_participants=max_participants,
                   mode=mode, persist=persist)

    @classmethod
    def open_or_create(cls, name, parties, action=None, timeout=None, *,
                       max_participants=None, mode=0o600, persist=False):
        """Open barrier ``name``, or create it (for ``parties``, with these arguments) if
        there is none: atomic, so that of any number of processes racing on one name,
        all end up with the same barrier, this process a party of it (as by create or
        open). ValueError if it exists for another number of parties; its default
        ``timeout`` is the existing one's (shared); ``action`` is this object's either
        way. LockKindError if the segment holds something else."""
        _check_create_args(1, max_participants, mode)
        _bar_setup(parties, timeout)              # (the checks of the arguments)

        def same(o):
            if o.parties != parties:
                raise ValueError(f"barrier {o.name!r} exists for {o.parties} parties, "
                                 f"not {parties}")
            o._action = action
        return cls._open_or_create(name, lambda n: cls(parties, action, timeout, n,
                                                       max_participants=max_participants,
                                                       mode=mode, persist=persist), same)

    @property
    def action(self):
        return self._action

    def wait(self, timeout=None):
        """wait(timeout=None) -> int

        Wait until ``parties`` threads wait; returns this one's arrival index. ``timeout``
        (None: the barrier's default) ends the wait by breaking the barrier.
        BrokenBarrierError if it is broken, reset, aborted, or a party died."""
        cdef int64_t deadline
        cdef reg_t* r
        cdef uint32_t index = 0
        cdef uint32_t me, hid
        cdef int rc
        cdef uint64_t tns
        cdef int64_t slept = 0
        cdef bint has_action = self._action is not None
        self._check()
        if timeout is None:
            tns = ld64_acq(&shm_tb_word(&self.b).timeout_ns)
            deadline = -1 if tns == 0 else shm_now_ns() + <int64_t>(tns - 1)
        else:
            deadline = tb_deadline(timeout)
        r = self._me()
        me = r.slot
        hid = r.hid
        _bar_track(self)
        with nogil:
            rc = _bar_wait(self.rm, &self.b, me, hid, deadline, has_action, &index, &slept)
        if rc == BAR_ACTION:
            try:
                self._action()
            except BaseException:
                with nogil:
                    _bar_release(self.rm, &self.b, me, 0, deadline)
                raise
            with nogil:
                rc = _bar_release(self.rm, &self.b, me, 1, deadline)
        with nogil:
            tb_count(&self.b, rc == BAR_PASSED, rc == BAR_BROKEN and 0 <= deadline <= shm_now_ns(),
                     slept)
        if rc == BAR_PASSED:
            return index
        if rc == BAR_BROKEN:
            raise _threading.BrokenBarrierError
        if rc == R_SIGNAL:
            return _raise_pending()
        if rc == BAR_STATE:
            raise CorruptRegionError(f"barrier {self._name!r}: its count and records are "
                                     "not a state a barrier can be in (scribbled)")
        raise self._guard_error()

    def _enroll(self):
        """This process has the barrier (it made, opened, unpickled or was forked with
        it): from now on it is one of its parties, known before it arrives, so its death
        breaks the barrier as a member's does ([B3]). Its thread's slot is the member.
        The guard by BAR_GUARD_NS (Ctrl-C in the main thread): held past that (a stopped
        holder, a scribbled word), the open goes on unenrolled (its first wait enrols)."""
        cdef reg_t* r
        cdef shm_tbrec* rec
        cdef int rc
        r = self._me()
        rec = shm_tb_rec(&self.b, r.slot)
        _bar_track(self)
        if ld32_acq(&rec.member) == r.hid:
            return
        with nogil:
            rc = tb_guard(self.rm, &self.b, shm_now_ns() + BAR_GUARD_NS, 1)
        if rc == R_SIGNAL:
            _raise_pending()
        if rc != R_ACQ:
            return
        _bar_reap(&self.b)
        if rec.member != r.hid:
            tb_set(&self.b, &rec.member, r.hid)
            tb_bump(&self.b, 0)                  # the waiters look again: watch it too
        tb_unlock(&self.b)
        tb_wake(&self.b, 0x7fffffff)

    def _opened(self):
        self._enroll()

    def _forget_mine(self):
        """This process's threads stop being parties (its end, or close()): alive, they
        break nothing by leaving. The guard by BAR_GUARD_NS (Ctrl-C in the main thread):
        held past that, they stay parties, and this process's end breaks the barrier as a
        death does, rather than hang."""
        cdef uint32_t x
        cdef uint32_t pid = getpid()
        cdef shm_tbrec* r
        cdef int rc
        if self._closed or self.rm.closed:
            return
        # a thread that is no participant here (one that never waited) pins the mapping
        # while it waits for the guard, whatever another thread closes (docs/design.md §2)
        pinned = reg_lookup(self.rm) == NULL
        if pinned:
            rmap_pin(self.rm)
        try:
            with nogil:
                rc = tb_guard(self.rm, &self.b, shm_now_ns() + BAR_GUARD_NS, 1)
        finally:
            if pinned:
                rmap_unpin(self.rm)
        if rc == R_SIGNAL:
            _raise_pending()
        if rc != R_ACQ:
            return
        _bar_reap(&self.b)
        for x in range(body_hwm(&self.b)):
            r = shm_tb_rec(&self.b, x)
            if (r.member != 0 and not r.inside and ld32_acq(&self.rm.part[x].pid) == pid
                    and participant_state(self.rm, x) == 1):
                tb_set(&self.b, &r.member, 0)
        tb_unlock(&self.b)

    def close(self):
        """Detach; this process's threads stop being parties of the barrier."""
        if not self._closed:
            try:
                self._forget_mine()
            except Exception:
                pass
        _TbObject.close(self)

    def reset(self):
        """Back to the initial state; threads waiting now get BrokenBarrierError."""
        cdef shm_tbword* w
        self._check()
        _bar_guard(self)
        w = shm_tb_word(&self.b)
        if w.flags & TB_F_BREAK:
            tb_set(&self.b, &w.flags, w.flags & ~(<uint32_t>TB_F_BREAK))
        if w.count > 0:
            if w.value == TB_B_FILLING or w.value == TB_B_BROKEN:
                _bar_set_state(&self.b, TB_B_RESETTING)
        else:
            _bar_set_state(&self.b, TB_B_FILLING)
        tb_bump(&self.b, 0)
        tb_unlock(&self.b)
        tb_wake(&self.b, 0x7fffffff)

    def abort(self):
        """Break the barrier: waiting and future wait() calls get BrokenBarrierError
        until reset()."""
        self._check()
        _bar_guard(self)
        _bar_set_state(&self.b, TB_B_BROKEN)
        tb_bump(&self.b, 0)
        tb_unlock(&self.b)
        tb_wake(&self.b, 0x7fffffff)

    @property
    def parties(self):
        self._check()
        return ld32_acq(&shm_tb_word(&self.b).limit)

    @property
    def n_waiting(self):
        """Threads waiting in the barrier now (a snapshot)."""
        cdef shm_tbword* w
        self._check()
        w = shm_tb_word(&self.b)
        if ld32_acq(&w.value) == TB_B_FILLING:
            return ld32_acq(&w.count)
        return 0

    @property
    def broken(self):
        self._check()
        return ld32_acq(&shm_tb_word(&self.b).value) == TB_B_BROKEN

    def __reduce__(self):
        self._check()
        if self._standalone:
            return (_bar_open, (self._region.name, None, self._action))
        return (_bar_open, (self._region.name, self._name, self._action))

    def _state(self):
        w = shm_tb_word(&self.b)
        names = {TB_B_FILLING: "filling", TB_B_DRAINING: "draining",
                 TB_B_RESETTING: "resetting", TB_B_BROKEN: "broken"}
        st = names.get(w.value, f"state {w.value}")
        return f"{st}, waiters={self.n_waiting}/{w.limit}"

    def __repr__(self):
        if self._closed or self.rm.closed:
            return f"<shmlocks.Barrier at {id(self):#x}: closed>"
        if self.broken:
            return f"<shmlocks.Barrier at {id(self):#x}: broken>"
        return (f"<shmlocks.Barrier at {id(self):#x}: "
                f"waiters={self.n_waiting}/{self.parties}>")


# Barriers this process has (made, opened, got pickled or by fork, waited on): at its end
# (atexit, or multiprocessing's finalizers in a child that ends with os._exit) its threads
# stop being parties, before its views leave.
_bar_objects = __import__("weakref").WeakSet()
_bar_hooked_pid = 0


class _BarAnchor:
    pass


_BAR_ANCHOR = _BarAnchor()


def _bar_forget_all():
    for bar in list(_bar_objects):
        try:
            bar._forget_mine()
        except Exception:
            pass


def _bar_track(bar):
    _bar_objects.add(bar)
    if _bar_hooked_pid != getpid():
        _bar_hook()


def _bar_hook():
    global _bar_hooked_pid
    import multiprocessing.util as util
    _bar_hooked_pid = getpid()
    _atexit.register(_bar_forget_all)
    util.Finalize(None, _bar_forget_all, exitpriority=-50)   # (before the names: -100)
    # a child's finalizers are emptied at its start (after a spawn child unpickled its
    # barriers, too): register there again, and enrol what the child was given
    util.register_after_fork(_BAR_ANCHOR, _bar_after_fork)


def _bar_given(bar, proc):
    """Is `bar` in the arguments of multiprocessing process `proc` (a few levels deep:
    Process(args=...), Pool(initargs=...))? A fork child gets them without pickling."""
    todo = [(getattr(proc, "_args", ()), 0), (getattr(proc, "_kwargs", {}), 0)]
    while todo:
        x, depth = todo.pop()
        if x is bar:
            return True
        if depth >= 4:
            continue
        if isinstance(x, dict):
            todo.extend((v, depth + 1) for v in x.values())
        elif isinstance(x, (tuple, list, set, frozenset)):
            todo.extend((v, depth + 1) for v in x)
    return False


def _bar_after_fork(anchor):
    """In a multiprocessing child, as it starts: the barriers it was given are its own
    (enrolled), and its end withdraws it from each."""
    global _bar_hooked_pid
    import multiprocessing
    _bar_hooked_pid = 0
    proc = multiprocessing.current_process()
    for bar in list(_bar_objects):
        try:
            if _bar_given(bar, proc):
                bar._enroll()
        except Exception:
            pass
    if len(_bar_objects):
        _bar_hook()


def _bar_open(region_name, name, action):
    if name is None:
        b = Barrier.open(region_name)
    else:
        b = Region.open(region_name).open_object(name)
    b._action = action
    return b


def _bar_create_in(Region region, name, parties, action, timeout):
    b = Barrier._new_in(region, name, _bar_setup(parties, timeout))
    b._action = action
    b._enroll()
    return b


_register_object(Barrier, tb_init, _bar_recover, 1)
g_tb_api["create_barrier"] = _bar_create_in
