# pi.pxi -- priority-inheritance robust mutex.
#
# Invariant: as robust.pxi, plus PTHREAD_PRIO_INHERIT: the futex word holds the owner's
# TID and a contended lock is FUTEX_LOCK_PI, so the kernel boosts the holder to the
# highest waiter's priority (rt_mutex) until it unlocks. It must be robust too: glibc
# aborts a process waiting on a non-robust PI mutex whose owner died.
# A real-time waiter (SCHED_FIFO/RR) blocks in FUTEX_LOCK_PI at once, so the boost applies
# at once. Any other waiter first spins on trylock for the wait policy's adaptive budget
# (at most SPIN_MAX_NS), as the robust kind does: a spinner can only take a mutex with no
# waiter queued in the kernel (the futex word then has FUTEX_WAITERS, and unlock hands it
# to the top waiter), so blocked waiters are still served in priority order, and a
# contended hand-off the spin catches skips two system calls and a cross-CPU wake-up
# (commit 1849df4 has the measurements).

#
# Resumable waiters (docs/design.md §5 "Resumable waits", §7.4): a waiter that must not
# block (an event loop's) cannot sleep on the mutex word, since FUTEX_WAIT on a PI futex
# is never woken by FUTEX_UNLOCK_PI (and its presence there makes that unlock fail). It
# sleeps on a side word instead, and on the holder's liveness token:
#
#   word A   u32 asyncw   1 while some participant waits that way (pi.pxd: pi_asyncw; the
#                         u32 past glibc's mutex)
#            u32 aseq     (the u32 past asyncw) bumped, then woken (all), by a release that
#                         sees asyncw set (pi_aseq)
#   prec[p]  awaiting     the lock's number + 1 while p waits that way (pi_awaiting): a
#                         table's compact stripes share one prec line per participant
#                         (docs/design.md §15), and p waits for one lock at a time
#
# The waiter: awaiting := 1, then asyncw := 1 (both SC); then at each look v := aseq,
# trylock, and if it is held, a sleep on aseq == v and the holder's token. The release:
# unlock (a locked instruction, or FUTEX_UNLOCK_PI), then a load of asyncw (on the line
# the unlock just wrote: no line the next holder writes, and ctl.flags stays 0, so a
# holder's acquire keeps its inline path); if set, aseq += 1 and wake. Each side writes,
# then reads the other's word, so either the release sees asyncw or the waiter's trylock
# sees the unlock; and the waiter read aseq before its trylock, so a bump after it ends its
# sleep at once (-EAGAIN) or wakes it.
# The last waiter out clears asyncw: awaiting := 0; if no prec says awaiting, asyncw := 0,
# then the precs are looked at again: if a waiter came meanwhile (its asyncw store may
# have come before ours), asyncw := 1 again and aseq bumped, for a release that read
# asyncw between the two and bumped nothing. A dead waiter's mark is taken down by its recovery
# (_pi_recover), which also redoes the last one out's part whatever it finds, so a waiter
# that died between any two of these stores (crash points pi.async.marked, pi.async.unmarked)
# leaves neither a mark nor the flag once recovered. Asynchronous waiters are not queued in the kernel: they take the lock by
# trylock, after the kernel's own waiters (an unlock hands it to the top one), so they get
# no priority order and lend the holder no boost.

cdef void _pi_init(shm_body* b) noexcept nogil:
    _robust_mutex_init(pm_mutex(b), 1)


cdef bint _pi_async_any(shm_body* b) noexcept nogil:
    """Does some participant wait on this lock asynchronously (its awaiting mark up)?"""
    cdef uint32_t x
    for x in range(body_hwm(b)):
        if ld32_seq(pi_awaiting(b, x)) == b.index + 1:
            return 1
    return 0


cdef void _pi_async_bump(shm_body* b) noexcept nogil:
    """The lock may be free now: every asynchronous waiter looks again."""
    fadd32(pi_aseq(b), 1)
    shm_futex_wake(pi_aseq(b), 0x7fffffff)


cdef void _pi_async_leave(shm_body* b, uint32_t q, bint recovering) noexcept nogil:
    """Participant q's asynchronous wait is over (or q died and we recover it: then the
    last one's part is redone even with its mark down already): its mark down, and asyncw
    cleared if it was the last (see the top of this file). Idempotent."""
    if not cas32(pi_awaiting(b, q), b.index + 1, 0) and not recovering:
        return
    if not recovering:
        crashpoint("pi.async.unmarked")
    if _pi_async_any(b):
        return
    st32_seq(pi_asyncw(b), 0)
    if _pi_async_any(b):                     # one came meanwhile: a release may have missed it
        st32_seq(pi_asyncw(b), 1)
        _pi_async_bump(b)


cdef void _pi_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Dead participant q: as robust's (_pmutex_recover: the kernel reports its hold),
    and an asynchronous wait of its taken off asyncw."""
    _pmutex_recover(rm, b, q, rec)
    if ld32_acq(pi_asyncw(b)) or ld32_acq(pi_awaiting(b, q)) == b.index + 1:
        _pi_async_leave(b, q, 1)


cdef class PIMutex(_PthreadMutexLock):
    """Priority-inheritance robust mutex: waiters are served in priority order and the
    holder runs at the highest waiter's priority."""
    kind_name = "pi"
    kind_code = SHM_KIND_PI
    fifo = False
    recovery = "kernel"
    priority_inheritance = True

    cdef _bind(self, object region, uint32_t i, name):
        _Lock._bind(self, region, i, name)
        if other_pidns(self.rm.hdr.creator_pidns):
            raise NamespaceError(
                f"pi lock {name!r} of region {self._region.name!r} belongs to another PID "
                "namespace: the kernel names a "
                "priority-inheritance futex's owner by thread id, and thread ids differ "
                "between namespaces, so it cannot be shared across them (every other kind "
                "can)")

    cdef bint _spins(self) noexcept nogil:
        cdef int pol = sched_getscheduler(0)        # the slow path only
        return pol != SCHED_FIFO and pol != SCHED_RR

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        cdef int rc = pm_unlock(pm_mutex(&self.b), 1)
        if ld32_seq(pi_asyncw(&self.b)):             # after the unlock (see the top)
            _pi_async_bump(&self.b)
        return 0 if rc == 0 else R_CORRUPT

    cdef int _wait_nb(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        """A resumable wait (docs/design.md §5): announced in prec and asyncw at the
        first entry (rc is R_PENDING after it), then trylock; where it would sleep, the
        driver sleeps on aseq and on the holder's liveness token (a holder not yet named:
        one slice). Any end but R_WOULDBLOCK takes the announcement down."""
        cdef shm_body* b = &self.b
        cdef uint32_t* aseq = pi_aseq(b)
        cdef watch_t ws
        cdef uint32_t v, h
        cdef int r, d, changed = 0
        if rc != R_PENDING:                          # the first entry: announce
            st32_seq(pi_awaiting(b, me), b.index + 1)
            crashpoint("pi.async.marked")
            st32_seq(pi_asyncw(b), 1)
        r = nb_enter(w)
        while r == R_CONT:
            if ld32_acq(&b.ctl.flags) & SHM_F_NOTRECOVERABLE:
                r = R_NOTREC
                break
            v = ld32_seq(aseq)                       # before the trylock (see the top)
            r = _pm_code(pm_trylock(pm_mutex(b), 1))
            if r != R_BUSY:
                break
            if w.deadline == 0 or (w.deadline > 0 and shm_now_ns() >= w.deadline):
                r = R_TIMEOUT
                break
            ws.words[0] = aseq
            ws.vals[0] = v
            ws.n = 1
            ws.token = -1
            ws.rec = &w.rec
            h = holder_slot(self.rm, ld32_acq(&b.ctl.holder))
            d = DEP_UNKNOWN if h == 0 else watch_participant(self.rm, h - 1, &ws)
            if w.rec.sig:
                w.rec.sig = 0
                r = R_SIGNAL
                break
            if d == DEP_CHANGED and changed < 8:
                changed += 1
                r = R_CONT
                continue
            w.resume_rc = R_PENDING
            return nb_would_block(w, &ws, NULL, d != DEP_ARMED or not g_wait_waitv)
        _pi_async_leave(b, me, 0)
        return r


def _pi_async_state(PIMutex lock):
    """A pi lock's resumable-waiter words, a snapshot (not API: tests): {"asyncw": 0/1,
    "aseq": n, "awaiting": [slots whose mark is up]}."""
    cdef shm_body* b = &lock.b
    cdef uint32_t x
    lock._check()
    return {"asyncw": ld32_acq(pi_asyncw(b)), "aseq": ld32_acq(pi_aseq(b)),
            "awaiting": [x for x in range(body_hwm(b))
                         if ld32_acq(pi_awaiting(b, x)) == b.index + 1]}


_register_kind(PIMutex, _pi_init, _pi_recover, 0)
