# wait.pxi -- the one waiting policy every kind uses (DESIGN.md section 5).
#
#   spin   cpu_relax for about one hand-off, checking the condition. The budget adapts per
#          participant and lock: doubled (to SPIN_MAX_NS) when a wait ended while spinning,
#          halved (to SPIN_MIN_NS) when it had to yield or park, so a waiter that shares a
#          CPU with the holder stops burning the holder's time slice;
#   yield  sched_yield a few times (lets a descheduled holder run on an oversubscribed box);
#   park   announce (parked += 1), re-check, FUTEX_WAIT on the word for at most PARK_SLICE_NS,
#          then check the deadline (CLOCK_MONOTONIC) and, with the GIL re-taken briefly,
#          Python's signal handlers (Ctrl-C -> W_SIGNAL within one slice); with ticks on,
#          return W_TICK after each slice so the kind can check that the participant it
#          depends on is still alive (and recover it if not), then wait again.
#
# The waker's side of the protocol, which makes a lost wake-up impossible:
#     make the condition true (SC store/RMW); [change *word (SC)]; if load(parked) != 0: FUTEX_WAKE
# The waiter announces (SC) before it reads the word and re-checks, so either the waker sees
# the announcement, or the waiter's re-check sees the condition; a FUTEX_WAIT on a stale
# value returns EAGAIN at once.
#
# Callers hold no GIL here: the kind's slow path runs inside `with nogil`.

cdef enum:
    W_READY = 1
    W_TIMEOUT = -2
    W_SIGNAL = -1
    W_CONT = 2
    W_PARK = 3
    W_TICK = 4

cdef int64_t SPIN_NS = 4000          # first budget: about one cross-core hand-off
cdef int64_t SPIN_MIN_NS = 200
cdef int64_t SPIN_MAX_NS = 16000
cdef int YIELD_ROUNDS = 6
cdef int64_t PARK_SLICE_NS = 5000000  # 5 ms: bounds the time to notice a dead holder


def _wait_policy(spin_ns=None, yield_rounds=None):
    """Read (and for experiments, set) the wait policy: (spin_ns, yield_rounds, slice_ns)."""
    global SPIN_NS, YIELD_ROUNDS
    if spin_ns is not None:
        SPIN_NS = spin_ns
    if yield_rounds is not None:
        YIELD_ROUNDS = yield_rounds
    return (SPIN_NS, YIELD_ROUNDS, PARK_SLICE_NS)

ctypedef bint (*ready_fn)(void* ctx) noexcept nogil

cdef struct wait_t:
    int64_t deadline        # absolute CLOCK_MONOTONIC ns; -1 = wait forever; 0 = do not wait
    int64_t spin_until
    int64_t spin_ns         # this wait's spin budget
    int phase               # 0 spin, 1 yield, 2 park
    int yields


cdef inline void wait_init(wait_t* w, int64_t deadline, uint32_t* budget=NULL) noexcept nogil:
    w.deadline = deadline
    w.spin_ns = SPIN_NS
    if budget != NULL and budget[0] != 0:
        w.spin_ns = budget[0]
    w.spin_until = 0
    w.phase = 0
    w.yields = 0


cdef int wait_check(wait_t* w) noexcept nogil:
    """Deadline and signals. 0 to go on, else W_TIMEOUT or W_SIGNAL."""
    if w.deadline >= 0 and shm_now_ns() >= w.deadline:
        return W_TIMEOUT
    with gil:
        if PyErr_CheckSignals() < 0:
            return W_SIGNAL
    return 0


cdef int64_t wait_slice(wait_t* w) noexcept nogil:
    """How long the next park may sleep: the slice, or what is left of the deadline."""
    cdef int64_t left
    if w.deadline < 0:
        return PARK_SLICE_NS
    left = w.deadline - shm_now_ns()
    if left <= 0:
        return 0
    return left if left < PARK_SLICE_NS else PARK_SLICE_NS


cdef int wait_pause(wait_t* w) noexcept nogil:
    """One step of the spin and yield phases: W_CONT (poll again), W_PARK or W_TIMEOUT."""
    cdef int i
    cdef int64_t now
    if w.phase == 0:
        for i in range(16):
            cpu_relax()
        now = shm_now_ns()
        if w.spin_until == 0:
            w.spin_until = now + w.spin_ns
        if w.deadline >= 0 and now >= w.deadline:
            return W_TIMEOUT
        if now >= w.spin_until:
            w.phase = 1
        return W_CONT
    if w.phase == 1:
        sched_yield()
        w.yields += 1
        if w.deadline >= 0 and shm_now_ns() >= w.deadline:
            return W_TIMEOUT
        if w.yields >= YIELD_ROUNDS:
            w.phase = 2
        return W_CONT
    return W_PARK


cdef int wait_park(wait_t* w, uint32_t* word, uint32_t expected) noexcept nogil:
    """Sleep on word while it holds `expected` (one slice), then check deadline and signals."""
    cdef int64_t sl = wait_slice(w)
    if sl > 0:
        shm_futex_wait(word, expected, sl)
    return wait_check(w)


cdef int wait_for(ready_fn ready, void* ctx, uint32_t* word, uint32_t* parked,
                  wait_t* w, bint ticks=0) noexcept nogil:
    """Wait until ready(ctx). The waker changes *word and wakes it when *parked != 0.
    With ticks, returns W_TICK after each park slice (call again to go on waiting)."""
    cdef int r
    cdef uint32_t v
    if ready(ctx):
        return W_READY
    if w.deadline == 0:
        return W_TIMEOUT
    while True:
        r = wait_pause(w)
        if r == W_CONT:
            if ready(ctx):
                return W_READY
            continue
        if r != W_PARK:
            return r
        fadd32(parked, 1)                   # announce, SC: the waker reads parked after its change
        v = ld32_seq(word)
        if ready(ctx):
            fsub32(parked, 1)
            return W_READY
        r = wait_park(w, word, v)
        fsub32(parked, 1)
        if ready(ctx):
            return W_READY
        if r != 0:
            return r
        if ticks:
            return W_TICK


cdef inline void wait_adapt(wait_t* w, uint32_t* budget) noexcept nogil:
    """After a successful wait: spin longer next time if spinning was enough, else less."""
    cdef int64_t s = w.spin_ns
    if w.phase == 0:
        s = s * 2 if s * 2 < SPIN_MAX_NS else SPIN_MAX_NS
    else:
        s = s // 2 if s // 2 > SPIN_MIN_NS else SPIN_MIN_NS
    budget[0] = <uint32_t>s


cdef inline void wake_if_parked(uint32_t* word, uint32_t* parked) noexcept nogil:
    if ld32_seq(parked) != 0:
        shm_futex_wake(word, 0x7fffffff)
