# rwlock.pxi -- RWLock: a phase-fair reader-writer lock in shared memory whose dead readers
# give their share back and whose dead writer is reported to the next writer through
# owner_died (docs/design.md §13; its views in sys/shm_rwlock.h).
#
# Words: word A's `w` is the writer phase, RW_PRESENT | phase << 13 | writer slot + 1,
# changed by CAS only (writers announcing and leaving, a dead writer's recoverer); each
# participant's record (its own prec line) holds its reader indicator `ind` (its read
# holds, and RW_BLOCKED with a phase tag while it waits for a writer) and its writer state
# `wstate`, written only by that participant (or its recoverer, once it is dead).
#
#   read     ind = 1 (SC store to its own line), then load w (SC): no writer present -> in.
#            A nested read of a thread that holds one adds 1 and is in (the writer waits
#            for the holds present at its arrival: this is one of them). Else it found the
#            writer of phase n: it tags ind (RW_BLOCKED | n) so that writer stops waiting
#            for it, and sleeps on w until the phase is no longer n; then it is in (tag
#            cleared), even if another writer has announced phase n + 1 meanwhile: that
#            writer counted it (a tag other than its own) and waits for it. A reader waits
#            for one writer at most.
#   write    CAS w from free to PRESENT | phase + 1 | me (waiting on w while another
#            writer is present), then drain: for each other participant, wait while its
#            ind has holds and is not tagged with this phase; then the holder record.
#            Readers that arrive after the announcement tag themselves and wait, so a
#            writer waits for the readers present at its arrival only (those holding, and
#            those that waited for the previous writer and are entitled to go first).
#   release  read: ind - 1 (SC), and wake a writer sleeping on it (wparked); write: clear
#            the holder record, store w free (same phase, no slot), wake every sleeper.
# Dekker pairs: a reader's SC store of ind then SC load of w, against a writer's CAS of w
# then SC load of each ind: at least one of the two sees the other. Writers among
# themselves are not FIFO (the free w goes to whichever CAS wins, as the futex kind's
# word does); phase-fairness is between readers and writers.
#
# Deaths (the recovery driver runs _rw_recover for dead participant q, its token held,
# the repair mutex held; every store idempotent, so a recoverer killed midway is redone):
#   [R1] q has read holds, or waits as a reader: ind = 0, and the writer sleeping on it
#        is woken (it watches q's token too: the kernel wakes it at the death).
#   [R2] w names q, wstate HOLDING: OWNER_DIED, then the holder record cleared and w set
#        free; the next writer gets owner_died and must mark_consistent(), and every
#        sleeper (they watch the writer's token) is woken.
#   [R3] w names q, wstate DRAINING or NONE (announced, or released its hold but not yet
#        w): it never returned holding, or its section is over: w is set free, no flag.
#   [R4] w names q, wstate RELEASING: as its release would, NOTRECOVERABLE if OWNER_DIED
#        is set and HANDON is not; then as [R3].
# Readers are admitted while OWNER_DIED is set (the dead writer's data may be half
# written: `owner_died` says so to them too); after a release without mark_consistent()
# (NOTRECOVERABLE) every acquire raises LockNotRecoverableError.


cdef object _RW_NEG1 = -1                  # acquire's default timeout (small ints are one object)


cdef inline uint32_t _rw_phase(uint32_t w) noexcept nogil:
    return (w >> RW_SLOT_BITS) & RW_PHASE_MASK


cdef inline uint32_t _rw_free(uint32_t w) noexcept nogil:
    """w with its writer gone: the same phase, nobody present."""
    return w & (RW_PHASE_MASK << RW_SLOT_BITS)


cdef inline bint _rw_counts(uint32_t v, uint32_t tag) noexcept nogil:
    """Does the writer whose phase tag is `tag` wait for indicator v?"""
    if (v & RW_COUNT_MASK) == 0:
        return 0
    return not ((v & RW_BLOCKED) and ((v >> RW_TAG_SHIFT) & RW_TAG_MASK) == tag)


cdef bint _rw_same_thread(rmap_t* rm, uint32_t me, uint32_t s) noexcept nogil:
    """Is live participant s the calling thread itself, through another object of this
    lock (opened again, or unpickled: another slot)?"""
    cdef shm_participant* a = &rm.part[me]
    cdef shm_participant* p = &rm.part[s]
    return (s != me and ld32_acq(&p.pid) == ld32_rlx(&a.pid)
            and ld32_acq(&p.tid) == ld32_rlx(&a.tid)
            and ld64_acq(&p.pidns) == ld64_rlx(&a.pidns)
            and participant_state(rm, s) == 1)


cdef inline void _rw_wake_ind(shm_rwrec* rec) noexcept nogil:
    if ld32_seq(&rec.wparked) != 0:
        shm_futex_wake(&rec.ind, 0x7fffffff)


cdef inline void _rw_wake_w(shm_rwword* W) noexcept nogil:
    if ld32_seq(&W.parked) != 0:
        shm_futex_wake(&W.w, 0x7fffffff)


cdef bint _rw_spin(uint32_t* word, uint32_t val) noexcept nogil:
    """Poll `word` while it holds `val`, for SPIN_NS at most (wait.pxi's first spin
    budget, about one cross-core hand-off): a writer's section or a reader's is often
    over before a sleep and its wake-up would be. 1 if it changed."""
    cdef int64_t end = 0
    cdef uint32_t n = 0
    while ld32_acq(word) == val:
        cpu_relax()
        n += 1
        if (n & 63) == 0:
            if end == 0:
                end = shm_now_ns() + SPIN_NS
            elif shm_now_ns() >= end:
                return 0
    return 1


# ---- the wait record (the wait-for graph, docs/design.md §9) ----

cdef void _rw_arm(rmap_t* rm, shm_body* b, uint32_t me, wait_t* wt) noexcept nogil:
    """Before a wait's first sleep: publish that participant `me` waits for this RWLock
    (op_lock, and since when: dl_arm), so the wait-for graph reads who it waits for from
    the lock's words (a reader: the writer of its tag's phase; a writer: the writer
    present, then every reader it drains), and schedule the wait's deadlock look. The
    caller set only wt.deadline, wt.dl_hit = 0 and wt.t0 = 0 (the uncontended acquire
    pays for nothing more): the rest is set here, and t0 is the wait's start (_rw_unarm
    reads it as "armed")."""
    cdef int64_t now
    if wt.t0 != 0:
        return
    now = shm_now_ns()
    wait_init(wt, wt.deadline)
    wt.rm = rm                                   # hidden while handlers run (wait.pxi)
    wt.t0 = now
    dl_arm(wt, rm, me, now)
    shm_op_set(&rm.part[me].op_lock, b.index + 1, SHM_OP_WAITING)


cdef inline void _rw_unarm(rmap_t* rm, uint32_t me, wait_t* wt) noexcept nogil:
    if wt.t0 != 0:
        dl_end(wt)                               # its wait links cleared
        shm_op_set(&rm.part[me].op_lock, 0, 0)


# ---- read ----

cdef int _rw_read_wait(rmap_t* rm, shm_body* b, uint32_t me, uint32_t w,
                       wait_t* wt) noexcept nogil:
    """The reader found writer phase w present (its ind is 1): wait for that writer, by
    wt's deadline (its wait record published from its first sleep: _rw_arm).
    R_ACQ (in: ind 1), or R_TIMEOUT (wt.dl_hit: a deadlock's victim), R_SIGNAL,
    R_RW_DEADLOCK, R_CORRUPT (ind 0). The caller ends the wait record (_rw_unarm)."""
    cdef int64_t deadline = wt.deadline
    cdef shm_rwword* W = shm_rw_word(b)
    cdef shm_rwrec* rec = shm_rw_rec(b, me)
    cdef uint32_t n = _rw_phase(w)
    cdef uint32_t w2, ws
    cdef int r = R_TIMEOUT
    cdef int d
    cdef bint last = 0
    cdef tb_watch_t t
    st32_seq(&rec.ind, 1 | RW_BLOCKED | ((n & RW_TAG_MASK) << RW_TAG_SHIFT))
    crashpoint("rwlock.read.blocked")
    _rw_wake_ind(rec)                           # the writer of phase n stops waiting for us
    while True:
        w2 = ld32_seq(&W.w)
        if not (w2 & RW_PRESENT) or _rw_phase(w2) != n:
            st32_seq(&rec.ind, 1)               # entitled: in (the next writer counts us)
            r = R_ACQ
            break
        if last:
            r = R_TIMEOUT
            break
        ws = w2 & RW_SLOT_MASK
        if ws == 0 or ws > body_hwm(b) or ws - 1 == me:
            r = R_CORRUPT
            break
        if _rw_same_thread(rm, me, ws - 1):
            r = R_RW_DEADLOCK if deadline != 0 else R_TIMEOUT
            break
        if deadline != 0 and not last and _rw_spin(&W.w, w2):
            continue
        tb_watch_init(&t, &W.w, w2, deadline)
        d = tb_watch(rm, &t, ws - 1)             # a dead writer is recovered here ([R2])
        if d == R_SIGNAL:
            r = R_SIGNAL
            break
        if d == DEP_CHANGED:
            continue
        if deadline == 0:
            r = R_TIMEOUT
            break
        _rw_arm(rm, b, me, wt)
        st32_rlx(&rec.waiting, 1)
        r = tb_sleep_w(rm, &t, &W.parked, wt)
        st32_rlx(&rec.waiting, 0)
        if r == R_SIGNAL:
            break
        if r == R_TIMEOUT:
            last = 1                             # one last look
    if r != R_ACQ:
        st32_seq(&rec.ind, 0)
        _rw_wake_ind(rec)
    return r


cdef inline void _rw_read_waited(shm_rwrec* rec, int64_t ns) noexcept nogil:
    """A read that waited `ns` for a writer is in: its statistics, on the participant's
    own line (plain relaxed stores, as stats_waited's in the holder's ctl line)."""
    cdef uint64_t t = <uint64_t>ns if ns > 0 else 0
    st64_rlx(&rec.read_waits, ld64_rlx(&rec.read_waits) + 1)
    st64_rlx(&rec.read_wait_ns, ld64_rlx(&rec.read_wait_ns) + t)
    if t > ld64_rlx(&rec.read_wait_max_ns):
        st64_rlx(&rec.read_wait_max_ns, t)


cdef inline void _rw_read_undo(shm_rwrec* rec) noexcept nogil:
    """Give back one read hold (the caller has one)."""
    cdef uint32_t v = ld32_rlx(&rec.ind)
    if (v & RW_COUNT_MASK) > 1:
        st32_seq(&rec.ind, v - 1)
        return
    st32_seq(&rec.ind, 0)
    _rw_wake_ind(rec)


# ---- write ----

cdef inline uint32_t _rw_next_counted(shm_body* b, uint32_t me, uint32_t tag,
                                     uint32_t s) noexcept nogil:
    """The first slot from s on, other than me, whose indicator the writer of phase tag
    waits for; RW_NONE_LEFT if none. A loop of its own: it runs over every participant
    line provisioned (read after the writer's announcement: body_hwm, an SC load, so a
    reader whose slot was provisioned since, and whose SC store of its indicator came
    before the announcement, is seen) on each write, and with nothing else live in it
    each step is one load and a test."""
    cdef uint32_t n = body_hwm(b)
    while s < n:
        if s != me and _rw_counts(ld32_seq(&shm_rw_rec(b, s).ind), tag):
            return s
        s += 1
    return RW_NONE_LEFT


cdef void _rw_withdraw(shm_body* b, uint32_t me, uint32_t mine) noexcept nogil:
    """A writer that announced `mine` leaves without holding: w free again (readers tagged
    with its phase are entitled now), every sleeper woken."""
    cdef shm_rwword* W = shm_rw_word(b)
    cas32(&W.w, mine, _rw_free(mine))
    st32_seq(&shm_rw_rec(b, me).wstate, RW_W_NONE)
    _rw_wake_w(W)


cdef int _rw_write_acquire(rmap_t* rm, shm_body* b, uint32_t me, uint32_t hid,
                           wait_t* wt, bint* waited) noexcept nogil:
    """R_ACQ (w names us, the readers drained, the holder record ours), R_TIMEOUT
    (wt.dl_hit: a deadlock's victim), R_SIGNAL, R_RW_DEADLOCK, R_CORRUPT (nothing held),
    by wt's deadline, which the recoveries it runs keep; its wait record is published
    from its first sleep (_rw_arm; the caller ends it: _rw_unarm). *waited: it found a
    writer present or a reader to wait for (statistics)."""
    cdef int64_t deadline = wt.deadline
    cdef shm_rwword* W = shm_rw_word(b)
    cdef shm_rwrec* mine = shm_rw_rec(b, me)
    cdef shm_rwrec* rec
    cdef uint32_t w, nw, ws, tag, v, s
    cdef int r, d
    cdef bint last = 0
    cdef tb_watch_t t
    # 1. announce: w free -> PRESENT | phase + 1 | me
    while True:
        w = ld32_seq(&W.w)
        if not (w & RW_PRESENT):
            nw = (RW_PRESENT | (((_rw_phase(w) + 1) & RW_PHASE_MASK) << RW_SLOT_BITS)
                  | (me + 1))
            st32_seq(&mine.wstate, RW_W_DRAINING)
            if cas32(&W.w, w, nw):
                break
            st32_seq(&mine.wstate, RW_W_NONE)
            continue
        waited[0] = 1
        ws = w & RW_SLOT_MASK
        if ws == 0 or ws > body_hwm(b) or ws - 1 == me:
            return R_CORRUPT
        if _rw_same_thread(rm, me, ws - 1):
            return R_RW_DEADLOCK if deadline != 0 else R_TIMEOUT
        if deadline != 0 and not last and _rw_spin(&W.w, w):
            continue
        tb_watch_init(&t, &W.w, w, deadline)
        d = tb_watch(rm, &t, ws - 1)             # a dead writer is recovered here ([R2])
        if d == R_SIGNAL:
            return R_SIGNAL
        if d == DEP_CHANGED:
            continue
        if deadline == 0 or last:
            return R_TIMEOUT
        _rw_arm(rm, b, me, wt)
        st32_rlx(&mine.waiting, 1)
        fadd32(&W.wwait, 1)
        r = tb_sleep_w(rm, &t, &W.parked, wt)
        fsub32(&W.wwait, 1)
        st32_rlx(&mine.waiting, 0)
        if r == R_SIGNAL:
            return r
        if r == R_TIMEOUT:
            last = 1
    crashpoint("rwlock.write.announced")
    # 2. drain the readers present at the announcement
    tag = _rw_phase(nw) & RW_TAG_MASK
    last = 0
    s = _rw_next_counted(b, me, tag, 0)
    while s != RW_NONE_LEFT:
        rec = shm_rw_rec(b, s)
        while True:
            v = ld32_seq(&rec.ind)
            if not _rw_counts(v, tag):
                break
            waited[0] = 1
            if _rw_same_thread(rm, me, s):
                _rw_withdraw(b, me, nw)
                return R_RW_DEADLOCK if deadline != 0 else R_TIMEOUT
            if deadline != 0 and not last and _rw_spin(&rec.ind, v):
                continue
            tb_watch_init(&t, &rec.ind, v, deadline)
            d = tb_watch(rm, &t, s)              # a dead reader is recovered here ([R1])
            if d == R_SIGNAL:
                _rw_withdraw(b, me, nw)
                return R_SIGNAL
            if d == DEP_CHANGED:
                continue
            if last or deadline == 0:
                _rw_withdraw(b, me, nw)
                return R_TIMEOUT
            _rw_arm(rm, b, me, wt)
            st32_rlx(&mine.waiting, 1)
            r = tb_sleep_w(rm, &t, &rec.wparked, wt)
            st32_rlx(&mine.waiting, 0)
            if r == R_SIGNAL:
                _rw_withdraw(b, me, nw)
                return r
            if r == R_TIMEOUT:
                last = 1
        s = _rw_next_counted(b, me, tag, s + 1)
    crashpoint("rwlock.write.drained")
    # 3. hold: the holder record, then the state a recoverer reads as "in its section"
    st32_seq(&b.ctl.holder, hid)
    crashpoint("rwlock.write.holder")
    st32_seq(&mine.wstate, RW_W_HOLDING)
    return R_ACQ


cdef void _rw_write_release(shm_body* b, uint32_t me, uint32_t hid,
                            bint handon) noexcept nogil:
    """The holder leaves: HANDON first if it hands owner_died on (a death from there on
    keeps owner_died, [R4]); NOTRECOVERABLE if it leaves owner_died unrepaired without
    handing it on; then the holder record, then w free, then the wake."""
    cdef shm_rwword* W = shm_rw_word(b)
    cdef shm_rwrec* mine = shm_rw_rec(b, me)
    cdef uint32_t w
    if handon:
        for32(&b.ctl.flags, SHM_F_HANDON)
    st32_seq(&mine.wstate, RW_W_RELEASING)
    crashpoint("rwlock.release.releasing")
    if (ld32_acq(&b.ctl.flags) & SHM_F_OWNER_DIED
            and not ld32_acq(&b.ctl.flags) & SHM_F_HANDON):
        for32(&b.ctl.flags, SHM_F_NOTRECOVERABLE)
    cas32(&b.ctl.holder, hid, 0)
    crashpoint("rwlock.release.unholder")
    w = ld32_seq(&W.w)
    if (w & RW_PRESENT) and (w & RW_SLOT_MASK) == me + 1:
        cas32(&W.w, w, _rw_free(w))
    crashpoint("rwlock.release.freed")
    st32_seq(&mine.wstate, RW_W_NONE)
    _rw_wake_w(W)


# ---- recovery ----

cdef void _rw_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rc) noexcept nogil:
    """Dead participant q (its token held by us, the repair mutex held): [R1]-[R4]. Waits
    for nothing, so it needs nothing of the recoverer's context `rc`."""
    cdef shm_rwword* W = shm_rw_word(b)
    cdef shm_rwrec* rec = shm_rw_rec(b, q)
    cdef uint32_t w, ws, f
    if q >= body_hwm(b):
        return
    if ld32_acq(&rec.ind) != 0:                  # [R1] its read holds (or its blocked wait)
        st32_seq(&rec.ind, 0)
        shm_futex_wake(&rec.ind, 0x7fffffff)
    w = ld32_seq(&W.w)
    ws = ld32_acq(&rec.wstate)
    if (w & RW_PRESENT) and (w & RW_SLOT_MASK) == q + 1:
        f = ld32_acq(&b.ctl.flags)
        if ws == RW_W_HOLDING:                   # [R2]
            for32(&b.ctl.flags, SHM_F_OWNER_DIED)
        elif (ws == RW_W_RELEASING and f & SHM_F_OWNER_DIED
              and not f & SHM_F_HANDON):         # [R4]
            for32(&b.ctl.flags, SHM_F_NOTRECOVERABLE)
        holder_forget(rm, b, q)
        crashpoint("rwlock.recover.flagged")
        cas32(&W.w, w, _rw_free(w))              # [R3]: free, the same phase
        shm_futex_wake(&W.w, 0x7fffffff)
    else:
        holder_forget(rm, b, q)
    st32_seq(&rec.wstate, RW_W_NONE)
    st32_rlx(&rec.waiting, 0)


cdef void _rw_init(shm_body* b) noexcept nogil:
    pass                                         # all zero: free, phase 0, no reader


cdef dict _rw_part(rmap_t* rm, uint32_t i):
    """Participant i as Region._describe shows one."""
    cdef shm_participant* p = &rm.part[i]
    return {"slot": i, "pid": ld32_rlx(&p.pid), "tid": ld32_rlx(&p.tid),
            "alive": participant_state(rm, i) == 1,
            "other_namespace": other_pidns(ld64_acq(&p.pidns))}


cdef class RWLock(_TbObject):
    """RWLock() -> a phase-fair reader-writer lock in shared memory.

    Any number of readers at once, or one writer, across threads and processes. A writer
    waits at most for the readers present when it arrived, a reader at most for one
    writer. A reader that dies gives its share back (a writer waiting for it gets in at
    once); a writer that dies is reported to the next writer through ``owner_died``,
    which repairs and calls ``mark_consistent()``. A thread that holds a read and asks to
    write (an upgrade), or holds the write and asks to read, gets DeadlockError.

    ``create(name=None, *, max_participants=None, mode=0o600, persist=False)``,
    ``open(name)``, ``close()``, ``unlink()`` and pickling (by name) as for locks;
    ``Region.create_rwlock(name)`` makes one in a region."""
    kind_name = "rwlock"
    kind_code = SHM_KIND_RWLOCK

    def __init__(self, name=None, *, max_participants=None, mode=0o600, persist=False):
        self._init_standalone(name, max_participants, mode, persist, None)

    @classmethod
    def create(cls, name=None, *, max_participants=None, mode=0o600, persist=False):
        """A new RWLock in a segment of its own (the same as calling the class)."""
        return cls(name, max_participants=max_participants, mode=mode, persist=persist)

    # -- read --

    @classmethod
    def open_or_create(cls, name, *, max_participants=None, mode=0o600, persist=False):
        """Open RWLock ``name``, or create it (free, with these arguments) if there is
        none: atomic, so that of any number of processes racing on one name, all end up
        with the same RWLock. LockKindError if the segment holds something else; the
        arguments do not apply to an RWLock that exists already."""
        _check_create_args(1, max_participants, mode)
        return cls._open_or_create(name, lambda n: cls(n, max_participants=max_participants,
                                                       mode=mode, persist=persist))

    def acquire_read(self, blocking=True, timeout=-1):
        """acquire_read(blocking=True, timeout=-1) -> bool

        Take a read hold (shared): at once unless a writer is present, else after that
        one writer. ``timeout`` and ``blocking`` as ``Lock.acquire``: False on timeout,
        or at once if ``blocking`` is False and a writer is present. A thread may nest
        reads (each needs its release_read()). DeadlockError if this thread holds the
        write; LockNotRecoverableError after a writer's death left the data unrepaired
        for good."""
        return self._acquire_read(blocking, timeout)

    cdef object _acquire_read(self, blocking, timeout):
        cdef int64_t deadline = -1
        cdef int64_t t0
        cdef reg_t* r
        cdef shm_rwrec* rec
        cdef uint32_t v, w
        cdef int rc
        cdef wait_t wt
        if not (blocking is True and (timeout is _RW_NEG1 or timeout is None)):
            deadline = _deadline_of(blocking, timeout)   # (lockbase.pxd)
        r = self._me()
        rec = shm_rw_rec(&self.b, r.slot)
        if (g_lockdep is not None and deadline != 0 and not ld32_rlx(&rec.ind)
                and ld32_rlx(&rec.wstate) == RW_W_NONE):
            self._lockdep_before()               # a read that may wait: in order, as a lock
        if ld32_rlx(&rec.wstate) != RW_W_NONE:
            if deadline == 0:
                return False                     # never waits: as Lock.acquire(False)
            raise DeadlockError(f"this thread holds RWLock {self._name!r} for writing: "
                                "a read now would wait for itself")
        v = ld32_rlx(&rec.ind)
        if v & RW_BLOCKED:                       # a signal handler, inside this thread's wait
            raise reentry_error(f"acquire_read() of RWLock {self._name!r}")
        if v & RW_COUNT_MASK:                    # nested: the writer waits for us anyway
            if (v & RW_COUNT_MASK) == RW_COUNT_MASK:
                raise OverflowError(f"too many nested read holds of RWLock {self._name!r}")
            st32_rel(&rec.ind, v + 1)
        else:
            st32_seq(&rec.ind, 1)
            crashpoint("rwlock.read.raised")
            w = ld32_seq(&shm_rw_word(&self.b).w)
            if w & RW_PRESENT:
                wt.deadline = deadline           # the rest only if it sleeps (_rw_arm)
                wt.t0 = 0
                wt.dl_hit = 0
                wt.dl_text = NULL
                t0 = shm_now_ns()                # the waiting path only: never a fast read
                with nogil:
                    rc = _rw_read_wait(self.rm, &self.b, r.slot, w, &wt)
                    _rw_unarm(self.rm, r.slot, &wt)
                found = dl_found(&wt)            # a deadlock victim's cycle, or None
                if rc != R_ACQ:
                    if rc == R_TIMEOUT and wt.dl_hit:
                        dl_raise(f"a read of RWLock {self._name!r}", found)
                    return self._read_failed(rc, deadline)
                _rw_read_waited(rec, shm_now_ns() - t0)
        if ld32_acq(&self.b.ctl.flags) & SHM_F_NOTRECOVERABLE:
            _rw_read_undo(rec)
            raise _not_recoverable(
                f"RWLock {self._name!r}: a writer released it without mark_consistent() "
                "after a writer died")
        st64_rlx(&rec.reads, ld64_rlx(&rec.reads) + 1)
        r.held += 1                              # keeps the slot while it holds
        if g_lockdep is not None:
            ld_held().append(self._lockdep_class())
        return True

    cdef str _lockdep_class(self):
        """The class lockdep knows it by: `region/name`, a standalone one's region name
        (as a lock's, lockbase.pxi)."""
        if self._standalone:
            return self._region.name
        return f"{self._region.name}/{self._name}"

    cdef int _lockdep_before(self) except -1:
        """A blocking or timed acquire, either side, is about to wait: validate and record
        the orders held -> this lock (shmlocks/lockdep.py). A read counts as a write for
        ordering, as the kernel's lockdep counts an rwsem's: a reader waits behind a
        writer that waits for a reader, so read-read inversions deadlock too."""
        cdef str cls = self._lockdep_class()
        cdef list held = ld_held()
        if held and (tuple(held), cls) not in g_ld_validated:
            g_lockdep.before(cls, held)
        return 0

    cdef object _read_failed(self, int rc, int64_t deadline):
        cdef reg_t* r
        if rc == R_SIGNAL:
            return _raise_pending()
        if rc == R_RW_DEADLOCK:
            raise DeadlockError(f"this thread holds RWLock {self._name!r} for writing "
                                "through another object of it (opened again, or "
                                "unpickled): a read now would wait for itself")
        if rc == R_CORRUPT:
            raise CorruptRegionError(f"RWLock {self._name!r}: its writer word names no "
                                     "participant")
        if deadline != 0:
            r = reg_lookup(self.rm)
            if r != NULL:
                fadd64(&shm_rw_rec(&self.b, r.slot).timeouts, 1)
        return False

    def release_read(self):
        """Give back one read hold of this thread. NotOwnerError if it has none."""
        self._release_read()

    cdef int _held_across_close(self, bint write) except -1:
        """A hold begun before close() is released through the closed object (as a lock's,
        lockbase.pxi): the thread's registration keeps the mapping while it holds, and a
        read left held by a live thread would keep every writer out for good. Anything
        else on a closed object is ValueError."""
        cdef reg_t* r = reg_lookup(self.rm)
        cdef shm_rwrec* rec
        if r != NULL and r.held > 0:
            rec = shm_rw_rec(&self.b, r.slot)
            if write and ld32_rlx(&rec.wstate) == RW_W_HOLDING:
                return 0
            if (not write and ld32_rlx(&rec.ind) & RW_COUNT_MASK
                    and not ld32_rlx(&rec.ind) & RW_BLOCKED):
                return 0
        raise ValueError(f"RWLock {self._name!r} is closed")

    cdef int _release_read(self) except -1:
        cdef reg_t* r
        cdef shm_rwrec* rec
        if self._closed or self.rm.closed:
            self._held_across_close(0)
        r = reg_lookup(self.rm)
        if r == NULL:
            raise NotOwnerError(f"release_read() of RWLock {self._name!r} by a thread that "
                                "holds no read")
        rec = shm_rw_rec(&self.b, r.slot)
        if (ld32_rlx(&rec.ind) & RW_COUNT_MASK) == 0 or ld32_rlx(&rec.ind) & RW_BLOCKED:
            raise NotOwnerError(f"release_read() of RWLock {self._name!r} by a thread that "
                                "holds no read")
        _rw_read_undo(rec)
        if r.held > 0:
            r.held -= 1
        if g_lockdep is not None:
            ld_released(self._lockdep_class())
        return 0

    # -- write --

    def acquire_write(self, blocking=True, timeout=-1):
        """acquire_write(blocking=True, timeout=-1) -> bool

        Take the write hold (exclusive): announce, then wait for the readers present at
        that moment (readers arriving later wait for this writer). ``timeout`` and
        ``blocking`` as ``Lock.acquire``. DeadlockError if this thread holds a read (an
        upgrade: two upgraders would wait for each other forever) or the write already;
        LockNotRecoverableError if a writer released it unrepaired after an owner death.
        ``owner_died`` is True for a hold that follows a writer's death."""
        return self._acquire_write(blocking, timeout)

    cdef object _acquire_write(self, blocking, timeout):
        cdef int64_t deadline = -1
        cdef int64_t t0
        cdef reg_t* r
        cdef shm_rwrec* rec
        cdef uint32_t f, slot, hid
        cdef int rc
        cdef bint waited = 0
        cdef wait_t wt
        if not (blocking is True and (timeout is _RW_NEG1 or timeout is None)):
            deadline = _deadline_of(blocking, timeout)   # (lockbase.pxd)
        r = self._me()
        rec = shm_rw_rec(&self.b, r.slot)
        if deadline == 0 and (ld32_rlx(&rec.wstate) != RW_W_NONE
                              or ld32_rlx(&rec.ind) & RW_COUNT_MASK):
            return False                         # never waits: as Lock.acquire(False)
        if ld32_rlx(&rec.wstate) != RW_W_NONE:
            raise DeadlockError(f"this thread already holds RWLock {self._name!r} for "
                                "writing (not reentrant)")
        if ld32_rlx(&rec.ind) & RW_COUNT_MASK:
            raise DeadlockError(f"this thread holds a read of RWLock {self._name!r}: an "
                                "upgrade to write is refused (two upgraders would wait "
                                "for each other forever); release the read first")
        if ld32_acq(&self.b.ctl.flags) & SHM_F_NOTRECOVERABLE:
            raise _not_recoverable(
                f"RWLock {self._name!r}: a writer released it without mark_consistent() "
                "after a writer died")
        if g_lockdep is not None and deadline != 0:
            self._lockdep_before()
        slot = r.slot
        hid = r.hid
        t0 = shm_now_ns()
        wt.deadline = deadline                   # the rest only if it sleeps (_rw_arm)
        wt.t0 = 0
        wt.dl_hit = 0
        wt.dl_text = NULL
        with nogil:
            rc = _rw_write_acquire(self.rm, &self.b, slot, hid, &wt, &waited)
            _rw_unarm(self.rm, slot, &wt)
        found = dl_found(&wt)                    # a deadlock victim's cycle, or None
        if rc != R_ACQ:
            if rc == R_SIGNAL:
                return _raise_pending()
            if rc == R_RW_DEADLOCK:
                raise DeadlockError(f"this thread holds RWLock {self._name!r} through "
                                    "another object of it (opened again, or unpickled): "
                                    "the write would wait for itself")
            if rc == R_CORRUPT:
                raise CorruptRegionError(f"RWLock {self._name!r}: its writer word names "
                                         "no participant")
            if wt.dl_hit:
                dl_raise(f"the write of RWLock {self._name!r}", found)
            if deadline != 0:
                stats_timeout(self.b.ctl)
            return False
        r.held += 1
        f = ld32_acq(&self.b.ctl.flags)
        if f & SHM_F_HANDON:                     # the hand-on is over: the hold is ours
            fand32(&self.b.ctl.flags, ~(<uint32_t>SHM_F_HANDON))
        if f & SHM_F_NOTRECOVERABLE:             # made so while we waited
            _rw_write_release(&self.b, slot, hid, 0)
            r.held -= 1
            raise _not_recoverable(
                f"RWLock {self._name!r}: a writer released it without mark_consistent() "
                "after a writer died")
        stats_hold(self.b.ctl, r.pid)
        if waited:
            stats_waited(self.b.ctl, shm_now_ns() - t0)
        if f & SHM_F_OWNER_DIED:
            stats_owner_death(self.b.ctl)
        if g_lockdep is not None:
            ld_held().append(self._lockdep_class())
        return True

    cdef reg_t* _holding_write(self) noexcept nogil:
        cdef reg_t* r = reg_lookup(self.rm)
        if r == NULL or ld32_rlx(&shm_rw_rec(&self.b, r.slot).wstate) != RW_W_HOLDING:
            return NULL
        return r

    def release_write(self):
        """Give back the write hold. NotOwnerError if this thread does not hold it.
        Releasing a hold that has ``owner_died`` without ``mark_consistent()`` makes the
        lock not recoverable (as for locks)."""
        self._release_write(0)

    cdef int _release_write(self, bint handon) except -1:
        cdef reg_t* r
        if self._closed or self.rm.closed:
            self._held_across_close(1)
        r = self._holding_write()
        if r == NULL:
            raise NotOwnerError(f"release_write() of RWLock {self._name!r} by a thread "
                                "that does not hold it for writing")
        _rw_write_release(&self.b, r.slot, r.hid, handon)
        if r.held > 0:
            r.held -= 1
        if g_lockdep is not None:
            ld_released(self._lockdep_class())
        return 0

    def read_lock(self):
        """A context manager: ``with rw.read_lock(): ...`` holds a read for the block."""
        cdef _RWHold h = _RWHold.__new__(_RWHold)
        h._rw = self
        h._write = 0
        return h

    def write_lock(self):
        """A context manager: ``with rw.write_lock(): ...`` holds the write for the block.
        Left by an exception while ``owner_died`` is still set (the repair failed before
        ``mark_consistent()``), it hands ``owner_died`` on to the next writer instead of
        making the lock not recoverable."""
        cdef _RWHold h = _RWHold.__new__(_RWHold)
        h._rw = self
        h._write = 1
        return h

    # -- owner death --

    @property
    def owner_died(self):
        """True while the lock's data follows a writer's death that no writer has
        repaired yet (mark_consistent()): a writer's hold after the death, and readers
        admitted meanwhile, see it."""
        self._check()
        return bool(ld32_acq(&self.b.ctl.flags) & SHM_F_OWNER_DIED)

    def mark_consistent(self):
        """Declare the data repaired after a writer's death (the write holder only)."""
        self._check()
        if self._holding_write() == NULL:
            raise NotOwnerError("mark_consistent() by a thread that does not hold the "
                                "write")
        fand32(&self.b.ctl.flags, ~(<uint32_t>(SHM_F_OWNER_DIED | SHM_F_HANDON)))

    def clear_not_recoverable(self):
        """clear_not_recoverable() -> bool

        Bring back a lock released unrepaired after a writer's death (every acquire
        raising LockNotRecoverableError): the next writer gets ``owner_died`` again.
        True if it was not recoverable, False (nothing done) otherwise."""
        cdef uint32_t f
        self._check()
        while True:
            f = ld32_acq(&self.b.ctl.flags)
            if not f & SHM_F_NOTRECOVERABLE:
                return False
            if cas32(&self.b.ctl.flags, f,
                     (f & ~(<uint32_t>(SHM_F_NOTRECOVERABLE | SHM_F_HANDON)))
                     | SHM_F_OWNER_DIED):
                return True

    # -- state --

    @property
    def readers(self):
        """The read holds now, over every thread and process (a snapshot)."""
        cdef uint32_t i, v
        cdef uint64_t n = 0
        self._check()
        for i in range(body_hwm(&self.b)):
            v = ld32_acq(&shm_rw_rec(&self.b, i).ind)
            if not v & RW_BLOCKED:
                n += v & RW_COUNT_MASK
        return n

    @property
    def writer(self):
        """(pid, native thread id) of the write holder, or None (a snapshot)."""
        cdef uint32_t h
        self._check()
        h = holder_slot(self.rm, ld32_acq(&self.b.ctl.holder))
        if h == 0 or other_pidns(ld64_acq(&self.rm.part[h - 1].pidns)):
            return None
        return (ld32_rlx(&self.rm.part[h - 1].pid), ld32_rlx(&self.rm.part[h - 1].tid))

    def locked(self):
        """True if a writer holds it or any reader does (a snapshot)."""
        self._check()
        return bool(ld32_acq(&self.b.ctl.holder)) or self.readers > 0

    def _state(self):
        cdef uint32_t w = ld32_acq(&shm_rw_word(&self.b).w)
        readers = self.readers
        if w & RW_PRESENT:
            h = ld32_acq(&self.b.ctl.holder)
            st = "writing" if h else f"writer draining, readers={readers}"
        else:
            st = f"readers={readers}" if readers else "free"
        return st

    def _describe(self):
        """As a lock's _describe (inspect), plus ``state`` and ``readers``: the holder is
        the writer; the readers a list of participants with their ``holds``."""
        cdef uint32_t h, i, v
        self._check()
        h = holder_slot(self.rm, ld32_acq(&self.b.ctl.holder))
        holder = _rw_part(self.rm, h - 1) if h else None
        readers = []
        for i in range(body_hwm(&self.b)):
            v = ld32_acq(&shm_rw_rec(&self.b, i).ind)
            if (v & RW_COUNT_MASK) and not v & RW_BLOCKED:
                d = _rw_part(self.rm, i)
                d["holds"] = v & RW_COUNT_MASK
                readers.append(d)
        f = ld32_acq(&self.b.ctl.flags)
        return {"name": self._name, "kind": self.kind_name,
                "locked": holder is not None or bool(readers), "holder": holder,
                "readers": readers, "waiters": self._waiters(),
                "owner_died": bool(f & SHM_F_OWNER_DIED),
                "not_recoverable": bool(f & SHM_F_NOTRECOVERABLE),
                "stale_step": False, "state": self._state()}

    cdef int _waiters(self) noexcept nogil:
        cdef uint32_t i
        cdef int n = 0
        for i in range(body_hwm(&self.b)):
            if (ld32_acq(&shm_rw_rec(&self.b, i).waiting)
                    and participant_state(self.rm, i) == 1):
                n += 1
        return n

    def stats(self):
        """The writers' statistics as a lock's (``acquisitions``, ``contended``,
        ``wait_total_s``, ``wait_max_s``, ``timeouts``, ``owner_deaths``, ``handoffs``:
        write holds only), plus ``reads`` (read holds begun), ``read_waits`` (those that
        waited for a writer), ``read_wait_total_s`` and ``read_wait_max_s`` (their wait)
        and ``read_timeouts``, summed (the max: the largest) over the participants' own
        lines (a snapshot)."""
        cdef uint32_t i
        cdef uint64_t reads = 0, waits = 0, tos = 0, wns = 0, wmax = 0, m
        cdef shm_rwrec* rec
        self._check()
        d = stats_read(self.b.ctl)
        for i in range(body_hwm(&self.b)):
            rec = shm_rw_rec(&self.b, i)
            reads += ld64_acq(&rec.reads)
            waits += ld64_acq(&rec.read_waits)
            tos += ld64_acq(&rec.timeouts)
            wns += ld64_acq(&rec.read_wait_ns)
            m = ld64_acq(&rec.read_wait_max_ns)
            if m > wmax:
                wmax = m
        d["reads"] = reads
        d["read_waits"] = waits
        d["read_wait_total_s"] = wns / 1e9
        d["read_wait_max_s"] = wmax / 1e9
        d["read_timeouts"] = tos
        return d

    def reset_stats(self):
        """Zero the statistics, for every process (as Lock.reset_stats)."""
        cdef uint32_t i
        self._check()
        stats_reset(self.b.ctl)
        for i in range(body_hwm(&self.b)):
            st64_rel(&shm_rw_rec(&self.b, i).reads, 0)
            st64_rel(&shm_rw_rec(&self.b, i).read_waits, 0)
            st64_rel(&shm_rw_rec(&self.b, i).timeouts, 0)
            st64_rel(&shm_rw_rec(&self.b, i).read_wait_ns, 0)
            st64_rel(&shm_rw_rec(&self.b, i).read_wait_max_ns, 0)

    def _raw(self):
        cdef shm_rwword* W = shm_rw_word(&self.b)
        cdef uint32_t i
        cdef shm_rwrec* r
        self._check()
        recs = []
        for i in range(body_hwm(&self.b)):
            r = shm_rw_rec(&self.b, i)
            recs.append((r.ind, r.wparked, r.wstate, r.waiting))
        return {"w": W.w, "parked": W.parked, "wwait": W.wwait,
                "flags": self.b.ctl.flags, "holder": self.b.ctl.holder,
                "recs (ind, wparked, wstate, waiting)": recs}

    def __repr__(self):
        st = "closed" if (self._closed or self.rm.closed) else self._state()
        return f"<shmlocks.RWLock at {id(self):#x}: {st}>"


cdef class _RWHold:
    """What RWLock.read_lock() and write_lock() return: a context manager."""

    def __enter__(self):
        if self._write:
            self._rw._acquire_write(True, None)
        else:
            self._rw._acquire_read(True, None)
        return self._rw

    def __exit__(self, t, v, tb):
        cdef uint32_t f
        if self._write:
            f = 0
            if t is not None and not self._rw._closed and not self._rw.rm.closed:
                f = ld32_acq(&self._rw.b.ctl.flags) & SHM_F_OWNER_DIED
            self._rw._release_write(f != 0)
        else:
            self._rw._release_read()
        return False


def _rw_create_in(Region region, name):
    return RWLock._new_in(region, name, None)


_register_object(RWLock, _rw_init, _rw_recover, 1)
g_tb_api["create_rwlock"] = _rw_create_in
