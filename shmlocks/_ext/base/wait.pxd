# wait.pxd -- the one waiting policy every kind uses (docs/design.md §5): the interface of
# wait.pxi. A kind waits with park() (its callbacks, park_t, watch_t and the result codes
# are the kind contract's: base/kind.pxd); the pthread kinds, which sleep in glibc's
# mutex, drive the policy's steps themselves (wait_pause, then wait_due and wait_sleep
# around their own sleep or lock call).

cdef struct wait_t:
    PyThreadState* saved    # the GIL, released by wait_nogil (NULL: not released here)
    int gil                 # 1 while the caller's GIL is still held (see wait_nogil)
    int64_t deadline        # absolute CLOCK_MONOTONIC ns; -1 = wait forever; 0 = do not wait
    int64_t t0              # when the wait began (its first clock read; 0 = not yet)
    int64_t spin_until
    int64_t spin_ns         # this wait's spin budget
    int phase               # 0 spin, 1 yield, 2 park
    int yields
    uint32_t polls          # spin polls so far (the clock is read every SPIN_CLOCK_EVERY)
    int64_t far_until       # end of the far-waiter yield phase (0 = not started)
    int far                 # 1 once this wait yielded as a far waiter
    int switched            # 1 once a yield of this wait let another task run here
    uint32_t backoff        # barging kinds: pauses between polls, doubling to BACKOFF_MAX
                            # (0: FIFO kinds, one pause per poll)
    # -- the deadlock chain walk (deadlock.pxi, docs/design.md §9): dl_arm sets these on
    #    the slow path; nothing of it runs before the wait's first sleep
    int dl_state            # 0: no walk (not armed); 1: armed, its first sleep walks;
                            # 2: walked (again when dl_next comes, or when poked)
    int64_t dl_next         # its next walk without a poke (its deadlock timeout, then every
                            # DL_RECHECK_NS); -1: none
    int64_t dl_from         # from when it may give up as a cycle's victim (its deadlock
                            # timeout passed); -1: never (its process does not detect)
    int64_t dl_last         # when it last walked
    uint32_t dl_slot        # the waiting participant's slot (in region rm)
    uint32_t dl_poke        # its poke word as its last walk began
    int dl_hit              # 1: a deadlock's victim, withdrawing as on a timeout
    int dl_members          # the victim's cycle: its length, and its description
    char* dl_text           # (malloc'd by the walk; dl_found takes it)
    int dl_linked           # 1: it published wait links in other regions (dl_links)
    void* dl_outer          # the wait it runs inside (a signal handler's), whose links come back
    rmap_t* rm              # the waiter's region: hidden while Python code runs (its
                            # re-entry window, participants.pxi); NULL: none
    recov_t rec             # the recoveries this wait runs keep its deadline (park passes
                            # it to dep through the watch set: watch_t.rec)
    # -- a resumable wait (docs/design.md §5 "Resumable waits"): nb_init sets these; a
    #    blocking wait (nb 0) never reads them
    int nb                  # 1: never sleep here: where park (or robust, pi) would sleep,
                            # return R_WOULDBLOCK, the place kept and the sleep's watch set
                            # in nb_ws; the driver sleeps on it, then re-enters _wait
    int resume_rc           # what the kind recorded at R_WOULDBLOCK: the rc to re-enter with
    int nb_slept            # 1 once it returned R_WOULDBLOCK: a re-entry is the end of a
                            # sleep (the deadline and the deadlock look are due first)
    watch_t* nb_ws          # the driver's: the watch set of the sleep it would have made
    uint32_t* nb_parked     # the park count it is still announced on (the waker then wakes
                            # its word); the driver takes it back (nb_unannounce). NULL: none
    int64_t nb_until        # when the driver must re-enter even if no word changes (the
                            # deadline, the next look, the end of a slice): absolute
                            # CLOCK_MONOTONIC ns, -1 never
    uint32_t own_parked     # a park count no waker reads, for a kind whose announcement is
                            # elsewhere (futex: its W bit); here, it outlives the _wait call
    # -- stepping aside (a FIFO kind's blocking wait, docs/design.md §7.0): wait_init clears
    uint32_t* aside         # the lock's aside words (aside_words); NULL: never step aside
    uint32_t aside_cap      # its seat words (aside_cap: fewer in a table's stripe)
    uint32_t aside_id       # the waiter's holder id: what a seat or the VIP word names it by
    shm_body* aside_b       # its lock's body, and its slot: its aside mark (prec.aside_since)
    uint32_t aside_slot
    int aside_ok            # 1 while the kind parks in its queued place (may step aside)
    int seat                # the spinner seat held (-1: none)
    int vip                 # 1 while it holds the VIP turn, 2 once it gave it back asleep in
                            # its place; either: it never steps aside again in this wait
    uint32_t* recall        # a word whose values in recall_set call the waiter back from
                            # aside before its VIP turn (clhc.pxi: its predecessor's node
                            # state, ABANDONED, which only it may hand back); NULL: none.
                            # Set by the kind as it steps aside; looked at each time the
                            # waiter wakes aside: whoever sets such a value wakes it there
                            # (its prec.aside_wake), so it never sleeps on the word itself
    uint32_t recall_set     # bit v set: value v (< 32) of *recall calls it back


cdef double _FOREVER_S                  # timeouts beyond ~31 years mean "wait forever"
cdef int64_t SPIN_NS                    # the first spin budget
cdef int64_t SPIN_MIN_NS
cdef int64_t SPIN_MAX_NS
cdef int64_t PARKED_SHORT_NS
cdef int64_t PARK_SLICE_NS                # a sleep that cannot watch whom it depends on
cdef int g_wait_waitv                   # 1: sleeps are futex_waitv (wait_mode_init)
cdef unsigned long g_main_ident         # the thread that runs Python's signal handlers

# The deadlock chain walk a sleeping wait makes (deadlock.pxi sets it to its dl_look at
# import, so this layer names nothing above it), with the value its poke word had before:
# 1 this waiter is a cycle's victim and gives up now (w.dl_hit), 0 go on.
ctypedef int (*look_fn)(wait_t* w, int64_t now, uint32_t poke) noexcept nogil
cdef look_fn wait_look
cdef int64_t DL_POKE_GAP_NS             # a waiter poked walks again at most this often

cdef str wait_mode_init(str forced)
cdef bint wait_signals(wait_t* w) noexcept nogil
cdef int wait_walk(wait_t* w, uint32_t** pw, uint32_t* pv) noexcept nogil
cdef int64_t wait_until(wait_t* w, bint sliced) noexcept nogil
cdef int wait_due(wait_t* w) noexcept nogil
cdef int wait_sleep(wait_t* w, watch_t* ws, bint sliced) noexcept nogil
cdef int wait_sleep_many(wait_t* w, watch_t* ws, shm_many* more) noexcept nogil
cdef int wait_pause(wait_t* w) noexcept nogil
cdef int watch_participant(rmap_t* rm, uint32_t slot, watch_t* ws) noexcept nogil
cdef int park_sleep(watch_t* ws, int64_t until) noexcept nogil
cdef void park_woken(watch_t* ws) noexcept nogil
cdef int park(park_t* pk, wait_t* w) noexcept nogil
# stepping aside (docs/design.md §7.0; the aside words are participants.pxd's)
cdef uint32_t g_aside_seats             # spinner seats a FIFO lock has: the CPUs we may use - 1
cdef int64_t ASIDE_NS                   # how long a waiter stays aside before it may take the
                                        # VIP turn (and the oldest's sleep, at most)
cdef int aside_sleep(wait_t* w) noexcept nogil
cdef void aside_done(wait_t* w) noexcept nogil
# the non-blocking driver's side (docs/design.md §5 "Resumable waits")
cdef int64_t NB_RECOVER_NS              # a recovery run inside a non-blocking wait: its time
cdef void nb_init(wait_t* w, watch_t* ws, int64_t deadline, int rc) noexcept nogil
cdef int nb_enter(wait_t* w) noexcept nogil
cdef int nb_would_block(wait_t* w, watch_t* ws, uint32_t* parked, bint sliced) noexcept nogil
cdef void nb_woken(wait_t* w) noexcept nogil


cdef inline void wait_init(wait_t* w, int64_t deadline, uint32_t* budget=NULL) noexcept nogil:
    w.saved = NULL
    w.gil = 0
    w.deadline = deadline
    w.spin_ns = SPIN_NS
    if budget != NULL and budget[0] != 0:
        w.spin_ns = budget[0]
    w.t0 = 0
    w.spin_until = 0
    w.phase = 0
    w.yields = 0
    w.polls = 0
    w.far_until = 0
    w.far = 0
    w.switched = 0
    w.backoff = 0
    w.dl_state = 0
    w.dl_next = -1
    w.dl_from = -1
    w.dl_last = 0
    w.dl_slot = 0
    w.dl_poke = 0
    w.dl_hit = 0
    w.dl_members = 0
    w.dl_text = NULL
    w.dl_linked = 0
    w.dl_outer = NULL
    w.rm = NULL
    recov_init(&w.rec, deadline)
    w.nb = 0
    w.aside = NULL
    w.aside_cap = 0
    w.aside_id = 0
    w.aside_b = NULL
    w.aside_slot = 0
    w.aside_ok = 0
    w.seat = -1
    w.vip = 0
    w.recall = NULL
    w.recall_set = 0


cdef inline void nb_unannounce(wait_t* w) noexcept nogil:
    """The driver, before it re-enters a wait that returned R_WOULDBLOCK: take back the
    announcement the would-be sleep left (parked += 1), so that wakers stop waking for it."""
    if w.nb_parked != NULL:
        fsub32(w.nb_parked, 1)
        w.nb_parked = NULL


cdef inline void wait_nogil(wait_t* w) noexcept nogil:
    """Release the GIL if the caller still holds it: before the first yield, far yield,
    park or blocking call. The spin phase keeps it (a release and re-take would add two
    GIL transfers to every contended hand-off); the caller re-takes it with wait_regil."""
    if w.gil:
        w.gil = 0
        w.saved = PyEval_SaveThread()


cdef inline void wait_regil(wait_t* w) noexcept nogil:
    if w.saved != NULL:
        PyEval_RestoreThread(w.saved)
        w.saved = NULL


cdef inline void wait_adapt(wait_t* w, uint32_t* budget) noexcept nogil:
    """After a successful wait: spin longer next time if a spin would have caught the lock,
    else less. It would have when the wait ended while spinning; or when no yield of it let
    another task run here (so the holder ran on another CPU) and either it ended while
    yielding, or the whole wait, park and wake-up included, took less than PARKED_SHORT_NS.
    A wake-up can cost more than a short critical section: without that last test, a
    section about as long as a wake-up made every wait park once the budget was halved for
    it, and kept it parking, doubling the hand-off time."""
    cdef int64_t s = w.spin_ns
    cdef int64_t took = 0
    cdef bint longer
    if w.far and w.phase == 0:
        return                              # it yielded behind others: says nothing of spinning
    if w.far or w.switched:
        longer = 0                          # it waited behind others, or shared this CPU
    elif w.phase < 2:
        longer = 1
    else:
        took = shm_now_ns() - w.t0 if w.t0 != 0 else PARKED_SHORT_NS
        longer = took < PARKED_SHORT_NS
    if longer:
        # double, and at least half again what this wait took (it may have parked)
        s = s * 2 if s * 2 > took + took // 2 else took + took // 2
        s = s if s < SPIN_MAX_NS else SPIN_MAX_NS
    else:
        s = s // 2 if s // 2 > SPIN_MIN_NS else SPIN_MIN_NS
    budget[0] = <uint32_t>s


cdef inline bint watch_word(watch_t* ws, uint32_t* word, uint32_t val) noexcept nogil:
    """Also sleep on word while it holds val (read by the caller BEFORE the state it decided
    on). 0 if the set is full: the caller then answers DEP_UNKNOWN."""
    if ws.n >= SHM_WAITV_MAX:
        return 0
    ws.words[ws.n] = word
    ws.vals[ws.n] = val
    ws.n += 1
    return 1


cdef inline void wake_if_parked(uint32_t* word, uint32_t* parked) noexcept nogil:
    if ld32_seq(parked) != 0:
        shm_futex_wake(word, 0x7fffffff)


# the fallback driver's sleeper (wait.pxi, docs/design.md §14): one arm per waiting cohort
cdef struct waiter_arm:
    uint64_t id
    int n
    uint32_t* words[SHM_WAITV_MAX]
    uint32_t vals[SHM_WAITV_MAX]


cdef class _Waiter:
    cdef pthread_mutex_t mu
    cdef waiter_arm* arms
    cdef int narms
    cdef int cap
    cdef uint32_t rearm
    cdef int stopped
    cdef int slices                       # sleeps cut to a slice (the union too large)
    cdef int _add(self, watch_t* ws, uint64_t id) except -1
    cdef void _kick(self) noexcept nogil
