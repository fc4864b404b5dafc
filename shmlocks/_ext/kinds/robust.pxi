# robust.pxi -- robust, process-shared pthread mutex (and the base the pi kind shares).
#
# Invariant: the mutex in word A (robust.pxd: pm_mutex, its futex word pm_word) is
# PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST, so glibc links it into the holder
# thread's robust list and the kernel marks it OWNER_DIED when that thread dies holding it. The next locker gets EOWNERDEAD, reported as
# owner_died; mark_consistent() is pthread_mutex_consistent(); a release without it leaves
# the mutex ENOTRECOVERABLE for everyone (LockNotRecoverableError).
#
# Waiting: a waiter spins on trylock briefly first, then sleeps on the mutex's futex word
# itself (_sleep) until the unlock or the kernel (at the holder's death) wakes it, its
# deadline or its next deadlock look, or a signal; pi sleeps in FUTEX_LOCK_PI (_sleep_pi).
#
# The mutex is in the segment, so its fields are foreign bytes: every glibc call goes
# through the pm_* guards (shm_sys.h), which refuse a mutex whose kind is not exactly the
# one we initialised (R_CORRUPT: CorruptRegionError) and, for pi, mark a word naming a
# thread that no longer exists FUTEX_OWNER_DIED before FUTEX_LOCK_PI would fail with ESRCH
# (glibc aborts on that); the lock then comes back owner_died.

cdef int64_t PI_MAIN_SLICE_NS = 50000000    # 50 ms: Ctrl-C within 100 ms (see _sleep_pi)
cdef int64_t PI_FOREVER_NS = 86400 * <int64_t>1000000000
# FUTEX_LOCK_PI watches no poke word (the deadlock walk's, docs/design.md §9): a pi
# waiter's first sleep after its first walk ends after this long, and it walks again
# then, so that a cycle closed just after its first walk by a member that could not poke
# it awake is refused in time; from there on it walks at its looks (every 0.5 s)
cdef int64_t PI_WALK_SLICE_NS = 50000000    # 50 ms


cdef void _robust_init(shm_body* b) noexcept nogil:
    _robust_mutex_init(pm_mutex(b), 0)


cdef void _pmutex_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Dead participant q: the kernel marked a mutex it held OWNER_DIED (the next locker
    gets EOWNERDEAD); only its holder id is left to clear. Its slot is about to be reused,
    so a hold it died in is kept in word B first ([R1]): who held the lock (pid, tid,
    dead) stays known until the next holder takes it over (_died_taken)."""
    cdef shm_participant* p = &rm.part[q]
    cdef uint32_t h = ld32_acq(&b.ctl.holder)
    cdef uint32_t w = ld32_acq(pm_word(b))
    if pm_died_untaken(w) and (
            h == participant_hid(rm, q)
            # died taking it, before its holder record (lockbase.pxi _describe's case)
            or (h == 0 and ld32_acq(pm_dead_pid(b)) == 0
                and participant_op(rm, q, b.index + 1) != 0)):
        st32_rlx(pm_dead_pidns(b), <uint32_t>ld64_rlx(&p.pidns))
        st32_rlx(pm_dead_tid(b), ld32_rlx(&p.tid))
        st32_rel(pm_dead_pid(b), ld32_rlx(&p.pid))   # last: the record is whole once set
    holder_forget(rm, b, q)


cdef class _PthreadMutexLock(_Lock):
    cdef bint _spins(self) noexcept nogil:
        return 1

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        return _pm_code(pm_trylock(pm_mutex(&self.b), self._code == SHM_KIND_PI))

    cdef int _try(self, uint32_t me) noexcept nogil:
        if ld32_acq(&self.b.ctl.flags) & SHM_F_NOTRECOVERABLE:
            return R_NOTREC
        return _pm_code(pm_trylock(pm_mutex(&self.b), self._code == SHM_KIND_PI))

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef timespec ts
        cdef int r
        cdef int64_t sl
        cdef bint spins
        if w.nb:
            return self._wait_nb(me, rc, w)
        if ld32_acq(&self.b.ctl.flags) & SHM_F_NOTRECOVERABLE:
            return R_NOTREC
        if w.deadline == 0:
            return R_TIMEOUT
        spins = self._spins()                        # once per wait (pi: a system call)
        w.backoff = 1                                # barging: poll less often as we wait
        while spins:
            # read the futex word first (its owner TID; the kernel's flag bits above): a
            # trylock bound to fail would still take the holder's cache line from it
            if ld32_rlx(pm_word(&self.b)) & FUTEX_TID_MASK_ == 0:
                rc = _pm_code(pm_trylock(pm_mutex(&self.b), self._code == SHM_KIND_PI))
                if rc != R_BUSY:
                    return rc
            r = wait_pause(w)
            if r == R_PARK:
                break
            if r != R_CONT:
                return R_TIMEOUT
        wait_nogil(w)
        if self._code == SHM_KIND_PI:
            return self._sleep_pi(w)
        return self._sleep(w, 0)

    cdef int _wait_nb(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        """_wait for a non-blocking driver (docs/design.md §5 "Resumable waits"): no spin;
        the sleep on the mutex word (_sleep) handed to the driver, the place being the
        FUTEX_WAITERS announcement (rc R_PENDING once made: the next trylock that takes
        the lock keeps FUTEX_WAITERS, as after a sleep). One that leaves after it slept
        (a timeout, a withdrawal) wakes another sleeper in its stead, whatever the word
        says now: an unlock wakes one waiter, which a blocking sleeper always uses (it
        looks at the lock before its deadline), and a resumable one may not; that unlock
        cleared FUTEX_WAITERS, and a trylock may have taken the lock since without it, so
        the bit no longer tells whether anyone sleeps (tests/test_nbwait.py
        test_woken_async_waiter_that_leaves_wakes_a_sleeper)."""
        cdef uint32_t* word = pm_word(&self.b)
        cdef bint slept = rc == R_PENDING
        cdef int r
        if ld32_acq(&self.b.ctl.flags) & SHM_F_NOTRECOVERABLE:
            r = R_NOTREC
        elif w.deadline == 0:
            r = R_TIMEOUT
        else:
            r = self._sleep(w, slept)
        if slept and r != R_WOULDBLOCK and r != R_ACQ and r != R_ACQ_DIED:
            shm_futex_wake(word, 1)
        return r

    cdef int _sleep(self, wait_t* w, bint slept) noexcept nogil:
        """Sleep on the robust mutex's own futex word, as glibc's lock does, but woken by a
        signal too (glibc's robust lock retries on EINTR, so Ctrl-C would never reach the
        main thread): announce with FUTEX_WAITERS, sleep to the deadline or the next
        deadlock look, take it with trylock. The holder's death wakes a waiter: the mutex
        is on the holder's robust list, and the kernel wakes one at FUTEX_OWNER_DIED."""
        cdef uint32_t* word = pm_word(&self.b)
        cdef watch_t ws
        cdef uint32_t v
        cdef int rc, r
        cdef bint odd
        while True:
            v = ld32_seq(word)
            odd = 0
            if v & FUTEX_TID_MASK_ == 0:
                rc = _pm_code(pm_trylock(pm_mutex(&self.b), 0))
                if rc != R_BUSY:
                    if slept and (rc == R_ACQ or rc == R_ACQ_DIED):
                        # glibc's trylock took it without FUTEX_WAITERS: other waiters may
                        # still sleep, so our unlock must wake (glibc's own lock after a
                        # sleep does the same)
                        for32(word, FUTEX_WAITERS_)
                    return rc
                # No owner, yet not takeable: taken between our read and the trylock, or a
                # word glibc never writes (FUTEX_WAITERS alone: the segment's bytes are
                # not ours to trust). Never spin on it: the deadline, then a short sleep.
                odd = ld32_seq(word) == v
            r = wait_due(w)
            if r != R_CONT:
                return r
            ws.n = 0
            ws.rec = &w.rec
            if odd:
                ws.token = -1
                watch_word(&ws, word, v)
                if w.nb:
                    w.resume_rc = R_PENDING if slept else R_BUSY
                    return nb_would_block(w, &ws, NULL, 1)
                r = wait_sleep(w, &ws, 1)
                if r != R_CONT:
                    return r
                continue
            if v & FUTEX_TID_MASK_ == 0:
                continue                             # it changed: look again
            if not (v & FUTEX_WAITERS_):
                if not cas32(word, v, v | FUTEX_WAITERS_):
                    continue
                v = v | FUTEX_WAITERS_
            ws.token = 0                             # (see park_woken)
            watch_word(&ws, word, v)
            if w.nb:                                 # a resumable wait: the driver sleeps
                w.resume_rc = R_PENDING              # (announced: FUTEX_WAITERS is set)
                return nb_would_block(w, &ws, NULL, not g_wait_waitv)
            r = wait_sleep(w, &ws, not g_wait_waitv)
            slept = 1
            if r != R_CONT:
                return r

    cdef int _sleep_pi(self, wait_t* w) noexcept nogil:
        """FUTEX_LOCK_PI (through glibc) to the deadline or the next deadlock walk: the
        kernel queues us by priority and boosts the holder. FUTEX_LOCK_PI is restarted
        after a signal handler, never interrupted, so the main thread sleeps in slices of
        PI_MAIN_SLICE_NS, to run Python's handlers (Ctrl-C) in time; other threads wake
        before their time only once, PI_WALK_SLICE_NS after their first walk (it cannot
        watch its poke word)."""
        cdef timespec ts
        cdef int rc, r
        cdef int64_t until, t
        cdef bint main = PyThread_get_thread_ident() == g_main_ident
        cdef uint32_t* pw
        cdef uint32_t pv
        cdef bint first = w.dl_state == 1
        while True:
            # the deadlock walk, when due (wait.pxi wait_walk); a poke cannot wake
            # FUTEX_LOCK_PI, so the first sleep after the first walk is short when this
            # waiter may be a victim by then (a poke is seen at its end)
            if wait_walk(w, &pw, &pv) != R_CONT:
                return R_TIMEOUT                     # a deadlock's victim
            until = wait_until(w, not g_wait_waitv)
            if first:
                first = 0
                t = shm_now_ns() + PI_WALK_SLICE_NS
                if 0 <= w.dl_from <= t and (until < 0 or t < until):
                    until = t
            if main:
                t = shm_now_ns() + PI_MAIN_SLICE_NS
                if until < 0 or t < until:
                    until = t
            if until < 0:
                until = shm_now_ns() + PI_FOREVER_NS
            ts = shm_ts_of_ns(until)
            rc = _pm_code(pm_clocklock(pm_mutex(&self.b), 1, &ts))
            if rc != R_TIMEOUT:
                return rc
            if wait_signals(w):
                return R_SIGNAL
            r = wait_due(w)
            if r != R_CONT:
                return r

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        return 0 if pm_unlock(pm_mutex(&self.b), self._code == SHM_KIND_PI) == 0 else R_CORRUPT

    cdef int _consistent(self) noexcept nogil:
        return pm_consistent(pm_mutex(&self.b), self._code == SHM_KIND_PI)

    cdef bint _is_locked(self) noexcept nogil:
        # the glibc mutex's first word is its futex: holder TID | FUTEX_WAITERS | OWNER_DIED
        return ld32_acq(pm_word(&self.b)) != 0

    cdef bint _held_by_tid(self, uint32_t tid) noexcept nogil:
        # the futex word: its owner's TID, or OWNER_DIED once the kernel saw the owner die
        cdef uint32_t w = ld32_acq(pm_word(&self.b))
        return (w & FUTEX_OWNER_DIED_) != 0 or (w & FUTEX_TID_MASK_) == tid

    cdef object _dead_holder(self):
        # [R1] the record, only while the word says nobody has taken the mutex since the
        # death (a snapshot, as owner is)
        cdef uint32_t pid
        if not pm_died_untaken(ld32_acq(pm_word(&self.b))):
            return None
        pid = ld32_acq(pm_dead_pid(&self.b))
        if pid == 0:
            return None
        return (pid, ld32_rlx(pm_dead_tid(&self.b)), ld32_rlx(pm_dead_pidns(&self.b)))

    cdef void _died_taken(self) noexcept nogil:
        # a hold that began with EOWNERDEAD: the dead holder's record is history now
        st32_rel(pm_dead_pid(&self.b), 0)


cdef class RobustMutex(_PthreadMutexLock):
    """Robust pthread mutex: the kernel reports a holder's death (owner_died)."""
    kind_name = "robust"
    kind_code = SHM_KIND_ROBUST
    fifo = False
    recovery = "kernel"
    priority_inheritance = False


_register_kind(RobustMutex, _robust_init, _pmutex_recover, 0)
