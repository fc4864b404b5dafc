# participants.pxd -- who is who (docs/design.md §3): the interface of participants.pxi.
#
# A participant is one thread of one process using a region, named by its slot and, in a
# lock's holder record, by slot and generation (the holder id). Its liveness is its
# token's: a robust mutex it holds for as long as it owns the slot, which the kernel
# marks OWNER_DIED at its death. Here too: this process's views of regions (rmap_t) and
# the calling thread's registrations (reg_t), the re-entry windows, and the recovery
# driver that completes a dead participant's protocol on every lock (each kind's recover,
# through the ops table of base/kind.pxd) and the verdict [V] every kind's holding case
# cites.

cdef struct rmap_t:
    char* base
    size_t size
    shm_header* hdr
    shm_dirent* dir
    shm_participant* part
    uint64_t locks_off
    uint64_t stride
    uint32_t P                # validated copies: never re-read from the segment (P: the cap)
    uint32_t L
    int closed                # no new use from this process
    int nthreads              # threads of this process holding a token in this mapping
                              # (an asyncio cohort's agent slot counts as one, below)
    int agents                # agent slots of this process here (reg_claim_agent): 0 keeps
                              # the same-thread checks of a blocking acquire off its path
    int pins                  # threads inside a call that touches the mapping unregistered
    int pyalive               # the Region object is alive
    int fd                    # the segment's file, open as long as the mapping (-1: none)
    int named                 # fd holds flock(LOCK_SH): this view keeps the name alive
    int persist               # the segment was created with persist=True
    int fork_fd               # between fork's prepare and parent/child: the child's fd
    char path[224]            # "/dev/shm/<name>" (names are at most 200 bytes)
    rmap_t* gnext
    uint64_t order_key        # validated copies, as P and L: the segment's place in
    uint64_t ino              # hold_all's global order (header.order_key, ties by the
                              # file's inode: unique among live segments; docs/design.md §15)
    uint64_t ext_off          # where the extension area (a table's stripes) begins
    shm_table tbl             # the region's lock table, validated (table_load): its size
    uint32_t tbl_entry        # 0 when there is none; its directory entry
    shm_body tbl_body         # the table entry's own body: its repair mutex and precs


cdef struct reg_t:
    reg_t* next
    rmap_t* rm
    uint32_t slot
    uint32_t hid              # holder_id(slot, generation): what ctl.holder names us by
    uint32_t pid              # = part[slot].pid, kept here so a hold's count reads no shm
    uint32_t* op              # &part[slot].op_lock: where this thread publishes its steps
    int held                  # locks this thread holds in this region
    int linked                # its participant carries a wait link of this thread's wait
                              # (diag/deadlock.pxi dl_links): cleared when the wait ends


# How many regions a thread may take part in at once. Each keeps one liveness token locked
# on the thread's glibc robust list, and so does each robust or pi lock the thread holds;
# at the thread's death the kernel walks at most ROBUST_LIST_LIMIT (2,048) entries of that
# list, newest first (glibc pushes at the head), so past it the OLDEST entries (the first
# regions' tokens) are never marked OWNER_DIED: the thread would look alive there forever.
# 1,024 tokens leave the other 1,024 entries to the robust/pi locks it holds at once (and
# to any other library's robust mutexes). Tokens of regions closed in this process are
# given back at close (the closing thread's) or at the next registration (another
# thread's: reg_leave_closed), so they do not count.
cdef enum:
    REGIONS_PER_THREAD = 1024

# A lock's holder record (ctl.holder) names a participant by slot AND generation, so a record
# left by one occupant of a slot can never be taken for the next occupant's: slot + 1 in
# the low HOLDER_SLOT_BITS (SHM_MAX_PARTICIPANTS + 1 fits), the generation's low bits above.
cdef enum:
    HOLDER_SLOT_BITS = 13
    HOLDER_SLOT_MASK = (1 << HOLDER_SLOT_BITS) - 1

# Linux robust futex word bits (include/uapi/linux/futex.h)
cdef enum:
    FUTEX_TID_MASK_ = 0x3fffffff
    FUTEX_OWNER_DIED_ = 0x40000000
    FUTEX_WAITERS_ = 0x80000000

# Re-entry windows (docs/design.md §4). Python code runs inside a blocked acquire only where
# the wait checks signals (wait_signals: handlers, which may run finalizers; the deadlock
# walk is C and runs none) and in the same check inside a recovery (recover_wait_check). The thread's
# participant in that region is mid-step there (WAITING, or recovering someone): a lock call
# from that code would publish its own step over it. For the length of the window the
# participant is hidden: its reg_t is unlinked from the thread's list, so any lock call on
# that region misses reg_lookup (the fast path is untouched) and reaches a slow path that
# refuses it with ReentryError (window_busy). Nested windows (a handler's wait on another
# region) stack, at most WINDOW_MAX deep, per thread: the stack (shm_win_*) is C
# thread-local state (shm_sys.h).
cdef enum:
    WINDOW_MAX = SHM_WINDOW_MAX


# -- process-local bookkeeping: the views, the SIGTERM-safe sections (docs/design.md §2) --
cdef pthread_mutex_t g_mutex            # guards every rmap_t's counters and the view list
# A fatal SIGTERM leaves the names as a normal end does (region.pxi: _sigterm_leave). Its
# handler can interrupt any thread anywhere, so it must never act on bookkeeping caught
# half-changed: every section that changes what this process's views keep alive (g_mutex
# held, through gm_lock/gm_unlock; a view made between its file's flock and its entry in
# g_rmaps, region.pxi) counts itself in g_lc_busy. A handler that finds a section running
# only records its signal in g_lc_pending and returns; the last thread out of a section
# then leaves the names and ends the process with it (lc_end). docs/design.md §2.
cdef uint32_t g_lc_busy
cdef uint32_t g_lc_pending
cdef void lc_end() noexcept nogil
cdef int _robust_mutex_init(pthread_mutex_t* m, bint pi) noexcept nogil
cdef int _init_pshared_mutex(pthread_mutex_t* m, bint pi) except -1
cdef _reserve(int fd, uint64_t off, uint64_t length, what)
cdef int participants_init() except -1
cdef void rmap_link(rmap_t* rm) noexcept nogil
cdef void rmap_maybe_unmap(rmap_t* rm) noexcept nogil
cdef void rmap_maybe_free(rmap_t* rm) noexcept nogil
cdef void rmap_leave_all_names() noexcept nogil
cdef int rmap_pin(rmap_t* rm) except -1
cdef void rmap_unpin(rmap_t* rm) noexcept nogil


cdef inline void lc_enter() noexcept nogil:
    fadd32(&g_lc_busy, 1)


cdef inline void lc_exit() noexcept nogil:
    # seq_cst both sides: the handler stores g_lc_pending then loads g_lc_busy, we store
    # g_lc_busy then load g_lc_pending, so at least one of the two sees the other
    if fsub32(&g_lc_busy, 1) == 1 and ld32_seq(&g_lc_pending) != 0:
        lc_end()


cdef inline void gm_lock() noexcept nogil:
    lc_enter()
    pthread_mutex_lock(&g_mutex)


cdef inline void gm_unlock() noexcept nogil:
    pthread_mutex_unlock(&g_mutex)
    lc_exit()


# -- the participants provisioned (docs/design.md §2) -----------------------------------
# part_hwm, the header's count of participant slots provisioned, only grows (reg_grow,
# under the directory mutex). Every reader loads it afresh (SC: a scan whose correctness
# rests on a Dekker pair, as a writer's drain of an RWLock's readers, sees every slot
# claimed before its own SC step) and clamps it to the validated cap: nothing at or past
# it is read or written, and an id naming a slot or node there is out of range.
cdef inline uint32_t rmap_hwm(rmap_t* rm) noexcept nogil:
    cdef uint32_t h = ld32_seq(&rm.hdr.part_hwm)
    return h if h < rm.P else rm.P


cdef inline uint32_t body_hwm(shm_body* b) noexcept nogil:
    """part_hwm of the region of body b (its participants, and their nodes and precs), read
    afresh (and kept in b.hwm_seen, this view's copy for bounds checks: queue.pxd)."""
    cdef uint32_t h = ld32_seq(b.hwm)
    if h > b.P:
        h = b.P
    if h > ld32_rlx(&b.hwm_seen):
        st32_rlx(&b.hwm_seen, h)
    return h


# -- holder ids, namespaces -------------------------------------------------------------
cdef uint64_t my_pidns() noexcept nogil


cdef inline uint32_t holder_id(uint32_t slot, uint64_t generation) noexcept nogil:
    return (slot + 1) | <uint32_t>(generation << HOLDER_SLOT_BITS)


cdef inline uint32_t participant_hid(rmap_t* rm, uint32_t slot) noexcept nogil:
    """The holder id of the participant now in `slot` (its generation as published)."""
    return holder_id(slot, ld64_acq(&rm.part[slot].generation))


cdef inline uint32_t holder_slot(rmap_t* rm, uint32_t h) noexcept nogil:
    """The slot + 1 that holder record h names, or 0 if none, out of range, or left by an
    earlier occupant of the slot (stale)."""
    cdef uint32_t s1 = h & HOLDER_SLOT_MASK
    if h == 0 or s1 == 0 or s1 > rmap_hwm(rm) or participant_hid(rm, s1 - 1) != h:
        return 0
    return s1


cdef inline bint other_pidns(uint64_t ns) noexcept nogil:
    """Is namespace id `ns` (a record's) known and not ours?"""
    cdef uint64_t mine = my_pidns()
    return ns != 0 and mine != 0 and ns != mine



# -- lock numbers (docs/design.md §15) ---------------------------------------------------
# A lock of a region is named by a number: entry i of the directory is lock i, stripe s of
# the region's table is lock tbl.first + s (first >= L). op_lock, the wait link and every
# reader store number + 1 (0: none). lock_at is the decoder of a mapped region
# (shmlocks/_segment.py mirrors it for the readers, sys/shm_walk.h dlw_lock for the chain
# walk's pread copies), bounds-checked against the validated copies in rmap_t.
cdef enum:
    LOCK_NONE = 0
    LOCK_ENTRY = 1            # a directory entry's body (READY or not: the caller checks
                              # its state and kind, as every scan of the directory does)
    LOCK_STRIPE = 2           # a stripe of the region's table


cdef inline int lock_at(rmap_t* rm, uint32_t lock1, shm_body* b) noexcept nogil:
    """The body of the lock that number lock1 - 1 names (as op_lock stores it): LOCK_ENTRY
    or LOCK_STRIPE with b filled in, or LOCK_NONE (0, or out of range)."""
    cdef uint32_t n = lock1 - 1
    if lock1 == 0:
        return LOCK_NONE
    if n < rm.L:
        b[0] = shm_body_at(rm.base, rm.locks_off + <uint64_t>n * rm.stride, rm.P, n)
        return LOCK_ENTRY
    if rm.tbl.size != 0 and n - rm.tbl.first < rm.tbl.size:
        b[0] = shm_stripe_at(rm.base, &rm.tbl, &rm.tbl_body, n - rm.tbl.first)
        return LOCK_STRIPE
    return LOCK_NONE


cdef inline pthread_mutex_t* body_repair(rmap_t* rm, shm_body* b) noexcept nogil:
    """The mutex that serialises the recoveries of body b: its own (ctl.repair), or for a
    stripe of the region's table (a number past the directory's) the table's, in the
    table entry's body (kept out of the view: shm_body stays one line)."""
    if b.index >= rm.L and rm.tbl.size != 0:
        return &rm.tbl_body.ctl.repair.m
    return &b.ctl.repair.m


cdef inline shm_body table_stripe(rmap_t* rm, uint32_t s) noexcept nogil:
    """Stripe s (< rm.tbl.size) of the region's table."""
    return shm_stripe_at(rm.base, &rm.tbl, &rm.tbl_body, s)


cdef int table_load(rmap_t* rm, name) except -1
cdef int table_grow(rmap_t* rm, uint32_t lo, uint32_t hi, what) except -1


# -- registration and the re-entry windows (docs/design.md §4) ------------------------
cdef reg_t* reg_register(rmap_t* rm, int64_t deadline=*) except NULL
# an asyncio cohort's participant (docs/design.md §14): a slot claimed by the calling
# thread (its token on that thread's robust list) but not in its registration list, so
# the thread's own lock calls never find it; `others`: the agent slots the thread holds
# already (they count against REGIONS_PER_THREAD with its registrations)
cdef reg_t* reg_claim_agent(rmap_t* rm, int64_t deadline, int others) except NULL
cdef void reg_release_agent(reg_t* r) noexcept nogil
# provisioning participants (docs/design.md §2): at a region's creation and growth, and in
# a lock's body at its creation (region.pxi)
cdef int reg_grow(rmap_t* rm, uint32_t seen) except -1
cdef int slots_provision(rmap_t* rm, uint32_t lo, uint32_t hi, what,
                         bint fresh=*) except -1
cdef int body_provision(rmap_t* rm, uint32_t i, uint32_t lo, uint32_t hi, what) except -1
cdef int body_provision_at(rmap_t* rm, uint64_t base, uint32_t code, uint32_t lo,
                           uint32_t hi, what) except -1
cdef int lines_provision(rmap_t* rm, uint64_t off, uint64_t nbytes, what,
                         bint fresh) except -1
cdef int reg_unregister(rmap_t* rm) noexcept nogil
cdef reg_t* reg_find(rmap_t* rm) noexcept nogil
cdef int reg_leave_closed() noexcept nogil
cdef int window_enter(rmap_t* rm) noexcept nogil
cdef void window_exit(int entered) noexcept nogil
cdef object reentry_error(str what)
cdef int _raise_pending() except -1


cdef inline reg_t* reg_lookup(rmap_t* rm) noexcept nogil:
    cdef reg_t* r = <reg_t*>shm_tls_get()
    while r != NULL:
        if r.rm == rm:
            return r
        r = r.next
    return NULL


cdef inline bint window_busy(rmap_t* rm) noexcept nogil:
    """Is this thread inside a window on region rm (a lock call now is a re-entry)?"""
    cdef int i
    for i in range(shm_win_n):
        if shm_win_rm[i] == <void*>rm:
            return 1
    return 0



# -- liveness and recovery (docs/design.md §6) ------------------------------------------
# 5 ms: how often a wait inside a recovery (short, bounded: a repair mutex, a live
# participant finishing a step) checks the deadline and signals; it polls, unlike a park
cdef int64_t RECOVER_CHECK_NS

# A recovery's context (docs/design.md §6.3): a waiter that recovers a dead participant
# does it on its own time, so what it brings travels with the recovery as an argument,
# from the call that found the death (participant_try_recover) through the kind's recover
# down to every wait inside (the repair mutex, live participants settling), and what they
# found comes back in it. One per wait (wait_t.rec, a toolbox wait's, a registration's):
# a handler that runs inside a recovery wait and recovers someone itself has its own.
cdef struct recov_t:
    int64_t deadline        # the recoverer's deadline: absolute CLOCK_MONOTONIC ns; -1: none
                            # (each wait's own cap only); 0: now (a non-blocking call)
    int cut                 # a wait inside ran out (or a handler raised) before a decision:
                            # the recovery stopped there, left pending for the next waiter
    int sig                 # a signal handler raised in a wait inside: its exception is
                            # pending, and the caller returns R_SIGNAL (or raises it)


cdef inline void recov_init(recov_t* rc, int64_t deadline) noexcept nogil:
    rc.deadline = deadline
    rc.cut = 0
    rc.sig = 0


ctypedef bint (*midstep_fn)(shm_body* b, uint32_t x) noexcept nogil
cdef int participant_state(rmap_t* rm, uint32_t slot) noexcept nogil
cdef void participant_try_recover(rmap_t* rm, uint32_t slot, recov_t* rc) noexcept nogil
cdef void recover_verdict(rmap_t* rm, shm_body* b, uint32_t q, uint32_t op) noexcept nogil
cdef bint participants_settle(rmap_t* rm, shm_body* b, uint32_t q, uint32_t step,
                              midstep_fn midstep, recov_t* rc) noexcept nogil
cdef bint settle_any(shm_body* b, uint32_t x) noexcept nogil   # midstep: every one at step
cdef int recover_wait_check(rmap_t* rm, recov_t* rc, int64_t until,
                            int64_t* next_sig) noexcept nogil


cdef inline int64_t recover_until(recov_t* rc, int64_t cap_ns) noexcept nogil:
    """When a wait inside a recovery must end: cap_ns from now, or the recoverer's
    deadline if that comes first."""
    cdef int64_t until = shm_now_ns() + cap_ns
    if 0 <= rc.deadline < until:
        until = rc.deadline
    return until


cdef inline void holder_forget(rmap_t* rm, shm_body* b, uint32_t q) noexcept nogil:
    """Clear the lock's holder record if it names dead participant q (this occupant of the
    slot, not a later one): a CAS, so it is redone harmlessly."""
    cas32(&b.ctl.holder, participant_hid(rm, q), 0)


cdef inline bint participant_dead(rmap_t* rm, uint32_t slot) noexcept nogil:
    """Cheap liveness check from the token's futex word (no syscall, no lock): dead, or
    free with its recovery pending."""
    cdef uint32_t w = ld32_acq(<uint32_t*>&rm.part[slot].token.m)
    if w & FUTEX_OWNER_DIED_:
        return 1
    return (w & FUTEX_TID_MASK_) == 0 and ld32_acq(&rm.part[slot].pending) != 0


cdef inline uint32_t participant_op(rmap_t* rm, uint32_t slot, uint32_t lock1) noexcept nogil:
    """The step a participant published for lock (index + 1) lock1, or 0."""
    cdef shm_participant* p = &rm.part[slot]
    if ld32_acq(&p.op_lock) != lock1:
        return 0
    return ld32_acq(&p.op_step)


cdef inline int agent_tasks(rmap_t* rm, uint32_t x, uint32_t lock1, uint32_t hslot) noexcept nogil:
    """How many waiters of lock (index + 1) lock1 the asyncio cohort in agent slot x
    stands for (docs/design.md §14): the tasks it waits for the lock for (at least one
    while it waits), or those queued behind the task it holds the lock for (hslot: the
    lock's holder slot + 1); 0 if it acts on another lock."""
    cdef uint32_t op = participant_op(rm, x, lock1)
    cdef uint32_t t
    if op != SHM_OP_TAKING and op != SHM_OP_WAITING and hslot != x + 1:
        return 0
    t = ld32_acq(&rm.part[x].tasks)
    if op == SHM_OP_WAITING and t == 0:
        return 1
    return <int>t



# -- a queue lock's waiters aside (docs/design.md §7.0): its words, which recovery frees,
#    and the oldest waiter aside, whom a change of them wakes. Here (not in wait.pxd) since
#    a participant's recovery frees what it held of them.
cdef enum:
    AS_VIP = 0          # the VIP turn: the holder id of the waiter that took it, 0 = none
    AS_VIP_AT = 1       # when the last VIP turn was taken (CLOCK_MONOTONIC us, mod 2^32):
                        # a hint, trusted for at most ASIDE_NS (wait.pxi aside_sleep)
    AS_SEATS = 2        # the spinner seats: each a spinning waiter's holder id, 0 = free
    AS_MAX_SEATS = 12   # a lock body's (a compact stripe's: SHM_STRIPE_SEATS, aside_cap)


cdef inline bint kind_steps_aside(uint32_t code) noexcept nogil:
    """Does a lock of kind `code` step aside (docs/design.md §7.0)? The queue kinds: ticket
    and mcs, whose abandoned places stay queued until a release passes them, and clh,
    whose place aside stays queued until a waiter behind passes it at its turn; so that a
    waiter aside can take its place back."""
    return code == SHM_KIND_TICKET or code == SHM_KIND_MCS or code == SHM_KIND_CLH


cdef inline uint32_t* aside_words(shm_body* b) noexcept nogil:
    """A FIFO lock's aside words: the upper half of its word B line (the queue kinds leave
    it unused; the ticket's serving is in the lower half). A table's compact stripe of a
    kind that steps aside (ticket, ticketc.pxi; mcs, mcsc.pxi) keeps them in its line's
    waiters' half, past its words (shm_layout.h SHM_STRIPE_ASIDE_OFF), with fewer seats
    (aside_cap), not 64 bytes past its word B (the next stripe's line); a clh stripe
    (clhc.pxi) in its line's last 12 bytes, with one seat (SHM_STRIPE_CLH_ASIDE_OFF). The
    stripe's kind is read from its line: whatever it says, the words lie in the line."""
    if shm_view_compact(b):
        if b.ctl.kind == SHM_KIND_CLH:       # (its line's last 12 bytes: clhc.pxi)
            return <uint32_t*>(<char*>b.ctl + SHM_STRIPE_CLH_ASIDE_OFF)
        return <uint32_t*>(<char*>b.ctl + SHM_STRIPE_ASIDE_OFF)
    return &b.wb.u32[SHM_LINE // 8]


cdef inline uint32_t aside_cap(shm_body* b) noexcept nogil:
    """The spinner seat words of lock b's aside words: AS_MAX_SEATS for a lock body,
    SHM_STRIPE_SEATS for a table's compact stripe. A waiter uses at most g_aside_seats of
    them (its process's CPUs - 1); a recovery frees a dead one's in all of them."""
    if not shm_view_compact(b):
        return AS_MAX_SEATS
    return SHM_STRIPE_CLH_SEATS if b.ctl.kind == SHM_KIND_CLH else SHM_STRIPE_SEATS


cdef int aside_ahead(rmap_t* rm, shm_body* b, uint32_t me, uint64_t since) noexcept nogil
cdef void aside_kick(rmap_t* rm, shm_body* b) noexcept nogil
cdef void aside_recover(rmap_t* rm, shm_body* b, uint32_t slot) noexcept nogil
