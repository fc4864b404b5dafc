# robust.pxd -- robust pthread mutex, and the base the pi kind shares: the interface of
# robust.pxi (the kind contract it implements: base/kind.pxd).

# The pthread kinds' word, named as qspinlock_types.h names the parts of its word:
#   word A  pthread_mutex_t   a process-shared robust glibc mutex (pi: PTHREAD_PRIO_INHERIT
#                             too), all of it glibc's; its first u32 is its futex word
#                             (pm_word): the owner's TID | FUTEX_WAITERS | FUTEX_OWNER_DIED
#   word B                    the dead holder (docs/design.md §7.4 [R1]): pid (u32[0]),
#                             tid (u32[1]) and PID namespace (u32[2]: a namespace's inode
#                             number is 32 bits, the kernel's proc_alloc_inum) of a holder that
#                             died holding, kept by the recoverer of its slot; pid 0: none.
#                             It means something only while word A says "owner died, not
#                             taken since" and no holder record names anyone.
cdef inline pthread_mutex_t* pm_mutex(shm_body* b) noexcept nogil:
    return &b.wa.m


cdef inline uint32_t* pm_word(shm_body* b) noexcept nogil:
    return <uint32_t*>&b.wa.m


cdef inline uint32_t* pm_dead_pid(shm_body* b) noexcept nogil:
    return &b.wb.u32[0]


cdef inline uint32_t* pm_dead_tid(shm_body* b) noexcept nogil:
    return &b.wb.u32[1]


cdef inline uint32_t* pm_dead_pidns(shm_body* b) noexcept nogil:
    return &b.wb.u32[2]


cdef inline bint pm_died_untaken(uint32_t w) noexcept nogil:
    """Does futex word w say its owner died and nobody has taken the mutex since? (The
    kernel leaves FUTEX_OWNER_DIED, and FUTEX_WAITERS if set, without a TID.)"""
    return (w & FUTEX_OWNER_DIED_) != 0 and (w & FUTEX_TID_MASK_) == 0


cdef void _pmutex_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil


# a glibc mutex call's result as a result code (pi uses it too)
cdef inline int _pm_code(int rc) noexcept nogil:
    if rc == 0:
        return R_ACQ
    if rc == EOWNERDEAD:
        return R_ACQ_DIED
    if rc == EBUSY:
        return R_BUSY
    if rc == ENOTRECOVERABLE:
        return R_NOTREC
    if rc == ETIMEDOUT:
        return R_TIMEOUT
    return R_CORRUPT


cdef class _PthreadMutexLock(_Lock):
    # overrides _fast, _try, _wait, _unlock, _consistent, _is_locked, _held_by_tid,
    # _dead_holder, _died_taken (base/kind.pxd); adds:
    cdef bint _spins(self) noexcept nogil
    cdef int _sleep(self, wait_t* w, bint slept) noexcept nogil
    cdef int _sleep_pi(self, wait_t* w) noexcept nogil
    # a resumable wait (wait_t.nb, docs/design.md §5): robust's here; pi overrides it
    cdef int _wait_nb(self, uint32_t me, int rc, wait_t* w) noexcept nogil


cdef class RobustMutex(_PthreadMutexLock):
    pass
