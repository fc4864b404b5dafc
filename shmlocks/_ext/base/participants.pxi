# participants.pxi -- who is who (docs/design.md §3).
#
# A participant is one thread of one process using a region. It claims a slot by taking
# the slot's liveness token (a robust, process-shared pthread mutex) and holds the token
# for as long as it owns the slot, so:
#   - trylock == 0 or EOWNERDEAD  ->  the slot is ours (EOWNERDEAD: the previous owner died);
#   - the kernel marks the token OWNER_DIED when its thread exits or its process dies,
#     whatever killed it, so liveness is exact and immune to PID reuse.
#
# Process-local bookkeeping: each region mapping is an rmap_t; each thread keeps a list
# of reg_t (one per region it participates in) under one pthread key, whose destructor
# runs at thread exit and gives the slot back cleanly when the thread holds nothing there.
# A mapping is unmapped only once it is closed AND no thread of this process still holds a
# token in it: glibc's robust list runs through the tokens themselves (the robust-list trap).
#
# Participants grow (docs/design.md §2): a region provisions its first slots at creation
# (SHM_HWM_FIRST, 32, at most its cap P) and, when a registration finds every provisioned slot
# taken, provisions twice as many (reg_grow) up to P, under the directory mutex, publishing
# the new count (header.part_hwm) last.

import os as _os
import errno as _errno



cdef int _robust_mutex_init(pthread_mutex_t* m, bint pi) noexcept nogil:
    """A process-shared robust mutex (+ priority inheritance): every pthread mutex the
    region holds is one, so a holder's death is always reported."""
    cdef pthread_mutexattr_t a
    cdef int rc
    pthread_mutexattr_init(&a)
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED)
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST)
    if pi:
        pthread_mutexattr_setprotocol(&a, PTHREAD_PRIO_INHERIT)
    rc = pthread_mutex_init(m, &a)
    pthread_mutexattr_destroy(&a)
    return rc


cdef _reserve(int fd, uint64_t off, uint64_t length, what):
    """Give the range of the segment real pages now (tmpfs files are sparse): a full
    /dev/shm is OSError(ENOSPC) here, never a SIGBUS at the first store into a page that
    tmpfs cannot supply."""
    try:
        _os.posix_fallocate(fd, off, length)
    except OSError as e:
        if e.errno in (_errno.ENOSPC, _errno.ENOMEM):
            raise OSError(_errno.ENOSPC, f"no space left for {what} ({length} bytes): "
                                  "the shared-memory filesystem is full") from None
        if e.errno not in (_errno.EOPNOTSUPP, _errno.EINVAL):     # no fallocate here: stay sparse
            raise


cdef int _init_pshared_mutex(pthread_mutex_t* m, bint pi) except -1:
    cdef int rc = _robust_mutex_init(m, pi)
    if rc != 0:
        raise OSError(rc, "pthread_mutex_init failed")
    return 0


cdef pthread_mutex_t g_mutex          # (participants.pxd: what each of these globals is)
cdef uint32_t g_lc_busy = 0
cdef uint32_t g_lc_pending = 0
cdef pthread_key_t g_key              # the calling thread's registrations (reg_t list)
cdef rmap_t* g_rmaps = NULL           # every view of this process
cdef int64_t RECOVER_CHECK_NS = 5000000


cdef void lc_end() noexcept nogil:
    """The process ends of the signal in g_lc_pending, no section of the views' bookkeeping
    running: every view leaves its name, then the signal is re-raised with its default
    action. Async-signal-safe calls only (flock, fstat, lstat, unlink, sigaction, kill).
    Returns if a section began meanwhile: its end comes back here."""
    cdef int sig = <int>ld32_seq(&g_lc_pending)
    cdef rmap_t* rm
    cdef c_sigaction dfl
    if sig == 0 or pthread_mutex_trylock(&g_mutex) != 0:
        return
    if ld32_seq(&g_lc_busy) != 0:         # a view being made (no g_mutex): after it
        pthread_mutex_unlock(&g_mutex)
        return
    rm = g_rmaps
    while rm != NULL:
        rmap_leave_name(rm)
        rm = rm.gnext
    memset(&dfl, 0, sizeof(dfl))
    dfl.sa_handler = SIG_DFL
    c_sigaction_call(sig, &dfl, NULL)
    # to the process: a thread that does not block it dies of it at once; in a handler,
    # this thread blocks it until the handler returns
    c_kill(getpid(), sig)


cdef uint64_t g_pidns = 0
cdef int g_pidns_pid = 0


cdef uint64_t my_pidns() noexcept nogil:
    """This process's PID namespace: the inode of /proc/self/ns/pid (0 if unknown). Pids
    and tids in a participant record mean something only in its own namespace."""
    global g_pidns, g_pidns_pid
    cdef struct_stat st
    cdef int pid = getpid()
    if g_pidns_pid != pid:
        g_pidns = <uint64_t>st.st_ino if stat(b"/proc/self/ns/pid", &st) == 0 else 0
        g_pidns_pid = pid
    return g_pidns


cdef uint64_t thread_start(uint32_t tid):
    """The calling thread's start time (clock ticks since boot, /proc field 22), 0 if
    unknown: with (pidns, pid, tid) it names this thread and no later one with its tid.
    Registration only (a file read)."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


cdef int window_enter(rmap_t* rm) noexcept nogil:
    """Python code may run now inside this thread's wait or recovery on region rm: hide
    the thread's participant there (unlink its reg_t) and mark rm busy. Returns 1 if
    window_exit must undo it."""
    global shm_win_n
    cdef reg_t* head
    cdef reg_t** pp
    cdef reg_t* r = NULL
    if rm == NULL or shm_win_n >= WINDOW_MAX or shm_win_n < 0:
        return 0
    head = <reg_t*>shm_tls_get()
    pp = &head
    while pp[0] != NULL:
        if pp[0].rm == rm:
            r = pp[0]
            pp[0] = r.next
            r.next = NULL
            pthread_setspecific(g_key, head)
            shm_tls_set(head)
            break
        pp = &pp[0].next
    shm_win_rm[shm_win_n] = <void*>rm
    shm_win_reg[shm_win_n] = <void*>r
    shm_win_n += 1
    return 1


cdef void window_exit(int entered) noexcept nogil:
    """End the window window_enter opened: link the hidden participant back."""
    global shm_win_n
    cdef reg_t* r
    if not entered or shm_win_n <= 0:          # (0 in a child forked inside the window)
        return
    shm_win_n -= 1
    r = <reg_t*>shm_win_reg[shm_win_n]
    if r != NULL:
        r.next = <reg_t*>shm_tls_get()
        pthread_setspecific(g_key, r)
        shm_tls_set(r)


cdef reg_t* reg_find(rmap_t* rm) noexcept nogil:
    """reg_lookup, hidden participants included: for calls that publish no step
    (mark_consistent, _is_owned), allowed inside a window."""
    cdef reg_t* r = reg_lookup(rm)
    cdef int i
    if r != NULL:
        return r
    for i in range(shm_win_n):
        if shm_win_rm[i] == <void*>rm and shm_win_reg[i] != NULL:
            return <reg_t*>shm_win_reg[i]
    return NULL


cdef int _raise_pending() except -1:
    return -1                          # the exception PyErr_CheckSignals set propagates


cdef object reentry_error(str what):
    return ReentryError(
        f"{what} inside a signal handler (or finalizer) that runs while this thread waits "
        "in acquire() of a lock of the same region (or recovers a participant there): "
        "refused, because it would overwrite the protocol step the waiting acquire has "
        "published (README: re-entry)")


cdef void rmap_link(rmap_t* rm) noexcept nogil:
    global g_rmaps
    gm_lock()
    rm.gnext = g_rmaps
    g_rmaps = rm
    gm_unlock()


cdef void rmap_maybe_unmap(rmap_t* rm) noexcept nogil:
    """Called with g_mutex held: unmap once closed, no thread holds a token here and no
    thread is inside a pinned call (rmap_pin)."""
    if rm.closed and rm.nthreads == 0 and rm.pins == 0 and rm.base != NULL:
        rmap_leave_name(rm)
        munmap(rm.base, rm.size)
        rm.base = NULL
        if rm.fd >= 0:
            close(rm.fd)
            rm.fd = -1


cdef void rmap_leave_name(rmap_t* rm) noexcept nogil:
    """This view stops keeping the segment's name alive (its unmap, or the process's end):
    if no other view anywhere holds the file (flock: ours is the last LOCK_SH), unlink the
    name, unless the segment is persist or the name names another file by now.
    docs/design.md §2."""
    cdef struct_stat a, b
    if not rm.named or rm.fd < 0:
        return
    rm.named = 0
    # a failed LOCK_SH -> LOCK_EX conversion drops our LOCK_SH (flock(2)), so of two last
    # users leaving at once, one gets LOCK_EX
    if flock(rm.fd, LOCK_EX | LOCK_NB) == 0:
        if (not rm.persist and fstat(rm.fd, &a) == 0 and lstat(rm.path, &b) == 0
                and a.st_dev == b.st_dev and a.st_ino == b.st_ino):
            unlink(rm.path)
    flock(rm.fd, LOCK_UN)


cdef void rmap_leave_all_names() noexcept nogil:
    """The process is ending (atexit, or multiprocessing's exit path before os._exit):
    every view leaves its name, as if unmapped; the mappings stay for daemon threads."""
    cdef rmap_t* rm
    gm_lock()
    rm = g_rmaps
    while rm != NULL:
        rmap_leave_name(rm)
        rm = rm.gnext
    gm_unlock()


cdef int rmap_pin(rmap_t* rm) except -1:
    """Keep the mapping for the calling thread, which is about to touch it without holding a
    token in it (registration, create_lock, a sweep), possibly releasing the GIL: a close()
    by another thread meanwhile defers the unmap to rmap_unpin. ValueError if closed."""
    gm_lock()
    if rm.closed or rm.base == NULL:
        gm_unlock()
        raise ValueError("region is closed")
    rm.pins += 1
    gm_unlock()
    return 0


cdef void rmap_unpin(rmap_t* rm) noexcept nogil:
    gm_lock()
    rm.pins -= 1
    rmap_maybe_unmap(rm)
    gm_unlock()


cdef void rmap_maybe_free(rmap_t* rm) noexcept nogil:
    """Called with g_mutex held: free the struct once unmapped and unreferenced."""
    global g_rmaps
    cdef rmap_t** pp
    if rm.base == NULL and not rm.pyalive:
        pp = &g_rmaps
        while pp[0] != NULL:
            if pp[0] == rm:
                pp[0] = rm.gnext
                break
            pp = &pp[0].gnext
        free(rm)


cdef inline void token_unlock(rmap_t* rm, uint32_t slot) noexcept nogil:
    cdef shm_participant* p = &rm.part[slot]
    shm_op_set(&p.op_lock, 0, 0)
    pm_unlock(&p.token.m, 0)


cdef void thread_exit(void* head) noexcept nogil:
    """pthread key destructor: this thread is exiting. Give back clean slots."""
    cdef reg_t* r = <reg_t*>head
    cdef reg_t* nx
    shm_tls_set(NULL)
    gm_lock()
    while r != NULL:
        nx = r.next
        if r.held == 0 and r.rm.base != NULL:
            token_unlock(r.rm, r.slot)
            r.rm.nthreads -= 1
            rmap_maybe_unmap(r.rm)
            rmap_maybe_free(r.rm)
        # else: the thread dies holding locks here. Its tokens and robust mutexes must be
        # marked OWNER_DIED by the kernel's robust-list walk, which needs the mapping: it
        # stays mapped for the life of the process.
        free(r)
        r = nx
    gm_unlock()


cdef void atfork_prepare() noexcept nogil:
    """Before fork: a new open file description (open of /proc/self/fd/N) with its own
    LOCK_SH for each view the child inherits open, so that the child keeps the name alive
    on its own: a flock belongs to a description, and the inherited fd shares ours."""
    cdef rmap_t* rm
    cdef char buf[48]
    cdef int fd
    gm_lock()
    rm = g_rmaps
    while rm != NULL:
        rm.fork_fd = -1
        if rm.named and not rm.closed and rm.fd >= 0:
            snprintf(buf, sizeof(buf), b"/proc/self/fd/%d", rm.fd)
            fd = c_open(buf, O_RDWR | O_CLOEXEC)
            if fd >= 0:
                # nobody can hold LOCK_EX while our own LOCK_SH stands: this never waits
                if flock(fd, LOCK_SH | LOCK_NB) == 0:
                    rm.fork_fd = fd
                else:
                    close(fd)
        rm = rm.gnext


cdef void atfork_parent() noexcept nogil:
    cdef rmap_t* rm = g_rmaps
    while rm != NULL:
        if rm.fork_fd >= 0:
            close(rm.fork_fd)             # the child's copy keeps its description and lock
            rm.fork_fd = -1
        rm = rm.gnext
    gm_unlock()


cdef void atfork_child() noexcept nogil:
    """A forked child is one new thread that owns no slot: forget the parent's threads."""
    global shm_win_n
    cdef rmap_t* rm = g_rmaps
    cdef reg_t* r = <reg_t*>shm_tls_get()
    cdef reg_t* nx
    while r != NULL:
        nx = r.next
        free(r)
        r = nx
    pthread_setspecific(g_key, NULL)
    shm_tls_set(NULL)
    shm_win_n = 0                       # a fork inside a window: the child has no wait
    # a signal the parent was deferring is not ours, nor are its other threads' sections:
    # the one running is prepare's, which the unlock below ends
    st32_seq(&g_lc_pending, 0)
    st32_seq(&g_lc_busy, 1)
    while rm != NULL:
        rm.nthreads = 0
        rm.agents = 0
        rm.pins = 0
        if rm.fork_fd >= 0:               # our own description, with its LOCK_SH
            if rm.fd >= 0:
                close(rm.fd)
            rm.fd = rm.fork_fd
            rm.fork_fd = -1
        else:                             # the inherited fd shares the parent's lock:
            rm.named = 0                  # never flock it here
        rm = rm.gnext
    gm_unlock()


cdef int participants_init() except -1:
    cdef pthread_mutex_t robust, pi
    pthread_mutex_init(&g_mutex, NULL)
    if _robust_mutex_init(&robust, 0) != 0 or _robust_mutex_init(&pi, 1) != 0:
        raise OSError("pthread_mutex_init of a robust mutex failed")
    shm_pm_learn_kinds(&robust, &pi)                # what every mutex of ours must carry
    if pthread_key_create(&g_key, thread_exit) != 0:
        raise OSError("pthread_key_create failed")
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child)
    return 0


cdef int reg_leave_closed() noexcept nogil:
    """The calling thread leaves every region closed by another thread where it holds
    nothing (it stayed registered, keeping the mapping, across that close) and has no
    protocol step published (no frame of this thread, a signal handler's caller
    included, is inside an acquire there). Returns how many regions it still takes part
    in: each keeps a token on its robust list (REGIONS_PER_THREAD)."""
    cdef reg_t* head = <reg_t*>shm_tls_get()
    cdef reg_t** pp = &head
    cdef reg_t* r
    cdef rmap_t* rm
    cdef int n = 0
    gm_lock()
    while pp[0] != NULL:
        r = pp[0]
        rm = r.rm
        if rm.closed and r.held == 0 and rm.base != NULL and ld32_acq(r.op) == 0:
            pp[0] = r.next
            token_unlock(rm, r.slot)
            rm.nthreads -= 1
            rmap_maybe_unmap(rm)
            rmap_maybe_free(rm)
            free(r)
        else:
            n += 1
            pp = &r.next
    gm_unlock()
    pthread_setspecific(g_key, head)
    shm_tls_set(head)
    return n


cdef reg_t* reg_register(rmap_t* rm, int64_t deadline=-1) except NULL:
    """Claim a participant slot for the calling thread (slow path, first use). The mapping
    is pinned meanwhile (the claim reads /proc and may recover a dead participant, by
    `deadline`: another thread can close the region then); a close that came first or
    meanwhile is ValueError.
    A thread keeps at most REGIONS_PER_THREAD tokens (see the enum's comment): past that,
    CapacityError."""
    cdef reg_t* r = NULL
    if window_busy(rm):
        raise reentry_error("a lock call")
    if reg_leave_closed() >= REGIONS_PER_THREAD:
        raise CapacityError(
            f"this thread already takes part in {REGIONS_PER_THREAD} regions, the most a "
            "thread may (each keeps a liveness token on the thread's robust list, which "
            "the kernel walks only so far at its death): close regions it no longer uses")
    rmap_pin(rm)
    try:
        r = reg_claim(rm, deadline)
    finally:
        rmap_unpin(rm)
    if rm.closed:                            # closed while we registered: leave again
        reg_unregister(rm)
        gm_lock()
        rmap_maybe_unmap(rm)
        gm_unlock()
        raise ValueError("region is closed")
    return r


cdef reg_t* reg_claim_agent(rmap_t* rm, int64_t deadline, int others) except NULL:
    """A participant slot for an asyncio cohort of the calling thread's event loop
    (docs/design.md §14): claimed as reg_register claims one (its token locked by this
    thread, so on its robust list: the thread's or its process's death is the agent's),
    marked `agent = 1`, but linked into no list: the thread's own lock calls never see
    it, and only the cohort, on this thread, acts through it. It keeps the mapping as a
    registration does (nthreads); reg_release_agent gives it back."""
    cdef reg_t* r = NULL
    if window_busy(rm):
        raise reentry_error("a lock call")
    if reg_leave_closed() + others >= REGIONS_PER_THREAD:
        raise CapacityError(
            f"this thread already takes part in {REGIONS_PER_THREAD} regions, the most a "
            "thread may (its registrations and the asyncio cohorts of its event loop, one "
            "per lock its tasks hold or wait for: each keeps a liveness token on the "
            "thread's robust list, which the kernel walks only so far at its death): close "
            "regions it no longer uses")
    rmap_pin(rm)
    try:
        r = reg_claim(rm, deadline, 1)
    finally:
        rmap_unpin(rm)
    if rm.closed:
        reg_release_agent(r)
        raise ValueError("region is closed")
    return r


cdef void reg_release_agent(reg_t* r) noexcept nogil:
    """Give an agent slot back (on the thread that claimed it: its token is that
    thread's; the cohort holds nothing and waits for nothing through it)."""
    cdef rmap_t* rm = r.rm
    gm_lock()
    if rm.base != NULL:
        st32_rlx(&rm.part[r.slot].agent, 0)
        token_unlock(rm, r.slot)
    rm.nthreads -= 1
    rm.agents -= 1
    rmap_maybe_unmap(rm)
    gm_unlock()
    free(r)


cdef reg_t* reg_claim(rmap_t* rm, int64_t deadline, bint agent=0) except NULL:
    """reg_register's work, on a pinned mapping: the first free slot of those provisioned;
    if every one is taken, more are provisioned (reg_grow) and the claim looks again. A
    slot whose token is not a mutex of ours (foreign bytes: its glibc fields would make
    glibc abort) is skipped, never locked. `agent`: an asyncio cohort's slot
    (reg_claim_agent), in no list."""
    cdef uint32_t lo = 0
    cdef uint32_t h
    cdef reg_t* r
    cdef int ncorrupt = 0
    while True:
        h = rmap_hwm(rm)
        r = _claim_in(rm, lo, h, deadline, &ncorrupt, agent)
        if r != NULL or PyErr_Occurred():
            return r
        if h >= rm.P:
            break
        reg_grow(rm, h)
        lo = h                       # the slots below were all taken a moment ago
    if ncorrupt:
        raise CorruptRegionError(
            f"{ncorrupt} of the {h} participant slots of region {_region_name(rm)!r} have a "
            "corrupt liveness token and the others are in use")
    raise CapacityError(_capacity_text(rm))


cdef str _region_name(rmap_t* rm):
    return rm.path.rpartition(b"/")[2].decode("utf-8", "replace")


cdef str _capacity_text(rmap_t* rm):
    """CapacityError's text: which cap, and what to do. A slot is a thread's, or an asyncio
    event loop's for one lock its tasks hold or wait for (a cohort, docs/design.md §14)."""
    cdef str name = _region_name(rm)
    cdef str who = ("live threads (each thread that used one of its locks keeps a slot until "
                    "it ends or closes the region; each asyncio event loop whose tasks hold "
                    "or wait for a lock of the region uses one per lock, whatever the "
                    "number of tasks)")
    if rm.P < SHM_MAX_PARTICIPANTS:
        return (f"all {rm.P} participant slots of region {name!r} are in use by {who} "
                f"(max_participants={rm.P}, the cap it was created with): create the region "
                f"with a larger max_participants (None: no cap but {SHM_MAX_PARTICIPANTS}), "
                "or use it from fewer threads at once")
    return (f"all {rm.P} participant slots of region {name!r} are in use by {who} "
            f"({SHM_MAX_PARTICIPANTS}, the most a region can have): use it from fewer "
            "threads at once (a pool), or spread the locks over more regions")


cdef reg_t* _claim_in(rmap_t* rm, uint32_t lo, uint32_t hi, int64_t deadline,
                      int* ncorrupt, bint agent) except? NULL:
    """Claim the first free slot of [lo, hi) for the calling thread: its reg_t, or NULL
    (none free; an exception set if a recovery's signal handler raised)."""
    cdef recov_t rec
    cdef uint32_t i, w
    cdef int rc
    cdef shm_participant* p
    cdef reg_t* r
    for i in range(lo, hi):
        p = &rm.part[i]
        w = ld32_acq(<uint32_t*>&p.token.m)
        if (w & FUTEX_TID_MASK_) != 0 and not (w & FUTEX_OWNER_DIED_):
            continue                     # taken by a live thread: no trylock (a CAS) on it
        rc = pm_trylock(&p.token.m, 0)
        if rc == SHM_PM_CORRUPT:
            ncorrupt[0] += 1
            continue
        if rc == EOWNERDEAD or (rc == 0 and ld32_acq(&p.pending)):
            # The previous owner died. We are its recoverer: finish its business first
            # (by our deadline: cut short, the slot stays pending and we try the next;
            # cut short by a signal handler that raised, its exception propagates).
            recov_init(&rec, deadline)
            if participant_recover(rm, i, &rec) != 1:
                if rec.sig:
                    return NULL
                continue
            rc = 0
        if rc == 0:
            r = <reg_t*>calloc(1, sizeof(reg_t))
            if r == NULL:
                token_unlock(rm, i)
                raise MemoryError()
            r.pid = <uint32_t>getpid()
            st32_rlx(&p.pid, r.pid)
            st32_rlx(&p.tid, shm_gettid())
            st64_rlx(&p.pidns, my_pidns())
            st64_rlx(&p.tstart, thread_start(p.tid))
            st64_rlx(&p.wait_since, 0)
            st32_rlx(&p.detects, 0)
            _clear_reserved(p)
            shm_op_set(&p.op_lock, 0, 0)
            st64_rel(&p.op_value, 0)
            st64_rel(&p.generation, ld64_rlx(&p.generation) + 1)
            trace("register", i, ld64_rlx(&p.generation), 0)
            r.rm = rm
            r.slot = i
            r.hid = participant_hid(rm, i)
            r.op = &p.op_lock
            r.held = 0
            if agent:
                st32_rlx(&p.agent, 1)
                gm_lock()
                rm.nthreads += 1
                rm.agents += 1
                gm_unlock()
                return r
            r.next = <reg_t*>shm_tls_get()
            pthread_setspecific(g_key, r)
            shm_tls_set(r)
            gm_lock()
            rm.nthreads += 1
            gm_unlock()
            return r
    return NULL


cdef inline void _clear_reserved(shm_participant* p) noexcept nogil:
    """A claim zeroes the fields layout 8 reserves for later (issues 37B and 38): line 1's
    upper half and the wait link (lines 2-3)."""
    memset(&p.poke, 0, SHM_LINE // 2)                # line 1, bytes 64..127
    memset(&p.link_seq, 0, 2 * SHM_LINE)             # lines 2-3


# -- growth (docs/design.md §2) ------------------------------------------------------------

cdef int64_t GROW_LOCK_NS = 5000000000      # as create_lock's wait for the directory mutex


cdef int body_provision(rmap_t* rm, uint32_t i, uint32_t lo, uint32_t hi, what) except -1:
    """The per-participant lines of participants [lo, hi) in body i (body_provision_at)."""
    return body_provision_at(rm, rm.locks_off + <uint64_t>i * rm.stride,
                             ld32_rlx(&rm.dir[i].kind), lo, hi, what)


cdef int body_provision_at(rmap_t* rm, uint64_t base, uint32_t code, uint32_t lo,
                           uint32_t hi, what) except -1:
    """The per-participant lines of participants [lo, hi) in the body at `base` of kind
    `code` (a directory entry's), nodes and precs, given
    pages (a full /dev/shm: OSError(ENOSPC)) and zeroed; node lines below the ones its kind
    uses by index (kind_ops_t.fixed_nodes: a body of a kind unknown here is taken for the
    one with the most), provisioned with the body and in use, are left alone."""
    cdef kind_ops_t* ops = kind_ops(code)
    cdef uint32_t nf = shm_fixed_nodes(ops.fixed_nodes if ops != NULL else SHM_TICKET_SLOTS,
                                       rm.P)
    cdef uint32_t nlo = lo if lo > nf else nf
    cdef uint64_t noff = base + (SHM_BODY_NODES + <uint64_t>nlo) * SHM_LINE
    cdef uint64_t poff = base + (SHM_BODY_NODES + <uint64_t>rm.P + 1 + lo) * SHM_LINE
    if hi > rm.P or lo >= hi:
        return 0
    if nlo < hi:
        lines_provision(rm, noff, <uint64_t>(hi - nlo) * SHM_LINE, what, 0)
    lines_provision(rm, poff, <uint64_t>(hi - lo) * SHM_LINE, what, 0)
    return 0


cdef int lines_provision(rmap_t* rm, uint64_t off, uint64_t nbytes, what,
                         bint fresh) except -1:
    """Bytes [off, off + nbytes) of the segment given pages (OSError(ENOSPC) on a full
    /dev/shm) and, unless `fresh` (a region still being built: a new file, zero already),
    zeroed."""
    if nbytes == 0:
        return 0
    if rm.fd >= 0:
        _reserve(rm.fd, off, nbytes, what)
    if not fresh:
        memset(rm.base + off, 0, <size_t>nbytes)
    return 0


# -- the region's lock table (docs/design.md §15) -----------------------------------------

cdef int table_load(rmap_t* rm, name) except -1:
    """Find the region's table entry (a READY directory entry of kind SHM_KIND_TABLE, at
    most one: LockTable's) and keep a validated copy of its header in rm (rm.tbl; size 0:
    none), so that nothing read from the segment afterwards steers an index: its kind, size
    and numbers, and its stripes filling the extension area exactly. CorruptRegionError
    otherwise. The header is written before the entry is READY and never changes."""
    cdef uint32_t i
    cdef int found = -1
    cdef shm_body tb
    cdef shm_table t
    cdef kind_ops_t* ops
    cdef uint64_t need
    rm.tbl.size = 0
    for i in range(rm.L):
        if (ld32_acq(&rm.dir[i].state) == SHM_DIRENT_READY
                and ld32_rlx(&rm.dir[i].kind) == SHM_KIND_TABLE):
            if found >= 0:
                raise CorruptRegionError(f"segment {name!r} has two lock tables")
            found = i
    if found < 0:
        if rm.size != rm.ext_off:
            raise CorruptRegionError(f"segment {name!r}: an extension area and no table")
        return 0
    tb = shm_body_at(rm.base, rm.locks_off + <uint64_t>found * rm.stride, rm.P, found)
    memcpy(&t, tb.wa, sizeof(shm_table))
    ops = kind_ops(t.sub)
    need = SHM_STRIPE_LINES * SHM_LINE
    if (tb.ctl.magic != SHM_BODY_MAGIC or tb.ctl.kind != SHM_KIND_TABLE
            or t.sub < SHM_KIND_TICKET or t.sub > SHM_KIND_PI or ops == NULL
            or t.compact != 1
            or t.size < 1 or t.size > SHM_TABLE_MAX or t.first != rm.L
            or t.stride != need or t.off != rm.ext_off
            or t.off + <uint64_t>t.size * t.stride != rm.size):
        raise CorruptRegionError(f"segment {name!r}: its lock table's header does not match "
                                 "its geometry")
    rm.tbl = t
    rm.tbl_entry = found
    rm.tbl_body = tb
    return 0


cdef int table_grow(rmap_t* rm, uint32_t lo, uint32_t hi, what) except -1:
    """Participants [lo, hi) are being provisioned (reg_grow, the directory mutex held):
    the table entry's line per participant (the stripes' precs), for mcs and clh their
    nodes (the table entry's node lines), and in every stripe what the kind sets up for
    them (its grow)."""
    cdef uint64_t tbase = rm.locks_off + <uint64_t>rm.tbl_entry * rm.stride
    cdef kind_ops_t* ops = kind_ops(rm.tbl.sub)
    cdef uint32_t s
    cdef shm_body sb
    if rm.tbl.size == 0 or lo >= hi or hi > rm.P:
        return 0
    lines_provision(rm, tbase + (SHM_BODY_NODES + <uint64_t>rm.P + 1 + lo) * SHM_LINE,
                    <uint64_t>(hi - lo) * SHM_LINE, what, 0)
    if rm.tbl.sub == SHM_KIND_MCS or rm.tbl.sub == SHM_KIND_CLH:
        # a compact mcs stripe's wait nodes (mcsc.pxi), a clh table's nodes (clhc.pxi)
        lines_provision(rm, tbase + (SHM_BODY_NODES + <uint64_t>lo) * SHM_LINE,
                        <uint64_t>(hi - lo) * SHM_LINE, what, 0)
    if ops.grow != NULL:
        for s in range(rm.tbl.size):
            sb = table_stripe(rm, s)
            ops.grow(&sb, lo, hi)
    return 0


cdef int slots_provision(rmap_t* rm, uint32_t lo, uint32_t hi, what,
                         bint fresh=0) except -1:
    """Participant slots [lo, hi): pages given (OSError(ENOSPC) on a full /dev/shm), zeroed,
    their tokens made robust process-shared mutexes. Only for slots nobody uses: not yet
    published (part_hwm <= lo), or a region still being built (`fresh`: a new file whose
    pages the caller has reserved, zero already). (Nothing of the segment past what is
    provisioned is ever read either: a read fault on a hole of a tmpfs mapping allocates
    the page, and on a full tmpfs is SIGBUS as a store is.)"""
    cdef uint64_t off = <uint64_t>(<char*>&rm.part[lo] - rm.base)
    cdef uint32_t i
    if lo >= hi:
        return 0
    if not fresh:
        if rm.fd >= 0:
            _reserve(rm.fd, off, <uint64_t>(hi - lo) * sizeof(shm_participant), what)
        memset(&rm.part[lo], 0, <size_t>(hi - lo) * sizeof(shm_participant))
    for i in range(lo, hi):
        _init_pshared_mutex(&rm.part[i].token.m, False)
    return 0


cdef int reg_grow(rmap_t* rm, uint32_t seen) except -1:
    """Every one of the `seen` provisioned slots was taken: provision twice as many (at
    most the cap), under the directory mutex (which serialises growth with create_lock):
    the slots themselves, then in every lock's body their nodes and precs and what the
    kind sets up for a participant (its grow), then publish the new part_hwm (SC) last.
    A grower that dies mid-way leaves part_hwm unpublished and the mutex EOWNERDEAD: the
    next grower redoes the whole growth, which touches only lines nobody can use yet. A
    full /dev/shm is OSError(ENOSPC) naming the region, nothing published. Returns 0 (grown,
    or another grew it meanwhile: the caller looks again)."""
    cdef pthread_mutex_t* m = &rm.hdr.dir_mutex.m
    cdef uint32_t h, new, i, code
    cdef int rc
    cdef timespec ts
    cdef shm_body b
    cdef kind_ops_t* ops
    cdef str name = _region_name(rm)
    if (ld32_acq(<uint32_t*>m) & FUTEX_TID_MASK_) == shm_gettid():
        raise reentry_error(f"a registration that must grow region {name!r} (while this "
                            "thread creates a lock there)")
    ts = shm_ts_of_ns(shm_now_ns() + GROW_LOCK_NS)
    with nogil:
        rc = pm_clocklock(m, 0, &ts)                  # guarded (shm_sys.h)
    if rc == EOWNERDEAD:
        pm_consistent(m, 0)          # a grower or creator died: nothing it did is published
    elif rc == ETIMEDOUT:
        raise TimeoutError(f"timed out waiting for the directory lock of region {name!r} "
                           "to provision more participant slots")
    elif rc != 0:
        raise CorruptRegionError(f"region {name!r}: directory lock unusable ({rc})")
    try:
        h = rmap_hwm(rm)
        if h > seen or h >= rm.P:
            return 0                 # another grew it meanwhile (or the cap: the caller says)
        crashpoint("region.grow.locked")
        new = 2 * h if 2 * h > h else h + 1
        if new > rm.P:
            new = rm.P
        what = f"{new - h} more participants of region {name!r}"
        if rm.fd >= 0:               # pages first: reading a hole tmpfs cannot fill is SIGBUS
            _reserve(rm.fd, <uint64_t>(<char*>&rm.part[h] - rm.base),
                     <uint64_t>(new - h) * sizeof(shm_participant), what)
        for i in range(h, new):
            # never re-initialise a token someone holds (a part_hwm scribbled lower)
            if ld32_acq(<uint32_t*>&rm.part[i].token.m) != 0:
                raise CorruptRegionError(
                    f"region {name!r}: participant slot {i}, past the {h} provisioned, is "
                    "in use (the header's participant count is corrupt)")
        slots_provision(rm, h, new, what)
        crashpoint("region.grow.slots")
        for i in range(rm.L):
            if ld32_acq(&rm.dir[i].state) != SHM_DIRENT_READY:
                continue
            if ld32_rlx(&rm.dir[i].kind) == SHM_KIND_TABLE:
                if rm.tbl.size != 0 and i == rm.tbl_entry:
                    table_grow(rm, h, new, what)      # its own lines and its stripes'
                continue
            body_provision(rm, i, h, new, what)
            ops = kind_ops(ld32_rlx(&rm.dir[i].kind))
            if ops != NULL and ops.grow != NULL:
                b = shm_body_at(rm.base, rm.locks_off + i * rm.stride, rm.P, i)
                ops.grow(&b, h, new)
        crashpoint("region.grow.bodies")
        trace("grow", h, new, 0)
        st32_seq(&rm.hdr.part_hwm, new)               # publish: everything above is visible
        crashpoint("region.grow.published")
    finally:
        pm_unlock(m, 0)
    return 0


cdef int reg_unregister(rmap_t* rm) noexcept nogil:
    """The calling thread leaves the region (close). Returns 1 if it left. A thread that
    still holds a lock here keeps its slot: its robust list may run through the mapping."""
    cdef reg_t* head = <reg_t*>shm_tls_get()
    cdef reg_t** pp = &head
    cdef reg_t* r
    while pp[0] != NULL:
        r = pp[0]
        if r.rm == rm:
            if r.held > 0:
                return 0
            pp[0] = r.next
            pthread_setspecific(g_key, head)
            shm_tls_set(head)
            gm_lock()
            if rm.base != NULL:
                token_unlock(rm, r.slot)
            rm.nthreads -= 1
            gm_unlock()
            free(r)
            return 1
        pp = &r.next
    return 0


cdef int recover_wait_check(rmap_t* rm, recov_t* rc, int64_t until,
                            int64_t* next_sig) noexcept nogil:
    """One check of a wait inside a recovery: 1 to stop it (rc.cut set: `until`, the
    recoverer's deadline included, has passed, or a signal handler raised; then also
    rc.sig), 0 to go on. Signals are checked every RECOVER_CHECK_NS, inside a re-entry
    window, as a park checks them before a sleep; a recovery cut short is left pending and
    finished by the next waiter (docs/design.md §6.3)."""
    cdef int64_t now = shm_now_ns()
    cdef int r = 0
    cdef int entered
    if now >= until:
        rc.cut = 1
        return 1
    if now >= next_sig[0]:
        next_sig[0] = now + RECOVER_CHECK_NS
        entered = window_enter(rm)         # (a handler's own acquire recovers with its own
        with gil:                          # context: this one is untouched)
            r = PyErr_CheckSignals()
        window_exit(entered)
        if r < 0:
            rc.cut = 1
            rc.sig = 1
            return 1
    return 0


cdef int repair_lock(rmap_t* rm, shm_body* b, recov_t* rec) noexcept nogil:
    """Take a lock's repair mutex, waiting at most 2 s or to the recoverer's deadline, in
    slices that check signals (recover_wait_check). 0 on success, ETIMEDOUT (time ran
    out, or a handler raised), or another error (a corrupt mutex)."""
    cdef int64_t until = recover_until(rec, 2000000000)
    cdef int64_t nsig = shm_now_ns() + RECOVER_CHECK_NS
    cdef int64_t end
    cdef timespec ts
    cdef int rc
    while True:
        end = shm_now_ns() + RECOVER_CHECK_NS
        ts = shm_ts_of_ns(end if end < until else until)
        rc = pm_clocklock(body_repair(rm, b), 0, &ts)
        if rc != ETIMEDOUT:
            break
        if recover_wait_check(rm, rec, until, &nsig):
            return ETIMEDOUT
    if rc == EOWNERDEAD:
        pm_consistent(body_repair(rm, b), 0)   # a recoverer died: redo is idempotent
        rc = 0
    return rc


cdef void participant_leave_pending(rmap_t* rm, uint32_t slot) noexcept nogil:
    """Our recovery of `slot` stopped at our deadline: give the token back, marked pending,
    for the next waiter to go on (each lock's recovery redoes safely from any point a
    recoverer can stop at: the crash-point tests kill recoverers at those points)."""
    st32_rel(&rm.part[slot].pending, 1)
    pm_consistent(&rm.part[slot].token.m, 0)
    pm_unlock(&rm.part[slot].token.m, 0)
    token_wake_all(rm, slot)


cdef int participant_recover(rmap_t* rm, uint32_t slot, recov_t* rec) noexcept nogil:
    """We took a dead participant's token (EOWNERDEAD, or free and pending), so we alone
    recover it: complete its protocol on every lock of the region on its behalf.
    Returns 1 if the slot may be reused (we still hold its token), -1 if the recoverer's
    deadline (rec) cut the recovery short (the slot is left pending and its token free;
    rec.sig: a signal handler raised), 0 if the slot is quarantined.

    Robust and pi locks it held were marked OWNER_DIED by the kernel: only the holder
    identity is cleared. If a lock's repair mutex is unusable (a corrupt segment), the
    slot is quarantined (its token left ENOTRECOVERABLE) rather than handed to a new
    thread with a half-finished protocol."""
    cdef shm_participant* p = &rm.part[slot]
    rec.cut = 0
    trace("recover.begin", slot, ld64_rlx(&p.generation),
          ld32_rlx(&p.op_lock) | (<uint64_t>ld32_rlx(&p.op_step) << 32))
    return _participant_recover(rm, slot, rec)


cdef int _participant_recover(rmap_t* rm, uint32_t slot, recov_t* rec) noexcept nogil:
    cdef shm_participant* p = &rm.part[slot]
    cdef uint32_t i, code, s, n
    cdef int rc
    cdef bint tbl
    cdef shm_body b
    cdef kind_ops_t* ops
    cdef kind_recover_fn recover
    for i in range(rm.L):
        if ld32_acq(&rm.dir[i].state) != SHM_DIRENT_READY:
            continue
        code = ld32_rlx(&rm.dir[i].kind)
        n = 1
        tbl = 0
        if code == SHM_KIND_TABLE:
            # A lock table: its stripes, under the table's one repair mutex (recoveries of
            # one table are serialised). Every stripe's kind recover runs, each a few loads
            # when q has nothing to do with it: the cost of a death in a region with a
            # table is a scan of its stripes' words (docs/design.md §15).
            if rm.tbl.size == 0 or i != rm.tbl_entry:
                continue                         # not the table validated at open: skip
            code = rm.tbl.sub
            n = rm.tbl.size
            tbl = 1
            b = rm.tbl_body                      # (its repair mutex: the stripes')
        else:
            b = shm_body_at(rm.base, rm.locks_off + i * rm.stride, rm.P, i)
        ops = kind_ops(code)
        if ops == NULL:
            continue                             # not a kind of ours: nothing to complete
        recover = ops.recover
        if tbl and ops.stripe_recover != NULL:
            recover = ops.stripe_recover         # a stripe protocol of its own (ticket, mcs,
                                                 # clh)
        if not ops.repair:
            for s in range(n):                   # the kernel recovers it (robust, pi)
                if tbl:
                    b = table_stripe(rm, s)
                recover(rm, &b, slot, rec)
            continue
        rc = repair_lock(rm, &b, rec)
        if rc == ETIMEDOUT:                      # a live recoverer is slow, or our time
            participant_leave_pending(rm, slot)  # is up: the next waiter goes on
            return -1
        if rc != 0:
            shm_op_set(&p.op_lock, 0, SHM_OP_QUARANTINED)
            pm_unlock(&p.token.m, 0)             # without consistent(): unusable for good
            return 0
        crashpoint("recover.locked")
        for s in range(n):
            if tbl:
                b = table_stripe(rm, s)
            if kind_steps_aside(code):
                aside_recover(rm, &b, slot)      # its seat, VIP turn, mark (§7.0)
            recover(rm, &b, slot, rec)
            if rec.cut:
                break
        pm_unlock(body_repair(rm, &b), 0)
        if rec.cut:                      # a settle wait ran out before a decision
            participant_leave_pending(rm, slot)
            return -1
    crashpoint("recover.done")
    trace("recover.end", slot, ld64_rlx(&p.generation), 0)
    st64_rel(&p.op_value, 0)                     # no half-done pass survives its recovery
    shm_op_set(&p.op_lock, 0, 0)
    st32_rel(&p.pending, 0)
    pm_consistent(&p.token.m, 0)
    return 1


cdef void recover_verdict(rmap_t* rm, shm_body* b, uint32_t q, uint32_t op) noexcept nogil:
    """[V] (docs/design.md §6.4) Dead participant q holds the lock (the kind's recovery
    decided it), at step `op`: say what its hold leaves behind, then end it.
      op 0 (in its critical section)        -> OWNER_DIED: the next holder must repair
      RELEASING with OWNER_DIED already set -> NOTRECOVERABLE, as its own release would
        (unless HANDON: it was handing owner_died on, which the flag still does)
      TAKING / WAITING (granted, not back)  -> nothing: it never entered
    The flags first, then the holder record, in the order _release uses: whoever sees
    the holder cleared sees the flags the next holder inherits. The kind then releases
    the lock on q's behalf. Every store is idempotent: a redo gives the same result."""
    if SHM_DEBUG_BUILT:                  # (`and`/`or` are evaluated outside dassert's macro)
        dassert(op == 0 or op == SHM_OP_TAKING or op == SHM_OP_WAITING
                or op == SHM_OP_RELEASING, "[V]: the dead holder was at a step of this lock")
        dassert(ld32_acq(&b.ctl.holder) == 0
                or ld32_acq(&b.ctl.holder) == participant_hid(rm, q),
                "[V]: the holder record names the dead holder or no one")
    if op == 0:
        for32(&b.ctl.flags, SHM_F_OWNER_DIED)
    elif (op == SHM_OP_RELEASING and ld32_acq(&b.ctl.flags) & SHM_F_OWNER_DIED
            and not ld32_acq(&b.ctl.flags) & SHM_F_HANDON):
        for32(&b.ctl.flags, SHM_F_NOTRECOVERABLE)
    holder_forget(rm, b, q)


cdef void participant_try_recover(rmap_t* rm, uint32_t slot, recov_t* rec) noexcept nogil:
    """A waiter found participant `slot` dead (or suspects it): if its token comes back
    EOWNERDEAD, or free with a recovery pending, we are its one recoverer; recover it (by
    our deadline, rec) and free the slot. rec.sig set: a handler raised, the caller must
    stop (its exception is pending)."""
    cdef int rc
    if slot >= rmap_hwm(rm):
        return
    rc = pm_trylock(&rm.part[slot].token.m, 0)
    if rc == EOWNERDEAD or (rc == 0 and ld32_acq(&rm.part[slot].pending)):
        if participant_recover(rm, slot, rec) == 1:
            pm_unlock(&rm.part[slot].token.m, 0)
        token_wake_all(rm, slot)
    elif rc == 0:
        pm_unlock(&rm.part[slot].token.m, 0)             # already recovered and free
        token_wake_all(rm, slot)


cdef inline void token_wake_all(rmap_t* rm, uint32_t slot) noexcept nogil:
    """Wake every waiter sleeping on slot's token (wait.pxi arms it): the kernel woke one
    at the death; the rest look again now that it is recovered (or left pending)."""
    shm_futex_wake(<uint32_t*>&rm.part[slot].token.m, 0x7fffffff)


cdef bint participants_settle(rmap_t* rm, shm_body* b, uint32_t q, uint32_t step,
                              midstep_fn midstep, recov_t* rec) noexcept nogil:
    """Recovery by elimination needs the live participants that are between two steps of
    `step` on this lock (midstep(b, x): e.g. took a ticket but has not published it) to
    finish them. Waits for each, bounded by its progress (a death ends the wait), 5 s and
    the recoverer's deadline (rec), and ends early if a signal handler raises. Returns 1
    once none is mid-step; 0 if cut short first (rec.cut set): the caller must then decide
    nothing and return."""
    cdef uint32_t x
    cdef uint32_t lock1 = b.index + 1
    cdef int64_t until = recover_until(rec, 5 * <int64_t>1000000000)
    cdef int64_t nsig = shm_now_ns() + RECOVER_CHECK_NS
    for x in range(body_hwm(b)):
        if x == q:
            continue
        while (_op_is(participant_op(rm, x, lock1), step) and midstep(b, x)
               and not participant_dead(rm, x)):
            if recover_wait_check(rm, rec, until, &nsig):    # deadline, 5 s, or a signal
                return 0
            sched_yield()
    return 1


cdef bint settle_any(shm_body* b, uint32_t x) noexcept nogil:
    """participants_settle's midstep when every live participant at the step counts (the
    kind cannot tell which are mid-step: ticketc.pxi, clhc.pxi)."""
    return 1


cdef inline bint _op_is(uint32_t op, uint32_t step) noexcept nogil:
    """step matches op; SHM_OP_WAITING as `step` means "taking or waiting"."""
    if step == SHM_OP_WAITING:
        return op == SHM_OP_TAKING or op == SHM_OP_WAITING
    return op == step


cdef int participant_state(rmap_t* rm, uint32_t slot) noexcept nogil:
    """Snapshot of a slot's token without taking it: 0 free, 1 alive, 2 dead (a slot not
    provisioned is free)."""
    cdef uint32_t w
    if slot >= rmap_hwm(rm):
        return 0
    w = ld32_acq(<uint32_t*>&rm.part[slot].token.m)
    if (w & FUTEX_OWNER_DIED_ or ld32_acq(&rm.part[slot].op_step) == SHM_OP_QUARANTINED
            or ((w & FUTEX_TID_MASK_) == 0 and ld32_acq(&rm.part[slot].pending))):
        return 2
    if w & FUTEX_TID_MASK_:
        return 1
    return 0


# ---- a queue lock's waiters aside (docs/design.md §7.0) --------------------------------
# A waiter aside sleeps on its own prec.aside_wake, never on a timer unless it is the
# oldest (wait.pxi aside_sleep). Whoever clears a mark (a waiter aside that takes the VIP
# turn or leaves, a recovery) or frees the VIP turn wakes the oldest live waiter aside
# (aside_kick); every other one watches the liveness token of the one just ahead of it
# (aside_ahead), so a death in the line wakes the one behind.

cdef inline bint _aside_live(rmap_t* rm, shm_body* b, uint32_t x) noexcept nogil:
    """Is participant x's aside mark believable: alive, and waiting for this lock? A dead
    one's mark is cleared by its recovery and never holds the others back meanwhile."""
    return (participant_state(rm, x) == 1
            and participant_op(rm, x, b.index + 1) == SHM_OP_WAITING)


cdef int aside_ahead(rmap_t* rm, shm_body* b, uint32_t me, uint64_t since) noexcept nogil:
    """The slot of the waiter aside just ahead of (me, since) in arrival order (by arrival,
    then slot), live or dead, or -1: none is (me is the oldest). A dead one is returned so
    that the one behind it, watching its token (wait.pxi aside_sleep), recovers it: its
    recovery clears its mark, and the next look goes past it. me = b.P and since = the
    largest u64 ask for the youngest of all; see aside_kick for the oldest."""
    cdef uint32_t x, n = rmap_hwm(rm)
    cdef uint64_t v, best_v = 0
    cdef int best = -1
    if n > b.P:
        n = b.P
    for x in range(n):
        if x == me:
            continue
        v = ld64_acq(&b.precs[x].aside_since)
        if v == 0 or v > since or (v == since and x > me):
            continue                                 # not aside, or behind me
        if best >= 0 and (v < best_v or (v == best_v and <int>x < best)):
            continue                                 # further ahead than the best so far
        if _aside_live(rm, b, x) or (participant_state(rm, x) == 2 and ld32_acq(
                &rm.part[x].op_step) != SHM_OP_QUARANTINED):   # (no recovery comes)
            best, best_v = <int>x, v
    return best


cdef void aside_kick(rmap_t* rm, shm_body* b) noexcept nogil:
    """Wake the oldest live waiter aside of lock b, if any: it is now the one that takes the
    next VIP turn (and the only one that sleeps on a timer). A bump of its word, then a
    futex wake: it read the word before the state it checked, so it cannot miss this."""
    cdef uint32_t x, n = rmap_hwm(rm)
    cdef uint64_t v, best_v = 0
    cdef int best = -1
    if n > b.P:
        n = b.P
    for x in range(n):
        v = ld64_acq(&b.precs[x].aside_since)
        if v == 0 or (best >= 0 and v >= best_v):
            continue
        if _aside_live(rm, b, x):
            best, best_v = <int>x, v
    if best >= 0:
        fadd32(&b.precs[best].aside_wake, 1)
        shm_futex_wake(&b.precs[best].aside_wake, 0x7fffffff)


cdef void aside_recover(rmap_t* rm, shm_body* b, uint32_t slot) noexcept nogil:
    """A dead participant's part of lock b's aside words: the seat and the VIP turn it took
    (each names its taker: a CAS from its holder id to 0) and its mark, freed; then the
    oldest waiter aside is woken if any was (the VIP turn may be its now). Redone at will."""
    cdef uint32_t* a = aside_words(b)
    cdef uint32_t dead = participant_hid(rm, slot)
    cdef uint32_t i
    cdef bint freed = 0
    if dead == 0:
        return
    if ld32_acq(&a[AS_VIP]) == dead:       # (a load first: a table recovers every stripe)
        freed |= cas32(&a[AS_VIP], dead, 0)
    for i in range(aside_cap(b)):
        if ld32_acq(&a[AS_SEATS + i]) == dead:
            cas32(&a[AS_SEATS + i], dead, 0)
    if ld64_acq(&b.precs[slot].aside_since) != 0:
        st64_rel(&b.precs[slot].aside_since, 0)      # not aside any more
        freed = 1
    if freed:
        aside_kick(rm, b)
