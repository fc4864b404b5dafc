# condition.pxi -- threading.Condition in shared memory, whose waiters never swallow a
# notification by dying (docs/design.md §12).
#
# Invariant (under the guard, toolbox.pxi): a thread inside wait() has a record with a
# ticket (taken from `value`, the next ticket; 0 = none) and `notified` (0, then 1 once a
# notify picked it); the record goes when the waiter, notified or timed out, has the lock
# back ("consumed"). notify(n) picks the n oldest waiters that are alive and not yet
# notified, sets their `notified` (a single store each: a notifier killed midway notified
# fewer, as if it died sooner) and wakes each on its own word: no herd. So a notification
# is in a record until a live waiter has consumed it, and:
#   [N1] a waiter that dies notified, before consuming it (asleep, or blocked on the lock):
#        its recoverer passes the notification on to the oldest live waiter not notified;
#   [N2] a waiter that dies not notified: its record is dropped; notify() never picks a
#        dead one, so notify(n) reaches n live waiters when there are n;
#   [N3] a waiter that leaves by an exception (a signal handler's, while it sleeps or
#        while it takes the lock back) while notified passes the notification on too;
#        one that times out notified returns True (it had it);
#   [N4] one that died holding the guard: its change is undone (tb_undo).
#   [N5] (not a death) one that has its lock back but not the guard by its deadline leaves
#        without it (_cv_depart): notified 0 -> TB_N_GONE by CAS, against the notifiers'
#        0 -> 1 (_cv_give), so it is notified or never picked; the next guard holder
#        drops its record (_cv_reap).
# For [N1] to be seen at once, the oldest waiter not notified (the one that would inherit
# the notification) sleeps on its own word, its `poke` word and the tokens of the
# notified waiters that have not consumed yet: a notify (or a waiter leaving) that changes
# who that is pokes the new oldest, which looks again. Every waiter watches those tokens
# as of its last look (up to SHM_WAITV_MAX - 2, else it sleeps in slices).

cdef inline uint32_t _cv_age(shm_tbword* w, uint32_t ticket) noexcept nogil:
    return w.value - ticket                     # (u32: wraps with the ticket counter)


cdef int _cv_oldest(rmap_t* rm, shm_body* b, uint32_t skip) noexcept nogil:
    """The oldest live waiter not yet notified nor gone (not `skip`), or -1 (guard held;
    or a waiter leaving without it: a snapshot, its use a CAS)."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* r
    cdef uint32_t x, age, best = 0
    cdef int who = -1
    for x in range(body_hwm(b)):
        if x == skip:
            continue
        r = shm_tb_rec(b, x)
        if (ld32_acq(&r.ticket) == 0 or ld32_acq(&r.notified) != 0
                or ld32_acq(&r.gone) != 0 or participant_state(rm, x) != 1):
            continue
        age = _cv_age(w, ld32_acq(&r.ticket))
        if who < 0 or age > best:
            best = age
            who = x
    return who


cdef inline void _cv_wake(shm_body* b, uint32_t x) noexcept nogil:
    shm_futex_wake(&shm_tb_rec(b, x).notified, 1)


cdef void _cv_poke_oldest(rmap_t* rm, shm_body* b, uint32_t skip) noexcept nogil:
    """Tell the oldest waiter not notified to look again at whom it watches."""
    cdef int x = _cv_oldest(rm, b, skip)
    if x >= 0:
        fadd32(&shm_tb_rec(b, x).poke, 1)
        shm_futex_wake(&shm_tb_rec(b, x).poke, 1)


cdef int _cv_give(rmap_t* rm, shm_body* b, uint32_t skip, bint journal) noexcept nogil:
    """Notify the oldest live waiter not notified (not `skip`): its `notified` 0 -> 1 by
    CAS, for a waiter leaving without the guard takes its own 0 -> TB_N_GONE (the loser
    of the two tries the next waiter). Journaled (tb_cas) in a change under the guard;
    a plain CAS for a waiter passing its notification on without the guard. The waiter
    notified, or -1."""
    cdef int y
    cdef uint32_t* p
    while True:
        y = _cv_oldest(rm, b, skip)
        if y < 0:
            return -1
        p = &shm_tb_rec(b, y).notified
        if journal:
            if tb_cas(b, p, 0, 1):
                return y
        elif cmpxchg32(p, 0, 1) == 0:
            return y


cdef void _cv_reap(shm_body* b) noexcept nogil:
    """Guard held: drop the records of the waiters that left without it ([N5],
    _cv_depart; each passed its notification on itself if it had to)."""
    cdef shm_tbrec* r
    cdef uint32_t x, g
    if not tb_gone_any(b):
        return
    for x in range(body_hwm(b)):
        r = shm_tb_rec(b, x)
        g = ld32_acq(&r.gone)
        if g != TB_GONE_DROP and g != TB_GONE_USED and g != TB_GONE_PASS:
            continue
        if r.ticket != 0:
            tb_set(b, &r.ticket, 0)
            tb_set(b, &r.notified, 0)
        tb_set(b, &r.gone, 0)


cdef int _cv_depart(rmap_t* rm, shm_body* b, uint32_t me, bint passing,
                    bint sig) noexcept nogil:
    """[N5] A waiter that has its lock back but not the guard by its deadline (or a
    signal handler raised: `sig`) leaves without it: it takes its `notified` 0 ->
    TB_N_GONE (so no notify picks it any more) or finds it notified; passing (it leaves
    by an exception), it hands that notification on itself; its record says it left, and
    the next guard holder drops it (_cv_reap). 1 notified, 0 not, R_SIGNAL (`sig`)."""
    cdef uint32_t v = cmpxchg32(&shm_tb_rec(b, me).notified, 0, TB_N_GONE)
    cdef bint was = v == 1
    cdef int y = -1
    if was and passing:
        y = _cv_give(rm, b, me, 0)
    tb_gone(b, me, TB_GONE_PASS if (was and passing) else
            (TB_GONE_USED if was else TB_GONE_DROP))
    if y >= 0:
        _cv_wake(b, y)
    if not was or y >= 0:
        _cv_poke_oldest(rm, b, me)              # the oldest may be someone else now
    if sig:
        return R_SIGNAL
    return 1 if (was and not passing) else 0


cdef int _cv_enter(rmap_t* rm, shm_body* b, uint32_t me, int64_t deadline) noexcept nogil:
    """Take a ticket (the caller holds the user's lock): R_ACQ, or R_TIMEOUT, R_SIGNAL,
    R_CORRUPT with no ticket taken (the guard not had by the wait's deadline)."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* r = shm_tb_rec(b, me)
    cdef uint32_t t
    cdef int g = tb_guard(rm, b, deadline, 1)
    if g != R_ACQ:
        return g
    _cv_reap(b)
    t = w.value
    if t == 0:
        t = 1
    tb_set(b, &w.value, t + 1)
    tb_set(b, &r.notified, 0)
    tb_set(b, &r.ticket, t)
    tb_unlock(b)
    return R_ACQ


cdef int _cv_sleep(rmap_t* rm, shm_body* b, uint32_t me, int64_t deadline,
                   int64_t* slept) noexcept nogil:
    """Until notified: R_ACQ, R_TIMEOUT, R_SIGNAL (recoveries it runs keep its deadline)."""
    cdef shm_tbrec* mine = shm_tb_rec(b, me)
    cdef shm_tbrec* r
    cdef tb_watch_t t
    cdef uint32_t x, pk
    cdef int rc
    cdef bint changed
    while True:
        if ld32_seq(&mine.notified):
            return R_ACQ
        if deadline == 0:
            return R_TIMEOUT
        pk = ld32_seq(&mine.poke)               # before the look at whom to watch
        tb_watch_init(&t, &mine.notified, 0, deadline)
        tb_watch_word(&t, &mine.poke, pk)
        changed = 0
        for x in range(body_hwm(b)):
            r = shm_tb_rec(b, x)
            if x != me and ld32_acq(&r.ticket) != 0 and ld32_acq(&r.notified) != 0:
                if tb_watch(rm, &t, x) == DEP_CHANGED:
                    changed = 1                 # [N1] recovered here: look again
        if changed:
            continue
        st32_rlx(&mine.waiting, 1)
        rc = tb_asleep(rm, &t, &mine.parked, deadline, slept)
        st32_rlx(&mine.waiting, 0)
        if ld32_seq(&mine.notified):
            return R_ACQ
        if rc != R_CONT:
            return rc


cdef int _cv_leave(rmap_t* rm, shm_body* b, uint32_t me, bint passing,
                   int64_t deadline) noexcept nogil:
    """The waiter has the lock back: consume its record. 1 if it was notified, 0 if not,
    R_SIGNAL, R_CORRUPT. `passing`: it leaves by an exception, so a notification goes on
    ([N3]). The guard by the wait's deadline (Ctrl-C in the main thread); past it, it
    leaves without it ([N5] _cv_depart), so notify() never picks a waiter that has left."""
    cdef shm_tbrec* r = shm_tb_rec(b, me)
    cdef int y
    cdef uint32_t was
    cdef int g
    if passing:
        deadline = shm_now_ns()                 # leaving by an exception: at once (grace)
    g = tb_guard(rm, b, deadline, 1)
    if g != R_ACQ:
        if g == R_CORRUPT:
            return R_CORRUPT
        return _cv_depart(rm, b, me, passing, g == R_SIGNAL)
    _cv_reap(b)
    was = r.notified == 1
    if r.ticket != 0:
        tb_set(b, &r.ticket, 0)
        tb_set(b, &r.notified, 0)
    if was and passing:
        y = _cv_give(rm, b, me, 1)
        if y >= 0:
            tb_unlock(b)
            _cv_wake(b, y)
            return 0
    tb_unlock(b)
    if not was:
        _cv_poke_oldest(rm, b, me)              # the oldest may be someone else now
    return 1 if was else 0


cdef int _cv_notify(rmap_t* rm, shm_body* b, uint64_t n) noexcept nogil:
    """Notify the n oldest live waiters not yet notified (the caller holds the lock): 0,
    R_SIGNAL (a handler raised while it waited for the guard: nobody notified), R_CORRUPT."""
    cdef int x
    cdef uint64_t k = 0
    cdef int g = tb_guard(rm, b, -1, 1)
    if g != R_ACQ:
        return R_SIGNAL if g == R_SIGNAL else R_CORRUPT
    _cv_reap(b)
    while k < n:
        x = _cv_oldest(rm, b, 0xffffffff)
        if x < 0:
            break
        # (one store, not journaled: a notifier killed midway notified fewer; a CAS, for
        # a waiter leaving without the guard takes its own word 0 -> TB_N_GONE)
        if cmpxchg32(&shm_tb_rec(b, x).notified, 0, 1) != 0:
            continue
        _cv_wake(b, x)
        k += 1
    if k:
        _cv_poke_oldest(rm, b, 0xffffffff)      # watch the ones just notified
    tb_unlock(b)
    return 0


cdef void _cv_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """[N1] [N2] dead waiter q (repair mutex held)."""
    cdef shm_tbrec* r = shm_tb_rec(b, q)
    cdef int y = -1
    st32_rlx(&r.waiting, 0)
    if ld32_acq(&r.ticket) == 0:
        return
    if tb_recover_lock(rm, b, rec) != 0:
        return                                   # cut short: left pending
    _cv_reap(b)
    if r.ticket != 0:
        if r.notified == 1:
            y = _cv_give(rm, b, q, 1)            # [N1]
            if y >= 0:
                fadd32(&b.ctl.owner_deaths, 1)   # notifications passed on (stats)
        tb_set(b, &r.ticket, 0)                  # [N2]
        tb_set(b, &r.notified, 0)
    tb_unlock(b)
    if y >= 0:
        _cv_wake(b, y)
        _cv_poke_oldest(rm, b, q)


cdef _cv_ref_of(lock):
    """(how, region name, lock name) for a Condition's lock."""
    how = 0
    inner = lock
    if isinstance(lock, _rlock_class()):
        how = TB_REF_RLOCK
        inner = lock.lock
    if not isinstance(inner, _Lock):
        return (TB_REF_NONE, b"", b"")
    if (<_Lock>inner)._standalone:
        return (how | TB_REF_STANDALONE, inner.region.name.encode(), b"")
    return (how | TB_REF_IN_REGION, inner.region.name.encode(), inner.name.encode())


cdef object _cv_lock_of(shm_body* b, name):
    """Open the lock a Condition's body names."""
    cdef shm_tbref* ref = shm_tb_ref(b)
    cdef uint32_t how = ld32_acq(&ref.how)
    region = ref.region[:strnlen(ref.region, 247)].decode("utf-8", "replace")
    lname = ref.lock[:strnlen(ref.lock, SHM_NAME_MAX - 1)].decode("utf-8", "replace")
    if how & 0xff == TB_REF_STANDALONE:
        lk = _Lock.open(region)
    elif how & 0xff == TB_REF_IN_REGION:
        lk = Region.open(region).open_lock(lname)
    else:
        raise ValueError(f"condition {name!r} was made with a lock that is not a shmlocks "
                         "lock: it cannot be opened by another process")
    if how & TB_REF_RLOCK:
        return _rlock_class()._wrap(lk)
    return lk


def _rlock_class():
    from shmlocks.rlock import RLock
    return RLock


def _cv_setup(lock):
    how, region, lname = _cv_ref_of(lock)
    if len(region) > 247 or len(lname) > SHM_NAME_MAX - 1:
        raise ValueError("the lock's names are too long")

    def setup(Region reg, uint32_t i):
        cdef shm_body b
        cdef shm_tbref* ref
        if reg.rm.P < 4:
            raise ValueError("a Condition needs max_participants >= 4")
        b = shm_body_at(reg.rm.base, reg.rm.locks_off + i * reg.rm.stride, reg.rm.P, i)
        ref = shm_tb_ref(&b)
        ref.how = how
        memcpy(ref.region, <const char*>region, len(region))
        memcpy(ref.lock, <const char*>lname, len(lname))
    return setup


cdef class Condition(_TbObject):
    """Condition(lock=None) -> a shared-memory ``threading.Condition`` on ``lock``.

    ``lock`` is any shmlocks lock or ``shmlocks.RLock`` (None: a new RLock); ``acquire``,
    ``release``, ``with``, ``wait(timeout=None)``, ``wait_for(predicate, timeout=None)``,
    ``notify(n=1)``, ``notify_all()`` are threading's, across processes. A waiter that
    dies while it waits never swallows a notification: ``notify(n)`` reaches n live
    waiters (one that was notified and died passes it on). ``create(lock=None,
    name=None, *, max_participants=None, mode=0o600, persist=False)``, ``open(name)`` (which
    opens its lock too), ``close()``, ``unlink()``; pickled with its lock."""
    kind_name = "condition"
    kind_code = SHM_KIND_CONDITION

    def __init__(self, lock=None, name=None, *, max_participants=None, mode=0o600,
                 persist=False):
        owns = lock is None
        if owns:
            lock = _rlock_class()(max_participants=max_participants, mode=mode)
        try:
            self._init_standalone(name, max_participants, mode, persist, _cv_setup(lock))
        except BaseException:
            if owns:
                lock.close()
            raise
        self._lock = lock
        self._owns_lock = owns

    @classmethod
    def create(cls, lock=None, name=None, *, max_participants=None, mode=0o600,
               persist=False):
        """A new Condition on ``lock`` (None: a new RLock) in a segment of its own."""
        return cls(lock, name, max_participants=max_participants, mode=mode, persist=persist)

    @classmethod
    def open_or_create(cls, name, lock=None, *, max_participants=None, mode=0o600,
                       persist=False):
        """Open condition ``name``, or create it (on ``lock``, None: a new RLock, with
        these arguments) if there is none: atomic, so that of any number of processes
        racing on one name, all end up with the same condition. With ``lock`` given, an
        existing condition must be on that lock (the same segment and entry, an RLock
        or not as it was made), else ValueError; with None it is on the lock it names.
        LockKindError if the segment holds something else."""
        _check_create_args(1, max_participants, mode)
        if lock is not None:
            _cv_setup(lock)                       # (the checks of the lock's names)

        def same(Condition o):
            if lock is None:
                return
            if _cv_ref_of(lock) != o._ref() or _cv_ref_of(lock)[0] == TB_REF_NONE:
                raise ValueError(f"condition {o._name!r} exists on another lock than "
                                 f"{lock!r}")
            o._lock = lock
            o._owns_lock = False
        return cls._open_or_create(name, lambda n: cls(lock, n,
                                                       max_participants=max_participants,
                                                       mode=mode, persist=persist), same)

    def _ref(self):
        """(how, region name, lock name) of the lock this condition's body names, as
        _cv_ref_of gives them for a lock object."""
        cdef shm_tbref* ref
        self._check()
        ref = shm_tb_ref(&self.b)
        how = ld32_acq(&ref.how)
        region = ref.region[:strnlen(ref.region, 247)]
        lname = ref.lock[:strnlen(ref.lock, SHM_NAME_MAX - 1)]
        return (how, region, lname)

    cdef object _the_lock(self):
        if self._lock is None:
            self._check()                        # (its name is read from the mapping)
            self._lock = _cv_lock_of(&self.b, self._name)
            self._owns_lock = True
        return self._lock

    @property
    def lock(self):
        """The lock this condition is used with."""
        self._check()
        return self._the_lock()

    def acquire(self, *args, **kwargs):
        """The lock's acquire(); ValueError once this Condition is closed."""
        self._check()
        return self._the_lock().acquire(*args, **kwargs)

    def release(self):
        """The lock's release() (a hold taken before close() is released after it)."""
        return self._the_lock().release()

    def __enter__(self):
        self._check()
        return self._the_lock().__enter__()

    def __exit__(self, *args):
        return self._the_lock().__exit__(*args)

    def _is_owned(self):
        lk = self._the_lock()
        if hasattr(lk, "_is_owned"):
            return lk._is_owned()
        if lk.acquire(False):                    # threading's test for a plain lock
            lk.release()
            return False
        return True

    def _release_save(self):
        lk = self._the_lock()
        if hasattr(lk, "_release_save"):
            return lk._release_save()
        lk.release()
        return None

    def _acquire_restore(self, state):
        lk = self._the_lock()
        if hasattr(lk, "_acquire_restore"):
            lk._acquire_restore(state)
        else:
            lk.acquire()

    def wait(self, timeout=None):
        """wait(timeout=None) -> bool

        Release the lock, sleep until notified (or ``timeout`` seconds), take the lock
        back: True if notified, False on timeout. RuntimeError if the calling thread does
        not hold the lock."""
        cdef int64_t deadline
        cdef reg_t* r
        cdef uint32_t me
        cdef int rc, got
        cdef int64_t slept = 0
        cdef bint passing = 1
        self._check()
        if not self._is_owned():
            raise RuntimeError("cannot wait on un-acquired lock")
        deadline = tb_deadline(timeout)
        r = self._me()
        me = r.slot
        with nogil:
            rc = _cv_enter(self.rm, &self.b, me, deadline)
        if rc == R_TIMEOUT:
            return False                         # no ticket, the lock never let go
        if rc == R_SIGNAL:
            return _raise_pending()
        if rc != R_ACQ:
            raise self._guard_error()
        saved = self._release_save()
        try:
            with nogil:
                rc = _cv_sleep(self.rm, &self.b, me, deadline, &slept)
            if rc == R_SIGNAL:
                _raise_pending()
            passing = 0
        finally:
            restored = False
            try:
                self._acquire_restore(saved)
                restored = True
            finally:
                # an exception while it takes the lock back (a handler's: Ctrl-C) leaves
                # by that exception too: a notification it had goes on ([N3])
                if not restored:
                    passing = 1
                with nogil:
                    got = _cv_leave(self.rm, &self.b, me, passing, deadline)
                if got == R_SIGNAL:
                    _raise_pending()
        if got < 0:
            raise self._guard_error()
        with nogil:
            tb_count(&self.b, got == 1, got == 0 and rc == R_TIMEOUT, slept)
        return got == 1

    def wait_for(self, predicate, timeout=None):
        """wait_for(predicate, timeout=None): wait until predicate() is true (checked with
        the lock held), at most ``timeout`` seconds; returns its last value."""
        endtime = None
        waittime = timeout
        result = predicate()
        while not result:
            if waittime is not None:
                if endtime is None:
                    endtime = _time.monotonic() + waittime
                else:
                    waittime = endtime - _time.monotonic()
                    if waittime <= 0:
                        break
            self.wait(waittime)
            result = predicate()
        return result

    def notify(self, n=1):
        """Wake up to ``n`` live waiters, oldest first. RuntimeError if the calling thread
        does not hold the lock."""
        cdef uint64_t nn
        cdef int rc
        self._check()
        if not self._is_owned():
            raise RuntimeError("cannot notify on un-acquired lock")
        if n <= 0:
            return
        nn = min(n, 0xffffffff)
        self._me()                               # its token keeps the mapping (tb_guard)
        with nogil:
            rc = _cv_notify(self.rm, &self.b, nn)
        if rc == R_SIGNAL:
            _raise_pending()
        if rc != 0:
            raise self._guard_error()

    def notify_all(self):
        """Wake every waiter."""
        self.notify(0xffffffff)

    notifyAll = notify_all

    def close(self):
        """Detach; a lock this object opened or made itself is closed too."""
        if not self._closed and self._owns_lock and self._lock is not None:
            self._lock.close()
        _TbObject.close(self)

    def __reduce__(self):
        self._check()
        return (_cv_open, (self._region.name, None if self._standalone else self._name,
                           self._the_lock()))

    def _state(self):
        return f"waiters={self._waiters()}"

    def __repr__(self):
        if self._closed or self.rm.closed:
            return f"<shmlocks.Condition at {id(self):#x}: closed>"
        return f"<shmlocks.Condition({self._lock!r}, {self._waiters()})>"


def _cv_open(region_name, name, lock):
    cdef Condition c
    if name is None:
        c = Condition.open(region_name)
    else:
        c = Region.open(region_name).open_object(name)
    c._lock = lock
    c._owns_lock = False
    return c


def _cv_create_in(Region region, name, lock):
    c = Condition._new_in(region, name, _cv_setup(lock))
    c._lock = lock
    return c


_register_object(Condition, tb_init, _cv_recover, 1)
g_tb_api["create_condition"] = _cv_create_in
g_tb_api["rlock"] = lambda lock: _rlock_class()._wrap(lock)
