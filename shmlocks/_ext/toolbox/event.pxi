# event.pxi -- threading.Event in shared memory (docs/design.md §12).
#
# Invariant: word A's seq is the whole state: bit 0 the flag, bits 1..31 the generation,
# bumped by every set() that turns the flag on. One word, changed by CAS only, so no guard
# and nothing for a death to leave half done: the Event needs no recovery.
#   set()    CAS seq: flag off -> on with generation + 1; then wake every parked waiter
#   clear()  CAS seq: flag on -> off
#   wait()   reads seq once (g0); it is over when the flag is on or the generation is not
#            g0's any more: a set() then clear() while it slept still returns True, as
#            threading's does. It sleeps on seq itself (futex), depending on nobody. The
#            waiting thread is a participant (registered, as every wait's): its token
#            keeps the mapping while it sleeps, whatever another thread closes
#            (docs/design.md §2), and its record's `waiting` is what inspect counts.

cdef inline bint _ev_over(uint32_t v, uint32_t v0) noexcept nogil:
    return (v & 1) != 0 or (v >> 1) != (v0 >> 1)


cdef int _ev_wait(rmap_t* rm, shm_body* b, uint32_t me, int64_t deadline,
                  int64_t* slept) noexcept nogil:
    """R_ACQ once set (since the call), R_TIMEOUT, R_SIGNAL."""
    cdef shm_tbword* w = shm_tb_word(b)
    cdef shm_tbrec* mine = shm_tb_rec(b, me)
    cdef uint32_t v0 = ld32_seq(&w.seq)
    cdef uint32_t v
    cdef int r
    cdef tb_watch_t t
    if v0 & 1:
        return R_ACQ
    if deadline == 0:
        return R_TIMEOUT
    while True:
        v = ld32_seq(&w.seq)
        if _ev_over(v, v0):
            return R_ACQ
        tb_watch_init(&t, &w.seq, v, deadline)
        st32_rlx(&mine.waiting, 1)
        r = tb_asleep(rm, &t, &w.parked, deadline, slept)
        st32_rlx(&mine.waiting, 0)
        if _ev_over(ld32_seq(&w.seq), v0):
            return R_ACQ
        if r != R_CONT:
            return r


cdef void _ev_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """One word, CAS only: nothing to complete; a dead waiter's record waits no more."""
    st32_rlx(&shm_tb_rec(b, q).waiting, 0)


cdef class Event(_TbObject):
    """Event() -> a shared-memory ``threading.Event``: set(), clear(), is_set(), wait().

    Usable by any process that opens it by name (or gets it pickled); ``create(name=None,
    *, max_participants=None, mode=0o600, persist=False)``, ``open(name)``, ``close()``,
    ``unlink()`` as for locks. A blocked wait() sleeps in the kernel until set()."""
    kind_name = "event"
    kind_code = SHM_KIND_EVENT

    def __init__(self, name=None, *, max_participants=None, mode=0o600, persist=False):
        self._init_standalone(name, max_participants, mode, persist, None)

    @classmethod
    def create(cls, name=None, *, max_participants=None, mode=0o600, persist=False):
        """A new Event in a segment of its own, not set (the same as calling the class).
        ``name=None`` generates one."""
        return cls(name, max_participants=max_participants, mode=mode, persist=persist)

    @classmethod
    def open_or_create(cls, name, *, max_participants=None, mode=0o600, persist=False):
        """Open Event ``name``, or create it (not set, with these arguments) if there is
        none: atomic, so that of any number of processes racing on one name, all end up
        with the same Event. LockKindError if the segment holds something else; the
        arguments do not apply to an Event that exists already."""
        _check_create_args(1, max_participants, mode)
        return cls._open_or_create(name, lambda n: cls(n, max_participants=max_participants,
                                                       mode=mode, persist=persist))

    def is_set(self):
        """True if the flag is set."""
        self._check()
        return bool(ld32_acq(&shm_tb_word(&self.b).seq) & 1)

    isSet = is_set

    def set(self):
        """Set the flag and wake every waiter."""
        cdef uint32_t* s
        cdef uint32_t v
        self._check()
        s = &shm_tb_word(&self.b).seq
        while True:
            v = ld32_seq(s)
            if v & 1:
                return
            if cas32(s, v, (((v >> 1) + 1) << 1) | 1):
                break
        tb_wake(&self.b, 0x7fffffff)

    def clear(self):
        """Reset the flag: wait() blocks until the next set()."""
        cdef uint32_t* s
        cdef uint32_t v
        self._check()
        s = &shm_tb_word(&self.b).seq
        while True:
            v = ld32_seq(s)
            if not v & 1 or cas32(s, v, v & ~(<uint32_t>1)):
                return

    def wait(self, timeout=None):
        """wait(timeout=None) -> bool

        Block until the flag is set, or ``timeout`` seconds pass: True if it was set (even
        if cleared again before this thread woke), False on timeout. Releases the GIL and
        runs signal handlers while it waits."""
        cdef int64_t deadline = tb_deadline(timeout)
        cdef int64_t slept = 0
        cdef int r
        cdef uint32_t me = self._me().slot
        with nogil:
            r = _ev_wait(self.rm, &self.b, me, deadline, &slept)
            tb_count(&self.b, r == R_ACQ, r == R_TIMEOUT and deadline != 0, slept)
        if r == R_SIGNAL:
            return _raise_pending()
        return r == R_ACQ

    def _state(self):
        return "set" if self.is_set() else "unset"

    def __repr__(self):
        st = "closed" if (self._closed or self.rm.closed) else self._state()
        return f"<shmlocks.Event at {id(self):#x}: {st}>"


_register_object(Event, tb_init, _ev_recover, 0)
g_tb_api["create_event"] = lambda region, name: Event._new_in(region, name, None)
