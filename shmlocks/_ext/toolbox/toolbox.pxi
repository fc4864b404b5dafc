# toolbox.pxi -- what the synchronization toolbox's objects share (docs/design.md §12):
# Event, Semaphore, BoundedSemaphore, Barrier and Condition live in a region's directory
# beside its locks, each with its own kind code (shm_toolbox.h), and a dead participant's
# part in them is undone by the participant-recovery driver that recovers locks
# (participants.pxi _participant_recover, through the kind-ops table).
#
# Invariant: an object's shared state (word A, shm_tbword, and the participants' records,
# shm_tbrec) changes only under its guard, a robust pthread mutex (word B), and every
# change of more than one word is journaled (tb_set: the word's offset and old value,
# then the store), so the state is always either before or after a whole change:
#   - a thread killed holding the guard leaves the journal; the next thread to take the
#     guard gets EOWNERDEAD and undoes the change (tb_undo), which its maker never saw
#     return, before anything reads the state;
#   - a participant killed at any other point has a record that says exactly what it had
#     (units, being inside a barrier, a condition ticket): the recoverer that takes its
#     token gives those back, under the guard (each object's *_recover).
# Waiting: nobody sleeps holding the guard. A waiter reads what it waits on under the
# guard (the futex word's value), lets go, announces itself (parked), and sleeps in one
# futex_waitv on that word and on the liveness tokens of the participants whose death
# would change what it waits for (tb_watch, up to SHM_WAITV_MAX - 1 of them): their death
# wakes it and it recovers them (participant_try_recover). The waker changes the state,
# changes the word, lets go of the guard, then wakes if parked != 0. With more tokens to
# watch than one futex_waitv takes, the tokens past them go to the thread's list
# (shm_uring.h shm_many) and the sleep is several io_uring FUTEX_WAITV at once, until the
# first completion (wait_sleep_many); without io_uring (AIO_MODE "thread"), or no
# futex_waitv, it sleeps a PARK_SLICE_NS slice and looks again.


cdef int64_t TB_GUARD_SLICE_NS = 50000000    # 50 ms: Ctrl-C within 100 ms (tb_guard)
cdef int64_t TB_GUARD_GRACE_NS = 20000000    # the least a call waits for a held guard


# ---- the guard and its journal ----

cdef void tb_undo(shm_body* b) noexcept nogil:
    """A thread died holding the guard: put back every word its change had journaled,
    newest first. Offsets come from shared memory: only word A and the records of the
    participants provisioned are ever written back, each offset checked."""
    cdef shm_tbjournal* j = shm_tb_journal(b)
    cdef uint32_t n = ld32_acq(&j.n)
    cdef uint32_t off
    cdef uint64_t lo_rec = (SHM_BODY_NODES + <uint64_t>b.P + 1) * SHM_LINE
    cdef uint64_t hi = lo_rec + <uint64_t>body_hwm(b) * SHM_LINE
    if n > TB_JMAX:
        n = TB_JMAX
    while n > 0:
        n -= 1
        off = j.e[n].off
        if off % 4 != 0:
            continue
        if ((SHM_LINE <= off and off + 4 <= 2 * SHM_LINE)
                or (lo_rec <= off and off + 4 <= hi)):
            st32_seq(<uint32_t*>(<char*>b.ctl + off), j.e[n].old)
    st32_seq(&j.n, 0)


cdef int tb_got(shm_body* b, int rc) noexcept nogil:
    """The guard's lock call returned rc: after its holder's death, undo its change first.
    0 (held), or the error."""
    cdef pthread_mutex_t* m = shm_tb_guard(b)
    if rc == EOWNERDEAD:
        tb_undo(b)
        pm_consistent(m, 0)
        fadd32(&shm_tb_word(b).gone, 1)    # the records of waiters that left: look again
        rc = 0
    elif rc == 0 and ld32_acq(&shm_tb_journal(b).n) != 0:
        tb_undo(b)                         # (a guard made consistent by a recoverer that died)
    return rc


cdef bint tb_stray(rmap_t* rm, shm_body* b, uint32_t* seen) noexcept nogil:
    """A wait for the guard ran a whole slice: is its owner a thread that holds no token
    of the region? Only a participant takes a guard (every call registers first; a
    recoverer holds the dead participant's token), so such an owner is in no change and
    will never let go: bytes scribbled into the word, or a segment copied while a guard
    was held; or naming the calling thread itself, which waits for it and so cannot be
    in a change. It must be seen twice in a row, a slice apart, naming the same thread (a
    thread that lets go and leaves the region between the two loads is no stray). One
    pass over the participants' tokens a slice (tb_guard, tb_lock): 1 once seen twice."""
    cdef uint32_t v = ld32_acq(<uint32_t*>shm_tb_guard(b)) & FUTEX_TID_MASK_
    cdef uint32_t i
    if v == 0:
        seen[0] = 0
        return 0
    if v != (<uint32_t>shm_gettid() & FUTEX_TID_MASK_):
        for i in range(rmap_hwm(rm)):
            if (ld32_acq(<uint32_t*>&rm.part[i].token.m) & FUTEX_TID_MASK_) == v:
                seen[0] = 0
                return 0
    if seen[0] == v:
        return 1
    seen[0] = v
    return 0


cdef int tb_lock(rmap_t* rm, shm_body* b, int64_t until) noexcept nogil:
    """Take the object's guard by `until` (-1: no end): 0, ETIMEDOUT, or an error (a
    mutex that is not one of ours, or held by no participant: tb_stray). After its
    holder's death, undo its change first. Runs no signal handler: recovery's
    (tb_recover_lock); the calls use tb_guard."""
    cdef pthread_mutex_t* m = shm_tb_guard(b)
    cdef int rc = pm_trylock(m, 0)
    cdef int64_t end
    cdef timespec ts
    cdef uint32_t seen = 0
    while rc == EBUSY:
        end = shm_now_ns() + TB_GUARD_SLICE_NS
        if 0 <= until < end:
            end = until
        ts = shm_ts_of_ns(end)
        rc = pm_clocklock(m, 0, &ts)
        if rc == ETIMEDOUT:
            if 0 <= until <= shm_now_ns():
                return ETIMEDOUT
            if tb_stray(rm, b, &seen):
                return SHM_PM_CORRUPT
            rc = EBUSY
    return tb_got(b, rc)


cdef int tb_guard(rmap_t* rm, shm_body* b, int64_t until, bint sig) noexcept nogil:
    """Take the object's guard for a call whose own deadline is `until` (-1: none; 0: a
    non-blocking call): R_ACQ (held), R_TIMEOUT, R_SIGNAL, R_CORRUPT; nothing is changed
    unless R_ACQ. A guard is held for a few stores, but its holder may be stopped (Ctrl-Z,
    a debugger) or the word scribbled: the wait gives up at `until`, never sooner than
    TB_GUARD_GRACE_NS after it began (a holder preempted mid-change is no reason to fail
    a call), and, with `sig`, the main thread runs Python's handlers every
    TB_GUARD_SLICE_NS (R_SIGNAL if one raised: Ctrl-C within 100 ms). An owner that is
    no participant of the region (tb_stray: it will never let go) is R_CORRUPT after two
    slices, whatever `until`: so no wait for a guard lasts for ever on foreign bytes.
    The caller is a participant of rm (registered: its token keeps the mapping)."""
    cdef pthread_mutex_t* m = shm_tb_guard(b)
    cdef int rc = pm_trylock(m, 0)
    cdef int64_t end, now
    cdef timespec ts
    cdef bint main
    cdef uint32_t seen = 0
    cdef wait_t ws                       # (for wait_signals: no region to hide, rm NULL)
    if rc == EBUSY:
        wait_init(&ws, until)
        main = sig and PyThread_get_thread_ident() == g_main_ident
        now = shm_now_ns()
        if 0 <= until < now + TB_GUARD_GRACE_NS:
            until = now + TB_GUARD_GRACE_NS
        while rc == EBUSY:
            end = shm_now_ns() + TB_GUARD_SLICE_NS
            if 0 <= until < end:
                end = until
            ts = shm_ts_of_ns(end)
            rc = pm_clocklock(m, 0, &ts)
            if rc == ETIMEDOUT:
                if main and wait_signals(&ws):
                    return R_SIGNAL
                if 0 <= until <= shm_now_ns():
                    return R_TIMEOUT
                if tb_stray(rm, b, &seen):
                    return R_CORRUPT
                rc = EBUSY
    return R_ACQ if tb_got(b, rc) == 0 else R_CORRUPT


cdef void tb_init(shm_body* b) noexcept nogil:
    _robust_mutex_init(shm_tb_guard(b), 0)


# ---- sleeping on a word and on participants' lives ----


cdef int tb_watch(rmap_t* rm, tb_watch_t* t, uint32_t slot) noexcept nogil:
    """Also sleep until participant `slot` dies. DEP_ARMED (watched, or nothing to watch: a
    free slot); DEP_CHANGED: it is dead, and recovered here (never call this holding a
    guard: the recovery takes them); DEP_UNKNOWN (t.full: sleep a slice, then look again):
    the set is full, or it is dead and stays so whatever we do (a quarantined slot, a
    scribbled token). Callers loop on DEP_CHANGED without a look at the clock, so it
    must mean that something changed: else a dead slot nobody can recover would keep the
    waiter spinning past its deadline (the segment fuzzer found such a Barrier.wait)."""
    cdef watch_t* ws = &t.ws
    cdef uint32_t* tw
    cdef uint32_t v, seen
    if slot >= rmap_hwm(rm):
        return DEP_ARMED
    tw = <uint32_t*>&rm.part[slot].token.m
    v = ld32_seq(tw)
    while True:
        if (v & FUTEX_OWNER_DIED_) or ((v & FUTEX_TID_MASK_) == 0
                                       and ld32_acq(&rm.part[slot].pending)):
            participant_try_recover(rm, slot, &t.rec)
            if t.rec.sig:
                return R_SIGNAL
            if participant_state(rm, slot) == 2 and ld32_seq(tw) == v:
                t.full = 1                       # no progress: a slice, by the deadline
                return DEP_UNKNOWN
            return DEP_CHANGED
        if (v & FUTEX_TID_MASK_) == 0:
            return DEP_ARMED                     # it left: nothing to wait for
        if ws.n >= SHM_WAITV_MAX and not tb_more(t):
            t.full = 1
            return DEP_UNKNOWN
        if v & FUTEX_WAITERS_:
            break
        seen = cmpxchg32(tw, v, v | FUTEX_WAITERS_)
        if seen == v:
            v = v | FUTEX_WAITERS_
            break
        v = seen
    if ws.n >= SHM_WAITV_MAX:                    # past one futex_waitv: the thread's list
        if shm_many_add(t.more, tw, v, slot) != 0:
            t.full = 1
            return DEP_UNKNOWN
        return DEP_ARMED
    if ws.token < 0:
        ws.token = ws.n                          # the one our robust list names (wait.pxi)
    t.slots[ws.n] = slot
    watch_word(ws, tw, v)
    return DEP_ARMED


cdef bint tb_more(tb_watch_t* t) noexcept nogil:
    """Room for tokens past the watch set's SHM_WAITV_MAX words: the thread's list,
    claimed for this sleep (io_uring only: AIO_MODE "io_uring"). 0: sleep in slices."""
    if not g_aio_uring or not g_wait_waitv:
        return 0
    if t.more == NULL:
        t.more = shm_many_claim(&t.more_gen)
        if t.more == NULL:
            return 0
    return shm_many_gen(t.more) == t.more_gen


cdef int tb_sleep(rmap_t* rm, tb_watch_t* t, uint32_t* parked, int64_t deadline) noexcept nogil:
    """One sleep on t's words until one changes, a watched participant dies, the deadline,
    or (main thread) a signal: R_CONT (look again), R_TIMEOUT, R_SIGNAL. The sleep is the
    wait policy's (wait.pxi wait_sleep: the signals before it and on EINTR, a slice when
    the set is full or futex_waitv missing). A death seen on waking is recovered here,
    which wakes everyone else who watched it."""
    cdef wait_t w                                # (no region to hide: w.rm NULL)
    wait_init(&w, deadline)
    return tb_sleep_w(rm, t, parked, &w)


cdef int tb_sleep_w(rmap_t* rm, tb_watch_t* t, uint32_t* parked, wait_t* w) noexcept nogil:
    """tb_sleep for a wait that lasts over many sleeps: the caller's `w` gives the
    deadline (w.deadline), the region whose participant is hidden while Python code runs
    (w.rm) and, once dl_arm armed it, the deadlock chain walk (deadlock.pxi), made before
    the sleep when due (wait.pxi wait_walk: the sleep watches the poke word too):
    R_TIMEOUT with w.dl_hit set for a cycle's victim."""
    cdef watch_t* ws = &t.ws
    cdef int r, i
    cdef int n0 = t.ws.n                         # the words whose slots t knows
    cdef int64_t now
    cdef uint32_t s
    # the tokens past ws's, in the thread's list: still this sleep's (a handler's own
    # sleep, run inside this one, may have taken the list over: then slices)
    cdef bint many = t.more != NULL and shm_many_count(t.more) > 0
    cdef bint mine = many and shm_many_gen(t.more) == t.more_gen
    if t.rec.sig:                                # a handler raised in a recovery of tb_watch
        return R_SIGNAL
    fadd32(parked, 1)                            # announce (SC), then re-check the word
    if ld32_seq(ws.words[0]) != ws.vals[0]:
        fsub32(parked, 1)
        return R_CONT
    if mine:
        r = wait_sleep_many(w, ws, t.more)
    else:
        r = wait_sleep(w, ws, t.full or not g_wait_waitv or many)
    fsub32(parked, 1)
    if r == R_SIGNAL or r == R_TIMEOUT:          # (R_TIMEOUT: a deadlock's victim)
        ws.n = n0
        return r
    for i in range(1, n0):
        if t.slots[i] < rmap_hwm(rm) and ld32_seq(ws.words[i]) & FUTEX_OWNER_DIED_:
            participant_try_recover(rm, t.slots[i], &t.rec)
            if t.rec.sig:
                return R_SIGNAL
    i = 0
    while mine and i < shm_many_count(t.more) and shm_many_gen(t.more) == t.more_gen:
        s = shm_many_word_slot(t.more, i)
        if s < rmap_hwm(rm) and ld32_seq(shm_many_word(t.more, i)) & FUTEX_OWNER_DIED_:
            participant_try_recover(rm, s, &t.rec)
            if t.rec.sig:
                return R_SIGNAL
        i += 1
    ws.n = n0                                    # (the poke word wait_sleep added)
    now = shm_now_ns()
    if w.deadline >= 0 and now >= w.deadline:
        return R_TIMEOUT
    return R_CONT


cdef int tb_asleep(rmap_t* rm, tb_watch_t* t, uint32_t* parked, int64_t deadline,
                   int64_t* slept) noexcept nogil:
    """tb_sleep, its time added to *slept (a call's time asleep: tb_count)."""
    cdef int64_t t0 = shm_now_ns()
    cdef int r = tb_sleep(rm, t, parked, deadline)
    slept[0] += shm_now_ns() - t0 + 1
    return r


cdef void tb_count(shm_body* b, bint got, bint timed_out, int64_t slept) noexcept nogil:
    """A wait call's end in the object's counters (its ctl line, as a lock's: `stat`,
    `top`; docs/design.md §12): `acquisitions` the calls that got what they waited for,
    `contended` and `wait_total_s`/`wait_max_s` those that slept and how long, `timeouts`.
    Atomic adds: an object has no holder to write them plainly (stats.pxd); never on a
    lock's path."""
    cdef shm_lockctl* c = b.ctl
    cdef uint64_t t = <uint64_t>slept if slept > 0 else 0
    cdef uint64_t m
    if got:
        fadd64(&c.acquisitions, 1)
    if timed_out:
        fadd32(&c.timeouts, 1)
    if slept > 0:
        fadd64(&c.contended, 1)
        fadd64(&c.wait_total_ns, t)
        m = ld64_rlx(&c.wait_max_ns)
        while t > m and not cas64(&c.wait_max_ns, m, t):
            m = ld64_rlx(&c.wait_max_ns)


cdef bint tb_sweep(rmap_t* rm, shm_body* b, bint (*has)(shm_body*, uint32_t) noexcept nogil,
                   uint32_t me, recov_t* rec) noexcept nogil:
    """Recover every dead participant that `has` a part in the object (a non-blocking call
    that would fail because of them), by rec's deadline. 1 if one was recovered (rec.sig: a
    handler raised, stop)."""
    cdef uint32_t x
    cdef bint any = 0
    for x in range(body_hwm(b)):
        if x != me and has(b, x) and participant_dead(rm, x):
            participant_try_recover(rm, x, rec)
            any = 1
            if rec.sig:
                break
    return any


# ---- timeouts, as threading takes them ----

cdef int64_t tb_deadline(timeout) except -2:
    """threading's timeout: None waits forever, <= 0 does not wait; a number beyond
    threading.TIMEOUT_MAX is OverflowError, NaN ValueError. -1 (forever), 0 (now), or an
    absolute CLOCK_MONOTONIC deadline in ns."""
    cdef double t
    if timeout is None:
        return -1
    if isinstance(timeout, (str, bytes)):
        raise TypeError(f"timeout must be a number, not {type(timeout).__name__}")
    t = PyFloat_AsDouble(timeout)
    if t != t:
        raise ValueError("timeout must not be NaN")
    if t <= 0:
        return 0
    if t > _TIMEOUT_MAX:
        raise OverflowError("timeout value is too large")
    if t >= _FOREVER_S:
        return -1
    return shm_now_ns() + <int64_t>(t * 1e9)


# ---- the Python base ----

cdef class _TbObject:
    """Base of the toolbox's shared-memory objects; not instantiated directly."""
    kind_name = None              # what `shmlocks inspect` shows as its kind
    kind_code = 0

    @classmethod
    def _pick(cls, uint32_t flags):
        """The class of an entry of this kind whose word A has these flags."""
        return cls

    @classmethod
    def _at(cls, Region region, uint32_t i, name=None):
        """The object of directory entry i of region (region.pxi _lock_at), as its stored
        type says."""
        cdef _TbObject o
        cdef shm_body b = shm_body_at(region.rm.base, region.rm.locks_off + i * region.rm.stride,
                                      region.rm.P, i)
        real = cls._pick(ld32_acq(&shm_tb_word(&b).flags))
        o = real.__new__(real)
        if name is None:
            d = &region.rm.dir[i]
            name = d.name[:strnlen(d.name, SHM_NAME_MAX - 1)].decode("utf-8", "replace")
        o._bind(region, i, name)
        return o

    cdef _bind(self, Region region, uint32_t i, name):
        cdef rmap_t* rm = region.rm
        cdef shm_body b = shm_body_at(rm.base, rm.locks_off + i * rm.stride, rm.P, i)
        if b.ctl.magic != SHM_BODY_MAGIC or b.ctl.kind != self.kind_code:
            raise CorruptRegionError(f"region {region.name!r}: {name!r} body does not "
                                     "match its directory entry")
        self._region = region
        self.rm = rm
        self.b = b
        self._name = name
        self._closed = False
        self._standalone = False

    def _init_standalone(self, name, max_participants, mode, persist, setup):
        """Make a segment holding just this object (its entry made, and set up, before
        the name exists) and bind to it."""
        region = Region._create(name, 1, max_participants, mode, persist, self.kind_code,
                                setup)
        self._bind(region, 0, region.name)
        self._standalone = True

    @classmethod
    def _new_in(cls, Region region, name, setup):
        i = region._create_entry(name, cls.kind_code, setup)
        return cls._at(region, i, name)

    @classmethod
    def open(cls, name):
        """Attach to an existing one (the one object of segment ``name``) from any process.
        LockKindError if the segment holds something else."""
        cdef _TbObject o
        region = Region.open(name)
        try:
            names = region.lock_names()
            if len(names) != 1:
                raise LockKindError(f"{region.name!r} holds {len(names)} objects, not a "
                                    f"single {cls.__name__}: open it with "
                                    f"shmlocks.Region.open({region.name!r}).open_object(name)")
            try:
                o = region.open_object(names[0])
            except LockKindError:
                raise LockKindError(f"{region.name!r} holds a lock, not "
                                    f"{_a(cls.__name__)}") from None
            if not isinstance(o, cls):
                raise LockKindError(f"{region.name!r} holds {_a(type(o).__name__)}, "
                                    f"not {_a(cls.__name__)}")
        except BaseException:
            region.close()
            raise
        o._standalone = True
        o._name = region.name
        return o

    @classmethod
    def _open_or_create(cls, name, make, same=None):
        """The loop of every toolbox class's open_or_create, a lock kind's (lockbase.pxi):
        make(n) creates the object in a segment of its own (FileExistsError if the name
        is taken), else it is opened; created or opened, by any number of racers, it is
        the one segment the name stands for. An object of another class (a
        BoundedSemaphore for Semaphore too) is LockKindError; same(o) raises (ValueError)
        if o is not what the caller's arguments say it must be (a Barrier's parties)."""
        cdef _TbObject o
        n = _check_name(name)
        deadline = _time.monotonic() + 5.0
        while True:
            try:
                return make(n)
            except FileExistsError:
                pass
            try:
                o = cls.open(n)
            except FileNotFoundError:              # its last user left meanwhile: again
                if _time.monotonic() > deadline:
                    raise
                continue
            try:
                if type(o) is not cls:
                    raise LockKindError(f"{n!r} holds {_a(type(o).__name__)}, "
                                        f"not {_a(cls.__name__)}")
                if same is not None:
                    same(o)
            except BaseException:
                o.close()
                raise
            return o

    cdef reg_t* _me(self) except NULL:
        cdef reg_t* r
        self._check()
        r = reg_lookup(self.rm)
        if r == NULL:
            r = reg_register(self.rm)
        return r

    cdef int _check(self) except -1:
        if self._closed or self.rm.closed:
            raise ValueError(f"{type(self).__name__} {self._name!r} is closed")
        return 0

    cdef int _guard(self) except -1:
        """Take the guard (with the GIL released while it waits; a Python signal handler
        that raises there ends the wait with its exception, the guard not taken). The
        thread registers first: its token keeps the mapping while it waits, whatever
        another thread closes (docs/design.md §2), and a guard's owner is always a
        participant (tb_stray)."""
        cdef int rc
        self._me()
        with nogil:
            rc = tb_guard(self.rm, &self.b, -1, 1)
        if rc == R_SIGNAL:
            return _raise_pending()
        if rc != R_ACQ:
            raise self._guard_error()
        return 0

    cdef object _guard_error(self):
        """The CorruptRegionError of a call that could not have the guard (R_CORRUPT):
        what its word says (the calling thread is registered: the mapping is there)."""
        cdef pthread_mutex_t* m = shm_tb_guard(&self.b)
        cdef uint32_t tid = ld32_acq(<uint32_t*>m) & FUTEX_TID_MASK_
        what = f"{self.kind_name} {self._name!r}"
        if not pm_kind_ok(m, 0):
            return CorruptRegionError(f"{what}: its guard is not a usable mutex (scribbled)")
        if tid != 0:
            return CorruptRegionError(
                f"{what}: its guard is held by thread {tid}, which is no participant of "
                "the region and so will never let it go (scribbled, or a copy of a "
                "segment made while the guard was held)")
        return CorruptRegionError(f"{what}: its guard is not a usable mutex")

    def _opened(self):
        """Called once this process has opened the object by name (Region.open_object)."""

    @property
    def name(self):
        return self._name

    @property
    def region(self):
        return self._region

    @property
    def kind(self):
        return self.kind_name

    def close(self):
        """Detach this object; one made by create()/open() also closes its segment."""
        if self._closed:
            return
        self._closed = True
        if self._standalone:
            self._region.close()

    def unlink(self):
        """Remove the segment's name now; mapped views go on working (ValueError once
        closed)."""
        self._check()
        self._region.unlink()

    def __reduce__(self):
        self._check()
        if self._standalone:
            return (_tb_open_standalone, (type(self), self._region.name))
        return (_tb_open_in_region, (self._region.name, self._name))

    def stats(self):
        """A snapshot of the object's state (its counters: _describe)."""
        self._check()
        return {}

    def reset_stats(self):
        self._check()

    cdef int _waiters(self) noexcept nogil:
        """Live participants whose record says they sleep in a wait here (a snapshot)."""
        cdef uint32_t i
        cdef int n = 0
        for i in range(body_hwm(&self.b)):
            if (ld32_acq(&shm_tb_rec(&self.b, i).waiting)
                    and participant_state(self.rm, i) == 1):
                n += 1
        return n

    def _state(self):
        return ""

    cdef dict _part(self, uint32_t i):
        """Participant i as Region._describe shows one."""
        cdef shm_participant* p = &self.rm.part[i]
        return {"slot": i, "pid": ld32_rlx(&p.pid), "tid": ld32_rlx(&p.tid),
                "alive": participant_state(self.rm, i) == 1,
                "other_namespace": other_pidns(ld64_acq(&p.pidns))}

    def _describe(self):
        """As a lock's _describe (inspect), plus ``state``: never held, no owner."""
        self._check()
        return {"name": self._name, "kind": self.kind_name, "locked": False, "holder": None,
                "waiters": self._waiters(), "owner_died": False, "not_recoverable": False,
                "stale_step": False, "state": self._state()}

    def _raw(self):
        cdef shm_tbword* w = shm_tb_word(&self.b)
        cdef uint32_t i
        cdef shm_tbrec* r
        self._check()
        recs = []
        for i in range(body_hwm(&self.b)):
            r = shm_tb_rec(&self.b, i)
            recs.append((r.units, r.inside, r.member, r.ticket, r.notified, r.waiting))
        return {"seq": w.seq, "parked": w.parked, "value": w.value, "limit": w.limit,
                "count": w.count, "cycle": w.cycle, "journal": shm_tb_journal(&self.b).n,
                "recs (units, inside, member, ticket, notified, waiting)": recs}


def _a(str noun):
    """The noun with its article: "a Semaphore", "an Event"."""
    return ("an " if noun[:1] in "AEIOU" or noun[:2] == "RW" else "a ") + noun


def _tb_open_standalone(cls, name):
    return cls.open(name)


def _tb_open_in_region(region_name, name):
    return Region.open(region_name).open_object(name)


cdef int tb_recover_lock(rmap_t* rm, shm_body* b, recov_t* rec) noexcept nogil:
    """A recovery takes the guard by the recoverer's deadline (at most 2 s: participants.pxd
    recover_until); cut short, the participant is left pending for the next one."""
    cdef int rc = tb_lock(rm, b, recover_until(rec, 2000000000))
    if rc != 0:
        rec.cut = 1
    return rc
