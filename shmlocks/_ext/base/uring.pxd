# uring.pxd -- futex waits through io_uring (sys/shm_uring.h; docs/design.md §5 "Resumable
# waits"): the interface of uring.pxi. Which way this process waits without blocking a
# thread (AIO_MODE: io_uring FUTEX_WAITV, or the fallback, a waiter thread in
# futex_waitv), and a ring a thread that must not block submits its waits to and reaps.

cdef int g_aio_uring                    # 1: io_uring FUTEX_WAITV (aio_mode_init)
cdef str aio_mode_init(str forced)

# user_data bit of a cancellation's own completion (_Ring.cancel): never a wait's
cdef uint64_t RING_CANCEL_BIT


cdef class _Ring:
    cdef shm_uring r
    cdef dict arrays                    # user_data -> its futex_waitv array (an address),
                                        # alive until its completion is reaped
    cdef int pid                        # the process that made it (a fork's child does
                                        # not own the parent's ring)
    cdef unsigned long owner            # the thread that made it: the one that reaps
    cdef int _check(self) except -1
    cdef int _submit(self, shm_waitv* v, unsigned n, uint64_t user_data) except -1
