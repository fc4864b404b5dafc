# robust.pxd -- robust pthread mutex, and the base the pi kind shares: the interface of
# robust.pxi (the kind contract it implements: base/kind.pxd).

# The pthread kinds' word, named as qspinlock_types.h names the parts of its word:
#   word A  pthread_mutex_t   a process-shared robust glibc mutex (pi: PTHREAD_PRIO_INHERIT
#                             too), all of it glibc's; its first u32 is its futex word
#                             (pm_word): the owner's TID | FUTEX_WAITERS | FUTEX_OWNER_DIED
#   word B                    unused
cdef inline pthread_mutex_t* pm_mutex(shm_body* b) noexcept nogil:
    return &b.wa.m


cdef inline uint32_t* pm_word(shm_body* b) noexcept nogil:
    return <uint32_t*>&b.wa.m


cdef void _pmutex_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil


cdef class _PthreadMutexLock(_Lock):
    # overrides _fast, _try, _wait, _unlock, _consistent, _is_locked, _held_by_tid
    # (base/kind.pxd); adds:
    cdef bint _spins(self) noexcept nogil
    cdef int _sleep(self, wait_t* w) noexcept nogil
    cdef int _sleep_pi(self, wait_t* w) noexcept nogil


cdef class RobustMutex(_PthreadMutexLock):
    pass
