# deadlock.pxi -- a blocked acquire that is part of a wait-for cycle gives up with
# DeadlockError (docs/design.md §9).
#
# Invariant: a waiter publishes where it waits (its wait record, op_step = WAITING, in its
# wait's region; a wait link in every other region where it holds a lock) and then, before
# its first sleep, walks the chain from itself (sys/shm_walk.h: C, no GIL, reading only the
# segments on the chain); it walks again once its wait is get_deadlock_timeout() old, every
# DL_RECHECK_NS after that, and when poked. Publish (SC) then walk: of two waiters closing a
# cycle at the same instant, at least one sees the other's edge. Of the members of a cycle
# the walk confirms, exactly one withdraws, as on a timeout (so every kind leaves the lock
# usable), keeping what it holds: the one that began to wait last among those whose process
# detects (the same victim for every walker: the records are the same); a walker that is
# not the victim pokes it. Nothing here runs on the uncontended path, nor while a waiter
# spins: dl_arm is called once per slow path, the walk from the wait's sleeps (wait.pxi
# wait_walk).

cdef int64_t g_dl_timeout_ns = 0             # -1: off
cdef object g_dl_timeout = 0.0
cdef int64_t DL_RECHECK_NS = 500000000


def _walk_trust():
    """(Re)read whose segments the walk reads: shmlocks/_shmread.py's trusted owners (our
    uids, root, SHMLOCKS_TRUST_UIDS). At import; the owners of a file are checked at
    every walk."""
    cdef uint32_t buf[32]
    cdef int n = 0
    from shmlocks._shmread import trusted_uids
    for uid in sorted(trusted_uids()):
        if n < 32 and 0 <= uid <= 0xffffffff:
            buf[n] = <uint32_t>uid
            n += 1
    shm_walk_trust(buf, n)


def set_deadlock_timeout(seconds):
    """set_deadlock_timeout(seconds) -> None

    After how long a blocked acquire may give up as the victim of a wait-for cycle through
    its thread, for every thread of this process (default 0: as soon as the cycle is
    seen, within milliseconds of its closing); None turns detection off (a waiter still
    tells a victim in another process, never gives up itself). Of a cycle, the member that
    began to wait last (among those that detect) gets DeadlockError. A negative or NaN
    value raises ValueError, a non-number TypeError."""
    global g_dl_timeout_ns, g_dl_timeout
    cdef double s
    if seconds is None:
        g_dl_timeout_ns = -1
        g_dl_timeout = None
        return
    if isinstance(seconds, (str, bytes, bytearray)) or not hasattr(type(seconds), "__float__"):
        raise TypeError(f"deadlock timeout must be a number or None, not "
                        f"{type(seconds).__name__}")
    s = float(seconds)
    if s != s:
        raise ValueError("deadlock timeout must not be NaN")
    if s < 0:
        raise ValueError("deadlock timeout must be >= 0 (None turns detection off)")
    g_dl_timeout = s
    g_dl_timeout_ns = -1 if s >= _FOREVER_S else <int64_t>(s * 1e9)


@cython.binding(True)        # a real signature on 3.13 too (see _crashpoints in _core.pyx)
def get_deadlock_timeout():
    """The deadlock timeout of this process in seconds (default 0.0), or None if off."""
    return g_dl_timeout


# ---- the wait links (docs/design.md §9) --------------------------------------------------

cdef void _dl_link_write(shm_participant* q, uint32_t lock1, uint64_t since,
                         const char* name, size_t nlen, uint32_t slot1, uint64_t gen,
                         uint32_t flags) noexcept nogil:
    """Write a wait link into our own participant q, seqlock-style (odd while written)."""
    cdef uint32_t s = ld32_rlx(&q.link_seq)
    s = (s + 1) | 1
    st32_seq(&q.link_seq, s)
    st32_rlx(&q.link_lock, lock1)
    st64_rlx(&q.link_since, since)
    memset(q.link_name, 0, sizeof(q.link_name))
    memcpy(q.link_name, name, nlen)
    st32_rlx(&q.link_slot, slot1)
    st64_rlx(&q.link_gen, gen)
    st32_rlx(&q.link_flags, flags)
    st32_rel(&q.link_seq, s + 1)


cdef void _dl_link_clear(shm_participant* q) noexcept nogil:
    cdef uint32_t s = ld32_rlx(&q.link_seq)
    s = (s + 1) | 1
    st32_seq(&q.link_seq, s)
    st32_rlx(&q.link_lock, 0)
    st32_rel(&q.link_seq, s + 1)


cdef void dl_links(wait_t* w) noexcept nogil:
    """Before the wait's first walk: in every region where the thread holds a lock (or an
    RWLock's read or write: reg_t.held), through a participant other than the waiting one,
    the link to this wait: the region's name, the lock, the waiting slot and its generation,
    since when, whether it detects. The thread's list of registrations is its own, so this
    costs the regions it holds in, on the slow path only."""
    cdef rmap_t* rm = w.rm
    cdef shm_participant* p = &rm.part[w.dl_slot]
    cdef reg_t* r = <reg_t*>shm_tls_get()
    cdef const char* name = rm.path + strlen(SHM_WALK_DIR)
    cdef size_t nlen = strnlen(name, 200)
    cdef uint32_t lock1 = ld32_rlx(&p.op_lock)
    cdef uint64_t since = ld64_rlx(&p.wait_since)
    cdef uint64_t gen = ld64_rlx(&p.generation)
    cdef uint32_t flags = SHM_LINK_DETECTS if ld32_rlx(&p.detects) else 0
    while r != NULL:
        if r.held > 0 and not (r.rm == rm and r.slot == w.dl_slot) and r.rm.base != NULL:
            _dl_link_write(&r.rm.part[r.slot], lock1, since, name, nlen, w.dl_slot + 1, gen,
                           flags)
            r.linked = 1
            w.dl_linked = 1
        r = r.next
    if w.dl_linked and shm_tls_dlwait_get() != <void*>w:
        w.dl_outer = shm_tls_dlwait_get()
        shm_tls_dlwait_set(<void*>w)


cdef void dl_end(wait_t* w) noexcept nogil:
    """The wait is over, however it ended: its links cleared (and the links of the wait it
    ran inside, a signal handler's wait having taken them over, written again)."""
    cdef reg_t* r
    cdef wait_t* outer
    w.dl_state = 0
    if not w.dl_linked:
        return
    w.dl_linked = 0
    r = <reg_t*>shm_tls_get()
    while r != NULL:
        if r.linked:
            _dl_link_clear(&r.rm.part[r.slot])
            r.linked = 0
        r = r.next
    if shm_tls_dlwait_get() == <void*>w:
        outer = <wait_t*>w.dl_outer
        shm_tls_dlwait_set(<void*>outer)
        if outer != NULL and outer.dl_linked and outer.rm != NULL:
            outer.dl_linked = 0
            dl_links(outer)


# ---- the walk ------------------------------------------------------------------------------

cdef void _dl_src(rmap_t* rm, dlw_src* s) noexcept nogil:
    """The walk's view of our own region: its mapping, validated when it was opened."""
    cdef const char* name = rm.path + strlen(SHM_WALK_DIR)
    s.base = rm.base
    s.hwmp = &rm.hdr.part_hwm
    s.fd = -1
    s.state = 1
    s.size = rm.size
    s.dir_off = <uint64_t>(<char*>rm.dir - rm.base)
    s.part_off = <uint64_t>(<char*>rm.part - rm.base)
    s.locks_off = rm.locks_off
    s.stride = rm.stride
    s.L = rm.L
    s.P = rm.P
    s.hwm = rmap_hwm(rm)
    memset(s.name, 0, sizeof(s.name))
    memcpy(s.name, name, strnlen(name, 200))
    s.ext_off = rm.ext_off
    s.tbl = rm.tbl                       # (its table, validated: participants.pxi table_load)
    s.tbl_state = 1


cdef int dl_chain_walk(rmap_t* rm, uint32_t slot, uint32_t lock, uint64_t task,
                       int64_t since, int detects, char** text, int* members) noexcept nogil:
    """The chain walk for any waiter: participant `slot` of region rm (mapped by this
    process), published as waiting for lock index `lock` there (its wait record, or for an
    asyncio task, the record of the cohort it waits behind), as task `task` (0: a thread;
    a task's wait began at `since` and `detects` says if its process detects, the values
    its wait links carry; since -1: the record's). C, no GIL, no Python code; reads only
    the segments on the chain.
      DLW_NONE    no cycle through it (or the walk hit a bound: no claim);
      DLW_VICTIM  a confirmed cycle whose victim it is: *text, malloc'd (free() it; NULL
                  if out of memory), one line per member, *members of them;
      DLW_OTHER   a confirmed cycle whose victim is another member, which was poked (or
                  in which nobody detects).
    A caller that withdraws on DLW_VICTIM does so only once its own deadlock timeout has
    passed (g_dl_timeout_ns); one that does not detect never withdraws."""
    cdef dlw_src src
    text[0] = NULL
    members[0] = 0
    if rm == NULL or rm.base == NULL or slot >= rmap_hwm(rm):
        return DLW_NONE
    _dl_src(rm, &src)
    return shm_walk(&src, slot, lock, task, since, detects, shm_now_ns(), text, members)


cdef int dl_look(wait_t* w, int64_t now, uint32_t poke) noexcept nogil:
    """The walk of a sleeping wait (wait.pxi wait_walk, when due): the first one publishes
    the wait's links. 1 if this waiter is a confirmed cycle's victim and its deadlock
    timeout has passed (w.dl_hit; the cycle kept for dl_found), else 0; the next walk
    scheduled (w.dl_next)."""
    cdef rmap_t* rm = w.rm
    cdef shm_participant* p
    cdef uint32_t lock1
    cdef char* text = NULL
    cdef int members = 0
    cdef int r
    if rm == NULL or rm.base == NULL or w.dl_slot >= rmap_hwm(rm):
        return 0
    p = &rm.part[w.dl_slot]
    if w.dl_state == 1:
        w.dl_state = 2
        dl_links(w)
        shm_fence_seq()                  # publish (SC) then walk
    w.dl_poke = poke
    w.dl_last = now
    if w.dl_from < 0:
        w.dl_next = -1                   # detection off: the first walk only (and pokes)
    elif w.dl_from > now:
        w.dl_next = w.dl_from            # its timeout: the first walk that may give up
    else:
        w.dl_next = now + DL_RECHECK_NS
    lock1 = ld32_rlx(&p.op_lock)
    if ld32_rlx(&p.op_step) != SHM_OP_WAITING or lock1 == 0:
        return 0
    r = dl_chain_walk(rm, w.dl_slot, lock1 - 1, 0, -1, 0, &text, &members)
    if r == DLW_VICTIM and 0 <= w.dl_from <= now:
        free(w.dl_text)
        w.dl_text = text
        w.dl_members = members
        w.dl_hit = 1
        return 1
    free(text)
    return 0


cdef object dl_found(wait_t* w):
    """The victim's cycle, as (members, description), taken from the wait (None if it was
    no victim): called with the GIL once the wait is over, whatever its outcome."""
    cdef char* t = w.dl_text
    if t == NULL:
        return None
    w.dl_text = NULL
    try:
        return (w.dl_members, t.decode("utf-8", "replace"))
    finally:
        free(t)


cdef object dl_raise(str what, found):
    """Raise the DeadlockError of the victim of the cycle its walk found (dl_found's),
    waiting for `what` (e.g. "futex lock 'a'", "the write of RWLock 'rw'")."""
    cdef int tid = shm_gettid()
    if found is None:
        raise DeadlockError(f"deadlock: this thread waits for {what} in a wait-for cycle "
                            "(out of memory to describe it)")
    n, cycle = found
    raise DeadlockError(
        f"deadlock: this thread (pid {getpid()}, tid {tid}) waits for {what} in a "
        f"cycle of {n} threads; it gave up its wait (the last of the cycle to begin "
        f"waiting) and keeps its locks:\n" + cycle)


def _dl_walk(Region region not None, uint32_t slot, uint32_t lock, uint64_t task=0):
    """The chain walk from participant `slot` of `region` (open here), as waiting for lock
    index `lock` (not API: the tests' look at dl_chain_walk): (result, members, text), the
    result "none", "victim" or "other"."""
    cdef char* text = NULL
    cdef int members = 0
    cdef int r
    cdef rmap_t* rm = region.rm
    if rm == NULL or rm.base == NULL:
        raise ValueError("region is closed")
    with nogil:
        r = dl_chain_walk(rm, slot, lock, task, -1, 0, &text, &members)
    out = None
    if text != NULL:
        out = text.decode("utf-8", "replace")
        free(text)
    return ({DLW_NONE: "none", DLW_VICTIM: "victim", DLW_OTHER: "other"}[r], members, out)


wait_look = dl_look                # wait_walk's walk (wait.pxi)
_walk_trust()
