# uring.pxi -- futex waits through io_uring (docs/design.md §5 "Resumable waits"): the
# waiting mode of a thread that must not block, chosen once, and _Ring, a ring such a
# thread (an event loop's) submits FUTEX_WAITV requests to and reaps completions from.
#
# AIO_MODE is "io_uring" when the kernel has IORING_OP_FUTEX_WAITV (Linux 6.7+) and a trial
# wait behaves (sys/shm_uring.h shm_uring_probe); "thread" otherwise: io_uring refused
# (ENOSYS, or EPERM: the kernel.io_uring_disabled sysctl, a seccomp filter), too old a
# kernel, or SHMLOCKS_AIO=thread at import. The fallback's driver is a thread asleep in
# futex_waitv on the watch sets (docs/design.md §14).
#
# A ring's completions are task work of the thread that submitted: it is made, fed and
# reaped by one thread. Each wait's futex_waitv array is the ring's until the wait's
# completion is reaped (or the ring closed), whatever the kernel's own copy.

import os as _os

cdef int g_aio_uring = 0
cdef uint64_t RING_CANCEL_BIT = (<uint64_t>1) << 63


cdef str aio_mode_init(str forced):
    """Chosen once, at import: io_uring if it works here unless SHMLOCKS_AIO=thread forces
    the fallback. Returns the mode's name."""
    global g_aio_uring
    g_aio_uring = forced != "thread" and shm_uring_probe() == 1
    return "io_uring" if g_aio_uring else "thread"


cdef class _Ring:
    """A private io_uring of futex waits (not API: the asyncio driver's, and the tests').

    _Ring(entries=64): a ring with that many submission slots, made and used by the calling
    thread only (OSError if io_uring is refused here). ``waitv(pairs, user_data)`` arms a
    FUTEX_WAITV on [(address, value), ...] (1 to 128 shared 32-bit words that must still
    hold their value: a word that changed completes at once with -EAGAIN);
    ``cancel(user_data)`` cancels it (its completion then says -ECANCELED; the cancel's
    own carries user_data | 1 << 63); ``completions(timeout=0)`` waits up to timeout
    seconds (None: no end) for one, then returns every (user_data, res) ready: res is the
    woken word's index, or -errno. ``fileno()`` is an eventfd the kernel signals at each
    completion (for loop.add_reader); ``close()``."""

    def __cinit__(self):
        shm_uring_zero(&self.r)                  # closed until __init__ made it
        self.arrays = {}
        self.pid = getpid()
        self.owner = PyThread_get_thread_ident()

    def __init__(self, unsigned entries=64):
        cdef int e
        if self.r.fd >= 0:
            raise ValueError("the ring is made already")
        e = shm_uring_setup(&self.r, entries, 0)
        if e < 0:
            raise OSError(-e, f"io_uring_setup: {_os.strerror(-e)}")

    def fileno(self):
        """The ring's eventfd (made and registered at the first call)."""
        cdef int e
        self._check()
        e = shm_uring_eventfd(&self.r)
        if e < 0:
            raise OSError(-e, f"IORING_REGISTER_EVENTFD: {_os.strerror(-e)}")
        return e

    cdef int _check(self) except -1:
        if self.r.fd < 0:
            raise ValueError("the ring is closed")
        if self.pid != getpid():
            raise ValueError("a ring made before fork() is not the child's")
        return 0

    cdef int _submit(self, shm_waitv* v, unsigned n, uint64_t user_data) except -1:
        """Queue and submit a FUTEX_WAITV on v[0:n] (malloc'd; the ring frees it when its
        completion is reaped)."""
        cdef int e = shm_uring_prep_waitv(&self.r, v, n, user_data)
        if e == -EBUSY:
            shm_uring_submit(&self.r)
            e = shm_uring_prep_waitv(&self.r, v, n, user_data)
        if e < 0:
            free(v)
            raise OSError(-e, f"FUTEX_WAITV: {_os.strerror(-e)}")
        self.arrays[user_data] = <size_t>v
        e = shm_uring_submit(&self.r)
        if e < 0:
            raise OSError(-e, f"io_uring_enter: {_os.strerror(-e)}")
        return 0

    def waitv(self, pairs, uint64_t user_data):
        """Arm a FUTEX_WAITV on [(address, value), ...] whose completion carries
        user_data (below 1 << 63, not already in flight)."""
        cdef Py_ssize_t n = len(pairs), i
        cdef shm_waitv* v
        self._check()
        if user_data & RING_CANCEL_BIT or user_data in self.arrays:
            raise ValueError(f"user_data {user_data} is in flight or reserved")
        if n < 1 or n > SHM_WAITV_MAX:
            raise ValueError(f"a FUTEX_WAITV watches 1 to {SHM_WAITV_MAX} words, not {n}")
        items = [(<size_t>a, <uint32_t>val) for a, val in pairs]     # (checked first)
        v = <shm_waitv*>calloc(n, sizeof(shm_waitv))
        if v == NULL:
            raise MemoryError()
        for i in range(n):
            shm_waitv_fill(&v[i], <uint32_t*><size_t>items[i][0], <uint32_t>items[i][1])
        self._submit(v, <unsigned>n, user_data)

    def cancel(self, uint64_t user_data):
        """Cancel the wait user_data (its completion: -ECANCELED, or it completed first)."""
        cdef int e
        self._check()
        e = shm_uring_prep_cancel(&self.r, user_data, user_data | RING_CANCEL_BIT)
        if e == -EBUSY:
            shm_uring_submit(&self.r)
            e = shm_uring_prep_cancel(&self.r, user_data, user_data | RING_CANCEL_BIT)
        if e == 0:
            e = shm_uring_submit(&self.r)
        if e < 0:
            raise OSError(-e, f"ASYNC_CANCEL: {_os.strerror(-e)}")

    @property
    def inflight(self):
        """The waits armed whose completion is not yet reaped."""
        return len(self.arrays)

    def drain(self):
        """For an event loop's reader of fileno(): the eventfd reset, then every completion
        ready, [(user_data, res), ...] (a completion that comes after the reset signals the
        eventfd again). Never waits."""
        cdef uint64_t ud = 0
        cdef int32_t res = 0
        cdef int k
        self._check()
        shm_uring_drain_eventfd(&self.r)
        out = []
        for k in range(2):
            while shm_uring_reap(&self.r, &ud, &res):
                out.append((ud, res))
                if not ud & RING_CANCEL_BIT:
                    free(<void*><size_t>self.arrays.pop(ud, 0))
            if out or k:
                break
            shm_uring_enter(&self.r, 0, -1)         # completions waiting as task work
        return out

    def completions(self, timeout=0):
        """Wait up to `timeout` seconds (None: no end) for a completion, then every one
        ready: [(user_data, res), ...] (empty at the timeout)."""
        cdef int64_t until = -1
        cdef uint64_t ud = 0
        cdef int32_t res = 0
        cdef int e
        cdef size_t a
        self._check()
        if timeout is not None:
            until = shm_now_ns() + <int64_t>(max(0.0, float(timeout)) * 1e9)
        out = []
        while True:
            while shm_uring_reap(&self.r, &ud, &res):
                out.append((ud, res))
                if not ud & RING_CANCEL_BIT:
                    a = self.arrays.pop(ud, 0)
                    free(<void*>a)
            if out:
                shm_uring_drain_eventfd(&self.r)
                return out
            if until >= 0 and shm_now_ns() >= until:
                shm_uring_enter(&self.r, 0, -1)     # run completions waiting as task work
                if shm_uring_reap(&self.r, &ud, &res):
                    out.append((ud, res))
                    if not ud & RING_CANCEL_BIT:
                        free(<void*><size_t>self.arrays.pop(ud, 0))
                    continue
                return out
            with nogil:
                e = shm_uring_enter(&self.r, 1, until)
            if e == -EINTR:
                PyErr_CheckSignals()
                if PyErr_Occurred() != NULL:
                    return _raise_pending()

    def close(self):
        """Close the ring (what is pending is cancelled with it) and free its arrays."""
        if self.r.fd >= 0:
            if self.pid == getpid():
                shm_uring_close(&self.r)
            else:
                shm_uring_zero(&self.r)             # (the child's copies are not its own)
        for a in self.arrays.values():
            free(<void*><size_t>a)
        self.arrays.clear()

    def __dealloc__(self):
        cdef size_t a
        if self.r.fd >= 0 and self.pid == getpid():
            shm_uring_close(&self.r)
        if self.arrays:
            for x in self.arrays.values():
                a = x
                free(<void*>a)
