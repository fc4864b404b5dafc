# semaphore.pxi -- threading.Semaphore and BoundedSemaphore in shared memory, whose units
# taken by `with` come back when their holder dies (docs/design.md §12).
#
# Invariant (under the guard, toolbox.pxi): value + sum(rec[p].units over live and dead
# participants p) + the units taken by bare acquire() and not released = what was created
# and released. A `with` take moves one unit from `value` to the taker's record in one
# journaled change; its exit moves it back, only ever from the exiting thread's record: a
# thread whose record holds none (it leaves a block its parent entered before a fork(),
# or one entered on another thread) releases nothing, since the unit is still its
# taker's, given back at the taker's exit or death (releasing it would make a unit); a
# bare acquire()/release() moves units between `value` and nobody (threading's ownerless
# semantics: one process may acquire, another release). So a participant's record is
# exactly the units it holds with `with`:
#   [S1] it died (any point outside the guard): its recoverer adds rec.units to value,
#        zeroes them, and wakes waiters;
#   [S2] it died holding the guard: the next guard taker undoes its change (tb_undo): a
#        take or a release that never returned did not happen.
# A waiter sleeps on seq (bumped by every release and [S1]) and on the tokens of the
# participants that hold units with `with` (up to SHM_WAITV_MAX - 1, else in slices):
# a holder's death wakes it, and it recovers the holder ([S1]) before looking again.
# `limit` is a bounded semaphore's initial value: release() past it is ValueError.

cdef bint _sem_holds(shm_body* b, uint32_t x) noexcept nogil:
    return ld32_acq(&shm_tb_rec(b, x).units) != 0


cdef inline bint _sem_take(shm_body* b, uint32_t me, bint owned) noexcept nogil:
    """Guard held: take a unit if there is one."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* r
    if w.value == 0:
        return 0
    tb_set(b, &w.value, w.value - 1)
    if owned:
        r = shm_tb_rec(b, me)
        tb_set(b, &r.units, r.units + 1)
    return 1


cdef int _sem_acquire(rmap_t* rm, shm_body* b, uint32_t me, bint owned,
                      int64_t deadline, int64_t* slept) noexcept nogil:
    """R_ACQ, R_TIMEOUT, R_SIGNAL or R_CORRUPT (recoveries it runs keep its deadline)."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* mine = shm_tb_rec(b, me)
    cdef uint32_t x, s
    cdef int r, d
    cdef bint changed, last = 0
    cdef tb_watch_t t
    cdef recov_t rec
    if True:
        while True:
            r = tb_guard(rm, b, deadline, 1)
            if r != R_ACQ:
                return r                       # R_TIMEOUT, R_SIGNAL, R_CORRUPT: nothing taken
            if _sem_take(b, me, owned):
                tb_unlock(b)
                return R_ACQ
            s = ld32_rlx(&w.seq)
            tb_unlock(b)
            if deadline == 0 or last:
                # about to fail: units held by the dead come back first ([S1])
                recov_init(&rec, deadline)
                if not last and tb_sweep(rm, b, _sem_holds, me, &rec):
                    if rec.sig:
                        return R_SIGNAL
                    last = 1
                    continue
                return R_TIMEOUT
            tb_watch_init(&t, &w.seq, s, deadline)
            changed = 0
            for x in range(body_hwm(b)):
                if x != me and _sem_holds(b, x):
                    d = tb_watch(rm, &t, x)
                    if d == DEP_CHANGED:
                        changed = 1
            if changed:
                continue
            st32_rlx(&mine.waiting, 1)
            r = tb_asleep(rm, &t, &w.parked, deadline, slept)
            st32_rlx(&mine.waiting, 0)
            if r == R_SIGNAL:
                if ld32_seq(&w.value) != 0:
                    tb_wake(b, 1)              # a unit meant for us goes to someone else
                return r
            if r == R_TIMEOUT:
                last = 1                       # one last look, as threading's does


cdef enum:
    SEM_OVERFLOW = -5   # _sem_release: the value would pass 2**31-1 (nothing released)
    SEM_NOTHELD = -6    # _sem_release: a `with` exit by a thread whose record holds no unit


cdef int _sem_release(rmap_t* rm, shm_body* b, uint32_t me, uint32_t n,
                      bint owned) noexcept nogil:
    """0, R_BOUND (past a bounded semaphore's initial value), SEM_OVERFLOW (past
    2**31-1), SEM_NOTHELD (`owned`: our record holds no unit, nothing released),
    R_SIGNAL (a handler raised while it waited for the guard: nothing released) or
    R_CORRUPT (the guard)."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* r = shm_tb_rec(b, me)
    cdef int g = tb_guard(rm, b, -1, 1)
    if g != R_ACQ:
        return R_SIGNAL if g == R_SIGNAL else R_CORRUPT
    if owned and r.units == 0:
        tb_unlock(b)                   # not ours: its taker's record holds it
        return SEM_NOTHELD
    if w.flags & TB_F_BOUNDED and <uint64_t>w.value + n > w.limit:
        tb_unlock(b)
        return R_BOUND
    if <uint64_t>w.value + n > 0x7fffffff:
        tb_unlock(b)
        return SEM_OVERFLOW
    if owned:
        tb_set(b, &r.units, r.units - 1)
    tb_set(b, &w.value, w.value + n)
    tb_bump(b, n)
    tb_unlock(b)
    tb_wake(b, <int>n)
    return 0


cdef void _sem_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """[S1] dead participant q: its `with` units come back (repair mutex held)."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* r = shm_tb_rec(b, q)
    cdef uint32_t u
    st32_rlx(&r.waiting, 0)
    if ld32_acq(&r.units) == 0:
        return
    if tb_recover_lock(rm, b, rec) != 0:
        return                                   # cut short: left pending
    u = r.units
    if u != 0:
        tb_set(b, &r.units, 0)
        tb_set(b, &w.value, w.value + u)
        tb_bump(b, u)
        fadd32(&b.ctl.owner_deaths, <uint32_t>u)   # units given back (stats)
    tb_unlock(b)
    if u:
        tb_wake(b, <int>u)


cdef class Semaphore(_TbObject):
    """Semaphore(value=1) -> a shared-memory ``threading.Semaphore``.

    ``acquire(blocking=True, timeout=None)`` and ``release(n=1)`` are threading's, and
    ownerless: one process may acquire and another release (signalling). A unit taken by
    ``with sem:`` is the taking thread's: if its process dies inside the block, the unit
    comes back (the next waiter, or the next call that would fail for want of it, finds
    the death and recovers it). ``create(value=1, name=None, *, max_participants=None,
    mode=0o600, persist=False)``, ``open(name)``, ``close()``, ``unlink()`` as for locks."""
    kind_name = "semaphore"
    kind_code = SHM_KIND_SEMAPHORE
    _bounded = False

    @classmethod
    def _pick(cls, uint32_t flags):
        return BoundedSemaphore if flags & TB_F_BOUNDED else Semaphore

    def __init__(self, value=1, name=None, *, max_participants=None, mode=0o600,
                 persist=False):
        self._init_standalone(name, max_participants, mode, persist,
                              _sem_setup(type(self), value))

    @classmethod
    def create(cls, value=1, name=None, *, max_participants=None, mode=0o600, persist=False):
        """A new semaphore of ``value`` units in a segment of its own (the same as
        calling the class)."""
        return cls(value, name, max_participants=max_participants, mode=mode,
                   persist=persist)

    @classmethod
    def open_or_create(cls, name, value=1, *, max_participants=None, mode=0o600,
                       persist=False):
        """Open semaphore ``name``, or create it (``value`` units, with these arguments)
        if there is none: atomic, so that of any number of processes racing on one name,
        all end up with the same semaphore. An existing one keeps the units its users
        left it (``value`` is its initial value only); a BoundedSemaphore's bound is what
        it is, so another ``value`` there is ValueError. LockKindError if the segment
        holds something else (a BoundedSemaphore for Semaphore, and the reverse)."""
        _check_create_args(1, max_participants, mode)
        _sem_setup(cls, value)                    # (the checks of value)

        def same(Semaphore o):
            cdef uint32_t bound = ld32_acq(&shm_tb_word(&o.b).limit)
            if cls._bounded and bound != value:
                raise ValueError(f"bounded semaphore {o._name!r} exists with a bound of "
                                 f"{bound}, not {value}")
        return cls._open_or_create(name, lambda n: cls(value, n,
                                                       max_participants=max_participants,
                                                       mode=mode, persist=persist), same)

    def acquire(self, blocking=True, timeout=None):
        """acquire(blocking=True, timeout=None) -> bool

        Take a unit, as ``threading.Semaphore.acquire``: wait for one if there is none
        (at most ``timeout`` seconds); False on timeout, or at once if ``blocking`` is
        False. ValueError for a timeout with ``blocking=False``."""
        return self._acquire(blocking, timeout, 0)

    cdef object _acquire(self, blocking, timeout, bint owned):
        cdef int64_t deadline
        cdef int64_t slept = 0
        cdef reg_t* r
        cdef int rc
        if not blocking and timeout is not None:
            raise ValueError("can't specify timeout for non-blocking acquire")
        deadline = tb_deadline(timeout) if blocking else 0
        r = self._me()
        with nogil:
            rc = _sem_acquire(self.rm, &self.b, r.slot, owned, deadline, &slept)
            tb_count(&self.b, rc == R_ACQ, rc == R_TIMEOUT and deadline != 0, slept)
        if rc == R_ACQ:
            if owned:
                r.held += 1                      # the thread keeps its slot (and the
            return True                          # mapping) while it holds units
        if rc == R_SIGNAL:
            return _raise_pending()
        if rc == R_CORRUPT:
            raise self._guard_error()
        return False

    def release(self, n=1):
        """Give back ``n`` units (any thread, any process), waking up to ``n`` waiters.
        ValueError if n < 1, or (BoundedSemaphore) past the initial value; OverflowError
        if the value would exceed 2**31-1 (nothing released)."""
        if n < 1:
            raise ValueError("n must be one or more")
        self._release(n, 0)

    cdef int _release(self, n, bint owned) except -1:
        cdef reg_t* r = self._me()
        cdef uint32_t nn
        cdef int rc
        if n > 0x7fffffff:
            raise OverflowError("n is too large")
        nn = n
        with nogil:
            rc = _sem_release(self.rm, &self.b, r.slot, nn, owned)
        if rc == R_SIGNAL:
            return _raise_pending()
        if rc == R_BOUND:
            raise ValueError("Semaphore released too many times")
        if rc == SEM_OVERFLOW:
            raise OverflowError("semaphore value would exceed 2**31-1")
        if rc == R_CORRUPT:
            raise self._guard_error()
        if rc == SEM_NOTHELD:
            return 0                             # (r.held mirrors our record: unchanged)
        if owned and r.held > 0:
            r.held -= 1
        return 0

    def __enter__(self):
        """Take a unit that is this thread's: given back if its process dies in the
        block."""
        self._acquire(True, None, 1)
        return True

    def __exit__(self, t, v, tb):
        """Give back the unit this thread took. A thread that holds none here releases
        nothing: a fork() child leaving a block its parent entered (the unit is the
        parent's, which gives it back at its own exit), or a thread leaving a block
        entered on another thread (the unit stays the taker's until it ends)."""
        self._release(1, 1)
        return False

    @property
    def value(self):
        """The free units now (a snapshot)."""
        self._check()
        return ld32_acq(&shm_tb_word(&self.b).value)

    def _state(self):
        w = shm_tb_word(&self.b)
        if w.flags & TB_F_BOUNDED:
            return f"value={w.value}/{w.limit}"
        return f"value={w.value}"

    def _describe(self):
        """As _TbObject's, plus ``holders``: the participants (alive, or dead and not yet
        recovered) holding units taken with ``with``, each with its ``units``."""
        cdef uint32_t i, u
        d = _TbObject._describe(self)
        holders = []
        for i in range(body_hwm(&self.b)):
            u = ld32_acq(&shm_tb_rec(&self.b, i).units)
            if u != 0 and participant_state(self.rm, i) != 0:
                h = self._part(i)
                h["units"] = u
                holders.append(h)
        d["holders"] = holders
        return d

    def stats(self):
        """``value`` (free units), ``held_with`` (units held by `with` blocks, by live or
        not yet recovered participants) and ``recovered`` (units given back after their
        holder died)."""
        cdef uint32_t i
        cdef uint64_t held = 0
        self._check()
        for i in range(body_hwm(&self.b)):
            held += ld32_acq(&shm_tb_rec(&self.b, i).units)
        return {"value": ld32_acq(&shm_tb_word(&self.b).value), "held_with": held,
                "recovered": ld32_acq(&self.b.ctl.owner_deaths)}

    def __repr__(self):
        st = "closed" if (self._closed or self.rm.closed) else self._state()
        return f"<shmlocks.{type(self).__name__} at {id(self):#x}: {st}>"


cdef class BoundedSemaphore(Semaphore):
    """BoundedSemaphore(value=1) -> a shared-memory ``threading.BoundedSemaphore``: a
    Semaphore whose release() past the initial value raises ValueError."""
    _bounded = True


def _sem_setup(cls, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"semaphore value must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError("semaphore initial value must be >= 0")
    if value > 0x7fffffff:
        raise OverflowError("semaphore initial value is too large")
    bounded = cls._bounded

    def setup(Region region, uint32_t i):
        cdef shm_body b = shm_body_at(region.rm.base, region.rm.locks_off + i * region.rm.stride,
                                      region.rm.P, i)
        cdef shm_tbword* w = shm_tb_word(&b)
        w.value = value
        w.limit = value
        w.flags = TB_F_BOUNDED if bounded else 0
    return setup


def _sem_create_in(Region region, name, value, bounded):
    cls = BoundedSemaphore if bounded else Semaphore
    return cls._new_in(region, name, _sem_setup(cls, value))


_register_object(Semaphore, tb_init, _sem_recover, 1)
g_tb_api["create_semaphore"] = _sem_create_in
